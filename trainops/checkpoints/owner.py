"""One DAG run owns a run path: ``trainops-run.json`` under it, created once with ``If-None-Match``.

Two DAG runs with the same ``run_name`` would otherwise share checkpoints, and the second would
resume from the first's.  A lifecycle DAG reserves its run path in its first task, before the gate
touches a node; ``train`` checks it again.  Later tries and Clears of the same DAG run find their own
name in it; any other run is refused, told which DAG run owns the path and what to do.
A run left without a name gets one derived from its DAG run (``derived_run_name``), unique per run.
"""

from __future__ import annotations

import json
from datetime import datetime

from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri
from trainops.errors import PermanentError
from trainops.training.naming import check_dns_label, run_key, slug

OWNER_FILE = "trainops-run.json"
MAX_OWNER_BYTES = 4096
MAX_RUN_NAME = 63  # a DNS-1123 label: run names also name Kubernetes objects and label values


class RunPathTaken(PermanentError):
    """The run path belongs to another DAG run; the message says how to choose another one."""


def derived_run_name(dag_id: str, run_id: str, run_after: datetime) -> str:
    """``<dag>-<YYYYmmdd-HHMMSS>-<hash>``: readable, a DNS-1123 label, and unique per DAG run (the hash
    is of ``dag_id`` and ``run_id``; the time is the run's ``run_after``, so two runs triggered in the
    same second still differ)."""
    tail = f"-{run_after:%Y%m%d-%H%M%S}-{run_key(dag_id, run_id)[:6]}"
    head = slug(dag_id)[: MAX_RUN_NAME - len(tail)].strip("-") or "run"
    return f"{head}{tail}"


def run_path(checkpoint_uri: str, run_name: str) -> str:
    """``<checkpoint_uri>/<run_name>/``; ValueError naming the field when either is malformed."""
    check_dns_label(run_name, "run_name")
    return str(S3Uri.parse(checkpoint_uri, field="checkpoint_uri").child(run_name))


def claim_run_path(store: CheckpointStore, run_uri: str, owner: str) -> bool:
    """Make ``owner`` (``<dag_id>/<run_id>``) the run path's owner; True when this call did.

    Raises ``RunPathTaken`` (nothing written) when another DAG run owns it."""
    uri = S3Uri.parse(run_uri, field="run_uri")
    key = f"{uri.prefix}{OWNER_FILE}"
    if store.put_if_absent(uri.bucket, key, json.dumps({"owner": owner}).encode()):
        return True
    current = _owner(store.read(uri.bucket, key, limit=MAX_OWNER_BYTES))
    if current == owner:
        return False
    raise RunPathTaken(
        f"run path s3://{uri.bucket}/{uri.prefix} belongs to DAG run {current!r}, not {owner!r}: two runs "
        f"must not share checkpoints. Trigger again with run_name left empty (a name is derived from the "
        f"DAG run) or another run_name; to continue that run on purpose, delete s3://{uri.bucket}/{key} first."
    )


def _owner(data: bytes | None) -> str | None:
    try:
        owner = json.loads(data or b"null")["owner"]
    except (ValueError, TypeError, KeyError):
        return None
    return owner if isinstance(owner, str) else None
