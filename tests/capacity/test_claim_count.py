"""A claim of ``count`` of the gate's candidates takes the least disruptive nodes, on the devcluster."""

from __future__ import annotations

from tests.capacity.helpers import DEPLOYMENTS, default_seeded_objects, kube_for, nodes_by_app
from trainops.capacity.procedure import claim, give_back
from trainops.conventions import MODE_TAINT

RUN, OTHER = "train_llm/manual__1", "train_llm/manual__2"


def mode(cluster, name: str) -> str | None:
    taints = cluster.store.get("nodes", "", name)["spec"].get("taints") or []
    return next((t["value"] for t in taints if t["key"] == MODE_TAINT), None)


def test_count_claims_idle_nodes_first_skips_held_ones_and_lists_pods_once(devcluster):
    default_seeded_objects(devcluster)
    where = nodes_by_app(devcluster)
    busy, idle = where["llm-chat"][:2], where["idle"][:3]
    kube = kube_for(devcluster)
    claim(kube, OTHER, idle[:1], cluster_queue="training")
    listed_before = len(devcluster.server.audit.entries())

    summary = claim(kube, RUN, [*busy, *idle], count=3, cluster_queue="training", deployments=DEPLOYMENTS)

    assert sorted(summary.node_names) == sorted([*idle[1:], busy[0]])
    # the scale-down removed the pod on the claimed node itself (pod-deletion-cost): nothing to evict
    assert summary.workloads_shrunk == ["Deployment inference/llm-chat"] and summary.evictions == 0
    assert [mode(devcluster, n) for n in sorted(summary.node_names)] == ["training"] * 3
    assert mode(devcluster, busy[1]) == "inference"
    assert [p for p in devcluster.store.list("pods")[0] if p["spec"].get("nodeName") == busy[0]] == []
    requests = devcluster.server.audit.entries()[listed_before:]
    pod_lists = [e for e in requests if e["verb"] == "list" and "/pods" in e["path"]]
    # one (paged) for the ranking and the inference shrink; the drain's are one per claimed node each
    assert len([e for e in pod_lists if "spec.nodeName" not in e["path"]]) == 1
    give_back(kube, RUN, cluster_queue="training")
    give_back(kube, OTHER, cluster_queue="training")
    assert mode(devcluster, busy[0]) == "inference"
