"""The run view's progress: the heartbeat step and rate, and the data of the plot of step against
time with a crash and a resume marker per attempt.

What exists to read (nothing here writes):

- ``<run path>/heartbeat.json``: the trainer's newest heartbeat (``trainops.checkpoints.helper.heartbeat``
  overwrites it: step, ``time`` on the trainer's clock, ``saving``, ``phase``);
- ``<run path>/<checkpoint>/_COMMITTED``: written once per checkpoint by the helper's ``commit``; its
  S3 ``LastModified`` is when the step was committed;
- each attempt's Job (named in the ledger, labelled with the run): created when the attempt was
  submitted, ``Complete``/``Failed`` (or ``Suspended``, when trainops stopped it) when it ended, and
  the nodes kept out of it (so the culprits of attempt n are the nodes kept out of attempt n+1 only).

Training pods write the S3 objects, so they are hostile input: each read is bounded in size and
count, and an object that is too large or malformed fails alone with the reason, naming the field.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from trainops.checkpoints import helper
from trainops.checkpoints.formats.base import step_from_name
from trainops.checkpoints.formats.manifest import COMMITTED_FILE
from trainops.checkpoints.helper import SHOWN
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri
from trainops.training.job import ATTEMPT_LABEL, condition, finished, kept_out, resume_point

MAX_COMMITS = 200  # the newest checkpoints plotted; older ones are counted, not read
COMMIT_READERS = 16  # concurrent one-key listings of _COMMITTED
RATE_SPAN_S = 10.0  # the shortest span the rate is measured over when the run has a longer one


class Unavailable(Exception):
    """A source of the view (the cluster, the S3 connection) could not be reached; the message says why."""


def _stamp(value: Any) -> float | None:
    """A Kubernetes timestamp (``2026-11-30T19:00:00Z``) as Unix seconds; None when absent or bad."""
    try:
        return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else None
    except ValueError:
        return None


# ---- the heartbeat -------------------------------------------------------------------------------
def read_heartbeat(store: CheckpointStore, run: S3Uri, now: float) -> dict[str, Any] | None:
    """The fields of the run's heartbeat the view shows, or None when the trainer writes none; raises
    ValueError (naming the field)/OSError/TrainopsError."""
    document = helper.read_heartbeat(store, run, now)
    if document is None:
        return None
    saving, phase = document.get("saving", False), document.get("phase", "")
    return {
        "step": document["step"],
        "at": float(document["time"]),
        "saving": saving if isinstance(saving, bool) else None,
        "phase": phase[:SHOWN] if isinstance(phase, str) else None,
    }


# ---- checkpoint commits --------------------------------------------------------------------------
def commit_times(store: CheckpointStore, run: S3Uri) -> tuple[list[dict[str, Any]], int]:
    """``([{"step", "at"}, ...] oldest first, how many older checkpoint directories were not read)``: when each
    of the newest ``MAX_COMMITS`` checkpoints was committed, from a one-key listing of its
    ``_COMMITTED`` (listings carry sub-second times where the server keeps them; uncommitted ones are left out)."""
    names, _ = store.list_dir(run)
    steps = sorted(
        ((step, name) for name in names if (step := step_from_name(name)) is not None), reverse=True
    )

    def committed(item: tuple[int, str]) -> dict[str, Any] | None:
        step, name = item
        key = run.child(name).key(COMMITTED_FILE)
        listed = store.client.list_objects_v2(Bucket=run.bucket, Prefix=key, MaxKeys=1).get("Contents") or []
        found = next((o for o in listed if o["Key"] == key), None)
        return {"step": step, "at": found["LastModified"].timestamp()} if found else None

    with ThreadPoolExecutor(COMMIT_READERS) as pool:
        found = [c for c in pool.map(committed, steps[:MAX_COMMITS]) if c]
    return sorted(found, key=lambda c: (c["at"], c["step"])), max(0, len(steps) - MAX_COMMITS)


# ---- attempts ------------------------------------------------------------------------------------
def _ended_at(job: Mapping) -> float | None:
    for kind in ("Failed", "Complete", "Suspended"):
        if (ended := condition(job, kind)) is not None:
            return _stamp(ended.get("lastTransitionTime"))
    return None


def _attempt_number(job: Mapping) -> int | None:
    value = ((job.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _unrecorded(ledger_attempts: list[Mapping], jobs: list[Mapping]) -> list[dict[str, Any]]:
    """Attempts that have a Job but no ledger entry yet: begun by the trigger, which hands the ledger
    back when the run ends (how they ended is then known; here only what their Jobs say)."""
    return [
        {"number": number, "job": job["metadata"]["name"], "resume_step": resume_point(job)[1]}
        for job in sorted(jobs, key=lambda j: _attempt_number(j) or 0)
        if (number := _attempt_number(job) or 0) > len(ledger_attempts)
    ]


def attempt_times(ledger: Mapping, jobs: list[Mapping] | None) -> list[dict[str, Any]]:
    """One entry per attempt of the ledger, and per attempt the trigger began since (from its Job): when
    it started and ended (its Job's times, whole seconds as S3's commit times are; None when the Job is
    gone or was not read), where it resumed from, how it ended and its culprits (None: unknown)."""
    by_name = {(j.get("metadata") or {}).get("name"): j for j in jobs or []}
    recorded = list(ledger.get("attempts") or [])
    attempts = recorded + _unrecorded(recorded, jobs or [])
    found = [by_name.get(a.get("job")) for a in attempts]
    # the nodes kept out of each attempt, and after the last one: the ledger's own list, once it has
    # the last attempt's end (mid-run the trigger holds a newer one)
    current = bool(recorded) and len(attempts) == len(recorded) and recorded[-1].get("phase") == "ended"
    kept_out_of = [kept_out(job) if job is not None else None for job in found] + [
        set(ledger.get("excluded") or {}) if current else None
    ]
    rows = []
    for index, (attempt, job) in enumerate(zip(attempts, found, strict=True)):
        ended = attempt.get("phase") == "ended" or (job is not None and finished(job))
        before, after = kept_out_of[index], kept_out_of[index + 1]
        rows.append(
            {
                "number": attempt.get("number"),
                "job": attempt.get("job"),
                "started_at": _stamp(((job or {}).get("metadata") or {}).get("creationTimestamp")),
                "ended_at": _ended_at(job) if job is not None and ended else None,
                "resume_step": attempt.get("resume_step"),
                "kind": attempt.get("kind"),
                "ended": attempt.get("ended"),
                "culprits": sorted(after - before) if ended and None not in (before, after) else None,
            }
        )
    return rows


# ---- the rate ------------------------------------------------------------------------------------
def heartbeat_rate(
    heartbeat: Mapping, commits: list[Mapping], attempt: Mapping | None
) -> dict[str, Any] | None:
    """Steps per second from earlier progress of the same attempt (a checkpoint it committed) to the
    heartbeat: from the newest such commit at least ``RATE_SPAN_S`` older than the heartbeat (S3 and
    Kubernetes keep whole seconds, so a shorter span would be mostly rounding), else from the oldest
    one, else from the attempt's start at the step it resumed from; None when there is none."""
    start = attempt.get("started_at") if attempt else None
    resumed = (attempt.get("resume_step") or 0) if attempt else 0
    # the attempt's own commits: past the step it resumed from (its Job's creation time has whole seconds,
    # and a resume within a second of the crash starts in the second of the last commits before it)
    earlier = [
        {"step": c["step"], "at": c["at"], "what": f"the step-{c['step']} checkpoint"}
        for c in commits
        if resumed < c["step"] < heartbeat["step"]
        and c["at"] < heartbeat["at"]
        and (start is None or c["at"] >= start)
    ]
    if not earlier and start is not None and start < heartbeat["at"]:
        earlier = [
            {
                "step": resumed,
                "at": start,
                "what": f"attempt {attempt.get('number')} resumed at step {resumed}"
                if resumed
                else f"attempt {attempt.get('number')} started",
            }
        ]
    if not earlier:
        return None
    spanning = [p for p in earlier if heartbeat["at"] - p["at"] >= RATE_SPAN_S]
    since = max(spanning, key=lambda p: p["at"]) if spanning else min(earlier, key=lambda p: p["at"])
    if since["step"] >= heartbeat["step"]:
        return None
    return {**since, "steps_per_s": (heartbeat["step"] - since["step"]) / (heartbeat["at"] - since["at"])}


