"""The overflow pool's plain-data parts: its spec, the room it has, the companion Deployment, and
giving a loan back in parts (the gradual return)."""

from __future__ import annotations

import json

import pytest

from trainops.capacity.loans import LOANS_ANNOTATION, repay_part_patch, repay_patch
from trainops.capacity.overflow import (
    OVERFLOW_OF_LABEL,
    SERVING_POOL_LABEL,
    OverflowPool,
    OverflowPoolError,
    Room,
    companion_manifest,
    lent,
    pool_pod_spec,
)

VK = {"node_label": "type=virtual-kubelet", "taint": "virtual-kubelet.io/provider"}
GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    "value, pool",
    [
        (
            VK,
            OverflowPool(
                {"type": "virtual-kubelet"}, {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
            ),
        ),
        (
            json.dumps(VK),
            OverflowPool(
                {"type": "virtual-kubelet"}, {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
            ),
        ),
        (
            {"node_label": "cloud=b, gpu=h100", "taint": "burst=cloud-b", "min_ready": 6},
            OverflowPool(
                {"cloud": "b", "gpu": "h100"}, {"key": "burst", "operator": "Equal", "value": "cloud-b"}, 6
            ),
        ),
        ({"node_label": "pool=spare"}, OverflowPool({"pool": "spare"})),
    ],
)
def test_pool_spec_parses(value, pool):
    assert OverflowPool.parse(value, "overflow_pool") == pool


@pytest.mark.parametrize(
    "value, names",
    [
        ("{not json", "overflow_pool: not JSON"),
        ({"taint": "x"}, "overflow_pool: .* must be an object with node_label"),
        ({"node_label": "type=vk", "tains": "x"}, "must be an object with node_label"),
        ({"node_label": "typevk"}, r"overflow_pool.node_label: 'typevk' is not key=value"),
        ({"node_label": "a=b", "taint": "key:NoSchedule"}, r"overflow_pool.taint: .*taint key, or key=value"),
        ({"node_label": "a=b", "min_ready": -1}, r"overflow_pool.min_ready: -1 must be a whole number"),
        ({"node_label": "a=b", "min_ready": True}, r"overflow_pool.min_ready"),
    ],
)
def test_a_bad_pool_spec_names_the_field(value, names):
    with pytest.raises(OverflowPoolError, match=names):
        OverflowPool.parse(value, "overflow_pool")


def test_the_workloads_annotation_wins_over_the_default():
    default = OverflowPool({"pool": "spare"})
    own = {
        "metadata": {
            "name": "chat",
            "namespace": "inference",
            "annotations": {"trainops.io/overflow-pool": json.dumps(VK)},
        }
    }
    assert OverflowPool.of(own, default).node_selector == {"type": "virtual-kubelet"}
    assert OverflowPool.of({"metadata": {"name": "chat"}}, default) is default
    bad = {
        "metadata": {
            "name": "chat",
            "namespace": "inference",
            "annotations": {"trainops.io/overflow-pool": "{"},
        }
    }
    with pytest.raises(
        OverflowPoolError, match="annotation trainops.io/overflow-pool of inference/chat: not JSON"
    ):
        OverflowPool.of(bad, default)


def node(name, gpus=8, labels=None, taints=(), ready="True", unschedulable=False) -> dict:
    return {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"taints": list(taints), "unschedulable": unschedulable},
        "status": {
            "allocatable": {GPU: str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def pod_spec(gpus=8, selector=None, tolerations=(), affinity=None) -> dict:
    spec = {
        "containers": [{"name": "s", "resources": {"requests": {GPU: str(gpus), "cpu": "8"}}}],
        "nodeSelector": dict(selector or {}),
        "tolerations": list(tolerations),
    }
    if affinity:
        spec["affinity"] = affinity
    return spec


def bound(node_name, gpus=8, phase="Running") -> dict:
    return {"spec": {**pod_spec(gpus), "nodeName": node_name}, "status": {"phase": phase}}


VK_TAINT = {"key": "virtual-kubelet.io/provider", "value": "azure", "effect": "NoSchedule"}
VK_LABELS = {"type": "virtual-kubelet"}
TOLERATE_VK = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}


@pytest.mark.parametrize(
    "nodes, pods, spec, want, placed",
    [
        # a virtual node with room for 4 GPU pods, one already there
        (
            [node("vk", 32, VK_LABELS, [VK_TAINT])],
            [bound("vk")],
            pod_spec(selector=VK_LABELS, tolerations=[TOLERATE_VK]),
            5,
            3,
        ),
        # finished pods hold nothing; a pod of 4 GPUs fits twice where 8 would fit once
        (
            [node("vk", 16, VK_LABELS, [VK_TAINT])],
            [bound("vk", phase="Succeeded")],
            pod_spec(4, VK_LABELS, [TOLERATE_VK]),
            9,
            4,
        ),
        # the taint not tolerated, the label not matching, a node not Ready or cordoned: no room
        ([node("vk", 32, VK_LABELS, [VK_TAINT])], [], pod_spec(selector=VK_LABELS), 2, 0),
        (
            [node("vk", 32, {"type": "other"}, [VK_TAINT])],
            [],
            pod_spec(selector=VK_LABELS, tolerations=[TOLERATE_VK]),
            2,
            0,
        ),
        ([node("vk", 32, VK_LABELS, ready="False")], [], pod_spec(selector=VK_LABELS), 2, 0),
        ([node("vk", 32, VK_LABELS, unschedulable=True)], [], pod_spec(selector=VK_LABELS), 2, 0),
        # a PreferNoSchedule taint does not keep pods out; two nodes add up
        (
            [node("a", 8, VK_LABELS, [{**VK_TAINT, "effect": "PreferNoSchedule"}]), node("b", 16, VK_LABELS)],
            [],
            pod_spec(selector=VK_LABELS),
            5,
            3,
        ),
        # required node affinity is honoured (In over the node's labels)
        (
            [node("a", 8, {"zone": "x"}), node("b", 8, {"zone": "y"})],
            [],
            pod_spec(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["y"]}]}
                            ]
                        }
                    }
                }
            ),
            2,
            1,
        ),
        # a node without GPUs has no room for GPU pods
        ([node("cpu", 0, VK_LABELS)], [], pod_spec(selector=VK_LABELS), 1, 0),
    ],
)
def test_room_counts_as_the_scheduler_would(nodes, pods, spec, want, placed):
    assert Room(nodes, pods).take(spec, want) == placed


