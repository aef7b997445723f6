"""The bookkeeping of a run's attempts, kept in Airflow's task state store between tries (the trigger
holds it while it resumes the run and hands it back in its event).

One attempt is one Job.  The ledger is written *before* the Job is submitted (phase
``submitting``) and again after (``submitted``), so a worker that dies anywhere around the
submit leaves enough behind for the next try to find the Job by its deterministic name and
reattach to it instead of submitting a second one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum

UNRECORDED = "unrecorded"  # how an attempt ended that a trigger judged and resumed, its reasons lost


class Phase(StrEnum):
    SUBMITTING = "submitting"
    SUBMITTED = "submitted"
    ENDED = "ended"


@dataclass
class AttemptRecord:
    """One attempt; ``kind``: how it ended (``succeeded`` or a ``FailureKind``), ``ended``: why;
    ``hints``: what the failed pods printed about GPUs or NCCL (recorded, never used to blame a node);
    ``verdict``: what its failure called for (``retry``: a resume, or ``fail``);
    ``try_number``: the Airflow try that began it (a resume in the trigger belongs to the deferred try);
    ``began_at`` / ``ended_at``: when it was begun and when its end was seen (Unix time)."""

    number: int
    job: str
    phase: Phase
    resume_from: str | None = None
    resume_step: int | None = None
    resume_verified: str | None = None
    ended: str | None = None
    kind: str | None = None
    hints: list[str] = field(default_factory=list)
    verdict: str | None = None
    try_number: int = 1
    began_at: float | None = None
    ended_at: float | None = None

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)


@dataclass
class RunLedger:
    """Every attempt of one DAG run's training task, and the nodes kept out of it (node -> why)."""

    attempts: list[AttemptRecord] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)
    preemptions: int = 0

    @classmethod
    def from_dict(cls, data: Mapping | None) -> RunLedger:
        if not data:
            return cls()
        return cls(
            [AttemptRecord(**a) for a in data.get("attempts", [])],
            dict(data.get("excluded", {})),
            int(data.get("preemptions", 0)),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def current(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def live(self) -> AttemptRecord | None:
        """The last attempt when it has not ended: its Job may still be running (or about to be created)."""
        current = self.current
        return current if current is not None and current.phase is not Phase.ENDED else None

    def begin(
        self,
        job: str,
        resume_from: str | None,
        resume_step: int | None,
        verified: str | None,
        try_number: int,
    ) -> AttemptRecord:
        if self.live is not None:
            raise RuntimeError(f"attempt {self.live.number} (Job {self.live.job}) has not ended")
        record = AttemptRecord(
            len(self.attempts) + 1,
            job,
            Phase.SUBMITTING,
            resume_from,
            resume_step,
            verified,
            try_number=try_number,
            began_at=time.time(),
        )
        self.attempts.append(record)
        return record

    def next_number(self) -> int:
        return len(self.attempts) + 1

    def end(self, kind: str, why: str, hints: list[str] | None = None, seen_at: float | None = None) -> None:
        """End the current attempt; ``seen_at``: when its end was seen (default: now)."""
        current = self.current
        if current is not None:
            current.phase, current.kind, current.ended = Phase.ENDED, str(kind), why
            current.hints, current.ended_at = list(hints or []), seen_at or time.time()

    def exclude(self, node: str, why: str) -> None:
        self.excluded.setdefault(node, why)

    @property
    def resumes_used(self) -> int:
        """Attempts after the first (each is one resume)."""
        return max(0, len(self.attempts) - 1)

    def resumes_since(self, first_try: int) -> int:
        """Resumes counted against the budget: attempts begun by try ``first_try`` or later (the run's
        start or its last Clear), less the first of them (a Clear's resume comes with a fresh budget)."""
        return max(0, sum(1 for a in self.attempts if a.try_number >= first_try) - 1)
