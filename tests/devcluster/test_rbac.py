"""Authentication and RBAC in the devcluster, as kube-apiserver does them: ServiceAccount tokens
from TokenRequest (``kubectl create token``), ``kubectl auth can-i`` (SelfSubjectAccessReview)
answering per ``deploy/rbac.yaml``, 401 and 403 Status bodies, and the node probe kept to its own
node (``deploy/node-probe-admission.yaml``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
import requests
import yaml
from trainops_devcluster import node_probe_policy, rbac
from trainops_devcluster.authn import ADMIN_TOKEN, NODE_NAME, service_account_user
from trainops_devcluster.errors import AdmissionDenied

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl
from trainops.cli import main

DEPLOY = Path(__file__).parents[2] / "deploy"
WORKER = "system:serviceaccount:airflow:airflow-worker"


@pytest.fixture
def cluster(make_devcluster, tmp_path):
    """A 2-node devcluster with deploy/rbac.yaml applied and the workers' ServiceAccount created."""
    dev = make_devcluster(nodes=2)
    kubectl(dev.kubeconfig, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    kubectl(dev.kubeconfig, "create", "namespace", "airflow")
    kubectl(dev.kubeconfig, "create", "serviceaccount", "airflow-worker", "-n", "airflow")
    ca = tmp_path / "ca.crt"
    ca.write_bytes(dev.server.serving_cert.cert_pem)
    dev.ca_file = ca
    return dev


def test_create_from_file_puts_what_names_no_namespace_in_default_as_kubectl_does(make_devcluster, tmp_path):
    dev = make_devcluster(nodes=2)
    manifest = tmp_path / "account.yaml"
    manifest.write_text("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: lonely}\n")
    dev.create_from_file(manifest)
    dev.create_from_file(manifest)  # what is there already is left as it is
    accounts = dev.store.list("serviceaccounts")[0]
    assert [a["metadata"].get("namespace") for a in accounts if a["metadata"]["name"] == "lonely"] == [
        "default"
    ]
    kubectl(dev.kubeconfig, "get", "serviceaccount", "lonely", "-n", "default")


def as_token(cluster, token: str) -> list[str]:
    """kubectl flags for ``token`` (kubectl sends credentials only over TLS: the HTTPS port)."""
    return [
        "--server",
        cluster.server.secure_url,
        "--certificate-authority",
        str(cluster.ca_file),
        "--token",
        token,
    ]


def call(cluster, method: str, path: str, token: str, body: dict | None = None) -> requests.Response:
    return requests.request(
        method,
        cluster.server.secure_url + path,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"},
        data=json.dumps(body) if body is not None else None,
        verify=str(cluster.ca_file),
        timeout=30,
    )


def create_token(cluster, account: str = "airflow-worker", namespace: str = "airflow", *args: str) -> str:
    return kubectl(cluster.kubeconfig, "create", "token", account, "-n", namespace, *args).stdout.strip()


CAN_I = [
    # (verb, resource, namespace or "", expected) per deploy/rbac.yaml
    ("list", "nodes", "", "yes"),
    ("patch", "nodes", "", "yes"),
    ("delete", "nodes", "", "no"),
    ("create", "pods --subresource=eviction", "inference", "yes"),
    ("create", "jobs.batch", "training", "yes"),
    ("create", "jobs.batch", "default", "no"),
    ("get", "pods --subresource=log", "training", "yes"),
    ("get", "pods --subresource=log", "inference", "no"),
    ("patch", "workloads.kueue.x-k8s.io", "training", "yes"),
    ("get", "configmaps", "trainops-system", "yes"),
    ("update", "configmaps", "trainops-system", "no"),
    ("patch", "clusterqueues.kueue.x-k8s.io", "", "yes"),
    ("delete", "clusterqueues.kueue.x-k8s.io", "", "no"),
]


def can_i(cluster, token: str, verb: str, resource: str, namespace: str = "") -> str:
    """What ``kubectl auth can-i`` answers (``yes``/``no``) for ``token``; ``resource`` may carry flags."""
    scope = ["-n", namespace] if namespace else []
    args = ["auth", "can-i", verb, *resource.split(), *scope, *as_token(cluster, token)]
    return kubectl(cluster.kubeconfig, *args, check=False).stdout.strip()


def test_kubectl_create_token_then_auth_can_i_answers_per_rbac_yaml(cluster):
    token = create_token(cluster)
    answers = [can_i(cluster, token, verb, resource, namespace) for verb, resource, namespace, _ in CAN_I]
    assert answers == [expected for *_, expected in CAN_I]
    # the admin (the devcluster's kubeconfig) may do anything
    assert kubectl(cluster.kubeconfig, "auth", "can-i", "delete", "nodes").stdout.strip() == "yes"


def test_kubectl_create_role_and_rolebinding_grant_by_resource_name(cluster):
    admin = cluster.kubeconfig
    kubectl(admin, "create", "serviceaccount", "reader", "-n", "default")
    kubectl(admin, *"create role one-pod --verb=get --resource=pods --resource-name=a -n default".split())
    kubectl(
        admin, *"create rolebinding one-pod --role=one-pod --serviceaccount=default:reader -n default".split()
    )
    reader = create_token(cluster, "reader", "default")
    asked = [("get", "pods/a", "default"), ("get", "pods/b", "default"), ("list", "pods", "default")]
    asked.append(("get", "pods/a", "training"))  # a Role grants in its own namespace only
    assert [can_i(cluster, reader, *question) for question in asked] == ["yes", "no", "no", "no"]


def test_a_list_whose_field_selector_requires_one_name_is_authorized_for_that_name():
    """As RequestInfoFactory: ``metadata.name=a`` or ``==a`` makes a list (or watch) about ``a``, so
    ``resourceNames`` can grant it; ``!=``, another field or a malformed selector names nothing."""

    def name(selector: str) -> str:
        return rbac.attributes("GET", "/api/v1/namespaces/default/pods", {"fieldSelector": selector}).name

    assert [name(s) for s in ("metadata.name=a", "metadata.name==a", "spec.nodeName=n,metadata.name=a")] == [
        "a",
        "a",
        "a",
    ]
    assert [name(s) for s in ("metadata.name!=a", "spec.nodeName=a", "metadata.name")] == ["", "", ""]


def test_a_service_account_token_acts_as_its_account_and_the_audit_log_says_who(cluster):
    token = create_token(cluster)
    cluster.server.audit.clear()
    nodes = kubectl(cluster.kubeconfig, "get", "nodes", "-o", "name", *as_token(cluster, token)).stdout
    assert "node/gpu-node-000" in nodes
    denied = kubectl(
        cluster.kubeconfig, "delete", "node", "gpu-node-000", *as_token(cluster, token), check=False
    )
    assert denied.returncode == 1
    assert denied.stderr.strip() == (
        f'Error from server (Forbidden): nodes "gpu-node-000" is forbidden: User "{WORKER}" cannot delete '
        'resource "nodes" in API group "" at the cluster scope'
    )
    assert cluster.store.find("nodes", "", "gpu-node-000") is not None
    seen = {
        (e["user"], e["verb"], e["path"].split("?")[0], e["status"]) for e in cluster.server.audit.entries()
    }
    assert (WORKER, "list", "/api/v1/nodes", 200) in seen
    assert (WORKER, "delete", "/api/v1/nodes/gpu-node-000", 403) in seen


def test_a_forbidden_call_gets_kube_apiservers_403_status(cluster):
    token = create_token(cluster)
    answer = call(cluster, "GET", "/apis/batch/v1/namespaces/default/jobs", token)
    assert answer.status_code == 403
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'jobs.batch is forbidden: User "{WORKER}" cannot list resource "jobs" in API group "batch" '
        'in the namespace "default"',
        "reason": "Forbidden",
        "details": {"group": "batch", "kind": "jobs"},
        "code": 403,
    }
    named = call(cluster, "GET", "/api/v1/namespaces/inference/pods/x/log", token).json()
    assert named["message"] == (
        f'pods "x" is forbidden: User "{WORKER}" cannot get resource "pods/log" in API group "" in the '
        'namespace "inference"'
    )
    assert named["details"] == {"name": "x", "kind": "pods"}
    # discovery is every authenticated user's (system:discovery); the devcluster's own endpoints are not
    assert call(cluster, "GET", "/apis", token).status_code == 200
    audit = call(cluster, "GET", "/devcluster/audit", token)
    assert (audit.status_code, audit.json()["message"]) == (
        403,
        f'forbidden: User "{WORKER}" cannot get path "/devcluster/audit"',
    )


