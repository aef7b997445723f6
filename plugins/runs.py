"""The run view's data: the run's attempt ledger (read from its Jobs, as the run's tries read it:
``TrainingRun.observe``), its checkpoints as verified now (``trainops.checkpoints.latest``), its progress
(``trainops.plugins.progress``: heartbeat, rate, the plot's data) and the capacity the run claimed and
returned, read from Airflow's metadata database (task instances, rendered fields, XCom), S3 and the
cluster.  Each part that cannot be read is empty with its reason; the rest of the view is still answered."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session
from trainops.operators.lifecycle.task_ids import CLAIM_NODES as CLAIM
from trainops.operators.lifecycle.task_ids import RESERVE_RUN_PATH as RESERVE
from trainops.operators.lifecycle.task_ids import RETURN_CAPACITY as RETURN
from trainops.operators.lifecycle.task_ids import TRAIN
from trainops.operators.lifecycle.task_ids import VERIFY_CHECKPOINT as VERIFY

from trainops.errors import TrainopsError


class RunNotFound(LookupError):
    """No DAG run with this dag_id and run_id."""


def _ledger(read: Callable[[], dict]) -> dict[str, Any]:
    """The attempt ledger from the run's Jobs; when the cluster cannot be read, empty with ``error`` saying why."""
    from trainops.plugins.progress import Unavailable

    try:
        return {**read(), "error": None}
    except (Unavailable, TrainopsError, OSError) as error:
        return {"attempts": [], "excluded": {}, "preemptions": 0, "error": str(error)[:500]}


def _xcom(session: Session, dag_id: str, run_id: str, task_id: str) -> Any:
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(run_id=run_id, dag_ids=dag_id, task_ids=task_id, key="return_value")
    row = session.execute(query.with_only_columns(XComModel.value)).first()
    return None if row is None else XComModel.deserialize_value(row)


def _run_uri(session: Session, dag_id: str, run_id: str) -> str | None:
    """The run path the lifecycle's first task reserved, else the one ``train`` or ``verify`` rendered."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as Rendered

    reserved = _xcom(session, dag_id, run_id, RESERVE)
    if isinstance(reserved, dict) and str(reserved.get("run_uri", "")).startswith("s3://"):
        return reserved["run_uri"]
    for task_id in (TRAIN, VERIFY):
        fields = session.scalar(
            select(Rendered.rendered_fields).where(
                Rendered.dag_id == dag_id, Rendered.run_id == run_id, Rendered.task_id == task_id
            )
        )
        uri = (fields or {}).get("run_uri")
        if isinstance(uri, str) and uri.startswith("s3://"):
            return uri
    return None


def _store(aws_conn_id: str):
    """The run path's S3 store from the Airflow connection; Unavailable naming the setting to fix."""
    from airflow.exceptions import AirflowNotFoundException
    from trainops.hooks.checkpoint_store import CheckpointStoreHook
    from trainops.plugins.progress import Unavailable

    try:
        return CheckpointStoreHook(aws_conn_id=aws_conn_id).get_store()
    except AirflowNotFoundException:
        raise Unavailable(
            f"no Airflow connection {aws_conn_id!r}: create it, or name another in [trainops] aws_conn_id"
        ) from None


def checkpoints(run_uri: str | None, store: Callable[[], Any]) -> dict[str, Any]:
    """The run's newest verified checkpoint and the newer ones skipped with their reasons, as of now."""
    from trainops.plugins.progress import Unavailable

    from trainops.checkpoints.latest import latest_verified

    if run_uri is None:
        return {"run_uri": None, "checkpoint": None, "skipped": [], "skipped_count": 0, "error": None}
    try:
        return {**latest_verified(run_uri, store=store()).to_dict(), "error": None}
    except (Unavailable, TrainopsError, OSError) as error:
        return {
            "run_uri": run_uri,
            "checkpoint": None,
            "skipped": [],
            "skipped_count": 0,
            "error": str(error)[:500],
        }


def _gpus_per_node(claimed: Any) -> float | None:
    """The claimed nodes' GPUs each (the claim's summary: its GPUs over its nodes), or None."""
    if not isinstance(claimed, dict) or not isinstance(claimed.get("node_names"), list):
        return None
    gpus, nodes = claimed.get("gpus"), len(claimed["node_names"])
    return gpus / nodes if isinstance(gpus, int) and gpus > 0 and nodes else None


def run_view(
    session: Session, dag_id: str, run_id: str, aws_conn_id: str, ledger: Callable[[], dict]
) -> dict[str, Any]:
    """Everything the run view shows; raises RunNotFound. ``ledger()``: the run's ledger, read from its Jobs."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from trainops.plugins.progress import run_progress

    run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if run is None:
        raise RunNotFound(f"no DAG run {dag_id}/{run_id}")
    tasks = {
        ti.task_id: {"state": ti.state, "try_number": ti.try_number}
        for ti in session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        )
    }
    run_uri = _run_uri(session, dag_id, run_id)
    store = functools.cache(lambda: _store(aws_conn_id))
    attempts = _ledger(ledger)
    claimed = _xcom(session, dag_id, run_id, CLAIM)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "state": run.state,
        "tasks": tasks,
        "ledger": attempts,
        "result": _xcom(session, dag_id, run_id, TRAIN),
        "checkpoints": checkpoints(run_uri, store),
        "progress": run_progress(attempts, run_uri, store, gpus_per_node=_gpus_per_node(claimed)),
        "published_checkpoint": _xcom(session, dag_id, run_id, VERIFY),
        "capacity": {
            "claimed": claimed,
            "returned": _xcom(session, dag_id, run_id, RETURN),
        },
        # where the claimed nodes sit in the fabric: domains per level, and the run/spare split when a
        # topology was asked for (trainops.placement)
        "placement": claimed.get("placement") if isinstance(claimed, dict) else None,
    }
