"""Verify one checkpoint directory in S3 at a level: structural, metadata (default) or deep.

- ``structural``: the listing only (plus tracker files): required files present, completion
  signal present, no ``-unfinished`` marker.
- ``metadata``: also reads the small metadata objects (manifest and ``_COMMITTED``, DCP
  ``.metadata``, ``trainer_state.json``, safetensors headers) and checks every file's size and
  ETag from the listing against them.  No request per shard; the commonest ones are read together.
- ``deep``: also streams every object and recomputes its ETag and S3 checksum.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from trainops.checkpoints import formats, integrity
from trainops.checkpoints.formats.base import DEEP, LEVELS, METADATA, STRUCTURAL, Checkpoint, step_from_name
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri
from trainops.errors import TemporaryError

MAX_REASONS = 20
MAX_REASON_CHARS = 512


@dataclass
class VerifyResult:
    """The verdict on one checkpoint; ``ok`` is True only when ``reasons`` is empty."""

    uri: str
    format: str
    level: str
    step: int | None
    bytes: int
    files: int
    last_modified: datetime | None
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (for XCom, ``--json`` and logs)."""
        data = asdict(self)
        data["ok"] = self.ok
        data["last_modified"] = self.last_modified.isoformat() if self.last_modified else None
        return data

    def summary(self) -> str:
        verdict = "verified" if self.ok else "NOT verified"
        return (
            f"{self.uri} {verdict} at {self.level} level: format={self.format} step={self.step} "
            f"files={self.files} bytes={self.bytes}"
        )


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}; got {level!r}")
    return level


def verify_checkpoint(
    uri: str | S3Uri,
    *,
    level: str = METADATA,
    store: CheckpointStore | None = None,
    sibling_names: set[str] | None = None,
) -> VerifyResult:
    """Verify the checkpoint directory at ``uri``.

    ``sibling_names`` (the names of the files directly in the parent directory) saves requests
    when the caller has listed the parent already.
    """
    check_level(level)
    if isinstance(uri, str):
        uri = S3Uri.parse(uri)
    if not uri.prefix:
        raise ValueError(
            f"uri must name a checkpoint directory inside the bucket, not the bucket root: {uri}"
        )
    store = store or CheckpointStore()
    files = {info.key[len(uri.prefix) :]: info for info in store.list(uri)}
    checkpoint = Checkpoint(store, uri, files, sibling_names)
    result = VerifyResult(
        uri=str(uri),
        format="none",
        level=level,
        step=step_from_name(uri.name),
        bytes=sum(info.size for info in files.values()),
        files=len(files),
        last_modified=max((info.last_modified for info in files.values()), default=None),
    )
    if not files:
        result.reasons = [f"no objects under {uri}"]
        return result
    try:
        with ThreadPoolExecutor(len(formats.PREFETCH)) as pool:
            if level != STRUCTURAL:
                checkpoint.prefetch(formats.PREFETCH, pool)
            result.format, reasons = formats.check(checkpoint, level)
        if level == DEEP and not reasons:
            reasons = integrity.check_contents(store, uri, files)
    except _UNAVAILABLE:
        raise  # S3 itself failed: the retry decides, the checkpoint is not judged on it
    except Exception as error:  # anything its bytes provoke condemns this checkpoint only
        reasons = [f"unreadable checkpoint: {type(error).__name__}: {error}"]
    result.reasons = _capped(reasons)
    return result


_UNAVAILABLE = (TemporaryError, BotoCoreError, ClientError)


def _capped(reasons: list[str]) -> list[str]:
    """At most ``MAX_REASONS`` reasons of at most ``MAX_REASON_CHARS`` characters each."""
    shown = [_shortened(str(reason)) for reason in reasons[:MAX_REASONS]]
    if len(reasons) > MAX_REASONS:
        shown.append(f"... and {len(reasons) - MAX_REASONS} more")
    return shown


def _shortened(reason: str) -> str:
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return f"{reason[: MAX_REASON_CHARS - 30]}... ({len(reason)} characters)"
