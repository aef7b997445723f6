"""The lifecycle DAGs on the real services (scheduler, dag-processor, triggerer, a Celery worker, the
API server, PostgreSQL, Redis), driven only through REST API v2 as the UI does.

The tests share one stack and run in file order: each ends with the cluster given back.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from trainops_devcluster import stack, stack_spec

from tests.e2e.conftest import Capacity, assert_capacity_back
from tests.services.conftest import TERMINAL, trainer, wait_for
from tests.training.conftest import heartbeat_step
from trainops.conventions import KUEUE_JOB_UID_LABEL
from trainops.kube.client import Kube
from trainops.training.job import RUN_LABEL
from trainops.training.naming import run_key

DAG_ID = "training_lifecycle"


def run_workloads(api, run_id: str) -> list[dict]:
    """The Kueue Workloads of the run's Jobs."""
    from kubernetes import client

    jobs = client.BatchV1Api(api).list_namespaced_job(
        "training", label_selector=f"{RUN_LABEL}={run_key(DAG_ID, run_id)}"
    )
    uids = {job.metadata.uid for job in jobs.items}
    kube = Kube.of(api)
    return [
        w
        for w in kube.list(kube.kueue("workloads"), "training")
        if w["metadata"].get("labels", {}).get(KUEUE_JOB_UID_LABEL) in uids
    ]


def running_pods(api) -> list[str]:
    from kubernetes import client

    pods = client.CoreV1Api(api).list_namespaced_pod("training").items
    return [p.metadata.name for p in pods if p.status.phase == "Running"]


def test_make_up_started_every_described_service_and_it_is_healthy(services, airflow):
    """`make up` ran the commands docker-compose.yaml declares (both come from stack_spec)."""
    for name, command in stack_spec.AIRFLOW_COMMANDS.items():
        record = json.loads((services.state / "pids" / f"{name}.json").read_text())
        assert [os.path.basename(record["argv"][0]), *record["argv"][1:]] == ["airflow", *command]
    health = airflow.session.get(f"{airflow.base}/api/v2/monitor/health", timeout=30).json()
    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
        assert health[part]["status"] == "healthy", health
    # `make up` twice: the second finds the running stack and starts nothing.
    assert stack.up(services.state) == services.at


def test_trigger_twice_with_the_form_defaults_gives_two_runs_that_succeed_with_train_deferred(
    services, airflow
):
    """What a user pressing Trigger twice gets: the form's run_name is empty, so each DAG run derives
    its own run path and both train (the form's defaults run the demo trainer on the stack's cluster)."""
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)

    run_ids = ("api-happy", "api-happy-again")
    for run_id in run_ids:
        answer = airflow.trigger(DAG_ID, run_id, {})
        assert answer.status_code == 200, answer.text
    # Both runs are watched in one loop: following one to its end first would miss the other's deferral.
    seen: dict[str, list] = {run_id: [] for run_id in run_ids}

    def both_ended() -> bool:
        for run_id, states in seen.items():
            now = airflow.task_states(DAG_ID, run_id)
            if not states or states[-1] != now:
                states.append(now)
        return all(airflow.run(DAG_ID, run_id)["state"] in TERMINAL for run_id in run_ids)

    wait_for(both_ended, "both runs to end", timeout_s=480)

    paths = set()
    for run_id, states in seen.items():
        assert airflow.run(DAG_ID, run_id)["state"] == "success", states[-1]
        # The training task waited in the triggerer (no worker slot), not inline in a worker.
        assert "deferred" in [s["train"] for s in states]
        verified = airflow.ok(
            "GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/verify_checkpoint/xcomEntries/return_value"
        )["value"]
        verified = json.loads(verified) if isinstance(verified, str) else verified
        assert verified["step"] == 200
        assert verified["uri"].startswith(f"s3://{stack_spec.BUCKET}/runs/training-lifecycle-")
        prefix = verified["uri"].split("/", 3)[3]
        assert f"{prefix}_COMMITTED" in services.bucket_keys(prefix)
        paths.add(prefix.split("/")[1])
    assert len(paths) == 2
    assert_capacity_back(api, before)


@pytest.mark.parametrize(
    "conf, field",
    [
        ({"run_name": "Not_A_DNS_Label"}, "run_name"),
        ({"nodes": 0}, "nodes"),
        ({"checkpoint_uri": "/tmp/checkpoints"}, "checkpoint_uri"),
        ({"command": []}, "command"),
    ],
)
def test_bad_params_are_refused_by_the_api_naming_the_field_and_nothing_is_written(
    services, airflow, conf, field
):
    airflow.unpause(DAG_ID)
    runs_before = airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns")["total_entries"]
    writes_before, keys_before = len(services.cluster_writes()), services.bucket_keys()

    answer = airflow.trigger(DAG_ID, f"bad-{field}", conf)

    assert answer.status_code == 400, answer.text
    assert f"param {field}" in answer.json()["detail"]
    assert airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns")["total_entries"] == runs_before
    assert len(services.cluster_writes()) == writes_before
    assert services.bucket_keys() == keys_before


