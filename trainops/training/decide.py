"""What to do next with a training run: one pure decision over the attempts as the cluster shows them.

``decide(ledger, budget, now, want)`` returns one ``Action``; ``verdict_of(failure, ledger, budget,
options)`` says what a judged failure calls for.  Neither reads or writes anything, so every race a try,
a trigger, a Clear or a teardown can run into is a row of a table test (tests/training/test_decide.py).
``reconcile`` observes, decides, acts and decides again until the action is to follow, succeed or fail.

The run's states, from the newest attempt (``docs/training-run.md`` draws them)::

    no attempt ------------------------------------------------------------> Begin attempt 1
    running, not judged, nothing seen ------------------------------------> Follow it
    ended (or its follower saw it end), not judged -------------------------> Judge it
    judged, still running or admitted (a hang, a failed gang) ------------> Stop it
    judged before the run's last Clear (any verdict) ---------------------> Begin, fresh budget
    judged succeeded -----------------------------------------------------> Succeed
    judged fail (user code, stopped by a person, never admitted) ---------> Fail, until a Clear
    judged resume, budget left -------------------------------------------> Begin, without the culprits
      (elastic, too few nodes free) --> Wait for nodes up to ``wait_s``, then Begin on fewer (>= min_nodes)
    judged resume, budget spent ------------------------------------------> Fail (resumes exhausted)

The budget (``Budget``): ``max_resumes`` resumes, and ``unconfirmed_fault_retries`` of them for failures
whose pods printed GPU/NCCL errors no node confirms, both counted from the run's first try or its last
Clear (``first_try``): a Clear gives both a fresh budget, and the first attempt since is free.  Each
attempt's Job records what was spent with it (``ledger.Spent``), so the count survives a lost worker, a
restarted triggerer and Jobs garbage-collected since.

The size of a new attempt (``Sizing``): the run's ``nodes``, unless the run is elastic (``min_nodes`` below
``nodes``) and fewer nodes are ``free`` (healthy, not kept out: what the caller read from the cluster):
then it waits up to ``wait_s`` from the newest attempt's end for nodes to come back (``Wait``), and then
begins on the nodes there are, never fewer than ``min_nodes``, from the same latest verified checkpoint
(DCP reshards it to the new world size).  A later resume is sized again: the run grows back to ``nodes``
at its next resume once they are free.

With ``want=STOP`` (the task was killed, the run is torn down or reaped) every attempt still running is
stopped, an attempt not judged yet is judged ``stopped`` (fail) as it is, and the newest attempt is
marked ``run-stopped``: a trigger that starts after the teardown must find the run stopped, not resume
it, and an attempt another process began while the stop ran is stopped by whoever sees it next; the try
after a Clear resumes it (its attempts began before the Clear).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from trainops.training.failures import RETRYABLE, Failure, FailureKind
from trainops.training.ledger import Attempt, End, Ledger, Spent, State, Verdict


class Want(StrEnum):
    RUN = "run"  # train to the end: a try of the task, its trigger
    STOP = "stop"  # the task was killed, the run torn down or reaped


@dataclass(frozen=True)
class Budget:
    """``try_number``: the Airflow try deciding (recorded on the attempts it begins); ``first_try``: the
    run's first try since it started or was last cleared (Airflow: ``max_tries - retries + 1``)."""

    try_number: int = 1
    first_try: int = 1
    max_resumes: int = 0
    unconfirmed_fault_retries: int = 0

    def counts(self, attempt: Attempt) -> bool:
        """Whether ``attempt`` was begun since the run's start or its last Clear."""
        return attempt.began_by_try is not None and attempt.began_by_try >= self.first_try

    def spent(self, ledger: Ledger) -> Spent:
        """What the run has spent since ``first_try``: what its newest attempt recorded, if begun since."""
        newest = ledger.newest
        if newest is not None and self.counts(newest) and newest.spent is not None:
            return newest.spent
        return Spent(self.first_try)


@dataclass(frozen=True)
class Options:
    """How failures are judged (the operator's parameters of the same names); ``check_queue``: before
    the run's first Job, read its queues and refuse a request Kueue can never admit (a resource the
    ClusterQueue does not cover; off where Kueue's configuration excludes or transforms resources).  The
    TAS refusals (``GangCluster._check_one_pod_per_node``) run whatever it says."""

    fail_fast_on_user_error: bool = True
    quarantine_culprits: bool = True
    evidence_wait_s: float = 0.0
    check_queue: bool = True


@dataclass(frozen=True)
class Sizing:
    """How many nodes an attempt trains on: ``nodes``, or, elastic, as few as ``min_nodes`` (None:
    ``nodes``, i.e. off) after waiting ``wait_s`` for the missing ones (the operator's parameters)."""

    nodes: int = 1
    min_nodes: int | None = None
    wait_s: float = 0.0

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes < self.nodes


