"""``train`` reaches S3 through the Airflow AWS connection, as ``verify_checkpoint`` does: a user whose
MinIO endpoint is only in the connection resumes from the right store."""

from __future__ import annotations

import boto3
from trainops_devcluster.airflow_home import xcom_value

from tests.training.conftest import idle_nodes, jobs
from tests.training.test_gang_e2e import assert_capacity_returned, conf, env_of
from trainops.checkpoints.latest import latest_verified
from trainops.checkpoints.owner import OWNER_FILE

NOWHERE = "http://127.0.0.1:9"  # nothing listens on the discard port
STEPS = ["--checkpoint-every", "20", "--step-seconds", "0.02", "--heartbeat-every", "5"]


def test_train_resumes_from_the_connection_store_when_the_ambient_boto3_env_points_nowhere(
    cluster, api, s3, bucket, run_dag, monkeypatch
):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/connection-only/"
    first = run_dag("gang_training_e2e", conf(nodes, run_uri, ["--steps", "40", *STEPS]))
    assert first.state == "success"
    resume_point = latest_verified(run_uri).checkpoint.uri
    earlier_jobs = {j["metadata"]["name"] for j in jobs(api)}
    # continuing that run on purpose from a second DAG run: release the run path as RunPathTaken says
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"runs/connection-only/{OWNER_FILE}")

    # the worker's ambient boto3 environment now points nowhere (the pods keep the devcluster's own env)
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(key, NOWHERE)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nothing")
    second = run_dag("gang_training_e2e", conf(nodes, run_uri, ["--steps", "80", *STEPS]))

    assert second.state == "success"
    new_jobs = [j for j in jobs(api) if j["metadata"]["name"] not in earlier_jobs]
    assert len(new_jobs) == 1
    assert resume_point == f"{run_uri}step-40/"
    assert env_of(new_jobs[0])["TRAINOPS_RESUME_FROM"] == resume_point
    result = xcom_value(second, "train")
    assert result["attempts"] == 1 and result["history"][0]["kind"] == "succeeded"
    assert result["checkpoint"]["uri"] == f"{run_uri}step-80/"
    assert_capacity_returned(api, nodes)