def test_an_unknown_or_revoked_token_is_401(cluster):
    unauthorized = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    answer = call(cluster, "GET", "/api/v1/nodes", "not-a-token")
    assert (answer.status_code, answer.json()) == (401, unauthorized)
    token = create_token(cluster)
    assert call(cluster, "GET", "/api/v1/nodes", token).status_code == 200
    # a token dies with its ServiceAccount, even when one of the same name is created again
    kubectl(cluster.kubeconfig, "delete", "serviceaccount", "airflow-worker", "-n", "airflow")
    kubectl(cluster.kubeconfig, "create", "serviceaccount", "airflow-worker", "-n", "airflow")
    answer = call(cluster, "GET", "/api/v1/nodes", token)
    assert (answer.status_code, answer.json()) == (401, unauthorized)
    result = kubectl(cluster.kubeconfig, "get", "nodes", *as_token(cluster, token), check=False)
    assert "error: You must be logged in to the server" in result.stderr


def test_token_request_checks_the_account_and_the_duration(cluster):
    missing = kubectl(cluster.kubeconfig, "create", "token", "nobody", "-n", "airflow", check=False)
    assert 'serviceaccounts "nobody" not found' in missing.stderr
    short = call(
        cluster,
        "POST",
        "/api/v1/namespaces/airflow/serviceaccounts/airflow-worker/token",
        ADMIN_TOKEN,
        {"spec": {"expirationSeconds": 60}},
    )
    assert short.status_code == 422
    assert "may not specify a duration less than 10 minutes" in short.json()["message"]


