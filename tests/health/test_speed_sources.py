"""Node speed from signals a real cluster has: a GEMM timed once per probe start, only on idle GPUs."""

from __future__ import annotations

from trainops_devcluster.telemetry import FakeNvml, TelemetryIbReader

from trainops.health.gemm import once_per_boot
from trainops.health.probe import collect_report
from trainops.health.report import Signal


class CountingGemm:
    """A speed probe that records each call (a real GEMM would load every GPU)."""

    def __init__(self, results: list[list[Signal]]):
        self.results, self.calls = results, 0

    def __call__(self, gpu_count: int) -> list[Signal]:
        self.calls += 1
        return self.results[min(self.calls, len(self.results)) - 1][:gpu_count]


def collect(node, clock, speed_probe, previous=None):
    return collect_report(
        FakeNvml(node),
        TelemetryIbReader(node),
        node.node_name,
        now=clock.now,
        speed_probe=speed_probe,
        previous=previous,
    )


def test_gemm_never_runs_on_busy_gpus_and_the_last_speed_is_carried(node, clock):
    gemm = CountingGemm([[Signal(700.0)] * 8])
    node.set_training_active(True)
    busy = collect(node, clock, gemm)
    assert gemm.calls == 0
    assert busy.gpus["0"]["gemm_tflops"].reason == "GPUs busy; the GEMM waits until they are idle"

    node.set_training_active(False)
    idle = collect(node, clock, gemm)
    assert gemm.calls == 1 and idle.gpus["7"]["gemm_tflops"].value == 700.0
    node.set_training_active(True)
    carried = collect(node, clock, gemm, previous=idle)
    assert gemm.calls == 1 and carried.gpus["7"]["gemm_tflops"].value == 700.0


def test_once_per_boot_times_the_gemm_once_after_a_full_result():
    gemm = CountingGemm([[Signal.unknown("CUDA error")] * 4, [Signal(650.0)] * 4, [Signal(1.0)] * 4])
    speeds = once_per_boot(gemm)
    assert not speeds(4)[0].known  # a failed timing is not kept: tried again next round
    assert [s.value for s in speeds(4)] == [650.0] * 4
    assert [s.value for s in speeds(4)] == [650.0] * 4 and gemm.calls == 2
