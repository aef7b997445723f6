"""Gang training end to end: devcluster + local S3 + the Airflow DAG (``tests/dags/gang_training_e2e.py``).

Every run claims the idle GPU nodes (setup), trains with the demo trainer writing real checkpoints,
and gives the capacity back (teardown); faults are injected from a thread while the DAG runs.
"""

from __future__ import annotations

import json
import time

from trainops_devcluster.airflow_home import xcom_value

from tests.training.conftest import heartbeat_step, idle_nodes, jobs, node, pods, when
from trainops.checkpoints.latest import latest_verified
from trainops.conventions import (
    CLAIMED_BY_ANNOTATION,
    HEALTH_LABEL,
    QUARANTINE_EVIDENCE_ANNOTATION,
    QUARANTINE_TAINT,
)
from trainops.kube.kueue import resource

TRAIN = ["--steps", "300", "--checkpoint-every", "20", "--step-seconds", "0.02", "--heartbeat-every", "5"]


def conf(nodes, run_uri, args=TRAIN, **extra):
    return {"node_names": nodes, "run_uri": run_uri, "args": list(args), "size": 2, **extra}


def running_pod(api, attempt: str):
    return next(
        (
            p
            for p in pods(api)
            if p["metadata"]["labels"].get("trainops.io/attempt") == attempt
            and p["status"].get("phase") == "Running"
        ),
        None,
    )


def env_of(job) -> dict:
    return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def task_state(dag_run, task_id):
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: ti for ti in dag_run.get_task_instances(session=session)}[task_id]


def assert_capacity_returned(api, nodes):
    for name in nodes:
        annotations = node(api, name)["metadata"].get("annotations") or {}
        assert CLAIMED_BY_ANNOTATION not in annotations, f"{name} still claimed"


def test_xid_crash_quarantines_the_node_and_resumes_elsewhere_from_the_last_verified_step(
    cluster, api, s3, bucket, run_dag
):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/xid/"
    fault = {}

    def inject():
        pod = running_pod(api, "1")
        fault["node"], fault["step"] = pod["spec"]["nodeName"], heartbeat_step(s3, run_uri)
        cluster.inject("xid", fault["node"], code=79)

    when(lambda: heartbeat_step(s3, run_uri) >= 50 and running_pod(api, "1") is not None, inject)
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri))

    assert dag_run.state == "success"
    assert task_state(dag_run, "train").try_number == 1  # the trigger resumed, within the try
    result = xcom_value(dag_run, "train")
    assert result["attempts"] == 2 and result["resumes_used"] == 1
    culprit = fault["node"]
    bad = node(api, culprit)
    assert bad["metadata"]["labels"][HEALTH_LABEL] == "quarantined"
    taint = next(t for t in bad["spec"]["taints"] if t["key"] == QUARANTINE_TAINT)
    assert taint["effect"] == "NoSchedule" and taint["value"] == "xid-79"
    # blamed at once on the node's own word (its device plugin took the GPU out of allocatable at the
    # XID, before the node probe's next report); the pod's own "Xid 79" line is only a hint
    reason = json.loads(bad["metadata"]["annotations"][QUARANTINE_EVIDENCE_ANNOTATION])["reason"]
    assert "took them out of allocatable" in reason
    first = result["history"][0]
    assert first["kind"] == "infrastructure" and "took them out of allocatable" in first["ended"]
    assert any("'XID 79'" in hint for hint in first["hints"])
    assert "took them out of allocatable" in result["excluded_nodes"][culprit]
    second = [j for j in jobs(api) if j["metadata"]["labels"]["trainops.io/attempt"] == "2"]
    assert len(second) == 1
    resumed = env_of(second[0])["TRAINOPS_RESUME_FROM"]
    step = int(resumed.rstrip("/").rpartition("step-")[2])
    assert step % 20 == 0 and 40 <= step <= fault["step"] + 20 and fault["step"] - step <= 20 + 5
    attempt2_nodes = {
        p["spec"]["nodeName"] for p in pods(api) if p["metadata"]["labels"]["trainops.io/attempt"] == "2"
    }
    assert culprit not in attempt2_nodes and len(attempt2_nodes) == 2
    assert latest_verified(run_uri).checkpoint.step == 300
    assert_capacity_returned(api, set(nodes) - {culprit})


