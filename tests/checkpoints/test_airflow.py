"""CheckpointVerifyOperator and the deferrable CheckpointSensor in real Airflow (``dag.test()``)."""

from __future__ import annotations

import threading
import time

from trainops_devcluster.airflow_home import xcom_value

from tests.checkpoints.builders import prefix_of, write_dcp


def test_operator_returns_the_latest_verified_and_the_skipped(run_dag, s3, client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/.metadata")

    dag_run = run_dag("checkpoint_latest", {"run_uri": run})

    assert dag_run.state == "success"
    result = xcom_value(dag_run, "latest")
    assert (result["uri"], result["step"], result["format"], result["level"]) == (
        f"{run}step-100/",
        100,
        "torchtitan",
        "metadata",
    )
    assert result["files"] == 3 and result["bytes"] > 0
    assert [s["uri"] for s in result["skipped"]] == [f"{run}step-200/"]
    assert ".metadata is missing" in result["skipped"][0]["reasons"][0]


def test_operator_fails_on_a_partial_checkpoint(run_dag, s3, client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/__0_0.distcp")

    dag_run = run_dag("checkpoint_verify_one", {"uri": f"{run}step-200/"})

    assert dag_run.state == "failed"
    assert xcom_value(dag_run, "verify") is None


def test_deferred_sensor_fires_when_a_newer_checkpoint_finishes_saving(run_dag, s3, client, bucket, run):
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
        dag_run = run_dag("checkpoint_sensor", {"run_uri": run, "newer_than_step": 100})
    finally:
        sensor_ran.set()
        saver.join()

    assert dag_run.state == "success"
    assert xcom_value(dag_run, "wait")["uri"] == f"{run}step-200/"


def test_deferred_sensor_times_out_when_nothing_newer_verifies(run_dag, s3, client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")

    dag_run = run_dag("checkpoint_sensor_timeout", {"run_uri": run, "newer_than_step": 100})

    assert dag_run.state == "failed"


def _has_deferred(dag_id: str) -> bool:
    """Whether the task of ``dag_id`` has deferred (``dag.test()`` then runs its trigger in line)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(TaskInstance.next_method).where(TaskInstance.dag_id == dag_id)
        return "execute_complete" in session.execute(query).scalars().all()
