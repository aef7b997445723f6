"""Inference keeps serving while training borrows its nodes, on the devcluster: displaced replicas are
made Ready in an overflow pool before their pods go, and come back in waves; a return killed halfway
resumes where it stopped; the service is measured through its Service, as clients reach it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from trainops_devcluster.demo.load import Load
from trainops_devcluster.topology import InferenceWorkload

from tests.capacity.helpers import (
    DEPLOYMENTS,
    HealthSampler,
    default_seeded_objects,
    kube_for,
    nodes_by_app,
    snapshot,
    writes,
)
from trainops.capacity.claims import release
from trainops.capacity.overflow import OVERFLOW_ANNOTATION, OverflowPoolError, lent
from trainops.capacity.procedure import claim, give_back
from trainops.capacity.quota import set_grant
from trainops.capacity.reaper import reap
from trainops.cli import main
from trainops.kube.nodes import edit_node, holder_of
from trainops.kube.retry import Deadline

RUN = "train_llm/manual__9"
CHAT = "inference/chat"


def held(cluster) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in cluster.store.list("nodes")[0]
        if holder_of(n["metadata"].get("annotations")) == RUN
    )


def deployment(cluster, name: str) -> dict | None:
    return cluster.store.find("deployments.apps", "inference", name)


def test_a_return_killed_halfway_resumes_and_the_service_never_drops_below_its_replicas(
    make_devcluster, capsys
):
    """8 inference servers on 8 GPU nodes (PDB minAvailable 6), a steady load through their Service;
    a claim of 4 nodes moves 4 replicas to the virtual node first; `trainops capacity return` in waves
    of one node is SIGKILLed after its second wave and run again: every request is served, Ready
    replicas never drop below 8, and the cluster ends exactly as it began."""
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    chat = InferenceWorkload(
        "chat", 8, min_available=6, server=True, server_args=("--service-ms", "50"), overflow=True
    )
    cluster = make_devcluster(nodes=8, virtual_nodes=1, inference=[chat], process_env=env)
    default_seeded_objects(cluster)
    before = snapshot(cluster)
    kubeconfig = str(cluster.kubeconfig)
    load = Load(cluster.service_address("inference", "chat", 80), rate=20).start()
    sampler = HealthSampler(cluster)
    try:
        nodes = nodes_by_app(cluster)["chat"][:4]
        summary = claim(kube_for(cluster), RUN, nodes, cluster_queue="training", deployments=[CHAT])

        assert summary.offloaded == {f"Deployment {CHAT}": 4} and summary.not_offloaded == {}
        assert summary.evictions == 0  # the scale-down removed exactly the pods on the claimed nodes
        companion = deployment(cluster, "chat-overflow")
        assert (companion["spec"]["replicas"], companion["status"]["readyReplicas"]) == (4, 4)
        assert deployment(cluster, "chat")["spec"]["replicas"] == 4
        where = nodes_by_app(cluster)["chat"]
        assert where.count("virtual-node-0") == 4 and not set(where) & set(nodes)
        assert main(["capacity", "status", "--kubeconfig", kubeconfig, "--json"]) == 0
        lent = json.loads(capsys.readouterr().out)["inference_loans"][RUN]
        assert [(loan["workload"], loan["overflow_of"], loan["fields"][0]["set"]) for loan in lent] == [
            (f"Deployment {CHAT}", None, 4),
            (f"Deployment {CHAT}-overflow", f"Deployment {CHAT}", 4),
        ]

        load.phase("return")
        argv = [sys.executable, "-m", "trainops.cli", "capacity", "return", "--kubeconfig", kubeconfig]
        argv += ["--run", RUN, "--wave-nodes", "1", "--training-namespace", ""]
        worker = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while deployment(cluster, "chat-overflow")["spec"]["replicas"] > 2 and worker.poll() is None:
            time.sleep(0.01)
        worker.kill()
        worker.wait()
        assert deployment(cluster, "chat-overflow")["spec"]["replicas"] == 2, (
            "the return ended before it was killed"
        )
        assert 1 <= len(held(cluster)) <= 2  # two waves done, the third perhaps begun

        assert (
            main(["capacity", "return", "--kubeconfig", kubeconfig, "--run", RUN, "--training-namespace", ""])
            == 0
        )
        load.phase("after")
        time.sleep(1)
    finally:
        load.stop()
        sampler.stop()

    assert snapshot(cluster) == before  # nodes, Deployments (the companion gone), budgets, quota
    assert sampler.samples > 0 and sampler.lowest["chat"] >= 8, sampler.lowest
    rows = {row.phase: row for row in load.report()}
    assert all(row.served > 0 and row.failed == 0 for row in rows.values()), [r.line() for r in rows.values()]


def test_what_the_pool_has_no_room_for_shrinks_and_a_bad_annotation_changes_nothing(devcluster):
    """The DAG param names the pool for workloads without an annotation of their own: here the GPU
    nodes themselves, of which the two idle ones left have room; the third displaced replica shrinks,
    and the summary says so.  A pool annotation that cannot be used fails the claim before anything
    is written."""
    default_seeded_objects(devcluster)
    where = nodes_by_app(devcluster)
    nodes = where["llm-chat"][:3] + where["idle"][:2]
    before = snapshot(devcluster)
    kube = kube_for(devcluster)
    pool = {"node_label": "nvidia.com/gpu.present=true"}

    devcluster.store.mutate(
        "deployments.apps",
        "inference",
        "embeddings",
        lambda d: (
            d["metadata"].setdefault("annotations", {}).update({OVERFLOW_ANNOTATION: '{"node_label": 1'})
        ),
    )
    devcluster.server.audit.clear()
    with pytest.raises(OverflowPoolError, match=f"annotation {OVERFLOW_ANNOTATION} of inference/embeddings"):
        claim(kube, RUN, nodes, cluster_queue="training", deployments=DEPLOYMENTS, overflow_pool=pool)
    assert writes(devcluster) == []
    devcluster.store.mutate(
        "deployments.apps",
        "inference",
        "embeddings",
        lambda d: d["metadata"]["annotations"].pop(OVERFLOW_ANNOTATION),
    )
    default_seeded_objects(devcluster)

    sampler = HealthSampler(devcluster)
    summary = claim(kube, RUN, nodes, cluster_queue="training", deployments=DEPLOYMENTS, overflow_pool=pool)

    chat = "Deployment inference/llm-chat"
    assert summary.offloaded == {chat: 2}
    assert summary.not_offloaded == {chat: "2 of 3 fit in its overflow pool; the rest shrink"}
    assert (
        deployment(devcluster, "llm-chat")["spec"]["replicas"],
        deployment(devcluster, "llm-chat-overflow")["spec"]["replicas"],
    ) == (5, 2)
    loans = json.loads(
        deployment(devcluster, "llm-chat-overflow")["metadata"]["annotations"]["trainops.io/capacity-loans"]
    )
    assert loans == {RUN: [{"path": ["spec", "replicas"], "prior": 0, "set": 2}]}

    returned = give_back(kube, RUN, cluster_queue="training")
    sampler.stop()

    assert returned.waves == 3  # 5 nodes, 2 a wave (a quarter, rounded up)
    assert returned.overflow_removed == ["Deployment inference/llm-chat-overflow"]
    assert snapshot(devcluster) == before
    assert sampler.lowest["llm-chat"] >= 7, sampler.lowest  # 8 + 2, then 5 + 2: never the PDB's 6


def test_the_reaper_finds_a_run_whose_return_stopped_after_its_nodes(devcluster):
    """A return killed after its last node went back leaves only loans (replicas still in the overflow
    pool): the run holds no node and no quota, and the reaper still finds it and finishes the return."""
    default_seeded_objects(devcluster)
    where = nodes_by_app(devcluster)
    before = snapshot(devcluster)
    kube = kube_for(devcluster)
    pool = {"node_label": "nvidia.com/gpu.present=true"}
    claim(
        kube,
        RUN,
        where["llm-chat"][:2],
        cluster_queue="training",
        deployments=DEPLOYMENTS,
        overflow_pool=pool,
    )
    for name in held(devcluster):  # what the return had done when it was killed
        edit_node(kube.core, name, release(RUN), Deadline(30))
    set_grant(kube, "training", RUN, 0, Deadline(30))
    assert lent(deployment(devcluster, "llm-chat-overflow"), RUN) == 2

    summary = reap(kube, lambda run: False, cluster_queue="training", grace_s=0, training_namespace=None)

    assert summary.returned == [RUN] and summary.failed == {}
    assert snapshot(devcluster) == before
