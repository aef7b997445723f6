"""The simulated Kueue over the store: webhook, Workloads, admission, PodsReady, deactivation, preemption.

These tests play the Job controller and kubelet by hand (they write Job status), so each Kueue
transition is observed on its own.
"""

from __future__ import annotations

import copy
import hashlib
import time

import pytest
from trainops_devcluster.errors import Forbidden, Invalid
from trainops_devcluster.kueue import KueueConfig, KueueController, kueue_admission
from trainops_devcluster.patch import merge_patch
from trainops_devcluster.store import Store

from tests.devcluster.ctrl_support import wait_for

NS = "train"
CQ, LQ, FLAVOR = "cluster-queue", "team-queue", "gpu-shared"
JOBS, WORKLOADS = "jobs.batch", "workloads.kueue.x-k8s.io"
CQS, LQS = "clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def cond(obj: dict | None, kind: str) -> dict | None:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def has(obj: dict | None, kind: str, status: str, reason: str | None = None) -> bool:
    c = cond(obj, kind)
    return c is not None and c["status"] == status and (reason is None or c["reason"] == reason)


class Cluster:
    """A store with Kueue's objects and a running KueueController."""

    def __init__(self, gpus: int, config: KueueConfig, preemption: str = "LowerPriority") -> None:
        self.store = Store()
        create = self.store.create
        create("namespaces", {"metadata": {"name": NS}})
        create(
            "resourceflavors.kueue.x-k8s.io",
            {
                "metadata": {"name": FLAVOR},
                "spec": {"nodeLabels": {"gpu-pool": "shared"}, "tolerations": [TOLERATION]},
            },
        )
        quotas = {"cpu": "1000", "memory": "4Ti", "nvidia.com/gpu": str(gpus)}
        cq = {
            "metadata": {"name": CQ},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": preemption},
                "resourceGroups": [
                    {
                        "coveredResources": list(quotas),
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [{"name": k, "nominalQuota": v} for k, v in quotas.items()],
                            }
                        ],
                    }
                ],
            },
        }
        create(CQS, kueue_admission(CQS, "CREATE", cq, None))
        create(LQS, {"metadata": {"name": LQ, "namespace": NS}, "spec": {"clusterQueue": CQ}})
        for name, value in (("low", 100), ("high", 1000)):
            create("workloadpriorityclasses.kueue.x-k8s.io", {"metadata": {"name": name}, "value": value})
        self.controller = KueueController(self.store, config)
        self.controller.start()

    def submit(
        self,
        name: str,
        pods: int = 1,
        gpus: int = 1,
        queue: str = LQ,
        priority: str | None = None,
        devices: dict | None = None,
    ) -> dict:
        labels = {"kueue.x-k8s.io/queue-name": queue} | (
            {"kueue.x-k8s.io/priority-class": priority} if priority else {}
        )
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"zone": "a"},
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "trainer:1",
                                "resources": {
                                    "requests": {"cpu": "2", "memory": "8Gi"},
                                    "limits": {"nvidia.com/gpu": str(gpus), **(devices or {})},
                                },
                            }
                        ],
                    },
                },
            },
        }
        return self.store.create(JOBS, kueue_admission(JOBS, "CREATE", job, None))

    def job(self, name: str) -> dict:
        return self.store.get(JOBS, NS, name)

    def workload(self, job_name: str) -> dict | None:
        uid = self.job(job_name)["metadata"]["uid"]
        found = [
            w
            for w in self.store.list(WORKLOADS, NS)[0]
            if w["metadata"]["labels"].get("kueue.x-k8s.io/job-uid") == uid
        ]
        return copy.deepcopy(found[0]) if found else None

    def job_status(self, name: str, **status) -> None:
        """Play the Job controller: write status counters/conditions."""
        self.store.mutate(JOBS, NS, name, lambda j: j.setdefault("status", {}).update(status))

    def admitted(self, name: str) -> dict:
        return wait_for(
            lambda: has(self.workload(name), "Admitted", "True") and self.workload(name), f"{name} admitted"
        )

    def running(self, name: str) -> dict:
        return wait_for(
            lambda: self.job(name)["spec"]["suspend"] is False and self.job(name), f"{name} unsuspended"
        )

    def stopped(self, name: str) -> dict:
        job = wait_for(
            lambda: self.job(name)["spec"]["suspend"] is True and self.job(name), f"{name} suspended"
        )
        self.job_status(name, active=0, ready=0)  # the Job controller deleted the pods
        return job

    def cq_status(self) -> dict:
        return self.store.get(CQS, "", CQ).get("status", {})

    def patch_cq(self, patch: dict) -> None:
        cq = merge_patch(self.store.get(CQS, "", CQ), patch)
        self.store.update(CQS, kueue_admission(CQS, "UPDATE", cq, None))

    def events(self, reason: str) -> list[dict]:
        return [e for e in self.store.list("events")[0] if e["reason"] == reason]


