"""The simulated kubelet: process pods really run, simulated pods follow their annotations,
deleted pods are stopped gracefully, and killed processes fail their pods."""

from __future__ import annotations

import os
import signal
import sys
import time

from trainops_devcluster.podutil import delete_pod
from trainops_devcluster.runtime import LOCAL_IMAGE

from tests.devcluster.ctrl_support import NS, control_plane, node, pod


def process_pod(name: str, script: str, env: list | None = None, **spec) -> dict:
    container = {"command": [sys.executable, "-c"], "args": [script], "env": env or []}
    return pod(name, image=LOCAL_IMAGE, container=container, **spec)


def terminated(p: dict) -> dict:
    return p["status"]["containerStatuses"][0]["state"]["terminated"]


def test_process_pod_runs_with_the_pod_env_and_its_exit_code():
    script = "import os; print(os.environ['GREETING'], os.environ['NODE'], os.environ['BASE'], os.environ['WHO']); raise SystemExit(3)"
    env = [
        {"name": "GREETING", "value": "hello"},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "WHO", "value": "$(GREETING)-world"},
    ]
    with control_plane(node("a"), process_env={"BASE": "from-devcluster"}) as plane:
        plane.store.create("pods", process_pod("p", script, env))
        failed = plane.wait_phase("p", "Failed")
        assert terminated(failed)["exitCode"] == 3 and terminated(failed)["reason"] == "Error"
        assert plane.logs.read(NS, "p") == "hello a from-devcluster hello-world\n"
        ready = next(c for c in failed["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and ready["reason"] == "PodCompleted"


def test_process_pod_that_exits_zero_succeeds():
    with control_plane(node("a")) as plane:
        plane.store.create("pods", process_pod("p", "print('done')"))
        done = plane.wait_phase("p", "Succeeded")
        assert terminated(done) | {"startedAt": "", "finishedAt": ""} == {
            "exitCode": 0,
            "reason": "Completed",
            "startedAt": "",
            "finishedAt": "",
        }


def test_running_pod_has_ip_start_time_and_ready_condition():
    with control_plane(node("a")) as plane:
        plane.store.create("pods", pod("p"))
        running = plane.wait_phase("p", "Running")
        status = running["status"]
        assert status["podIP"] and status["startTime"] and status["hostIP"] == "192.168.0.1"
        assert status["containerStatuses"][0]["state"]["running"]["startedAt"]
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])


def test_killed_process_fails_the_pod_like_a_crash():
    with control_plane(node("a")) as plane:
        plane.store.create(
            "pods", process_pod("p", "import os, time; print(os.getpid(), flush=True); time.sleep(600)")
        )
        pid = int(plane.wait(lambda: plane.logs.read(NS, "p").strip()))
        os.kill(pid, signal.SIGKILL)
        failed = plane.wait_phase("p", "Failed")
        assert terminated(failed)["exitCode"] == 137 and terminated(failed)["reason"] == "Error"


def test_crash_pod_fault_reports_the_given_reason():
    with control_plane(node("a")) as plane:
        plane.store.create("pods", process_pod("p", "import time; print('up', flush=True); time.sleep(600)"))
        plane.wait(lambda: plane.logs.read(NS, "p"))
        plane.faults.crash_pod(NS, "p", exit_code=137, reason="OOMKilled")
        failed = plane.wait_phase("p", "Failed")
        assert terminated(failed)["exitCode"] == 137 and terminated(failed)["reason"] == "OOMKilled"


def test_deletion_sends_sigterm_then_removes_the_pod(tmp_path):
    marker = tmp_path / "terminated"
    script = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').write('checkpointed'), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    with control_plane(node("a")) as plane:
        plane.store.create("pods", process_pod("p", script))
        plane.wait(lambda: plane.logs.read(NS, "p"))
        delete_pod(plane.store, NS, "p")
        plane.wait(lambda: plane.pod("p") is None)
        assert marker.read_text() == "checkpointed"


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period():
    script = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); time.sleep(600)"
    with control_plane(node("a")) as plane:
        plane.store.create("pods", process_pod("p", script, terminationGracePeriodSeconds=1))
        pid = int(plane.wait(lambda: plane.logs.read(NS, "p").strip()))
        delete_pod(plane.store, NS, "p")
        assert plane.pod("p")["metadata"]["deletionTimestamp"]
        plane.wait(lambda: plane.pod("p") is None)
        assert not _alive(pid)


