"""Find the newest checkpoint under a run path that verifies, falling back newest-first."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from trainops.checkpoints.formats.base import METADATA, step_from_name
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri
from trainops.checkpoints.verify import VerifyResult, check_level, verify_checkpoint

MAX_SKIPPED = 10


@dataclass
class LatestResult:
    """The newest verified checkpoint (None when none verifies) and the newer ones skipped: the
    newest ``MAX_SKIPPED`` of them in ``skipped``, how many in all in ``skipped_count``."""

    run_uri: str
    checkpoint: VerifyResult | None
    skipped: list[VerifyResult] = field(default_factory=list)
    skipped_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_uri": self.run_uri,
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "skipped": [result.to_dict() for result in self.skipped],
            "skipped_count": self.skipped_count,
        }


def latest_verified(
    run_uri: str | S3Uri,
    *,
    level: str = METADATA,
    store: CheckpointStore | None = None,
    newer_than_step: int | None = None,
) -> LatestResult:
    """Verify the run's checkpoints newest first (by the step in their names) and stop at the first good one.

    Directories whose names carry no step (``step-N``, ``checkpoint-N``, ``iter_N``,
    ``global_stepN``, ``...step=N...``) are not checkpoints and are ignored, and so are those at or
    below ``newer_than_step``.
    """
    check_level(level)
    run = S3Uri.parse(run_uri, field="run_uri") if isinstance(run_uri, str) else run_uri
    store = store or CheckpointStore()
    names, objects = store.list_dir(run)
    sibling_names = {info.key[len(run.prefix) :] for info in objects}
    candidates = sorted(
        (
            (step, name)
            for name in names
            if (step := step_from_name(name)) is not None
            and (newer_than_step is None or step > newer_than_step)
        ),
        reverse=True,
    )
    result = LatestResult(str(run), None)
    for _, name in candidates:
        verdict = verify_checkpoint(run.child(name), level=level, store=store, sibling_names=sibling_names)
        if verdict.ok:
            result.checkpoint = verdict
            break
        result.skipped_count += 1
        if len(result.skipped) < MAX_SKIPPED:
            result.skipped.append(verdict)
    return result


def fresh_checkpoint(
    run_uri: str | S3Uri,
    *,
    newer_than_step: int | None = None,
    max_age: timedelta | None = None,
    level: str = METADATA,
    store: CheckpointStore | None = None,
) -> VerifyResult | None:
    """The latest verified checkpoint if it is past ``newer_than_step`` and younger than ``max_age``
    (the checkpoints at or below ``newer_than_step`` are not verified at all)."""
    latest = latest_verified(run_uri, level=level, store=store, newer_than_step=newer_than_step).checkpoint
    if latest is None:
        return None
    if max_age is not None and datetime.now(UTC) - latest.last_modified > max_age:
        return None
    return latest
