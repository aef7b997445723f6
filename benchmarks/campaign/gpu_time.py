"""One run's GPU-seconds: held, useful, and the rest by cause, from what the cluster and the heartbeat showed.

Held: each node's GPUs from the moment the run's claim names it to the moment the node is free again.
Useful: the step time of the steps that reach the final checkpoint, on the gang's GPUs.  Everything else
held is accounted to one cause, by cutting the run's time at what was seen (a ``RunTimes``):

    first node held --claim--> attempt 1's Job --start--> its first step ... training ...
    failure --detection--> seen ended --judgement--> next Job --re-admission--> admitted
           --waiting for nodes--> pods running --re-rendezvous--> first step ... training ...
    final checkpoint --teardown--> last node free

While a gang trains, its GPUs' time is useful for the steps that reach the final checkpoint and
``recomputed`` for the others (steps past the checkpoint the next attempt resumed from: it does them
again); on a slowed GPU (speed ``s``) only ``s`` of a useful step's time is, the rest is ``slow steps``;
the held GPUs beyond the gang's are ``spare``.  A run that failed has no useful steps, and what
follows its last failure is ``failed``.  Time a run pays anyway while its task has no worker (killed,
not yet retried) is the ``dead worker``'s.

Every GPU-second held is useful or lost.  The ``SETUP`` phases (claim, start, spare, teardown) are what
a run without faults pays too: a policy's fault-free set-up is measured once (``Setup``, the mean of
its fault-free runs) and each run is charged only what its phases took beyond it (a fault that delays
the first step, a requeue, a spare held longer: all lost, under the phase they fell in).  So
``held = useful + runs x setup + lost`` exactly, for either policy.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

SETUP = ("claim", "start", "spare", "teardown")
FAULT = (
    "detection",
    "judgement",
    "re-admission",
    "waiting for nodes",
    "re-rendezvous",
    "recomputed",
    "slow steps",
    "dead worker",
    "failed",
)


@dataclass
class AttemptTimes:
    """One attempt (one Job) as seen: Unix times; ``beats``: its heartbeats (time, step), oldest first."""

    job: str
    created: float
    start_step: int = 0
    admitted: float | None = None  # Kueue admitted its Workload
    running: float | None = None  # all its pods Running
    beats: list[tuple[float, int]] = field(default_factory=list)
    failed_at: float | None = None  # the fault (or the failure seen first), None: it succeeded
    detected: float | None = None  # when the policy saw it had ended
    speed: float = (
        1.0  # its slowest rank's GPU speed (a slowed GPU's fault): the rest of its steps' time is lost
    )


@dataclass
class RunTimes:
    holds: dict[str, list[tuple[float, float]]]  # node -> [(held from, free again)]
    attempts: list[AttemptTimes]
    gang_gpus: int
    gpus_per_node: int = 8
    succeeded: bool = True
    final_step: int = 0
    dead: list[tuple[float, float]] = field(default_factory=list)  # no worker ran the task (killed, retried)


@dataclass(frozen=True)
class Setup:
    """A policy's fault-free set-up: GPU-seconds by ``SETUP`` phase, the mean of its fault-free runs (so
    that what those runs lose beyond it adds up to nothing)."""

    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SETUP, 0.0))
    runs: int = 0  # how many fault-free runs it is the mean of (0: none measured, nothing subtracted)

    @classmethod
    def measured(cls, accounts: list[Account]) -> Setup:
        if not accounts:
            return cls()
        return cls({p: statistics.fmean(a.causes[p] for a in accounts) for p in SETUP}, len(accounts))

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def to_dict(self) -> dict:
        return {
            "runs": self.runs,
            "total_gpu_s": round(self.total, 1),
            "by_phase_gpu_s": {phase: round(value, 1) for phase, value in self.phases.items()},
        }


@dataclass
class Account:
    """One run's GPU-seconds (or several runs' added up): held, useful, and by cause as measured."""

    held: float = 0.0
    useful: float = 0.0
    causes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SETUP + FAULT, 0.0))
    recoveries: list[float] = field(default_factory=list)
    redone_steps: int = 0  # steps a failed attempt had done past the checkpoint its successor resumed from
    setups: int = 1  # the fault-free set-ups it is charged beyond: its runs that held GPUs

    def charged(self, setup: Setup) -> dict[str, float]:
        """GPU-seconds lost by cause: each fault cause as measured, each set-up phase beyond what
        ``setups`` fault-free runs pay (negative where a fault shortened it, e.g. a spare put to work)."""
        return {
            cause: value - self.setups * setup.phases[cause] if cause in SETUP else value
            for cause, value in self.causes.items()
        }

    def lost(self, setup: Setup) -> float:
        """GPU-seconds lost: everything held that was neither useful nor the fault-free set-up."""
        return sum(self.charged(setup).values())

    def add(self, other: Account) -> None:
        self.held += other.held
        self.useful += other.useful
        for cause, value in other.causes.items():
            self.causes[cause] += value
        self.recoveries += other.recoveries
        self.redone_steps += other.redone_steps
        self.setups += other.setups

    def to_dict(self, setup: Setup) -> dict:
        lost = self.lost(setup)
        return {
            "held_gpu_s": round(self.held, 1),
            "useful_gpu_s": round(self.useful, 1),
            "setup_gpu_s": round(self.setups * setup.total, 1),
            "lost_gpu_s": round(lost, 1),
            "lost_per_1000": per_1000(lost, self.held),
            "redone_steps": self.redone_steps,
            "lost_by_cause_gpu_s": {cause: round(value, 1) for cause, value in self.charged(setup).items()},
        }


def per_1000(part: float, held: float) -> float | None:
    """GPU-hours of ``part`` per 1,000 GPU-hours held."""
    return round(1000 * part / held, 1) if held else None


def account(run: RunTimes) -> Account:
    result = Account()
    held_from = min((a for spans in run.holds.values() for a, _ in spans), default=None)
    held_to = max((b for spans in run.holds.values() for _, b in spans), default=None)
    if held_from is None:  # it never held a GPU: it paid no set-up either
        result.setups = 0
        return result
    result.held = _held(run, held_from, held_to)
    useful_ranges = _lineage(run)
    clock = Clock(run, held_from, result)
    attempts = run.attempts
    for index, attempt in enumerate(attempts):
        first = index == 0
        clock.to(attempt.created, "claim" if first else "judgement")
        if not first:
            clock.to(attempt.admitted, "re-admission")
            clock.to(attempt.running, "waiting for nodes")
        # an attempt that never stepped (it failed loading its checkpoint) ends its start at its failure
        clock.to(_training_start(attempt) or attempt.failed_at, "start" if first else "re-rendezvous")
        clock.train(attempt, _training_end(attempt), useful_ranges.get(index))
        if attempt.failed_at is not None:
            clock.to(attempt.detected, "detection")
            if index + 1 < len(attempts):
                reached = max((step for _, step in attempt.beats), default=attempt.start_step)
                result.redone_steps += max(0, reached - attempts[index + 1].start_step)
                if attempts[index + 1].beats:
                    result.recoveries.append(attempts[index + 1].beats[0][0] - attempt.failed_at)
    if attempts and attempts[-1].failed_at is not None:
        clock.to(held_to, "failed")
    clock.to(held_to, "teardown")
    return result


class Clock:
    """Walks the run's time forward, crediting each span's held GPU-seconds to a cause."""

    def __init__(self, run: RunTimes, now: float, result: Account) -> None:
        self.run, self.now, self.result = run, now, result

    def to(self, until: float | None, cause: str) -> None:
        """Credit now..``until`` to ``cause``; what a run pays anyway (``SETUP``) while its task had no
        worker (killed, not yet retried) is the ``dead worker``'s."""
        if until is None or until <= self.now:
            return
        if cause in SETUP:
            for start, end in sorted(self.run.dead):
                start, end = max(start, self.now), min(end, until)
                if start < end:
                    self.to(start, cause)
                    self.result.causes["dead worker"] += _held(self.run, start, end)
                    self.now = end
        if until > self.now:
            self.result.causes[cause] += _held(self.run, self.now, until)
            self.now = until

    def train(self, attempt: AttemptTimes, until: float, useful: tuple[int, int] | None) -> None:
        """From now to ``until`` the gang trained: useful for the steps in ``useful``, recomputed otherwise."""
        if until <= self.now:
            return
        span, held = until - self.now, _held(self.run, self.now, until)
        gang = min(self.run.gang_gpus * span, held)
        kept = 0.0
        if useful is not None:
            start = max(self.now, min(until, _time_of(attempt, useful[0])))
            end = max(start, min(until, _time_of(attempt, useful[1], last=True)))
            kept = gang * (end - start) / span
        self.result.useful += kept * attempt.speed
        self.result.causes["slow steps"] += kept * (1 - attempt.speed)
        self.result.causes["recomputed"] += gang - kept
        self.result.causes["spare"] += held - gang
        self.now = until


