"""The lifecycle DAGs on the real services (scheduler, dag-processor, triggerer, a Celery worker, the
API server, PostgreSQL, Redis), driven only through REST API v2 as the UI does.

The tests share one stack and run in file order: each ends with the cluster given back.
"""

from __future__ import annotations

import json
import os

import pytest
from trainops_devcluster import stack, stack_spec

from tests.e2e.conftest import Capacity, assert_capacity_back
from tests.services.conftest import TERMINAL, trainer, wait_for
from tests.training.conftest import heartbeat_step

DAG_ID = "training_lifecycle"
KUEUE = ("kueue.x-k8s.io", "v1beta2", "training", "workloads")


def unfinished_workloads(api) -> list[dict]:
    """Kueue Workloads without a ``Finished`` condition (earlier runs' Workloads are finished)."""
    from kubernetes import client

    return [
        w
        for w in client.CustomObjectsApi(api).list_namespaced_custom_object(*KUEUE)["items"]
        if not any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in (w.get("status") or {}).get("conditions", [])
        )
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


def test_trigger_with_params_succeeds_with_train_deferred_on_the_triggerer(services, airflow):
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)

    answer = airflow.trigger(DAG_ID, "api-happy", {"run_name": "api-happy", "command": trainer(60, 0.05)})
    assert answer.status_code == 200, answer.text
    seen = airflow.follow(DAG_ID, "api-happy", lambda run, _: run["state"] in TERMINAL)

    assert airflow.run(DAG_ID, "api-happy")["state"] == "success", seen[-1]
    # The training task waited in the triggerer (no worker slot), not inline in a worker.
    assert "deferred" in [states["train"] for states in seen]
    verified = airflow.ok(
        "GET", f"/dags/{DAG_ID}/dagRuns/api-happy/taskInstances/verify_checkpoint/xcomEntries/return_value"
    )["value"]
    verified = json.loads(verified) if isinstance(verified, str) else verified
    assert verified["step"] == 60
    assert verified["uri"].startswith(f"s3://{stack_spec.BUCKET}/runs/api-happy/")
    prefix = verified["uri"].split("/", 3)[3]
    assert f"{prefix}_COMMITTED" in services.bucket_keys(prefix)
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


def test_marking_the_run_failed_while_training_stops_the_job_and_returns_every_node(services, airflow):
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)
    run_uri = f"s3://{stack_spec.BUCKET}/runs/api-stopped/"
    answer = airflow.trigger(
        DAG_ID, "api-stopped", {"run_name": "api-stopped", "command": trainer(3000, 0.05)}
    )
    assert answer.status_code == 200, answer.text
    airflow.follow(DAG_ID, "api-stopped", lambda _, states: states["train"] == "deferred")
    wait_for(lambda: heartbeat_step(services.s3, run_uri) >= 10, "the trainer's heartbeat at step 10")

    airflow.ok("PATCH", f"/dags/{DAG_ID}/dagRuns/api-stopped", json={"state": "failed"})
    seen = airflow.follow(
        DAG_ID, "api-stopped", lambda _, states: states["return_capacity"] in ("success", "failed")
    )

    states = seen[-1]
    assert states["train"] == "failed"
    assert states["return_capacity"] == "success", states
    # The triggerer cancels the trigger and its on_kill deactivates the Workload. It may do so after
    # the teardown has already returned the nodes (the teardown does not wait for the Job to stop).
    wait_for(
        lambda: [w["spec"]["active"] for w in unfinished_workloads(api)] == [False],
        "the run's Workload to be deactivated (spec.active=false)",
    )
    wait_for(lambda: running_pods(api) == [], "the training pods to stop")
    stopped_at = heartbeat_step(services.s3, run_uri)
    assert stopped_at < 3000
    assert_capacity_back(api, before)
    # The run's own final state is Airflow's to decide: teardowns are not leaves, and the tasks the
    # PATCH failed or skipped are not leaves either, so Airflow 3.3 ends such a run "success".
    airflow.follow(DAG_ID, "api-stopped", lambda run, _: run["state"] in TERMINAL)


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
    committed = [k for k in services.bucket_keys("runs/retrain-") if k.endswith("/_COMMITTED")]
    assert committed, "no committed checkpoint under the dated run path runs/retrain-<date>/"
    assert_capacity_back(api, before)