def test_user_code_exit_1_fails_at_once_without_using_a_resume(cluster, api, s3, bucket, run_dag):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/bug/"
    dag_run = run_dag(
        "gang_training_e2e", conf(nodes, run_uri, [*TRAIN, "--fail-at-step", "30", "--exit-code", "1"])
    )

    assert dag_run.state == "failed"
    train = task_state(dag_run, "train")
    assert train.state == "failed" and train.try_number == 1
    assert len(jobs(api)) == 1
    assert not any(HEALTH_LABEL in node(api, n)["metadata"].get("labels", {}) for n in nodes)
    assert task_state(dag_run, "give_back").state == "success"
    assert_capacity_returned(api, nodes)


def test_worker_killed_right_after_submitting_reattaches_to_the_one_job(cluster, api, s3, bucket, run_dag):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/killed/"
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri, kill_worker_after_submit=True))

    assert dag_run.state == "success"
    assert task_state(dag_run, "train").try_number == 2
    result = xcom_value(dag_run, "train")
    assert result["attempts"] == 1 and result["resumes_used"] == 0
    all_jobs = jobs(api)
    assert [j["metadata"]["labels"]["trainops.io/attempt"] for j in all_jobs] == ["1"]
    assert latest_verified(run_uri).checkpoint.step == 300


def test_crash_in_the_middle_of_a_save_resumes_from_the_previous_complete_checkpoint(
    cluster, api, s3, bucket, run_dag
):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/midsave/"
    bucket_name, _, prefix = run_uri[5:].partition("/")
    fault = {}

    def saving_at() -> int | None:
        body = s3.client().get_object(Bucket=bucket_name, Key=f"{prefix}heartbeat.json")["Body"].read()
        beat = json.loads(body)
        return beat["step"] if beat.get("saving") and beat["step"] >= 40 else None

    def in_save() -> bool:
        try:
            return saving_at() is not None and running_pod(api, "1") is not None
        except Exception:
            return False

    def inject():
        fault["step"] = saving_at()
        rank0 = next(
            p
            for p in pods(api)
            if p["metadata"]["name"].rsplit("-", 2)[-2] == "0"
            and p["metadata"]["labels"]["trainops.io/attempt"] == "1"
        )
        cluster.inject("crash-pod", f"training/{rank0['metadata']['name']}", exit_code=137)

    when(in_save, inject)
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri, [*TRAIN, "--save-seconds", "1.0"]))

    assert dag_run.state == "success"
    crashed = fault["step"]
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket_name, Prefix=f"{prefix}")["Contents"]}
    second = next(j for j in jobs(api) if j["metadata"]["labels"]["trainops.io/attempt"] == "2")
    assert env_of(second)["TRAINOPS_RESUME_FROM"] == f"{run_uri}step-{crashed - 20}/"
    assert f"{prefix}step-{crashed}/_COMMITTED" in keys  # re-saved and committed by attempt 2
    assert xcom_value(dag_run, "train")["history"][0]["kind"] == "infrastructure"


def test_hang_is_detected_the_job_stopped_and_the_run_resumed(cluster, api, s3, bucket, run_dag):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/hang/"
    fault = {}

    def inject():
        job = next(j for j in jobs(api) if j["metadata"]["labels"]["trainops.io/attempt"] == "1")
        fault["step"] = heartbeat_step(s3, run_uri)
        cluster.inject("hang", f"training/{job['metadata']['name']}")

    when(lambda: heartbeat_step(s3, run_uri) >= 50 and running_pod(api, "1") is not None, inject)
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri))

    assert dag_run.state == "success"
    history = xcom_value(dag_run, "train")["history"]
    assert [a["kind"] for a in history] == ["hang", "succeeded"]
    assert "no progress for" in history[0]["ended"]
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    workloads = custom.list_namespaced_custom_object(
        *resource(custom, "workloads")[:2], "training", "workloads"
    )
    first = next(
        w for w in workloads["items"] if w["metadata"]["ownerReferences"][0]["name"] == history[0]["job"]
    )
    assert first["spec"]["active"] is False
    assert history[1]["resume_step"] is not None and fault["step"] - history[1]["resume_step"] <= 25


