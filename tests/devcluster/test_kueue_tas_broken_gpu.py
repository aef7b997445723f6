"""Kueue TAS in the devcluster reads the node's allocatable: a node whose GPU fell off the bus does
not hold an 8-GPU pod until it is repaired (the device plugin takes the GPU out of allocatable)."""

from __future__ import annotations

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.test_kueue_tas import admitted, pending, pods, submit, tas  # noqa: F401 (fixture)
from trainops.placement.request import RACK_LABEL


def test_tas_does_not_place_an_8_gpu_pod_on_a_node_with_an_unhealthy_gpu_until_repair(tas):  # noqa: F811
    dev, kube, version = tas("2,2/2", [0, 1])  # one rack of two claimed nodes
    dev.inject("xid", "gpu-node-000", code=79, gpu=4)
    node = kube.core.read_node("gpu-node-000")
    assert (node.status.allocatable["nvidia.com/gpu"], node.status.capacity["nvidia.com/gpu"]) == ("7", "8")

    submit(kube, "run", 2, {"kueue.x-k8s.io/podset-required-topology": RACK_LABEL})

    quota = pending(kube, version)
    assert quota["reason"] == "TopologyPlacementFailed"
    assert "allows to fit only 1 out of 2 pod(s)" in quota["message"]
    assert all(p.spec.node_name is None for p in pods(kube))

    dev.inject("repair", "gpu-node-000")
    admitted(kube, version)
    placed = wait_for(lambda: len(p := [x.spec.node_name for x in pods(kube) if x.spec.node_name]) == 2 and p)
    assert sorted(placed) == ["gpu-node-000", "gpu-node-001"]
