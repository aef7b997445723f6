"""The run view's API after a real ``training_lifecycle`` run (dag.test) with an XID mid-run:
where the run resumed from and why, the culprit, the checkpoints and the capacity, from Airflow's
database and S3 alone."""

from __future__ import annotations

from tests.e2e.conftest import DAG_ID, api, cluster, lifecycle_conf, training_running  # noqa: F401
from tests.e2e.test_lifecycle import running_training_pod
from tests.training.conftest import when


def test_the_run_view_answers_where_the_run_resumed_from_and_why(cluster, api, s3, bucket, run_dag, ui):  # noqa: F811
    http, token = ui
    run_uri, fault = f"s3://{bucket}/runs/ui-xid/", {}

    def inject():
        fault["node"] = running_training_pod(api, "1")["spec"]["nodeName"]
        cluster.inject("xid", fault["node"], code=79)

    when(lambda: training_running(s3, run_uri, 25)() and running_training_pod(api, "1"), inject)
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
    assert fault["node"] in view["ledger"]["excluded"]
    assert view["checkpoints"]["run_uri"] == run_uri and view["checkpoints"]["error"] is None
    assert view["checkpoints"]["checkpoint"]["uri"] == f"{run_uri}step-60/"
    assert view["published_checkpoint"]["step"] == 60
    claimed, returned = view["capacity"]["claimed"], view["capacity"]["returned"]
    assert len(claimed["node_names"]) == 3 and set(returned["node_names"]) == set(claimed["node_names"])
    assert view["tasks"]["train"]["state"] == "success" and view["tasks"]["train"]["try_number"] == 2

    missing = http.get(f"/trainops/api/runs/{DAG_ID}/no-such-run", headers=headers)
    assert missing.status_code == 404 and "no DAG run" in missing.json()["detail"]
    assert http.get(f"/trainops/api/runs/{DAG_ID}/{dag_run.run_id}").status_code == 401
