"""The node probe confined to its own facts by ``deploy/node-probe-admission.yaml``, as kube-apiserver
enforces it: the devcluster serves the ValidatingAdmissionPolicies and evaluates the manifest's CEL.

Every write the probe must not make is tried with its node-bound token, with RBAC as generous as it
could be made by mistake, and refused with the policy's own message, leaving the object as it was;
what the probe writes (``trainops probe --publish``) passes with the shipped RBAC."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest
import requests
from trainops_devcluster.authn import ADMIN_TOKEN

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl
from tests.health.driver_upgrade_support import label_gpu_clients
from trainops.capacity.claims import CLAIM_PRIOR_ANNOTATION
from trainops.cli import main
from trainops.conventions import (
    CLAIMED_BY_ANNOTATION,
    GPU_COUNT_LABEL,
    GPU_POOL_LABEL,
    HEALTH_LABEL,
    HEALTH_SUMMARY_ANNOTATION,
    IB_PORT_COUNT_LABEL,
    QUARANTINE_EVIDENCE_ANNOTATION,
    QUARANTINE_TAINT,
)

DEPLOY = Path(__file__).parents[2] / "deploy"
NODE, OTHER = "gpu-node-000", "gpu-node-001"
OWN_REPORT = f"node-health-{NODE}"
MERGE, JSON = "application/merge-patch+json", "application/json"
GENEROUS = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: too-generous}
rules:
  - apiGroups: [""]
    resources: [nodes, nodes/status, configmaps]
    verbs: [create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: too-generous}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: too-generous}
subjects: [{kind: ServiceAccount, name: trainops-node-probe, namespace: kube-system}]
"""


