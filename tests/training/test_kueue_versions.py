"""The run's Kueue paths against a devcluster serving each Kueue API version: ``v1beta1`` as the 0.13
line (``Pending``/``Inadmissible`` only) and ``v1beta2`` (0.15 and later); the package discovers which.
The paths: quota claimed and returned, a gang run preempted and requeued on its way to completion, a
stop, and Kueue's own deactivation at its requeuing limit, which is reported with Kueue's reason and
is no stop."""

from __future__ import annotations

import dataclasses

import pytest
from trainops_devcluster.kueue import KueueConfig

from tests.devcluster.ctrl_support import wait_for
from tests.training.conftest import claimed_run, idle_nodes, run_to_end, training_run, when
from trainops.capacity.procedure import give_back
from trainops.capacity.quota import grants_of
from trainops.kube.kueue import BY_KUEUE, read, resource, workload_facts
from trainops.kube.retry import Deadline
from trainops.training.cluster import GangCluster
from trainops.training.decide import Fail, Succeed
from trainops.training.failures import FailureKind
from trainops.training.job import build_job
from trainops.training.naming import job_name

VERSIONS = pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
ARGS = ["--steps", "150", "--checkpoint-every", "20", "--step-seconds", "0.02"]


def run_to_verdict(cluster, kube, spec, run_id: str):
    """The trigger's loop (``TrainingRun.follow_to_end`` following with ``RunFollower``): its end, and the
    ledger read back from the cluster."""
    run = training_run(kube, spec, run_id, max_resumes=0)
    return run_to_end(cluster, run), run.observe()


def workload_of(kube, job: str) -> dict | None:
    custom = kube.custom
    listed = custom.list_namespaced_custom_object(*resource(custom, "workloads")[:2], "training", "workloads")
    return next((w for w in listed["items"] if w["metadata"]["ownerReferences"][0]["name"] == job), None)


@pytest.fixture
def start(make_devcluster, s3):
    """``start(kueue_config)``: an 8-node devcluster serving that Kueue, and an ApiClient of it."""
    from kubernetes import config

    clients = []

    def make(kueue_config: KueueConfig):
        cluster = make_devcluster(nodes=8, process_env=s3.env(), kueue_config=kueue_config)
        clients.append(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        return cluster, clients[-1]

    yield make
    for api in clients:
        api.close()


def watching(cluster, path: str) -> bool:
    """Someone (the follower) watches ``path``: what it sees from now on, it sees."""
    return any(e["verb"] == "watch" and path in e["path"] for e in cluster.server.audit.entries())


def running(gang: GangCluster, job: str, count: int = 2) -> bool:
    return sum(p["status"].get("phase") == "Running" for p in gang.job_pods("training", job)) >= count


@VERSIONS
def test_quota_a_preempted_gang_run_to_completion_and_a_stop(start, bucket, version):
    cluster, api = start(KueueConfig(version=version))
    kube, spec = claimed_run(cluster, api, bucket, "preempted", ARGS)
    queue = read(kube.custom, "clusterqueues", "training", Deadline(30))
    assert queue["apiVersion"] == f"kueue.x-k8s.io/{version}"
    assert grants_of(queue)["dag/preempted"]["gpus"] == 16
    gang, first = GangCluster(kube), job_name("dag", "preempted", 1)

    def preempt() -> None:  # an urgent run takes the quota; once it is admitted, it is stopped
        urgent = dataclasses.replace(
            spec, run_uri=f"s3://{bucket}/runs/urgent/", priority_class="training-urgent"
        )
        gang.create_job(
            build_job(urgent, name="urgent", dag_id="dag", run_id="urgent", attempt=1, resume_from=None)
        )
        wait_for(
            lambda: workload_facts(workload_of(kube, "urgent") or {}).admitted, "the urgent run admitted"
        )
        gang.stop("training", "urgent")

    thread = when(lambda: running(gang, first) and watching(cluster, "/workloads"), preempt)
    verdict, ledger = run_to_verdict(cluster, kube, spec, "preempted")
    thread.join(timeout=60)

    assert isinstance(verdict, Succeed), verdict
    assert (ledger.preemptions, len(ledger.attempts)) == (1, 1)  # requeued by Kueue: no resume used
    done = workload_of(kube, first)
    assert done["apiVersion"] == f"kueue.x-k8s.io/{version}"
    assert workload_facts(done).finished.reason == "Succeeded"

    stopped = dataclasses.replace(spec, run_uri=f"s3://{bucket}/runs/stopped/")
    second = job_name("dag", "stopped", 1)
    when(lambda: running(gang, second), lambda: gang.stop("training", second))
    verdict, ledger = run_to_verdict(cluster, kube, stopped, "stopped")
    assert isinstance(verdict, Fail) and ledger.attempts[0].end.kind == FailureKind.STOPPED
    assert "was deactivated (Deactivated" in verdict.reason

    give_back(kube, "dag/preempted", cluster_queue="training")
    assert grants_of(read(kube.custom, "clusterqueues", "training", Deadline(30))) == {}


@VERSIONS
def test_kueues_requeuing_limit_is_reported_with_kueues_reason_not_as_a_stop(start, bucket, version):
    cluster, api = start(
        KueueConfig(
            version=version,
            wait_for_pods_ready_timeout_s=0.5,
            requeue_backoff_base_s=0.2,
            backoff_limit_count=1,
            topology_aware_scheduling=False,  # with TAS, Kueue would not admit onto nodes it knows are tainted
        )
    )
    kube, spec = claimed_run(cluster, api, bucket, "stuck", ARGS)
    inference = sorted(set(cluster.telemetry) - set(idle_nodes(api)))[:2]
    stuck = dataclasses.replace(spec, node_names=inference)  # nodes still tainted for inference: pods pend

    verdict, ledger = run_to_verdict(cluster, kube, stuck, "stuck")

    ended = [(a.end.kind, a.end.reason) for a in ledger.attempts]
    assert isinstance(verdict, Fail), ended
    assert ended[0][0] == FailureKind.KUEUE_DEACTIVATED and len(ended) == 1, ended
    assert "Kueue deactivated Workload" in verdict.reason
    assert "DeactivatedDueToRequeuingLimitExceeded" in verdict.reason
    # the follow may end on DeactivationTarget, before Kueue set spec.active=false and evicted it
    workload = wait_for(
        lambda: (w := workload_of(kube, job_name("dag", "stuck", 1))) and workload_facts(w).evicted and w,
        "Kueue's eviction",
    )
    assert workload["spec"]["active"] is False
    assert workload_facts(workload).evicted.reason == "DeactivatedDueToRequeuingLimitExceeded"
    assert training_run(kube, stuck, "stuck").observe().attempts[0].stopped_by == BY_KUEUE  # not a stop
    give_back(kube, "dag/stuck", cluster_queue="training")