@pytest.fixture
def make_cluster():
    made = []

    def make(gpus: int = 8, **config) -> Cluster:
        preemption = config.pop("preemption", "LowerPriority")
        cluster = Cluster(gpus, KueueConfig(**({"wait_for_pods_ready_timeout_s": None} | config)), preemption)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.controller.stop()


def gpu_quota(cluster: Cluster, flavor_table: str) -> str:
    rows = cluster.cq_status()[flavor_table][0]["resources"]
    return next(r["total"] for r in rows if r["name"] == "nvidia.com/gpu")


# ---- webhook ---------------------------------------------------------------------------------
def test_webhook_suspends_queued_jobs_at_creation_and_refuses_bad_queue_names():
    job = {
        "metadata": {"name": "j", "labels": {"kueue.x-k8s.io/queue-name": "team-queue"}},
        "spec": {"suspend": False},
    }
    assert kueue_admission(JOBS, "CREATE", job, None)["spec"]["suspend"] is True
    assert job["spec"]["suspend"] is False  # the caller's object is left alone
    plain = {"metadata": {"name": "p"}, "spec": {}}
    assert "suspend" not in kueue_admission(JOBS, "CREATE", plain, None)["spec"]

    bad = copy.deepcopy(job)
    bad["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "Team_Queue"
    with pytest.raises(
        Forbidden, match=r"metadata.labels\[kueue.x-k8s.io/queue-name\]: Invalid value: \"Team_Queue\""
    ):
        kueue_admission(JOBS, "CREATE", bad, None)

    running = copy.deepcopy(job)
    moved = copy.deepcopy(job)
    moved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "other"
    with pytest.raises(Forbidden, match="immutable"):
        kueue_admission(JOBS, "UPDATE", moved, running)
    running["spec"]["suspend"] = True
    assert kueue_admission(JOBS, "UPDATE", moved, running) is moved  # allowed while suspended


RESOURCE_0 = r"resourceGroups\[0\]\.flavors\[0\]\.resources\[0\]"


@pytest.mark.parametrize(
    ("covered", "resources", "field", "message"),
    [
        (["cpu"], [("cpu", "lots")], rf"{RESOURCE_0}\.nominalQuota", "must be a quantity"),
        # Kueue's CRD rule: a flavor lists every covered resource ...
        (["cpu", "rdma/ib"], [("cpu", "1")], r"resourceGroups\[0\]", "flavors must have the same number"),
        # ... and its webhook: in coveredResources' order
        (["cpu", "rdma/ib"], [("rdma/ib", "1"), ("cpu", "1")], rf"{RESOURCE_0}\.name", "must match the name"),
    ],
)
def test_webhook_refuses_a_cluster_queue_kueue_refuses(covered, resources, field, message):
    flavor = {"name": "f", "resources": [{"name": n, "nominalQuota": q} for n, q in resources]}
    cq = {
        "metadata": {"name": "cq"},
        "spec": {"resourceGroups": [{"coveredResources": covered, "flavors": [flavor]}]},
    }
    with pytest.raises(Invalid, match=rf"spec\.{field}: Invalid value: .*{message}"):
        kueue_admission(CQS, "CREATE", cq, None)


# ---- Workload ----------------------------------------------------------------------------------
def test_workload_is_created_for_a_queued_job_with_owner_labels_podsets_and_priority(make_cluster):
    cluster = make_cluster(gpus=0)
    job = cluster.submit("run42", pods=4, priority="high")
    assert job["spec"]["suspend"] is True
    workload = wait_for(lambda: cluster.workload("run42"), "the Workload")

    digest = hashlib.sha1(f"Job\nbatch\nrun42\n{job['metadata']['uid']}".encode()).hexdigest()[:5]
    assert workload["metadata"]["name"] == f"job-run42-{digest}"
    assert workload["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "run42",
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = workload["spec"]
    assert spec["queueName"] == LQ and spec["active"] is True
    assert spec["priority"] == 1000
    assert spec["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("main", 4)]
    assert spec["podSets"][0]["template"] == job["spec"]["template"]
    assert cluster.events("CreatedWorkload")[0]["involvedObject"]["name"] == "run42"


def test_missing_priority_class_means_no_workload_and_a_warning_event(make_cluster):
    old = make_cluster(version="v1beta1")  # Kueue 0.13 says so only in its own log
    old.submit("orphan", priority="urgent")
    time.sleep(0.2)
    assert old.workload("orphan") is None and old.events("WorkloadPriorityClassNotFound") == []
    cluster = make_cluster()
    cluster.submit("orphan", priority="urgent")
    event = wait_for(lambda: cluster.events("WorkloadPriorityClassNotFound"), "the Warning Event")[0]
    assert event["type"] == "Warning" and event["message"] == 'WorkloadPriorityClass "urgent" not found'
    assert event["involvedObject"]["kind"] == "Job" and event["involvedObject"]["name"] == "orphan"
    assert cluster.workload("orphan") is None
    cluster.store.create(
        "workloadpriorityclasses.kueue.x-k8s.io", {"metadata": {"name": "urgent"}, "value": 5}
    )
    assert (
        wait_for(lambda: cluster.workload("orphan"), "the Workload once the class exists")["spec"]["priority"]
        == 5
    )


def test_a_missing_local_queue_leaves_the_workload_inadmissible(make_cluster):
    cluster = make_cluster()
    cluster.submit("lost", queue="no-such-queue")
    workload = wait_for(
        lambda: (
            has(cluster.workload("lost"), "QuotaReserved", "False", "Inadmissible")
            and cluster.workload("lost")
        ),
        "Inadmissible",
    )
    assert cond(workload, "QuotaReserved")["message"] == "LocalQueue no-such-queue doesn't exist"
    assert cluster.job("lost")["spec"]["suspend"] is True


# ---- admission ---------------------------------------------------------------------------------
def test_admission_reserves_quota_and_starts_the_job_with_the_flavor_injected(make_cluster):
    cluster = make_cluster(gpus=8)
    cluster.submit("run", pods=2, gpus=4)
    workload = cluster.admitted("run")
    quota = cond(workload, "QuotaReserved")
    assert (quota["status"], quota["reason"], quota["message"]) == (
        "True",
        "QuotaReserved",
        f"Quota reserved in ClusterQueue {CQ}",
    )
    assert set(quota) == {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
    assert cond(workload, "Admitted")["reason"] == "Admitted"
    assert workload["status"]["admission"] == {
        "clusterQueue": CQ,
        "podSetAssignments": [
            {
                "name": "main",
                "flavors": {"cpu": FLAVOR, "memory": FLAVOR, "nvidia.com/gpu": FLAVOR},
                "resourceUsage": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"},
                "count": 2,
            }
        ],
    }
    job = cluster.running("run")
    template = job["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"zone": "a", "gpu-pool": "shared"}
    assert template["spec"]["tolerations"] == [TOLERATION]
    assert template["metadata"]["labels"] == {
        "app": "run",
        "kueue.x-k8s.io/podset": "main",
        "kueue.x-k8s.io/local-queue-name": LQ,
        "kueue.x-k8s.io/cluster-queue-name": CQ,
    }
    assert template["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": workload["metadata"]["name"]}
    status = wait_for(
        lambda: cluster.cq_status().get("admittedWorkloads") == 1 and cluster.cq_status(), "CQ status"
    )
    assert status["reservingWorkloads"] == 1 and status["pendingWorkloads"] == 0
    assert gpu_quota(cluster, "flavorsReservation") == "8" and gpu_quota(cluster, "flavorsUsage") == "8"
    lq = cluster.store.get(LQS, NS, LQ)["status"]
    assert lq["admittedWorkloads"] == 1 and has({"status": lq}, "Active", "True", "Ready")


def test_no_admission_without_quota_until_a_merge_patch_raises_it(make_cluster):
    cluster = make_cluster(gpus=0)
    cluster.submit("run", pods=2, gpus=8)
    pending = wait_for(
        lambda: has(cluster.workload("run"), "QuotaReserved", "False") and cluster.workload("run"), "pending"
    )
    assert cond(pending, "QuotaReserved")["reason"] == "ExceedsMaxQuota"
    assert cluster.job("run")["spec"]["suspend"] is True
    wait_for(lambda: cluster.cq_status().get("pendingWorkloads") == 1, "pendingWorkloads")

    cluster.patch_cq(
        {
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1000"},
                                    {"name": "memory", "nominalQuota": "4Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                                ],
                            }
                        ],
                    }
                ]
            }
        }
    )
    cluster.admitted("run")
    cluster.running("run")


def test_a_gang_larger_than_free_quota_waits_whole(make_cluster):
    cluster = make_cluster(gpus=16)
    cluster.submit("first", pods=1, gpus=8)
    cluster.running("first")
    cluster.submit("gang", pods=2, gpus=8)  # 16 GPUs, only 8 free: none of it may start
    workload = wait_for(
        lambda: has(cluster.workload("gang"), "QuotaReserved", "False") and cluster.workload("gang"),
        "gang pending",
    )
    assert cond(workload, "QuotaReserved")["reason"] == "WaitingForQuota"
    assert "8 more needed" in cond(workload, "QuotaReserved")["message"]
    assert "admission" not in workload["status"] and cluster.job("gang")["spec"]["suspend"] is True
    assert gpu_quota(cluster, "flavorsReservation") == "8"

    cluster.job_status(
        "first",
        conditions=[
            {"type": "Complete", "status": "True", "message": "Reached expected number of succeeded pods"}
        ],
    )
    cluster.admitted("gang")
    assert cluster.running("gang")["spec"]["parallelism"] == 2


def test_finished_when_the_job_completes_or_fails_and_quota_is_released(make_cluster):
    cluster = make_cluster(gpus=8)
    cluster.submit("good", gpus=4)
    cluster.submit("bad", gpus=4)
    cluster.running("good")
    cluster.running("bad")
    cluster.job_status(
        "good",
        succeeded=1,
        conditions=[
            {"type": "Complete", "status": "True", "message": "Reached expected number of succeeded pods"}
        ],
    )
    cluster.job_status(
        "bad",
        failed=1,
        conditions=[
            {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
            }
        ],
    )
    good = wait_for(
        lambda: has(cluster.workload("good"), "Finished", "True") and cluster.workload("good"),
        "good finished",
    )
    bad = wait_for(
        lambda: has(cluster.workload("bad"), "Finished", "True") and cluster.workload("bad"), "bad finished"
    )
    assert cond(good, "Finished")["reason"] == "Succeeded"
    assert (cond(bad, "Finished")["reason"], cond(bad, "Finished")["message"]) == (
        "Failed",
        "Job has reached the specified backoff limit",
    )
    wait_for(lambda: gpu_quota(cluster, "flavorsReservation") == "0", "quota released")
    assert cluster.cq_status()["reservingWorkloads"] == 0


# ---- PodsReady ---------------------------------------------------------------------------------
def test_pods_ready_marks_the_workload_started(make_cluster):
    cluster = make_cluster(wait_for_pods_ready_timeout_s=30)
    cluster.submit("run", pods=2)
    cluster.running("run")
    assert has(cluster.workload("run"), "PodsReady", "False", "WaitForStart")
    cluster.job_status("run", active=2, ready=1)
    time.sleep(0.1)
    assert has(cluster.workload("run"), "PodsReady", "False", "WaitForStart")
    cluster.job_status("run", ready=2)
    wait_for(lambda: has(cluster.workload("run"), "PodsReady", "True", "Started"), "PodsReady=True Started")


def test_pods_ready_timeout_evicts_requeues_with_backoff_then_deactivates(make_cluster):
    cluster = make_cluster(
        wait_for_pods_ready_timeout_s=0.3, requeue_backoff_base_s=0.5, backoff_limit_count=1
    )
    cluster.submit("stuck", pods=2)
    started = cluster.running("stuck")
    assert started["spec"]["template"]["spec"]["tolerations"] == [TOLERATION]
    cluster.job_status("stuck", active=2, ready=1)  # one pod never becomes ready

    evicted = wait_for(
        lambda: has(cluster.workload("stuck"), "Evicted", "True") and cluster.workload("stuck"), "eviction"
    )
    name = evicted["metadata"]["name"]
    assert cond(evicted, "Evicted")["reason"] == "PodsReadyTimeout"
    assert cond(evicted, "Evicted")["message"] == f"Exceeded the PodsReady timeout {NS}/{name}"
    assert evicted["status"]["requeueState"]["count"] == 1 and evicted["status"]["requeueState"]["requeueAt"]
    job = cluster.stopped("stuck")
    assert "tolerations" not in job["spec"]["template"]["spec"]  # Kueue's injections are restored
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"zone": "a"}
    assert job["spec"]["template"]["metadata"] == {"labels": {"app": "stuck"}}

    released = wait_for(
        lambda: has(cluster.workload("stuck"), "QuotaReserved", "False") and cluster.workload("stuck"),
        "release",
    )
    assert has(released, "Requeued", "False", "PodsReadyTimeout") and has(
        released, "Admitted", "False", "NoReservation"
    )
    assert "admission" not in released["status"]
    # after the backoff it is requeued and admitted again
    wait_for(
        lambda: has(cluster.workload("stuck"), "Requeued", "True", "BackoffFinished"), "backoff finished"
    )
    again = cluster.admitted("stuck")
    assert has(again, "Evicted", "False", "QuotaReserved")
    cluster.running("stuck")
    # the second timeout exceeds backoffLimitCount=1: deactivated, not requeued
    cluster.job_status("stuck", active=2, ready=0)
    gone = wait_for(
        lambda: (
            cluster.workload("stuck")["spec"]["active"] is False
            and has(cluster.workload("stuck"), "Evicted", "True")
            and cluster.workload("stuck")
        ),
        "deactivation",
    )
    assert cond(gone, "Evicted")["reason"] == "DeactivatedDueToRequeuingLimitExceeded"
    cluster.stopped("stuck")
    wait_for(
        lambda: has(cluster.workload("stuck"), "Requeued", "False", "DeactivatedDueToRequeuingLimitExceeded"),
        "released",
    )
    time.sleep(0.3)
    assert (
        not has(cluster.workload("stuck"), "QuotaReserved", "True")
        and cluster.job("stuck")["spec"]["suspend"] is True
    )


