"""``trainops capacity status`` and ``trainops capacity return`` against the devcluster."""

import json

from tests.capacity.helpers import DEPLOYMENTS, default_seeded_objects, kube_for, nodes_by_app, snapshot
from trainops.capacity.procedure import ReturnSummary, claim
from trainops.cli import main

RUN = "train_llm/manual__7"


def test_status_lists_claimed_nodes_and_return_gives_them_back(devcluster, capsys):
    default_seeded_objects(devcluster)
    where = nodes_by_app(devcluster)
    nodes = where["llm-chat"][:1] + where["idle"][:1]
    before = snapshot(devcluster)
    claim(kube_for(devcluster), RUN, nodes, cluster_queue="training", deployments=DEPLOYMENTS)
    kubeconfig = str(devcluster.kubeconfig)

    assert main(["capacity", "status", "--kubeconfig", kubeconfig, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted(row["node"] for row in status["nodes"]) == sorted(nodes)
    assert {row["holder"] for row in status["nodes"]} == {RUN}
    assert all(row["age_s"] >= 0 and row["quarantined"] is False for row in status["nodes"])
    assert status["quota_grants"] == {RUN: {"flavor": "gpu", "gpus": 16}}
    lent = {"workload": "Deployment inference/llm-chat", "overflow_of": None}
    assert status["inference_loans"] == {
        RUN: [{**lent, "fields": [{"path": "spec.replicas", "prior": 8, "set": 7}]}]
    }

    assert main(["capacity", "status", "--kubeconfig", kubeconfig]) == 0
    table = capsys.readouterr().out
    assert all(node in table for node in nodes) and RUN in table and "16 GPUs" in table
    assert f"inference: {RUN} borrows from Deployment inference/llm-chat: spec.replicas 8 -> 7" in table

    assert main(["capacity", "return", "--kubeconfig", kubeconfig, "--run", RUN]) == 0
    assert (
        f"returned {RUN}: 2 node(s) with 16 GPUs back to inference; 16 GPUs of ClusterQueue training quota "
        "taken back" in capsys.readouterr().out
    )
    assert snapshot(devcluster) == before

    assert main(["capacity", "status", "--kubeconfig", kubeconfig]) == 0
    assert "no claimed nodes" in capsys.readouterr().out


def test_return_with_a_malformed_run_is_refused_and_changes_nothing(devcluster, capsys):
    devcluster.server.audit.clear()
    assert main(["capacity", "return", "--kubeconfig", str(devcluster.kubeconfig), "--run", "no-slash"]) == 2
    assert "<dag_id>/<run_id>" in capsys.readouterr().err
    assert devcluster.server.audit.entries() == []


def test_the_return_line_says_what_was_given_back_and_when_no_quota_was_granted():
    nodes = ["gpu-node-001", "gpu-node-002", "gpu-node-003"]
    held_no_quota = ReturnSummary(RUN, nodes, gpus_returned=24, cluster_queue="training")
    assert held_no_quota.describe() == (
        f"returned {RUN}: 3 node(s) with 24 GPUs back to inference; no quota on ClusterQueue training "
        "(none was granted); inference restored: none; still quarantined: none"
    )
    nothing = ReturnSummary(RUN, cluster_queue="training", quota_returned=16)
    assert nothing.describe().startswith(
        f"returned {RUN}: no node (it held none); 16 GPUs of ClusterQueue training quota taken back;"
    )
