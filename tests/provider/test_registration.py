"""The provider registers like Airflow's own: its info validates against Airflow's schema, lists
every hook, operator, sensor and trigger module, and the Prometheus connection type has a UI form."""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from trainops.provider import get_provider_info

BASES = {
    "hooks": "airflow.sdk.bases.hook.BaseHook",
    "operators": "airflow.sdk.bases.operator.BaseOperator",
    "sensors": "airflow.sdk.bases.sensor.BaseSensorOperator",
    "triggers": "airflow.triggers.base.BaseTrigger",
}


def airflow_cli(*args: str) -> list[dict]:
    """``airflow providers <args> --output json`` in a subprocess with the tests' Airflow home."""
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", *args, "--output", "json"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=True,
        timeout=300,
    )
    return json.loads(done.stdout)


def test_provider_info_validates_against_airflows_schema():
    from airflow.providers_manager import _create_provider_info_schema_validator

    info = get_provider_info()
    _create_provider_info_schema_validator().validate(info)
    declared = {i["integration-name"] for i in info["integrations"]}
    used = {entry["integration-name"] for kind in BASES for entry in info[kind]}
    assert used <= declared


@pytest.mark.parametrize("kind", sorted(BASES))
def test_every_module_defining_a_hook_operator_sensor_or_trigger_is_registered(kind):
    base = importlib.import_module(BASES[kind].rsplit(".", 1)[0])
    base_class = getattr(base, BASES[kind].rsplit(".", 1)[1])
    package = importlib.import_module(f"trainops.{kind}")
    defining = set()
    for module_info in pkgutil.walk_packages(package.__path__, f"trainops.{kind}."):
        module = importlib.import_module(module_info.name)
        classes = inspect.getmembers(module, inspect.isclass)
        if any(issubclass(c, base_class) and c.__module__ == module.__name__ for _, c in classes):
            defining.add(module.__name__)
    registered = {m for entry in get_provider_info()[kind] for m in entry["python-modules"]}
    assert defining and registered == defining


@pytest.mark.servers
def test_airflow_lists_the_prometheus_connection_type_its_form_fields_and_the_triggers(airflow_db):
    hooks = {h["connection_type"]: h for h in airflow_cli("hooks")}
    assert hooks["trainops_prometheus"]["class"] == "trainops.hooks.prometheus.PrometheusHook"
    assert hooks["trainops_prometheus"]["hook_name"] == "Prometheus (trainops)"
    widgets = {w["connection_parameter_name"] for w in airflow_cli("widgets")}
    assert {
        "extra__trainops_prometheus__verify",
        "extra__trainops_prometheus__timeout",
        "extra__trainops_prometheus__node_label",
    } <= widgets
    assert {"field_behaviours": "trainops_prometheus"} in airflow_cli("behaviours")
    triggers = {
        t["class"] for t in airflow_cli("triggers") if t["package_name"] == "airflow-provider-trainops"
    }
    assert triggers == {f"trainops.triggers.{m}" for m in ("capacity", "checkpoint", "health", "training")}


class _Prometheus(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.servers
def test_a_trainops_prometheus_connection_reaches_prometheus_with_its_auth_headers_and_timeout(monkeypatch):
    from trainops.hooks.prometheus import PrometheusHook

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        connection = {
            "conn_type": "trainops_prometheus",
            "host": f"http://127.0.0.1:{server.server_port}",
            "login": "gate",
            "password": "s3cret",
            "extra": {"X-Scope-OrgID": "team-a", "timeout": 7, "verify": True, "node_label": "node"},
        }
        monkeypatch.setenv("AIRFLOW_CONN_FLEET_METRICS", json.dumps(connection))
        client = PrometheusHook("fleet_metrics").client()
        assert client.query("up") == []
    finally:
        server.shutdown()
    headers = _Prometheus.seen[-1]
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"gate:s3cret").decode()
    assert headers["X-Scope-OrgID"] == "team-a"
    assert "timeout" not in headers and "verify" not in headers and "node_label" not in headers
    assert client.timeout == 7.0 and client.node_label == "node"
    assert PrometheusHook("fleet_metrics", timeout_s=2.5).client().timeout == 2.5