# ---- deactivation and preemption ---------------------------------------------------------------
def test_deactivation_evicts_without_requeue_and_reactivation_requeues(make_cluster):
    cluster = make_cluster()
    cluster.submit("run", pods=2)
    workload = cluster.admitted("run")
    cluster.running("run")
    cluster.job_status("run", active=2, ready=2)
    cluster.store.mutate(
        WORKLOADS, NS, workload["metadata"]["name"], lambda w: w["spec"].update(active=False)
    )
    evicted = wait_for(
        lambda: has(cluster.workload("run"), "Evicted", "True", "Deactivated") and cluster.workload("run"),
        "Deactivated",
    )
    assert cond(evicted, "Evicted")["message"] == "The workload is deactivated"
    cluster.stopped("run")
    released = wait_for(
        lambda: has(cluster.workload("run"), "QuotaReserved", "False") and cluster.workload("run"),
        "quota released",
    )
    assert has(released, "Requeued", "False", "Deactivated")
    time.sleep(0.3)
    assert cluster.job("run")["spec"]["suspend"] is True and not has(
        cluster.workload("run"), "QuotaReserved", "True"
    )

    cluster.store.mutate(WORKLOADS, NS, workload["metadata"]["name"], lambda w: w["spec"].update(active=True))
    wait_for(lambda: has(cluster.workload("run"), "Requeued", "True", "Reactivated"), "Reactivated")
    cluster.admitted("run")
    cluster.running("run")