def start_long_run(services, airflow, run_id: str) -> None:
    """Trigger a run that trains for minutes; return once ``train`` is deferred and past step 10."""
    answer = airflow.trigger(DAG_ID, run_id, {"run_name": run_id, "command": trainer(3000, 0.05)})
    assert answer.status_code == 200, answer.text
    airflow.follow(DAG_ID, run_id, lambda _, states: states["train"] == "deferred")
    run_uri = f"s3://{stack_spec.BUCKET}/runs/{run_id}/"
    wait_for(lambda: heartbeat_step(services.s3, run_uri) >= 10, "the trainer's heartbeat at step 10")


def mark_failed(airflow, run_id: str) -> dict[str, str | None]:
    """The UI's "Mark run as failed"; returns the task states once the teardown has ended."""
    airflow.ok("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}", json={"state": "failed"})
    seen = airflow.follow(
        DAG_ID, run_id, lambda _, states: states["return_capacity"] in ("success", "failed")
    )
    return seen[-1]


def assert_stopped_before_returned(services, api, run_id: str, states: dict) -> None:
    """The teardown succeeded, and by the time it had the run's Workload was deactivated and its pods
    had stopped: it stops the run before it gives the nodes back."""
    assert (states["train"], states["return_capacity"]) == ("failed", "success"), states
    assert [w["spec"]["active"] for w in run_workloads(api, run_id)] == [False]
    assert running_pods(api) == []
    assert heartbeat_step(services.s3, f"s3://{stack_spec.BUCKET}/runs/{run_id}/") < 3000


def test_marking_the_run_failed_while_training_stops_the_job_and_returns_every_node(services, airflow):
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)
    start_long_run(services, airflow, "api-stopped")

    states = mark_failed(airflow, "api-stopped")

    assert_stopped_before_returned(services, api, "api-stopped", states)
    assert_capacity_back(api, before)
    # The run's own final state is Airflow's to decide: teardowns are not leaves, and the tasks the
    # PATCH failed or skipped are not leaves either, so Airflow 3.3 ends such a run "success".
    airflow.follow(DAG_ID, "api-stopped", lambda run, _: run["state"] in TERMINAL)


def test_with_the_triggerer_down_marking_the_run_failed_still_stops_the_job_before_the_nodes_return(
    services, airflow
):
    """No trigger on_kill stops this run (its triggerer is paused, as during a restart, which does
    not run on_kill at all): the teardown stops it before it returns the nodes."""
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)
    start_long_run(services, airflow, "api-stopped-no-triggerer")
    triggerer = json.loads((services.state / "pids" / "airflow-triggerer.json").read_text())["pid"]

    os.killpg(triggerer, signal.SIGSTOP)  # the triggerer and the trigger runner it started
    try:
        states = mark_failed(airflow, "api-stopped-no-triggerer")
        assert_stopped_before_returned(services, api, "api-stopped-no-triggerer", states)
        assert_capacity_back(api, before)
    finally:
        os.killpg(triggerer, signal.SIGCONT)
    airflow.follow(DAG_ID, "api-stopped-no-triggerer", lambda run, _: run["state"] in TERMINAL)


def test_with_no_node_passing_the_gate_waits_on_the_triggerer_then_fails_before_claiming(services, airflow):
    """A policy under which every probe report is stale (report_age over 0 s) excludes every node,
    none quarantined: the health gate defers, the triggerer re-checks the pool (as its own
    ServiceAccount) until health_wait_s is over, and the gate fails; nothing is claimed or trained."""
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)
    conf = {
        "run_name": "api-gate-waits",
        "health_policy_overrides": {"report_age": {"threshold": 0}},
        "health_wait_s": 12,
    }
    answer = airflow.trigger(DAG_ID, "api-gate-waits", conf)
    assert answer.status_code == 200, answer.text
    seen = airflow.follow(DAG_ID, "api-gate-waits", lambda run, _: run["state"] in TERMINAL)

    assert "deferred" in [states["health_gate"] for states in seen]
    assert seen[-1]["health_gate"] == "failed" and seen[-1]["train"] == "upstream_failed", seen[-1]
    assert airflow.run(DAG_ID, "api-gate-waits")["state"] == "failed"
    assert_capacity_back(api, before)


def test_an_asset_event_through_the_api_runs_scheduled_retraining(services, airflow):
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause("scheduled_retraining")
    assets = airflow.ok("GET", "/assets", params={"name_pattern": "training-data"})["assets"]
    (asset,) = [a for a in assets if a["name"] == "training-data"]

    event = airflow.ok("POST", "/assets/events", json={"asset_id": asset["id"], "extra": {"source": "test"}})
    assert event["asset_id"] == asset["id"]

    def triggered() -> list[dict]:
        runs = airflow.ok("GET", "/dags/scheduled_retraining/dagRuns")["dag_runs"]
        return [r for r in runs if r["run_type"] == "asset_triggered"]

    wait_for(lambda: triggered() != [], "the asset-triggered run")
    (run,) = triggered()
    airflow.follow("scheduled_retraining", run["dag_run_id"], lambda r, _: r["state"] in TERMINAL)
    assert airflow.run("scheduled_retraining", run["dag_run_id"])["state"] == "success"
    committed = [k for k in services.bucket_keys("runs/scheduled-retraining-") if k.endswith("/_COMMITTED")]
    assert committed, "no committed checkpoint under the derived run path runs/scheduled-retraining-<date>-…/"
    assert_capacity_back(api, before)
