"""The devcluster's simulated telemetry: exporter text, Prometheus query answers, fault validation."""

from __future__ import annotations

import re
import threading

import pytest
from trainops_devcluster.telemetry import FakeNvml, NodeTelemetry, prometheus_query, render_dcgm

from tests.health.conftest import NOW
from trainops.health.nvml_reader import NvmlReader


def test_healthy_is_deterministic_by_seed():
    a, b, c = (NodeTelemetry.healthy("n1", 8, seed=s) for s in (1, 1, 2))
    assert render_dcgm(a) == render_dcgm(b) != render_dcgm(c)
    assert len({g.uuid for g in a.gpus}) == 8


def test_render_dcgm_looks_like_dcgm_exporter(clock):
    node = NodeTelemetry.healthy("gpu-node-a", 2, seed=0, clock=clock)
    node.inject_xid(13, gpu=1)
    text = render_dcgm(node)
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in text
    line = next(ln for ln in text.splitlines() if ln.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="1"'))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert set(labels) == {
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
    }
    assert labels["Hostname"] == "gpu-node-a" and labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert re.search(r'DCGM_EXP_XID_ERRORS_COUNT\{gpu="1",.*xid="13"\} 1$', text, re.M)
    assert re.search(r'DCGM_FI_DEV_XID_ERRORS\{gpu="1",.*\} 13$', text, re.M)
    node.set_missing()
    assert render_dcgm(node) == ""


@pytest.fixture
def fleet(clock):
    return {name: NodeTelemetry.healthy(name, 2, seed=0, clock=clock) for name in ("a", "b")}


def result(fleet, query):
    body = prometheus_query(fleet, query, NOW)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_query_forms(fleet, clock):
    assert len(result(fleet, "DCGM_FI_DEV_GPU_TEMP")) == 4
    only = result(fleet, 'DCGM_FI_DEV_GPU_TEMP{Hostname="b", gpu="1"}')
    assert [(r["metric"]["Hostname"], r["metric"]["gpu"]) for r in only] == [("b", "1")]
    assert only[0]["value"][0] == NOW
    names = {
        r["metric"]["__name__"]
        for r in result(fleet, '{__name__=~"DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_POWER_USAGE"}')
    }
    assert names == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"}
    assert len(result(fleet, 'DCGM_FI_DEV_GPU_TEMP{gpu!="0"}')) == 2
    stamps = result(fleet, "timestamp(DCGM_FI_DEV_GPU_TEMP)")
    assert {float(r["value"][1]) for r in stamps} == {NOW - NOW % 15} and "__name__" not in stamps[0][
        "metric"
    ]


def test_increase_counts_only_the_window(fleet, clock):
    clock.now = NOW - 600
    fleet["a"].nvlink_errors(replay=4, gpu=1)
    clock.now = NOW - 60
    fleet["a"].nvlink_errors(replay=3, gpu=1)
    query = "increase(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL[5m])"
    values = {(r["metric"]["Hostname"], r["metric"]["gpu"]): r["value"][1] for r in result(fleet, query)}
    assert values == {("a", "0"): "0", ("a", "1"): "3", ("b", "0"): "0", ("b", "1"): "0"}
    total = result(fleet, 'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{Hostname="a",gpu="1"}')
    assert total[0]["value"][1] == "7"


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("rate(x[5m])", "cannot parse selector"),
        ("increase(DCGM_FI_DEV_GPU_TEMP)", "increase() needs a range selector"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0"', "cannot parse selector"),
        ("DCGM_FI_DEV_GPU_TEMP{gpu=0}", "cannot parse label matchers"),
    ],
)
def test_bad_queries_answer_like_prometheus(fleet, query, error):
    body = prometheus_query(fleet, query, NOW)
    assert body["status"] == "error" and body["errorType"] == "bad_data" and error in body["error"]


def test_missing_node_has_no_series(fleet):
    fleet["a"].set_missing()
    assert {r["metric"]["Hostname"] for r in result(fleet, "DCGM_FI_DEV_GPU_TEMP")} == {"b"}


@pytest.mark.parametrize(
    ("inject", "message"),
    [
        (lambda n: n.inject_xid(79, gpu=8), "gpu must be in 0..7 on node n1, got 8"),
        (lambda n: n.inject_ecc(-1), "uncorrectable must be >= 0"),
        (lambda n: n.nvlink_errors(replay=-2, gpu=0), "replay must be >= 0"),
        (lambda n: n.slow_gpu(0), "factor must be in (0, 10]"),
        (lambda n: n.ib_down(port=2), "no InfiniBand port mlx5_0/2 on node n1; ports: mlx5_0/1"),
    ],
)
def test_bad_fault_requests_name_the_problem(inject, message):
    node = NodeTelemetry.healthy("n1", 8, seed=0)
    before = render_dcgm(node)
    with pytest.raises(ValueError) as raised:
        inject(node)
    assert message in str(raised.value)
    assert render_dcgm(node) == before


def test_faults_while_a_reader_thread_reads(clock):
    node = NodeTelemetry.healthy("n1", 8, seed=0, clock=clock)
    done = threading.Event()
    failures: list[BaseException] = []

    def keep_reading():
        try:
            with NvmlReader(FakeNvml(node), clock=clock) as reader:
                while not done.is_set():
                    reader.read()
                    prometheus_query({"n1": node}, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", NOW)
        except BaseException as err:  # surfaced by the assertion below
            failures.append(err)

    reader = threading.Thread(target=keep_reading)
    reader.start()
    for i in range(200):
        node.inject_ecc(1, gpu=i % 8)
        node.set_training_active(i % 2 == 0)
    done.set()
    reader.join()
    assert failures == []
    assert sum(g.ecc_uncorrected for g in node.gpus) == 200
