"""The Job controller: Indexed Jobs to completion and to BackoffLimitExceeded, suspension."""

from __future__ import annotations

import sys

from trainops_devcluster.runtime import LOCAL_IMAGE

from tests.devcluster.ctrl_support import NS, control_plane, job, node, pods_of


def test_indexed_job_runs_every_index_to_completion():
    script = "import os; print('rank', os.environ['JOB_COMPLETION_INDEX'])"
    container = {"image": LOCAL_IMAGE, "command": [sys.executable, "-c", script]}
    with control_plane(node("a"), node("b")) as plane:
        created = plane.store.create("jobs.batch", job("train", container=container))
        complete = plane.wait(lambda: plane.job_condition("train", "Complete"))
        assert complete["reason"] == "CompletionsReached"
        status = plane.store.get("jobs.batch", NS, "train")["status"]
        assert status["succeeded"] == 4 and status["failed"] == 0 and status["active"] == 0
        assert status["completedIndexes"] == "0-3" and status["completionTime"] and status["startTime"]
        pods = pods_of(plane, "train")
        by_index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods}
        assert sorted(by_index) == ["0", "1", "2", "3"]
        for index, p in by_index.items():
            assert p["metadata"]["name"].startswith(f"train-{index}-")
            assert p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == index
            assert p["metadata"]["labels"]["app"] == "train"
            assert p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == created["metadata"]["uid"]
            owner = p["metadata"]["ownerReferences"][0]
            assert (
                owner["kind"] == "Job" and owner["uid"] == created["metadata"]["uid"] and owner["controller"]
            )
            assert plane.logs.read(NS, p["metadata"]["name"]) == f"rank {index}\n"
        assert plane.events("Completed")


def test_parallelism_limits_running_pods():
    annotations = {"devcluster.trainops.io/run-seconds": "0.1"}
    with control_plane(node("a")) as plane:
        plane.store.create(
            "jobs.batch", job("train", completions=6, parallelism=2, pod_annotations=annotations)
        )
        seen_active = []
        plane.wait(
            lambda: (
                seen_active.append(
                    plane.store.get("jobs.batch", NS, "train").get("status", {}).get("active", 0)
                )
                or plane.job_condition("train", "Complete")
            )
        )
        assert max(seen_active) == 2
        assert plane.store.get("jobs.batch", NS, "train")["status"]["succeeded"] == 6


def test_failures_beyond_backoff_limit_fail_the_job():
    annotations = {"devcluster.trainops.io/run-seconds": "0.02", "devcluster.trainops.io/exit-code": "1"}
    with control_plane(node("a")) as plane:
        plane.store.create(
            "jobs.batch",
            job("train", completions=2, parallelism=1, backoffLimit=2, pod_annotations=annotations),
        )
        failed = plane.wait(lambda: plane.job_condition("train", "Failed"))
        assert failed["reason"] == "BackoffLimitExceeded"
        status = plane.store.get("jobs.batch", NS, "train")["status"]
        assert status["failed"] == 3 and status["active"] == 0 and "completionTime" not in status
        assert not plane.job_condition("train", "Complete")


def test_suspended_job_has_no_pods_and_resumes_with_the_current_template():
    with control_plane(node("a", labels={"pool": "gpu"}), node("b")) as plane:
        plane.store.create("jobs.batch", job("train", completions=2, parallelism=2, suspend=True))
        suspended = plane.wait(lambda: plane.job_condition("train", "Suspended"))
        assert suspended["reason"] == "JobSuspended"
        assert (
            pods_of(plane, "train") == []
            and "startTime" not in plane.store.get("jobs.batch", NS, "train")["status"]
        )

        def admit(obj: dict) -> None:  # what Kueue does at admission
            obj["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "gpu"}
            obj["spec"]["suspend"] = False

        plane.store.mutate("jobs.batch", NS, "train", admit)
        plane.wait(
            lambda: (
                len(pods_of(plane, "train")) == 2
                and all(p["spec"].get("nodeName") for p in pods_of(plane, "train"))
            )
        )
        assert {p["spec"]["nodeName"] for p in pods_of(plane, "train")} == {"a"}
        resumed = next(
            c
            for c in plane.store.get("jobs.batch", NS, "train")["status"]["conditions"]
            if c["type"] == "Suspended"
        )
        assert resumed["status"] == "False" and resumed["reason"] == "JobResumed"

        plane.store.mutate("jobs.batch", NS, "train", lambda obj: obj["spec"].update(suspend=True))
        plane.wait(lambda: pods_of(plane, "train") == [])
        status = plane.store.get("jobs.batch", NS, "train")["status"]
        assert status["active"] == 0 and status["failed"] == 0 and plane.job_condition("train", "Suspended")


def test_non_indexed_job_counts_completions():
    annotations = {"devcluster.trainops.io/run-seconds": "0.02"}
    with control_plane(node("a")) as plane:
        plane.store.create(
            "jobs.batch",
            job("work", completions=3, parallelism=3, indexed=False, pod_annotations=annotations),
        )
        plane.wait(lambda: plane.job_condition("work", "Complete"))
        status = plane.store.get("jobs.batch", NS, "work")["status"]
        assert status["succeeded"] == 3 and "completedIndexes" not in status
        assert all(p["metadata"]["name"].startswith("work-") for p in pods_of(plane, "work"))


def test_a_crashed_pod_is_replaced_and_counted():
    with control_plane(node("a")) as plane:
        plane.store.create("jobs.batch", job("train", completions=1, parallelism=1, backoffLimit=3))
        first = plane.wait(
            lambda: [p for p in pods_of(plane, "train") if p["status"].get("phase") == "Running"]
        )[0]
        result = plane.faults.crash_job(NS, "train")
        assert result == {"pods": [first["metadata"]["name"]]}
        plane.wait(lambda: [p for p in pods_of(plane, "train") if p["status"].get("phase") == "Running"])
        status = plane.store.get("jobs.batch", NS, "train")["status"]
        assert status["failed"] == 1 and status["active"] == 1
        replacement = next(p for p in pods_of(plane, "train") if p["status"]["phase"] == "Running")
        assert replacement["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0"