def test_self_subject_access_review_says_which_binding_allows(cluster):
    token = create_token(cluster)
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": "create",
                "group": "batch",
                "resource": "jobs",
                "namespace": "training",
            }
        },
    }
    answer = call(cluster, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", token, review)
    assert answer.status_code == 201
    assert answer.json()["status"] == {
        "allowed": True,
        "reason": 'RBAC: allowed by RoleBinding "trainops-airflow-submit/training" of Role '
        '"trainops-airflow-submit" to ServiceAccount "airflow-worker/airflow"',
    }


# ---- the node probe ----------------------------------------------------------------------------
@pytest.fixture
def probe_token(cluster):
    """A token of the probe's ServiceAccount bound to its pod on gpu-node-000 (deploy/node-probe.yaml)."""
    kubectl(cluster.kubeconfig, "apply", "-f", str(DEPLOY / "node-probe.yaml"))

    def probe_pod():
        pods = cluster.store.list("pods", "kube-system")[0]
        return next((p for p in pods if p["spec"].get("nodeName") == "gpu-node-000"), None)

    pod = wait_for(probe_pod, "a probe pod on gpu-node-000")
    bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"]]
    return create_token(cluster, "trainops-node-probe", "kube-system", *bound)


def annotate(value: str) -> dict:
    return {"metadata": {"annotations": {"trainops.io/health-summary": value}}}


def test_the_probe_may_change_its_own_node_and_report_only(cluster, probe_token):
    own = call(cluster, "PATCH", "/api/v1/nodes/gpu-node-000", probe_token, annotate("ok"))
    assert own.status_code == 200
    status = {"status": {"conditions": [{"type": "GPUHealthy", "status": "True"}]}}
    assert call(cluster, "PATCH", "/api/v1/nodes/gpu-node-000/status", probe_token, status).status_code == 200
    other = call(cluster, "PATCH", "/api/v1/nodes/gpu-node-001", probe_token, annotate("forged"))
    denial = (
        "ValidatingAdmissionPolicy 'trainops-node-probe-own-node' with binding 'trainops-node-probe-own-node' "
        "denied request: the node probe on gpu-node-000 may not change node gpu-node-001"
    )
    assert (other.status_code, other.json()) == (
        422,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'nodes "gpu-node-001" is forbidden: {denial}',
            "reason": "Invalid",
            "details": {"name": "gpu-node-001", "kind": "nodes", "causes": [{"message": denial}]},
            "code": 422,
        },
    )
    annotations = cluster.store.get("nodes", "", "gpu-node-001")["metadata"]["annotations"]
    assert annotations.get("trainops.io/health-summary") != "forged"
    untaint = {"spec": {"taints": None}}
    spec = call(cluster, "PATCH", "/api/v1/nodes/gpu-node-000", probe_token, untaint).json()
    assert spec["message"].endswith("the node probe may not change a node's spec (taints, unschedulable)")
    report = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"verdict": "healthy"}}
    path = "/api/v1/namespaces/trainops-system/configmaps"
    # the devcluster's probe daemon (which writes the store, not the API) published one already
    cluster.probe_daemon.stop()
    kubectl(cluster.kubeconfig, "delete", "configmap", "node-health-gpu-node-000", "-n", "trainops-system")
    mine = call(
        cluster, "POST", path, probe_token, {**report, "metadata": {"name": "node-health-gpu-node-000"}}
    )
    assert mine.status_code == 201
    forged = call(
        cluster, "POST", path, probe_token, {**report, "metadata": {"name": "node-health-gpu-node-001"}}
    )
    assert forged.status_code == 422
    assert forged.json()["message"].endswith(
        "the node probe on gpu-node-000 may write only ConfigMap trainops-system/node-health-gpu-node-000"
    )


