"""Every policy row passes on a healthy value and trips on a bad one; overrides and unknowns."""

from __future__ import annotations

import json

import pytest

from tests.health.conftest import two_sample_report
from trainops.health.policy import DEFAULT_POLICY, evaluate, load_policy
from trainops.health.report import HealthReport, Signal

# row name -> (a value that passes, a value that trips)
ROW_CASES = {
    "report_age": (10, 301),
    "gpu_count": (8, 0),
    "gpus_missing": (0, 1),
    "gpu_lost": (False, True),
    "xid_fatal": ([43, 45], [79]),
    "xid_undecoded": ([147], [149]),
    "xid_warn": ([43, 147], [13]),
    "recovery_action": ("NONE", "GPU_RESET"),
    "ecc_uncorrectable": (0, 1),
    "ecc_correctable": (20_000_000, 20_000_001),
    "row_remap_failure": (False, True),
    "row_remap_pending": (False, True),
    "remapped_rows": (511, 512),
    "retired_pages": (62, 63),
    "retired_pending": (False, True),
    "throttling": (0x1 | 0x4, 0x40),
    "clock_slowdown": (100.0, 68.0),  # % of the max SM clock while busy and held down
    "slowed_in_training": (0.0, 43.0),  # % slower than the run's median step
    "thermal_warn": (84, 85),
    "thermal_critical": (84, 95),
    "pcie_link": (False, True),
    "pcie_replay": (31, 32),
    "nvlink_down": (0, 1),
    "nvlink_replay": (0, 1),
    "nvlink_recovery": (0, 1),
    "nvlink_crc_flit": (5999, 6000),
    "nvlink_crc_data": (5999, 6000),
    "persistence_mode": (True, False),
    "gpu_in_use": (0, 1),
    "tensor_busy": (0.0, 0.6),
    "ib_port_count": (8, 0),
    "ib_ports_missing": (0, 1),
    "ib_state": ("ACTIVE", "DOWN"),
    "ib_phys_state": ("LinkUp", "Polling"),
    "ib_rate": (0.0, 200.0),  # Gb/s below the fabric's rate
    "ib_symbol_errors": (9, 10),
    "ib_link_recovery": (9, 10),
    "ib_link_downed": (0, 1),
    "ib_rcv_errors": (9, 10),
    "ib_xmit_discards": (99, 100),
}
ROWS = {row.name: row for row in DEFAULT_POLICY.rows}
NODE = {"metadata": {"labels": {}}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}


@pytest.fixture
def healthy(node, clock) -> HealthReport:
    return two_sample_report(node, clock)


def with_value(report: HealthReport, row_name: str, value) -> tuple[HealthReport, dict]:
    """``report`` (and the Node object beside it) changed so that ``row_name``'s signal reads ``value``;
    derived signals are set through what they derive from."""
    row = ROWS[row_name]
    node = json.loads(json.dumps(NODE))
    if row.signal == "report_age_s":
        report.collected_at -= value
    elif row.signal == "gpus_missing":  # the node advertises more GPUs than NVML sees
        node["status"]["capacity"]["nvidia.com/gpu"] = str(8 + value)
    elif row.signal == "ib_ports_missing":  # the node's label says it has more fabric ports
        node["metadata"]["labels"]["trainops.io/ib-port-count"] = str(8 + value)
    elif row.signal == "fabric_ports":
        report.ib_ports = dict(list(report.ib_ports.items())[:value])
        report.signals["ib_port_count"] = Signal(value)
    elif row.signal == "slowdown_pct":  # a training run kept it on the node ten minutes ago
        slow = {
            "node": "gpu-node-a",
            "step_s": 1.43,
            "median_s": 1.0,
            "pct_slower": value,
            "at": report.collected_at - 600,
        }
        node["metadata"]["annotations"] = {"trainops.io/slowdown": json.dumps(slow)}
    elif row.signal == "nvlink_links_down":  # an H100 SXM has 18 links
        report.gpus["3"]["nvlink_active_links"] = Signal(18 - value)
    elif row.signal == "ib_rate_shortfall_gbps":  # the other ports run at NDR's 400
        report.ib_ports["mlx5_2/1"]["ib_rate_gbps"] = Signal(400.0 - value)
    elif row.scope == "node":
        report.signals[row.signal] = Signal(value)
    elif row.scope == "gpu":
        report.gpus["3"][row.signal] = Signal(value)
    else:
        report.ib_ports["mlx5_2/1"][row.signal] = Signal(value)
    return report, node


def test_every_row_has_cases():
    assert set(ROW_CASES) == set(DEFAULT_POLICY.names)


def test_healthy_node_is_ok(healthy, clock):
    verdict = evaluate(healthy, now=clock.now)
    assert (verdict.verdict, verdict.reasons) == ("ok", [])


@pytest.mark.parametrize("row_name", sorted(ROW_CASES))
def test_row_passes(row_name, healthy, clock):
    report, node = with_value(healthy, row_name, ROW_CASES[row_name][0])
    verdict = evaluate(report, now=clock.now, node=node)
    assert verdict.verdict == "ok", verdict.reasons
    assert not [e for e in verdict.evidence if e["row"] == row_name and e["kind"] == "tripped"]


@pytest.mark.parametrize("row_name", sorted(ROW_CASES))
def test_row_trips(row_name, healthy, clock):
    report, node = with_value(healthy, row_name, ROW_CASES[row_name][1])
    verdict = evaluate(report, now=clock.now, node=node)
    assert verdict.verdict == ROWS[row_name].verdict
    assert any(reason.startswith(f"{row_name} [") for reason in verdict.reasons), verdict.reasons


