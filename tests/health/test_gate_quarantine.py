"""Quarantine and release on the devcluster: idempotent, foreign taints kept, release only after a re-check."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trainops.cli import main
from trainops.conventions import HEALTH_LABEL, QUARANTINE_TAINT
from trainops.health.gate import GateConfig, run_gate
from trainops.health.policy import load_policy
from trainops.health.quarantine import EVIDENCE_ANNOTATION, ReleaseRefused, apply_quarantine, release
from trainops.health.report import HealthReport
from trainops.kube.nodes import NodeState, read_node
from trainops.kube.retry import Deadline

NODE = "gpu-node-005"
FOREIGN = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}
WRITES = ("create", "update", "patch", "delete")
UNTIERED = GateConfig(speed_tiers=False)


@pytest.fixture
def core_v1(k8s):
    return client.CoreV1Api(k8s)


def writes(devcluster) -> list[dict]:
    return [e for e in devcluster.server.audit.entries() if e["verb"] in WRITES]


def published(core_v1, name: str = NODE) -> dict:
    """The node's report ConfigMap, as the API serves it."""
    return core_v1.api_client.sanitize_for_serialization(
        core_v1.read_namespaced_config_map(f"node-health-{name}", "trainops-system")
    )


def state(core_v1, name: str = NODE) -> NodeState:
    return NodeState.of(read_node(core_v1, name))


def gate_and_quarantine(core_v1) -> list[str]:
    return apply_quarantine(core_v1, run_gate(core_v1, UNTIERED), Deadline(30))


@pytest.fixture
def broken(devcluster, core_v1):
    """NODE with XID 79 and a foreign taint, quarantined once by the gate."""
    node = read_node(core_v1, NODE)
    core_v1.patch_node(NODE, {"spec": {"taints": [*node["spec"]["taints"], FOREIGN]}}, _preload_content=False)
    devcluster.inject("xid", NODE, code=79)
    devcluster.probe_daemon.wait_rounds(2)
    assert gate_and_quarantine(core_v1) == [NODE]
    return devcluster


def test_quarantine_is_idempotent_and_keeps_foreign_taints(broken, core_v1):
    first = state(core_v1)
    assert first.taint(QUARANTINE_TAINT)["value"] == "gpu_lost.xid_fatal"
    assert first.taint(FOREIGN["key"]) == FOREIGN and first.taint("trainops.io/mode") is not None
    assert first.labels[HEALTH_LABEL] == "quarantined"

    before = len(writes(broken))
    assert gate_and_quarantine(core_v1) == []
    broken.probe_daemon.wait_rounds(1)
    assert gate_and_quarantine(core_v1) == []
    assert [e for e in writes(broken)[before:] if e["path"].endswith(NODE)] == []
    assert state(core_v1).taints == first.taints
    assert state(core_v1).annotations[EVIDENCE_ANNOTATION] == first.annotations[EVIDENCE_ANNOTATION]


def test_a_quarantined_node_is_not_chosen_even_once_healthy(broken, core_v1):
    broken.telemetry[NODE].repair()
    broken.probe_daemon.wait_rounds(2)
    checked = {n.name: n for n in run_gate(core_v1, UNTIERED).nodes}[NODE]
    assert checked.policy.verdict in ("ok", "warn") and checked.verdict == "exclude"
    assert checked.reasons[0].startswith(f"quarantined ({QUARANTINE_TAINT}=gpu_lost.xid_fatal)")


def test_release_refuses_while_the_fault_persists_then_releases_after_repair(broken, core_v1, capsys):
    with pytest.raises(
        ReleaseRefused, match=f"node {NODE} still fails its health checks \\(quarantine\\): gpu_lost"
    ):
        release(core_v1, NODE, Deadline(30))
    assert main(["health", "release", NODE, "--kubeconfig", str(broken.kubeconfig)]) == 1
    assert "still fails its health checks" in capsys.readouterr().err
    assert state(core_v1).taint(QUARANTINE_TAINT) is not None

    broken.telemetry[NODE].repair()
    broken.probe_daemon.wait_rounds(2)
    assert main(["health", "release", NODE, "--kubeconfig", str(broken.kubeconfig)]) == 0
    assert f"{NODE}: released" in capsys.readouterr().out
    after = state(core_v1)
    assert after.taint(QUARANTINE_TAINT) is None and HEALTH_LABEL not in after.labels
    assert EVIDENCE_ANNOTATION not in after.annotations
    assert after.taint(FOREIGN["key"]) == FOREIGN and after.taint("trainops.io/mode") is not None
    assert NODE in run_gate(core_v1, UNTIERED).selected

    assert main(["health", "release", NODE, "--kubeconfig", str(broken.kubeconfig)]) == 0
    assert "not quarantined; nothing to release" in capsys.readouterr().out


