"""Faults seen in a burst keep their node out for the fault window after they were last seen, and the
evidence says when; GPUs slowed down under load are seen without an idle GEMM."""

from __future__ import annotations

from trainops_devcluster import topology
from trainops_devcluster.hardware import NodeProfile
from trainops_devcluster.telemetry import FakeNvml, NodeTelemetry, TelemetryIbReader

from tests.health.conftest import Clock
from trainops.health.nvml_reader import NvmlReader
from trainops.health.policy import DEFAULT_POLICY, evaluate
from trainops.health.probe import collect_report

WINDOW = 3600.0
HGX_H100 = NodeProfile()


class Probe:
    """One node's probe, reporting once a minute (or after ``wait``) on a simulated clock."""

    def __init__(self, profile: NodeProfile = HGX_H100):
        self.clock = Clock()
        self.node = NodeTelemetry.from_profile("n", profile, clock=self.clock)
        self.reader = NvmlReader(FakeNvml(self.node), xid_lookback_s=WINDOW, clock=self.clock)
        self.reader.start()
        self.node_object = topology.gpu_node(0, profile)
        self.report = None
        self.next()

    def next(self, wait: float = 60.0):
        self.clock.now += wait
        self.report = collect_report(
            self.reader,
            TelemetryIbReader(self.node),
            "n",
            now=self.clock.now,
            previous=self.report,
            window_s=WINDOW,
        )
        return evaluate(self.report, DEFAULT_POLICY, now=self.clock.now, node=self.node_object)


def test_an_nvlink_replay_burst_keeps_the_node_out_for_the_window_and_names_when():
    probe = Probe()
    probe.node.nvlink_errors(40, gpu=2)
    burst = probe.next()
    assert burst.verdict == "quarantine"
    seen_at = probe.clock.now
    for _ in range(30):  # half an hour of quiet minutes
        quiet = probe.next()
    assert quiet.verdict == "quarantine"  # the gate that runs now still sees the burst
    assert probe.report.gpus["2"]["nvlink_replay_per_min"].value == 40.0
    assert probe.report.gpus["2"]["nvlink_replay_per_min_at"].value == seen_at
    assert "(last seen 2023-11-14T22:" in quiet.reasons[0]  # when, in UTC
    after = probe.next(WINDOW)
    assert after.verdict == "ok", after.reasons


def test_an_xid_names_when_it_was_seen_and_expires_with_the_window():
    probe = Probe()
    probe.node.inject_xid(109, gpu=4)
    verdict = probe.next()
    assert verdict.verdict == "quarantine" and "last seen" in verdict.reasons[0]
    assert probe.next(WINDOW + 60).verdict == "ok"


def test_a_gpu_slowed_down_under_load_is_kept_out_and_stays_out_after_the_load_ends():
    probe = Probe()
    probe.node.set_training_active(True)  # serving inference or training: busy GPUs
    assert probe.next().verdict == "warn"  # busy (processes on the GPUs), clocks at their ceiling
    assert probe.report.gpus["3"]["slowdown_clock_pct"].value == 100.0
    probe.node.slow_gpu(0.7, gpu=3)  # the hardware holds its clock down
    slowed = probe.next()
    assert slowed.verdict == "exclude"
    assert slowed.reasons[0].startswith("clock_slowdown [gpu 3] hardware held the SM clock down under load")
    assert 60 < probe.report.gpus["3"]["slowdown_clock_pct"].value < 75
    probe.node.set_training_active(False)
    idle = probe.next(600)
    assert idle.verdict == "exclude"  # idle now, the slowdown seen ten minutes ago still counts
    assert probe.next(WINDOW).verdict == "ok"
    assert probe.report.gpus["3"]["slowdown_clock_pct"].na  # idle: clocks are judged under load
