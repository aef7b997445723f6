"""Benchmark of the UI plugin's fleet API: its answer for 4,096 GPU nodes against its floor.

``ui_fleet``: ``GET /trainops/api/fleet`` (the plugin's FastAPI app mounted at ``/trainops`` as the
API server mounts it, called with a JWT of Airflow's auth manager, answer received and decoded)
against one paginated list of the same cluster's nodes (500 per request, fetched and decoded),
alternately, best of ``ROUNDS`` (5). The fleet adds the login, one row per node from its health
summary, taints and claim, the counts and the JSON answer.

``ui_tensor_activity``: ``GET /trainops/api/fleet/tensor-activity`` (the fleet view's tensor-core
column, answered apart from the fleet: through ``[trainops] prometheus_conn_id``) against the same
one Prometheus query asked bare, best of ``ROUNDS``. Prometheus is a real one scraping every node's
dcgm-exporter at the real 15 s interval (its scrapes run during both benchmarks).

The devcluster (every node's probe summary published, every exporter scraped) runs in a child process.
Prints ``bench ui_fleet: ... ratio=<r> target<=1.5 PASS|FAIL`` and ``bench ui_tensor_activity: ...``
with the load average; exits 1 on a miss, or when not every node has its tensor-core activity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results import record

NODES = 4096
ROUNDS = 5
TARGET = 1.5


def load() -> str:
    return "load=" + "/".join(f"{x:.1f}" for x in os.getloadavg())


def serve_devcluster(nodes: int) -> None:
    """``--serve N``: a devcluster of N GPU nodes, every probe summary published and every exporter
    scraped by its Prometheus; prints its kubeconfig and Prometheus URL as JSON, runs until stdin closes."""
    from trainops_devcluster.cluster import DevCluster
    from trainops_devcluster.prometheus import REAL_SCRAPE_INTERVAL_S

    with DevCluster(
        nodes=nodes,
        inference=[],
        probe_interval_s=3600,
        probe_gemm=False,
        prometheus=True,
        scrape_interval_s=REAL_SCRAPE_INTERVAL_S,
    ) as cluster:
        cluster.probe_daemon.wait_rounds(1, timeout=3600)
        cluster.wait_until_scraped(timeout=3600)
        print(
            json.dumps({"kubeconfig": str(cluster.kubeconfig), "prometheus": cluster.prometheus_url}),
            flush=True,
        )
        sys.stdin.read()


def bench_fleet(kubeconfig: str, prometheus_url: str) -> bool:
    from trainops_devcluster import airflow_home

    home = Path(tempfile.mkdtemp(prefix="bench-ui-airflow-"))
    airflow_home.configure(home, {"dags": home / "dags"})
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = airflow_home.kubernetes_connection(Path(kubeconfig))
    os.environ["AIRFLOW_CONN_BENCH_PROMETHEUS"] = json.dumps(
        {"conn_type": "trainops_prometheus", "host": prometheus_url, "extra": {"timeout": 600}}
    )
    os.environ["AIRFLOW__TRAINOPS__PROMETHEUS_CONN_ID"] = "bench_prometheus"
    airflow_home.migrate()

    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from trainops.plugins.app import app
    from trainops.plugins.fleet import TENSOR_ACTIVE

    from trainops.health.gate import list_paginated
    from trainops.health.prometheus import PrometheusClient
    from trainops.kube.client import Kube
    from trainops.kube.lists import PAGE
    from trainops.kube.retry import Deadline

    token = init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="bench", role="viewer"))
    root = FastAPI()
    root.mount("/trainops", app)
    kube = Kube.from_kubeconfig(kubeconfig)

    def list_nodes() -> list[dict]:  # the fleet's own paging (PAGE per request, raw JSON decoded)
        return list_paginated(kube.core.list_node, "", PAGE, Deadline(600), "nodes")

    def timed(request: Callable[[], Any]) -> tuple[float, Any]:
        start = time.perf_counter()
        answer = request()
        return time.perf_counter() - start, answer

    headers = {"Authorization": f"Bearer {token}"}
    prometheus = PrometheusClient(prometheus_url, timeout=600)
    floors, fleets, queries, activities = [], [], [], []
    with TestClient(root) as http:
        for _ in range(ROUNDS):
            floors.append(timed(list_nodes))
            fleets.append(timed(lambda: http.get("/trainops/api/fleet", headers=headers).json()))
            queries.append(
                timed(lambda: prometheus.query(f"avg by ({prometheus.node_label}) ({TENSOR_ACTIVE})"))
            )
            activities.append(
                timed(lambda: http.get("/trainops/api/fleet/tensor-activity", headers=headers).json())
            )
    listed, rows = len(floors[-1][1]), len(fleets[-1][1]["nodes"])
    active, error = len(activities[-1][1]["nodes"]), activities[-1][1]["error"]
    fastest = lambda runs: min(seconds for seconds, _ in runs)  # noqa: E731
    ratio = fastest(fleets) / fastest(floors)
    passed = ratio <= TARGET and rows == NODES
    print(
        f"bench ui_fleet: nodes={NODES} listed={listed} rows={rows} fleet={fastest(fleets):.2f}s "
        f"node_list={fastest(floors):.2f}s ratio={ratio:.2f} target<={TARGET} {'PASS' if passed else 'FAIL'} ({load()})",
        flush=True,
    )
    record(
        "ui_fleet",
        passed=passed,
        ratio=round(ratio, 3),
        target=f"<={TARGET}",
        nodes=NODES,
        rows=rows,
        fleet_s=round(fastest(fleets), 3),
        node_list_s=round(fastest(floors), 3),
    )
    tensor_ratio = fastest(activities) / fastest(queries)
    tensor_passed = tensor_ratio <= TARGET and active == NODES
    print(
        f"bench ui_tensor_activity: nodes={NODES} with_activity={active} answer={fastest(activities):.2f}s "
        f"bare_query={fastest(queries):.2f}s ratio={tensor_ratio:.2f} target<={TARGET} "
        f"{'PASS' if tensor_passed else 'FAIL'}{f' error={error}' if error else ''} ({load()})",
        flush=True,
    )
    record(
        "ui_tensor_activity",
        passed=tensor_passed,
        ratio=round(tensor_ratio, 3),
        target=f"<={TARGET}",
        nodes=NODES,
        with_activity=active,
        answer_s=round(fastest(activities), 3),
        bare_query_s=round(fastest(queries), 3),
    )
    return passed and tensor_passed


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
        return 0 if bench_fleet(ready["kubeconfig"], ready["prometheus"]) else 1
    finally:
        server.stdin.close()
        server.wait(timeout=600)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve_devcluster(int(sys.argv[2]))
    else:
        sys.exit(main())
