"""The attempt ledger, read from the cluster: one attempt is one Job, and the Job says what is known about it.

Nothing else stores the ledger: every caller (a try, the trigger, the run view, the reaper) reads it
from the run's Jobs with ``read_ledger``, so what one of them sees is what the others see.  A Job
carries, in its label ``trainops.io/attempt`` and in annotations written when it is created
(``job.build_job``):

- ``trainops.io/resume-from``: the checkpoint it resumed from (none: a fresh start);
- ``trainops.io/kept-out``: the nodes kept off it (its node affinity) and why, as JSON;
- ``trainops.io/begun``: the Airflow try that began it, when, and the resume budget spent with it
  (JSON ``{"try", "at", "since_try", "resumes", "unconfirmed"}``, see ``Spent``; ``begun_annotation``),

and its ``spec.completions``: how many nodes the attempt trains on (fewer than the run's after an
elastic resume).  Once its end is judged (``end_annotation``, one patch: the only write to a Job
after its creation):

- ``trainops.io/end``: how it ended, the verdict (``succeeded``, ``resume`` or ``fail``), why, the
  culprit nodes, what its pods printed about GPUs (hints), when, and the Kueue preemptions it rode out;
- ``trainops.io/run-stopped``: on the newest attempt when the run was stopped (the task killed, the run
  torn down or reaped): who stopped it.  No attempt of the same budget may run after it.

A Job the cluster no longer has (deleted, or garbage-collected by a TTL policy) leaves a gap in the
numbers: that attempt is ``gone``, and what the next Job carries (its kept-out nodes, the budget spent)
still holds.  Annotations are written by trainops but readable and writable by anyone who may edit
Jobs: each is parsed with a size bound, and one that cannot be read is reported on its attempt
(``problems``) and ignored (an unreadable end is judged again).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from trainops.checkpoints.formats.base import step_from_name
from trainops.conventions import KUEUE_JOB_UID_LABEL
from trainops.kube.kueue import deactivation_message, workload_facts
from trainops.training.job import (
    ATTEMPT_LABEL,
    KEPT_OUT_ANNOTATION,
    MAX_KEPT_OUT,
    RESUME_ANNOTATION,
    condition,
)

BEGUN_ANNOTATION = "trainops.io/begun"
END_ANNOTATION = "trainops.io/end"
RUN_STOPPED_ANNOTATION = "trainops.io/run-stopped"
# Bounds: what trainops writes always fits what it reads back (the texts and lists are cut to them).
MAX_END = 48 << 10  # characters of trainops.io/end: a reason, 64 culprits, 64 slowed and 16 hints fit
MAX_REASON = 1000  # characters of an end's reason
MAX_ITEM = 200  # characters of a culprit's evidence or a hint (node names: 253 at most, as the API's)
MAX_CULPRITS, MAX_HINTS = 64, 16


class State(StrEnum):
    """Where an attempt's Job is, as the cluster shows it."""

    RUNNING = "running"  # not finished and not stopped: queued, admitted, running
    STOPPED = "stopped"  # its Workload was deactivated (or the Job is being deleted), not finished yet
    SUCCEEDED = "succeeded"  # Job Complete
    FAILED = "failed"  # Job Failed
    GONE = "gone"  # no Job (deleted, garbage-collected)


class Verdict(StrEnum):
    """What an attempt's end calls for."""

    SUCCEEDED = "succeeded"
    RESUME = "resume"
    FAIL = "fail"


@dataclass(frozen=True)
class Spent:
    """The resume budget spent when an attempt began, counting its own begin: ``resumes`` (every resume)
    and ``unconfirmed`` (resumes after a GPU/NCCL fault no node confirmed), since try ``since_try`` (the
    run's start or its last Clear: both budgets reset there, see ``decide.Budget``)."""

    since_try: int = 1
    resumes: int = 0
    unconfirmed: int = 0