def test_room_taken_by_one_workload_is_not_counted_again():
    room = Room([node("vk", 32, VK_LABELS, [VK_TAINT])], [])
    spec = pod_spec(selector=VK_LABELS, tolerations=[TOLERATE_VK])
    assert (room.take(spec, 3), room.take(spec, 3), room.take(spec, 3)) == (3, 1, 0)


PRIMARY = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "chat", "namespace": "inference", "uid": "u-1", "labels": {"app": "chat"}},
    "spec": {
        "replicas": 8,
        "selector": {"matchLabels": {"app": "chat"}},
        "strategy": {"type": "RollingUpdate"},
        "template": {
            "metadata": {"labels": {"app": "chat"}},
            "spec": {
                "nodeSelector": {"trainops.io/gpu-pool": "true"},
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
                    },
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
                },
                "tolerations": [{"key": "trainops.io/mode", "value": "inference", "effect": "NoSchedule"}],
                "containers": [{"name": "server", "image": "chat:1"}],
            },
        },
    },
}


def test_the_companion_runs_the_primarys_pods_in_the_pool_and_records_its_loan():
    pool = OverflowPool.parse(VK, "overflow_pool")
    companion = companion_manifest(PRIMARY, pool, "dag/run-1", 3)

    meta, spec = companion["metadata"], companion["spec"]
    assert meta["name"] == "chat-overflow" and meta["namespace"] == "inference"
    assert meta["labels"] == {"app": "chat", OVERFLOW_OF_LABEL: "chat"}
    assert meta["ownerReferences"] == [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat", "uid": "u-1"}
    ]
    assert spec["replicas"] == 3 and lent(companion, "dag/run-1") == 3 and lent(companion, "dag/other") == 0
    # its own selector: the primary's never counts its pods, the Service and the PDB (app=chat) do
    assert spec["selector"] == {"matchLabels": {"app": "chat", SERVING_POOL_LABEL: "overflow"}}
    assert spec["template"]["metadata"]["labels"] == {"app": "chat", SERVING_POOL_LABEL: "overflow"}
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"type": "virtual-kubelet"}
    assert pod["affinity"] == {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert pod["tolerations"][-1] == {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
    assert pod["containers"] == PRIMARY["spec"]["template"]["spec"]["containers"]
    assert spec["strategy"] == {"type": "RollingUpdate"}
    assert PRIMARY["spec"]["template"]["spec"]["nodeSelector"] == {
        "trainops.io/gpu-pool": "true"
    }  # untouched
    assert pool_pod_spec(PRIMARY, pool) == pod


def deployment(replicas: int, loans: dict) -> dict:
    return {
        "metadata": {"annotations": {LOANS_ANNOTATION: json.dumps(loans)}},
        "spec": {"replicas": replicas},
    }


R = ("spec", "replicas")


@pytest.mark.parametrize(
    "replicas, entry, amount, patched, left",
    [
        # a primary lent 4 of 8: it gets 1 back, then the rest
        (4, {"prior": 8, "set": 4}, 1, 5, 3),
        (5, {"prior": 8, "set": 5}, 10, 8, 0),
        # a companion lent 3 (made at 0): it gives 2 back
        (3, {"prior": 0, "set": 3}, 2, 1, 1),
        # another run moved the number since: the run's own delta moves, theirs stays
        (6, {"prior": 8, "set": 4}, 1, 7, 3),
    ],
)
def test_a_loan_comes_back_in_parts_and_the_full_repay_stays_exact(replicas, entry, amount, patched, left):
    obj = deployment(replicas, {"r/1": [{"path": list(R), **entry}], "r/2": []})
    patch = repay_part_patch(obj, "r/1", R, amount)
    assert patch["spec"]["replicas"] == patched
    obj["spec"]["replicas"] = patched
    obj["metadata"]["annotations"][LOANS_ANNOTATION] = patch["metadata"]["annotations"][LOANS_ANNOTATION]
    assert (
        lent(obj, "r/1") == left and json.loads(obj["metadata"]["annotations"][LOANS_ANNOTATION])["r/2"] == []
    )
    final = repay_patch(obj, "r/1")  # what the record still says comes back, and nothing twice
    assert final["spec"]["replicas"] == replicas + entry["prior"] - entry["set"]


@pytest.mark.parametrize(
    "obj, amount",
    [
        (deployment(8, {"r/1": [{"path": list(R), "prior": 8, "set": 8}]}), 1),  # all given back already
        (deployment(4, {"r/1": [{"path": list(R), "prior": 8, "set": 4}]}), 0),  # nothing asked
        (deployment(4, {"r/2": [{"path": list(R), "prior": 8, "set": 4}]}), 1),  # another run's loan
        (deployment(4, {}), 1),
    ],
)
def test_nothing_to_give_back_writes_nothing(obj, amount):
    assert repay_part_patch(obj, "r/1", R, amount) is None
