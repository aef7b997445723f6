"""The gate's defaults hold on a cluster unlike the devcluster's: 4-GPU nodes, and the node probe
run as ``deploy/node-probe.yaml`` runs it (no ``--gemm``, so no node has a measured speed)."""

from __future__ import annotations

import json

import pytest

from trainops.cli import main
from trainops.conventions import IB_PORT_COUNT_LABEL, QUARANTINE_TAINT


@pytest.mark.parametrize("probe_gemm", [False, True], ids=["as-deployed", "with-gemm"])
def test_gate_on_4_gpu_nodes_selects_every_healthy_node_and_quarantines_none(
    make_devcluster, capsys, probe_gemm
):
    cluster = make_devcluster(nodes=6, gpus_per_node=4, probe_gemm=probe_gemm)
    cluster.probe_daemon.wait_rounds(1)
    gpu_nodes = sorted(cluster.telemetry)

    args = ["health", "gate", "--kubeconfig", str(cluster.kubeconfig), "--min-nodes", "6", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)

    assert sorted(out["selected"]) == gpu_nodes
    assert {n["verdict"] for n in out["nodes"]} <= {"ok", "warn"}, out["nodes"]  # warn: serving inference
    if not probe_gemm:
        assert (out["group"], out["speed_unknown"]) == ("speed unknown", gpu_nodes)
    for name in gpu_nodes:
        taints = cluster.store.get("nodes", "", name)["spec"].get("taints") or []
        assert QUARANTINE_TAINT not in {t["key"] for t in taints}


def test_gate_on_4_port_nodes_passes_them_and_excludes_one_short_of_its_label(make_devcluster, capsys):
    cluster = make_devcluster(nodes=3, gpus_per_node=4)
    gpu_nodes = sorted(cluster.telemetry)
    for name in gpu_nodes:
        telemetry = cluster.telemetry[name]
        telemetry.ib_ports = telemetry.ib_ports[:4]
    short = gpu_nodes[0]  # labelled as having 8 ports, sees 4: an adapter fell off
    cluster.store.mutate(
        "nodes", "", short, lambda n: n["metadata"]["labels"].update({IB_PORT_COUNT_LABEL: "8"})
    )
    cluster.probe_daemon.wait_rounds(2)

    args = ["health", "gate", "--kubeconfig", str(cluster.kubeconfig), "--min-nodes", "2", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)

    assert sorted(out["selected"]) == gpu_nodes[1:]
    verdict = {n["name"]: n for n in out["nodes"]}[short]
    assert verdict["verdict"] == "exclude"
    assert verdict["reasons"][0].startswith("ib_ports_missing [node] fewer fabric ports than the node has")
