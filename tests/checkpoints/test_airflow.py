"""CheckpointVerifyOperator and the deferrable CheckpointSensor in real Airflow (``dag.test()``)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.checkpoints.builders import write_dcp
from trainops.devcluster import airflow_home
from trainops.devcluster.airflow_home import xcom_value

DAGS = Path(__file__).resolve().parent / "dags"
BUNDLES = "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"


@pytest.fixture
def run_checkpoint_dag(airflow_db, s3, monkeypatch):
    """``dag.test()`` for a DAG in ``tests/checkpoints/dags``, served as one more DAG bundle."""
    bundles = json.loads(os.environ[BUNDLES]) + [
        {
            "name": "checkpoint-test-dags",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(DAGS)},
        }
    ]
    monkeypatch.setenv(BUNDLES, json.dumps(bundles))

    def run(dag_id: str, conf: dict):
        return airflow_home.load_dag(dag_id, DAGS).test(run_conf=conf)

    return run


def prefix_of(uri: str) -> str:
    return uri.split("/", 3)[3]


def test_operator_returns_the_latest_verified_and_the_skipped(run_checkpoint_dag, client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/.metadata")

    dag_run = run_checkpoint_dag("checkpoint_latest", {"run_uri": run})

    assert dag_run.state == "success"
    result = xcom_value(dag_run, "latest")
    assert (result["uri"], result["step"], result["format"], result["level"]) == (f"{run}step-100/", 100, "torchtitan", "metadata")
    assert result["files"] == 3 and result["bytes"] > 0
    assert [s["uri"] for s in result["skipped"]] == [f"{run}step-200/"]
    assert ".metadata is missing" in result["skipped"][0]["reasons"][0]


def test_operator_fails_on_a_partial_checkpoint(run_checkpoint_dag, client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/__0_0.distcp")

    dag_run = run_checkpoint_dag("checkpoint_verify_one", {"uri": f"{run}step-200/"})

    assert dag_run.state == "failed"
    assert xcom_value(dag_run, "verify") is None


def test_deferred_sensor_fires_when_a_newer_checkpoint_finishes_saving(run_checkpoint_dag, client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/.metadata")  # save in progress
    sensor_ran = threading.Event()

    def finish_the_save_once_deferred():
        while not sensor_ran.is_set():
            if _has_deferred("checkpoint_sensor"):
                write_dcp(client, bucket, prefix_of(run) + "step-200/")  # .metadata is written last
                return
            time.sleep(0.2)

    saver = threading.Thread(target=finish_the_save_once_deferred)
    saver.start()
    try:
        dag_run = run_checkpoint_dag("checkpoint_sensor", {"run_uri": run, "newer_than_step": 100})
    finally:
        sensor_ran.set()
        saver.join()

    assert dag_run.state == "success"
    assert xcom_value(dag_run, "wait")["uri"] == f"{run}step-200/"


def test_deferred_sensor_times_out_when_nothing_newer_verifies(run_checkpoint_dag, client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")

    dag_run = run_checkpoint_dag("checkpoint_sensor_timeout", {"run_uri": run, "newer_than_step": 100})

    assert dag_run.state == "failed"


def _has_deferred(dag_id: str) -> bool:
    """Whether the task of ``dag_id`` has deferred (``dag.test()`` then runs its trigger in line)."""
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        query = select(TaskInstance.next_method).where(TaskInstance.dag_id == dag_id)
        return "execute_complete" in session.execute(query).scalars().all()
