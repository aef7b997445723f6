"""Faults: GPU and node faults change the node's telemetry, fail the pods they hit and leave Events."""

from __future__ import annotations

import sys

from trainops_devcluster.runtime import LOCAL_IMAGE

from tests.devcluster.ctrl_support import NS, control_plane, job, node, pod, pods_of


def running(plane, *names: str) -> None:
    for name in names:
        plane.wait_phase(name, "Running")


def terminated(p: dict) -> dict:
    return p["status"]["containerStatuses"][0]["state"]["terminated"]


def test_fatal_xid_fails_the_pod_on_that_gpu_and_records_an_event():
    with control_plane(node("a", gpus=2)) as plane:
        plane.store.create("pods", pod("gpu0"))
        running(plane, "gpu0")
        plane.store.create("pods", pod("gpu1"))
        running(plane, "gpu1")
        result = plane.faults.xid("a", 79, gpu=1)
        assert result == {"failed_pods": [f"{NS}/gpu1"]}
        failed = plane.wait_phase("gpu1", "Failed")
        assert terminated(failed)["exitCode"] == 1 and terminated(failed)["reason"] == "Error"
        assert "Xid 79" in terminated(failed)["message"]
        assert plane.pod("gpu0")["status"]["phase"] == "Running"
        event = plane.events("XidError")[0]
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
        assert event["involvedObject"]["name"] == "a" and "Xid 79 on GPU 1" in event["message"]
        assert plane.telemetry["a"].gpus[1].lost


def test_informational_xid_leaves_pods_running():
    with control_plane(node("a", gpus=1)) as plane:
        plane.store.create("pods", pod("p"))
        running(plane, "p")
        assert plane.faults.xid("a", 63, gpu=0) == {"failed_pods": []}
        assert plane.events("XidError")
        assert plane.pod("p")["status"]["phase"] == "Running"


def test_process_pod_killed_by_xid_fails_its_job_pod():
    script = "import time; print('training', flush=True); time.sleep(600)"
    container = {"image": LOCAL_IMAGE, "command": [sys.executable, "-c", script]}
    with control_plane(node("a", gpus=1)) as plane:
        plane.store.create(
            "jobs.batch", job("train", completions=1, parallelism=1, backoffLimit=0, container=container)
        )
        first = plane.wait(
            lambda: [p for p in pods_of(plane, "train") if plane.logs.read(NS, p["metadata"]["name"])]
        )[0]
        plane.faults.xid("a", 48, gpu=0)
        failed = plane.wait_phase(first["metadata"]["name"], "Failed")
        assert "Xid 48" in terminated(failed)["message"]
        assert plane.wait(lambda: plane.job_condition("train", "Failed"))["reason"] == "BackoffLimitExceeded"


def test_ecc_and_ib_down_fail_gpu_pods_nvlink_replays_do_not():
    with control_plane(node("a", gpus=2), node("b", gpus=2)) as plane:
        plane.store.create("pods", pod("on-a", nodeName="a"))
        plane.store.create("pods", pod("on-b", nodeName="b", gpus=2))
        running(plane, "on-a", "on-b")
        assert plane.faults.nvlink_errors("a", 5, gpu=0) == {"failed_pods": []}
        assert plane.pod("on-a")["status"]["phase"] == "Running"
        assert plane.faults.ecc("a", 2, gpu=0) == {"failed_pods": [f"{NS}/on-a"]}
        assert plane.telemetry["a"].gpus[0].ecc_uncorrected >= 2
        assert plane.faults.ib_down("b", port=1) == {"failed_pods": [f"{NS}/on-b"]}
        assert "InfiniBand" in terminated(plane.wait_phase("on-b", "Failed"))["message"]
        assert plane.events("EccError") and plane.events("InfiniBandPortDown")


def test_node_not_ready_fails_its_pods_and_taints_it():
    with control_plane(node("a"), node("b")) as plane:
        plane.store.create("pods", pod("p", nodeName="a"))
        plane.store.create("pods", pod("q", nodeName="b"))
        running(plane, "p", "q")
        assert plane.faults.node_not_ready("a") == {"failed_pods": [f"{NS}/p"]}
        assert terminated(plane.wait_phase("p", "Failed"))["exitCode"] == 137
        assert plane.pod("q")["status"]["phase"] == "Running"
        plane.wait(
            lambda: any(
                t["key"] == "node.kubernetes.io/unreachable"
                for t in plane.store.get("nodes", "", "a")["spec"].get("taints", [])
            )
        )
        plane.store.create("pods", pod("later"))
        plane.wait(lambda: (p := plane.pod("later")) and p["spec"].get("nodeName") == "b")


def test_telemetry_faults_reach_the_node_telemetry():
    with control_plane(node("a")) as plane:
        plane.faults.slow_gpu("a", 0.5, gpu=3)
        plane.faults.telemetry_missing("a")
        assert plane.telemetry["a"].gpus[3].speed_factor == 0.5
        assert plane.telemetry["a"].missing


def test_hang_job_keeps_pods_running_and_never_finishing():
    annotations = {"devcluster.trainops.io/run-seconds": "0.3"}
    with control_plane(node("a")) as plane:
        plane.store.create(
            "jobs.batch", job("train", completions=2, parallelism=2, pod_annotations=annotations)
        )
        plane.wait(
            lambda: len([p for p in pods_of(plane, "train") if p["status"].get("phase") == "Running"]) == 2
        )
        hung = plane.faults.hang_job(NS, "train")
        assert len(hung["pods"]) == 2
        plane.store.create("pods", pod("witness", annotations={"devcluster.trainops.io/run-seconds": "0.6"}))
        plane.wait_phase("witness", "Succeeded")  # well past the Job pods' 0.3 s
        assert [p["status"]["phase"] for p in pods_of(plane, "train")] == ["Running", "Running"]
        assert not plane.job_condition("train", "Complete")
