"""The run view's progress: the heartbeat step and rate, and the data of the plot of step against
time with a crash and a resume marker per attempt.

What exists to read (nothing here writes):

- ``<run path>/heartbeat.json``: the trainer's newest heartbeat (``trainops.checkpoints.helper.heartbeat``
  overwrites it: step, ``time`` on the trainer's clock, ``saving``, ``phase``);
- ``<run path>/<checkpoint>/_COMMITTED``: written once per checkpoint by the helper's ``commit``; its
  S3 ``LastModified`` is when the step was committed;
- the run's attempt ledger, read from its Jobs (``TrainingRun.observe``): when each attempt's Job was
  created, when it ended (``Complete``/``Failed``, or ``Suspended`` once stopped), where it resumed
  from, how it was judged and its culprits.

Training pods write the S3 objects, so they are hostile input: each read is bounded in size and
count, and an object that is too large or malformed fails alone with the reason, naming the field.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainops.checkpoints import helper
from trainops.checkpoints.formats.base import step_from_name
from trainops.checkpoints.formats.manifest import COMMITTED_FILE
from trainops.checkpoints.helper import SHOWN
from trainops.checkpoints.interval import advise
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri

MAX_COMMITS = 200  # the newest checkpoints plotted; older ones are counted, not read
COMMIT_READERS = 16  # concurrent one-key listings of _COMMITTED
RATE_SPAN_S = 10.0  # the shortest span the rate is measured over when the run has a longer one
MAX_SAVE_S = 86_400.0  # a save time past a day is not believed
FAILED = ("infrastructure", "hang")  # attempt ends the checkpoint interval is advised against (not user bugs)


class Unavailable(Exception):
    """A source of the view (the cluster, the S3 connection) could not be reached; the message says why."""


# ---- the heartbeat -------------------------------------------------------------------------------
def read_heartbeat(store: CheckpointStore, run: S3Uri, now: float) -> dict[str, Any] | None:
    """The fields of the run's heartbeat the view shows, or None when the trainer writes none; raises
    ValueError (naming the field)/OSError/TrainopsError."""
    document = helper.read_heartbeat(store, run, now)
    if document is None:
        return None
    saving, phase = document.get("saving", False), document.get("phase", "")
    save_s = document.get("last_save_s")
    return {
        "step": document["step"],
        "at": float(document["time"]),
        "saving": saving if isinstance(saving, bool) else None,
        "phase": phase[:SHOWN] if isinstance(phase, str) else None,
        # the newest save's blocking time (a number the trainer wrote: anything else is not shown)
        "last_save_s": float(save_s)
        if isinstance(save_s, int | float) and not isinstance(save_s, bool) and 0 < save_s <= MAX_SAVE_S
        else None,
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
def attempt_times(ledger: Mapping) -> list[dict[str, Any]]:
    """The plot's rows, one per attempt of the ledger: when its Job was created and when it ended (the
    Job's own times, whole seconds as S3's commit times are; else when its end was seen), where it
    resumed from, how it ended and its culprits (None while it has not ended)."""
    rows = []
    for attempt in ledger.get("attempts") or []:
        ended = attempt.get("kind") is not None
        rows.append(
            {
                "number": attempt.get("number"),
                "job": attempt.get("job"),
                "started_at": attempt.get("created_at"),
                "ended_at": (attempt.get("finished_at") or attempt.get("ended_at")) if ended else None,
                "resume_step": attempt.get("resume_step"),
                "kind": attempt.get("kind"),
                "ended": attempt.get("ended"),
                "culprits": sorted(attempt.get("culprits") or {}) if ended else None,
            }
        )
    return rows


# ---- the checkpoint interval ---------------------------------------------------------------------
def interval_advice(
    ledger: Mapping,
    commits: list[Mapping],
    heartbeat: Mapping | None,
    gpus_per_node: float | None,
    now: float,
) -> dict[str, Any] | None:
    """Young–Daly advice (``trainops.checkpoints.interval``) from the newest save time the heartbeat
    says, the run's failures and GPU-hours so far (pooled with Llama 3's rate), next to the interval the
    run used (the median time between its commits); None until a save time and the GPUs are known."""
    save_s = (heartbeat or {}).get("last_save_s")
    attempts = [a for a in ledger.get("attempts") or [] if a.get("created_at") is not None]
    if not save_s or not gpus_per_node or not attempts:
        return None
    gpus = round(gpus_per_node * (attempts[-1].get("nodes") or 0))
    if gpus < 1:
        return None
    hours = sum(
        max(0.0, (a.get("ended_at") or now) - a["created_at"]) * gpus_per_node * (a.get("nodes") or 0)
        for a in attempts
    )
    gaps = [b["at"] - a["at"] for a, b in zip(commits, commits[1:], strict=False) if b["at"] > a["at"]]
    return advise(
        save_s=save_s,
        gpus=gpus,
        failures=sum(a.get("kind") in FAILED for a in attempts),
        gpu_hours=hours / 3600,
        used_s=statistics.median(gaps) if gaps else None,
    ).to_dict()


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
    now: float | None = None,
    gpus_per_node: float | None = None,
) -> dict[str, Any]:
    """``{"heartbeat", "rate", "attempts", "commits", "checkpoints_unread", "interval", "errors": {part:
    reason}}``; each part is read alone, and one that cannot be read is empty with its reason in ``errors``
    (``ledger``: as ``runs`` read it, with its own ``error``; ``gpus_per_node``: the claimed nodes', for
    the checkpoint-interval advice)."""
    now = time.time() if now is None else now
    errors: dict[str, str | None] = {"heartbeat": None, "commits": None, "attempts": ledger.get("error")}
    attempts = attempt_times(ledger)
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
        "interval": interval_advice(ledger, commits, heartbeat, gpus_per_node, now),
        "errors": errors,
    }