# ---- actions -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Follow:
    """Watch ``attempt`` until it ends."""

    attempt: Attempt


@dataclass(frozen=True)
class Judge:
    """Classify how ``attempt`` ended (its pods, nodes, logs) and record the ``End`` on its Job;
    ``seen``: what its follower saw (None: it ended while nobody watched)."""

    attempt: Attempt
    seen: object | None = None


@dataclass(frozen=True)
class Stop:
    """Stop these attempts; ``end``: recorded first on those not judged yet (None: all are judged);
    ``mark``: the attempt to mark ``run-stopped`` by ``end.by`` (``want=STOP``: no attempt begun after it
    in the same budget may run, whichever process begins it)."""

    attempts: tuple[Attempt, ...]
    end: End | None = None
    mark: Attempt | None = None


@dataclass(frozen=True)
class Begin:
    """Submit attempt ``number`` from the latest verified checkpoint, without the nodes ``kept_out``
    (node -> why), with the budget ``spent`` counting this begin, on ``nodes`` nodes (None: the run's
    own ``nodes``; fewer: an elastic resume)."""

    number: int
    kept_out: Mapping[str, str] = field(default_factory=dict)
    spent: Spent = field(default_factory=Spent)
    why: str = ""
    nodes: int | None = None


@dataclass(frozen=True)
class Wait:
    """An elastic resume lacks nodes: decide again when more are free, or at ``until`` (Unix time) at the
    latest, when the run resumes on the nodes there are."""

    until: float
    why: str


@dataclass(frozen=True)
class Succeed:
    attempt: Attempt


@dataclass(frozen=True)
class Fail:
    """The run fails; ``exhausted``: because the resume budget is spent (the message then names the
    latest verified checkpoint to Clear from)."""

    reason: str
    exhausted: bool = False


@dataclass(frozen=True)
class Stopped:
    """``want=STOP``: nothing of the run is running any more."""

    reason: str


Action = Follow | Judge | Stop | Begin | Wait | Succeed | Fail | Stopped


# ---- the decision ------------------------------------------------------------------------------
def decide(
    ledger: Ledger,
    budget: Budget,
    now: float,
    want: Want = Want.RUN,
    seen=None,
    by: str = "",
    sizing: Sizing | None = None,
    free: int | None = None,
) -> Action:
    """The one next step (see the module docstring).  ``seen``: what the follower of the newest attempt
    saw end it, when one followed it (its ``Outcome``); ``by``: who stops, for ``want=STOP``;
    ``sizing``: the run's size; ``free``: how many nodes a new attempt could run on now (healthy, not
    kept out; None: not read, the run's own size)."""
    attempts, newest, sizing = ledger.attempts, ledger.newest, sizing or Sizing()
    running = tuple(a for a in attempts if a.state is State.RUNNING)
    if want is Want.STOP:
        unmarked = (
            newest
            if newest is not None and newest.state is not State.GONE and not newest.run_stopped
            else None
        )
        if running or unmarked:
            return Stop(running, _stopped(f"stopped: {by}", now, by), unmarked)
        return Stopped("no attempt is running")
    if newest is None:
        return Begin(1, {}, Spent(budget.first_try), "first attempt")
    halted = next((a.run_stopped for a in attempts if a.run_stopped and budget.counts(a)), None)
    if halted and running:  # a begin raced the stop (the teardown's, another process's): stop it too
        return Stop(running, _stopped(f"stopped: {halted}", now, halted))
    superseded = tuple(a for a in attempts[:-1] if a.state is State.RUNNING)
    if superseded:  # a resume raced a stop: only the newest attempt may run
        why = f"superseded by attempt {newest.number}"
        return Stop(superseded, _stopped(why, now, by or why))
    end = newest.end
    if end is None and newest.state is State.GONE:
        # nothing can be written on a Job that is gone: its end goes with the next attempt's budget
        end = End(str(FailureKind.INFRASTRUCTURE), Verdict.RESUME, f"Job {newest.job} is gone", at=now)
    if end is None:
        if newest.state is State.RUNNING and seen is None:
            return Follow(newest)
        return Judge(newest, seen)
    if newest.state is State.RUNNING or (end.verdict is Verdict.RESUME and _still_admitted(newest)):
        return Stop((newest,))  # judged, not stopped yet (a hang, a crash between the two): stop first
    if not budget.counts(newest):  # begun before the run's last Clear: a resume with a fresh budget
        return _sized(
            Begin(newest.number + 1, ledger_excluded(ledger, end), Spent(budget.first_try), "cleared"),
            newest,
            sizing,
            free,
            now,
        )
    if end.verdict is Verdict.SUCCEEDED:
        return Succeed(newest)
    if end.verdict is Verdict.FAIL:
        return Fail(f"attempt {newest.number} failed, no resume ({end.kind}): {end.reason}")
    if halted:
        return Fail(f"the run was stopped ({halted}): no resume")
    spent = budget.spent(ledger)
    if spent.resumes >= budget.max_resumes:
        return Fail(f"resumes exhausted after {len(attempts)} attempts; last: {end.reason}", exhausted=True)
    nxt = Spent(budget.first_try, spent.resumes + 1, spent.unconfirmed + int(end.unconfirmed))
    begin = Begin(newest.number + 1, ledger_excluded(ledger, end), nxt, f"{end.kind}: {end.reason}")
    return _sized(begin, newest, sizing, free, now)