def test_higher_priority_preempts_lower_and_the_preempted_run_is_requeued(make_cluster):
    cluster = make_cluster(gpus=8)
    cluster.submit("low", pods=1, gpus=8, priority="low")
    cluster.running("low")
    cluster.job_status("low", active=1, ready=1)
    cluster.submit("high", pods=1, gpus=8, priority="high")

    victim = wait_for(
        lambda: has(cluster.workload("low"), "Evicted", "True", "Preempted") and cluster.workload("low"),
        "preemption",
    )
    high_uid = cluster.workload("high")["metadata"]["uid"]
    assert has(victim, "Preempted", "True", "InClusterQueue")
    assert cond(victim, "Preempted")["message"] == (
        f"Preempted to accommodate a workload (UID: {high_uid}, JobUID: {cluster.job('high')['metadata']['uid']}) "
        f"due to prioritization in the ClusterQueue; preemptor path: /{CQ}; preemptee path: /{CQ}"
    )
    wait_for(  # written just after the victim's eviction
        lambda: has(cluster.workload("high"), "QuotaReserved", "False", "WaitingForPreemptedWorkloads"),
        "the preemptor waiting",
    )

    cluster.stopped("low")  # its pods are gone: the quota moves to the preemptor
    cluster.admitted("high")
    cluster.running("high")
    requeued = wait_for(
        lambda: has(cluster.workload("low"), "Requeued", "True", "Preempted") and cluster.workload("low"),
        "requeued",
    )
    assert has(requeued, "QuotaReserved", "False")

    cluster.job_status("high", conditions=[{"type": "Complete", "status": "True"}])
    readmitted = cluster.admitted("low")
    assert has(readmitted, "Evicted", "False") and has(readmitted, "Preempted", "False")
    cluster.running("low")