def test_an_unbound_probe_token_may_change_no_node(cluster, probe_token):
    token = create_token(cluster, "trainops-node-probe", "kube-system")
    answer = call(cluster, "PATCH", "/api/v1/nodes/gpu-node-000", token, annotate("ok"))
    assert answer.status_code == 422
    assert "the node probe's token is not bound to a node" in answer.json()["message"]
    # RBAC comes first: what the probe's ClusterRole does not grant is a 403, not the policy's 422
    assert call(cluster, "DELETE", "/api/v1/nodes/gpu-node-000", probe_token).status_code == 403


def test_the_devcluster_denies_as_the_manifests_policy_does():
    """node_probe_policy mirrors deploy/node-probe-admission.yaml: its names, user, resources, and for
    a request that fails each validation in turn, that validation's message (CEL's string
    concatenation of ``messageExpression`` reads as Python)."""
    policy, binding = [d for d in yaml.safe_load_all((DEPLOY / "node-probe-admission.yaml").read_text()) if d]
    assert (policy["metadata"]["name"], binding["metadata"]["name"]) == (
        node_probe_policy.POLICY,
        node_probe_policy.BINDING,
    )
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        f"request.userInfo.username == '{node_probe_policy.PROBE_USER}'"
    )
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    matched = {tuple(r.partition("/")[::2]) for rule in rules for r in rule["resources"]}
    assert matched == node_probe_policy._MATCHED
    probe = service_account_user("kube-system", "trainops-node-probe", {NODE_NAME: ["gpu-node-000"]})
    unbound = service_account_user("kube-system", "trainops-node-probe")
    own, other = {"metadata": {"name": "gpu-node-000"}, "spec": {}}, {"metadata": {"name": "gpu-node-001"}}
    tainted = {**own, "spec": {"taints": []}}
    report = {"metadata": {"name": "node-health-gpu-node-001"}}
    failing = [  # (user, operation, resource, namespace, object, old object), one per validation
        (unbound, "UPDATE", "nodes", "", own, own),
        (probe, "DELETE", "nodes", "", None, own),
        (probe, "UPDATE", "nodes", "", other, other),
        (probe, "UPDATE", "nodes", "", tainted, own),
        (probe, "CREATE", "configmaps", "trainops-system", report, None),
    ]
    for validation, (user, operation, resource, namespace, obj, old) in zip(
        policy["spec"]["validations"], failing, strict=True
    ):
        name = (obj or old)["metadata"]["name"]
        cel = SimpleNamespace(
            variables=SimpleNamespace(node="gpu-node-000", report="node-health-gpu-node-000"),
            request=SimpleNamespace(name=name),
        )
        message = validation.get("message") or eval(validation["messageExpression"], {}, vars(cel))  # noqa: S307
        with pytest.raises(AdmissionDenied) as denied:
            node_probe_policy.check(user, operation, resource, "", namespace, obj, old)
        assert denied.value.causes == [
            {
                "message": f"ValidatingAdmissionPolicy '{node_probe_policy.POLICY}' with binding "
                f"'{node_probe_policy.BINDING}' denied request: {message}"
            }
        ]
    # and what the probe does is admitted
    node_probe_policy.check(probe, "UPDATE", "nodes", "status", "", own, own)
    node_probe_policy.check(
        probe,
        "CREATE",
        "configmaps",
        "",
        "trainops-system",
        {"metadata": {"name": "node-health-gpu-node-000"}},
        None,
    )


