"""Benchmark of the UI plugin's fleet API: its answer for 4,096 GPU nodes against its floor.

``ui_fleet``: ``GET /trainops/api/fleet`` (the plugin's FastAPI app mounted at ``/trainops`` as the
API server mounts it, called with a JWT of Airflow's auth manager, answer received and decoded)
against one paginated list of the same cluster's nodes (500 per request, fetched and decoded),
alternately, best of ``ROUNDS`` (5). The fleet adds the login, one row per node from its health
summary, taints and claim, the counts and the JSON answer. The devcluster (every node's probe
summary published) runs in a child process.

Prints ``bench ui_fleet: ... ratio=<r> target<=1.5 PASS|FAIL`` with the load average; exits 1 on a miss.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = 4096
ROUNDS = 5
TARGET = 1.5


def load() -> str:
    return "load=" + "/".join(f"{x:.1f}" for x in os.getloadavg())


def serve_devcluster(nodes: int) -> None:
    """``--serve N``: a devcluster of N GPU nodes, every probe summary published; prints its
    kubeconfig as JSON and runs until stdin closes."""
    from trainops_devcluster.cluster import DevCluster

    with DevCluster(nodes=nodes, inference=[], probe_interval_s=3600, probe_gemm=False) as cluster:
        cluster.probe_daemon.wait_rounds(1, timeout=3600)
        print(json.dumps({"kubeconfig": str(cluster.kubeconfig)}), flush=True)
        sys.stdin.read()


def bench_fleet(kubeconfig: str) -> bool:
    from trainops_devcluster import airflow_home

    home = Path(tempfile.mkdtemp(prefix="bench-ui-airflow-"))
    airflow_home.configure(home, {"dags": home / "dags"})
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = airflow_home.kubernetes_connection(Path(kubeconfig))
    airflow_home.migrate()

    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from trainops.plugins.app import app

    from trainops.kube.client import Kube
    from trainops.kube.lists import PAGE, list_all
    from trainops.kube.nodes import json_of
    from trainops.kube.retry import Deadline

    token = init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="bench", role="viewer"))
    root = FastAPI()
    root.mount("/trainops", app)
    kube = Kube.from_kubeconfig(kubeconfig)

    def list_nodes() -> list[dict]:
        def fetch(token: str | None) -> dict:
            return json_of(kube.core.list_node(limit=PAGE, _continue=token, _preload_content=False))

        return list_all(fetch, Deadline(600), "list nodes")

    floors, fleets, rows = [], [], 0
    with TestClient(root) as http:
        for _ in range(ROUNDS):
            start = time.perf_counter()
            listed = len(list_nodes())
            floors.append(time.perf_counter() - start)
            start = time.perf_counter()
            answer = http.get("/trainops/api/fleet", headers={"Authorization": f"Bearer {token}"})
            rows = len(answer.json()["nodes"])
            fleets.append(time.perf_counter() - start)
            assert answer.status_code == 200
    ratio = min(fleets) / min(floors)
    passed = ratio <= TARGET and rows == NODES
    print(
        f"bench ui_fleet: nodes={NODES} listed={listed} rows={rows} fleet={min(fleets):.2f}s "
        f"node_list={min(floors):.2f}s ratio={ratio:.2f} target<={TARGET} {'PASS' if passed else 'FAIL'} ({load()})",
        flush=True,
    )
    return passed


def main() -> int:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(NODES)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready = json.loads(server.stdout.readline() or "{}")
        if not ready:
            raise RuntimeError(f"the {NODES}-node devcluster did not start (exit {server.wait()})")
        return 0 if bench_fleet(ready["kubeconfig"]) else 1
    finally:
        server.stdin.close()
        server.wait(timeout=600)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve_devcluster(int(sys.argv[2]))
    else:
        sys.exit(main())
