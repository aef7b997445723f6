"""One DAG run owns a run path: ``trainops-run.json`` under it, created once with ``If-None-Match``.

Two DAG runs with the same ``run_name`` would otherwise share checkpoints, and the second would
resume from the first's.  A lifecycle DAG reserves its run path in its first task, before the gate
touches a node; ``train`` checks it again.  Later tries and Clears of the same DAG run find their own
name in it; any other run is refused, told which DAG run owns the path and what to do.
The run path and the name a run without one is given are ``trainops.training.naming``'s
(``run_path``, ``derived_run_name``).
"""

from __future__ import annotations

import json

from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri
from trainops.errors import PermanentError

OWNER_FILE = "trainops-run.json"
MAX_OWNER_BYTES = 4096


class RunPathTaken(PermanentError):
    """The run path belongs to another DAG run; the message says how to choose another one."""


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
