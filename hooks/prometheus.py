"""``PrometheusHook``: the fleet's dcgm-exporter metrics through Prometheus, from an Airflow ``http`` connection.

The http provider's ``HttpHook`` reads the connection (host, schema, port, login/password, extra
headers) into a ``requests`` session; this hook hands that session to the Airflow-free
:class:`~trainops.health.prometheus.PrometheusClient`, which the health gate queries.
"""

from __future__ import annotations

from airflow.providers.http.hooks.http import HttpHook

from trainops.health.prometheus import PrometheusClient


class PrometheusHook(HttpHook):
    """Connection type ``http``: host (and port/schema) of the Prometheus server, auth as ``HttpHook``."""

    conn_name_attr = "prometheus_conn_id"
    default_conn_name = "prometheus_default"
    hook_name = "Prometheus (trainops)"

    def __init__(self, prometheus_conn_id: str = default_conn_name, timeout_s: float = 30.0) -> None:
        super().__init__(method="GET", http_conn_id=prometheus_conn_id)
        self.timeout_s = timeout_s

    def client(self) -> PrometheusClient:
        """A query client on the connection's base URL, with its authentication and headers."""
        session = self.get_conn()
        return PrometheusClient(self.base_url, session=session, timeout=self.timeout_s)
