"""Broken hardware stays broken until the node is repaired, as on a real node: a GPU the device plugin
marks Unhealthy leaves the node's allocatable (and is handed to no new pod), and a downed fabric port
fails every GPU pod that starts there.  ``repair`` (the node rebooted fixed) undoes both."""

from __future__ import annotations

import sys

import pytest
from trainops_devcluster.faults import device_plugin_marks_unhealthy
from trainops_devcluster.runtime import LOCAL_IMAGE, NCCL_ABORT_S

from tests.devcluster.ctrl_support import NS, control_plane, pod
from tests.devcluster.ctrl_support import node as plain_node

SHOW_DEVICES = (
    "import os, time; print(os.environ.get('NVIDIA_VISIBLE_DEVICES', ''), flush=True); time.sleep(600)"
)


def node(name: str, gpus: int = 8) -> dict:
    """A node as the kubelet registers it: capacity and allocatable alike."""
    obj = plain_node(name, gpus=gpus)
    obj["status"]["capacity"] = dict(obj["status"]["allocatable"])
    return obj


def gpus(plane, name: str, kind: str = "allocatable") -> str:
    return plane.store.get("nodes", "", name)["status"][kind]["nvidia.com/gpu"]


def terminated(p: dict) -> dict:
    return p["status"]["containerStatuses"][0]["state"]["terminated"]


def unschedulable(plane, name: str) -> str:
    """The scheduler's message once it has found no node for the pod."""

    def message() -> str:
        found = plane.pod(name) or {}
        for condition in found.get("status", {}).get("conditions", []):
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return condition.get("message") or "?"
        return ""

    return plane.wait(message)


@pytest.mark.parametrize(
    ("code", "allocatable"),
    [
        (79, "7"),  # fallen off the bus
        (48, "7"),  # double-bit ECC
        (63, "7"),  # row-remap event: not fatal to the job, but not in the device plugin's skip list
        (94, "7"),
        (13, "8"),  # application errors the device plugin skips: the GPU stays allocatable
        (31, "8"),
        (43, "8"),
        (109, "8"),
    ],
)
def test_an_xid_the_device_plugin_does_not_skip_takes_the_gpu_out_of_allocatable(code, allocatable):
    with control_plane(node("a", gpus=8)) as plane:
        plane.faults.xid("a", code, gpu=3)
        plane.wait(lambda: gpus(plane, "a") == allocatable)
        assert gpus(plane, "a", "capacity") == "8"  # the kubelet's capacity still counts it


def test_the_unhealthy_gpu_is_handed_to_no_new_pod_and_repair_restores_it():
    container = {"image": LOCAL_IMAGE, "command": [sys.executable, "-c", SHOW_DEVICES]}
    with control_plane(node("a", gpus=8)) as plane:
        plane.faults.xid("a", 79, gpu=0)
        assert gpus(plane, "a") == "7"
        plane.store.create("pods", pod("seven", gpus=7, container=container))
        plane.wait_phase("seven", "Running")
        devices = plane.wait(lambda: plane.logs.read(NS, "seven").strip())
        assert devices.split(",") == ["1", "2", "3", "4", "5", "6", "7"]
        plane.faults.repair("a")
        assert gpus(plane, "a") == "8"
        plane.store.create("pods", pod("one", gpus=1, container=container))
        plane.wait_phase("one", "Running")
        assert plane.wait(lambda: plane.logs.read(NS, "one").strip()) == "0"


def test_uncorrectable_ecc_takes_the_gpu_out_correctable_does_not():
    with control_plane(node("a", gpus=8)) as plane:
        plane.faults.ecc("a", 0, gpu=2)
        assert gpus(plane, "a") == "8"
        plane.faults.ecc("a", 2, gpu=2)
        assert gpus(plane, "a") == "7"
        plane.faults.ecc("a", 1, gpu=5)
        assert gpus(plane, "a") == "6"
        plane.faults.repair("a")
        assert gpus(plane, "a") == "8"


