"""The simulated scheduler: every filter rule, the Unschedulable condition and its message, retries."""

from __future__ import annotations

import collections

import pytest

from tests.devcluster.ctrl_support import NS, control_plane, node, pod


def scheduled_node(plane, name: str) -> str:
    return plane.wait(lambda: (p := plane.pod(name)) and p["spec"].get("nodeName"))


def unschedulable_message(plane, name: str) -> str:
    def condition():
        for c in plane.pod(name)["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False":
                assert c["reason"] == "Unschedulable"
                return c["message"]
        return None

    return plane.wait(condition)


def test_node_selector_picks_the_labelled_node():
    with control_plane(node("a"), node("b", labels={"pool": "train"}), node("c")) as plane:
        plane.store.create("pods", pod("p", nodeSelector={"pool": "train"}))
        assert scheduled_node(plane, "p") == "b"
        scheduled = next(c for c in plane.pod("p")["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["status"] == "True"


@pytest.mark.parametrize(
    ("expressions", "expected"),
    [
        ([{"key": "zone", "operator": "In", "values": ["z2", "z9"]}], "b"),
        ([{"key": "zone", "operator": "NotIn", "values": ["z1", "z2"]}], "c"),
        ([{"key": "fast", "operator": "Exists"}], "a"),
        ([{"key": "zone", "operator": "Exists"}, {"key": "fast", "operator": "DoesNotExist"}], "b"),
    ],
)
def test_required_node_affinity_operators(expressions, expected):
    nodes = [node("a", labels={"zone": "z1", "fast": "yes"}), node("b", labels={"zone": "z2"}), node("c")]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions}]
            }
        }
    }
    with control_plane(*nodes) as plane:
        plane.store.create("pods", pod("p", affinity=affinity))
        assert scheduled_node(plane, "p") == expected


def test_node_selector_terms_are_ored():
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["nowhere"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    with control_plane(node("a"), node("b"), node("c")) as plane:
        plane.store.create("pods", pod("p", affinity=affinity))
        assert scheduled_node(plane, "p") == "c"


TAINT = {"key": "trainops.io/mode", "value": "inference", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "trainops.io/mode", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
        {"key": "trainops.io/mode", "operator": "Exists"},
        {"operator": "Exists"},
    ],
)
def test_tolerated_taint_admits_the_pod(toleration):
    with control_plane(node("a", taints=[TAINT])) as plane:
        plane.store.create("pods", pod("p", tolerations=[toleration]))
        assert scheduled_node(plane, "p") == "a"


def test_untolerated_taints_and_wrong_value_keep_the_pod_pending():
    wrong_value = {
        "key": "trainops.io/mode",
        "operator": "Equal",
        "value": "training",
        "effect": "NoSchedule",
    }
    no_execute = {"key": "gpu-broken", "value": "", "effect": "NoExecute"}
    with control_plane(node("a", taints=[TAINT]), node("b", taints=[no_execute])) as plane:
        plane.store.create("pods", pod("p", tolerations=[wrong_value]))
        message = unschedulable_message(plane, "p")
        assert message.startswith("0/2 nodes are available: ")
        assert "1 node(s) had untolerated taint {gpu-broken: }" in message
        assert "1 node(s) had untolerated taint {trainops.io/mode: inference}" in message
        assert plane.pod("p")["status"]["phase"] == "Pending" and not plane.pod("p")["spec"].get("nodeName")
        assert plane.events("FailedScheduling")


def test_message_counts_every_reason_like_kube_scheduler():
    pool = {"pool": "x"}
    nodes = [
        node("full", gpus=1, labels=pool),
        node("tainted", labels=pool, taints=[TAINT]),
        node("cordoned", labels=pool, unschedulable=True),
        node("elsewhere"),
    ]
    with control_plane(*nodes) as plane:
        plane.store.create("pods", pod("p", gpus=2, nodeSelector=pool))
        assert unschedulable_message(plane, "p") == (
            "0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node "
            "affinity/selector, 1 node(s) had untolerated taint {trainops.io/mode: inference}, 1 node(s) were "
            "unschedulable. preemption: 0/4 nodes are available: 1 No preemption victims found for incoming pod, "
            "3 Preemption is not helpful for scheduling."
        )


def test_gpu_capacity_is_honoured_and_freed_capacity_is_reused():
    with control_plane(node("a", gpus=8)) as plane:
        for name in ("p1", "p2", "p3"):
            plane.store.create("pods", pod(name, gpus=4))
        plane.wait(lambda: sum(1 for p in plane.store.list("pods")[0] if p["spec"].get("nodeName")) == 2)
        waiting = next(
            p["metadata"]["name"] for p in plane.store.list("pods")[0] if not p["spec"].get("nodeName")
        )
        assert "1 Insufficient nvidia.com/gpu" in unschedulable_message(plane, waiting)
        bound = next(p["metadata"]["name"] for p in plane.store.list("pods")[0] if p["spec"].get("nodeName"))
        plane.store.delete("pods", NS, bound)
        assert scheduled_node(plane, waiting) == "a"


def test_cpu_and_memory_requests_count():
    with control_plane(node("a")) as plane:
        big = {"resources": {"requests": {"cpu": "40", "memory": "300Gi"}}}
        plane.store.create("pods", pod("p1", gpus=0, container=big))
        assert scheduled_node(plane, "p1") == "a"
        plane.store.create(
            "pods", pod("p2", gpus=0, container={"resources": {"requests": {"cpu": "30000m"}}})
        )
        assert "1 Insufficient cpu" in unschedulable_message(plane, "p2")


def test_pending_pod_is_retried_when_a_node_is_untainted_or_uncordoned():
    with control_plane(node("a", taints=[TAINT]), node("b", unschedulable=True)) as plane:
        plane.store.create("pods", pod("p"))
        assert "node(s) were unschedulable" in unschedulable_message(plane, "p")
        plane.store.mutate("nodes", "", "b", lambda n: n["spec"].pop("unschedulable"))
        assert scheduled_node(plane, "p") == "b"


def test_many_pods_fill_nodes_without_overcommitting():
    with control_plane(*[node(f"n{i}", gpus=8) for i in range(32)]) as plane:
        for i in range(260):
            plane.store.create("pods", pod(f"p{i}"))
        plane.wait(lambda: sum(1 for p in plane.store.list("pods")[0] if p["spec"].get("nodeName")) == 256)
        per_node = collections.Counter(
            p["spec"]["nodeName"] for p in plane.store.list("pods")[0] if p["spec"].get("nodeName")
        )
        assert set(per_node.values()) == {8} and len(per_node) == 32
        pending = [p for p in plane.store.list("pods")[0] if not p["spec"].get("nodeName")]
        assert len(pending) == 4
