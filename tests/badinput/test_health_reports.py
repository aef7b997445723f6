"""Issue 15: one node's malformed health report is a reason for that node, never an error for the gate."""

from __future__ import annotations

import json

import pytest
from trainops_devcluster.telemetry import NodeTelemetry

from tests.health.conftest import Clock, two_sample_report
from trainops.health.gate import GateConfig, judge
from trainops.health.policy import load_policy
from trainops.health.published import read_report
from trainops.health.report import MAX_REPORT_CHARS, HealthReport, Signal

GOOD = {"schema_version": 1, "node": "gpu-1", "collected_at": 1.0, "source": "probe"}

BAD_REPORTS = {
    "gpus-a-list": ({**GOOD, "gpus": [{"xid": {"value": 0}}]}, "gpus must be an object keyed by gpu"),
    "gpus-a-string": ({**GOOD, "gpus": "eight"}, "gpus must be an object keyed by gpu"),
    "ib-ports-a-list": ({**GOOD, "ib_ports": [1]}, "ib_ports must be an object"),
    "signals-a-list": ({**GOOD, "signals": [{"value": 1}]}, "signals must map names to {value, reason}"),
    "signals-a-string": ({**GOOD, "signals": "ok"}, "signals must map names to {value, reason}"),
    "a-gpu-signal-a-number": ({**GOOD, "gpus": {"0": {"xid": 5}}}, "gpus['0'] must map names"),
    "node-a-number": ({**GOOD, "node": 7}, "node and source must be strings"),
    "report-a-list": ([GOOD], "must be a JSON object, not list"),
    "deep-nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "over-1-mib": ({**GOOD, "source": "x" * MAX_REPORT_CHARS}, "over the 1048576 limit"),
    "collected-at-a-string": ({**GOOD, "collected_at": "soon"}, "collected_at must be a finite number"),
    "collected-at-too-big-for-a-float": (
        {**GOOD, "collected_at": 10**400},
        "collected_at must be a finite number",
    ),
    "collected-at-infinite": (
        '{"schema_version": 1, "node": "gpu-1", "collected_at": 1e400, "source": "probe"}',
        "collected_at must be a finite number",
    ),
}


@pytest.mark.parametrize("report, message", BAD_REPORTS.values(), ids=BAD_REPORTS.keys())
def test_a_malformed_report_reads_as_a_node_that_knows_nothing(report, message):
    text = report if isinstance(report, str) else json.dumps(report)
    with pytest.raises(ValueError, match="health report") as error:
        HealthReport.from_json(text)
    assert message in str(error.value)

    read = read_report({"data": {"report.json": text}}, "gpu-1", now=5.0)

    assert read.node == "gpu-1" and read.gpus == {} and not read.signals["gpu_count"].known
    assert message in read.signals["gpu_count"].reason


# Shapes a node may write beyond what the probe writes: msgspec's typed decode (the fast path)
# takes some and refuses others to the stdlib checks; either way the report read is the same.
ODD_BUT_READABLE = {
    "extra-fields": {**GOOD, "extra": [1], "gpus": {"0": {"temperature_c": {"value": 40, "unit": "C"}}}},
    "value-missing-or-nested": {**GOOD, "gpus": {"0": {"a": {}, "xid_events": {"value": [[79], {"x": 1}]}}}},
    "huge-integer": {**GOOD, "signals": {"gpu_count": {"value": 10**30}}},
    "na-false-and-null-reason": {
        **GOOD,
        "ib_ports": {"mlx5_0/1": {"ib_state": {"value": "ACTIVE", "na": False, "reason": None}}},
    },
    "na-a-number": {**GOOD, "gpus": {"0": {"ecc_mode": {"value": None, "reason": "x", "na": 1}}}},
    "reason-a-number": {**GOOD, "signals": {"gpu_count": {"value": 8, "reason": 7}}},
    "collected-at-a-string": {**GOOD, "collected_at": "5"},
    "schema-version-a-float": {**GOOD, "schema_version": 1.0},
    "a-float-out-of-range": '{"schema_version": 1, "node": "gpu-1", "collected_at": 1, "source": "probe", "signals": {"power_w": {"value": 1e400}}}',
    "a-key-twice": '{"schema_version": 1, "node": "gpu-1", "collected_at": 1, "source": "probe", "signals": {"a": {"value": 1}, "a": {"value": 2, "value": 3}}}',
}


@pytest.mark.parametrize("report", ODD_BUT_READABLE.values(), ids=ODD_BUT_READABLE.keys())
def test_a_report_reads_the_same_through_the_fast_decode_and_the_checks(report):
    text = report if isinstance(report, str) else json.dumps(report)

    assert HealthReport.from_json(text) == HealthReport.from_dict(json.loads(text))


def gpu_node(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


@pytest.mark.parametrize(
    "gpu_signal, value, reason",
    [
        ("temperature_c", "hot", "gpu 3 temperature_c='hot' is not a value this signal can have"),
        ("ecc_uncorrected_volatile", None, "gpu 3 ecc_uncorrected_volatile=None is not a value"),
        ("xid_events", 79, "gpu 3 xid_events=79 is not a value"),
        ("gemm_tflops", "fast", "gpu 3 gemm_tflops='fast' is not a number"),
        ("clock_event_reasons", 1e400, "gpu 3 clock_event_reasons=inf is not a value"),  # JSON's 1e400
    ],
)
def test_a_value_of_the_wrong_type_excludes_its_node_alone(gpu_signal, value, reason):
    clock = Clock()
    good, bad = (
        two_sample_report(NodeTelemetry.healthy(name, gpus=8, seed=7, clock=clock), clock)
        for name in ("gpu-a", "gpu-b")
    )
    bad.gpus["3"][gpu_signal] = Signal(value)
    config = GateConfig(policy=load_policy({"report_age": {"threshold": 3600}}))

    judged = [judge(r.node, gpu_node(r.node), r, config, clock.now) for r in (good, bad)]

    assert [r.verdict for r in judged] == ["ok", "exclude"]
    assert reason in judged[1].reasons[0] and "node-health-gpu-b: " in judged[1].reasons[0]
    assert judged[0].speed is not None and judged[1].speed is None


def test_a_last_seen_time_no_clock_can_show_still_judges_the_xid():
    clock = Clock()
    report = two_sample_report(NodeTelemetry.healthy("gpu-a", gpus=8, seed=7, clock=clock), clock)
    report.gpus["3"].update(xid_events=Signal([79]), xid_events_at=Signal(1e300))
    config = GateConfig(policy=load_policy({"report_age": {"threshold": 3600}}))

    judged = judge("gpu-a", gpu_node("gpu-a"), report, config, clock.now)

    reason = judged.reasons[0]
    assert judged.verdict == "quarantine"
    assert reason.startswith("xid_fatal [gpu 3] fatal XID") and "last seen" not in reason
