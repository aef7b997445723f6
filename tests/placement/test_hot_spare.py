"""Hot spares: the claim pulls the training image onto every claimed node, the spare included, so the
pods of a resume find it there; the pull pods are gone afterwards."""

from __future__ import annotations

from tests.devcluster.ctrl_support import wait_for
from trainops.capacity.prepull import PREPULL_LABEL, prepull_pod, pull_state
from trainops.capacity.procedure import claim, give_back
from trainops.kube.client import Kube

IMAGE = "registry.example/trainer:2.1"
RUN = "train_llm/manual__1"


def events_about(kube: Kube, node: str, reason: str) -> list[str]:
    found = kube.core.list_namespaced_event("training").items
    return [e.message for e in found if e.reason == reason and e.source.host == node]


def test_the_claim_pulls_the_image_onto_each_node_and_a_later_pod_finds_it_there(make_devcluster):
    dev = make_devcluster(nodes=4, inference=[], system_nodes=0, image_pull_s=0.2)
    kube = Kube.from_kubeconfig(str(dev.kubeconfig))
    nodes = ["gpu-node-000", "gpu-node-001", "gpu-node-002"]

    summary = claim(kube, RUN, nodes, cluster_queue="training", image=IMAGE)

    assert summary.prepulled == dict.fromkeys(nodes, "pulled")
    for node in nodes:
        images = kube.core.read_node(node).status.images or []
        assert any(IMAGE in (i.names or []) for i in images)
        assert events_about(kube, node, "Pulled") == [f'Successfully pulled image "{IMAGE}" in 0.200s']
    assert not kube.core.list_namespaced_pod("training", label_selector=PREPULL_LABEL).items
    assert not (kube.core.read_node("gpu-node-003").status.images or [])  # not claimed, not pulled

    spare = prepull_pod("resume/after-fault", "gpu-node-002", IMAGE)  # any later pod of that image
    kube.core.create_namespaced_pod("training", spare)
    wait_for(
        lambda: (
            f'Container image "{IMAGE}" already present on machine'
            in events_about(kube, "gpu-node-002", "Pulled")
        )
    )
    give_back(kube, RUN, cluster_queue="training")


def test_pull_states_from_the_pod_status():
    waiting = {
        "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]
    }

    assert pull_state({"status": {"phase": "Pending"}}) is None
    assert pull_state({"status": {"phase": "Failed"}}) == "pulled"  # got past the pull: `true` may be missing
    assert pull_state({"status": {"phase": "Pending", **waiting}}) == "failed: ImagePullBackOff: not found"
    pod = prepull_pod(RUN, "gpu-node-007", IMAGE)
    assert len(pod["metadata"]["name"]) <= 63 and pod["spec"]["nodeSelector"] == {
        "kubernetes.io/hostname": "gpu-node-007"
    }
