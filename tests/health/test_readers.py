"""The production NVML and InfiniBand readers over the fake NVML, simulated telemetry and fake sysfs."""

from __future__ import annotations

import pynvml
import pytest
from trainops_devcluster.telemetry import FakeNvml, TelemetryIbReader

from tests.health.conftest import two_sample_report
from trainops.health.ib_reader import IbUnavailable, SysfsIbReader
from trainops.health.nvml_reader import NvmlReader
from trainops.health.policy import evaluate
from trainops.health.probe import collect_report


def read(fake, clock=None):
    kwargs = {"clock": clock} if clock else {}
    with NvmlReader(fake, **kwargs) as reader:
        return reader.read()


def test_healthy_node_reads_every_signal(node):
    signals, gpus = read(FakeNvml(node))
    assert signals["gpu_count"].value == 8 and signals["driver_version"].known
    assert sorted(gpus, key=int) == [str(i) for i in range(8)]
    gpu = gpus["0"]
    assert gpu["model"].value == "NVIDIA H100 80GB HBM3" and gpu["uuid"].value.startswith("GPU-")
    assert 25 <= gpu["temperature_c"].value <= 40 and gpu["temp_slowdown_c"].value == 89
    assert (gpu["ecc_uncorrected_volatile"].value, gpu["ecc_uncorrected_aggregate"].value) == (0, 0)
    assert (gpu["row_remap_pending"].value, gpu["row_remap_failure"].value) == (False, False)
    assert (gpu["nvlink_active_links"].value, gpu["nvlink_inactive_links"].value) == (18, 0)
    assert gpu["counter_nvlink_replay"].value == 0
    assert (gpu["pcie_link_width"].value, gpu["pcie_link_width_degraded"].value) == (16, False)
    assert gpu["persistence_mode"].value is True and gpu["running_processes"].value == 0
    assert gpu["recovery_action"].value == "NONE" and gpu["xid_events"].value == []
    assert gpu["power_w"].value == 70.0 and gpu["power_limit_w"].value == 700.0
    assert gpu["clock_event_reasons"].value == 0x1  # GPU idle
    # H100 has no page retirement: unknown with the NVML error, never a healthy 0.
    assert gpu["retired_pages"].value is None and "Not Supported" in gpu["retired_pages"].reason


def test_xid_events_arrive_only_after_registration(node, clock):
    node.inject_xid(48, gpu=1)  # before the reader registered: NVML never reports it
    fake = FakeNvml(node)
    with NvmlReader(fake, clock=clock) as reader:
        assert reader.read()[1]["1"]["xid_events"].value == []
        node.inject_xid(13, gpu=1)
        node.inject_xid(79, gpu=4)
        _, gpus = reader.read()
    assert gpus["1"]["xid_events"].value == [13]
    assert gpus["4"]["gpu_lost"].value is True and gpus["4"]["xid_events"].value == [79]
    assert set(gpus["4"]) == {"gpu_lost", "xid_events", "xid_events_at"}
    assert gpus["4"]["xid_events_at"].value == clock.now  # when the probe saw it


def test_xid_lookback_forgets_old_events(node, clock):
    with NvmlReader(FakeNvml(node), xid_lookback_s=600, clock=clock) as reader:
        node.inject_xid(13, gpu=0)
        assert reader.read()[1]["0"]["xid_events"].value == [13]
        clock.now += 601
        assert reader.read()[1]["0"]["xid_events"].value == []


def test_lost_gpu_quarantines_with_xid_evidence(node, clock):
    report = two_sample_report(node, clock, lambda: node.inject_xid(79, gpu=2))
    verdict = evaluate(report, now=clock.now)
    assert verdict.verdict == "quarantine"
    assert any(r.startswith("xid_fatal [gpu 2]") and "[79]" in r for r in verdict.reasons)
    assert any(r.startswith("gpu_lost [gpu 2]") for r in verdict.reasons)


def test_uncorrectable_ecc(node, clock):
    report = two_sample_report(node, clock, lambda: node.inject_ecc(2, gpu=5))
    gpu = report.gpus["5"]
    assert gpu["ecc_uncorrected_volatile"].value == 2 and gpu["row_remap_pending"].value is True
    verdict = evaluate(report, now=clock.now)
    assert verdict.verdict == "quarantine"
    assert {r.split(" ")[0] for r in verdict.reasons} == {"ecc_uncorrectable", "row_remap_pending"}


def test_nvlink_replay_errors_become_a_rate(node, clock):
    report = two_sample_report(node, clock, lambda: node.nvlink_errors(replay=5, gpu=6))
    assert report.gpus["6"]["counter_nvlink_replay"].value == 5
    assert report.gpus["6"]["nvlink_replay_per_min"].value == 5.0
    assert report.gpus["0"]["nvlink_replay_per_min"].value == 0.0
    assert evaluate(report, now=clock.now).reasons[0].startswith("nvlink_replay [gpu 6]")


def test_ib_port_down(node, clock):
    report = two_sample_report(node, clock, lambda: node.ib_down(port=1, device="mlx5_3"))
    port = report.ib_ports["mlx5_3/1"]
    assert (port["ib_state"].value, port["ib_phys_state"].value) == ("DOWN", "Polling")
    verdict = evaluate(report, now=clock.now)
    assert verdict.verdict == "quarantine"
    assert [r.split(" ")[0] for r in verdict.reasons] == ["ib_state", "ib_phys_state"]


def test_slow_gpu_shows_in_measured_speed(node, clock):
    before = two_sample_report(node, clock).gpus["3"]["gemm_tflops"].value
    node.slow_gpu(0.7, gpu=3)
    after = two_sample_report(node, clock).gpus["3"]["gemm_tflops"].value
    assert after == pytest.approx(before * 0.7, abs=0.1)


