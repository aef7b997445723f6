"""Before anything is claimed: the run's LocalQueue leads to the claimed ClusterQueue, which covers every
resource its pods request (Kueue leaves a run asking for an uncovered one pending for good).  Against a
devcluster serving each Kueue API version; the queues are ``deploy/kueue-queues.yaml``'s."""

from __future__ import annotations

import sys

import pytest
from trainops_devcluster.kueue import KueueConfig

from tests.devcluster.ctrl_support import wait_for
from tests.training.conftest import idle_nodes
from trainops.capacity.coverage import QueueMismatch, check_queue
from trainops.capacity.procedure import claim, give_back
from trainops.kube.client import Kube
from trainops.kube.retry import Deadline
from trainops.training.cluster import GangCluster
from trainops.training.job import build_job
from trainops.training.spec import TrainingSpec

RDMA_RUN = ["nvidia.com/gpu", "rdma/ib", "cpu", "memory"]


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_the_queue_is_checked_with_reads_only_and_refused_with_the_fix(make_devcluster, version):
    cluster = make_devcluster(nodes=2, kueue_config=KueueConfig(version=version))
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    other = {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "LocalQueue",
        "metadata": {"name": "other", "namespace": "training"},
        "spec": {"clusterQueue": "elsewhere"},
    }
    kube.create(other, kube.kueue("localqueues"))
    cluster.server.audit.clear()

    def check(local_queue="training", resources=RDMA_RUN, cluster_queue="training", priority_class=None):
        return check_queue(
            kube,
            "training",
            local_queue,
            resources,
            Deadline(30),
            cluster_queue=cluster_queue,
            priority_class=priority_class,
        )

    assert (
        check(priority_class="training-urgent") == "training"
    )  # the README's RDMA run: covered by deploy/kueue-queues.yaml
    for args, message in [
        (
            {"resources": ["nvidia.com/gpu", "rdma/hca_shared_devices_a"]},
            "ClusterQueue training does not cover rdma/hca_shared_devices_a, which each pod of the run requests: "
            'Kueue would leave the run pending ("resource rdma/hca_shared_devices_a unavailable in '
            'ClusterQueue"). Add rdma/hca_shared_devices_a to coveredResources of ClusterQueue training, with a '
            "nominalQuota in each flavor of that resource group (see deploy/kueue-queues.yaml)",
        ),
        (
            {"local_queue": "nope"},
            "LocalQueue training/nope does not exist: create it (see deploy/kueue-queues.yaml)",
        ),
        (
            {"local_queue": "other"},
            "LocalQueue training/other sends runs to ClusterQueue 'elsewhere', but the claim raises the quota of "
            "ClusterQueue 'training', so the run would never be admitted: point the LocalQueue's "
            "spec.clusterQueue at 'training', or claim for 'elsewhere'",
        ),
        (
            {"local_queue": "other", "cluster_queue": None},
            "ClusterQueue 'elsewhere' of LocalQueue training/other does not exist",
        ),
        (
            {"priority_class": "training-lowest"},
            "WorkloadPriorityClass 'training-lowest' does not exist: Kueue would make no Workload for the run",
        ),
    ]:
        with pytest.raises(QueueMismatch) as refused:
            check(**args)
        assert str(refused.value).startswith(message), args
    assert {e["verb"] for e in cluster.server.audit.entries()} <= {"get"}  # reads only


def test_a_claim_for_a_run_its_queue_cannot_admit_fails_without_retries_and_changes_nothing(devcluster):
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException
    from trainops.operators.capacity import ClaimNodesOperator

    from tests.capacity.helpers import snapshot
    from tests.capacity.test_capacity_operators import nodes_to_claim

    nodes = nodes_to_claim(devcluster)
    before = snapshot(devcluster)
    operator = ClaimNodesOperator(
        task_id="claim_nodes",
        node_names=nodes,
        local_queue="training",
        run_resources=["nvidia.com/gpu", "rdma/hca_shared_devices_a"],
        inference_deployments=["inference/llm-chat"],
    )

    with pytest.raises(AirflowFailException, match="does not cover rdma/hca_shared_devices_a"):
        operator.execute({"dag_run": SimpleNamespace(dag_id="dag", run_id="run")})
    assert snapshot(devcluster) == before


def test_the_readmes_rdma_run_is_admitted_by_the_shipped_queues(devcluster, k8s):
    """``extra_resources={"rdma/ib": 1}`` (README): Kueue admits it with deploy/kueue-queues.yaml."""
    kube = Kube.from_kubeconfig(str(devcluster.kubeconfig))
    nodes = idle_nodes(k8s)[:2]
    claim(kube, "dag/rdma", nodes, cluster_queue="training")
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-c", "pass"],
        run_uri="s3://bucket/runs/rdma/",
        nodes=2,
        node_names=nodes,
        extra_resources={"rdma/ib": 1},
    )
    check_queue(kube, "training", spec.queue, ["nvidia.com/gpu", "rdma/ib"], Deadline(30))
    job, _ = GangCluster(kube).create_job(
        build_job(spec, name="rdma", dag_id="dag", run_id="rdma", attempt=1, resume_from=None)
    )
    workload = wait_for(
        lambda: (
            next(iter(GangCluster(kube).workloads("training", job)), {}).get("status", {}).get("admission")
        ),
        "the RDMA run admitted",
    )
    assert workload["podSetAssignments"][0]["flavors"]["rdma/ib"] == "gpu"
    assert workload["podSetAssignments"][0]["resourceUsage"]["rdma/ib"] == "2"
    give_back(kube, "dag/rdma", cluster_queue="training")