def urgent_job(nodes: int) -> dict:
    """A higher-priority gang (simulated pods that run 2 s) that needs more quota than is free."""
    from trainops.training.job import build_job
    from trainops.training.spec import TrainingSpec

    spec = TrainingSpec(
        image="registry.example/urgent:1",
        command=["serve"],
        run_uri="s3://urgent/runs/u/",
        nodes=nodes,
        priority_class="training-urgent",
    )
    job = build_job(spec, name="urgent", dag_id="other", run_id="r", attempt=1, resume_from=None)
    job["spec"]["template"]["metadata"]["annotations"] = {"devcluster.trainops.io/run-seconds": "2"}
    return job


def test_preemption_by_a_higher_priority_workload_requeues_without_using_a_resume(
    cluster, api, s3, bucket, run_dag
):
    from kubernetes import client

    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/preempted/"
    when(
        lambda: heartbeat_step(s3, run_uri) >= 50 and running_pod(api, "1") is not None,
        lambda: client.BatchV1Api(api).create_namespaced_job("training", urgent_job(3)),
    )
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri))

    assert dag_run.state == "success"
    result = xcom_value(dag_run, "train")
    assert result["preemptions"] >= 1
    assert result["attempts"] == 1 and result["resumes_used"] == 0
    assert task_state(dag_run, "train").try_number == 1
    urgent = next(j for j in jobs(api) if j["metadata"]["name"] == "urgent")
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in urgent["status"]["conditions"])
    assert latest_verified(run_uri).checkpoint.step == 300


def test_resumes_exhausted_is_a_clear_final_error_and_the_teardown_still_runs(
    cluster, api, s3, bucket, run_dag, capfd
):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/exhausted/"
    # killed by SIGKILL from outside at step 30, every attempt: infrastructure, each one a resume
    dag_run = run_dag(
        "gang_training_e2e", conf(nodes, run_uri, [*TRAIN, "--fail-at-step", "30", "--exit-code", "137"])
    )

    assert dag_run.state == "failed"
    train = task_state(dag_run, "train")
    assert train.state == "failed" and train.try_number == 1  # the trigger made both resumes
    assert sorted(j["metadata"]["labels"]["trainops.io/attempt"] for j in jobs(api)) == ["1", "2", "3"]
    printed = capfd.readouterr().out
    assert "resumes exhausted after 3 attempts" in printed
    assert f"Latest verified checkpoint: {run_uri}step-20/ (step 20)" in printed
    assert task_state(dag_run, "give_back").state == "success"
    assert_capacity_returned(api, nodes)


def start_attempt(cluster, api, run: str, run_uri: str):
    """``run`` (``<dag_id>/<run_id>``) claims the idle nodes and begins its first attempt of the demo
    trainer on 2 of them, as ``train``'s first try does; returns its trigger, the run and the nodes."""
    import sys

    from trainops.operators.training import GangTrainingOperator
    from trainops.triggers.training import GangRunTrigger

    from trainops.capacity.procedure import claim
    from trainops.checkpoints.store import CheckpointStore
    from trainops.kube.client import Kube
    from trainops.training.cluster import GangCluster
    from trainops.training.decide import Budget
    from trainops.training.reconcile import TrainingRun

    nodes = idle_nodes(api)
    claim(Kube(api), run, nodes, cluster_queue="training")
    operator = GangTrainingOperator(
        task_id="train",
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args=TRAIN,
        run_uri=run_uri,
        nodes=2,
        kubeconfig=str(cluster.kubeconfig),
    )
    dag_id, _, run_id = run.partition("/")
    gang = TrainingRun(
        GangCluster(Kube(api)),
        "training",
        dag_id,
        run_id,
        spec=operator.spec(),
        store=CheckpointStore(),
        budget=Budget(max_resumes=1),
        follow_config=operator.follow_config(),
    )
    gang.reconcile()
    return GangRunTrigger(gang.to_dict(), kubeconfig=str(cluster.kubeconfig)), gang, nodes


