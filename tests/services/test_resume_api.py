"""Resumes on the real services: an XID mid-run (the triggerer resumes it on the spare) and a "Clear"
of ``train`` after a user-code failure (a resume with a fresh budget), all through REST API v2."""

from __future__ import annotations

import shlex

import requests
from trainops_devcluster import stack_spec

from tests.e2e.conftest import Capacity, assert_capacity_back
from tests.services.conftest import TERMINAL, trainer, wait_for
from tests.training.conftest import heartbeat_step
from trainops.conventions import HEALTH_LABEL, QUARANTINE_EVIDENCE_ANNOTATION, QUARANTINE_TAINT
from trainops.training.job import ATTEMPT_LABEL, RUN_LABEL
from trainops.training.naming import run_key

DAG_ID = "training_lifecycle"


def training_pods(api, run_id: str, attempt: str) -> list:
    """The training pods of DAG run ``run_id``'s attempt ``attempt`` (earlier tests' runs leave theirs)."""
    from kubernetes import client

    selector = f"{RUN_LABEL}={run_key(DAG_ID, run_id)},{ATTEMPT_LABEL}={attempt}"
    return client.CoreV1Api(api).list_namespaced_pod("training", label_selector=selector).items


def committed_steps(services, prefix: str) -> list[int]:
    """The steps of the committed checkpoints under ``prefix`` (``runs/<run>/``)."""
    return [
        int(k.split("/")[2].removeprefix("step-"))
        for k in services.bucket_keys(prefix)
        if k.endswith("/_COMMITTED")
    ]


def xcom(airflow, run_id: str, task_id: str):
    return airflow.ok(
        "GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    )["value"]


def followed_past_step_20(services, airflow, api, run_id: str) -> str:
    """Wait until the triggerer holds ``run_id``'s trigger and attempt 1 trains past its step-20 checkpoint;
    returns a node attempt 1 runs on."""
    run_uri = f"s3://{stack_spec.BUCKET}/runs/{run_id}/"
    wait_for(
        lambda: (
            (airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train")["trigger"] or {}).get(
                "triggerer_id"
            )
            is not None
            and heartbeat_step(services.s3, run_uri) >= 25
            and any(p.status.phase == "Running" for p in training_pods(api, run_id, "1"))
        ),
        "attempt 1 followed by the triggerer and past its step-20 checkpoint",
    )
    return next(p.spec.node_name for p in training_pods(api, run_id, "1") if p.status.phase == "Running")


def test_an_xid_mid_run_quarantines_the_node_and_the_trigger_resumes_on_the_spare(services, airflow):
    from kubernetes import client

    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)
    answer = airflow.trigger(DAG_ID, "api-xid", {"run_name": "api-xid", "command": trainer(200, 0.05)})
    assert answer.status_code == 200, answer.text
    airflow.follow(DAG_ID, "api-xid", lambda _, states: states["train"] == "deferred")
    # Inject once the triggerer holds the trigger, so the XID lands while the trigger follows the run.
    culprit = followed_past_step_20(services, airflow, api, "api-xid")
    injected = requests.post(
        f"{services.at.devcluster_url}/devcluster/faults/xid",
        json={"target": culprit, "code": 79},
        timeout=30,
    )
    assert injected.status_code == 200, injected.text
    # Attempt 1 can commit nothing more once its gang is broken: this is where attempt 2 must resume.
    wait_for(
        lambda: not any(p.status.phase == "Running" for p in training_pods(api, "api-xid", "1")),
        "attempt 1 to end",
    )
    last_committed = max(committed_steps(services, "runs/api-xid/"))

    airflow.follow(DAG_ID, "api-xid", lambda run, _: run["state"] in TERMINAL)

    assert airflow.run(DAG_ID, "api-xid")["state"] == "success"
    train = airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns/api-xid/taskInstances/train")
    assert train["try_number"] == 1  # the triggerer resumed the run itself: no Airflow retry
    trained = xcom(airflow, "api-xid", "train")
    assert trained["attempts"] == 2 and trained["resumes_used"] == 1
    assert trained["history"][1]["resume_step"] == last_committed >= 20  # step 20 came before beat 25
    node = client.CoreV1Api(api).read_node(culprit)
    assert node.metadata.labels[HEALTH_LABEL] == "quarantined"
    assert QUARANTINE_EVIDENCE_ANNOTATION in node.metadata.annotations
    assert any(t.key == QUARANTINE_TAINT for t in node.spec.taints)
    second = {p.spec.node_name for p in training_pods(api, "api-xid", "2")}
    assert len(second) == 2 and culprit not in second
    assert xcom(airflow, "api-xid", "verify_checkpoint")["step"] == 200
    assert_capacity_back(api, before)  # the culprit stays quarantined, out of both pools
    # the trigger's judgement is in the try's log, as the UI shows it (its start() judges an attempt that
    # failed before it followed it; otherwise its follow does)
    log = airflow.ok(
        "GET", f"/dags/{DAG_ID}/dagRuns/api-xid/taskInstances/train/logs/1", params={"full_content": "true"}
    )
    events = [str(line.get("event", "")) for line in log["content"]]
    assert any(e.startswith(f"quarantined node {culprit}") for e in events), events
    assert any(e.startswith("attempt 1 ended: infrastructure: node fault") for e in events), events
    assert any(e.startswith("attempt 2: Job") for e in events), events


def test_clear_after_a_user_code_failure_resumes_from_the_last_verified_checkpoint(services, airflow):
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)
    # A bug that the fresh start hits at step 25; the fixed code, resumed, runs to the end.
    fails_once = shlex.join(trainer(60, 0.05))
    command = [
        "sh",
        "-c",
        f'if [ -z "$TRAINOPS_RESUME_FROM" ]; then {fails_once} --fail-at-step 25; else {fails_once}; fi',
    ]
    conf = {"run_name": "api-clear", "command": command, "max_resumes": 0}
    answer = airflow.trigger(DAG_ID, "api-clear", conf)
    assert answer.status_code == 200, answer.text
    airflow.follow(DAG_ID, "api-clear", lambda run, _: run["state"] in TERMINAL)
    states = airflow.task_states(DAG_ID, "api-clear")
    assert (states["train"], states["return_capacity"]) == ("failed", "success"), states
    assert_capacity_back(api, before)
    committed = committed_steps(services, "runs/api-clear/")
    assert committed, "the failed attempt committed no checkpoint before step 25"

    # The UI's "Clear" on train (with its downstream tasks), as the dialog sends it.
    cleared = airflow.ok(
        "POST",
        f"/dags/{DAG_ID}/clearTaskInstances",
        json={
            "dag_run_id": "api-clear",
            "task_ids": [["train", -1]],
            "dry_run": False,
            "only_failed": False,
            "include_upstream": False,
            "include_downstream": True,
            "include_future": False,
            "include_past": False,
            "run_on_latest_version": False,
        },
    )
    assert "train" in {ti["task_id"] for ti in cleared["task_instances"]}
    airflow.follow(DAG_ID, "api-clear", lambda run, _: run["state"] in TERMINAL)

    assert airflow.run(DAG_ID, "api-clear")["state"] == "success", airflow.task_states(DAG_ID, "api-clear")
    trained = xcom(airflow, "api-clear", "train")
    assert trained["history"][-1]["resume_step"] == max(committed)  # the last verified checkpoint
    assert xcom(airflow, "api-clear", "verify_checkpoint")["step"] == 60
    assert_capacity_back(api, before)
