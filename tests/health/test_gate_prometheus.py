"""Prometheus in the gate: fleet-wide queries to the devcluster's real Prometheus, and never a silent
pass when it is down."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests
from kubernetes import client, config
from trainops_devcluster.airflow_home import xcom_value

from trainops.cli import main
from trainops.health.gate import GateConfig, GateError, run_gate
from trainops.health.prometheus import PrometheusClient

WRITES = ("create", "update", "patch", "delete")


@pytest.fixture
def core_v1(k8s):
    return client.CoreV1Api(k8s)


@pytest.fixture
def dead_url() -> str:
    """A local URL where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def scraped(make_devcluster):
    """The 16-node devcluster with Prometheus, once every exporter has been scraped twice."""
    cluster = make_devcluster(prometheus=True)
    cluster.wait_until_scraped()
    cluster.wait_until_scraped()
    return cluster


def test_prometheus_fills_what_the_probe_lacks_with_a_few_fleet_queries(scraped):
    scraped.probe_daemon.wait_rounds(2)
    prometheus = PrometheusClient(scraped.prometheus_url)
    before = len(scraped.prometheus.query_log.read_text().splitlines())
    api_client = config.new_client_from_config(config_file=str(scraped.kubeconfig))
    result = run_gate(client.CoreV1Api(api_client), GateConfig(speed_tiers=False), prometheus=prometheus)
    api_client.close()
    assert result.sources == ["probe", "prometheus"] and len(result.selected) == 16
    report = result.nodes[0].report
    assert report.gpus["0"]["tensor_active"].known  # only dcgm-exporter has it
    queries = len(scraped.prometheus.query_log.read_text().splitlines()) - before
    assert 0 < queries <= 30  # for 16 nodes, as for 4,096


def test_a_node_label_that_holds_no_node_names_is_named_in_the_result(scraped):
    """A connection whose node_label is not where the exporter puts the node's name: every node is
    without series, and the result says which label was read and how to change it."""
    api_client = config.new_client_from_config(config_file=str(scraped.kubeconfig))
    prometheus = PrometheusClient(scraped.prometheus_url, node_label="instance")
    result = run_gate(client.CoreV1Api(api_client), GateConfig(speed_tiers=False), prometheus=prometheus)
    api_client.close()
    [warning] = result.warnings
    assert "dcgm-exporter series for 16 values of label 'instance'" in warning
    assert "set the Prometheus connection's node_label (CLI: --prometheus-node-label)" in warning
    assert f"WARNING: {warning}" in result.table()


def test_unreachable_prometheus_fails_the_gate_with_a_clear_error(devcluster, core_v1, dead_url, capsys):
    with pytest.raises(GateError, match=f"Prometheus at {dead_url} unreachable.*on_unavailable='probe-only'"):
        run_gate(core_v1, GateConfig(), prometheus=PrometheusClient(dead_url))
    args = ["health", "gate", "--kubeconfig", str(devcluster.kubeconfig), "--prometheus", dead_url]
    assert main(args) == 1
    assert "error: Prometheus at" in capsys.readouterr().err
    assert [e for e in devcluster.server.audit.entries() if e["verb"] in WRITES] == []


def test_probe_only_gates_on_the_probe_reports_and_says_so(devcluster, core_v1, dead_url, capsys):
    devcluster.probe_daemon.wait_rounds(2)
    devcluster.inject("ib-down", "gpu-node-007")
    devcluster.probe_daemon.wait_rounds(2)
    config = GateConfig(on_unavailable="probe-only", speed_tiers=False)
    result = run_gate(core_v1, config, prometheus=PrometheusClient(dead_url))
    assert result.sources == ["probe"]
    assert result.warnings[0].startswith("Prometheus unavailable, gated on the node probe's reports alone")
    assert {n.name: n.verdict for n in result.nodes}["gpu-node-007"] == "quarantine"
    assert "gpu-node-007" not in result.selected and len(result.selected) == 15

    args = ["health", "gate", "--kubeconfig", str(devcluster.kubeconfig), "--prometheus", dead_url]
    assert main([*args, "--prometheus-optional", "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["warnings"][0].startswith("Prometheus unavailable") and "gpu-node-007" not in out["selected"]


def test_devcluster_prometheus_is_real_honours_time_and_answers_400_on_errors(scraped):
    build = requests.get(f"{scraped.prometheus_url}/api/v1/status/buildinfo", timeout=10).json()
    assert build["data"]["version"].startswith("2.")
    url = f"{scraped.prometheus_url}/api/v1/query"
    at = time.time() - 0.5
    body = requests.get(
        url, params={"query": "timestamp(DCGM_FI_DEV_GPU_TEMP)", "time": at}, timeout=10
    ).json()
    samples = body["data"]["result"]
    assert len(samples) == 16 * 8
    assert all(s["value"][0] == pytest.approx(at) and float(s["value"][1]) <= at for s in samples)
    bad = requests.get(url, params={"query": "increase(DCGM_FI_DEV_GPU_TEMP)"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["errorType"] == "bad_data"


def test_operator_fails_on_unreachable_prometheus_and_passes_probe_only(
    devcluster, run_dag, monkeypatch, dead_url
):
    monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS", json.dumps({"conn_type": "http", "host": dead_url}))
    devcluster.probe_daemon.wait_rounds(2)
    conf = {"min_nodes": 4, "prometheus_conn_id": "prometheus"}
    assert run_dag("health_gate", conf).state == "failed"

    run = run_dag("health_gate", {**conf, "on_prometheus_unavailable": "probe-only"})
    assert run.state == "success"
    gate = xcom_value(run, "gate")
    assert len(gate["node_names"]) == 16 and "Prometheus unavailable" in gate["warnings"][0]
