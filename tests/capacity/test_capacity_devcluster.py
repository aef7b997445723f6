"""Claim and return of GPU nodes against the devcluster, over HTTP with the official client."""

from __future__ import annotations

import threading

import pytest

from tests.capacity.helpers import (
    DEPLOYMENTS,
    HealthSampler,
    default_seeded_objects,
    kube_for,
    nodes_by_app,
    rival_writer,
    snapshot,
    writes,
)
from trainops.capacity.drain import DrainStalled, drain
from trainops.capacity.procedure import Deadlines, NodesHeld, claim, give_back
from trainops.conventions import MODE_TAINT
from trainops.kube.retry import Deadline

RUN, OTHER = "train_llm/manual__1", "train_llm/manual__2"


def claim_nodes(cluster) -> list[str]:
    """Two nodes running llm-chat, one running embeddings, one idle."""
    default_seeded_objects(cluster)
    where = nodes_by_app(cluster)
    return where["llm-chat"][:2] + where["embeddings"][:1] + where["idle"][:1]


def do_claim(apis, run, nodes, **options):
    return claim(apis, run, nodes, cluster_queue="training", deployments=DEPLOYMENTS, **options)


def gpu_quota(cluster) -> str:
    cq = cluster.store.get("clusterqueues.kueue.x-k8s.io", "", "training")
    return next(
        r["nominalQuota"]
        for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        if r["name"] == "nvidia.com/gpu"
    )