def test_release_needs_a_report_newer_than_the_quarantine(devcluster, core_v1):
    devcluster.probe_daemon.wait_rounds(2)
    strict = GateConfig(speed_tiers=False, policy=load_policy({"gpu_in_use": {"verdict": "quarantine"}}))
    busy = apply_quarantine(core_v1, run_gate(core_v1, strict), Deadline(30))
    assert busy and state(core_v1, busy[0]).taint(QUARANTINE_TAINT)["value"] == "gpu_in_use"
    with pytest.raises(ReleaseRefused, match="no health report since its quarantine"):
        release(core_v1, busy[0], Deadline(30))  # the default policy passes it, but on a report from before
    assert state(core_v1, busy[0]).taint(QUARANTINE_TAINT) is not None


def test_missing_telemetry_publishes_nothing_new_and_the_report_goes_stale(devcluster, core_v1):
    devcluster.probe_daemon.wait_rounds(2)
    devcluster.inject("telemetry-missing", NODE)
    devcluster.probe_daemon.wait_rounds(1)
    last = published(core_v1)
    devcluster.probe_daemon.wait_rounds(2)
    assert published(core_v1) == last

    stale_at = HealthReport.from_json(last["data"]["report.json"]).collected_at + 301
    checked = {n.name: n for n in run_gate(core_v1, UNTIERED, now=stale_at).nodes}[NODE]
    assert checked.verdict == "exclude"
    assert checked.reasons[0].startswith("report_age [node] health report is stale: report_age_s=")


def test_candidates_are_listed_in_pages(devcluster, core_v1):
    devcluster.server.audit.clear()
    result = run_gate(core_v1, GateConfig(page_size=5, speed_tiers=False))
    assert [n.name for n in result.nodes] == sorted(devcluster.telemetry)
    lists = [e["path"] for e in devcluster.server.audit.entries() if e["verb"] == "list"]
    assert all("limit=5" in path for path in lists)
    assert sum(p.startswith("/api/v1/nodes?") for p in lists) == 4  # 16 GPU nodes in pages of 5
    reports = [p for p in lists if p.startswith("/api/v1/namespaces/trainops-system/configmaps?")]
    assert len(reports) == 4 and all("node-health-report%3Dtrue" in p for p in reports)


def test_evidence_names_the_rows_signals_and_values(broken, core_v1):
    record = json.loads(state(core_v1).annotations[EVIDENCE_ANNOTATION])
    tripped = {(e["row"], e["target"], json.dumps(e["value"])) for e in record["evidence"]}
    assert ("gpu_lost", "gpu 0", "true") in tripped and ("xid_fatal", "gpu 0", "[79]") in tripped
    assert (
        record["report"]["source"] == "probe" and record["quarantined_at"] > record["report"]["collected_at"]
    )
    assert record["report"]["at"] == f"trainops-system/node-health-{NODE}"
    assert (
        HealthReport.from_json(published(core_v1)["data"]["report.json"]).gpus["0"]["gpu_lost"].value is True
    )


def test_a_list_whose_continue_token_expires_is_restarted(devcluster, core_v1):
    """The API server answers 410 Gone to a continue token it no longer honours (the fleet changed too
    much between pages): the gate lists again from the first page and still judges every node once."""
    firsts, expired = [], []

    def list_node(**kwargs):
        if not kwargs.get("_continue"):
            firsts.append(kwargs)
        elif not expired:
            expired.append(kwargs["_continue"])
            raise ApiException(status=410, reason="Expired")
        return core_v1.list_node(**kwargs)

    lister = SimpleNamespace(
        list_node=list_node, list_namespaced_config_map=core_v1.list_namespaced_config_map
    )
    result = run_gate(lister, GateConfig(page_size=5, speed_tiers=False))
    assert expired and len(firsts) == 2  # listed again from the first page
    assert [n.name for n in result.nodes] == sorted(devcluster.telemetry)
