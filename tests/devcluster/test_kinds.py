"""ConfigMap, Secret, ServiceAccount, RBAC and DaemonSet, through stock kubectl and the official client;
untainted system nodes take the pods that tolerate no GPU taint."""

from __future__ import annotations

import base64
import functools
import logging
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl as run_kubectl
from tests.health.driver_upgrade_support import label_gpu_clients

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kubectl(devcluster):
    return functools.partial(run_kubectl, devcluster.kubeconfig)


def probe_pods(devcluster) -> list[dict]:
    pods, _ = devcluster.store.list("pods", "kube-system")
    return [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == "trainops-node-probe"]


def test_node_probe_manifest_applies_and_runs_one_pod_per_gpu_node(kubectl, devcluster):
    label_gpu_clients(devcluster)  # as GPU Operator v26.7.0+ labels GPU nodes (the devcluster's is v25.10.0)
    out = kubectl("apply", "-f", str(REPO / "deploy" / "node-probe.yaml")).stdout
    assert "daemonset.apps/trainops-node-probe created" in out
    assert "clusterrole.rbac.authorization.k8s.io/trainops-node-probe created" in out
    kubectl("rollout", "status", "daemonset/trainops-node-probe", "-n", "kube-system", "--timeout=60s")
    pods = probe_pods(devcluster)
    assert sorted(p["spec"]["nodeName"] for p in pods) == [f"gpu-node-{i:03d}" for i in range(16)]
    assert all(p["status"]["phase"] == "Running" for p in pods)
    table = kubectl("get", "ds", "-n", "kube-system").stdout.splitlines()
    assert table[0].split()[:6] == ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE"]
    assert table[1].split()[:6] == ["trainops-node-probe", "16", "16", "16", "16", "16"]

    kubectl("label", "node", "gpu-node-003", "nvidia.com/gpu.present-")  # no longer a GPU node
    left = [f"gpu-node-{i:03d}" for i in range(16) if i != 3]
    # the controller deletes the pod gracefully: wait until it is gone, not only terminating
    wait_for(lambda: sorted(p["spec"].get("nodeName") for p in probe_pods(devcluster)) == left)

    again = kubectl("apply", "-f", str(REPO / "deploy" / "node-probe.yaml")).stdout
    assert "daemonset.apps/trainops-node-probe unchanged" in again
    kubectl("delete", "ds", "trainops-node-probe", "-n", "kube-system", "--wait=true", "--timeout=60s")
    wait_for(lambda: not probe_pods(devcluster))


def test_untolerating_pods_land_on_system_nodes(kubectl, devcluster):
    kubectl("run", "sys", "--image=registry.example/busybox:1.36", "-n", "default")
    pod = wait_for(lambda: devcluster.store.get("pods", "default", "sys")["spec"].get("nodeName"))
    assert pod.startswith("system-node-")
    kubectl("wait", "--for=condition=Ready", "pod/sys", "-n", "default", "--timeout=60s")


def test_config_maps_through_the_official_client(k8s):
    core = client.CoreV1Api(k8s)
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="settings", labels={"app": "train"}), data={"lr": "0.1"}
    )
    created = core.create_namespaced_config_map("default", body)
    assert created.data == {"lr": "0.1"} and created.kind == "ConfigMap"
    core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="other"))
    )
    listed = core.list_namespaced_config_map("default", label_selector="app=train")
    assert [c.metadata.name for c in listed.items] == ["settings"]

    stream = watch.Watch().stream(
        core.list_namespaced_config_map,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=10,
    )
    core.patch_namespaced_config_map("settings", "default", {"data": {"batch": "32"}})
    event = next(stream)
    assert event["type"] == "MODIFIED" and event["object"].data == {"lr": "0.1", "batch": "32"}

    current = core.read_namespaced_config_map("settings", "default")
    current.data = {"lr": "0.2"}
    assert core.replace_namespaced_config_map("settings", "default", current).data == {"lr": "0.2"}
    core.delete_collection_namespaced_config_map("default", label_selector="app=train")
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("settings", "default")
    assert gone.value.status == 404
    core.delete_namespaced_config_map("other", "default")
    assert core.list_namespaced_config_map("default").items == []