@dataclass(frozen=True)
class End:
    """How an attempt ended, as judged: ``kind`` (``succeeded`` or a ``FailureKind``), the ``verdict``,
    ``reason``, ``culprits`` (node -> the evidence against it), ``hints`` (what the pods printed about
    GPUs or NCCL: never enough to blame a node), ``at`` (when the end was seen, Unix time),
    ``preemptions`` (Kueue preemptions it was requeued after), ``by`` (who judged it) and ``slowed``
    (node -> its step times against the run's, ``trainops.health.slowdown``: kept out, not blamed)."""

    kind: str
    verdict: Verdict
    reason: str
    culprits: Mapping[str, str] = field(default_factory=dict)
    hints: tuple[str, ...] = ()
    at: float | None = None
    preemptions: int = 0
    by: str = ""
    slowed: Mapping[str, str] = field(default_factory=dict)

    @property
    def unconfirmed(self) -> bool:
        """A resume of a failure whose pods printed GPU/NCCL errors no node confirmed."""
        return self.verdict is Verdict.RESUME and self.kind == "user_code" and bool(self.hints)


@dataclass(frozen=True)
class Attempt:
    """One attempt as its Job shows it (``job`` may be ``gone``).  ``began_by_try``, ``began_at`` and
    ``spent`` are None for a Job that does not say (gone, or not made by trainops); ``workload``: its
    Kueue Workload; ``stopped_by``: who deactivated that Workload (``kueue.BY_KUEUE`` or ``BY_USER``: any
    other program, trainops included) and ``stop_reason`` how it says so; ``finished_at``: when the Job completed, failed or was suspended (stopped), Unix seconds."""

    number: int
    job: str
    state: State = State.GONE
    began_by_try: int | None = None
    began_at: float | None = None
    created_at: float | None = None
    finished_at: float | None = None
    resume_from: str | None = None
    kept_out: Mapping[str, str] = field(default_factory=dict)
    spent: Spent | None = None
    end: End | None = None
    workload: str | None = None
    stopped_by: str | None = None
    stop_reason: str | None = None
    run_stopped: str | None = None
    problems: tuple[str, ...] = ()
    nodes: int | None = None  # how many nodes (pods) it trains on: its Job's completions

    @property
    def resume_step(self) -> int | None:
        uri = self.resume_from
        return step_from_name(uri.rstrip("/").rpartition("/")[2]) if uri else None

    @property
    def live(self) -> bool:
        """Its Job exists and has not ended: following it, or stopping it, is still to do."""
        return self.state in (State.RUNNING, State.STOPPED)

    def to_dict(self) -> dict[str, Any]:
        """The attempt as the task's result and the run view show it."""
        end = self.end
        return {
            "number": self.number,
            "job": self.job,
            "state": str(self.state),
            "try_number": self.began_by_try,
            "began_at": self.began_at if self.began_at is not None else self.created_at,
            "ended_at": (end.at if end.at is not None else self.finished_at) if end else None,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "resume_from": self.resume_from,
            "resume_step": self.resume_step,
            "nodes": self.nodes,
            "kept_out": dict(self.kept_out),
            "kind": end.kind if end else None,
            "verdict": str(end.verdict) if end else None,
            "ended": end.reason if end else None,
            "culprits": dict(end.culprits) if end else {},
            "slowed": dict(end.slowed) if end else {},
            "hints": list(end.hints) if end else [],
            "preemptions": end.preemptions if end else 0,
            "run_stopped": self.run_stopped,
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Ledger:
    """Every attempt of one run, by number (gaps filled with ``gone`` attempts)."""

    attempts: tuple[Attempt, ...] = ()

    @property
    def newest(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def excluded(self) -> dict[str, str]:
        """The nodes kept out of the run from now on and why: the newest attempt's, and its culprits."""
        newest = self.newest
        if newest is None:
            return {}
        end = newest.end
        return {**newest.kept_out, **(end.slowed if end else {}), **(end.culprits if end else {})}

    @property
    def preemptions(self) -> int:
        return sum(a.end.preemptions for a in self.attempts if a.end)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempts": [a.to_dict() for a in self.attempts],
            "excluded": self.excluded,
            "preemptions": self.preemptions,
        }


# ---- writing -----------------------------------------------------------------------------------
def _cut(text: Any, limit: int = MAX_ITEM) -> str:
    return str(text)[:limit]


def begun_annotation(try_number: int, at: float, spent: Spent) -> dict[str, str]:
    """The annotation of a new attempt's Job that says who began it, when, and the budget it spent
    (``job.build_job`` writes where it resumes from and the nodes kept out)."""
    return {
        BEGUN_ANNOTATION: json.dumps({"try": try_number, "at": at, **asdict(spent)}, separators=(",", ":"))
    }


def run_stopped_annotation(by: str) -> dict[str, str]:
    """The annotation that marks the run stopped on its newest attempt."""
    return {RUN_STOPPED_ANNOTATION: _cut(by) or "stopped"}


def end_annotation(end: End) -> dict[str, str]:
    """The annotation that records a judged end."""
    data = {
        "kind": _cut(end.kind),
        "verdict": str(end.verdict),
        "reason": _cut(end.reason, MAX_REASON),
        "culprits": {_cut(node, 253): _cut(why) for node, why in sorted(end.culprits.items())[:MAX_CULPRITS]},
        "hints": [_cut(h) for h in end.hints[:MAX_HINTS]],
        "at": end.at,
        "preemptions": end.preemptions,
        "by": _cut(end.by),
        "slowed": {_cut(node, 253): _cut(why) for node, why in sorted(end.slowed.items())[:MAX_CULPRITS]},
    }
    return {END_ANNOTATION: json.dumps(data, separators=(",", ":"))}


# ---- reading -----------------------------------------------------------------------------------
class Unreadable(ValueError):
    """An annotation that is not what trainops writes; the message names it and why."""


def _json(annotations: Mapping[str, str], key: str, limit: int) -> Any:
    raw = annotations.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or len(raw) > limit:
        raise Unreadable(f"{key} is over the {limit}-character limit")
    try:
        return json.loads(raw)
    except ValueError as error:
        raise Unreadable(f"{key} is not JSON: {error}") from None


def _int(data: Mapping, key: str, where: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Unreadable(f"{where}.{key} must be a non-negative integer, got {value!r}")
    return value


def _time(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Unreadable(f"{where} must be Unix seconds, got {value!r}")
    return float(value)


def _texts(value: Any, where: str, most: int | None = None) -> dict[str, str]:
    if not isinstance(value, Mapping) or (most is not None and len(value) > most):
        raise Unreadable(f"{where} must map {f'at most {most} ' if most else ''}node names to reasons")
    return {_cut(k, 253): _cut(v) for k, v in value.items()}


def parse_end(annotations: Mapping[str, str]) -> End | None:
    """The judged end a Job's annotations record (None: not judged yet); raises ``Unreadable``."""
    data = _json(annotations, END_ANNOTATION, MAX_END)
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise Unreadable(f"{END_ANNOTATION} must be a JSON object")
    try:
        verdict = Verdict(data.get("verdict"))
    except ValueError:
        raise Unreadable(f"{END_ANNOTATION}.verdict must be one of {[str(v) for v in Verdict]}") from None
    hints = data.get("hints") or []
    if not isinstance(hints, list) or len(hints) > MAX_HINTS:
        raise Unreadable(f"{END_ANNOTATION}.hints must be a list of at most {MAX_HINTS} lines")
    return End(
        kind=_cut(data.get("kind") or ""),
        verdict=verdict,
        reason=_cut(data.get("reason") or "", MAX_REASON),
        culprits=_texts(data.get("culprits") or {}, f"{END_ANNOTATION}.culprits", MAX_CULPRITS),
        hints=tuple(_cut(h) for h in hints),
        at=_time(data.get("at"), f"{END_ANNOTATION}.at"),
        preemptions=_int(data, "preemptions", END_ANNOTATION, 0),
        by=_cut(data.get("by") or ""),
        slowed=_texts(data.get("slowed") or {}, f"{END_ANNOTATION}.slowed", MAX_CULPRITS),
    )


def timestamp(value: Any) -> float | None:
    """An API timestamp (RFC 3339, e.g. ``creationTimestamp``) as Unix seconds; None when it is not one."""
    try:
        return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else None
    except ValueError:
        return None


def _state(job: Mapping, workload: Mapping | None) -> tuple[State, str | None, str | None]:
    """The Job's state, and who deactivated its Workload and how (read by meaning, any Job state)."""
    stopped_by = stop_reason = None
    if workload is not None:
        facts = workload_facts(workload)
        if facts.deactivated_by is not None:  # Kueue's own (its requeuing limit...), or anyone else's
            stopped_by, stop_reason = facts.deactivated_by, deactivation_message(facts)
    if condition(job, "Complete"):
        return State.SUCCEEDED, stopped_by, stop_reason
    if condition(job, "Failed"):
        return State.FAILED, stopped_by, stop_reason
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return State.STOPPED, stopped_by or "user", stop_reason or "the Job is being deleted"
    return (State.STOPPED if stopped_by else State.RUNNING), stopped_by, stop_reason


def read_attempt(job: Mapping, workload: Mapping | None = None) -> Attempt:
    """One attempt from its Job (and its Kueue Workload, when it has one)."""
    meta = job.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    number = int((meta.get("labels") or {}).get(ATTEMPT_LABEL, "0"))
    state, stopped_by, stop_reason = _state(job, workload)
    problems: list[str] = []
    began_by_try = began_at = spent = end = None
    kept_out: dict[str, str] = {}
    try:
        begun = _json(annotations, BEGUN_ANNOTATION, MAX_ITEM)
        if begun is not None:
            if not isinstance(begun, Mapping):
                raise Unreadable(f"{BEGUN_ANNOTATION} must be a JSON object")
            began_by_try = _int(begun, "try", BEGUN_ANNOTATION)
            began_at = _time(begun.get("at"), f"{BEGUN_ANNOTATION}.at")
            spent = Spent(
                _int(begun, "since_try", BEGUN_ANNOTATION, began_by_try),
                _int(begun, "resumes", BEGUN_ANNOTATION, 0),
                _int(begun, "unconfirmed", BEGUN_ANNOTATION, 0),
            )
    except Unreadable as error:
        problems.append(str(error))
    try:
        raw = _json(annotations, KEPT_OUT_ANNOTATION, MAX_KEPT_OUT) or {}
        kept_out = _texts(raw, KEPT_OUT_ANNOTATION)
    except Unreadable as error:
        problems.append(str(error))
    try:
        end = parse_end(annotations)
    except Unreadable as error:
        problems.append(f"{error}; the end is judged again")
    completions = (job.get("spec") or {}).get("completions")
    finished = condition(job, "Complete") or condition(job, "Failed") or condition(job, "Suspended")
    return Attempt(
        number=number,
        job=str(meta.get("name") or ""),
        state=state,
        began_by_try=began_by_try,
        began_at=began_at,
        created_at=timestamp(meta.get("creationTimestamp")),
        finished_at=timestamp((finished or {}).get("lastTransitionTime")),
        resume_from=str(annotations.get(RESUME_ANNOTATION) or "")[:MAX_REASON] or None,
        kept_out=kept_out,
        spent=spent,
        end=end,
        workload=(workload or {}).get("metadata", {}).get("name"),
        stopped_by=stopped_by,
        stop_reason=stop_reason,
        run_stopped=_cut(annotations[RUN_STOPPED_ANNOTATION])
        if annotations.get(RUN_STOPPED_ANNOTATION)
        else None,
        problems=tuple(problems),
        nodes=completions if isinstance(completions, int) and not isinstance(completions, bool) else None,
    )


def read_ledger(
    jobs: Iterable[Mapping],
    workloads: Iterable[Mapping] = (),
    job_name: Any = None,
    known: Sequence[Attempt] = (),
) -> Ledger:
    """The run's ledger from its Jobs and their Workloads (matched by the Job's uid); numbers with no
    Job are ``gone`` (named by ``job_name(number)`` when given).  ``known``: attempts this process saw
    whose Jobs are gone since (what the follower saw of a Job deleted under it)."""
    by_uid = {(w.get("metadata") or {}).get("labels", {}).get(KUEUE_JOB_UID_LABEL): w for w in workloads}
    found: dict[int, Attempt] = {}
    for job in jobs:
        attempt = read_attempt(job, by_uid.get((job.get("metadata") or {}).get("uid")))
        if attempt.number > 0:
            found[attempt.number] = attempt
    for attempt in known:
        if attempt.number not in found:
            found[attempt.number] = replace(attempt, state=State.GONE)
    top = max(found, default=0)
    return Ledger(
        tuple(
            found.get(n) or Attempt(n, job_name(n) if job_name else "", State.GONE) for n in range(1, top + 1)
        )
    )
