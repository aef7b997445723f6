"""The training-side helper: commit checkpoints, report progress, find where to resume.

Importable in a training image with only boto3 installed (no Airflow)::

    from trainops.checkpoints.helper import commit, heartbeat, resume_from

    start = resume_from()                      # None on a fresh start
    ...
    heartbeat(step, ranks=world_size)          # every few steps
    heartbeat(step, ranks=world_size, node_step_s=gather_step_seconds(compute_s))  # and how fast each node was
    heartbeat(step, ranks=world_size, saving=True, phase="checkpoint")
    save_checkpoint(f"{run_uri}step-{step}/")  # the framework's own save
    commit(f"{run_uri}step-{step}/", step=step)

Environment: ``TRAINOPS_RUN_URI`` (the run path), ``TRAINOPS_RESUME_FROM`` (set by the
orchestrator, empty on a fresh start), and boto3's usual AWS variables (``AWS_ENDPOINT_URL_S3``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainops.checkpoints.formats.base import METADATA, step_from_name
from trainops.checkpoints.formats.manifest import (
    COMMITTED_FILE,
    COMMITTED_READ_LIMIT,
    MANIFEST_FILE,
    MANIFEST_READ_LIMIT,
    build_committed,
    build_manifest,
    digest,
)
from trainops.checkpoints.latest import latest_verified
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri
from trainops.errors import PermanentError

RUN_URI_ENV = "TRAINOPS_RUN_URI"
RESUME_FROM_ENV = "TRAINOPS_RESUME_FROM"
HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_LIMIT = 64 << 10  # heartbeat() writes ~200 bytes plus the trainer's ``extra``
CLOCK_SKEW_S = 300.0  # how far ahead of a reader's clock a trainer's may run
SHOWN = 120  # characters of a bad value quoted in an error


class CommitConflict(PermanentError):
    """``_COMMITTED`` exists for a different manifest: the files changed after the first commit."""


@dataclass(frozen=True)
class CommitResult:
    uri: str
    written: bool  # False when the checkpoint was already committed (a retry or a concurrent commit)
    manifest_sha256: str
    files: int
    bytes: int


def commit(
    checkpoint_uri: str, *, step: int | None = None, store: CheckpointStore | None = None
) -> CommitResult:
    """Commit a saved checkpoint: write ``trainops-manifest.json``, then ``_COMMITTED``, each exactly once.

    Call it on one rank after every rank's save has finished.  Safe to retry and to race: both are
    written with ``If-None-Match: *``, so a committed checkpoint's manifest is never replaced and
    every call over the same files returns normally.  Raises CommitConflict when an existing
    manifest or commit names other file contents.
    """
    uri = S3Uri.parse(checkpoint_uri, field="checkpoint_uri")
    store = store or CheckpointStore()
    existing = store.read(uri.bucket, uri.key(COMMITTED_FILE), limit=COMMITTED_READ_LIMIT)
    if existing is not None:
        return _already_committed(uri, existing, None)
    files = [(info.key[len(uri.prefix) :], info) for info in store.list(uri)]
    if not any(rel not in (MANIFEST_FILE, COMMITTED_FILE) for rel, _ in files):
        raise ValueError(f"checkpoint_uri {uri} holds no files: save the checkpoint before committing it")
    manifest = build_manifest(files, step if step is not None else step_from_name(uri.name))
    if not store.put_if_absent(uri.bucket, uri.key(MANIFEST_FILE), manifest):
        _check_stored_manifest(uri, store, manifest)
    committed = build_committed(manifest)
    if store.put_if_absent(uri.bucket, uri.key(COMMITTED_FILE), committed):
        return _result(uri, True, committed)
    existing = store.read(uri.bucket, uri.key(COMMITTED_FILE), limit=COMMITTED_READ_LIMIT)
    return _already_committed(uri, existing, digest(manifest))


def _check_stored_manifest(uri: S3Uri, store: CheckpointStore, manifest: bytes) -> None:
    """A manifest is never overwritten (an overwrite could unverify a committed checkpoint): one
    already stored must be ours byte for byte, or its commit must be ours."""
    stored = store.read(uri.bucket, uri.key(MANIFEST_FILE), limit=MANIFEST_READ_LIMIT)
    if stored == manifest:
        return
    existing = store.read(uri.bucket, uri.key(COMMITTED_FILE), limit=COMMITTED_READ_LIMIT)
    if existing is not None:
        _already_committed(uri, existing, digest(manifest))
    raise CommitConflict(
        f"{uri} already has a {MANIFEST_FILE} for other files and no {COMMITTED_FILE}: another commit is "
        f"in flight or one crashed before the files changed; if none is running, delete "
        f"{uri.key(MANIFEST_FILE)} and commit again"
    )


def _already_committed(uri: S3Uri, committed: bytes, our_digest: str | None) -> CommitResult:
    result = _result(uri, False, committed)
    if our_digest is not None and result.manifest_sha256 != our_digest:
        raise CommitConflict(
            f"{uri} was already committed with manifest {result.manifest_sha256}, but its files now give "
            f"{our_digest}: the checkpoint changed after it was committed; save it under a new step"
        )
    return result


def _result(uri: S3Uri, written: bool, committed: bytes) -> CommitResult:
    body = json.loads(committed)
    return CommitResult(str(uri), written, body["manifest_sha256"], body["files"], body["bytes"])


_saving_since: dict[str, float] = {}  # run path -> when this process's save in progress began
_last_save_s: dict[str, float] = {}  # run path -> how long this process's newest save took


def heartbeat(
    step: int,
    *,
    ranks: int | None = None,
    saving: bool = False,
    phase: str = "train",
    run_uri: str | None = None,
    extra: dict[str, Any] | None = None,
    store: CheckpointStore | None = None,
    node_step_s: Mapping[int | str, float] | None = None,
) -> dict[str, Any]:
    """Write ``heartbeat.json`` under the run path and return what was written.

    ``saving=True`` (with e.g. ``phase="checkpoint"``) tells a watcher a save is in progress,
    so it pauses hang detection until the next heartbeat with ``saving=False``; from then on each
    heartbeat carries ``last_save_s``: how long the newest save blocked training (the run view and the
    fault campaign advise the checkpoint interval from it: ``trainops.checkpoints.interval``).
    ``node_step_s``: per node rank (``NODE_RANK``), the seconds its GPUs spent computing a step
    (:func:`gather_step_seconds` collects it); trainops keeps a node that is much slower than the
    run's others out of the run's next resume and of the next run (``trainops.health.slowdown``).
    """
    run = S3Uri.parse(run_uri or _require_env(RUN_URI_ENV), field="run_uri")
    now = time.time()
    if saving:
        _saving_since.setdefault(str(run), now)
    elif (began := _saving_since.pop(str(run), None)) is not None:
        _last_save_s[str(run)] = round(now - began, 3)
    if not saving and str(run) in _last_save_s:
        extra = {"last_save_s": _last_save_s[str(run)], **(extra or {})}
    document = {
        "step": int(step),
        "time": now,
        "time_iso": datetime.fromtimestamp(now, UTC).isoformat(),
        "ranks": ranks,
        "saving": saving,
        "phase": phase,
        **({"node_step_s": {str(rank): float(s) for rank, s in node_step_s.items()}} if node_step_s else {}),
        **(extra or {}),
    }
    (store or CheckpointStore()).put(run.bucket, run.key(HEARTBEAT_FILE), json.dumps(document).encode())
    return document


def gather_step_seconds(seconds: float) -> dict[str, float]:
    """Each node's compute seconds for its last step, from every rank's ``seconds``: call it on every
    rank (with torch.distributed initialised it is a collective); returns ``{node rank: seconds}``, a
    node as slow as its slowest rank. Time only the compute (forward and backward up to the
    gradients' all-reduce): a synchronous step's wall time is the slowest rank's on every rank."""
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    try:
        import torch.distributed as dist
    except ImportError:
        return {node: float(seconds)}
    if not (dist.is_available() and dist.is_initialized()):
        return {node: float(seconds)}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (node, float(seconds)))
    per_node: dict[str, float] = {}
    for rank_node, rank_seconds in everyone:
        per_node[rank_node] = max(per_node.get(rank_node, 0.0), rank_seconds)
    return per_node


