"""The plugin's JSON API against the devcluster: no data without a login, the fleet as the nodes
say, and the two actions changing the cluster only when allowed and confirmed, recorded on the node."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client
from trainops.plugins.actions import ACTION_ANNOTATION

from tests.capacity.helpers import DEPLOYMENTS, nodes_by_app
from trainops.capacity.procedure import claim
from trainops.conventions import CLAIMED_BY_ANNOTATION, MODE_TAINT, QUARANTINE_TAINT
from trainops.health.gate import GateConfig, run_gate
from trainops.health.quarantine import apply_quarantine
from trainops.kube.client import Kube
from trainops.kube.nodes import NodeState, edit_node, read_node, without_taint
from trainops.kube.retry import Deadline

NODE = "gpu-node-003"
RUN = "train_llm/manual__ui"


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def node_state(k8s, name: str = NODE) -> NodeState:
    return NodeState.of(read_node(client.CoreV1Api(k8s), name))


@pytest.fixture
def quarantined(devcluster, k8s):
    """NODE with XID 79, quarantined by the gate."""
    core = client.CoreV1Api(k8s)
    devcluster.inject("xid", NODE, code=79)
    devcluster.probe_daemon.wait_rounds(2)
    assert apply_quarantine(core, run_gate(core, GateConfig(speed_tiers=False)), Deadline(30)) == [NODE]
    return devcluster


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/trainops/api/fleet"),
        ("GET", "/trainops/api/fleet/tensor-activity"),
        ("GET", "/trainops/api/runs/train_llm/manual__1"),
        ("GET", "/trainops/api/runs/train_llm/manual__1/inference"),
        ("POST", f"/trainops/api/nodes/{NODE}/release"),
        ("POST", "/trainops/api/runs/train_llm/manual__1/return"),
    ],
)
def test_no_login_no_data(ui, devcluster, method, path):
    http, _ = ui
    anonymous = http.request(method, path, json={"confirm": NODE})
    forged = http.request(method, path, headers=bearer("not.a.jwt"), json={"confirm": NODE})
    foreign_cookie = http.request(method, path, cookies={"_token": "eyJhbGciOiJIUzUxMiJ9.e30.x"})
    assert anonymous.status_code == 401
    assert forged.status_code == 403 and foreign_cookie.status_code == 403
    assert all("nodes" not in r.text and "ledger" not in r.text for r in (anonymous, forged, foreign_cookie))


def test_a_login_that_may_not_read_dag_runs_gets_no_fleet(ui, devcluster, k8s):
    """The fleet names the DAG runs holding nodes: like the run view, only for users who may read DAG runs."""
    http, token = ui
    claim(Kube(k8s), RUN, ["gpu-node-010"], cluster_queue="training")
    answer = http.get("/trainops/api/fleet", headers=bearer(token(None, "mallory")))
    assert answer.status_code == 403 and RUN not in answer.text
    assert "'mallory' may not read the DAG runs" in answer.json()["detail"]


def test_fleet_shows_every_gpu_node_and_the_quarantine_with_its_reason(ui, quarantined, k8s):
    http, token = ui
    claim(Kube(k8s), RUN, ["gpu-node-010", "gpu-node-011"], cluster_queue="training")
    answer = http.get("/trainops/api/fleet", headers=bearer(token("viewer")))
    assert answer.status_code == 200
    fleet = answer.json()
    rows = {row["name"]: row for row in fleet["nodes"]}
    assert sorted(rows) == [f"gpu-node-{i:03d}" for i in range(16)]  # the CPU system nodes are left out
    bad = rows[NODE]
    assert bad["health"] == "quarantine" and any("xid" in r.lower() for r in bad["reasons"])
    assert bad["quarantine"]["reason"] == "gpu_lost.xid_fatal" and bad["quarantine"]["since"] > 0
    assert rows["gpu-node-010"]["claimed_by"] == RUN and rows["gpu-node-010"]["mode"] == "training"
    varying = {"health": None, "reasons": None, "findings": None, "reported_at": None}
    assert rows["gpu-node-001"] | varying == {
        "name": "gpu-node-001",
        "mode": "inference",
        "status": "serving",  # busy or idle, an inference node doing its job needs nobody
        "attention": False,
        **varying,
        "quarantine": None,
        "claimed_by": None,
        "gpus": 8,
        "gpu_model": "NVIDIA-H100-80GB-HBM3",
        "pool": "default",
        "report": "trainops-system/node-health-gpu-node-001",
        "domain": ["block-a", "rack-1"],
    }
    assert rows["gpu-node-001"]["reported_at"].endswith("Z")
    assert rows["gpu-node-001"]["health"] in ("ok", "warn")
    assert bad["status"] == "quarantined" and bad["attention"]
    assert rows["gpu-node-010"]["status"] == "training" and not rows["gpu-node-010"]["attention"]
    assert fleet["counts"] == {
        "total": 16,
        "attention": 1,  # the quarantined node alone
        "status": {"serving": 13, "training": 2, "quarantined": 1},
        "mode": {"inference": 14, "training": 2},
        "health": fleet["counts"]["health"],
        "quarantined": 1,
        "claimed": 2,
    }
    assert fleet["counts"]["health"]["quarantine"] == 1
    # nodes grouped by block (the devcluster's default fabric: blocks of 8): the quarantined one in block-a,
    # the claimed ones in block-b
    assert fleet["blocks"] == {
        "block-a": {"total": 8, "free": fleet["blocks"]["block-a"]["free"], "claimed": 0, "quarantined": 1},
        "block-b": {"total": 8, "free": fleet["blocks"]["block-b"]["free"], "claimed": 2, "quarantined": 0},
    }
    assert fleet["blocks"]["block-a"]["free"] <= 7 and fleet["blocks"]["block-b"]["free"] <= 6
    activity = http.get("/trainops/api/fleet/tensor-activity", headers=bearer(token("viewer")))
    assert activity.json() == {
        "configured": False,
        "error": None,
        "nodes": {},
    }  # no Prometheus: n/a, not an error


def test_a_node_whose_quarantine_taint_was_removed_by_hand_still_shows_quarantined(ui, quarantined, k8s):
    """The fleet counts a node as quarantined as a claim does (taint or label), so it can be released."""
    http, token = ui
    edit_node(client.CoreV1Api(k8s), NODE, lambda s: without_taint(s, QUARANTINE_TAINT), Deadline(30))
    rows = {
        r["name"]: r for r in http.get("/trainops/api/fleet", headers=bearer(token("viewer"))).json()["nodes"]
    }
    assert rows[NODE]["quarantine"]["since"] > 0 and rows["gpu-node-001"]["quarantine"] is None


def test_the_cookie_of_the_airflow_ui_logs_in(ui, devcluster):
    http, token = ui
    answer = http.get("/trainops/api/fleet", cookies={"_token": token("viewer")})
    assert answer.status_code == 200 and len(answer.json()["nodes"]) == 16


def test_release_needs_edit_rights_and_confirmation_then_rechecks_and_records(ui, quarantined, k8s):
    http, token = ui
    path = f"/trainops/api/nodes/{NODE}/release"
    viewer = http.post(path, headers=bearer(token("viewer")), json={"confirm": NODE})
    assert viewer.status_code == 403
    unconfirmed = http.post(path, headers=bearer(token("user")), json={})
    assert unconfirmed.status_code == 400 and "confirm must be 'gpu-node-003'" in unconfirmed.json()["detail"]
    still_bad = http.post(path, headers=bearer(token("user")), json={"confirm": NODE})
    assert still_bad.status_code == 409 and "still fails its health checks" in still_bad.json()["detail"]
    assert node_state(k8s).taint(QUARANTINE_TAINT) is not None
    assert ACTION_ANNOTATION not in node_state(k8s).annotations

    quarantined.telemetry[NODE].repair()
    quarantined.probe_daemon.wait_rounds(2)
    released = http.post(path, headers=bearer(token("user", "bob")), json={"confirm": NODE})
    assert released.status_code == 200 and released.json()["released"] is True
    after = node_state(k8s)
    assert after.taint(QUARANTINE_TAINT) is None and after.taint(MODE_TAINT) is not None
    record = json.loads(after.annotations[ACTION_ANNOTATION])
    assert record["who"] == "bob" and record["what"].startswith("released from quarantine") and record["when"]


def test_return_gives_the_run_nodes_back_and_records_it_on_each(ui, devcluster, k8s):
    http, token = ui
    held = ["gpu-node-012", "gpu-node-013"]
    claim(Kube(k8s), RUN, held, cluster_queue="training")
    path = f"/trainops/api/runs/{RUN}/return"
    wrong = http.post(path, headers=bearer(token("admin")), json={"confirm": "train_llm/other"})
    assert wrong.status_code == 400
    assert all(node_state(k8s, n).annotations.get(CLAIMED_BY_ANNOTATION) == RUN for n in held)

    answer = http.post(path, headers=bearer(token("admin", "carol")), json={"confirm": RUN})
    assert answer.status_code == 200, answer.text
    assert sorted(answer.json()["node_names"]) == held and answer.json()["gpus_returned"] == 16
    assert answer.json()["quota_returned"] == 16
    for name in held:
        state = node_state(k8s, name)
        assert CLAIMED_BY_ANNOTATION not in state.annotations
        assert state.taint(MODE_TAINT)["value"] == "inference"
        record = json.loads(state.annotations[ACTION_ANNOTATION])
        assert record["who"] == "carol" and record["what"] == f"capacity of run {RUN} returned"


def test_the_views_modules_are_served_from_the_package_and_the_old_pages_lead_into_the_ui(ui):
    http, _ = ui
    for name in ("fleet.js", "run.js", "common.js"):
        script = http.get(f"/trainops/static/{name}")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        assert "http" not in script.text.replace("https://", "")  # nothing from a CDN: the UI's own React
    assert 'useApi("fleet")' in http.get("/trainops/static/fleet.js").text
    assert http.get("/trainops/static/gpu.svg").headers["content-type"] == "image/svg+xml"
    assert http.get("/trainops/static/..%2Fapp.py").status_code == 404
    fleet = http.get("/trainops/fleet", follow_redirects=False)
    assert fleet.status_code == 307 and fleet.headers["location"] == "../plugin/trainops-fleet"
    run = http.get("/trainops/runs/train_llm/manual__1", follow_redirects=False)
    assert run.headers["location"] == "../../../dags/train_llm/runs/manual__1/plugin/trainops-run"


def test_a_missing_cluster_connection_is_named_with_its_fix(ui, monkeypatch):
    http, token = ui
    monkeypatch.delenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW__TRAINOPS__KUBERNETES_CONN_ID", "gpu_cluster")
    answer = http.get("/trainops/api/fleet", headers=bearer(token("viewer")))
    assert answer.status_code == 503
    assert answer.json()["detail"] == (
        "no Airflow connection 'gpu_cluster': create it, or name another in [trainops] kubernetes_conn_id"
    )


def test_tensor_core_activity_comes_from_one_prometheus_query_for_the_fleet(ui, make_devcluster, monkeypatch):
    """With [trainops] prometheus_conn_id naming a trainops_prometheus connection, each node's
    DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (mean over its GPUs) as a real Prometheus scraped it; Prometheus
    down: no values, the reason, and the fleet still answered."""
    http, token = ui
    cluster = make_devcluster(nodes=4, system_nodes=0, inference=[], prometheus=True)
    cluster.telemetry["gpu-node-002"].set_training_active(True)
    cluster.wait_until_scraped()
    monkeypatch.setenv(
        "AIRFLOW_CONN_DCGM_PROMETHEUS",
        json.dumps({"conn_type": "trainops_prometheus", "host": cluster.prometheus_url}),
    )
    monkeypatch.setenv("AIRFLOW__TRAINOPS__PROMETHEUS_CONN_ID", "dcgm_prometheus")
    path = "/trainops/api/fleet/tensor-activity"
    assert http.get(path).status_code == 401
    before = len(cluster.prometheus.query_log.read_text().splitlines())

    activity = http.get(path, headers=bearer(token("viewer"))).json()
    assert activity == {
        "configured": True,
        "error": None,
        "nodes": {"gpu-node-000": 0.0, "gpu-node-001": 0.0, "gpu-node-002": 0.58, "gpu-node-003": 0.0},
    }
    log = cluster.prometheus.query_log.read_text().splitlines()
    asked = [json.loads(line)["params"]["query"] for line in log[before:]]
    assert asked == ["avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)"]  # one for the whole fleet

    cluster.prometheus.stop()
    down = http.get(path, headers=bearer(token("viewer")))
    assert down.status_code == 200 and down.json()["nodes"] == {}
    assert "unreachable" in down.json()["error"]
    assert len(http.get("/trainops/api/fleet", headers=bearer(token("viewer"))).json()["nodes"]) == 4


def test_a_missing_prometheus_connection_leaves_the_column_empty_and_names_the_fix(ui, monkeypatch):
    http, token = ui
    monkeypatch.setenv("AIRFLOW__TRAINOPS__PROMETHEUS_CONN_ID", "dcgm_prometheus")
    answer = http.get("/trainops/api/fleet/tensor-activity", headers=bearer(token("viewer")))
    assert answer.status_code == 200
    assert answer.json() == {
        "configured": True,
        "error": "no Airflow connection 'dcgm_prometheus': create it (type trainops_prometheus), or name "
        "another in [trainops] prometheus_conn_id, or leave that setting empty",
        "nodes": {},
    }


FORBIDDEN = 'nodes is forbidden: User "system:serviceaccount:airflow:airflow-api-server" cannot list resource'


class _RefusingApiServer(BaseHTTPRequestHandler):
    """A Kubernetes API server whose RBAC grants the API server's identity nothing."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Forbidden",
                "code": 403,
                "message": FORBIDDEN,
            }
        ).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.servers
