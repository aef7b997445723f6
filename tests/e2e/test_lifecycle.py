"""The real ``training_lifecycle`` DAG end to end with dag.test(): the clean path and the failures that matter.

After every run, whatever happened: no node claimed or in training mode, inference back at full
replicas and Ready, the training ClusterQueue's GPU quota where it was.
"""

from __future__ import annotations

from tests.e2e.conftest import (
    DAG_ID,
    assert_capacity_back,
    lifecycle_conf,
)
from tests.training.conftest import pods
from trainops.checkpoints.latest import latest_verified
from trainops.devcluster.airflow_home import xcom_value


def final_checkpoint_events(dag_id: str = DAG_ID) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.name == f"trainops/{dag_id}/final-checkpoint")
        ).all()
        return [dict(row.extra) for row in rows]


def test_clean_path_trains_verifies_publishes_the_checkpoint_and_gives_everything_back(
    cluster, api, s3, bucket, run_dag, capacity_before
):
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "clean"))

    assert dag_run.state == "success"
    gate = xcom_value(dag_run, "health_gate")
    claimed = xcom_value(dag_run, "claim_nodes")["nodes"]
    assert len(claimed) == 3 and set(claimed) <= set(gate["nodes"])
    trained = xcom_value(dag_run, "train")
    assert trained["attempts"] == 1 and trained["resumes_used"] == 0
    verified = xcom_value(dag_run, "verify_checkpoint")
    assert verified["uri"] == f"s3://{bucket}/runs/clean/step-60/" and verified["step"] == 60
    assert latest_verified(f"s3://{bucket}/runs/clean/").checkpoint.step == 60
    assert {"uri": verified["uri"], "step": 60}.items() <= final_checkpoint_events()[-1].items()
    ran_on = {p["spec"]["nodeName"] for p in pods(api)}
    assert len(ran_on) == 2 and ran_on <= set(claimed)
    assert_capacity_back(api, capacity_before)
