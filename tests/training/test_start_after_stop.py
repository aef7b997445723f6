"""The races of a try, a trigger, a Clear and a teardown, on the devcluster: what each finds on the
cluster (the run's Jobs are its ledger) and the one thing it does about it.  The same races are rows of
the pure decision table (test_decide.py); these show the acts on real Jobs: one Job per attempt, the
stop and the judgement recorded where every later reader finds them."""

from __future__ import annotations

import dataclasses

import pytest

from tests.devcluster.ctrl_support import wait_for
from tests.training.conftest import claimed_run, jobs, training_run, when
from tests.training.test_gang_e2e import running_pod
from tests.training.test_kueue_versions import watching
from trainops.errors import PermanentError
from trainops.training.cluster import GangCluster
from trainops.training.decide import Begin, Fail, Follow, Succeed
from trainops.training.failures import FailureKind
from trainops.training.follow import Outcome, Status
from trainops.training.job import finished
from trainops.training.ledger import Spent, State

ARGS = ["--steps", "400", "--checkpoint-every", "20", "--step-seconds", "0.02"]
KILLED = "the task was killed (Clear, mark failed or success)"


def names(api) -> list[str]:
    return sorted(j["metadata"]["name"] for j in jobs(api))


def followed(run, job_name: str, status: Status, message: str, pods=()):
    """``run``'s trigger saw ``job_name`` end as ``status``: what it reconciles next."""
    run.followed = next(a for a in run.observe().attempts if a.job == job_name)
    return run.reconcile(seen=Outcome(status, message, job_name, list(pods)))


def test_a_clear_after_its_on_kill_stopped_the_attempt_resumes_with_a_fresh_budget(cluster, api, s3, bucket):
    kube, spec = claimed_run(cluster, api, bucket, "clear", ARGS)
    first = training_run(kube, spec, "clear").reconcile()
    assert isinstance(first, Follow) and first.attempt.number == 1
    wait_for(lambda: GangCluster(kube).job_pods("training", first.attempt.job), "the attempt's pods")
    training_run(kube, spec, "clear").halt(KILLED)  # the Clear's on_kill, in the trigger of try 1

    second = training_run(kube, spec, "clear", try_number=2, first_try=2).reconcile()  # the Clear's try

    assert isinstance(second, Follow) and second.attempt.number == 2
    ledger = training_run(kube, spec, "clear").observe()
    assert ledger.attempts[0].end.kind == FailureKind.STOPPED and KILLED in ledger.attempts[0].end.reason
    assert ledger.attempts[1].began_by_try == 2 and ledger.attempts[1].spent == Spent(2, 0, 0)
    assert len(jobs(api)) == 2
    GangCluster(kube).stop("training", second.attempt.job)


def test_a_clear_that_killed_a_trigger_after_it_resumed_starts_past_its_attempts(cluster, api, s3, bucket):
    """The trigger judged attempt 1 hung and began attempt 2, then the Clear's on_kill stopped attempt 2.
    The Clear's try begins attempt 3, instead of taking the stopped Job 2 for a new attempt."""
    kube, spec = claimed_run(cluster, api, bucket, "clear2", ARGS)
    trigger = training_run(kube, spec, "clear2")
    first = trigger.reconcile()
    resumed = followed(trigger, first.attempt.job, Status.HANG, "no progress for 30.0s")
    assert isinstance(resumed, Follow) and resumed.attempt.number == 2
    wait_for(lambda: GangCluster(kube).job_pods("training", resumed.attempt.job), "attempt 2's pods")
    trigger.halt(KILLED)

    third = training_run(kube, spec, "clear2", try_number=2, first_try=2).reconcile()

    assert isinstance(third, Follow) and third.attempt.number == 3
    ended = [(a.number, a.end.kind) for a in trigger.observe().attempts if a.end]
    assert ended == [(1, FailureKind.HANG), (2, FailureKind.STOPPED)]
    assert len(jobs(api)) == 3
    GangCluster(kube).stop("training", third.attempt.job)


def test_a_stop_before_kueue_made_the_workload_deactivates_it_and_keeps_the_attempts_record(
    cluster, api, s3, bucket
):
    """Kueue makes a Job's Workload after the Job (here: once its priority class exists).  A stop in
    between waits for that Workload and deactivates it: deleting the Job instead deleted the attempt's
    record with it (its judged end and the run-stopped mark), and a later reader took the run for one
    with no attempt, or a Job gone (found when a loaded machine lost attempt 1's hang in the test above)."""
    kube, spec = claimed_run(cluster, api, bucket, "early", ARGS)
    spec = dataclasses.replace(spec, priority_class="training-later")
    run = training_run(kube, spec, "early")
    first = run.reconcile()
    assert isinstance(first, Follow) and first.attempt.workload is None
    classes = kube.kueue("workloadpriorityclasses", namespaced=False)
    later = {"metadata": {"name": "training-later"}, "value": 100}
    when(lambda: watching(cluster, "/workloads"), lambda: kube.create(later, classes))

    run.halt(KILLED)

    (stopped,) = run.observe().attempts  # old: none (the Job was deleted, its record with it)
    assert (stopped.end.kind, stopped.run_stopped) == (FailureKind.STOPPED, KILLED), stopped
    assert (stopped.state, stopped.stopped_by) == (State.STOPPED, "user")  # its Workload: spec.active=false
    assert run.stops == [f"deactivated Workload {stopped.workload} (spec.active=false)"]


