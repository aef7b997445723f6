"""The probe lets the NVIDIA driver go between samples: NVML is open only while a report is sampled
(nvmlInit, the XID registration, the reads, the event set freed and nvmlShutdown), so a driver upgrade
can unload the kernel module whenever the probe is not sampling. Judged by the fake NVML's own state:
between samples every NVML call answers Uninitialized and no event set is registered."""

from __future__ import annotations

import pynvml
import pytest
from trainops_devcluster.telemetry import FakeNvml, TelemetryIbReader

from trainops.health.nvml_reader import XIDS_BETWEEN_SAMPLES, NvmlReader
from trainops.health.policy import DEFAULT_POLICY, evaluate
from trainops.health.probe import Publisher, collect_report, own_view


class WatchedNvml(FakeNvml):
    """The fake NVML, keeping the event sets it made; ``xid_in_sample`` raises that XID on GPU 0 while
    the next sample waits for events (after it registered for them)."""

    def __init__(self, telemetry):
        super().__init__(telemetry)
        self.event_sets: list = []
        self.xid_in_sample: int | None = None

    def nvmlEventSetCreate(self):
        self.event_sets.append(super().nvmlEventSetCreate())
        return self.event_sets[-1]

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if self.xid_in_sample is not None:
            self._telemetry.inject_xid(self.xid_in_sample, gpu=0)
            self.xid_in_sample = None
        return super().nvmlEventSetWait_v2(event_set, timeout_ms)


def assert_released(fake: WatchedNvml) -> None:
    """Nothing of NVML held: no initialisation outstanding, no event set registered."""
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    assert fake.event_sets and all(not s.cursors for s in fake.event_sets)


def sample(reader: NvmlReader, node, clock, previous=None):
    return collect_report(reader, TelemetryIbReader(node), node.node_name, now=clock.now, previous=previous)


def test_a_sample_opens_nvml_only_while_it_runs(node, clock):
    fake = WatchedNvml(node)
    reader = NvmlReader(fake, clock=clock)
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # nothing opened before the first sample
        fake.nvmlDeviceGetCount()
    first = sample(reader, node, clock)
    assert_released(fake)
    clock.now += 60
    second = sample(reader, node, clock, previous=first)
    assert_released(fake)
    assert len(fake.event_sets) == 2  # one XID registration per sample, each freed
    assert second.signals["gpu_count"].value == 8 and second.gpus["7"]["temperature_c"].known
    assert second.gpus["0"]["pcie_replay_per_min"].value == 0  # rates still come from two samples


def test_a_sample_that_fails_midway_still_shuts_nvml_down(node, clock):
    class Broken(WatchedNvml):
        def nvmlSystemGetDriverVersion(self):
            raise RuntimeError("the probe's own bug")

    fake = Broken(node)
    with pytest.raises(RuntimeError):
        sample(NvmlReader(fake, clock=clock), node, clock)
    assert_released(fake)


def test_a_driver_that_cannot_start_is_tried_again_at_the_next_sample(node, clock):
    """Sampled, the probe picks a reloaded driver up at its next report (held, it read a stale NVML)."""
    fake = WatchedNvml(node)
    reader = NvmlReader(fake, clock=clock)
    node.nvml_init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    down = sample(reader, node, clock)
    assert "NVML cannot start: Driver Not Loaded" in down.signals["gpu_count"].reason
    node.nvml_init_error = None
    assert sample(reader, node, clock).signals["gpu_count"].value == 8
    assert_released(fake)


def test_xids_seen_while_sampling_are_kept_and_none_seen_is_unknown_not_healthy(node, clock):
    fake = WatchedNvml(node)
    reader = NvmlReader(fake, clock=clock)
    first = sample(reader, node, clock)
    # no XID seen: the probe did not watch between samples, so it does not claim there were none;
    # the gate fills it from dcgm-exporter's XID series
    assert first.gpus["0"]["xid_events"].reason == XIDS_BETWEEN_SAMPLES
    node.inject_xid(13, gpu=1)  # between samples: not seen (NVML delivers only events after registration)
    clock.now += 60
    fake.xid_in_sample = 48  # while the second sample runs: seen
    second = sample(reader, node, clock, previous=first)
    assert second.gpus["0"]["xid_events"].value == [48]
    assert second.gpus["1"]["xid_events"].reason == XIDS_BETWEEN_SAMPLES
    verdict = evaluate(second, now=clock.now)
    assert verdict.verdict == "quarantine" and any("fatal XID" in r for r in verdict.reasons), verdict.reasons
    clock.now += 600
    third = sample(reader, node, clock, previous=second)  # kept for the fault window, NVML shut again
    assert third.gpus["0"]["xid_events"].value == [48]
    assert_released(fake)


def test_held_nvml_stays_open_and_watches_xids_between_reports(node, clock):
    """``--hold-nvml`` (and the devcluster's probe daemon): open across reports, one init, one shutdown."""
    fake = WatchedNvml(node)
    with NvmlReader(fake, clock=clock) as reader:
        first = sample(reader, node, clock)
        assert fake.nvmlDeviceGetCount() == 8  # still open between reports
        node.inject_xid(79, gpu=1)
        clock.now += 60
        second = sample(reader, node, clock, previous=first)
        assert second.gpus["1"]["xid_events"].value == [79] and second.gpus["0"]["xid_events"].value == []
    assert_released(fake)
    assert len(fake.event_sets) == 1


def test_the_probes_own_condition_warns_of_xids_between_samples_and_the_gate_policy_still_needs_them(
    node, clock
):
    """The node's GPUHealthy stays True on a healthy sampled node (the gap named in its message); the
    gate, which merges dcgm-exporter's XIDs, judges the report by the policy as it is (unknown: exclude)."""
    reader = NvmlReader(WatchedNvml(node), clock=clock)
    first = sample(reader, node, clock)
    clock.now += 60
    report = sample(reader, node, clock, previous=first)
    writes = Publisher().plan(report)
    assert writes.verdict.verdict == "warn" and writes.condition["status"] == "True"
    assert "no XID seen while the probe sampled" in writes.condition["message"]
    assert evaluate(report, now=clock.now).verdict == "exclude"  # what the gate does without dcgm-exporter


def test_an_xid_watch_unknown_for_another_reason_is_judged_as_the_policy_says(node, clock):
    node.set_xid_events_supported(False)
    report = sample(NvmlReader(WatchedNvml(node), clock=clock), node, clock)
    assert "XID events not available" in report.gpus["0"]["xid_events"].reason
    assert own_view(report, DEFAULT_POLICY) is DEFAULT_POLICY