def test_simulated_pod_follows_its_annotations():
    annotations = {"devcluster.trainops.io/run-seconds": "0.05", "devcluster.trainops.io/exit-code": "2"}
    with control_plane(node("a")) as plane:
        plane.store.create("pods", pod("p", annotations=annotations))
        failed = plane.wait_phase("p", "Failed")
        assert terminated(failed)["exitCode"] == 2


def test_bad_annotation_fails_the_container_with_a_clear_message():
    with control_plane(node("a")) as plane:
        plane.store.create("pods", pod("p", annotations={"devcluster.trainops.io/run-seconds": "soon"}))
        failed = plane.wait_phase("p", "Failed")
        assert "devcluster.trainops.io/run-seconds" in terminated(failed)["message"]


def test_on_failure_restarts_the_container_in_place():
    annotations = {"devcluster.trainops.io/run-seconds": "0.02", "devcluster.trainops.io/exit-code": "1"}
    with control_plane(node("a")) as plane:
        plane.store.create("pods", pod("p", annotations=annotations, restartPolicy="OnFailure"))
        restarted = plane.wait(
            lambda: (
                (p := plane.pod("p"))
                and p["status"].get("containerStatuses", [{}])[0].get("restartCount", 0) >= 2
                and p
            )
        )
        assert restarted["status"]["phase"] == "Running"
        assert restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 1


def test_hang_stops_progress_but_keeps_the_pod_running():
    script = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.02)\n"
    with control_plane(node("a")) as plane:
        plane.store.create("pods", process_pod("p", script))
        plane.wait(lambda: plane.logs.read(NS, "p").count("step") >= 3)
        plane.controllers.runtime.hang(NS, "p")
        frozen = plane.logs.read(NS, "p")
        time.sleep(0.3)  # ten steps' worth of time
        assert plane.logs.read(NS, "p") == frozen
        assert plane.pod("p")["status"]["phase"] == "Running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_virtual_node_runs_gpu_pods_without_gpu_devices():
    """A Virtual-Kubelet-like node's GPUs are another provider's: its pods get no local GPU indices."""
    script = "import os; print(os.environ.get('NVIDIA_VISIBLE_DEVICES', 'none'))"
    virtual = node("vk", gpus=16, labels={"type": "virtual-kubelet"})
    with control_plane(node("a"), virtual) as plane:
        plane.store.create("pods", process_pod("here", script, nodeName="a"))
        plane.store.create("pods", process_pod("there", script, nodeName="vk"))
        plane.wait_phase("here", "Succeeded")
        plane.wait_phase("there", "Succeeded")
        assert (plane.logs.read(NS, "here"), plane.logs.read(NS, "there")) == ("0\n", "none\n")


def test_a_pod_on_a_slowed_gpu_is_told_its_speed():
    """The demo trainer's steps take longer on a slowed GPU: the kubelet hands it the GPU's speed."""
    script = "import os; print(os.environ['DEVCLUSTER_GPU_SPEED'])"
    with control_plane(node("a"), node("b")) as plane:
        plane.telemetry["a"].slow_gpu(0.5)
        plane.store.create("pods", process_pod("slow", script, nodeName="a"))
        plane.store.create("pods", process_pod("fast", script, nodeName="b"))
        plane.wait_phase("slow", "Succeeded")
        plane.wait_phase("fast", "Succeeded")
        assert (plane.logs.read(NS, "slow"), plane.logs.read(NS, "fast")) == ("0.5\n", "1.0\n")