@pytest.fixture
def cluster(make_devcluster):
    """2 nodes with the probe's manifests applied; gpu-node-000 quarantined with evidence and held by a
    claim; the devcluster's own probe daemon stopped (it writes the store, not the API)."""
    dev = make_devcluster(nodes=2)
    dev.probe_daemon.stop()
    label_gpu_clients(dev)  # as GPU Operator v26.7.0+ labels GPU nodes: the probe's nodeSelector wants it
    kubectl(dev.kubeconfig, "apply", "-f", str(DEPLOY / "node-probe.yaml"))
    kubectl(dev.kubeconfig, "apply", "-f", str(DEPLOY / "node-probe-admission.yaml"))
    held = {
        "metadata": {
            "labels": {HEALTH_LABEL: "quarantined", IB_PORT_COUNT_LABEL: "8"},
            "annotations": {
                QUARANTINE_EVIDENCE_ANNOTATION: '{"reason": "xid 79"}',
                CLAIMED_BY_ANNOTATION: "train/run-1",
                CLAIM_PRIOR_ANNOTATION: "{}",
            },
        },
        "spec": {"taints": [{"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}]},
    }
    kubectl(dev.kubeconfig, "patch", "node", NODE, "--type", "merge", "-p", json.dumps(held))
    return dev


@pytest.fixture
def probe_token(cluster) -> str:
    """A token of the probe's ServiceAccount bound to its pod on gpu-node-000."""

    def probe_pod():
        pods = cluster.store.list("pods", "kube-system")[0]
        return next((p for p in pods if p["spec"].get("nodeName") == NODE), None)

    pod = wait_for(probe_pod, "a probe pod on gpu-node-000")
    bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"]]
    return token(cluster, *bound)


def token(cluster, *args: str) -> str:
    return kubectl(
        cluster.kubeconfig, "create", "token", "trainops-node-probe", "-n", "kube-system", *args
    ).stdout.strip()


def call(
    cluster, method: str, path: str, bearer: str, body=None, content_type: str = MERGE
) -> requests.Response:
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": content_type}
    data = json.dumps(body) if body is not None else None
    return requests.request(method, cluster.url + path, headers=headers, data=data, timeout=60)


def status_of(cluster, node: str, change) -> dict:
    """A /status merge patch: the node's whole condition list (merge patch replaces lists) as ``change`` makes it."""
    status = json.loads(json.dumps(cluster.store.get("nodes", "", node)["status"]))
    change(status)
    return {"status": status}


def ready_false(status: dict) -> None:
    next(c for c in status["conditions"] if c["type"] == "Ready")["status"] = "False"


def allocatable_16(status: dict) -> None:
    status["allocatable"]["nvidia.com/gpu"] = "16"


def capacity_16(status: dict) -> None:
    status["capacity"]["nvidia.com/gpu"] = "16"


def gpu_healthy(status: dict) -> None:
    conditions = [c for c in status.get("conditions") or [] if c["type"] != "GPUHealthy"]
    status["conditions"] = [
        *conditions,
        {"type": "GPUHealthy", "status": "True", "reason": "AllChecksPassed"},
    ]


def labels(**values) -> dict:
    return {"metadata": {"labels": values}}


def annotations(**values) -> dict:
    return {"metadata": {"annotations": values}}


NODE_POLICY, REPORT_POLICY = "trainops-node-probe-own-node", "trainops-node-probe-own-report"
SPEC = "the node probe may not change its node's spec (taints, unschedulable)"
LABELS = "the node probe may not change its node's labels"
ANNOTATIONS = "the node probe may change only its node's annotation trainops.io/health-summary"
STATUS = (
    "the node probe may not change its node's status other than its GPUHealthy condition "
    "(capacity, allocatable, addresses)"
)
CONDITIONS = (
    "the node probe may change only its node's GPUHealthy condition (Ready and the others are not its own)"
)
ELSEWHERE = f"the node probe on {NODE} may write only ConfigMap trainops-system/{OWN_REPORT}"
FORBIDDEN = [
    # (what, method, path, body or a function of the cluster, the policy's message: None for the metadata one)
    ("label trainops.io/health", "PATCH", f"/api/v1/nodes/{NODE}", labels(**{HEALTH_LABEL: None}), LABELS),
    ("label gpu-pool", "PATCH", f"/api/v1/nodes/{NODE}", labels(**{GPU_POOL_LABEL: "false"}), LABELS),
    ("label ib-port-count", "PATCH", f"/api/v1/nodes/{NODE}", labels(**{IB_PORT_COUNT_LABEL: "0"}), LABELS),
    (
        "label nvidia.com/gpu.count",
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        labels(**{GPU_COUNT_LABEL: "16"}),
        LABELS,
    ),
    (
        "label through /status",
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        labels(**{HEALTH_LABEL: None}),
        LABELS,
    ),
    (
        "claimed-by",
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        annotations(**{CLAIMED_BY_ANNOTATION: None}),
        ANNOTATIONS,
    ),
    (
        "claim-prior",
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        annotations(**{CLAIM_PRIOR_ANNOTATION: "[]"}),
        ANNOTATIONS,
    ),
    (
        "quarantine-evidence",
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        annotations(**{QUARANTINE_EVIDENCE_ANNOTATION: None}),
        ANNOTATIONS,
    ),
    ("an annotation of its own making", "PATCH", f"/api/v1/nodes/{NODE}", annotations(mine="x"), ANNOTATIONS),
    (
        "annotation through /status",
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        annotations(**{CLAIMED_BY_ANNOTATION: "me"}),
        ANNOTATIONS,
    ),
    (
        "finalizers",
        "PATCH",
        f"/api/v1/nodes/{NODE}",
        {"metadata": {"finalizers": ["trainops.io/mine"]}},
        None,
    ),
    (
        "status allocatable",
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        lambda c: status_of(c, NODE, allocatable_16),
        STATUS,
    ),
    (
        "status capacity",
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        lambda c: status_of(c, NODE, capacity_16),
        STATUS,
    ),
    (
        "condition Ready",
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        lambda c: status_of(c, NODE, ready_false),
        CONDITIONS,
    ),
    ("spec taints", "PATCH", f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}}, SPEC),
    ("spec unschedulable", "PATCH", f"/api/v1/nodes/{NODE}", {"spec": {"unschedulable": True}}, SPEC),
    (
        "another node's summary",
        "PATCH",
        f"/api/v1/nodes/{OTHER}",
        annotations(**{HEALTH_SUMMARY_ANNOTATION: "forged"}),
        f"the node probe on {NODE} may not change node {OTHER}",
    ),
    (
        "another node's condition",
        "PATCH",
        f"/api/v1/nodes/{OTHER}/status",
        lambda c: status_of(c, OTHER, gpu_healthy),
        f"the node probe on {NODE} may not change node {OTHER}",
    ),
    (
        "a node created",
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "gpu-node-999"}},
        "the node probe creates and deletes no node",
    ),
    (
        "its node deleted",
        "DELETE",
        f"/api/v1/nodes/{NODE}",
        None,
        "the node probe creates and deletes no node",
    ),
    (
        "another node's report",
        "POST",
        "/api/v1/namespaces/trainops-system/configmaps",
        {"metadata": {"name": f"node-health-{OTHER}"}},
        ELSEWHERE,
    ),
    (
        "its report elsewhere",
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": OWN_REPORT}},
        ELSEWHERE,
    ),
    (
        "another ConfigMap replaced",
        "PUT",
        "/api/v1/namespaces/trainops-system/configmaps/node-health-gpu-node-001",
        {"metadata": {"name": f"node-health-{OTHER}"}, "data": {"report.json": "{}"}},
        ELSEWHERE,
    ),
    (
        "its report deleted",
        "DELETE",
        f"/api/v1/namespaces/trainops-system/configmaps/{OWN_REPORT}",
        None,
        "the node probe deletes no ConfigMap (it replaces its report)",
    ),
]


