"""The probe: report format, publishing (ConfigMap + node summary) over HTTP, and the ``trainops probe`` CLI."""

from __future__ import annotations

import json
import os
import signal
import threading
from datetime import datetime, timedelta

import kubernetes
import pynvml
import pytest
from trainops_devcluster.telemetry import FakeNvml, TelemetryIbReader

from tests.health.conftest import two_sample_report
from trainops.cli import main
from trainops.errors import TemporaryError
from trainops.health.probe import LEGACY_REPORT_ANNOTATION as LEGACY
from trainops.health.probe import Publisher, collect_report, publish
from trainops.health.report import SCHEMA_VERSION, HealthReport

NODE = "gpu-node-a"


@pytest.fixture
def cluster(devcluster):
    """The devcluster with a node named like the test telemetry, which the probe daemon leaves alone."""
    devcluster.store.create("nodes", {"metadata": {"name": NODE, "annotations": {"other.io/keep": "yes"}}})
    devcluster.store.mutate(
        "nodes", "", NODE, lambda n: n.setdefault("status", {}).update(conditions=[READY])
    )
    return devcluster


READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready"}


@pytest.fixture
def core_api(cluster, k8s):
    return kubernetes.client.CoreV1Api(k8s)


class RacingKubelet:
    """A CoreV1Api whose next ``writes`` node reads are each followed by a kubelet heartbeat write,
    so the patch built from that read meets a newer resourceVersion (409) on the real server."""

    def __init__(self, core_api, store, writes: int):
        self.core_api, self.store, self.writes, self.conflicts = core_api, store, writes, 0
        self.api_client = core_api.api_client

    def _racing(self, read):
        def wrapped(name, **kwargs):
            node = read(name, **kwargs)
            if self.writes:
                self.writes -= 1
                self.conflicts += 1
                beat = lambda n: n["status"]["conditions"][0].update(message=f"heartbeat {self.writes}")  # noqa: E731
                self.store.mutate("nodes", "", name, beat)
            return node

        return wrapped

    def __getattr__(self, name):
        attr = getattr(self.core_api, name)
        return self._racing(attr) if name in ("read_node", "read_node_status") else attr


@pytest.fixture
def no_driver(monkeypatch):
    def fail():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)


