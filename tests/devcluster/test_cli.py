"""``trainops devcluster up`` and ``inject`` as a user runs them: separate processes, stock kubectl."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.devcluster.kubectl_support import kubectl

pytestmark = pytest.mark.servers  # `trainops devcluster up` as a separate process

TRAINOPS = [sys.executable, "-m", "trainops.cli"]


@pytest.fixture
def running(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    server = subprocess.Popen(
        [
            *TRAINOPS,
            "devcluster",
            "up",
            "--nodes",
            "4",
            "--scrape-interval",
            "1",
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = [server.stdout.readline() for _ in range(6)]
    assert lines[0].startswith("devcluster API listening on http://127.0.0.1:"), lines
    assert lines[2] == f"devcluster log: {tmp_path / 'devcluster.log'}\n", lines
    assert lines[3].startswith("prometheus: http://127.0.0.1:"), lines
    assert lines[4] == f"prometheus log: {tmp_path / 'prometheus.log'}\n", lines
    ca = tmp_path / "devcluster-ca.crt"
    assert lines[5].startswith("HTTPS for ServiceAccount tokens: https://127.0.0.1:"), lines
    assert lines[5].endswith(f" (certificate: {ca})\n"), lines
    yield {
        "url": lines[0].rsplit(" ", 1)[1].strip(),
        "kubeconfig": kubeconfig,
        "prometheus": lines[3].split()[1],
        "secure": ["--server", lines[5].split()[4], "--certificate-authority", str(ca)],
    }
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0
    assert (tmp_path / "prometheus.log").is_file()  # the log it pointed at outlives it
    terminal = server.stderr.read() + server.stdout.read()
    assert "HTTP/1.1" not in terminal and "level=" not in terminal  # no request or Prometheus log lines


def test_up_serves_kubectl_and_inject_reaches_the_node_telemetry(running):
    url, kubeconfig = running["url"], running["kubeconfig"]
    nodes = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "name"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert nodes == [f"node/gpu-node-00{i}" for i in range(4)] + ["node/system-node-0", "node/system-node-1"]

    injected = subprocess.run(
        [
            *TRAINOPS,
            "devcluster",
            "inject",
            "--kubeconfig",
            str(kubeconfig),
            "xid",
            "gpu-node-001",
            "--code",
            "79",
        ],
        capture_output=True,
        text=True,
    )
    assert injected.returncode == 0, injected.stderr
    assert json.loads(injected.stdout)["fault"] == "xid"
    metrics = requests.get(f"{url}/devcluster/nodes/gpu-node-001/metrics", timeout=10).text
    assert any(
        line.startswith("DCGM_FI_DEV_XID_ERRORS") and line.endswith(" 79") for line in metrics.splitlines()
    )


def test_up_starts_a_real_prometheus_scraping_the_nodes_quietly(running):
    build = requests.get(f"{running['prometheus']}/api/v1/status/buildinfo", timeout=10).json()
    assert build["status"] == "success" and build["data"]["version"].startswith("2.")
    query = f"{running['prometheus']}/api/v1/query"
    deadline = time.monotonic() + 60
    nodes: list[str] = []
    while sorted(nodes) != [f"gpu-node-00{i}" for i in range(4)] and time.monotonic() < deadline:
        time.sleep(0.5)
        body = requests.get(
            query, params={"query": "count by (Hostname) (DCGM_FI_DEV_GPU_TEMP)"}, timeout=10
        ).json()
        nodes = [r["metric"]["Hostname"] for r in body["data"]["result"]]
    assert sorted(nodes) == [f"gpu-node-00{i}" for i in range(4)]


def test_inject_names_the_known_faults_when_given_an_unknown_one(running):
    kubeconfig = running["kubeconfig"]
    result = subprocess.run(
        [*TRAINOPS, "devcluster", "inject", "--kubeconfig", str(kubeconfig), "meteor", "gpu-node-001"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "unknown fault 'meteor'" in result.stderr and "xid" in result.stderr


def test_up_refuses_to_bind_beyond_loopback(tmp_path):
    result = subprocess.run(
        [*TRAINOPS, "devcluster", "up", "--host", "0.0.0.0", "--kubeconfig", str(tmp_path / "k")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "loopback" in result.stderr


def test_a_service_account_token_works_against_the_https_port_it_prints(running):
    admin = running["kubeconfig"]
    kubectl(admin, "create", "serviceaccount", "reader")
    token = kubectl(admin, "create", "token", "reader").stdout.strip()
    as_reader = [*running["secure"], "--token", token]

    def can_list_nodes() -> str:
        return kubectl(admin, "auth", "can-i", "list", "nodes", *as_reader, check=False).stdout.strip()

    assert can_list_nodes() == "no"
    kubectl(admin, "create", "clusterrolebinding", "reader", "--clusterrole=cluster-admin",
            "--serviceaccount=default:reader")  # fmt: skip
    assert can_list_nodes() == "yes"