def test_flip_and_return_keep_inference_within_pdbs_and_restore_everything(devcluster):
    apis, nodes = kube_for(devcluster), claim_nodes(devcluster)
    before = snapshot(devcluster)
    sampler = HealthSampler(devcluster)

    summary = do_claim(apis, RUN, nodes)

    assert summary.gpus == 32 and sorted(summary.node_names) == sorted(nodes)
    assert gpu_quota(devcluster) == "32"
    for name in nodes:
        node = devcluster.store.get("nodes", "", name)
        assert {"key": MODE_TAINT, "value": "training", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert node["metadata"]["annotations"]["trainops.io/claimed-by"] == RUN
    on_claimed = [p for p in devcluster.store.list("pods")[0] if p["spec"].get("nodeName") in nodes]
    assert on_claimed == []

    give_back(apis, RUN, cluster_queue="training")
    sampler.stop()

    assert snapshot(devcluster) == before
    assert sampler.samples > 0
    for app, floor in sampler.min_available.items():
        assert sampler.lowest[app] >= floor, (
            f"{app} fell to {sampler.lowest[app]} healthy pods, PDB says {floor}"
        )
    deployments = {d["metadata"]["name"]: d for d in devcluster.store.list("deployments.apps")[0]}
    assert all(d["status"]["readyReplicas"] == d["spec"]["replicas"] for d in deployments.values())

    devcluster.server.audit.clear()
    do_claim(apis, RUN, nodes)  # a second cycle works the same, within 3 API writes per node per direction
    assert 0 < len(writes(devcluster)) <= 3 * len(nodes)
    devcluster.server.audit.clear()
    give_back(apis, RUN, cluster_queue="training")
    assert 0 < len(writes(devcluster)) <= 3 * len(nodes)


def test_repeated_claim_and_repeated_return_write_nothing(devcluster):
    apis, nodes = kube_for(devcluster), claim_nodes(devcluster)
    do_claim(apis, RUN, nodes)
    devcluster.server.audit.clear()
    do_claim(apis, RUN, nodes)
    assert writes(devcluster) == []
    give_back(apis, RUN, cluster_queue="training")
    devcluster.server.audit.clear()
    give_back(apis, RUN, cluster_queue="training")
    assert writes(devcluster) == []


def test_foreign_taints_added_during_the_claim_survive_the_return(devcluster):
    apis, nodes = kube_for(devcluster), claim_nodes(devcluster)
    before = snapshot(devcluster)
    do_claim(apis, RUN, nodes)
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    driver = {"key": "nvidia.com/gpu-driver-upgrade", "value": "pending", "effect": "NoSchedule"}

    def add_taints(node):
        node["spec"]["taints"] = [cordon, *node["spec"]["taints"], driver]
        node["spec"]["unschedulable"] = True

    devcluster.store.mutate("nodes", "", nodes[0], add_taints)
    give_back(apis, RUN, cluster_queue="training")

    after = snapshot(devcluster)
    expected = before["nodes"][nodes[0]]
    assert after["nodes"][nodes[0]]["spec"]["taints"] == [cordon, *expected["spec"]["taints"], driver]
    assert after["nodes"][nodes[0]]["spec"]["unschedulable"] is True
    assert after["nodes"][nodes[0]]["metadata"] == expected["metadata"]
    assert {n: o for n, o in after["nodes"].items() if n != nodes[0]} == {
        n: o for n, o in before["nodes"].items() if n != nodes[0]
    }


def test_claim_killed_halfway_then_return_leaves_the_cluster_as_before(devcluster):
    apis, nodes = kube_for(devcluster), claim_nodes(devcluster)
    before = snapshot(devcluster)
    third = sorted(nodes)[2]
    devcluster.inject("api-fault", path=f"/api/v1/nodes/{third}$", status=500, count=1)
    with pytest.raises(Exception, match="500"):
        do_claim(apis, RUN, nodes)
    held = [
        n["metadata"]["name"]
        for n in devcluster.store.list("nodes")[0]
        if n["metadata"].get("annotations", {}).get("trainops.io/claimed-by")
    ]
    assert held == sorted(nodes)[:2]

    summary = give_back(apis, RUN, cluster_queue="training")

    assert summary.node_names == sorted(nodes)[:2]
    assert snapshot(devcluster) == before


def test_conflict_storms_and_throttling_bursts_still_finish_correctly(devcluster):
    apis, nodes = kube_for(devcluster), claim_nodes(devcluster)
    before = snapshot(devcluster)
    stop = threading.Event()

    for path, status in (
        (r"/api/v1/nodes/", 503),
        (r"/api/v1/nodes/", 429),
        (r"/eviction$", 429),
        (r"/eviction$", 503),
    ):
        devcluster.inject("api-fault", path=path, status=status, fraction=0.3)
    rival = threading.Thread(target=rival_writer, args=(devcluster, nodes, stop), daemon=True)
    rival.start()
    try:
        do_claim(apis, RUN, nodes)
        give_back(apis, RUN, cluster_queue="training")
    finally:
        stop.set()
        rival.join()
        devcluster.server.faults.clear()

    statuses = [e["status"] for e in devcluster.server.audit.entries()]
    assert statuses.count(409) > 0 and statuses.count(429) > 0 and statuses.count(503) > 0
    assert snapshot(devcluster) == before


def test_two_overlapping_claims_exactly_one_holds_each_node(devcluster):
    apis = kube_for(devcluster)
    idle, chat = nodes_by_app(devcluster)["idle"], nodes_by_app(devcluster)["llm-chat"]
    first, second = idle[:3] + chat[:1], idle[1:4] + chat[1:2]
    outcomes: dict[str, object] = {}

    def run(key, nodes):
        try:
            outcomes[key] = do_claim(kube_for(devcluster), key, nodes)
        except NodesHeld as error:
            outcomes[key] = error

    threads = [
        threading.Thread(target=run, args=(RUN, first)),
        threading.Thread(target=run, args=(OTHER, second)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    winners = [k for k, v in outcomes.items() if not isinstance(v, NodesHeld)]
    assert len(winners) == 1, outcomes
    winner = winners[0]
    loser = OTHER if winner == RUN else RUN
    assert set(outcomes[loser].holders.values()) == {winner}
    give_back(apis, loser, cluster_queue="training")  # the loser's teardown
    holders = {
        n["metadata"]["name"]: n["metadata"].get("annotations", {}).get("trainops.io/claimed-by")
        for n in devcluster.store.list("nodes")[0]
    }
    assert {n for n, h in holders.items() if h} == set(outcomes[winner].node_names)
    assert all(h == winner for h in holders.values() if h)
    assert gpu_quota(devcluster) == str(8 * len(outcomes[winner].node_names))


def test_a_drain_that_cannot_finish_fails_early_naming_the_stuck_workload(devcluster):
    """Every idle node is claimed too, so evicted llm-chat pods have nowhere to go and its budget
    (minAvailable 6 of 8) holds the rest: the claim says so instead of waiting out the drain deadline."""
    apis, where = kube_for(devcluster), nodes_by_app(devcluster)
    before = snapshot(devcluster)
    nodes = where["idle"] + where["llm-chat"][:3]

    with pytest.raises(DrainStalled, match=r"cannot be rescheduled .*llm-chat.*budget"):
        do_claim(apis, RUN, nodes, deadlines=Deadlines(drain_s=120, drain_stall_s=1))
    give_back(apis, RUN, cluster_queue="training")

    assert snapshot(devcluster) == before


def test_a_drain_evicts_pod_after_pod_without_a_cancelled_request(make_devcluster):
    """kube-apiserver cancels, and does not apply, a request on a connection whose previous answer
    was released unread (the client fails it at once and closes the connection): every second
    eviction in a row cost a drain round, and the drain under-counted its evictions."""
    cluster = make_devcluster(nodes=3, inference=[])
    cluster.server.cancel_window_s = 0.2  # a write waits as long as kube-apiserver's etcd would
    core = kube_for(cluster).core
    nodes = {"gpu-node-000", "gpu-node-001", "gpu-node-002"}
    for node in sorted(nodes):
        for i in range(2):
            container = {"name": "main", "image": "busybox:1.36"}
            pod = {"metadata": {"name": f"{node}-{i}"}, "spec": {"nodeName": node, "containers": [container]}}
            core.create_namespaced_pod("default", pod)

    evicted = drain(core, nodes, Deadline(60))

    answers = [e["status"] for e in cluster.server.audit.entries() if e["path"].endswith("/eviction")]
    assert evicted == 6 and answers == [201] * 6