def test_secrets_are_stored_encoded_and_never_logged(k8s, devcluster, kubectl, caplog):
    caplog.set_level(logging.DEBUG)
    password = "hunter2-never-in-a-log"
    core = client.CoreV1Api(k8s)
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="s3-creds"), string_data={"password": password}
    )
    created = core.create_namespaced_secret("default", secret)
    assert created.type == "Opaque" and created.string_data is None
    assert base64.b64decode(created.data["password"]).decode() == password
    shown = kubectl("get", "secret", "s3-creds", "-o", "jsonpath={.data.password}").stdout
    assert base64.b64decode(shown).decode() == password
    assert "Opaque" in kubectl("get", "secrets").stdout
    kubectl("delete", "secret", "s3-creds")
    assert devcluster.store.find("secrets", "default", "s3-creds") is None
    assert password not in caplog.text
    assert password not in str(devcluster.server.audit.entries())


def test_service_accounts_and_rbac(kubectl, devcluster, k8s):
    manifest = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: runner}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: runner-reads}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects: [{kind: ServiceAccount, name: runner, namespace: default}]
"""
    out = kubectl("apply", "--server-side", "-f", "-", stdin=manifest).stdout
    assert "serviceaccount/runner serverside-applied" in out
    assert "rolebinding.rbac.authorization.k8s.io/runner-reads serverside-applied" in out
    accounts = client.CoreV1Api(k8s).list_namespaced_service_account("default").items
    assert [a.metadata.name for a in accounts] == ["runner"]
    assert kubectl("get", "sa", "runner", "-o", "name").stdout.strip() == "serviceaccount/runner"
    role = client.RbacAuthorizationV1Api(k8s).read_namespaced_role("reader", "default")
    assert role.rules[0].verbs == ["get", "list"]
    kubectl("delete", "-f", "-", stdin=manifest)
    assert devcluster.store.count("roles.rbac.authorization.k8s.io") == 0


def test_kubectl_create_generators_send_protobuf_and_are_understood(kubectl, devcluster):
    kubectl("create", "deployment", "web", "--image=registry.example/web:1.0", "--replicas=2", "--port=8080")
    deployment = devcluster.store.get("deployments.apps", "default", "web")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert (container["name"], container["image"]) == ("web", "registry.example/web:1.0")
    assert container["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    kubectl("rollout", "status", "deployment/web", "--timeout=60s")
    kubectl("scale", "deployment", "web", "--replicas=0")
    assert devcluster.store.get("deployments.apps", "default", "web")["spec"]["replicas"] == 0

    kubectl("create", "configmap", "settings", "--from-literal=lr=0.1", "--from-literal=batch=32")
    assert devcluster.store.get("configmaps", "default", "settings")["data"] == {"lr": "0.1", "batch": "32"}
    kubectl("create", "secret", "generic", "token", "--from-literal=key=s3cr3t")
    secret = devcluster.store.get("secrets", "default", "token")
    assert secret["type"] == "Opaque" and base64.b64decode(secret["data"]["key"]) == b"s3cr3t"
    kubectl("create", "serviceaccount", "runner")
    assert devcluster.store.find("serviceaccounts", "default", "runner") is not None
    kubectl("create", "namespace", "team-a")
    assert devcluster.store.get("namespaces", "", "team-a")["status"]["phase"] == "Active"
    kubectl("create", "job", "once", "--image=registry.example/once:1.0")
    job = devcluster.store.get("jobs.batch", "default", "once")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    kubectl(
        "wait", "--for=condition=Ready", "pod", "-l", "job-name=once", "--timeout=60s"
    )  # runs until deleted
    managers = {e["manager"] for e in job["metadata"]["managedFields"]}
    assert managers == {"kubectl-create"}