def test_training_activity(node):
    node.set_training_active(True)
    _, gpus = read(FakeNvml(node))
    assert gpus["0"]["running_processes"].value == 1 and gpus["0"]["utilization_pct"].value == 97
    assert gpus["0"]["clock_event_reasons"].value == 0x4  # busy under its power cap: not a slowdown
    assert gpus["0"]["sm_clock_mhz"].value > 0.9 * gpus["0"]["sm_clock_max_mhz"].value


def test_recovery_action(node):
    node.set_recovery_action(pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT, gpu=7)
    assert read(FakeNvml(node))[1]["7"]["recovery_action"].value == "NODE_REBOOT"


def test_nvml_error_makes_only_that_signal_unknown(node, clock):
    fake = FakeNvml(node)
    fake.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_UNKNOWN)
    _, gpus = read(fake)
    assert gpus["0"]["temperature_c"].value is None
    assert gpus["0"]["temperature_c"].reason == "nvmlDeviceGetTemperature: Unknown Error"
    assert gpus["0"]["ecc_uncorrected_volatile"].value == 0


def test_nvlink_not_supported_reads_not_applicable_and_other_errors_unknown(node):
    fake = FakeNvml(node)
    fake.fail("nvmlDeviceGetNvLinkState", pynvml.NVML_ERROR_NOT_SUPPORTED)
    gpu = read(fake)[1]["0"]
    assert gpu["nvlink_inactive_links"].na and "no NVLink" in gpu["nvlink_inactive_links"].reason
    fake.fail("nvmlDeviceGetNvLinkState", pynvml.NVML_ERROR_UNKNOWN)
    gpu = read(fake)[1]["0"]
    assert not gpu["nvlink_inactive_links"].na and "Unknown Error" in gpu["nvlink_inactive_links"].reason


def test_missing_telemetry_reports_unknown_not_healthy(node, clock):
    node.set_missing()
    report = collect_report(FakeNvml(node), TelemetryIbReader(node), node.node_name, now=clock.now)
    assert report.gpus == {} and report.ib_ports == {}
    assert "Driver Not Loaded" in report.signals["gpu_count"].reason
    assert report.signals["ib_port_count"].reason == "node telemetry unavailable"
    verdict = evaluate(report, now=clock.now)
    assert verdict.verdict == "exclude" and verdict.only_unknown


def test_real_pynvml_without_a_driver_is_unknown(monkeypatch):
    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    signals, gpus = read(pynvml)
    assert gpus == {}
    assert signals["gpu_count"].reason.split(";")[0] == "NVML cannot start: NVML Shared Library Not Found"


# -- sysfs InfiniBand ----------------------------------------------------------------------------


def make_port(
    root, device, port=1, *, state="4: ACTIVE", phys="5: LinkUp", rate="400 Gb/sec (4X NDR)", **counters
):
    port_dir = root / device / "ports" / str(port)
    (port_dir / "counters").mkdir(parents=True)
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", "InfiniBand")):
        if text is not None:
            (port_dir / name).write_text(text + "\n")
    for name, value in counters.items():
        (port_dir / "counters" / name).write_text(f"{value}\n")
    return port_dir


def test_sysfs_ports(tmp_path):
    make_port(tmp_path, "mlx5_0", symbol_error=3, link_downed=0)
    make_port(tmp_path, "mlx5_1", state="1: DOWN", phys="2: Polling", rate=None)
    (tmp_path / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error").write_text("garbage\n")
    ports = SysfsIbReader(tmp_path).read_ports()
    assert sorted(ports) == ["mlx5_0/1", "mlx5_1/1"]
    up, down = ports["mlx5_0/1"], ports["mlx5_1/1"]
    assert (up["ib_state"].value, up["ib_phys_state"].value, up["ib_rate_gbps"].value) == (
        "ACTIVE",
        "LinkUp",
        400.0,
    )
    assert up["counter_symbol_error"].value == 3 and up["ib_link_layer"].value == "InfiniBand"
    assert (down["ib_state"].value, down["ib_phys_state"].value) == ("DOWN", "Polling")
    assert down["ib_rate_gbps"].value is None and down["ib_rate_gbps"].reason == "cannot read rate"
    assert down["counter_symbol_error"].reason.startswith("cannot parse counters/symbol_error")


def test_sysfs_counter_rates_between_samples(tmp_path, node, clock):
    port_dir = make_port(tmp_path, "mlx5_0", symbol_error=0, port_rcv_errors=100)
    ib = SysfsIbReader(tmp_path)
    first = collect_report(FakeNvml(node), ib, "n", now=clock.now)
    (port_dir / "counters" / "symbol_error").write_text("30\n")
    (port_dir / "counters" / "port_rcv_errors").write_text("5\n")  # counter was reset
    second = collect_report(FakeNvml(node), ib, "n", now=clock.now + 120, previous=first)
    port = second.ib_ports["mlx5_0/1"]
    assert port["symbol_error_per_min"].value == 15.0
    assert port["port_rcv_errors_per_min"].reason == "counter reset since the previous sample"
    assert first.ib_ports["mlx5_0/1"]["symbol_error_per_min"].value is None


def test_sysfs_without_infiniband(tmp_path):
    with pytest.raises(IbUnavailable, match="does not exist"):
        SysfsIbReader(tmp_path / "absent").read_ports()
    with pytest.raises(IbUnavailable, match="no RDMA devices under"):
        SysfsIbReader(tmp_path).read_ports()
