"""A request Kueue can never admit ends at once, for every caller, instead of waiting out its admission
timeout (3,600 s by default) as ``admission_timeout``.

Kueue (0.13, measured) answers a PodSet asking for a resource its ClusterQueue does not cover at once, and
for good: ``QuotaReserved=False`` (``Pending``; ``NoMatchingFlavor`` from 0.19) "couldn't assign flavors to
pod set main: resource rdma/ib unavailable in ClusterQueue".  The run checks its Job's requests against its
queues before its first Job (nothing is submitted); where that check cannot see (the queues unreadable, the
check off), the follower ends the attempt on Kueue's answer.  Answers that may change (quota short, a
preemption under way, no topology room now) never end it."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from trainops_devcluster.kueue import KueueConfig

from tests.training.conftest import claimed_run, jobs, run_to_end, training_run
from trainops.kube.client import Kube
from trainops.kube.queues import QueueMismatch, never_admits, requested_resources
from trainops.training.cluster import GangCluster
from trainops.training.decide import Fail
from trainops.training.failures import FailureKind
from trainops.training.follow import FollowConfig, RunState, Status
from trainops.training.job import build_job
from trainops.training.ledger import State
from trainops.training.naming import job_name

UNCOVERED = "rdma/hca_shared_devices_a"  # deploy/kueue-queues.yaml covers rdma/ib, not this
PODSET = "couldn't assign flavors to pod set main: "

# Kueue's words (pkg/scheduler/flavorassigner/{flavorassigner,tas_flavorassigner}.go; 0.13 measured):
# what they name when the queue can never admit the request, None when the answer may change.
ANSWERS = [
    (PODSET + "resource rdma/ib unavailable in ClusterQueue", (("rdma/ib",), ())),
    (PODSET + "untolerated taint gpu=broken:NoSchedule in flavor gpu", ((), ("gpu",))),
    (
        PODSET + "flavor a100 doesn't match node affinity, flavor h100 doesn't match node affinity",
        ((), ("a100", "h100")),
    ),
    (PODSET + 'Flavor "gpu" does not support TopologyAwareScheduling', ((), ("gpu",))),
    (PODSET + 'Flavor "gpu" does not contain the requested level', ((), ("gpu",))),
    (
        "couldn't assign flavors to pod set driver: insufficient unused quota for cpu in flavor default, "
        "1 more needed; " + PODSET + "resource example.com/fpga unavailable in ClusterQueue",
        (("example.com/fpga",), ()),
    ),
    # may change: quota short (a claim raises nominalQuota), a preemption, a topology with no room now
    (PODSET + "insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed", None),
    (
        PODSET + "insufficient quota for nvidia.com/gpu in flavor gpu, request > maximum capacity (24 > 16)",
        None,
    ),
    (
        PODSET + "insufficient quota for nvidia.com/gpu in flavor gpu-shared, previously considered podsets "
        "requests (0) + current podset request (16) > maximum capacity (8)",
        None,
    ),
    (
        PODSET
        + "insufficient unused quota for nvidia.com/gpu in flavor gpu-shared, 8 more needed. Pending the "
        "preemption of 1 workload(s)",
        None,
    ),
    ("Pending the preemption of 1 workload(s)", None),
    # one flavor misfits for good, another is only short of quota: it may still be admitted there
    (
        PODSET + "flavor a100 doesn't match node affinity, insufficient unused quota for nvidia.com/gpu in "
        "flavor h100, 8 more needed",
        None,
    ),
    (PODSET + 'topology "gpu-topology" doesn\'t allow to fit any of 2 pod(s)', None),
    (PODSET + 'Flavor "gpu" information missing in TAS cache', None),
    ("failed to assign flavors to pod set main: no TAS flavor assigned", None),
    ("LocalQueue training doesn't exist", None),
    ("ClusterQueue training is inactive", None),
    ("The workload is deactivated", None),
    ("", None),
]


@pytest.mark.parametrize(("message", "named"), ANSWERS)
def test_only_kueues_answers_that_can_never_change_say_never(message, named):
    found = never_admits(message)
    assert (None if found is None else (found.resources, found.flavors)) == named, message


def test_the_followers_verdict_on_a_pending_workload():
    config = FollowConfig("training", "run-1", "s3://b/runs/r/", nodes=2, admission_timeout=3600)
    job = {"metadata": {"name": "run-1", "uid": "u"}, "spec": {"suspend": True}}

    def pending(reason: str, message: str) -> dict:
        condition = {"type": "QuotaReserved", "status": "False", "reason": reason, "message": message}
        return {
            "metadata": {"name": "job-run-1-abcde"},
            "spec": {"queueName": "training", "active": True},
            "status": {"conditions": [condition]},
        }

    state = RunState(config, job, None, now=0.0)
    state.apply(
        "workload",
        "MODIFIED",
        pending("Pending", PODSET + "resource rdma/ib unavailable in ClusterQueue"),
        1.0,
    )
    status, message = state.verdict(1.0)
    assert status is Status.NEVER_ADMITTED
    assert message.startswith(
        "Kueue can never admit Workload job-run-1-abcde as its queue and the run's request stand "
        "(QuotaReserved=False, Pending: couldn't assign flavors to pod set main: resource rdma/ib "
        "unavailable in ClusterQueue): add rdma/ib to coveredResources of the ClusterQueue behind LocalQueue training/training"
    ) and message.endswith("or drop the request from the run"), message

    state = RunState(config, job, None, now=0.0)
    short = PODSET + "insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed"
    state.apply("workload", "MODIFIED", pending("WaitingForQuota", short), 1.0)
    assert state.verdict(1.0) is None  # waits, up to its admission timeout
    assert state.verdict(3601.0)[0] is Status.ADMISSION_TIMEOUT


def test_what_a_pod_requests_as_kueue_counts_it():
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "8", "cpu": "2"}}},
            {"resources": {"requests": {"memory": "0", "example.com/fpga": "0Gi"}}},  # zero: no request
        ],
        "initContainers": [{"resources": {"limits": {"rdma/ib": "1"}}}],
        "overhead": {"memory": "64Mi"},
    }
    assert requested_resources(spec) == {"cpu", "nvidia.com/gpu", "rdma/ib", "memory"}


def test_a_run_asking_for_an_uncovered_resource_fails_at_once_and_submits_nothing(cluster, api, s3, bucket):
    kube, spec = claimed_run(cluster, api, bucket, "uncovered", ["--steps", "40"])
    run = training_run(kube, dataclasses.replace(spec, extra_resources={UNCOVERED: 1}), "uncovered")

    with pytest.raises(QueueMismatch) as refused:  # a PermanentError: the task fails without retries
        run.reconcile()

    assert str(refused.value).startswith(
        f"Kueue can never admit Job training/{job_name('dag', 'uncovered', 1)}: ClusterQueue training "
        f"(behind LocalQueue training/training) does not cover {UNCOVERED}, which each pod of the run "
        f'requests (Kueue would answer "resource {UNCOVERED} unavailable in ClusterQueue" and the run wait '
        f"for its admission timeout); nothing was submitted. Add {UNCOVERED} to coveredResources of "
        "ClusterQueue training, with a nominalQuota in each flavor of that resource group (see "
        "deploy/kueue-queues.yaml), or drop the request from the run (extra_resources, pod_template)"
    )
    assert jobs(api) == [] and run.observe().attempts == ()


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_the_follower_ends_the_attempt_on_kueues_answer_when_the_check_did_not_run(
    make_devcluster, s3, bucket, version
):
    """The check off (a Kueue configuration that excludes resources makes it wrong): the Job is submitted,
    Kueue answers at once, and the run fails on that answer (never_admitted, one Job), not at its 3,600 s
    admission timeout (admission_timeout)."""
    from kubernetes import config

    cluster = make_devcluster(nodes=8, process_env=s3.env(), kueue_config=KueueConfig(version=version))
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    kube, spec = claimed_run(cluster, api, bucket, "unchecked", ["--steps", "40"])
    run = training_run(
        kube, dataclasses.replace(spec, extra_resources={UNCOVERED: 1}), "unchecked", check_queue=False
    )
    assert run.follow_config.admission_timeout == 3600  # waiting it out would hang the test, not pass it

    action = run_to_end(cluster, run)

    assert isinstance(action, Fail), action
    assert action.reason.startswith(
        "attempt 1 failed, no resume (never_admitted): Kueue can never admit Workload "
    )
    reason = "Pending" if version == "v1beta1" else "NoMatchingFlavor"
    assert (
        f"(QuotaReserved=False, {reason}: couldn't assign flavors to pod set main: resource {UNCOVERED} "
        f"unavailable in ClusterQueue): add {UNCOVERED} to coveredResources of the ClusterQueue behind "
        "LocalQueue training/training"
    ) in action.reason
    (attempt,) = run.observe().attempts
    assert attempt.end.kind == FailureKind.NEVER_ADMITTED and attempt.state is State.STOPPED
    assert len(jobs(api)) == 1  # submitted: nothing checked it first
    api.close()


def test_queues_it_cannot_read_are_logged_and_nothing_is_refused(cluster, tmp_path, caplog):
    """A worker whose RBAC cannot read the queues (or a LocalQueue not created yet): the check says so in
    the log and lets the Job go; Kueue's answer ends the attempt then (the test above)."""
    import sys

    from trainops.training.spec import TrainingSpec

    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-c", "pass"],
        run_uri="s3://bucket/runs/r/",
        extra_resources={UNCOVERED: 1},
    )
    job = build_job(spec, name="r-1", dag_id="dag", run_id="r", attempt=1, resume_from=None)
    nobody = Kube.from_kubeconfig(
        str(cluster.service_account_kubeconfig("training", "nobody", tmp_path / "kc"))
    )
    admin = Kube.from_kubeconfig(str(cluster.kubeconfig))
    elsewhere = build_job(
        dataclasses.replace(spec, queue="not-created-yet"),
        name="r-1",
        dag_id="dag",
        run_id="r",
        attempt=1,
        resume_from=None,
    )

    with caplog.at_level(logging.WARNING, logger="trainops.training.cluster"):
        assert GangCluster(nobody).check_admissible(job) is None
        assert GangCluster(admin).check_admissible(elsewhere) is None
    said = [r.getMessage() for r in caplog.records]
    assert "could not read LocalQueue training/training and its ClusterQueue (HTTP 403" in said[0], said
    assert said[0].endswith("submitting unchecked"), said
    assert said[1].startswith("LocalQueue training/not-created-yet does not exist; submitting unchecked"), (
        said
    )
    with pytest.raises(QueueMismatch, match=f"does not cover {UNCOVERED}"):
        GangCluster(admin).check_admissible(job)


def test_check_queue_off_still_refuses_a_kueue_whose_tas_ignores_node_affinity(make_devcluster, s3, bucket):
    """``check_queue=False`` turns off the coverage check only: a Kueue 0.13.9 placing by TAS (it ignores
    the pods' required node affinity) is refused before the first Job all the same."""
    from kubernetes import config

    from tests.devcluster.test_kueue_tas_versions import kueue_controller
    from trainops.training.cluster import KueueRelease

    kueue = KueueConfig(version="v1beta1", topology_aware_scheduling=True, controller_version="v0.13.9")
    cluster = make_devcluster(nodes=8, process_env=s3.env(), kueue_config=kueue)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    kube, spec = claimed_run(cluster, api, bucket, "oldtas", ["--steps", "40"])
    kueue_controller(kube, "v0.13.9")
    run = training_run(kube, spec, "oldtas", check_queue=False)

    with pytest.raises(KueueRelease, match="Kueue v0.13.9"):
        run.reconcile()
    assert jobs(api) == [] and run.observe().attempts == ()