def test_an_8_gpu_pod_goes_to_the_healthy_node_not_the_one_with_a_dead_gpu_until_it_is_repaired():
    with control_plane(node("a", gpus=8), node("b", gpus=8)) as plane:
        plane.faults.xid("a", 79, gpu=6)
        plane.store.create("pods", pod("first", gpus=8))
        plane.store.create("pods", pod("second", gpus=8))
        placed = {
            name: plane.wait(lambda name=name: (plane.pod(name) or {}).get("spec", {}).get("nodeName"))
            for name in plane.wait(
                lambda: [
                    n for n in ("first", "second") if (plane.pod(n) or {}).get("spec", {}).get("nodeName")
                ]
            )
        }
        assert list(placed.values()) == ["b"]  # one of them on b, none on a
        waiting = next(n for n in ("first", "second") if n not in placed)
        assert "Insufficient nvidia.com/gpu" in unschedulable(plane, waiting)
        assert not plane.pod(waiting)["spec"].get("nodeName")
        plane.faults.repair("a")
        assert plane.wait_phase(waiting, "Running")["spec"]["nodeName"] == "a"


def test_device_plugin_health_check_settings():
    assert device_plugin_marks_unhealthy(79) and not device_plugin_marks_unhealthy(13)
    assert not device_plugin_marks_unhealthy(79, {"DP_DISABLE_HEALTHCHECKS": "79, 48"})
    assert not device_plugin_marks_unhealthy(79, {"DP_DISABLE_HEALTHCHECKS": "all"})
    assert device_plugin_marks_unhealthy(
        48, {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48"}
    )
    assert device_plugin_marks_unhealthy(13, {"DP_ENABLE_HEALTHCHECKS": "13"})
    assert device_plugin_marks_unhealthy(109, {"DP_ENABLE_HEALTHCHECKS": "all"})
    with control_plane(node("a", gpus=8)) as plane:
        plane.faults.device_plugin_env = {"DP_DISABLE_HEALTHCHECKS": "xids"}
        plane.faults.xid("a", 79, gpu=1)
        assert gpus(plane, "a") == "8"


def test_a_gpu_pod_started_on_a_node_whose_ib_port_is_down_fails_until_repair():
    with control_plane(node("a", gpus=8)) as plane:
        plane.faults.ib_down("a", port=1)
        plane.store.create("pods", pod("later"))
        plane.store.create("pods", pod("cpu-only", gpus=0))
        failed = plane.wait_phase("later", "Failed")
        assert terminated(failed)["message"] == "NCCL error: InfiniBand port mlx5_0/1 is down"
        assert terminated(failed)["exitCode"] == 1
        assert plane.pod("cpu-only")["status"]["phase"] == "Running"  # NCCL is not in it
        plane.store.create("pods", pod("restarting", restartPolicy="Always"))
        plane.wait(
            lambda: any(
                c["restartCount"] >= 2 for c in plane.pod("restarting")["status"].get("containerStatuses", [])
            )
        )
        plane.faults.repair("a")
        plane.store.create("pods", pod("after-repair"))
        plane.wait_phase("after-repair", "Running")
        plane.store.create(
            "pods", pod("witness", gpus=0, annotations={"devcluster.trainops.io/run-seconds": "0.6"})
        )
        plane.wait_phase("witness", "Succeeded")  # well past NCCL_ABORT_S
        assert NCCL_ABORT_S < 0.6
        assert plane.pod("after-repair")["status"]["phase"] == "Running"


def test_a_process_pod_on_an_ib_down_node_is_killed_with_the_nccl_message():
    container = {"image": LOCAL_IMAGE, "command": [sys.executable, "-c", SHOW_DEVICES]}
    with control_plane(node("a", gpus=8)) as plane:
        plane.faults.ib_down("a", port=1)
        plane.store.create("pods", pod("train", container=container))
        failed = plane.wait_phase("train", "Failed")
        assert "NCCL error" in terminated(failed)["message"] and terminated(failed)["exitCode"] == 1