def moment(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def stored(cluster, name=NODE) -> dict:
    return cluster.store.get("nodes", "", name)


def conditions(cluster, name=NODE):
    return {c["type"]: c for c in stored(cluster, name)["status"]["conditions"]}


def test_report_round_trips_through_json(node, clock):
    report = two_sample_report(node, clock)
    data = json.loads(report.to_json())
    assert data["schema_version"] == SCHEMA_VERSION and data["node"] == "gpu-node-a"
    assert data["gpus"]["0"]["retired_pages"] == {  # not applicable: H100 remaps rows instead
        "value": None,
        "reason": "nvmlDeviceGetRetiredPages: Not Supported",
        "na": True,
    }
    assert data["gpus"]["0"]["ecc_uncorrected_volatile"] == {"value": 0}
    assert HealthReport.from_json(report.to_json()).to_dict() == report.to_dict()


def test_unknown_schema_version_is_refused(node, clock):
    data = two_sample_report(node, clock).to_dict()
    data["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99 is not supported; this trainops reads 1"):
        HealthReport.from_dict(data)


def test_collect_report_opens_a_module_for_one_report(node, clock):
    report = collect_report(FakeNvml(node), TelemetryIbReader(node), "gpu-node-a", now=clock.now)
    assert report.signals["gpu_count"].value == 8 and report.signals["ib_port_count"].value == 8
    assert report.gpus["0"]["gemm_tflops"].reason == "speed probe not run"
    assert report.gpus["0"]["nvlink_replay_per_min"].reason.startswith("rate needs two samples")


def configmap(cluster, name=NODE) -> dict | None:
    return cluster.store.find("configmaps", "trainops-system", f"node-health-{name}")


def test_publish_puts_the_report_in_a_configmap_and_a_small_summary_on_the_node(
    node, clock, cluster, core_api
):
    cluster.store.mutate("nodes", "", NODE, lambda n: n["metadata"]["annotations"].update({LEGACY: "{}"}))
    report = two_sample_report(node, clock)
    writes = publish(report, core_api, Publisher())
    held = configmap(cluster)
    assert HealthReport.from_json(held["data"]["report.json"]).to_dict() == report.to_dict()
    assert held["metadata"]["labels"] == {"trainops.io/node-health-report": "true"}
    annotations = stored(cluster)["metadata"]["annotations"]
    assert annotations["other.io/keep"] == "yes" and LEGACY not in annotations
    summary = json.loads(annotations["trainops.io/health-summary"])
    assert summary["verdict"] == "ok" and summary["report"] == f"trainops-system/node-health-{NODE}"
    assert summary["digest"] == held["metadata"]["annotations"]["trainops.io/health-digest"]
    assert len(json.dumps(stored(cluster))) < 4096 < len(held["data"]["report.json"])
    assert conditions(cluster)["Ready"]["status"] == "True"
    ours = conditions(cluster)["GPUHealthy"]
    assert (ours["status"], ours["reason"], ours["message"]) == (
        "True",
        "HealthChecksPassed",
        "ok: all checks passed",
    )
    assert writes.condition == ours


def test_steady_readings_write_only_heartbeats_and_a_fault_writes_at_once(node, clock, cluster, core_api):
    publisher = Publisher(report_heartbeat_s=120, node_heartbeat_s=600)
    publish(two_sample_report(node, clock), core_api, publisher)
    versions = [
        (stored(cluster)["metadata"]["resourceVersion"], configmap(cluster)["metadata"]["resourceVersion"])
    ]
    for _ in range(12):  # 12 more reports a minute apart: readings move, no threshold is crossed
        publish(two_sample_report(node, clock), core_api, publisher)
        versions.append(
            (
                stored(cluster)["metadata"]["resourceVersion"],
                configmap(cluster)["metadata"]["resourceVersion"],
            )
        )
    node_writes = len({v[0] for v in versions}) - 1
    report_writes = len({v[1] for v in versions}) - 1
    assert node_writes == 1  # the condition's heartbeat, 10 minutes on
    assert report_writes == 6  # every 2 minutes
    assert HealthReport.from_json(configmap(cluster)["data"]["report.json"]).collected_at >= clock.now - 120

    clock.now += 1
    broken = two_sample_report(node, clock, lambda: node.inject_xid(79, gpu=1))
    writes = publish(broken, core_api, publisher)
    assert writes.configmap is not None and writes.condition is not None
    summary = json.loads(stored(cluster)["metadata"]["annotations"]["trainops.io/health-summary"])
    assert summary["verdict"] == "quarantine" and any("xid_fatal [gpu 1]" in r for r in summary["reasons"])
    assert (
        HealthReport.from_json(configmap(cluster)["data"]["report.json"]).collected_at == broken.collected_at
    )
    assert conditions(cluster)["GPUHealthy"]["status"] == "False"


def test_publish_retries_on_conflict_and_keeps_transition_time(node, clock, cluster, core_api):
    publisher = Publisher()
    publish(two_sample_report(node, clock), core_api, publisher)
    first_transition = moment(conditions(cluster)["GPUHealthy"]["lastTransitionTime"])
    racing = RacingKubelet(core_api, cluster.store, writes=2)
    clock.now += 3600
    publish(two_sample_report(node, clock), racing, publisher)
    assert racing.conflicts == 2
    patches = [
        e
        for e in cluster.server.audit.entries()
        if e["verb"] == "patch" and e["path"].endswith(f"/{NODE}/status")
    ]
    assert [e["status"] for e in patches[-3:]] == [409, 409, 200]
    ours = conditions(cluster)["GPUHealthy"]
    assert moment(ours["lastTransitionTime"]) == first_transition
    assert moment(ours["lastHeartbeatTime"]) == first_transition + timedelta(seconds=3660)
    assert conditions(cluster)["Ready"]["message"].startswith("heartbeat")  # the kubelet's write survived

    clock.now += 60
    publish(two_sample_report(node, clock, lambda: node.inject_xid(79, gpu=1)), core_api, publisher)
    ours = conditions(cluster)["GPUHealthy"]
    assert (ours["status"], ours["reason"]) == ("False", "HealthChecksFailed")
    assert "xid_fatal [gpu 1]" in ours["message"] and moment(ours["lastTransitionTime"]) > first_transition


@pytest.mark.parametrize("report_s, node_s", [(0, 600), (700, 600), (-1, -1)])
def test_bad_heartbeats_are_refused_naming_both(report_s, node_s):
    with pytest.raises(ValueError, match="report_heartbeat_s and node_heartbeat_s must be > 0"):
        Publisher(report_heartbeat_s=report_s, node_heartbeat_s=node_s)


def test_publish_gives_up_after_repeated_conflicts(node, clock, cluster, core_api):
    racing = RacingKubelet(core_api, cluster.store, writes=100)
    with pytest.raises(TemporaryError, match=f"node {NODE}: gave up after 5 resourceVersion conflicts"):
        publish(two_sample_report(node, clock), racing, Publisher())


def test_cli_once_without_a_driver_reports_unknown(no_driver, tmp_path, capsys):
    code = main(["probe", "--once", "--json", "--node", "n1", "--ib-sysfs", str(tmp_path / "none")])
    out, err = capsys.readouterr()
    assert code == 1
    assert "error: GPU health unknown: NVML cannot start: NVML Shared Library Not Found" in err
    assert "runtimeClassName: nvidia" in err  # what fixes it
    report = HealthReport.from_json(out)
    assert report.gpus == {} and report.signals["gpu_count"].value is None
    assert report.signals["ib_port_count"].reason.startswith("no RDMA devices: ")
    assert "does not exist (no RDMA driver on this node)" in report.signals["ib_port_count"].reason


def test_cli_once_human_summary(no_driver, tmp_path, capsys):
    assert main(["probe", "--once", "--node", "n1", "--ib-sysfs", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("n1: exclude (default policy)\n")
    assert "gpu_count [node] gpu_count unknown: NVML cannot start" in out


def test_cli_publish_needs_a_node(monkeypatch, capsys):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["probe", "--publish"]) == 2
    assert "--publish needs --node NAME" in capsys.readouterr().err


def test_cli_publish_without_a_driver_sets_condition_unknown(no_driver, cluster, tmp_path, capsys):
    args = [
        "probe",
        "--publish",
        "--node",
        "gpu-node-a",
        "--iterations",
        "1",
        "--kubeconfig",
        str(cluster.kubeconfig),
    ]
    assert main([*args, "--ib-sysfs", str(tmp_path)]) == 0
    ours = conditions(cluster)["GPUHealthy"]
    assert (ours["status"], ours["reason"]) == ("Unknown", "SignalsUnknown")
    assert "gpu_count [node] gpu_count unknown: NVML cannot start" in ours["message"]
    assert "gpu-node-a: exclude; wrote configmap, condition" in capsys.readouterr().out
    assert configmap(cluster) is not None


class PublishWatch:
    """``publish`` as the CLI calls it, noting whether NVML was open each time; ``sigterm_after``:
    send this process SIGTERM once that many reports were published (after checking a handler is set)."""

    def __init__(self, fake: FakeNvml, sigterm_after: int = 0):
        self.fake, self.sigterm_after, self.nvml_open = fake, sigterm_after, []

    def __call__(self, report, core_api, publisher):
        try:
            self.fake.nvmlDeviceGetCount()
            self.nvml_open.append(True)
        except pynvml.NVMLError_Uninitialized:
            self.nvml_open.append(False)
        writes = publish(report, core_api, publisher)
        if self.sigterm_after and len(self.nvml_open) == self.sigterm_after:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return writes


def publish_args(cluster, tmp_path, *extra: str) -> list[str]:
    node = ["--node", NODE, "--kubeconfig", str(cluster.kubeconfig), "--ib-sysfs", str(tmp_path)]
    return ["probe", "--publish", *node, *extra]


@pytest.fixture
def fake_nvml(node, monkeypatch):
    fake = FakeNvml(node)
    monkeypatch.setattr("trainops.health.cli.load_pynvml", lambda: fake)
    return fake


def test_cli_publish_shuts_nvml_down_between_samples_and_publishes_with_it_shut(
    fake_nvml, cluster, tmp_path, monkeypatch, capsys
):
    watch = PublishWatch(fake_nvml)
    monkeypatch.setattr("trainops.health.cli.publish", watch)
    args = publish_args(cluster, tmp_path, "--iterations", "3", "--interval", "0.01")
    assert main(args) == 0
    assert watch.nvml_open == [False, False, False]
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake_nvml.nvmlDeviceGetCount()
    report = HealthReport.from_json(configmap(cluster)["data"]["report.json"])
    assert report.signals["gpu_count"].value == 8  # read while it was open


@pytest.mark.parametrize("hold", [False, True], ids=["sampled", "held"])
def test_cli_publish_stops_at_sigterm_between_samples_with_nvml_shut_down(
    fake_nvml, cluster, tmp_path, monkeypatch, capsys, hold
):
    """The probe is its container's PID 1: without a handler SIGTERM would be ignored until the
    kubelet's SIGKILL, the driver held all that time. With one it ends within the interval's wait."""
    watch = PublishWatch(fake_nvml, sigterm_after=1)
    monkeypatch.setattr("trainops.health.cli.publish", watch)
    before = signal.getsignal(signal.SIGTERM)
    # the loop's wait is an hour: only SIGTERM ends it before the test's own timeout fails it
    assert (
        main(publish_args(cluster, tmp_path, "--interval", "3600", *(["--hold-nvml"] if hold else []))) == 0
    )
    assert watch.nvml_open == [hold]  # held: open while publishing; sampled: shut already
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake_nvml.nvmlDeviceGetCount()
    assert f"{NODE}: SIGTERM: stopped" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) == before
