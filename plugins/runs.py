"""The run view's data: the train task's attempt ledger, the run's checkpoints as verified now
(``trainops.checkpoints.latest``), and the capacity the run claimed and returned, read from
Airflow's metadata database (task instances, task state store, rendered fields, XCom) and S3."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session
from trainops.operators.training import LEDGER_KEY

from trainops.errors import TrainopsError

TRAIN, VERIFY, CLAIM, RETURN = "train", "verify_checkpoint", "claim_nodes", "return_capacity"


class RunNotFound(LookupError):
    """No DAG run with this dag_id and run_id."""


def _ledger(session: Session, dag_id: str, run_id: str) -> dict[str, Any]:
    from airflow.models.task_state_store import TaskStateStoreModel

    from trainops.training.attempts import RunLedger

    value = session.scalar(
        select(TaskStateStoreModel.value).where(
            TaskStateStoreModel.dag_id == dag_id,
            TaskStateStoreModel.run_id == run_id,
            TaskStateStoreModel.task_id == TRAIN,
            TaskStateStoreModel.key == LEDGER_KEY,
        )
    )
    return RunLedger.from_dict(json.loads(value) if value else None).to_dict()


def _xcom(session: Session, dag_id: str, run_id: str, task_id: str) -> Any:
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(run_id=run_id, dag_ids=dag_id, task_ids=task_id, key="return_value")
    row = session.execute(query.with_only_columns(XComModel.value)).first()
    return None if row is None else XComModel.deserialize_value(row)


def _run_uri(session: Session, dag_id: str, run_id: str) -> str | None:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as Rendered

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


def checkpoints(run_uri: str | None, aws_conn_id: str) -> dict[str, Any]:
    """The run's newest verified checkpoint and the newer ones skipped with their reasons, as of now."""
    if run_uri is None:
        return {"run_uri": None, "checkpoint": None, "skipped": [], "skipped_count": 0, "error": None}
    from trainops.hooks.checkpoint_store import CheckpointStoreHook

    from trainops.checkpoints.latest import latest_verified

    try:
        store = CheckpointStoreHook(aws_conn_id=aws_conn_id).get_store()
        return {**latest_verified(run_uri, store=store).to_dict(), "error": None}
    except (TrainopsError, OSError) as error:
        return {
            "run_uri": run_uri,
            "checkpoint": None,
            "skipped": [],
            "skipped_count": 0,
            "error": str(error)[:500],
        }


def run_view(session: Session, dag_id: str, run_id: str, aws_conn_id: str) -> dict[str, Any]:
    """Everything the run view shows; raises RunNotFound."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

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
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "state": run.state,
        "tasks": tasks,
        "ledger": _ledger(session, dag_id, run_id),
        "result": _xcom(session, dag_id, run_id, TRAIN),
        "checkpoints": checkpoints(run_uri, aws_conn_id),
        "published_checkpoint": _xcom(session, dag_id, run_id, VERIFY),
        "capacity": {
            "claimed": _xcom(session, dag_id, run_id, CLAIM),
            "returned": _xcom(session, dag_id, run_id, RETURN),
        },
    }