def _held(run: RunTimes, start: float, end: float) -> float:
    return run.gpus_per_node * sum(
        max(0.0, min(end, b) - max(start, a)) for spans in run.holds.values() for a, b in spans
    )


def _lineage(run: RunTimes) -> dict[int, tuple[int, int]]:
    """Attempt index -> the steps (from, to] of it that reach the final checkpoint (none: a failed run)."""
    if not run.succeeded or not run.attempts:
        return {}
    ranges, upper = {}, run.final_step
    for index in range(len(run.attempts) - 1, -1, -1):
        start = run.attempts[index].start_step
        if run.attempts[index].beats and start < upper:  # one that never stepped wrote nothing
            ranges[index], upper = (start, upper), start
    return ranges


def _step_seconds(attempt: AttemptTimes) -> float | None:
    pairs = zip(attempt.beats, attempt.beats[1:], strict=False)
    rates = [(t2 - t1) / (s2 - s1) for (t1, s1), (t2, s2) in pairs if s2 > s1]
    return statistics.median(rates) if rates else None


def _training_start(attempt: AttemptTimes) -> float | None:
    """When its first step began: its first heartbeat less the steps before it at its step time."""
    if not attempt.beats:
        return None
    at, step = attempt.beats[0]
    per_step = _step_seconds(attempt) or 0.0
    floor = attempt.running or attempt.created
    return max(floor, at - (step - attempt.start_step) * per_step)


def _training_end(attempt: AttemptTimes) -> float:
    """Its last progress: the failure, else its last heartbeat."""
    last = attempt.beats[-1][0] if attempt.beats else attempt.created
    return max(last, attempt.failed_at) if attempt.failed_at is not None else last


def _time_of(attempt: AttemptTimes, step: int, last: bool = False) -> float:
    """When the attempt reached ``step`` (interpolated between heartbeats, extrapolated past them);
    ``last``: when it was last at it (its heartbeats after saving the checkpoint of that step)."""
    points = [(_training_start(attempt), attempt.start_step), *attempt.beats]
    if last and (at := [t for t, s in points if s == step]):
        return max(at)
    for (t1, s1), (t2, s2) in zip(points, points[1:], strict=False):
        if s1 <= step <= s2 and s2 > s1:
            return t1 + (t2 - t1) * (step - s1) / (s2 - s1)
    t, s = points[-1] if step > points[-1][1] else points[0]
    return t + (step - s) * (_step_seconds(attempt) or 0.0)
