"""A try of ``train`` that finds its attempt stopped (a Clear's or a mark-failed's ``on_kill`` deactivated
the Workload) starts a new attempt from the last verified checkpoint; it does not reattach to the
stopped Job, whose follow would end at once as "deactivated" and fail the run the Clear was to resume.
Found by the fault campaign (issue 15): a Clear failed its run whenever the next try came before the
stopped Job happened to be marked Failed."""

from __future__ import annotations

import pytest

from tests.devcluster.ctrl_support import wait_for
from tests.training.conftest import claimed_run
from trainops.capacity.procedure import give_back
from trainops.checkpoints.store import CheckpointStore
from trainops.training.attempts import RunLedger
from trainops.training.cluster import GangCluster
from trainops.training.failures import FailureKind
from trainops.training.job import finished
from trainops.training.runner import GangRun

ARGS = ["--steps", "400", "--checkpoint-every", "20", "--step-seconds", "0.02"]


def tries(kube, spec, run_id: str, state: dict):
    """``a_try(try_number, **budget)``: the run's ``GangRun`` for one try, which reads the ledger the
    previous try saved in ``state`` (as Airflow's task state store) and saves its own there."""

    def a_try(try_number: int = 1, **budget) -> GangRun:
        ledger = RunLedger.from_dict(state.get("ledger"))
        return GangRun(
            spec,
            "dag",
            run_id,
            GangCluster(kube),
            CheckpointStore(),
            ledger,
            lambda d: state.update(ledger=d),
            try_number=try_number,
            **budget,
        )

    return a_try


def test_a_try_after_the_attempt_was_stopped_submits_a_new_attempt(cluster, api, s3, bucket):
    kube, spec = claimed_run(cluster, api, bucket, "clear", ARGS)
    state: dict = {}
    a_try = tries(kube, spec, "clear", state)

    first, _ = a_try().start()
    wait_for(lambda: GangCluster(kube).job_pods("training", first.job), "the attempt's pods")
    GangCluster(kube).stop("training", first.job)  # the Clear's on_kill

    second, reattached = a_try(2, first_try=2).start()  # the Clear's try

    assert not reattached and second.number == 2 and second.job != first.job
    ended = RunLedger.from_dict(state["ledger"]).attempts[0]
    assert ended.kind == FailureKind.STOPPED and "deactivated" in ended.ended
    GangCluster(kube).stop("training", second.job)
    give_back(kube, "dag/clear", cluster_queue="training")


def test_a_try_after_a_clear_killed_a_trigger_that_had_resumed_starts_past_its_attempts(
    cluster, api, s3, bucket
):
    """The trigger resumed (attempt 2) and was killed by a Clear before its event: the task state store
    still names attempt 1.  The next try finds attempt 2 by its Job, sees it stopped, and starts attempt 3,
    instead of taking the stopped Job 2 for a new attempt and failing the run."""
    kube, spec = claimed_run(cluster, api, bucket, "clear2", ARGS)
    state: dict = {}
    a_try = tries(kube, spec, "clear2", state)
    run = a_try()
    first, _ = run.start()
    trigger = GangRun.from_dict(
        run.to_dict(), GangCluster(kube), CheckpointStore()
    )  # keeps its ledger to itself
    GangCluster(kube).stop("training", first.job)  # the trigger judged attempt 1 and stopped it
    trigger.ledger.end(FailureKind.HANG, "no progress")
    resumed = trigger.new_attempt()
    wait_for(lambda: GangCluster(kube).job_pods("training", resumed.job), "attempt 2's pods")
    GangCluster(kube).stop("training", resumed.job)  # the Clear's on_kill

    third, reattached = a_try(2, first_try=2).start()

    assert not reattached and third.number == 3
    ledger = RunLedger.from_dict(state["ledger"])
    assert [a.job for a in ledger.attempts[:2]] == [first.job, resumed.job]
    assert ledger.attempts[1].kind == FailureKind.STOPPED
    GangCluster(kube).stop("training", third.job)


def test_a_try_after_its_worker_died_fails_on_a_user_code_failure_it_finds_without_resuming(
    cluster, api, s3, bucket
):
    """The worker died after submitting; the trainer then failed on its own (exit 1, nothing on the nodes).
    The next try judges it as the trigger would have: the user's code, no resume, no second Job."""
    from tests.training.conftest import jobs
    from tests.training.test_gang_e2e import running_pod
    from trainops.errors import PermanentError

    kube, spec = claimed_run(cluster, api, bucket, "died", ARGS)
    state: dict = {}
    a_try = tries(kube, spec, "died", state)

    first, _ = a_try().start()
    pod = wait_for(lambda: running_pod(api, "1"), "attempt 1 running")
    cluster.inject(
        "crash-pod", f"training/{pod['metadata']['name']}", exit_code=1, message="ValueError: bad batch"
    )
    wait_for(lambda: finished(GangCluster(kube).read_job("training", first.job)), "Job 1 Failed")

    with pytest.raises(PermanentError, match="exited with code 1"):
        a_try().start()
    assert [j["metadata"]["name"] for j in jobs(api)] == [first.job]
    assert RunLedger.from_dict(state["ledger"]).attempts[0].kind == FailureKind.USER_CODE