def _target(path: str) -> tuple[str, str, str]:
    """(resource, namespace, name) a request path writes; a POST names its object in the body."""
    parts = path.strip("/").split("/")[2:]
    namespace = parts[1] if parts[0] == "namespaces" else ""
    rest = parts[2:] if namespace else parts
    return rest[0], namespace, rest[1] if len(rest) > 1 else ""


@pytest.mark.parametrize(
    ("what", "method", "path", "body", "message"), FORBIDDEN, ids=[f[0] for f in FORBIDDEN]
)
def test_every_write_the_probe_must_not_make_is_refused_with_the_policys_message(
    cluster, probe_token, what, method, path, body, message
):
    kubectl(cluster.kubeconfig, "apply", "-f", "-", stdin=GENEROUS)  # RBAC granting more than it should
    for name in (OWN_REPORT, f"node-health-{OTHER}"):  # both reports exist (the admin's copies)
        data = {"metadata": {"name": name}, "data": {"report.json": "{}"}}
        call(cluster, "POST", "/api/v1/namespaces/trainops-system/configmaps", ADMIN_TOKEN, data, JSON)
    resource, namespace, name = _target(path)
    name = name or body["metadata"]["name"]
    before = cluster.store.find(resource, namespace, name)
    payload = body(cluster) if callable(body) else body

    answer = call(cluster, method, path, probe_token, payload, MERGE if method == "PATCH" else JSON)

    policy = REPORT_POLICY if resource == "configmaps" else NODE_POLICY
    message = message or "the node probe may not change its node's metadata (finalizers, owner references)"
    denial = f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {message}"
    assert (answer.status_code, answer.json()["message"]) == (
        422,
        f'{resource} "{name}" is forbidden: {denial}',
    )
    assert answer.json()["details"]["causes"] == [{"message": denial}]
    assert cluster.store.find(resource, namespace, name) == before  # not one byte changed


def test_the_probes_own_writes_pass_and_change_only_its_facts(cluster, probe_token):
    before = cluster.store.get("nodes", "", NODE)
    summary = annotations(
        **{HEALTH_SUMMARY_ANNOTATION: '{"verdict": "healthy"}', "trainops.io/health-report": None}
    )
    assert call(cluster, "PATCH", f"/api/v1/nodes/{NODE}", probe_token, summary).status_code == 200
    condition = call(
        cluster, "PATCH", f"/api/v1/nodes/{NODE}/status", probe_token, status_of(cluster, NODE, gpu_healthy)
    )
    assert condition.status_code == 200, condition.text
    report = {"metadata": {"name": OWN_REPORT}, "data": {"report.json": "{}"}}
    path = "/api/v1/namespaces/trainops-system/configmaps"
    call(cluster, "DELETE", f"{path}/{OWN_REPORT}", ADMIN_TOKEN)
    assert call(cluster, "POST", path, probe_token, report, JSON).status_code == 201
    assert call(cluster, "PUT", f"{path}/{OWN_REPORT}", probe_token, report, JSON).status_code == 200

    after = cluster.store.get("nodes", "", NODE)
    assert after["metadata"]["labels"] == before["metadata"]["labels"] and after["spec"] == before["spec"]
    assert {k: v for k, v in after["metadata"]["annotations"].items() if k != HEALTH_SUMMARY_ANNOTATION} == {
        k: v for k, v in before["metadata"]["annotations"].items() if k != HEALTH_SUMMARY_ANNOTATION
    }
    changed = [c for c in after["status"]["conditions"] if c not in before["status"]["conditions"]]
    assert [c["type"] for c in changed] == ["GPUHealthy"]
    assert {k: v for k, v in after["status"].items() if k != "conditions"} == {
        k: v for k, v in before["status"].items() if k != "conditions"
    }


