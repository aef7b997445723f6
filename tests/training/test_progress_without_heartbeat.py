"""A trainer that never calls the heartbeat helper is followed by its checkpoints, not declared hung."""

from __future__ import annotations

from trainops_devcluster.airflow_home import xcom_value

from tests.training.conftest import idle_nodes, jobs, when
from tests.training.test_gang_e2e import conf, task_state
from trainops.checkpoints.latest import latest_verified


def no_heartbeat(steps: int) -> list[str]:
    """Trainer args: ``steps`` of 0.12 s, a checkpoint every ~2.4 s and no heartbeat at all."""
    return ["--steps", str(steps), "--checkpoint-every", "20", "--step-seconds", "0.12", "--no-heartbeat"]


def test_a_run_without_heartbeats_finishes_in_one_attempt(cluster, api, s3, bucket, run_dag):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/no-heartbeat/"

    # 300 steps: the run lasts ~40 s, past the test DAG's 30 s startup bound.
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri, no_heartbeat(300)))

    assert dag_run.state == "success"
    result = xcom_value(dag_run, "train")
    assert result["attempts"] == 1 and result["resumes_used"] == 0
    assert task_state(dag_run, "train").try_number == 1 and len(jobs(api)) == 1
    assert latest_verified(run_uri).checkpoint.step == 300
    s3_keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert not any(key.endswith("heartbeat.json") for key in s3_keys)


def test_a_silent_trainer_without_heartbeats_is_still_caught_once_checkpoints_stop(
    cluster, api, s3, bucket, run_dag
):
    """Checkpoints teach the bound; a hang after them is caught by it (the hang fault stops the pods)."""
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/no-heartbeat-hang/"
    fault = {}

    def hang() -> None:
        job = next(j for j in jobs(api) if j["metadata"]["labels"]["trainops.io/attempt"] == "1")
        fault["step"] = latest_verified(run_uri).checkpoint.step
        cluster.inject("hang", f"training/{job['metadata']['name']}")

    def three_checkpoints() -> bool:
        checkpoint = latest_verified(run_uri).checkpoint
        return checkpoint is not None and checkpoint.step >= 60

    when(three_checkpoints, hang)
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri, no_heartbeat(140)))

    assert dag_run.state == "success"
    history = xcom_value(dag_run, "train")["history"]
    assert history[0]["kind"] == "hang" and "between new checkpoints" in history[0]["ended"]
    assert latest_verified(run_uri).checkpoint.step == 140