def test_a_cluster_that_refuses_the_api_server_is_named_not_a_bare_500(ui, tmp_path, monkeypatch):
    http, token = ui
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}),
    )
    try:
        answer = http.get("/trainops/api/fleet", headers=bearer(token("viewer")))
    finally:
        server.shutdown()
    assert answer.status_code == 502
    assert answer.json()["detail"].startswith(f"the cluster answered 403: {FORBIDDEN}")


def test_the_run_view_shows_the_inference_a_run_borrows_ready_by_pool(ui, devcluster, k8s):
    """A claim whose displaced replicas went to an overflow pool (here: the idle GPU nodes): the run's
    inference reads Ready replicas of the primary and of its overflow companion, now."""
    http, token = ui
    where = nodes_by_app(devcluster)
    pool = {"node_label": "nvidia.com/gpu.present=true"}
    claim(
        Kube(k8s),
        RUN,
        where["llm-chat"][:2],
        cluster_queue="training",
        deployments=DEPLOYMENTS,
        overflow_pool=pool,
    )

    answer = http.get(f"/trainops/api/runs/{RUN}/inference", headers=bearer(token("viewer")))

    assert answer.status_code == 200, answer.text
    assert answer.json()["workloads"] == [
        {
            "workload": "Deployment inference/llm-chat",
            "kind": "Deployment",
            "primary_ready": 6,
            "primary_replicas": 6,
            "overflow_ready": 2,
            "overflow_replicas": 2,
            "lent": 2,
            "offloaded": 2,
        }
    ]
    assert http.get(
        "/trainops/api/runs/train_llm/manual__other/inference", headers=bearer(token("viewer"))
    ).json() == {"workloads": []}
