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

An elastic resume (``min_nodes``) may run an attempt on fewer ranks than the run was sized for;
:func:`elastic_world` tells the trainer how to keep the global batch (and so the loss curve) there::

    world = elastic_world()                    # TRAINOPS_ORIGINAL_WORLD_SIZE vs WORLD_SIZE, RANK
    accumulate = world.accumulation_steps      # original // current ranks (ElasticSizeError if it does not divide)
    mine = world.samples(offset, global_batch) # this rank's global sample indices of the step's batch
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
ORIGINAL_WORLD_SIZE_ENV = (
    "TRAINOPS_ORIGINAL_WORLD_SIZE"  # ranks the run was sized for: nodes x procs_per_node
)
ORIGINAL_NODES_ENV = "TRAINOPS_ORIGINAL_NODES"  # nodes the run was sized for (its ``nodes``)
NODES_ENV = "TRAINOPS_WORLD_SIZE"  # this attempt's nodes (a node count, despite the name)
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


class ElasticSizeError(ValueError):
    """This attempt's size cannot keep the run's global batch the way the trainer asked."""


@dataclass(frozen=True)
class ElasticWorld:
    """The run's original size and this attempt's, in ranks (processes), and what keeps the global batch.

    An elastic resume runs an attempt on fewer nodes than the run's ``nodes`` (down to ``min_nodes``).
    Training that keeps a fixed micro-batch per rank would silently change its global batch (and so its
    effective learning rate); instead each rank accumulates gradients over ``accumulation_steps``
    micro-batches, and takes its slice of every global batch by sample index (:meth:`samples`), so no
    sample is repeated or skipped across the resize when the data position is saved in the checkpoint
    as a global sample offset.  Scale each micro-batch's summed loss by ``1 / share`` (the rank's
    samples per step) so the data-parallel gradient average is the mean over the global batch.

    ``model_parallel``: ranks per data-parallel replica (tensor, pipeline, context parallel), laid out
    contiguously (rank = dp_rank * model_parallel + i, torch's device-mesh order with the data-parallel
    dimension outermost); 1 for plain data parallel and FSDP.  Sharded state (FSDP) over the
    data-parallel ranks grows by :attr:`shard_growth` per GPU: check it fits the GPU's memory.
    """

    rank: int
    world_size: int
    original_world_size: int
    model_parallel: int = 1
    nodes: int | None = None  # this attempt's nodes (TRAINOPS_WORLD_SIZE), for messages
    original_nodes: int | None = None  # the run's nodes (TRAINOPS_ORIGINAL_NODES), for messages

    def __post_init__(self) -> None:
        for name in ("world_size", "original_world_size", "model_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if (
            isinstance(self.rank, bool)
            or not isinstance(self.rank, int)
            or not 0 <= self.rank < self.world_size
        ):
            raise ValueError(
                f"rank must be an integer from 0 to world_size - 1 ({self.world_size - 1}), got {self.rank!r}"
            )
        for name, ranks in (
            ("WORLD_SIZE", self.world_size),
            (ORIGINAL_WORLD_SIZE_ENV, self.original_world_size),
        ):
            if ranks % self.model_parallel:
                raise ValueError(
                    f"{name}={ranks} ranks do not split into data-parallel replicas of "
                    f"model_parallel={self.model_parallel} ranks"
                )

    @property
    def resized(self) -> bool:
        """Whether this attempt runs on another size than the run's original one (an elastic resume)."""
        return self.world_size != self.original_world_size

    @property
    def dp_size(self) -> int:
        """Data-parallel replicas now: the size to shard a sampler with."""
        return self.world_size // self.model_parallel

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel replica: the rank to shard a sampler with."""
        return self.rank // self.model_parallel

    @property
    def original_dp_size(self) -> int:
        """Data-parallel replicas the run was sized for."""
        return self.original_world_size // self.model_parallel

    @property
    def shard_growth(self) -> float:
        """How many times its full-size shard each GPU now holds of state sharded over the data-parallel
        ranks (FSDP parameters, gradients, optimizer state): ``original_dp_size / dp_size``."""
        return self.original_dp_size / self.dp_size

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step that keep the global batch with an unchanged micro-batch:
        ``original_dp_size // dp_size`` (1 on the original size).  Raises ElasticSizeError, naming the
        variables and the nearest sizes that would do, when the current size does not divide the original."""
        original, now = self.original_dp_size, self.dp_size
        if original % now == 0:
            return original // now
        fits = [d for d in range(1, original + 1) if original % d == 0]
        below = max(d for d in fits if d < now)
        above = [d for d in fits if d > now]
        nearest = f"{below} (accumulation {original // below})" + (f" or {above[0]}" if above else "")
        nodes = ""
        if self.original_nodes and self.nodes:
            dividing = [n for n in range(1, self.original_nodes + 1) if self.original_nodes % n == 0]
            nodes = (
                f" ({NODES_ENV}={self.nodes} of {ORIGINAL_NODES_ENV}={self.original_nodes} nodes; "
                f"node counts that divide it: {', '.join(map(str, dividing))})"
            )
        raise ElasticSizeError(
            f"{self.world_size} ranks (WORLD_SIZE) do not divide {ORIGINAL_WORLD_SIZE_ENV}="
            f"{self.original_world_size}{nodes}: no whole number of accumulation steps keeps the global "
            f"batch on {now} data-parallel ranks of {original}; the nearest sizes that do: {nearest} "
            f"data-parallel ranks. Keep the global batch with smaller micro-batches instead "
            f"(ElasticWorld.micro_batches), or resume only on sizes that divide it (trainops resumes on "
            f"any node count from min_nodes to nodes)"
        )

    def share(self, global_batch: int) -> int:
        """Samples each data-parallel rank takes of a global batch of ``global_batch`` samples; raises
        ElasticSizeError when it does not split evenly over the current data-parallel ranks."""
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise ValueError(f"global_batch must be an integer >= 1, got {global_batch!r}")
        if global_batch % self.dp_size:
            fits = [d for d in range(1, self.dp_size) if global_batch % d == 0]
            raise ElasticSizeError(
                f"a global batch of {global_batch} samples does not split evenly over {self.dp_size} "
                f"data-parallel ranks (WORLD_SIZE={self.world_size}, {ORIGINAL_WORLD_SIZE_ENV}="
                f"{self.original_world_size}); the nearest fewer that it does: {fits[-1]}"
            )
        return global_batch // self.dp_size

    def samples(self, offset: int, global_batch: int) -> range:
        """This rank's global sample indices of the global batch that starts at sample ``offset``:
        a contiguous ``share(global_batch)`` of them, by data-parallel rank.  Save the offset after the
        step (``offset + global_batch``) in the checkpoint: any size that resumes it goes on with the
        next sample, each rank with its own slice."""
        share = self.share(global_batch)
        start = offset + self.dp_rank * share
        return range(start, start + share)

    def micro_batches(self, micro_batch: int) -> tuple[int, ...]:
        """Sizes of this rank's micro-batches in one optimizer step that keep the global batch of
        ``original_dp_size * micro_batch`` samples, none larger than ``micro_batch``:
        ``accumulation_steps`` of ``micro_batch`` when the size divides the original, else the rank's
        share split as evenly as it goes (e.g. 3 -> 2 ranks of 32: two of 24).  Raises ElasticSizeError
        when the global batch does not split evenly over the current ranks."""
        if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
            raise ValueError(f"micro_batch must be an integer >= 1, got {micro_batch!r}")
        share = self.share(self.original_dp_size * micro_batch)
        count = -(-share // micro_batch)
        size, larger = divmod(share, count)
        return tuple(size + 1 if i < larger else size for i in range(count))


def elastic_world(env: Mapping[str, str] | None = None, *, model_parallel: int = 1) -> ElasticWorld:
    """The run's original size and this attempt's, from the environment (``os.environ`` by default).

    ``RANK`` and ``WORLD_SIZE`` (this attempt's ranks; set by trainops, or by torchrun in each worker),
    ``TRAINOPS_ORIGINAL_WORLD_SIZE`` (the ranks the run was sized for: its ``nodes`` x ``procs_per_node``,
    the same on every attempt), and for messages ``TRAINOPS_ORIGINAL_NODES`` / ``TRAINOPS_WORLD_SIZE``
    (the run's nodes and this attempt's).  Without ``TRAINOPS_ORIGINAL_WORLD_SIZE`` (outside trainops)
    the current size is the original; without ``WORLD_SIZE``, one rank.  Raises ValueError naming a
    variable that is not a positive integer.
    """
    env = os.environ if env is None else env

    def number(name: str, default: int | None, least: int = 1) -> int | None:
        text = str(env.get(name, "")).strip()
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {text[:SHOWN]!r}")
        return value

    world = number("WORLD_SIZE", 1)
    return ElasticWorld(
        rank=number("RANK", 0, least=0),
        world_size=world,
        original_world_size=number(ORIGINAL_WORLD_SIZE_ENV, world),
        model_parallel=model_parallel,
        nodes=number(NODES_ENV, None),
        original_nodes=number(ORIGINAL_NODES_ENV, None),
    )