def test_the_production_probe_publishes_as_its_own_account(
    cluster, probe_token, monkeypatch, tmp_path, capsys
):
    """``trainops probe --publish`` with the probe pod's token: every call it makes (the node's status
    read, its condition and summary, its report ConfigMap) is allowed by deploy/node-probe.yaml's
    ClusterRole and the own-node policy; the same probe pointed at another node changes nothing."""

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    cluster.probe_daemon.stop()  # the devcluster's own probe writes the store, not the API
    kubectl(cluster.kubeconfig, "delete", "configmap", "node-health-gpu-node-000", "-n", "trainops-system")
    kubeconfig = cluster.write_kubeconfig(
        tmp_path / "probe.kubeconfig", token=probe_token, user="probe", namespace="kube-system", secure=True
    )
    probe = ["probe", "--publish", "--iterations", "1", "--kubeconfig", str(kubeconfig)]
    probe += ["--ib-sysfs", str(tmp_path)]

    assert main([*probe, "--node", "gpu-node-000"]) == 0
    own = cluster.store.get("nodes", "", "gpu-node-000")
    condition = next(c for c in own["status"]["conditions"] if c["type"] == "GPUHealthy")
    assert (condition["status"], condition["reason"]) == ("Unknown", "SignalsUnknown")
    assert cluster.store.find("configmaps", "trainops-system", "node-health-gpu-node-000") is not None
    calls = [e for e in cluster.server.audit.entries() if e["user"].endswith(":trainops-node-probe")]
    denied = [(e["verb"], e["path"], e["status"]) for e in calls if e["status"] in (401, 403, 422)]
    assert calls and not denied, denied  # (a 404 is the first write of its ConfigMap: replace, then create)

    capsys.readouterr()
    before = cluster.store.get("nodes", "", "gpu-node-001")
    report = cluster.store.find("configmaps", "trainops-system", "node-health-gpu-node-001")
    assert main([*probe, "--node", "gpu-node-001"]) == 1
    assert capsys.readouterr().err == (
        'error: publishing to node gpu-node-001 failed: configmaps "node-health-gpu-node-001" is forbidden: '
        "ValidatingAdmissionPolicy 'trainops-node-probe-own-node' with binding 'trainops-node-probe-own-node' "
        "denied request: the node probe on gpu-node-000 may write only ConfigMap "
        "trainops-system/node-health-gpu-node-000\n"
    )
    assert cluster.store.get("nodes", "", "gpu-node-001") == before
    assert cluster.store.find("configmaps", "trainops-system", "node-health-gpu-node-001") == report
