"""The real ``training_lifecycle`` DAG end to end with dag.test(): the clean path and the failures that matter.

After every run, whatever happened: no node claimed or in training mode, inference back at full
replicas and Ready, the training ClusterQueue's GPU quota where it was.
"""

from __future__ import annotations

import re

from trainops_devcluster.airflow_home import xcom_value

from tests.e2e.conftest import (
    DAG_ID,
    TRAINER,
    assert_capacity_back,
    lifecycle_conf,
    mark_failed,
    running_training_pod,
    task_instances,
    training_running,
    xid_mid_run,
)
from tests.training.conftest import heartbeat_step, jobs, node, pods, when
from trainops.checkpoints.latest import latest_verified
from trainops.conventions import HEALTH_LABEL, QUARANTINE_EVIDENCE_ANNOTATION, QUARANTINE_TAINT
from trainops.kube.client import Kube
from trainops.training.naming import derived_run_name


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
    """Triggered twice with the form's run_name (empty): two runs, each on a run path of its own."""
    conf = {"checkpoint_uri": f"s3://{bucket}/runs/", "command": TRAINER}
    dag_run = run_dag(DAG_ID, conf)

    assert dag_run.state == "success"
    run_uri = xcom_value(dag_run, "reserve_run_path")["run_uri"]
    assert re.fullmatch(rf"s3://{bucket}/runs/training-lifecycle-\d{{8}}-\d{{6}}-[0-9a-f]{{6}}/", run_uri)
    gate = xcom_value(dag_run, "health_gate")
    claimed = xcom_value(dag_run, "claim_nodes")["node_names"]
    assert len(claimed) == 3 and set(claimed) <= set(gate["node_names"])
    trained = xcom_value(dag_run, "train")
    assert trained["attempts"] == 1 and trained["resumes_used"] == 0
    verified = xcom_value(dag_run, "verify_checkpoint")
    assert verified["uri"] == f"{run_uri}step-60/" and verified["step"] == 60
    assert latest_verified(run_uri).checkpoint.step == 60
    assert {"uri": verified["uri"], "step": 60}.items() <= final_checkpoint_events()[-1].items()
    ran_on = {p["spec"]["nodeName"] for p in pods(api)}
    assert len(ran_on) == 2 and ran_on <= set(claimed)
    assert_capacity_back(api, capacity_before)

    again = run_dag(DAG_ID, conf)

    assert again.state == "success"
    second_uri = xcom_value(again, "reserve_run_path")["run_uri"]
    assert second_uri != run_uri and xcom_value(again, "verify_checkpoint")["uri"] == f"{second_uri}step-60/"
    assert_capacity_back(api, capacity_before)


def test_xid_on_a_training_node_quarantines_it_and_resumes_on_the_spare(
    cluster, api, s3, bucket, run_dag, capacity_before
):
    fault = xid_mid_run(cluster, api, s3, f"s3://{bucket}/runs/xid/")
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "xid"))

    assert dag_run.state == "success"
    assert task_instances(dag_run)["train"].try_number == 1  # the trigger resumed, within the try
    trained = xcom_value(dag_run, "train")
    assert trained["attempts"] == 2 and trained["resumes_used"] == 1
    assert trained["history"][1]["resume_step"] >= 20
    culprit = node(api, fault["node"])
    assert culprit["metadata"]["labels"][HEALTH_LABEL] == "quarantined"
    assert QUARANTINE_EVIDENCE_ANNOTATION in culprit["metadata"]["annotations"]
    assert any(t["key"] == QUARANTINE_TAINT for t in culprit["spec"]["taints"])
    second = {
        p["spec"]["nodeName"] for p in pods(api) if p["metadata"]["labels"]["trainops.io/attempt"] == "2"
    }
    assert len(second) == 2 and fault["node"] not in second
    assert xcom_value(dag_run, "verify_checkpoint")["step"] == 60
    assert_capacity_back(api, capacity_before)