def parse_heartbeat(body: bytes, where: str, now: float | None = None) -> dict[str, Any]:
    """A ``heartbeat.json`` document (training pods write it: hostile input), checked: a JSON object
    whose ``step`` is a non-negative integer and whose ``time`` is positive Unix seconds, no later than
    ``now + CLOCK_SKEW_S`` when ``now`` is given.  Raises ValueError naming the field and what was found."""

    def quote(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= SHOWN else text[:SHOWN] + "..."

    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise ValueError(
            f"{where} is not JSON ({error}); the trainer should write it with heartbeat()"
        ) from None
    if not isinstance(document, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(document).__name__}")
    step, at = document.get("step"), document.get("time")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"{where}: step must be a non-negative integer, got {quote(step)}")
    latest = float("inf") if now is None else now + CLOCK_SKEW_S
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 < at <= latest:
        bound = "" if now is None else f" no later than now (+{CLOCK_SKEW_S:g}s of clock skew)"
        raise ValueError(f"{where}: time must be Unix seconds{bound}, got {quote(at)}")
    return document


def read_heartbeat(store: CheckpointStore, run: S3Uri, now: float | None = None) -> dict[str, Any] | None:
    """The run's ``heartbeat.json``, checked (``parse_heartbeat``); None while there is none.  Read
    errors, an object over ``HEARTBEAT_LIMIT`` and a malformed one are raised."""
    body = store.read(run.bucket, run.key(HEARTBEAT_FILE), limit=HEARTBEAT_LIMIT)
    return parse_heartbeat(body, f"{run}{HEARTBEAT_FILE}", now) if body else None


def resume_from(*, level: str = METADATA, store: CheckpointStore | None = None) -> str | None:
    """Where to resume: the newer of ``TRAINOPS_RESUME_FROM`` and the newest verified checkpoint under
    ``TRAINOPS_RUN_URI``; None for a fresh start (neither set, or nothing verifies yet).

    A pod restarted in place keeps its env (Kueue re-admission after a preemption, a JobSet restart),
    so ``TRAINOPS_RESUME_FROM`` can be older than what the run has verified since: the newer one wins.
    """
    given = os.environ.get(RESUME_FROM_ENV, "").strip() or None
    run_uri = os.environ.get(RUN_URI_ENV, "").strip()
    if not run_uri:
        return given
    latest = latest_verified(S3Uri.parse(run_uri, field=RUN_URI_ENV), level=level, store=store).checkpoint
    if latest is None:
        return given
    if given is None or (latest.step or 0) > (
        step_from_name(S3Uri.parse(given, field=RESUME_FROM_ENV).name) or 0
    ):
        return latest.uri
    return given


def _require_env(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(f"{name} is not set: pass run_uri= or set {name}=s3://bucket/runs/<run>/")
    return value