def test_an_unbound_token_may_change_nothing_and_rbac_answers_first(cluster, probe_token):
    unbound = token(cluster)
    answer = call(
        cluster, "PATCH", f"/api/v1/nodes/{NODE}", unbound, annotations(**{HEALTH_SUMMARY_ANNOTATION: "x"})
    )
    assert answer.status_code == 422
    assert "the node probe's token is not bound to a node" in answer.json()["message"]
    # with the shipped RBAC a delete never reaches the policy: 403, not the policy's 422
    assert call(cluster, "DELETE", f"/api/v1/nodes/{NODE}", probe_token).status_code == 403


def test_the_policies_type_check_clean_against_the_kinds_they_match(cluster):
    policies = cluster.store.list("validatingadmissionpolicies.admissionregistration.k8s.io")[0]
    assert sorted(p["metadata"]["name"] for p in policies) == [NODE_POLICY, REPORT_POLICY]
    assert [p["status"]["typeChecking"] for p in policies] == [{}, {}]


def test_the_production_probe_publishes_as_its_own_account(
    cluster, probe_token, monkeypatch, tmp_path, capsys
):
    """``trainops probe --publish`` with the probe pod's token: every call it makes (the node's status
    read, its condition and summary, its report ConfigMap) is allowed by deploy/node-probe.yaml's RBAC
    and the policies; the same probe pointed at another node changes nothing."""

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    kubectl(
        cluster.kubeconfig, "delete", "configmap", OWN_REPORT, "-n", "trainops-system", "--ignore-not-found"
    )
    kubeconfig = cluster.write_kubeconfig(
        tmp_path / "probe.kubeconfig", token=probe_token, user="probe", namespace="kube-system", secure=True
    )
    probe = ["probe", "--publish", "--iterations", "1", "--kubeconfig", str(kubeconfig)]
    probe += ["--ib-sysfs", str(tmp_path)]

    assert main([*probe, "--node", NODE]) == 0
    own = cluster.store.get("nodes", "", NODE)
    condition = next(c for c in own["status"]["conditions"] if c["type"] == "GPUHealthy")
    assert (condition["status"], condition["reason"]) == ("Unknown", "SignalsUnknown")
    assert HEALTH_SUMMARY_ANNOTATION in own["metadata"]["annotations"]
    assert cluster.store.find("configmaps", "trainops-system", OWN_REPORT) is not None
    calls = [e for e in cluster.server.audit.entries() if e["user"].endswith(":trainops-node-probe")]
    denied = [(e["verb"], e["path"], e["status"]) for e in calls if e["status"] in (401, 403, 422)]
    assert calls and not denied, denied  # (a 404 is the first write of its ConfigMap: replace, then create)

    capsys.readouterr()
    before = cluster.store.get("nodes", "", OTHER)
    report = cluster.store.find("configmaps", "trainops-system", f"node-health-{OTHER}")
    assert main([*probe, "--node", OTHER]) == 1
    assert capsys.readouterr().err == (
        f'error: publishing to node {OTHER} failed: configmaps "node-health-{OTHER}" is forbidden: '
        f"ValidatingAdmissionPolicy '{REPORT_POLICY}' with binding '{REPORT_POLICY}' denied request: {ELSEWHERE}\n"
    )
    assert cluster.store.get("nodes", "", OTHER) == before
    assert cluster.store.find("configmaps", "trainops-system", f"node-health-{OTHER}") == report
