"""Node lifecycle: condition taints, cordon taint, NoExecute eviction (with tolerationSeconds)."""

from __future__ import annotations

from tests.devcluster.ctrl_support import NS, control_plane, job, node, pod, pods_of

BROKEN = {"key": "trainops.io/quarantine", "value": "xid", "effect": "NoExecute"}


def taints(plane, name: str) -> list[tuple]:
    return [
        (t["key"], t.get("value"), t["effect"])
        for t in plane.store.get("nodes", "", name)["spec"].get("taints", [])
    ]


def add_taint(plane, name: str, taint: dict) -> None:
    plane.store.mutate("nodes", "", name, lambda n: n["spec"].setdefault("taints", []).append(taint))


def test_no_execute_taint_evicts_pods_that_do_not_tolerate_it():
    with control_plane(node("a")) as plane:
        plane.store.create("pods", pod("victim"))
        plane.store.create(
            "pods", pod("stays", tolerations=[{"key": "trainops.io/quarantine", "operator": "Exists"}])
        )
        plane.wait_phase("victim", "Running")
        plane.wait_phase("stays", "Running")
        seen = []
        plane.controllers.nodes.store.add_listener(
            lambda e: (
                e.resource == "pods" and e.object["metadata"]["name"] == "victim" and seen.append(e.object)
            )
        )
        add_taint(plane, "a", BROKEN)
        plane.wait(lambda: plane.pod("victim") is None)
        marked = next(o for o in seen if o["metadata"].get("deletionTimestamp"))
        target = next(c for c in marked["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert target["reason"] == "DeletionByTaintManager"
        assert plane.pod("stays")["status"]["phase"] == "Running"
        assert plane.events("TaintManagerEviction")


def test_toleration_seconds_delay_eviction_and_removing_the_taint_cancels_it():
    tolerate_briefly = [
        {"key": "trainops.io/quarantine", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}
    ]
    tolerate_long = [
        {
            "key": "trainops.io/quarantine",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 3600,
        }
    ]
    with control_plane(node("a"), node("b")) as plane:
        plane.store.create("pods", pod("brief", tolerations=tolerate_briefly, nodeName="a"))
        plane.store.create("pods", pod("long", tolerations=tolerate_long, nodeName="b"))
        plane.wait_phase("brief", "Running")
        plane.wait_phase("long", "Running")
        add_taint(plane, "a", BROKEN)
        add_taint(plane, "b", BROKEN)
        assert plane.pod("brief") is not None  # not at once
        plane.wait(lambda: plane.pod("brief") is None)
        plane.store.mutate("nodes", "", "b", lambda n: n["spec"].update(taints=[]))
        assert plane.pod("long")["status"]["phase"] == "Running"


def test_cordon_and_not_ready_add_the_lifecycle_taints_and_keep_others():
    mode = {"key": "trainops.io/mode", "value": "inference", "effect": "NoSchedule"}
    with control_plane(node("a", taints=[mode])) as plane:
        plane.store.mutate("nodes", "", "a", lambda n: n["spec"].update(unschedulable=True))
        plane.wait(lambda: ("node.kubernetes.io/unschedulable", None, "NoSchedule") in taints(plane, "a"))
        plane.faults.node_not_ready("a")
        plane.wait(lambda: ("node.kubernetes.io/unreachable", None, "NoExecute") in taints(plane, "a"))
        assert ("node.kubernetes.io/unreachable", None, "NoSchedule") in taints(plane, "a")
        assert ("trainops.io/mode", "inference", "NoSchedule") in taints(plane, "a")
        ready = next(
            c for c in plane.store.get("nodes", "", "a")["status"]["conditions"] if c["type"] == "Ready"
        )
        assert ready["status"] == "Unknown"
        plane.faults.node_ready("a")
        plane.store.mutate("nodes", "", "a", lambda n: n["spec"].pop("unschedulable"))
        plane.wait(lambda: taints(plane, "a") == [("trainops.io/mode", "inference", "NoSchedule")])


def test_evicted_job_pod_counts_as_failed_and_is_replaced_elsewhere():
    with control_plane(node("a"), node("b")) as plane:
        plane.store.create("jobs.batch", job("train", completions=1, parallelism=1))
        first = plane.wait(
            lambda: [p for p in pods_of(plane, "train") if p["status"].get("phase") == "Running"]
        )[0]
        add_taint(plane, first["spec"]["nodeName"], BROKEN)
        replacement = plane.wait(
            lambda: [
                p
                for p in pods_of(plane, "train")
                if p["status"].get("phase") == "Running"
                and p["metadata"]["name"] != first["metadata"]["name"]
            ]
        )[0]
        assert replacement["spec"]["nodeName"] != first["spec"]["nodeName"]
        plane.wait(lambda: plane.store.get("jobs.batch", NS, "train")["status"].get("failed") == 1)
