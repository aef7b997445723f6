"""``decide``: every race the training run has met, as one row each, on plain data (no cluster).

Each row is the run as the cluster shows it (its attempts' Jobs: state, who began them, what they
spent, how they were judged), the try deciding and its budget, and the one action that must come
next.  The notes say where the race was found (issue stops, CI, the fault campaign)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from trainops.training.decide import (
    Begin,
    Budget,
    Fail,
    Follow,
    Judge,
    Options,
    Sizing,
    Stop,
    Stopped,
    Succeed,
    Wait,
    Want,
    decide,
    follower_failure,
    verdict_of,
)
from trainops.training.failures import Failure, FailureKind
from trainops.training.follow import Outcome, Status
from trainops.training.ledger import Attempt, End, Ledger, Spent, State, Verdict

NOW = 1_000.0
XID = {"gpu-node-3": "GPUHealthy=False: xid_events=[79]"}


def end(kind: str, verdict: str, reason: str = "", **more) -> End:
    return End(kind, Verdict(verdict), reason or kind, **more)


RESUME = end("infrastructure", "resume", "node fault: gpu-node-3", culprits=XID)
HANG = end("hang", "resume", "no progress for 30.0s")
USER = end("user_code", "fail", "pod p-0 exited with code 1")
UNCONFIRMED = end("user_code", "resume", "exited with code 1", hints=("pod printed 'XID 13'",))
STOPPED_BY_TEARDOWN = end("stopped", "fail", "stopped: the teardown", by="the teardown")
STOPPED_BY_KILL = end("stopped", "fail", "stopped: the task was killed", by="on_kill")
SUCCEEDED = end("succeeded", "succeeded", "Job completed")


def attempt(number: int, state: str, *, by_try: int = 1, spent: tuple = (1, 0, 0), **more) -> Attempt:
    return Attempt(number, f"job-a{number}", State(state), began_by_try=by_try, spent=Spent(*spent), **more)


def seen(status: str, message: str = "seen") -> Outcome:
    return Outcome(Status(status), message, "job-a1")


@dataclass
class Row:
    race: str
    attempts: list[Attempt]
    expect: type
    budget: Budget = field(default_factory=lambda: Budget(max_resumes=3, unconfirmed_fault_retries=1))
    want: Want = Want.RUN
    seen: Outcome | None = None
    check: dict = field(default_factory=dict)  # attributes of the action, e.g. number=2


ROWS = [
    Row("a run's first try: begin attempt 1", [], Begin, check={"number": 1, "spent": Spent(1, 0, 0)}),
    Row(
        "the worker died right after submitting: the next try reattaches to the one Job",
        [attempt(1, "running")],
        Follow,
        Budget(try_number=2, max_resumes=3),
        check={"attempt.number": 1},
    ),
    Row(
        "the attempt failed while no try watched (its worker died): judge it from the cluster",
        [attempt(1, "failed")],
        Judge,
        Budget(try_number=2, max_resumes=3),
        check={"seen": None},
    ),
    Row(
        "the follower saw a hang: judge it (the follower stops nothing itself)",
        [attempt(1, "running")],
        Judge,
        seen=seen("hang", "no progress for 30.0s"),
    ),
    Row("judged a hang, still running: stop it before resuming", [attempt(1, "running", end=HANG)], Stop),
    Row(
        "judged a node fault on a failed Job whose Workload is still admitted: deactivate it before resuming",
        [attempt(1, "failed", end=RESUME, workload="w1")],
        Stop,
    ),
    Row(
        "judged and stopped: resume without the culprits, one resume spent",
        [attempt(1, "failed", end=RESUME, workload="w1", stopped_by="user")],
        Begin,
        check={"number": 2, "kept_out": XID, "spent": Spent(1, 1, 0)},
    ),
    Row(
        "a triggerer restarted between its own hang-stop and the next begin: it resumes "
        "(was: failed the run as stopped, the price of resume_stopped=False)",
        [attempt(1, "stopped", end=HANG, stopped_by="user")],
        Begin,
        check={"number": 2},
    ),
    Row(
        "a triggerer restarted after it resumed: the new trigger follows the attempt the first one began "
        "(was: followed the Job it had stopped and failed the run 'deactivated')",
        [attempt(1, "stopped", end=HANG), attempt(2, "running", spent=(1, 1, 0))],
        Follow,
        check={"attempt.number": 2},
    ),
    Row(
        "a Clear's on_kill stopped attempt 1: the Clear's try resumes it with a fresh budget "
        "(the campaign: a Clear failed its run when the next try reattached to the stopped Job)",
        [attempt(1, "stopped", end=STOPPED_BY_KILL)],
        Begin,
        Budget(try_number=2, first_try=2, max_resumes=3),
        check={"number": 2, "spent": Spent(2, 0, 0)},
    ),
    Row(
        "a Clear killed a trigger that had resumed: the Clear's try starts past attempt 2, not on it",
        [attempt(1, "stopped", end=HANG), attempt(2, "stopped", spent=(1, 1, 0), end=STOPPED_BY_KILL)],
        Begin,
        Budget(try_number=2, first_try=2, max_resumes=3),
        check={"number": 3, "spent": Spent(2, 0, 0)},
    ),
    Row(
        "a Clear while the triggerer was down (no on_kill): the Clear's try follows the running attempt",
        [attempt(1, "running")],
        Follow,
        Budget(try_number=2, first_try=2, max_resumes=3),
    ),
    Row(
        "mark-failed before the triggerer ran the trigger: the teardown stopped attempt 1, then the trigger "
        "started; it must not resume on nodes given back (CI: a second, active Workload after the teardown)",
        [attempt(1, "stopped", end=STOPPED_BY_TEARDOWN)],
        Fail,
        check={"reason": "attempt 1 failed, no resume (stopped): stopped: the teardown"},
    ),
    Row(
        "a killed trigger's thread still deciding after its on_kill recorded the stop: nothing is begun",
        [attempt(1, "stopped", end=STOPPED_BY_KILL)],
        Fail,
    ),
    Row(
        "someone deactivated the Workload by hand: judged as a stop, not resumed",
        [attempt(1, "stopped", stopped_by="user", stop_reason="spec.active=false")],
        Judge,
    ),
    Row(
        "Kueue deactivated the Workload itself (its requeuing limit): judged, with Kueue's reason",
        [
            attempt(
                1,
                "stopped",
                stopped_by="kueue",
                stop_reason="Kueue deactivated Workload w (DeactivatedDueToRequeuingLimitExceeded)",
            )
        ],
        Judge,
    ),
    Row(
        "the worker died after the trigger's success: follow nothing, train nothing more",
        [attempt(1, "succeeded", end=SUCCEEDED)],
        Succeed,
        Budget(try_number=2, max_resumes=3),
    ),
    Row(
        "the Job completed while nobody watched: judge it (then succeed)",
        [attempt(1, "succeeded")],
        Judge,
        Budget(try_number=2, max_resumes=3),
    ),
    Row(
        "the worker died past a 'fail' verdict (user code): the next try fails too, no resume of failed code",
        [attempt(1, "failed", end=USER)],
        Fail,
        Budget(try_number=2, max_resumes=3),
        check={"exhausted": False},
    ),
    Row(
        "... until a Clear: a resume with a fresh budget",
        [attempt(1, "failed", end=USER)],
        Begin,
        Budget(try_number=3, first_try=3, max_resumes=3),
        check={"number": 2, "spent": Spent(3, 0, 0)},
    ),
    Row(
        "the worker died after the trigger ran out of resumes: no resume past the budget",
        [attempt(1, "failed", end=RESUME), attempt(2, "failed", spent=(1, 1, 0), end=RESUME)],
        Fail,
        Budget(try_number=2, max_resumes=1),
        check={"exhausted": True},
    ),
    Row(
        "... a Clear gives a fresh budget",
        [attempt(1, "failed", end=RESUME), attempt(2, "failed", spent=(1, 1, 0), end=RESUME)],
        Begin,
        Budget(try_number=3, first_try=3, max_resumes=1),
        check={"number": 3, "spent": Spent(3, 0, 0)},
    ),
    Row(
        "max_resumes=0: a crash fails the run at once",
        [attempt(1, "failed", end=RESUME)],
        Fail,
        Budget(max_resumes=0),
        check={"exhausted": True},
    ),
    Row(
        "resumes made in one try by the trigger count against the budget",
        [attempt(n, "failed", spent=(1, n - 1, 0), end=RESUME) for n in (1, 2, 3, 4)],
        Fail,
        Budget(max_resumes=3),
        check={"exhausted": True},
    ),
    Row(
        "an unconfirmed fault is a resume, counted in both budgets",
        [attempt(1, "failed", end=UNCONFIRMED)],
        Begin,
        check={"spent": Spent(1, 1, 1)},
    ),
    Row(
        "a resume raced a stop: two attempts running, the older one is stopped",
        [attempt(1, "running", end=HANG), attempt(2, "running", spent=(1, 1, 0))],
        Stop,
        check={"attempts.0.number": 1},
    ),
    Row(
        "the followed attempt's Job was deleted: resumed, and the resume is counted",
        [attempt(1, "failed", end=RESUME), attempt(2, "gone", spent=(1, 1, 0))],
        Begin,
        check={"number": 3, "spent": Spent(1, 2, 0)},
    ),
    Row(
        "the teardown (want=STOP) stops the running attempt and records it stopped",
        [attempt(1, "running")],
        Stop,
        want=Want.STOP,
        check={"end.kind": "stopped", "end.verdict": Verdict.FAIL},
    ),
    Row(
        "want=STOP after a stop: nothing is running and the run is marked stopped, done",
        [attempt(1, "stopped", end=STOPPED_BY_TEARDOWN, run_stopped="the teardown")],
        Stopped,
        want=Want.STOP,
    ),
    Row(
        "want=STOP between a judgement and its resume: nothing runs, the newest attempt is marked stopped",
        [attempt(1, "failed", end=RESUME, workload="w1", stopped_by="user")],
        Stop,
        want=Want.STOP,
        check={"attempts": (), "mark.number": 1},
    ),
    Row(
        "the trigger began attempt 2 after the teardown's stop had looked (another process): stopped by "
        "whoever reads the run next",
        [attempt(1, "stopped", end=HANG, run_stopped="the teardown"), attempt(2, "running", spent=(1, 1, 0))],
        Stop,
        check={"attempts.0.number": 2, "end.reason": "stopped: the teardown"},
    ),
    Row(
        "a run marked stopped is not resumed in the same budget",
        [attempt(1, "failed", end=RESUME, workload="w1", stopped_by="user", run_stopped="the teardown")],
        Fail,
        check={"reason": "the run was stopped (the teardown): no resume"},
    ),
    Row(
        "... but a Clear resumes it (the mark is of the budget before)",
        [attempt(1, "stopped", end=STOPPED_BY_KILL, run_stopped="on_kill")],
        Begin,
        Budget(try_number=2, first_try=2, max_resumes=3),
    ),
    Row(
        "pods cannot be created (Pod Security): the follower saw it at once; judge it",
        [attempt(1, "running")],
        Judge,
        seen=seen("pods_refused", 'pods "p" is forbidden: violates PodSecurity "baseline:latest"'),
    ),
]


def _get(action, path: str):
    value = action
    for part in path.split("."):
        value = value[int(part)] if part.isdigit() else getattr(value, part)
    return value


@pytest.mark.parametrize("row", ROWS, ids=[r.race for r in ROWS])
def test_decide(row: Row):
    action = decide(Ledger(tuple(row.attempts)), row.budget, NOW, row.want, row.seen, by="the teardown")

    assert type(action) is row.expect, action
    for path, value in row.check.items():
        assert _get(action, path) == value, (path, action)


@dataclass
class VerdictRow:
    case: str
    failure: Failure
    verdict: Verdict
    says: str
    attempts: list[Attempt] = field(default_factory=lambda: [attempt(1, "failed")])
    budget: Budget = field(default_factory=lambda: Budget(max_resumes=3, unconfirmed_fault_retries=1))
    options: Options = field(default_factory=Options)


F = FailureKind
VERDICTS = [
    VerdictRow(
        "a node fault is resumed", Failure(F.INFRASTRUCTURE, "node fault"), Verdict.RESUME, "infrastructure"
    ),
    VerdictRow("a hang is resumed", Failure(F.HANG, "no progress"), Verdict.RESUME, "hang: no progress"),
    VerdictRow(
        "the user's code fails at once",
        Failure(F.USER_CODE, "exited with code 1"),
        Verdict.FAIL,
        "user code failed (no resume used): exited with code 1",
    ),
    VerdictRow(
        "... or is resumed when fail_fast_on_user_error is off",
        Failure(F.USER_CODE, "exited with code 1"),
        Verdict.RESUME,
        "user_code",
        options=Options(fail_fast_on_user_error=False),
    ),
    VerdictRow(
        "GPU errors the pods printed, no node confirms: one resume of their own",
        Failure(F.USER_CODE, "exited", hints=["XID 13"]),
        Verdict.RESUME,
        "unconfirmed fault (1 of 1 such retries)",
    ),
    VerdictRow(
        "... the second one is the user's code",
        Failure(F.USER_CODE, "exited", hints=["XID 13"]),
        Verdict.FAIL,
        "user code failed",
        attempts=[attempt(1, "failed", end=UNCONFIRMED), attempt(2, "failed", spent=(1, 1, 1))],
    ),
    VerdictRow(
        "... and a Clear resets it as it resets max_resumes (was: never reset)",
        Failure(F.USER_CODE, "exited", hints=["XID 13"]),
        Verdict.RESUME,
        "unconfirmed fault (1 of 1",
        attempts=[attempt(1, "failed", end=UNCONFIRMED), attempt(2, "failed", spent=(1, 1, 1))],
        budget=Budget(try_number=2, first_try=2, max_resumes=3, unconfirmed_fault_retries=1),
    ),
    VerdictRow(
        "never admitted: fail", Failure(F.ADMISSION_TIMEOUT, "quota"), Verdict.FAIL, "admission_timeout"
    ),
    VerdictRow("stopped by a person: fail", Failure(F.STOPPED, "deactivated"), Verdict.FAIL, "stopped"),
    VerdictRow(
        "Kueue gave up on it: fail, with Kueue's reason",
        Failure(F.KUEUE_DEACTIVATED, "Kueue deactivated Workload w: RequeuingLimitExceeded"),
        Verdict.FAIL,
        "RequeuingLimitExceeded",
    ),
    VerdictRow(
        "pods refused by admission: fail with the API's message",
        Failure(F.PODS_REFUSED, 'violates PodSecurity "baseline:latest"'),
        Verdict.FAIL,
        "violates PodSecurity",
    ),
    VerdictRow(
        "Kueue says its queue can never admit the request: fail with Kueue's answer, no resume",
        follower_failure("never_admitted", "resource rdma/ib unavailable in ClusterQueue"),
        Verdict.FAIL,
        "never_admitted: resource rdma/ib unavailable in ClusterQueue",
    ),
]


@pytest.mark.parametrize("row", VERDICTS, ids=[r.case for r in VERDICTS])
def test_verdict_of(row: VerdictRow):
    verdict, message = verdict_of(row.failure, Ledger(tuple(row.attempts)), row.budget, row.options)

    assert verdict is row.verdict and row.says in message, message


# ---- elastic resume: how many nodes the next attempt trains on ------------------------------------
CRASHED_AT = NOW - 10  # the newest attempt's end was seen 10 s ago
CRASHED = end("infrastructure", "resume", "node fault: gpu-node-3", culprits=XID, at=CRASHED_AT)
ELASTIC = Sizing(nodes=3, min_nodes=2, wait_s=60)


@dataclass
class SizeRow:
    case: str
    sizing: Sizing
    free: int | None
    expect: type
    nodes: int | None = None  # Begin.nodes (None: the run's own size)
    attempts: list[Attempt] = field(
        default_factory=lambda: [attempt(1, "failed", end=CRASHED, workload="w1", stopped_by="user")]
    )
    budget: Budget = field(default_factory=lambda: Budget(max_resumes=3))


SIZES = [
    SizeRow("off (min_nodes unset): a resume short of a node waits for it in Kueue", Sizing(3), 2, Begin),
    SizeRow("off (min_nodes == nodes): the same", Sizing(3, 3, 60), 2, Begin),
    SizeRow(
        "elastic, every node free (a spare took the culprit's place): the run's own size", ELASTIC, 3, Begin
    ),
    SizeRow("elastic, nodes not read (an attempt still live): the run's own size", ELASTIC, None, Begin),
    SizeRow("elastic, a node short, within the wait: wait for a spare", ELASTIC, 2, Wait),
    SizeRow("elastic, a node short, the wait is over: resume on the nodes there are", ELASTIC, 2, Begin, 2),
    SizeRow("elastic, no wait: resume on fewer at once", Sizing(3, 2, 0), 2, Begin, 2),
    SizeRow(
        "elastic, fewer free than min_nodes after the wait: never below min_nodes (Kueue holds it for them)",
        Sizing(4, 2, 0),
        1,
        Begin,
        2,
    ),
    SizeRow(
        "elastic, a Job gone with its end: nothing to wait from, resume on fewer at once",
        Sizing(3, 2, 600),
        2,
        Begin,
        2,
        [attempt(1, "gone")],
    ),
    SizeRow(
        "elastic, an attempt on 2 of 3 crashed and all 3 nodes are free again: grow back to 3",
        ELASTIC,
        3,
        Begin,
        None,
        [attempt(1, "stopped", end=CRASHED), attempt(2, "failed", end=CRASHED, spent=(1, 1, 0), nodes=2)],
    ),
    SizeRow(
        "elastic, resumes exhausted: the size does not matter, the run fails",
        ELASTIC,
        1,
        Fail,
        budget=Budget(max_resumes=0),
    ),
    SizeRow(
        "elastic, a Clear's first try and a node short: shrinks too (the gate and the claim ran again)",
        Sizing(3, 2, 0),
        2,
        Begin,
        2,
        budget=Budget(try_number=2, first_try=2, max_resumes=3),
    ),
]


@pytest.mark.parametrize("row", SIZES, ids=[r.case for r in SIZES])
def test_elastic_resume_size(row: SizeRow):
    now = NOW if row.case.find("wait is over") < 0 else CRASHED_AT + row.sizing.wait_s
    action = decide(Ledger(tuple(row.attempts)), row.budget, now, sizing=row.sizing, free=row.free)

    assert type(action) is row.expect, action
    if isinstance(action, Begin):
        assert action.nodes == row.nodes, action
        assert action.kept_out == (XID if row.attempts[-1].end else {})
        if row.nodes is not None:
            assert f"elastic resume on {row.nodes} of {row.sizing.nodes} nodes" in action.why
    if isinstance(action, Wait):
        assert action.until == CRASHED_AT + row.sizing.wait_s
        assert "2 of 3 nodes free" in action.why