def _sized(begin: Begin, newest: Attempt, sizing: Sizing, free: int | None, now: float) -> Begin | Wait:
    """``begin`` on the run's own size, or (elastic, fewer nodes ``free``) a wait for nodes up to
    ``wait_s`` after the newest attempt ended, then ``begin`` on the nodes there are, at least ``min_nodes``."""
    if not sizing.elastic or free is None or free >= sizing.nodes:
        return begin
    since = newest.end.at if newest.end is not None and newest.end.at is not None else newest.finished_at
    if since is not None and now < since + sizing.wait_s:
        return Wait(
            since + sizing.wait_s,
            f"{free} of {sizing.nodes} nodes free for attempt {begin.number}: waiting up to "
            f"{sizing.wait_s:g}s for more before resuming on fewer (min_nodes={sizing.min_nodes})",
        )
    nodes = max(free, sizing.min_nodes)
    why = f"{begin.why}; elastic resume on {nodes} of {sizing.nodes} nodes ({free} free, min_nodes={sizing.min_nodes})"
    return replace(begin, nodes=nodes, why=why)


def _stopped(reason: str, now: float, by: str) -> End:
    return End(str(FailureKind.STOPPED), Verdict.FAIL, reason, at=now, by=by)


def _still_admitted(attempt: Attempt) -> bool:
    """A failed attempt's Workload that nobody deactivated yet: a resume deactivates it first, so that
    Kueue holds no quota and no pod for it while the next attempt starts."""
    return attempt.state is State.FAILED and attempt.workload is not None and attempt.stopped_by is None


def ledger_excluded(ledger: Ledger, end: End) -> dict[str, str]:
    """The nodes the next attempt is kept off: the newest attempt's, and the culprits and the nodes its
    own step times showed slow (``End.slowed``) of its end."""
    newest = ledger.newest
    return {**(newest.kept_out if newest else {}), **end.slowed, **end.culprits}


def verdict_of(failure: Failure, ledger: Ledger, budget: Budget, options: Options) -> tuple[Verdict, str]:
    """What ``failure`` of the newest attempt calls for, and the message that says so.  A fault the pods
    printed but no node confirms is resumed while ``unconfirmed_fault_retries`` allows (then it counts as
    the user's code); the user's code fails at once unless ``fail_fast_on_user_error`` is off."""
    kind = failure.kind
    if kind is FailureKind.USER_CODE and failure.hints:
        used = budget.spent(ledger).unconfirmed + 1
        if used <= budget.unconfirmed_fault_retries:
            return Verdict.RESUME, (
                f"unconfirmed fault ({used} of {budget.unconfirmed_fault_retries} such retries): {failure.reason}"
            )
    if kind is FailureKind.USER_CODE:
        if options.fail_fast_on_user_error:
            return Verdict.FAIL, f"user code failed (no resume used): {failure.reason}"
        return Verdict.RESUME, f"{kind}: {failure.reason}"
    if kind in RETRYABLE:
        return Verdict.RESUME, f"{kind}: {failure.reason}"
    return Verdict.FAIL, f"{kind}: {failure.reason}"


def follower_failure(status: str, message: str) -> Failure | None:
    """The failure a follower's outcome is, when it is one without pods to classify (None: ``failed``
    and ``succeeded`` are judged on the cluster's objects)."""
    kinds = {
        "hang": FailureKind.HANG,
        "heartbeat_unreadable": FailureKind.HEARTBEAT_UNREADABLE,
        "start_timeout": FailureKind.START_TIMEOUT,
        "admission_timeout": FailureKind.ADMISSION_TIMEOUT,
        "pods_refused": FailureKind.PODS_REFUSED,
        "never_admitted": FailureKind.NEVER_ADMITTED,
        "deactivated": FailureKind.STOPPED,
        "kueue_deactivated": FailureKind.KUEUE_DEACTIVATED,
        "job_missing": FailureKind.INFRASTRUCTURE,
    }
    return Failure(kinds[status], message) if status in kinds else None