def test_with_no_spare_an_elastic_run_resumes_on_the_node_that_remains(
    cluster, api, s3, bucket, run_dag, capacity_before
):
    """spare_nodes=0, min_nodes=1: the XID takes one of the run's two nodes; after elastic_wait_s the run
    resumes on the other, told so by its environment, and finishes there."""
    fault = xid_mid_run(cluster, api, s3, f"s3://{bucket}/runs/elastic/")
    conf = lifecycle_conf(bucket, "elastic", spare_nodes=0, min_nodes=1, elastic_wait_s=1)
    dag_run = run_dag(DAG_ID, conf)

    assert dag_run.state == "success"
    trained = xcom_value(dag_run, "train")
    assert [a["nodes"] for a in trained["history"]] == [2, 1]  # each attempt's world size
    assert trained["history"][1]["resume_step"] >= 20 and fault["node"] in trained["excluded_nodes"]
    (second,) = [j for j in jobs(api) if j["metadata"]["labels"]["trainops.io/attempt"] == "2"]
    env = {e["name"]: e.get("value") for e in second["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert second["spec"]["parallelism"] == 1 and env["WORLD_SIZE"] == env["TRAINOPS_WORLD_SIZE"] == "1"
    assert xcom_value(dag_run, "verify_checkpoint")["step"] == 60
    assert_capacity_back(api, capacity_before)


def test_user_code_exit_1_fails_the_run_at_once_and_gives_everything_back(
    cluster, api, s3, bucket, run_dag, capacity_before
):
    dag_run = run_dag(
        DAG_ID, lifecycle_conf(bucket, "bug", [*TRAINER, "--fail-at-step", "15", "--exit-code", "1"])
    )

    assert dag_run.state == "failed"
    tis = task_instances(dag_run)
    assert tis["train"].state == "failed" and tis["train"].try_number == 1
    assert tis["verify_checkpoint"].state == "upstream_failed"
    assert tis["return_capacity"].state == "success"
    assert len(jobs(api)) == 1
    assert_capacity_back(api, capacity_before)


def test_resumes_exhausted_fails_clearly_and_the_teardown_still_runs(
    cluster, api, s3, bucket, run_dag, capacity_before, capfd
):
    # killed from outside (SIGKILL) at step 15 on every attempt: infrastructure, each crash a resume
    command = [*TRAINER, "--fail-at-step", "15", "--exit-code", "137"]
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "exhausted", command, max_resumes=1))

    assert dag_run.state == "failed"
    tis = task_instances(dag_run)
    assert tis["train"].state == "failed" and tis["train"].try_number == 1  # the trigger resumed once
    assert sorted(j["metadata"]["labels"]["trainops.io/attempt"] for j in jobs(api)) == ["1", "2"]
    assert "resumes exhausted after 2 attempts" in capfd.readouterr().out
    assert tis["return_capacity"].state == "success"
    assert_capacity_back(api, capacity_before)


def test_preemption_by_an_urgent_workload_requeues_without_using_a_resume(
    cluster, api, s3, bucket, run_dag, capacity_before
):
    from kubernetes import client

    from tests.training.test_gang_e2e import urgent_job

    run_uri = f"s3://{bucket}/runs/preempted/"
    when(
        lambda: training_running(s3, run_uri, 20)() and running_training_pod(api, "1"),
        lambda: client.BatchV1Api(api).create_namespaced_job("training", urgent_job(2)),
    )
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "preempted"))

    assert dag_run.state == "success"
    trained = xcom_value(dag_run, "train")
    assert trained["preemptions"] >= 1 and trained["resumes_used"] == 0
    assert task_instances(dag_run)["train"].try_number == 1
    assert xcom_value(dag_run, "verify_checkpoint")["step"] == 60
    assert_capacity_back(api, capacity_before)


def test_gate_fails_for_lack_of_healthy_nodes_and_claims_nothing(
    cluster, api, s3, bucket, run_dag, capacity_before, capfd
):
    for index in range(6):  # 2 healthy nodes left; the run needs 2 + 1 spare
        cluster.inject("xid", f"gpu-node-{index:03d}", code=79)
    cluster.probe_daemon.wait_rounds(2)

    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "starved"))

    assert dag_run.state == "failed"
    tis = task_instances(dag_run)
    assert tis["health_gate"].state == "failed"
    assert tis["claim_nodes"].state == "upstream_failed"
    assert "need 3 healthy node(s), have 2 of 8" in capfd.readouterr().out
    assert jobs(api) == []
    assert_capacity_back(api, capacity_before)


def test_user_marking_the_training_failed_stops_the_job_and_gives_everything_back(
    cluster, api, s3, bucket, run_dag, capacity_before, triggerer_honours_mark_failed
):
    run_uri = f"s3://{bucket}/runs/stopped/"
    slow = [*TRAINER[:4], "600", *TRAINER[5:]]  # would run long
    when(training_running(s3, run_uri, 15), lambda: mark_failed(DAG_ID, "train"))
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "stopped", slow))

    assert dag_run.state == "failed"
    tis = task_instances(dag_run)
    assert tis["train"].state == "failed" and tis["train"].try_number == 1
    assert tis["return_capacity"].state == "success"
    kube = Kube.of(api)
    assert [w["spec"]["active"] for w in kube.list(kube.kueue("workloads"), "training")] == [False]
    assert [p["metadata"]["name"] for p in pods(api) if p["status"].get("phase") == "Running"] == []
    assert heartbeat_step(s3, run_uri) < 600
    assert_capacity_back(api, capacity_before)


def test_scheduled_retraining_runs_the_same_lifecycle_under_a_run_path_of_its_own(
    cluster, api, s3, bucket, run_dag, capacity_before
):
    """A scheduled run leaves run_name empty: its run path is derived from the DAG run, so next
    week's run never resumes from this one's checkpoints."""
    dag_run = run_dag("scheduled_retraining", lifecycle_conf(bucket, ""))

    assert dag_run.state == "success"
    verified = xcom_value(dag_run, "verify_checkpoint")
    own = f"s3://{bucket}/runs/{derived_run_name('scheduled_retraining', dag_run.run_id, dag_run.run_after)}/"
    assert own.startswith(f"s3://{bucket}/runs/scheduled-retraining-{dag_run.run_after:%Y%m%d-%H%M%S}-")
    assert verified["uri"] == f"{own}step-60/"
    assert latest_verified(own).checkpoint.step == 60
    assert_capacity_back(api, capacity_before)
