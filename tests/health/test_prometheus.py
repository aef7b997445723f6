"""Fleet signals from a real Prometheus scraping the devcluster's dcgm-exporter endpoints."""

from __future__ import annotations

import json
import math
import socket
import time

import pytest
import requests
from trainops_devcluster.cluster import DevCluster
from trainops_devcluster.telemetry import NodeTelemetry

from tests.health.conftest import Clock, two_sample_report
from trainops.health.policy import evaluate
from trainops.health.prometheus import (
    COUNTERS,
    GAUGES,
    XID_LAST,
    PrometheusClient,
    PrometheusError,
    fleet_reports,
)
from trainops.health.report import merge_reports

NODES = [f"gpu-node-{i:03d}" for i in range(6)]


@pytest.fixture
def start_fleet():
    """``start_fleet(prepare)``: a 6-node devcluster with Prometheus; ``prepare(telemetry)`` runs
    before anything is scraped.  Returns the cluster once every exporter has been scraped twice
    (``increase()`` needs two samples)."""
    clusters: list[DevCluster] = []

    def start(prepare=lambda telemetry: None) -> DevCluster:
        cluster = DevCluster(nodes=6, inference=[], system_nodes=0, prometheus=True, probe_interval_s=3600)
        prepare(cluster.telemetry)
        clusters.append(cluster.start())
        cluster.wait_until_scraped()
        cluster.wait_until_scraped()
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()


def logged_queries(cluster: DevCluster) -> list[str]:
    """Every query Prometheus answered, from its query log."""
    lines = cluster.prometheus.query_log.read_text().splitlines()
    return [json.loads(line)["params"]["query"] for line in lines]


@pytest.mark.servers
def test_healthy_fleet_in_a_fixed_number_of_queries(start_fleet):
    cluster = start_fleet()
    before = len(logged_queries(cluster))
    fleet = fleet_reports(PrometheusClient(cluster.prometheus_url))
    assert sorted(fleet.reports) == NODES and fleet.label == "Hostname"
    # each metric and the last XID, the freshness, the XID counts, the recent last XIDs, each counter's increase()
    queries = len(GAUGES) + 1 + 1 + 2 + len(COUNTERS)
    assert len(logged_queries(cluster)) - before == queries  # whatever the fleet size
    report = fleet.reports["gpu-node-000"]
    assert report.signals["gpu_count"].value == 8
    assert sorted(report.gpus, key=int) == [str(i) for i in range(8)]
    gpu = report.gpus["0"]
    assert gpu["xid_events"].value == [] and gpu["ecc_uncorrected_volatile"].value == 0
    assert gpu["recovery_action"].value == "NONE" and gpu["tensor_active"].value == 0.0
    assert gpu["nvlink_replay_per_min"].value == 0.0 and gpu["row_remap_failure"].value is False
    assert gpu["model"].value == "NVIDIA H100 80GB HBM3" and gpu["slowdown_clock_pct"].na  # idle
    assert fleet.missing() == {}  # the devcluster's exporter runs deploy/dcgm-exporter-counters.csv


@pytest.mark.servers
def test_the_node_label_names_which_label_keys_the_reports(start_fleet):
    """dcgm-exporter's Hostname is the node's name only where NODE_NAME is set; a Prometheus that relabels
    the node's name (here the scrape target's ``node`` label, as from ``__meta_kubernetes_pod_node_name``)
    is read through that label, and a label that is not the node's name finds none of the nodes."""
    cluster = start_fleet()
    cluster.inject("xid", "gpu-node-001", code=79, gpu=3)
    cluster.wait_until_scraped()

    relabeled = fleet_reports(PrometheusClient(cluster.prometheus_url, node_label="node"))
    assert relabeled.label == "node" and sorted(relabeled.reports) == NODES
    assert relabeled.reports["gpu-node-001"].gpus["3"]["xid_events"].value == [79]
    by_instance = fleet_reports(PrometheusClient(cluster.prometheus_url, node_label="instance"))
    assert by_instance.label == "instance" and not set(by_instance.reports) & set(
        NODES
    )  # "gpu-node-000:9400"
    assert by_instance.label_for(NODES) == "Hostname"  # dcgm-exporter's own label holds the names


def test_a_node_label_that_is_no_label_name_is_refused_before_any_query():
    with pytest.raises(ValueError, match="node_label must be a Prometheus label name"):
        PrometheusClient("http://prometheus.invalid:9090", node_label="node) or vector(1")


@pytest.mark.servers
def test_faults_show_up_per_node(start_fleet):
    cluster = start_fleet()
    cluster.inject("xid", "gpu-node-001", code=79, gpu=3)
    cluster.inject("nvlink-errors", "gpu-node-002", replay=10, gpu=0)
    cluster.telemetry["gpu-node-003"].set_training_active(True)
    cluster.wait_until_scraped()
    reports = fleet_reports(PrometheusClient(cluster.prometheus_url)).reports

    lost = reports["gpu-node-001"]
    assert lost.signals["gpu_count"].value == 7 and lost.gpus["3"]["xid_events"].value == [79]
    assert lost.gpus["3"]["temperature_c"].reason == "no DCGM_FI_DEV_GPU_TEMP series (or not a number)"
    node = cluster.store.get("nodes", "", "gpu-node-001")  # the gate passes the node: it has 8 GPUs
    assert {r.split(" ")[0] for r in evaluate(lost, node=node).reasons} >= {"gpus_missing", "xid_fatal"}

    replay = reports["gpu-node-002"].gpus["0"]
    assert replay["counter_nvlink_replay"].value == 10
    # 10 replays in the 5 min window is 2/min; increase() extrapolates over a few seconds of history
    assert 2.0 <= replay["nvlink_replay_per_min"].value < 5.0
    assert reports["gpu-node-002"].gpus["1"]["nvlink_replay_per_min"].value == 0.0
    assert reports["gpu-node-003"].gpus["5"]["tensor_active"].value == pytest.approx(0.58)