def test_a_try_after_its_worker_died_judges_a_user_code_failure_it_finds_and_fails_without_resuming(
    cluster, api, s3, bucket
):
    """The worker died after submitting; the trainer then failed on its own (exit 1, nothing on the nodes).
    The next try judges it as the trigger would have: the user's code, no resume, no second Job."""
    kube, spec = claimed_run(cluster, api, bucket, "died", ARGS)
    first = training_run(kube, spec, "died").reconcile()
    pod = wait_for(lambda: running_pod(api, "1"), "attempt 1 running")
    cluster.inject(
        "crash-pod", f"training/{pod['metadata']['name']}", exit_code=1, message="ValueError: bad batch"
    )
    wait_for(lambda: finished(GangCluster(kube).read_job("training", first.attempt.job)), "Job 1 Failed")

    action = training_run(kube, spec, "died", try_number=2).reconcile()

    assert isinstance(action, Fail) and "exited with code 1" in action.reason, action
    assert names(api) == [first.attempt.job]
    judged = training_run(kube, spec, "died").observe().attempts[0].end
    assert judged.kind == FailureKind.USER_CODE and judged.by == "try 2"


def test_a_try_after_the_trigger_spent_the_budget_fails_until_a_clear_gives_a_fresh_one(
    cluster, api, s3, bucket
):
    """The trigger ran out of resumes, then the worker died before it failed the task: the next try must
    not resume once more (each Job records the budget spent with it); a Clear resumes."""
    kube, spec = claimed_run(cluster, api, bucket, "spent", ARGS)
    trigger = training_run(kube, spec, "spent", max_resumes=1)
    first = trigger.reconcile()
    second = followed(trigger, first.attempt.job, Status.HANG, "no progress for 300 s")
    assert isinstance(second, Follow) and second.attempt.spent == Spent(1, 1, 0)
    assert isinstance(followed(trigger, second.attempt.job, Status.HANG, "no progress for 300 s"), Fail)

    action = training_run(kube, spec, "spent", try_number=2, max_resumes=1).reconcile()

    assert isinstance(action, Fail) and action.exhausted, action
    assert action.reason == "resumes exhausted after 2 attempts; last: no progress for 300 s"
    assert len(jobs(api)) == 2, "a third attempt was submitted"
    cleared = training_run(kube, spec, "spent", try_number=3, first_try=3, max_resumes=1).reconcile()
    assert isinstance(cleared, Follow) and cleared.attempt.number == 3 and len(jobs(api)) == 3
    GangCluster(kube).stop("training", cleared.attempt.job)


def test_a_try_after_the_trigger_judged_success_trains_nothing_more(cluster, api, s3, bucket):
    """The trigger's event said succeeded, then the worker died: the next try must not train once more
    from the last checkpoint."""
    kube, spec = claimed_run(cluster, api, bucket, "done", ["--steps", "20", "--checkpoint-every", "10"])
    trigger = training_run(kube, spec, "done")
    first = trigger.reconcile()
    wait_for(lambda: finished(GangCluster(kube).read_job("training", first.attempt.job)), "the Job completed")
    assert isinstance(followed(trigger, first.attempt.job, Status.SUCCEEDED, "Job completed"), Succeed)

    again = training_run(kube, spec, "done", try_number=2).reconcile()

    assert isinstance(again, Succeed) and again.attempt.number == 1
    assert names(api) == [first.attempt.job]


def test_a_fail_verdict_stands_for_every_later_try_until_a_clear(cluster, api, s3, bucket):
    """The trigger judged the user's code failed (no resume), then the worker died before it failed the
    task: the next try fails too; a Clear resumes."""
    kube, spec = claimed_run(cluster, api, bucket, "failed", ARGS)
    trigger = training_run(kube, spec, "failed")
    first = trigger.reconcile()
    pod = wait_for(lambda: running_pod(api, "1"), "attempt 1 running")
    cluster.inject("crash-pod", f"training/{pod['metadata']['name']}", exit_code=1, message="KeyError: 'x'")
    wait_for(lambda: finished(GangCluster(kube).read_job("training", first.attempt.job)), "Job 1 Failed")
    pods = GangCluster(kube).job_pods("training", first.attempt.job)
    assert isinstance(followed(trigger, first.attempt.job, Status.FAILED, "a pod failed", pods), Fail)

    again = training_run(kube, spec, "failed", try_number=2).reconcile()
    assert isinstance(again, Fail)
    assert (
        again.reason.startswith("attempt 1 failed, no resume (user_code): ")
        and "exited with code 1" in again.reason
    )
    assert names(api) == [first.attempt.job]

    cleared = training_run(kube, spec, "failed", try_number=3, first_try=3).reconcile()
    assert isinstance(cleared, Follow) and cleared.attempt.number == 2
    GangCluster(kube).stop("training", cleared.attempt.job)


def test_a_killed_trigger_begins_nothing_after_its_on_kill(cluster, api, s3, bucket):
    """Mark-failed came as the trigger began: its on_kill stopped attempt 1 while its thread still
    reconciled the run (cancelling the coroutine does not stop that thread).  What that thread decides
    next finds the stop recorded, and a begin it had already decided is refused in this process."""
    kube, spec = claimed_run(cluster, api, bucket, "killed", ARGS)
    trigger = training_run(kube, spec, "killed")
    first = trigger.reconcile()
    wait_for(lambda: GangCluster(kube).job_pods("training", first.attempt.job), "the attempt's pods")
    ledger = trigger.observe()

    trigger.halt(KILLED)  # the trigger's on_kill

    assert isinstance(trigger.reconcile(), Fail)  # what its thread goes on with
    with pytest.raises(PermanentError, match="the task was killed: attempt 2's Job .* is not created"):
        trigger.act(Begin(2, {}, Spent(1, 1, 0)), ledger)  # a begin decided before the on_kill
    assert names(api) == [first.attempt.job]
