"""The gate's defaults hold on a cluster unlike the devcluster's: 4-GPU nodes, and the node probe
run as ``deploy/node-probe.yaml`` runs it (no ``--gemm``, so no node has a measured speed)."""

from __future__ import annotations

import json

import pytest

from trainops.cli import main
from trainops.conventions import QUARANTINE_TAINT


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