def assert_training_stopped(api, s3, run_uri: str) -> None:
    """The Workload is deactivated, no pod of the run is running and its heartbeat no longer moves."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    workloads = custom.list_namespaced_custom_object(
        *resource(custom, "workloads")[:2], "training", "workloads"
    )
    assert [w["spec"]["active"] for w in workloads["items"]] == [False]
    for _ in range(600):  # the pods get SIGTERM and go
        if not [p for p in pods(api) if p["status"].get("phase") == "Running"]:
            break
        time.sleep(0.1)
    assert [p["metadata"]["name"] for p in pods(api) if p["status"].get("phase") == "Running"] == []
    step = heartbeat_step(s3, run_uri)
    time.sleep(0.5)
    assert heartbeat_step(s3, run_uri) == step  # nothing trains any more


def test_killing_the_deferred_task_stops_the_job_and_its_pods(cluster, api, s3, bucket):
    """Mark-failed in the UI runs the trigger's on_kill: the Workload is deactivated, the pods go."""
    import asyncio

    run_uri = f"s3://{bucket}/runs/killed-by-user/"
    trigger, _, _ = start_attempt(cluster, api, "tests/kill", run_uri)

    async def follow_then_kill():
        following = asyncio.create_task(anext(trigger.run()))
        while heartbeat_step(s3, run_uri) < 20:
            await asyncio.sleep(0.05)
        following.cancel()
        await trigger.on_kill()

    asyncio.run(follow_then_kill())
    assert_training_stopped(api, s3, run_uri)


def test_a_trigger_that_starts_after_the_teardown_stopped_the_run_does_not_resume_it(
    cluster, api, s3, bucket
):
    """Mark-failed before the triggerer ran the trigger: the teardown stopped attempt 1, then the trigger
    started (its cancel came later).  It must end the run as stopped, not submit attempt 2 on nodes being
    given back (seen on the services stack: a second, active Workload after the teardown)."""
    import asyncio

    from tests.devcluster.ctrl_support import wait_for
    from trainops.kube.client import Kube
    from trainops.kube.retry import Deadline
    from trainops.training.cluster import GangCluster
    from trainops.training.reconcile import stop_run

    run_uri = f"s3://{bucket}/runs/torn-down/"
    trigger, _, _ = start_attempt(cluster, api, "tests/torn-down", run_uri)
    wait_for(lambda: heartbeat_step(s3, run_uri) >= 5, "attempt 1 training")
    stop_run(GangCluster(Kube(api)), "training", "tests/torn-down", "the teardown", Deadline(60))

    event = asyncio.run(anext(trigger.run())).payload

    assert event["status"] == "failed" and "stopped: the teardown" in event["message"], event["message"]
    assert [j["metadata"]["labels"]["trainops.io/attempt"] for j in jobs(api)] == ["1"]


def test_returning_a_runs_capacity_by_hand_stops_its_training_first(cluster, api, s3, bucket):
    """`trainops capacity return` (and the reaper, the UI's return, the teardown: one give_back) on a
    run that is still training: its Job is stopped and its pods gone before any node goes back, so
    inference never lands next to a training pod."""
    from trainops.cli import main

    run_uri = f"s3://{bucket}/runs/returned-by-hand/"
    *_, nodes = start_attempt(cluster, api, "tests/returned", run_uri)
    while heartbeat_step(s3, run_uri) < 20:
        time.sleep(0.05)

    kubeconfig = str(cluster.kubeconfig)
    assert main(["capacity", "return", "--run", "tests/returned", "--kubeconfig", kubeconfig]) == 0

    assert_training_stopped(api, s3, run_uri)
    assert_capacity_returned(api, nodes)


def test_dropped_watches_and_api_error_bursts_neither_lose_the_run_nor_burn_a_resume(
    cluster, api, s3, bucket, run_dag
):
    """The follower re-lists and resumes its watches when they drop and rides out 429/503 answers."""
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/flaky-api/"

    def turbulence():
        for path in (r"/apis/kueue\.x-k8s\.io/", r"/apis/batch/v1/", r"/api/v1/namespaces/training/pods"):
            cluster.inject("api-fault", path=path, status=429, fraction=0.3)
            cluster.inject("api-fault", path=path, status=503, fraction=0.2)
        for _ in range(8):  # every drop makes the follower re-list and re-watch through the faults
            cluster.inject("drop-watches")
            time.sleep(0.5)
        cluster.server.faults.clear()

    when(lambda: heartbeat_step(s3, run_uri) >= 20, turbulence)
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri))

    assert dag_run.state == "success"
    result = xcom_value(dag_run, "train")
    assert result["attempts"] == 1 and result["resumes_used"] == 0
    assert latest_verified(run_uri).checkpoint.step == 300
    faulted = [e for e in cluster.server.audit.entries() if e["status"] in (429, 503)]
    assert any("watch" in e["path"] or e["verb"] == "list" for e in faulted)
    assert_capacity_returned(api, nodes)
