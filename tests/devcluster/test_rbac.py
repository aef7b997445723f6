"""Authentication and RBAC in the devcluster, as kube-apiserver does them: ServiceAccount tokens
from TokenRequest (``kubectl create token``), ``kubectl auth can-i`` (SelfSubjectAccessReview)
answering per ``deploy/rbac.yaml``, 401 and 403 Status bodies.  The node probe's own account:
``test_node_probe_policy.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from trainops_devcluster import rbac
from trainops_devcluster.authn import ADMIN_TOKEN

from tests.devcluster.kubectl_support import kubectl

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
