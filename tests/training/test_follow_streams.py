"""The follower judges a failure on the Job and its pods as they are, not as the watches last
delivered them: the Job, its pods and its Workload come on separate streams, and one can lag
another (seen under the real triggerer as attempts ending "failed with no failed container" with no
pods, or a completed run's Workload ``Finished`` taken for a failure)."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio.client import ApiClient

from trainops.kube.client import Kind
from trainops.training import follow
from trainops.training.failures import FailureKind, classify
from trainops.training.follow import FollowConfig, RunFollower, Status
from trainops.training.job import CONTAINER_NAME

CONFIG = FollowConfig("training", "job-1", "s3://b/runs/r/", nodes=1)
JOB_META = {"name": "job-1", "namespace": "training", "uid": "u-1"}
HEALTHY = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def job(*conditions: str) -> dict:
    return {
        "metadata": JOB_META,
        "spec": {"suspend": False},
        "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]},
    }


def pod(phase: str, exit_code: int | None = None) -> dict:
    status: dict = {"phase": phase}
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        status["containerStatuses"] = [{"name": CONTAINER_NAME, "state": {"terminated": terminated}}]
    return {"metadata": {"name": "job-1-0"}, "spec": {"nodeName": "n1"}, "status": status}


class Cluster:
    """The API server's current objects; ``jobs``: what successive Job reads return."""

    def __init__(self, jobs: list[dict], pods: list[dict]) -> None:
        self.jobs, self.pods = jobs, pods

    def read_job(self, namespace: str, name: str) -> dict:
        return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]

    def job_pods(self, namespace: str, name: str) -> list[dict]:
        return self.pods

    def workload_kind(self) -> Kind:
        return Kind("kueue.x-k8s.io", "v1beta2", "workloads")


class NoHeartbeat:
    def read(self, bucket: str, key: str, *, limit: int) -> None:
        return None

    def list_dir(self, uri) -> tuple[list, list]:
        return [], []


def streams(delivered: dict[str, list[tuple[str, dict]]]):
    """A ``watch`` whose streams deliver ``delivered[kind]`` and then nothing more (they lag)."""

    async def watch(resource):
        for item in delivered.get(resource.kind, []):
            yield item
        await asyncio.Event().wait()

    return watch


def follow_with(monkeypatch, cluster: Cluster, delivered: dict) -> follow.Outcome:
    monkeypatch.setattr(follow, "watch", streams(delivered))
    return asyncio.run(RunFollower(CONFIG, cluster, ApiClient, NoHeartbeat()).follow())


def test_a_workload_finished_before_its_job_is_seen_complete_is_a_success(monkeypatch):
    workload = {
        "metadata": {"name": "job-job-1-u1"},
        "spec": {"active": True},
        "status": {
            "conditions": [
                {"type": "Admitted", "status": "True", "lastTransitionTime": "t1"},
                {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "done"},
            ]
        },
    }
    # the Job was running when the follow began; it completed, and Kueue finished its Workload,
    # whose stream delivered first
    cluster = Cluster([job(), job("Complete")], [pod("Succeeded", 0)])

    outcome = follow_with(monkeypatch, cluster, {"workload": [("ADDED", workload)]})

    assert outcome.status is Status.SUCCEEDED, outcome.message


def test_a_job_failed_before_its_pods_were_listed_is_judged_on_its_failed_pod(monkeypatch):
    # the follow began after the attempt failed: the Job reads Failed before the pod stream delivered
    cluster = Cluster([job("Failed")], [pod("Failed", 3)])

    outcome = follow_with(monkeypatch, cluster, {})

    assert outcome.status is Status.FAILED
    failure = classify(outcome.pods, {"n1": HEALTHY}, container=CONTAINER_NAME)
    assert failure.kind is FailureKind.USER_CODE
    assert failure.reason.startswith("pod job-1-0 on n1 exited with code 3")
