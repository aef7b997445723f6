"""The run view's API after a real ``training_lifecycle`` run (dag.test) with an XID mid-run:
where the run resumed from and why, the culprit, the checkpoints, the heartbeat and its rate, the
plot's data (when each attempt started and ended, when each checkpoint was committed) and the
capacity, from Airflow's database, S3 and the attempts' Jobs.  Then the trainer's objects and the
ledger turn hostile, and each fails alone with its reason while the rest is still answered."""

from __future__ import annotations

import json

from sqlalchemy import update

from tests.e2e.conftest import DAG_ID, api, cluster, lifecycle_conf, xid_mid_run  # noqa: F401
from trainops.checkpoints.uri import S3Uri


def test_the_run_view_answers_where_the_run_resumed_from_and_why(
    cluster,  # noqa: F811
    api,  # noqa: F811
    s3,
    bucket,
    run_dag,
    ui,
    monkeypatch,
):
    http, token = ui
    run_uri = f"s3://{bucket}/runs/ui-xid/"
    fault = xid_mid_run(cluster, api, s3, run_uri)
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "ui-xid"))
    assert dag_run.state == "success"

    headers = {"Authorization": f"Bearer {token('viewer')}"}
    answer = http.get(f"/trainops/api/runs/{DAG_ID}/{dag_run.run_id}", headers=headers)
    assert answer.status_code == 200, answer.text
    view = answer.json()
    first, second = view["ledger"]["attempts"]
    assert first["resume_from"] is None and first["kind"] not in (None, "succeeded")
    assert second["resume_from"].startswith(run_uri) and second["resume_step"] >= 20
    assert second["kind"] == "succeeded"
    assert fault["node"] in view["ledger"]["excluded"] and view["ledger"]["error"] is None
    assert view["checkpoints"]["run_uri"] == run_uri and view["checkpoints"]["error"] is None
    assert view["checkpoints"]["checkpoint"]["uri"] == f"{run_uri}step-60/"
    assert view["published_checkpoint"]["step"] == 60
    claimed, returned = view["capacity"]["claimed"], view["capacity"]["returned"]
    assert len(claimed["node_names"]) == 3 and set(returned["node_names"]) == set(claimed["node_names"])
    assert view["tasks"]["train"]["state"] == "success" and view["tasks"]["train"]["try_number"] == 1

    progress = view["progress"]
    assert progress["errors"] == {"heartbeat": None, "commits": None, "attempts": None}
    crashed, resumed = progress["attempts"]
    assert crashed["culprits"] == [fault["node"]] and crashed["kind"] == first["kind"]
    assert resumed["culprits"] == [] and resumed["resume_step"] == second["resume_step"]
    assert crashed["started_at"] <= crashed["ended_at"] <= resumed["started_at"] <= resumed["ended_at"]
    commits = progress["commits"]
    assert sorted(c["step"] for c in commits) == [10, 20, 30, 40, 50, 60]
    assert all(crashed["started_at"] <= c["at"] <= resumed["ended_at"] + 1 for c in commits)
    heartbeat = progress["heartbeat"]
    assert heartbeat["step"] == 60 and heartbeat["saving"] is False
    rate = progress["rate"]
    of_attempt_2 = {c["step"] for c in commits if c["at"] >= resumed["started_at"]}
    assert rate["step"] in of_attempt_2 - {60} and rate["step"] > second["resume_step"]
    assert rate["steps_per_s"] == (60 - rate["step"]) / (heartbeat["at"] - rate["at"]) > 0

    missing = http.get(f"/trainops/api/runs/{DAG_ID}/no-such-run", headers=headers)
    assert missing.status_code == 404 and "no DAG run" in missing.json()["detail"]
    assert http.get(f"/trainops/api/runs/{DAG_ID}/{dag_run.run_id}").status_code == 401

    # The trainer's heartbeat turns hostile: too large, then not a step; each fails alone.
    run = S3Uri.parse(run_uri)
    client = s3.client()
    path = f"/trainops/api/runs/{DAG_ID}/{dag_run.run_id}"

    def with_heartbeat(body: bytes) -> dict:
        client.put_object(Bucket=run.bucket, Key=run.key("heartbeat.json"), Body=body)
        answer = http.get(path, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()

    huge = with_heartbeat(json.dumps({"step": 61, "time": heartbeat["at"], "pad": "x" * (64 << 10)}).encode())
    assert "heartbeat.json is" in huge["progress"]["errors"]["heartbeat"]
    assert "over the 65536-byte limit" in huge["progress"]["errors"]["heartbeat"]
    assert huge["progress"]["heartbeat"] is None and huge["progress"]["rate"] is None
    assert huge["progress"]["commits"] == commits and huge["progress"]["attempts"] == progress["attempts"]
    assert huge["checkpoints"] == view["checkpoints"] and huge["ledger"] == view["ledger"]

    wrong = with_heartbeat(b'{"step": "sixty", "time": 1}')
    assert wrong["progress"]["errors"]["heartbeat"] == (
        f"{run_uri}heartbeat.json: step must be a non-negative integer, got 'sixty'"
    )
    future = with_heartbeat(b'{"step": 70, "time": 1e12}')
    assert "time must be Unix seconds no later than now" in future["progress"]["errors"]["heartbeat"]
    assert future["progress"]["commits"] == commits

    # The ledger is unreadable (oversized, then malformed): empty with its reason; S3's parts still answer.
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session

    def with_ledger(value: str) -> dict:
        with create_session() as session:
            session.execute(
                update(TaskStateStoreModel)
                .where(TaskStateStoreModel.run_id == dag_run.run_id, TaskStateStoreModel.task_id == "train")
                .values(value=value)
            )
        answer = http.get(path, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()

    # Mid-run the task state holds the ledger as the task deferred (attempt 1 live); the attempt its
    # trigger began since is shown from its Job.
    as_deferred = {
        "attempts": [first | {"phase": "submitted", "kind": None, "ended": None}],
        "excluded": {},
        "preemptions": 0,
    }
    mid_run = with_ledger(json.dumps(as_deferred))["progress"]["attempts"]
    assert [(a["number"], a["job"]) for a in mid_run] == [(1, crashed["job"]), (2, resumed["job"])]
    assert mid_run[1]["resume_step"] == second["resume_step"] and mid_run[1]["kind"] is None

    oversized = with_ledger(json.dumps({"attempts": [], "pad": "x" * (4 << 20)}))
    assert oversized["ledger"]["attempts"] == []
    assert [a["number"] for a in oversized["progress"]["attempts"]] == [1, 2]  # from the Jobs alone
    assert "over the 4194304-character limit" in oversized["ledger"]["error"]
    assert oversized["checkpoints"] == view["checkpoints"] and oversized["progress"]["commits"] == commits
    malformed = with_ledger(json.dumps({"attempts": [{"number": 1, "phase": "exploded"}]}))
    assert malformed["ledger"]["error"].startswith("the attempt ledger (train's task state")
    assert "cannot be read" in malformed["ledger"]["error"]

    # Without a usable cluster connection the attempts' times are unknown, and the connection is named.
    with_ledger(json.dumps(view["ledger"] | {"error": None}))
    monkeypatch.setenv("AIRFLOW__TRAINOPS__KUBERNETES_CONN_ID", "gone_cluster")
    blind = http.get(path, headers=headers).json()["progress"]
    assert "no Airflow connection 'gone_cluster'" in blind["errors"]["attempts"]
    assert [a["started_at"] for a in blind["attempts"]] == [None, None] and blind["commits"] == commits
