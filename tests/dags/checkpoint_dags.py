"""DAGs for the checkpoint operator and sensor tests; run through ``dag.test()``."""

from datetime import datetime

from airflow.sdk import DAG
from trainops.operators.checkpoint import CheckpointVerifyOperator
from trainops.sensors.checkpoint import CheckpointSensor

with DAG("checkpoint_latest", schedule=None, start_date=datetime(2026, 1, 1), tags=["test"]):
    CheckpointVerifyOperator(task_id="latest", run_uri="{{ dag_run.conf['run_uri'] }}")

with DAG("checkpoint_verify_one", schedule=None, start_date=datetime(2026, 1, 1), tags=["test"]):
    CheckpointVerifyOperator(task_id="verify", uri="{{ dag_run.conf['uri'] }}", retries=0)

with DAG("checkpoint_sensor", schedule=None, start_date=datetime(2026, 1, 1), tags=["test"]):
    CheckpointSensor(
        task_id="wait",
        run_uri="{{ dag_run.conf['run_uri'] }}",
        newer_than_step="{{ dag_run.conf['newer_than_step'] }}",
        deferrable=True,
        poke_interval=0.5,
        timeout=600,
    )

with DAG("checkpoint_sensor_timeout", schedule=None, start_date=datetime(2026, 1, 1), tags=["test"]):
    CheckpointSensor(
        task_id="wait",
        run_uri="{{ dag_run.conf['run_uri'] }}",
        newer_than_step="{{ dag_run.conf['newer_than_step'] }}",
        deferrable=True,
        poke_interval=0.5,
        timeout=2,
    )
