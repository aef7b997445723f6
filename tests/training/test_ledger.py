"""The ledger is the run's Jobs: what a Job is created with and the end written on it when judged read
back as the same attempt; gaps (Jobs gone) and hostile annotations are reported, never fatal."""

from __future__ import annotations

import json

import pytest

from trainops.training.job import build_job
from trainops.training.ledger import (
    END_ANNOTATION,
    MAX_END,
    End,
    Spent,
    State,
    Verdict,
    begun_annotation,
    end_annotation,
    read_attempt,
    read_ledger,
)
from trainops.training.spec import TrainingSpec

SPEC = TrainingSpec(image="img", command=["train"], run_uri="s3://b/runs/r/", nodes=2)


def job(
    number: int, *, resume_from=None, kept_out=None, end: End | None = None, uid: str = "", **status
) -> dict:
    made = build_job(
        SPEC,
        name=f"train-r-a{number}",
        dag_id="dag",
        run_id="r",
        attempt=number,
        resume_from=resume_from,
        excluded_nodes=kept_out,
        annotations=begun_annotation(3, 1_700_000_000.25, Spent(2, number - 1, 0)),
    )
    made["metadata"].update(uid=uid or f"uid-{number}", creationTimestamp="2026-12-01T10:00:00Z")
    if end is not None:
        made["metadata"]["annotations"].update(end_annotation(end))
    made["status"] = status
    return made


def workload(uid: str, *, active: bool = True, evicted: str | None = None) -> dict:
    conditions = [{"type": "Evicted", "status": "True", "reason": evicted, "message": "m"}] if evicted else []
    return {
        "metadata": {"name": f"job-{uid}", "labels": {"kueue.x-k8s.io/job-uid": uid}},
        "spec": {"active": active},
        "status": {"conditions": conditions},
    }


def failed(at: str = "2026-12-01T10:05:00Z") -> dict:
    return {"conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": at}]}


def test_what_a_job_is_created_with_and_the_end_written_on_it_read_back_as_the_attempt():
    end = End(
        "infrastructure",
        Verdict.RESUME,
        "node fault: gpu-node-3: GPUHealthy=False",
        {"gpu-node-3": "GPUHealthy=False: xid_events=[79]"},
        ("pod p-0 printed 'XID 79'",),
        1_700_000_100.5,
        2,
        "try 3",
    )
    made = job(2, resume_from="s3://b/runs/r/step-40/", kept_out={"gpu-node-1": "ECC"}, end=end, **failed())

    attempt = read_attempt(made)

    assert (attempt.number, attempt.job, attempt.state) == (2, "train-r-a2", State.FAILED)
    assert (attempt.began_by_try, attempt.began_at, attempt.spent) == (3, 1_700_000_000.25, Spent(2, 1, 0))
    assert (attempt.resume_from, attempt.resume_step) == ("s3://b/runs/r/step-40/", 40)
    assert attempt.kept_out == {"gpu-node-1": "ECC"}
    assert attempt.end == end and attempt.problems == ()
    assert attempt.finished_at - attempt.created_at == 300.0  # the Job's own times (whole seconds)
    assert attempt.nodes == 2 and attempt.to_dict()["nodes"] == 2  # the gang's size, as the run view shows it


def test_an_elastic_resumes_smaller_gang_is_its_attempts_world_size():
    smaller = build_job(
        SPEC, name="train-r-a2", dag_id="dag", run_id="r", attempt=2, resume_from=None, nodes=1
    )
    assert read_attempt(smaller).nodes == 1
    smaller["spec"]["completions"] = "many"  # not what trainops writes: unknown, not a crash
    assert read_attempt(smaller).nodes is None


@pytest.mark.parametrize(
    "workload_state, state, by",
    [
        ({}, State.RUNNING, None),
        ({"active": False, "evicted": "Deactivated"}, State.STOPPED, "user"),
        ({"active": False, "evicted": "DeactivatedDueToRequeuingLimitExceeded"}, State.STOPPED, "kueue"),
        ({"evicted": "Preempted"}, State.RUNNING, None),  # requeued by Kueue: not an end
    ],
)
def test_a_running_jobs_workload_says_whether_and_by_whom_it_was_stopped(workload_state, state, by):
    attempt = read_attempt(job(1), workload("uid-1", **workload_state))
    assert (attempt.state, attempt.stopped_by) == (state, by)


def test_jobs_gone_leave_gaps_the_next_job_still_accounts_for():
    spent = Spent(2, 2, 0)
    ledger = read_ledger(
        [job(3, kept_out={"gpu-node-3": "XID 79"}), job(1, **failed())],
        [workload("uid-3")],
        job_name=lambda n: f"train-r-a{n}",
    )

    assert [(a.number, a.state) for a in ledger.attempts] == [
        (1, State.FAILED),
        (2, State.GONE),
        (3, State.RUNNING),
    ]
    assert ledger.attempts[1].job == "train-r-a2" and ledger.attempts[1].end is None
    assert ledger.newest.spent == spent and ledger.excluded == {"gpu-node-3": "XID 79"}


@pytest.mark.parametrize(
    "annotation, problem",
    [
        ("x" * (MAX_END + 1), f"over the {MAX_END}-character limit"),
        ("{not json", "is not JSON"),
        (json.dumps({"verdict": "explode"}), "verdict must be one of"),
        (json.dumps({"verdict": "fail", "hints": "a string"}), "hints must be a list"),
        (json.dumps({"verdict": "fail", "culprits": ["n1"]}), "culprits must map"),
        (json.dumps({"verdict": "fail", "at": "yesterday"}), "at must be Unix seconds"),
    ],
)
def test_a_hostile_end_is_reported_on_its_attempt_and_judged_again(annotation, problem):
    made = job(1, **failed())
    made["metadata"]["annotations"][END_ANNOTATION] = annotation

    attempt = read_attempt(made)

    assert attempt.end is None and attempt.state is State.FAILED  # decide judges it again
    assert len(attempt.problems) == 1 and problem in attempt.problems[0], attempt.problems
    assert attempt.problems[0].endswith("the end is judged again")


def test_what_trainops_writes_always_reads_back_however_long_the_evidence():
    end = End(
        "infrastructure",
        Verdict.RESUME,
        "r" * 50_000,
        {f"gpu-node-{i:04d}": "e" * 5_000 for i in range(500)},
        ("h" * 5_000,) * 500,
    )
    kept_out = {f"gpu-node-{i:04d}": "x" * 5_000 for i in range(5_000)}  # reasons dropped to fit

    attempt = read_attempt(job(1, end=end, kept_out=kept_out))

    assert attempt.problems == ()
    assert (
        len(attempt.end.culprits) == 64 and len(attempt.end.hints) == 16 and len(attempt.end.reason) == 1000
    )
    assert len(attempt.kept_out) == 5_000
