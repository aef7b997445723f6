"""The health gate end to end on the devcluster: A has XID 79, B an InfiniBand port down, C a GPU 30%
slow, D no telemetry at all. Through the core, the CLI and the operator in a real DAG."""

from __future__ import annotations

import json

import pytest
from kubernetes import client, config
from trainops_devcluster import airflow_home
from trainops_devcluster.airflow_home import xcom_value
from trainops_devcluster.cluster import DevCluster

from trainops.cli import main
from trainops.conventions import HEALTH_LABEL, QUARANTINE_TAINT
from trainops.health.gate import GateConfig, run_gate
from trainops.health.prometheus import PrometheusClient
from trainops.health.quarantine import EVIDENCE_ANNOTATION, apply_quarantine
from trainops.kube.nodes import NodeState, read_node
from trainops.kube.retry import Deadline

# C is one of the idle nodes (inference fills 000-008): the probe times its GEMM on idle GPUs only.
A, B, C, D = "gpu-node-001", "gpu-node-002", "gpu-node-009", "gpu-node-004"
WRITES = ("create", "update", "patch", "delete")


@pytest.fixture
def cluster(monkeypatch):
    """12 nodes; D's telemetry is missing from the start, then A, B and C get their faults."""
    cluster = DevCluster(nodes=12, gpus_per_node=8, prometheus=True)
    cluster.telemetry[D].set_missing()
    with cluster:
        cluster.wait_until_settled()
        cluster.inject("xid", A, code=79)
        cluster.inject("ib-down", B)
        cluster.inject("slow-gpu", C, factor=0.7)
        cluster.probe_daemon.wait_rounds(2)
        cluster.wait_until_scraped()
        monkeypatch.setenv(
            "AIRFLOW_CONN_KUBERNETES_DEFAULT", airflow_home.kubernetes_connection(cluster.kubeconfig)
        )
        prometheus = {"conn_type": "http", "host": cluster.prometheus_url}
        monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS", json.dumps(prometheus))
        yield cluster


@pytest.fixture
def core_v1(cluster):
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client.CoreV1Api(api_client)
    api_client.close()


def writes(cluster) -> list[dict]:
    return [e for e in cluster.server.audit.entries() if e["verb"] in WRITES]


def assert_quarantined(core_v1, name: str, rows: set[str]) -> None:
    node = read_node(core_v1, name)
    state = NodeState.of(node)
    taint = state.taint(QUARANTINE_TAINT)
    assert taint["effect"] == "NoSchedule" and rows <= set(taint["value"].split("."))
    assert state.labels[HEALTH_LABEL] == "quarantined"
    evidence = json.loads(state.annotations[EVIDENCE_ANNOTATION])
    assert evidence["verdict"] == "quarantine" and rows <= {e["row"] for e in evidence["evidence"]}
    assert any(t["key"] == "trainops.io/mode" for t in state.taints)  # the foreign taint is kept


def test_gate_quarantines_a_and_b_keeps_c_out_excludes_d_and_returns_the_rest(cluster, core_v1):
    prometheus = PrometheusClient(cluster.prometheus_url)
    result = run_gate(core_v1, GateConfig(min_nodes=6), prometheus=prometheus)
    verdicts = {n.name: n for n in result.nodes}
    healthy = sorted(set(cluster.telemetry) - {A, B, C, D})

    assert result.enough and sorted(result.selected) == healthy, result.table()
    assert verdicts[A].verdict == verdicts[B].verdict == "quarantine"
    assert verdicts[C].verdict == "exclude" and "straggler" in verdicts[C].reasons[0]
    assert verdicts[D].verdict == "exclude" and verdicts[D].policy.only_unknown
    assert any("gpu_count unknown" in r for r in verdicts[D].reasons)
    assert result.sources == ["probe", "prometheus"] and result.warnings == []

    assert sorted(apply_quarantine(core_v1, result, Deadline(30))) == [A, B]
    assert_quarantined(core_v1, A, {"gpu_lost", "xid_fatal"})
    assert_quarantined(core_v1, B, {"ib_state", "ib_phys_state"})
    for name in (C, D, *healthy):
        assert QUARANTINE_TAINT not in {t["key"] for t in NodeState.of(read_node(core_v1, name)).taints}

    before = len(writes(cluster))
    again = run_gate(core_v1, GateConfig(min_nodes=6), prometheus=prometheus)
    assert apply_quarantine(core_v1, again, Deadline(30)) == []
    assert len(writes(cluster)) == before  # the second run changed nothing
    assert sorted(again.selected) == healthy
    assert {n.name: n.verdict for n in again.nodes} == {n.name: n.verdict for n in result.nodes}, (
        again.table()
    )


def test_cli_gate_json_dry_run_writes_nothing_then_gate_quarantines(cluster, capsys):
    args = ["health", "gate", "--kubeconfig", str(cluster.kubeconfig), "--min-nodes", "6"]
    assert main([*args, "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert writes(cluster) == []
    assert {n["name"]: n["verdict"] for n in out["nodes"]}[A] == "quarantine"
    assert set(out["nodes"][0]) >= {"name", "verdict", "reasons"}
    assert sorted(out["selected"]) == sorted(set(cluster.telemetry) - {A, B, C, D})

    assert main(args) == 0
    table = capsys.readouterr().out
    assert f"quarantined now: {A}, {B}" in table and "of 12 node(s) chosen (need 6)" in table
    assert {e["path"] for e in writes(cluster)} == {f"/api/v1/nodes/{A}", f"/api/v1/nodes/{B}"}


def test_cli_gate_fails_naming_what_is_missing(cluster, capsys):
    args = ["health", "gate", "--kubeconfig", str(cluster.kubeconfig), "--min-nodes", "11", "--dry-run"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "NOT ENOUGH: need 11 healthy node(s), have 8 of 12" in out
    assert f"{D}: exclude: gpu_count [node] gpu_count unknown" in out


def test_operator_in_a_dag_quarantines_and_pushes_the_chosen_nodes(cluster, core_v1, run_dag):
    run = run_dag("health_gate", {"min_nodes": 6, "prometheus_conn_id": "prometheus"})

    assert run.state == "success"
    gate = xcom_value(run, "gate")
    healthy = sorted(set(cluster.telemetry) - {A, B, C, D})
    assert sorted(gate["node_names"]) == healthy and xcom_value(run, "chosen") == healthy
    verdicts = {v["name"]: v["verdict"] for v in gate["verdicts"]}
    assert (verdicts[A], verdicts[B], verdicts[C], verdicts[D]) == (
        "quarantine",
        "quarantine",
        "exclude",
        "exclude",
    )
    assert sorted(gate["quarantined"]) == [A, B]
    assert_quarantined(core_v1, A, {"xid_fatal"})
    assert_quarantined(core_v1, B, {"ib_state"})

    before = len(writes(cluster))
    assert run_dag("health_gate", {"min_nodes": 6, "prometheus_conn_id": "prometheus"}).state == "success"
    assert len(writes(cluster)) == before