def test_required_signal_unknown_excludes_with_reason(healthy, clock):
    healthy.gpus["2"]["ecc_uncorrected_volatile"] = Signal.unknown(
        "nvmlDeviceGetTotalEccErrors: Unknown Error"
    )
    verdict = evaluate(healthy, now=clock.now)
    assert verdict.verdict == "exclude"
    assert verdict.only_unknown
    assert verdict.reasons == [
        "ecc_uncorrectable [gpu 2] ecc_uncorrected_volatile unknown: nvmlDeviceGetTotalEccErrors: Unknown Error"
    ]


def test_optional_signal_unknown_warns_never_ok(healthy, clock):
    del healthy.ib_ports["mlx5_0/1"]["symbol_error_per_min"]
    verdict = evaluate(healthy, now=clock.now)
    assert verdict.verdict == "warn"
    assert verdict.reasons == ["ib_symbol_errors [ib mlx5_0/1] symbol_error_per_min unknown: not in report"]


def test_report_without_anything_is_excluded(clock):
    report = HealthReport.empty("gpu-node-x", clock.now, "prometheus", "no dcgm-exporter series")
    verdict = evaluate(report, now=clock.now)
    assert verdict.verdict == "exclude"
    assert any("gpu_count unknown: no dcgm-exporter series" in r for r in verdict.reasons)


def test_same_reason_on_many_gpus_is_one_line(healthy, clock):
    for gpu in ("0", "5"):
        healthy.gpus[gpu]["xid_events"] = Signal([79])
    verdict = evaluate(healthy, now=clock.now)
    assert verdict.reasons == [
        "xid_fatal [gpu 0, gpu 5] fatal XID (NVIDIA catalog: reset/reboot): xid_events=[79] (any_in "
        + repr(ROWS["xid_fatal"].threshold)[:56]
        + "...])"
    ]


def test_override_threshold_and_verdict(healthy, clock):
    healthy.signals.update(gpu_count=Signal(4))
    assert evaluate(healthy, now=clock.now, node=NODE).verdict == "quarantine"
    policy = DEFAULT_POLICY.with_overrides({"gpus_missing": {"threshold": 4}})
    assert evaluate(healthy, policy, now=clock.now, node=NODE).verdict == "ok"
    healthy.gpus["1"]["xid_events"] = Signal([13])
    stricter = policy.with_overrides({"xid_warn": {"verdict": "exclude"}})
    assert evaluate(healthy, stricter, now=clock.now, node=NODE).verdict == "exclude"
    assert DEFAULT_POLICY.with_overrides({"gpus_missing": {"threshold": 4}}) == policy


def test_expected_gpu_count_is_the_nodes_own_not_a_constant(healthy, clock):
    healthy.signals.update(gpu_count=Signal(4))
    four = {"metadata": {"labels": {"nvidia.com/gpu.count": "4"}}, "status": {}}
    assert evaluate(healthy, now=clock.now, node=four).verdict == "ok"
    verdict = evaluate(healthy, now=clock.now, node=NODE)
    assert verdict.verdict == "quarantine"
    assert verdict.reasons[0].startswith(
        "gpus_missing [node] fewer GPUs (or MIG devices) than the node advertises (reboot): gpus_missing=4"
    )
    # the probe evaluating itself: nothing to compare with, shown as such
    alone = evaluate(healthy, now=clock.now)
    assert alone.verdict == "ok"
    assert any(line.startswith("gpus_missing [node] no Node object") for line in alone.not_applicable)


def test_row_switched_off_with_verdict_ok(healthy, clock):
    healthy.gpus["1"]["running_processes"] = Signal(3)
    policy = load_policy({"gpu_in_use": {"verdict": "ok"}})
    assert evaluate(healthy, policy, now=clock.now).verdict == "ok"


def test_unknown_row_name_is_an_error_listing_valid_rows():
    with pytest.raises(ValueError) as raised:
        DEFAULT_POLICY.with_overrides({"xid_fatl": {"verdict": "warn"}})
    message = str(raised.value)
    assert "'xid_fatl'" in message and "xid_fatal" in message and "ib_rate" in message


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"signal": "x"}, "field 'signal': cannot be overridden"),
        ({"verdict": "panic"}, "'panic' is not a verdict"),
        ({"if_unknown": "maybe"}, "'maybe' is not a verdict"),
        ({"threshold": "eight"}, "'eight' is not like the default 1"),
        ({"threshold": True}, "True is not like the default 1"),
    ],
)
def test_bad_override_names_the_field(changes, expected):
    with pytest.raises(ValueError, match="policy row 'gpu_count'") as raised:
        DEFAULT_POLICY.with_overrides({"gpu_count": changes})
    assert expected in str(raised.value)


def test_policy_from_yaml_and_json_files(tmp_path, healthy, clock):
    healthy.gpus["0"]["temperature_c"] = Signal(90)
    (tmp_path / "p.yaml").write_text("thermal_warn:\n  threshold: 92\n")
    (tmp_path / "p.json").write_text(json.dumps({"thermal_warn": {"verdict": "exclude"}}))
    assert evaluate(healthy, now=clock.now).verdict == "warn"
    assert evaluate(healthy, load_policy(tmp_path / "p.yaml"), now=clock.now).verdict == "ok"
    assert evaluate(healthy, load_policy(str(tmp_path / "p.json")), now=clock.now).verdict == "exclude"
    (tmp_path / "bad.yaml").write_text("- thermal_warn\n")
    with pytest.raises(ValueError, match="expected a mapping of row name"):
        load_policy(tmp_path / "bad.yaml")