# ---- all of it -----------------------------------------------------------------------------------
def _alone(read: Callable[[], Any], errors: dict[str, str | None], name: str, default: Any) -> Any:
    """``read()``; on a bad object, an unreachable server or a refusal, ``default`` and the reason in ``errors``."""
    from botocore.exceptions import BotoCoreError, ClientError

    from trainops.errors import TrainopsError

    try:
        return read()
    except (Unavailable, ValueError, OSError, TrainopsError, ClientError, BotoCoreError) as error:
        errors[name] = str(error)[:500]
        return default


def run_progress(
    ledger: Mapping,
    run_uri: str | None,
    store: Callable[[], CheckpointStore],
    jobs: Callable[[], list[Mapping]],
    now: float | None = None,
) -> dict[str, Any]:
    """``{"heartbeat", "rate", "attempts", "commits", "checkpoints_unread", "errors": {part: reason}}``;
    each part is read alone, and one that cannot be read is empty with its reason in ``errors``."""
    now = time.time() if now is None else now
    errors: dict[str, str | None] = {"heartbeat": None, "commits": None, "attempts": None}
    attempts = attempt_times(ledger, _alone(jobs, errors, "attempts", None))
    heartbeat, commits, unread = None, [], 0
    if run_uri is not None:
        run = S3Uri.parse(run_uri, field="run_uri")
        opened = _alone(store, errors, "heartbeat", None)
        if opened is None:
            errors["commits"] = errors["heartbeat"]
        else:
            heartbeat = _alone(lambda: read_heartbeat(opened, run, now), errors, "heartbeat", None)
            commits, unread = _alone(lambda: commit_times(opened, run), errors, "commits", ([], 0))
    rate = heartbeat_rate(heartbeat, commits, attempts[-1] if attempts else None) if heartbeat else None
    return {
        "heartbeat": heartbeat,
        "rate": rate if rate is None or math.isfinite(rate["steps_per_s"]) else None,
        "attempts": attempts,
        "commits": commits,
        "checkpoints_unread": unread,
        "errors": errors,
    }
