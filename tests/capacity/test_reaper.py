"""Claims cannot leak: a worker killed by SIGKILL mid-claim leaves nodes claimed, and
``trainops capacity reap`` returns them once Airflow's REST API says the DAG run is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.capacity.helpers import DEPLOYMENTS, default_seeded_objects, kube_for, nodes_by_app, snapshot
from trainops.capacity.procedure import claim, give_back
from trainops.cli import main
from trainops.kube.nodes import holder_of

GHOST, ALIVE = "training_lifecycle/manual__ghost", "training_lifecycle/manual__alive"
CLAIM = """
import sys
from trainops.capacity.procedure import claim
from trainops.kube.client import Kube
claim(Kube.from_kubeconfig(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), cluster_queue="training",
      deployments=sys.argv[4].split(","))
"""


@pytest.fixture
def airflow_api():
    """Airflow's ``GET /api/v2/dags/{dag_id}/dagRuns/{run_id}`` as the API server answers it: the
    alive run is running, any other run does not exist (404)."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(self.path)
            if self.path == "/api/v2/dags/training_lifecycle/dagRuns/manual__alive":
                body, status = json.dumps({"dag_run_id": "manual__alive", "state": "running"}), 200
            else:
                body, status = json.dumps({"detail": "DagRun not found"}), 404
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def holders(cluster) -> dict[str, str]:
    return {
        n["metadata"]["name"]: holder
        for n in cluster.store.list("nodes")[0]
        if (holder := holder_of(n["metadata"].get("annotations")))
    }


def test_a_claim_killed_by_sigkill_is_reaped_and_a_running_runs_claim_is_kept(
    devcluster, airflow_api, capsys
):
    url, asked = airflow_api
    default_seeded_objects(devcluster)
    where = nodes_by_app(devcluster)
    busy, idle = where["llm-chat"][:2], where["idle"][:1]
    before = snapshot(devcluster)
    kube = kube_for(devcluster)
    claim(kube, ALIVE, idle, cluster_queue="training")

    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLAIM,
            str(devcluster.kubeconfig),
            GHOST,
            ",".join(busy),
            ",".join(DEPLOYMENTS),
        ]
    )
    while GHOST not in holders(devcluster).values():  # killed once it holds a node, mid-claim
        assert worker.poll() is None, "the claim ended before it could be killed"
        time.sleep(0.01)
    os.kill(worker.pid, signal.SIGKILL)
    assert worker.wait(timeout=30) == -signal.SIGKILL
    assert GHOST in holders(devcluster).values()  # leaked: nothing ran its teardown

    args = ["capacity", "reap", "--kubeconfig", str(devcluster.kubeconfig), "--airflow-url", url]
    assert main([*args, "--grace", "0", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)

    assert summary["returned"] == [GHOST] and summary["failed"] == {}
    assert summary["kept"] == {ALIVE: "its DAG run is queued or running"}
    assert sorted(asked) == sorted(
        [
            "/api/v2/dags/training_lifecycle/dagRuns/manual__ghost",
            "/api/v2/dags/training_lifecycle/dagRuns/manual__alive",
        ]
    )
    assert holders(devcluster) == dict.fromkeys(idle, ALIVE)
    give_back(kube, ALIVE, cluster_queue="training")
    assert snapshot(devcluster) == before  # nodes, loans and quota exactly as before either claim


def test_reap_leaves_young_claims_and_runs_airflow_cannot_vouch_for(devcluster, airflow_api, capsys):
    url, asked = airflow_api
    default_seeded_objects(devcluster)
    node = nodes_by_app(devcluster)["idle"][:1]
    claim(kube_for(devcluster), GHOST, node, cluster_queue="training")
    kubeconfig = str(devcluster.kubeconfig)

    assert main(["capacity", "reap", "--kubeconfig", kubeconfig, "--airflow-url", url, "--json"]) == 0
    young = json.loads(capsys.readouterr().out)
    assert young["returned"] == [] and "grace period" in young["kept"][GHOST] and asked == []

    unreachable = ["--airflow-url", "http://127.0.0.1:9", "--grace", "0", "--json"]
    assert main(["capacity", "reap", "--kubeconfig", kubeconfig, *unreachable]) == 0
    assert json.loads(capsys.readouterr().out)["kept"] == {
        GHOST: "Airflow could not say whether its DAG run is alive"
    }

    assert (
        main(
            [
                "capacity",
                "reap",
                "--kubeconfig",
                kubeconfig,
                "--airflow-url",
                url,
                "--grace",
                "0",
                "--dry-run",
            ]
        )
        == 0
    )
    assert f"kept {GHOST}: dry run: would return 1 node(s)" in capsys.readouterr().out
    assert holders(devcluster) == dict.fromkeys(node, GHOST)

    assert main(["capacity", "reap", "--kubeconfig", kubeconfig, "--airflow-url", "localhost:8080"]) == 2
    assert "airflow_url: 'localhost:8080' is not an http(s) URL" in capsys.readouterr().err


def test_the_scheduled_reaper_dag_returns_a_gone_runs_claim(devcluster, run_dag):
    from trainops_devcluster.airflow_home import xcom_value

    default_seeded_objects(devcluster)
    node = nodes_by_app(devcluster)["idle"][:1]
    claim(kube_for(devcluster), GHOST, node, cluster_queue="training")

    dag_run = run_dag("trainops_reaper", {"grace_s": 0})

    assert dag_run.state == "success"
    assert xcom_value(dag_run, "reap_gone_runs")["returned"] == [GHOST]
    assert holders(devcluster) == {}


def test_a_retried_claim_finishes_the_same_claim_instead_of_taking_other_nodes(devcluster):
    where = nodes_by_app(devcluster)
    busy, idle = where["llm-chat"][0], where["idle"][0]
    kube = kube_for(devcluster)
    claim(kube, GHOST, [busy], cluster_queue="training")  # the first try got this far, then died

    summary = claim(kube, GHOST, [idle, busy], count=1, cluster_queue="training")  # the retry

    assert summary.node_names == [busy] and summary.newly_claimed == []
    assert holders(devcluster) == {busy: GHOST}
