"""The devcluster's simulated telemetry: exporter text, staleness, fault validation."""

from __future__ import annotations

import re
import threading

import pytest
from trainops_devcluster.telemetry import FakeNvml, NodeTelemetry, render_dcgm

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


def test_stale_exporter_stamps_the_values_it_last_read(clock):
    node = NodeTelemetry.healthy("n1", 2, seed=0, clock=clock)
    node.set_stale(NOW - 200)
    lines = [ln for ln in render_dcgm(node).splitlines() if not ln.startswith("#")]
    assert lines and all(ln.endswith(f" {int((NOW - 200) * 1000)}") for ln in lines)
    node.set_stale(None)
    assert not render_dcgm(node).splitlines()[-1].endswith("000")


def test_disabled_metrics_are_not_exported(clock):
    node = NodeTelemetry.healthy("n1", 2, seed=0, clock=clock)
    node.exported.discard("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
    text = render_dcgm(node)
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in text and "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{" in text


@pytest.mark.parametrize(
    ("inject", "message"),
    [
        (lambda n: n.inject_xid(79, gpu=8), "gpu must be in 0..7 on node n1, got 8"),
        (lambda n: n.inject_ecc(-1), "uncorrectable must be >= 0"),
        (lambda n: n.nvlink_errors(replay=-2, gpu=0), "replay must be >= 0"),
        (lambda n: n.slow_gpu(0), "factor must be in (0, 10]"),
        (lambda n: n.ib_down(port=2), "no RDMA port mlx5_0/2 on node n1; ports: mlx5_0/1, mlx5_1/1"),
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
                    render_dcgm(node)
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
