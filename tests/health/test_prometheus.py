"""Fleet signals from the devcluster's Prometheus answers, over real HTTP with requests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from trainops_devcluster.telemetry import NodeTelemetry, prometheus_query

from tests.health.conftest import NOW, two_sample_report
from trainops.health.policy import evaluate
from trainops.health.prometheus import COUNTERS, PrometheusClient, PrometheusError, fleet_reports
from trainops.health.report import merge_reports


class FleetPrometheus:
    """A local HTTP server answering /api/v1/query from simulated telemetry, recording queries."""

    def __init__(self, fleet: dict[str, NodeTelemetry]):
        self.fleet = fleet
        self.queries: list[str] = []
        self.drop_metric: str | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                url = urlparse(self.path)
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                outer.queries.append(params["query"])
                body = prometheus_query(outer.fleet, params["query"], float(params["time"]))
                if outer.drop_metric and body["status"] == "success":
                    result = body["data"]["result"]
                    body["data"]["result"] = [
                        r for r in result if r["metric"].get("__name__") != outer.drop_metric
                    ]
                payload = json.dumps(body).encode()
                self.send_response(200 if body["status"] == "success" else 400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fleet(clock):
    nodes = {
        f"gpu-node-{i}": NodeTelemetry.healthy(f"gpu-node-{i}", 8, seed=i, clock=clock) for i in range(6)
    }
    return nodes


@pytest.fixture
def prometheus(fleet):
    server = FleetPrometheus(fleet)
    yield server
    server.close()


def test_healthy_fleet_in_a_fixed_number_of_queries(prometheus, fleet):
    reports = fleet_reports(PrometheusClient(prometheus.url), now=NOW)
    assert sorted(reports) == sorted(fleet)
    assert len(prometheus.queries) == 2 + len(COUNTERS)  # whatever the fleet size
    report = reports["gpu-node-0"]
    assert report.signals["gpu_count"].value == 8 and sorted(report.gpus, key=int) == [
        str(i) for i in range(8)
    ]
    gpu = report.gpus["0"]
    assert gpu["xid_events"].value == [] and gpu["ecc_uncorrected_volatile"].value == 0
    assert gpu["recovery_action"].value == "NONE" and gpu["tensor_active"].value == 0.0
    assert gpu["nvlink_replay_per_min"].value == 0.0 and gpu["row_remap_failure"].value is False


def test_faults_show_up_per_node(prometheus, fleet, clock):
    fleet["gpu-node-1"].inject_xid(79, gpu=3)
    clock.now += 30
    fleet["gpu-node-2"].nvlink_errors(replay=10, gpu=0)
    fleet["gpu-node-3"].set_training_active(True)
    clock.now += 30
    reports = fleet_reports(PrometheusClient(prometheus.url), now=clock.now)

    lost = reports["gpu-node-1"]
    assert lost.signals["gpu_count"].value == 7 and lost.gpus["3"]["xid_events"].value == [79]
    assert lost.gpus["3"]["temperature_c"].reason == "no DCGM_FI_DEV_GPU_TEMP series"
    assert {r.split(" ")[0] for r in evaluate(lost, now=clock.now).reasons} >= {"gpu_count", "xid_fatal"}

    assert reports["gpu-node-2"].gpus["0"]["nvlink_replay_per_min"].value == 2.0  # 10 in the 5 min window
    assert reports["gpu-node-2"].gpus["0"]["counter_nvlink_replay"].value == 10
    assert reports["gpu-node-3"].gpus["5"]["tensor_active"].value == pytest.approx(0.58)


def test_stale_and_missing_nodes_are_unknown(prometheus, fleet, clock):
    fleet["gpu-node-1"].set_stale(NOW - 200)  # still within Prometheus' lookback, but older than the bound
    fleet["gpu-node-2"].set_stale(NOW - 400)  # beyond the lookback: Prometheus returns no series
    fleet["gpu-node-3"].set_missing()
    reports = fleet_reports(
        PrometheusClient(prometheus.url), nodes=[*fleet, "gpu-node-99"], now=NOW, max_age_s=120
    )
    assert reports["gpu-node-1"].signals["gpu_count"].reason == (
        "dcgm-exporter data stale: last sample 200s old (bound 120s)"
    )
    for node in ("gpu-node-2", "gpu-node-3", "gpu-node-99"):
        assert reports[node].signals["gpu_count"].reason == "no dcgm-exporter series for this node"
        assert reports[node].gpus == {}
        assert evaluate(reports[node], now=NOW).verdict == "exclude"
    assert reports["gpu-node-0"].signals["gpu_count"].value == 8


def test_missing_metric_is_unknown_per_signal(prometheus):
    prometheus.drop_metric = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
    reports = fleet_reports(PrometheusClient(prometheus.url), now=NOW)
    gpu = reports["gpu-node-0"].gpus["2"]
    assert gpu["ecc_uncorrected_volatile"].reason == "no DCGM_FI_DEV_ECC_DBE_VOL_TOTAL series"
    verdict = evaluate(reports["gpu-node-0"], now=NOW)
    assert "ecc_uncorrectable [gpu 0, gpu 1, gpu 2, gpu 3, gpu 4, gpu 5, gpu 6, gpu 7]" in " ".join(
        verdict.reasons
    )


def test_probe_report_filled_from_prometheus(prometheus, fleet, clock):
    node = fleet["gpu-node-0"]
    probe = two_sample_report(node, clock)
    prom = fleet_reports(PrometheusClient(prometheus.url), now=clock.now)["gpu-node-0"]
    merged = merge_reports(probe, prom)
    assert merged.gpus["0"]["tensor_active"].value == 0.0  # only Prometheus has it
    assert merged.gpus["0"]["nvlink_active_links"].value == 18  # only the probe has it
    assert merged.source == "probe+prometheus"
    assert evaluate(merged, now=clock.now).verdict == "ok"


def test_unreachable_prometheus_is_a_clear_error():
    server = FleetPrometheus({})
    url = server.url
    server.close()
    with pytest.raises(PrometheusError, match=f"Prometheus at {url} unreachable"):
        fleet_reports(PrometheusClient(url, timeout=5), now=NOW)


def test_refused_query_is_a_clear_error(prometheus):
    with pytest.raises(PrometheusError, match="refused 'rate\\(x\\)': bad_data: cannot parse selector"):
        PrometheusClient(prometheus.url).query("rate(x)", at=NOW)
