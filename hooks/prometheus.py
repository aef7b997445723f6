"""``PrometheusHook``: the fleet's dcgm-exporter metrics through Prometheus, from a ``trainops_prometheus`` connection.

The connection type has its own form in the Airflow UI (declared in ``trainops.provider``): the
Prometheus URL, basic auth, extra HTTP headers as JSON (e.g. a bearer token), TLS verification, a
query timeout and the label that names the node in dcgm-exporter's series.  The http provider's ``HttpHook`` reads it into a ``requests`` session; this hook
hands that session to the Airflow-free :class:`~trainops.health.prometheus.PrometheusClient`,
which the health gate queries.
"""

from __future__ import annotations

from airflow.providers.http.hooks.http import HttpHook

from trainops.health.prometheus import DEFAULT_NODE_LABEL, PrometheusClient

DEFAULT_TIMEOUT_S = 30.0
NODE_LABEL_FIELD = "node_label"  # the connection's extra field; not an HTTP header


class PrometheusHook(HttpHook):
    """Queries a Prometheus server; ``client()`` is what the health gate uses.

    :param prometheus_conn_id: the ``trainops_prometheus`` connection (an ``http`` one works too).
    :param timeout_s: seconds each query may take; default: the connection's ``timeout``, else 30.
    """

    conn_name_attr = "prometheus_conn_id"
    default_conn_name = "prometheus_default"
    conn_type = "trainops_prometheus"
    hook_name = "Prometheus (trainops)"

    def __init__(self, prometheus_conn_id: str = default_conn_name, timeout_s: float | None = None) -> None:
        super().__init__(method="GET", http_conn_id=prometheus_conn_id)
        self.timeout_s = timeout_s

    def client(self) -> PrometheusClient:
        """A query client on the connection's base URL, with its authentication, headers and TLS settings."""
        session = self.get_conn()
        # HttpHook makes every extra field it does not know an HTTP header: take this one back out
        node_label = session.headers.pop(NODE_LABEL_FIELD, None) or DEFAULT_NODE_LABEL
        timeout = self.timeout_s or self.merged_extra.get("timeout") or DEFAULT_TIMEOUT_S
        return PrometheusClient(self.base_url, session=session, timeout=float(timeout), node_label=node_label)
