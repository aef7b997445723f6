"""The run view's API after a real ``training_lifecycle`` run (dag.test) with an XID mid-run:
where the run resumed from and why, the culprit, the checkpoints, the heartbeat and its rate, the
plot's data (when each attempt started and ended, when each checkpoint was committed) and the
capacity, from Airflow's database, S3 and the attempts' Jobs (the ledger).  Then the trainer's objects
and an attempt's recorded end turn hostile, and each fails alone with its reason while the rest is
still answered."""

from __future__ import annotations

import json

from trainops_devcluster.airflow_home import xcom_value

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
    assert first["nodes"] == second["nodes"] == 2  # each attempt's world size
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
    # the checkpoint interval, advised from the newest save's time and the run's one infrastructure failure
    advice = progress["interval"]
    assert heartbeat["last_save_s"] > 0 and advice["save_s"] == heartbeat["last_save_s"]
    assert advice["gpus"] == 16 and advice["failures"] == 1 and advice["prior"] is True
    assert advice["used_s"] > 0 and advice["summary"].startswith("save every ")

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

    # The ledger is the run's Jobs, read as the run's own tries read them: the same attempts, ends and
    # culprits as the task returned.
    assert [(a["number"], a["kind"], a["ended"]) for a in view["ledger"]["attempts"]] == [
        (h["number"], h["kind"], h["ended"]) for h in xcom_value(dag_run, "train")["history"]
    ]

    # An attempt's end on its Job turns hostile (oversized, then malformed): that attempt shows the reason
    # and no end; the other attempt, S3's parts and the checkpoints still answer.
    from trainops.kube.client import JOBS, Kube
    from trainops.training.ledger import END_ANNOTATION, MAX_END

    kube = Kube(api)

    def with_end(value: str) -> dict:
        kube.patch(JOBS, crashed["job"], {"metadata": {"annotations": {END_ANNOTATION: value}}}, "training")
        answer = http.get(path, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()

    oversized = with_end("x" * (MAX_END + 1))
    hostile, kept = oversized["ledger"]["attempts"]
    assert hostile["kind"] is None and f"over the {MAX_END}-character limit" in hostile["problems"][0]
    assert kept["kind"] == "succeeded" and oversized["ledger"]["error"] is None
    assert oversized["checkpoints"] == view["checkpoints"] and oversized["progress"]["commits"] == commits
    malformed = with_end(json.dumps({"verdict": "exploded"}))["ledger"]["attempts"][0]
    assert malformed["kind"] is None and "trainops.io/end.verdict must be one of" in malformed["problems"][0]

    # Without a usable cluster connection the ledger is unknown, and the connection is named.
    monkeypatch.setenv("AIRFLOW__TRAINOPS__KUBERNETES_CONN_ID", "gone_cluster")
    blind = http.get(path, headers=headers).json()
    assert "no Airflow connection 'gone_cluster'" in blind["ledger"]["error"]
    assert "no Airflow connection 'gone_cluster'" in blind["progress"]["errors"]["attempts"]
    assert blind["ledger"]["attempts"] == [] and blind["progress"]["commits"] == commits