@pytest.mark.servers
def test_stale_and_missing_nodes_are_unknown(start_fleet):
    now = time.time()

    def prepare(telemetry: dict[str, NodeTelemetry]) -> None:
        telemetry["gpu-node-001"].set_stale(now - 200)  # within Prometheus' 5 min lookback, beyond the bound
        telemetry["gpu-node-002"].set_stale(now - 400)  # beyond the lookback: no series at all
        telemetry["gpu-node-003"].set_missing()

    cluster = start_fleet(prepare)
    fleet = fleet_reports(PrometheusClient(cluster.prometheus_url), max_age_s=120)
    reports = {node: fleet.report(node) for node in [*NODES, "gpu-node-099"]}
    reason = reports["gpu-node-001"].signals["gpu_count"].reason
    assert reason.startswith("dcgm-exporter data stale: last sample 2") and reason.endswith(
        "s old (bound 120s)"
    )
    for node in ("gpu-node-002", "gpu-node-003", "gpu-node-099"):
        assert reports[node].signals["gpu_count"].reason == f'no dcgm-exporter series with Hostname="{node}"'
        assert reports[node].gpus == {}
        assert evaluate(reports[node]).verdict == "exclude"
    assert reports["gpu-node-000"].signals["gpu_count"].value == 8


@pytest.mark.servers
def test_missing_metric_is_unknown_per_signal(start_fleet):
    def prepare(telemetry: dict[str, NodeTelemetry]) -> None:
        telemetry["gpu-node-000"].exported.discard("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
        broken = telemetry[
            "gpu-node-001"
        ]  # its exporter serves NaN or an infinity for three of GPU 2's fields
        broken.write_exporter_value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", math.inf, gpu=2)
        broken.write_exporter_value("DCGM_FI_DEV_ROW_REMAP_FAILURE", math.nan, gpu=2)
        broken.write_exporter_value(XID_LAST, math.nan, gpu=2)

    cluster = start_fleet(prepare)
    reports = fleet_reports(PrometheusClient(cluster.prometheus_url)).reports
    gpu = reports["gpu-node-000"].gpus["2"]
    assert (
        gpu["ecc_uncorrected_volatile"].reason == "no DCGM_FI_DEV_ECC_DBE_VOL_TOTAL series (or not a number)"
    )
    verdict = evaluate(reports["gpu-node-000"])
    assert "ecc_uncorrectable [gpu 0, gpu 1, gpu 2, gpu 3, gpu 4, gpu 5, gpu 6, gpu 7]" in " ".join(
        verdict.reasons
    )
    assert reports["gpu-node-002"].gpus["2"]["ecc_uncorrected_volatile"].value == 0

    # not a number is no reading: unknown, never a value (NaN read as a row-remap failure, or as no XID)
    broken, healthy = evaluate(reports["gpu-node-001"]), evaluate(reports["gpu-node-002"])
    assert broken.verdict == "exclude" and broken.only_unknown
    added = sorted(set(broken.reasons) - set(healthy.reasons))
    assert [r.split(" ")[0] for r in added] == ["ecc_uncorrectable", "row_remap_failure", "xid_fatal"]
    assert all(" [gpu 2] " in r and "or not a number" in r for r in added), added


@pytest.mark.servers
def test_probe_report_filled_from_prometheus(start_fleet):
    cluster = start_fleet()
    clock = Clock(time.time() - 60)  # the probe's second sample lands now
    probe = two_sample_report(NodeTelemetry.healthy("gpu-node-000", 8, seed=0, clock=clock), clock)
    prom = fleet_reports(PrometheusClient(cluster.prometheus_url)).reports["gpu-node-000"]
    merged = merge_reports(probe, prom)
    assert merged.gpus["0"]["tensor_active"].value == 0.0  # only Prometheus has it
    assert merged.gpus["0"]["nvlink_active_links"].value == 18  # only the probe has it
    assert merged.source == "probe+prometheus"
    assert evaluate(merged).verdict == "ok"


@pytest.mark.servers
def test_nodes_that_come_and_go_are_scraped_or_dropped(start_fleet):
    cluster = start_fleet()
    url = f"{cluster.prometheus_url}/api/v1/query"

    def scraped() -> list[str]:
        body = requests.get(url, params={"query": 'up{job="dcgm-exporter"} == 1'}, timeout=10).json()
        return sorted(r["metric"]["node"] for r in body["data"]["result"])

    assert scraped() == NODES
    node = cluster.store.get("nodes", "", "gpu-node-004")
    cluster.store.delete("nodes", "", "gpu-node-004")
    until(lambda: scraped() == [n for n in NODES if n != "gpu-node-004"])
    cluster.store.create("nodes", node)
    until(lambda: scraped() == NODES)


def until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "Prometheus did not follow the nodes"
        time.sleep(0.5)


def test_unreachable_prometheus_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(PrometheusError, match=f"Prometheus at {url} unreachable"):
        fleet_reports(PrometheusClient(url, timeout=5))


@pytest.mark.servers
def test_refused_query_is_a_clear_error(start_fleet):
    cluster = start_fleet()
    with pytest.raises(PrometheusError, match=r"refused 'rate\(x\)': bad_data: .*expected type range vector"):
        PrometheusClient(cluster.prometheus_url).query("rate(x)")
