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
from trainops.health.gate import GateConfig, GateError, GateResult, run_gate
from trainops.health.prometheus import COUNTERS, GAUGES, PrometheusClient

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
    assert queries == len(GAUGES) + 4 + len(COUNTERS)  # for 16 nodes, as for 4,096


def gate(cluster, **client_options) -> GateResult:
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        prometheus = PrometheusClient(cluster.prometheus_url, **client_options)
        return run_gate(client.CoreV1Api(api_client), GateConfig(speed_tiers=False), prometheus=prometheus)
    finally:
        api_client.close()


def test_the_node_label_is_found_among_dcgm_exporters_names(scraped):
    """A connection whose node_label holds no node names (here the scrape target's instance) is
    read through dcgm-exporter's own label that does, and the result says which."""
    result = gate(scraped, node_label="instance")
    assert result.warnings == [] and len(result.selected) == 16
    assert result.signal_sources["prometheus"]["node_label"] == "Hostname"
    assert "Prometheus (node label 'Hostname') filled what the probe lacked" in result.table()


def test_dcgm_exporter_main_branch_hostname_label_is_read(make_devcluster):
    cluster = make_devcluster(nodes=4, prometheus=True, exporter_node_label="hostname")
    cluster.wait_until_scraped()
    result = gate(cluster)  # the connection's default, Hostname, is absent from the series
    assert result.warnings == [] and result.signal_sources["prometheus"]["node_label"] == "hostname"
    assert result.signal_sources["prometheus"]["nodes"] == 4


def test_an_exporter_without_node_name_is_named_in_a_warning(make_devcluster):
    cluster = make_devcluster(nodes=4, prometheus=True, exporter_node_name=False)
    cluster.wait_until_scraped()
    result = gate(cluster)
    [warning] = result.warnings
    assert "dcgm-exporter series for 32 GPUs" in warning
    assert "'Hostname' holds e.g. 'nvidia-dcgm-exporter-00000'" in warning and "NODE_NAME" in warning
    assert f"WARNING: {warning}" in result.table()


def test_a_fatal_last_xid_is_fatal_when_the_probe_cannot_watch_xids(make_devcluster):
    """dcgm-exporter's default counters: the last XID is the only XID series. The node's probe cannot
    register for XID events; the gate quarantines on the gauge's value, and says what is not exported."""
    cluster = make_devcluster(nodes=4, prometheus=True, exporter_counters="default")
    node = "gpu-node-002"
    cluster.telemetry[node].set_xid_events_supported(False)
    cluster.telemetry[node].boot_id += 1  # the probe restarts and meets it
    cluster.probe_daemon.wait_rounds(2)
    cluster.inject("xid", node, code=48, gpu=5)
    cluster.wait_until_scraped()
    cluster.probe_daemon.wait_rounds(1)
    result = gate(cluster)
    verdicts = {n.name: n for n in result.nodes}
    assert verdicts[node].verdict == "quarantine", verdicts[node].reasons
    assert any(r.startswith("xid_fatal [gpu 5]") for r in verdicts[node].reasons)
    assert verdicts[node].report.gpus["5"]["xid_events"].value == [48]
    prometheus = result.signal_sources["prometheus"]
    assert prometheus["filled"]["xid_events"] == 8  # every GPU of the node whose probe cannot watch
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in prometheus["not_exported"]
    assert (
        "deploy/dcgm-exporter-counters.csv enables it"
        in prometheus["not_exported"]["DCGM_FI_DEV_ROW_REMAP_PENDING"]
    )
    assert "NOT EXPORTED by dcgm-exporter: " in result.table()


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