def test_a_try_after_its_worker_died_with_the_resume_budget_spent_fails_without_a_new_attempt(
    cluster, api, s3, bucket
):
    """The trigger ran out of resumes and its event's ledger was saved, then the worker died before it
    failed the task: the next try must not resume once more (it reads what is left of the budget)."""
    from tests.training.conftest import jobs
    from trainops.errors import PermanentError

    def attempts() -> set[str]:
        return {j["metadata"]["labels"]["trainops.io/attempt"] for j in jobs(api)}

    kube, spec = claimed_run(cluster, api, bucket, "spent", ARGS)
    state: dict = {}
    a_try = tries(kube, spec, "spent", state)
    run = a_try(1, max_resumes=1)
    first, _ = run.start()
    GangCluster(kube).stop("training", first.job)
    run.ledger.end(FailureKind.HANG, "no progress for 300 s")
    second = run.new_attempt()  # the trigger's one resume
    GangCluster(kube).stop("training", second.job)
    run.ledger.end(FailureKind.HANG, "no progress for 300 s")
    run.save()  # execute_complete saved the event's ledger, then its worker died

    with pytest.raises(
        PermanentError, match="resumes exhausted after 2 attempts; last: no progress for 300 s"
    ):
        a_try(2, max_resumes=1).start()
    assert "3" not in attempts(), "a third attempt was submitted"
    assert len(RunLedger.from_dict(state["ledger"]).attempts) == 2

    cleared, _ = a_try(3, max_resumes=1, first_try=3).start()  # a Clear gives a fresh budget
    assert cleared.number == 3 and "3" in attempts()
    GangCluster(kube).stop("training", cleared.job)


def test_a_try_after_its_worker_died_on_a_succeeded_run_follows_the_completed_job_again(
    cluster, api, s3, bucket
):
    """The trigger's event said succeeded and was saved, then the worker died: the next try must not
    train once more from the last checkpoint."""
    from tests.training.conftest import jobs
    from trainops.training.follow import Status

    kube, spec = claimed_run(cluster, api, bucket, "done", ["--steps", "20", "--checkpoint-every", "10"])
    state: dict = {}
    a_try = tries(kube, spec, "done", state)
    run = a_try(1, max_resumes=3)
    first, _ = run.start()
    wait_for(lambda: finished(GangCluster(kube).read_job("training", first.job)), "the Job completed")
    run.ledger.end(Status.SUCCEEDED, "completed")
    run.save()

    again, reattached = a_try(2, max_resumes=3).start()

    assert (again.number, reattached) == (1, True)
    assert [j["metadata"]["name"] for j in jobs(api)] == [first.job]


def test_a_try_after_its_worker_died_on_a_failed_verdict_fails_until_a_clear(cluster, api, s3, bucket):
    """The trigger judged the user's code failed (no resume) and its event was saved, then the worker
    died before it failed the task: the next try fails too; a Clear resumes."""
    from tests.training.conftest import jobs
    from tests.training.test_gang_e2e import running_pod
    from trainops.errors import PermanentError
    from trainops.training.follow import Outcome, Status
    from trainops.training.runner import Decision

    kube, spec = claimed_run(cluster, api, bucket, "failed", ARGS)
    state: dict = {}
    a_try = tries(kube, spec, "failed", state)
    run = a_try(1, max_resumes=3)
    first, _ = run.start()
    pod = wait_for(lambda: running_pod(api, "1"), "attempt 1 running")
    cluster.inject("crash-pod", f"training/{pod['metadata']['name']}", exit_code=1, message="KeyError: 'x'")
    wait_for(lambda: finished(GangCluster(kube).read_job("training", first.job)), "Job 1 Failed")
    pods = GangCluster(kube).job_pods("training", first.job)
    verdict = run.finish(Outcome(Status.FAILED, "a pod failed", first.job, pods).to_dict())  # the trigger
    assert verdict.decision is Decision.FAIL

    with pytest.raises(
        PermanentError, match=r"attempt 1 failed, no resume \(user_code\): .*exited with code 1"
    ):
        a_try(2, max_resumes=3).start()
    assert [j["metadata"]["name"] for j in jobs(api)] == [first.job]

    cleared, reattached = a_try(3, max_resumes=3, first_try=3).start()
    assert (cleared.number, reattached) == (2, False)
    GangCluster(kube).stop("training", cleared.job)


def test_a_killed_trigger_submits_nothing_after_its_on_kill(cluster, api, s3, bucket):
    """Mark-failed came as the trigger began: its on_kill stopped attempt 1 while its start() still read
    the run in a thread (cancelling the coroutine does not stop that thread).  That start() finds attempt 1
    stopped and must not submit attempt 2, which nobody would stop (seen once on the services stack)."""
    from tests.training.conftest import jobs
    from trainops.errors import PermanentError

    kube, spec = claimed_run(cluster, api, bucket, "killed", ARGS)
    run = tries(kube, spec, "killed", {})(1, max_resumes=3)
    first, _ = run.start()
    wait_for(lambda: GangCluster(kube).job_pods("training", first.job), "the attempt's pods")
    trigger = GangRun.from_dict(run.to_dict(), GangCluster(kube), CheckpointStore())

    GangCluster(kube).stop("training", trigger.stop_submitting())  # the trigger's on_kill
    with pytest.raises(PermanentError, match="the task was killed: attempt 2's Job .* is not created"):
        trigger.start()  # what its thread goes on with

    assert [j["metadata"]["name"] for j in jobs(api)] == [first.job]