def test_no_preemption_when_the_cluster_queue_says_never(make_cluster):
    cluster = make_cluster(gpus=8, preemption="Never")
    cluster.submit("low", gpus=8, priority="low")
    cluster.running("low")
    cluster.submit("high", gpus=8, priority="high")
    wait_for(lambda: has(cluster.workload("high"), "QuotaReserved", "False", "WaitingForQuota"), "high waits")
    assert not has(cluster.workload("low"), "Evicted", "True")


def test_deleting_the_job_removes_its_workload(make_cluster):
    cluster = make_cluster()
    cluster.submit("run")
    name = wait_for(lambda: cluster.workload("run"), "Workload")["metadata"]["name"]
    cluster.store.delete(JOBS, NS, "run")
    wait_for(lambda: cluster.store.find(WORKLOADS, NS, name) is None, "Workload removed")


# ---- the release played: v1beta1 is Kueue 0.13, v1beta2 is 0.15 and later ----------------------------
def test_kueue_0_13_names_the_priority_class_its_way_and_says_only_pending_or_inadmissible(make_cluster):
    cluster = make_cluster(gpus=8, version="v1beta1")
    cluster.submit("big", gpus=16, priority="low")  # never fits: 0.15+ says ExceedsMaxQuota
    cluster.submit("lost", queue="no-such-queue")
    cluster.submit("rdma", gpus=16, devices={"rdma/ib": "1"})  # uncovered: said first, as 0.13 does
    big = wait_for(
        lambda: has(cluster.workload("big"), "QuotaReserved", "False") and cluster.workload("big"), "big"
    )
    assert big["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert (big["spec"]["priorityClassName"], big["spec"]["priorityClassSource"]) == (
        "low",
        "kueue.x-k8s.io/workloadpriorityclass",
    )
    assert "priorityClassRef" not in big["spec"]
    assert (cond(big, "QuotaReserved")["reason"], cond(big, "QuotaReserved")["message"]) == (
        "Pending",
        "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor gpu-shared, "
        "previously considered podsets requests (0) + current podset request (16) > maximum capacity (8)",
    )
    wait_for(lambda: has(cluster.workload("lost"), "QuotaReserved", "False", "Inadmissible"), "Inadmissible")
    rdma = wait_for(
        lambda: (
            has(cluster.workload("rdma"), "QuotaReserved", "False", "Pending") and cluster.workload("rdma")
        ),
        "rdma",
    )
    assert cond(rdma, "QuotaReserved")["message"] == (
        "couldn't assign flavors to pod set main: resource rdma/ib unavailable in ClusterQueue"
    )

    cluster.submit("low", gpus=8, priority="low")
    template = cluster.running("low")["spec"]["template"]["metadata"]
    # 0.13: no queue-name labels (0.17+) and the workload annotation only with TAS on
    assert template["labels"] == {"app": "low", "kueue.x-k8s.io/podset": "main"} and not template.get(
        "annotations"
    )
    lq = wait_for(
        lambda: (
            cluster.store.get(LQS, NS, LQ)["status"].get("admittedWorkloads") == 1
            and cluster.store.get(LQS, NS, LQ)["status"]
        ),
        "LQ status",
    )
    assert "flavorUsage" in lq and "flavorsUsage" not in lq  # v1beta2 renamed it
    cluster.submit("high", gpus=8, priority="high")
    waiting = wait_for(
        lambda: has(cluster.workload("high"), "QuotaReserved", "False") and cluster.workload("high"),
        "preemptor",
    )
    assert (cond(waiting, "QuotaReserved")["reason"], cond(waiting, "QuotaReserved")["message"]) == (
        "Pending",
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
        "gpu-shared, 8 more needed. Pending the preemption of 1 workload(s)",
    )
    assert has(cluster.workload("low"), "Evicted", "True", "Preempted")
    assert cond(cluster.workload("low"), "Preempted")["message"].endswith(
        "due to prioritization in the ClusterQueue"
    )


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_without_wait_for_pods_ready_no_workload_has_a_pods_ready_condition(make_cluster, version):
    cluster = make_cluster(version=version)  # make_cluster's default: waitForPodsReady off
    cluster.submit("run", pods=2)
    cluster.running("run")
    cluster.job_status("run", active=2, ready=2)
    time.sleep(0.2)
    cluster.store.mutate(
        WORKLOADS, NS, cluster.workload("run")["metadata"]["name"], lambda w: w["spec"].update(active=False)
    )
    cluster.stopped("run")
    wait_for(lambda: has(cluster.workload("run"), "Requeued", "False", "Deactivated"), "released")
    assert cond(cluster.workload("run"), "PodsReady") is None
