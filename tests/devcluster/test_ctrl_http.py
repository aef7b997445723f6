"""The controllers behind the real API server, driven by the official ``kubernetes`` client over HTTP."""

from __future__ import annotations

import sys

import pytest
import yaml
from kubernetes import client, config, watch
from trainops_devcluster.authn import ADMIN_TOKEN
from trainops_devcluster.controllers import start_controllers
from trainops_devcluster.logs import PodLogs
from trainops_devcluster.runtime import LOCAL_IMAGE
from trainops_devcluster.server import ApiServer
from trainops_devcluster.store import Store

from tests.devcluster.ctrl_support import node

pytestmark = pytest.mark.servers  # `api_client`: the devcluster's API server


@pytest.fixture
def api_client(tmp_path):
    store = Store()
    store.create("namespaces", {"metadata": {"name": "default"}, "status": {"phase": "Active"}})
    for name in ("a", "b"):
        store.create("nodes", node(name))
    logs = PodLogs()
    controllers = start_controllers(store, logs, {}, {})
    server = ApiServer(store, logs=logs)
    url = server.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "dev", "cluster": {"server": url}}],
                "users": [{"name": "dev", "user": {"token": ADMIN_TOKEN}}],
                "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "dev"}}],
                "current-context": "dev",
            }
        )
    )
    api = config.new_client_from_config(config_file=str(kubeconfig))
    yield api
    api.close()
    server.stop()
    controllers.stop()


def test_indexed_job_submitted_over_http_runs_its_processes(api_client):
    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
    script = "import os; print('rank', os.environ['JOB_COMPLETION_INDEX'], 'on', os.environ['NODE'])"
    container = {
        "name": "train",
        "image": LOCAL_IMAGE,
        "command": [sys.executable, "-c", script],
        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }
    batch.create_namespaced_job("default", manifest)
    stream = watch.Watch().stream(
        batch.list_namespaced_job, "default", field_selector="metadata.name=train", timeout_seconds=60
    )
    for event in stream:
        status = event["object"].status
        conditions = (status.conditions if status else None) or []
        if any(c.type == "Complete" and c.status == "True" for c in conditions):
            break
    job = batch.read_namespaced_job("train", "default")
    assert job.status.succeeded == 2 and job.status.completed_indexes == "0-1"
    pods = core.list_namespaced_pod("default", label_selector="batch.kubernetes.io/job-name=train").items
    # _preload_content=False: kubernetes 36 turns a text body into the repr of its bytes otherwise
    logs = sorted(
        core.read_namespaced_pod_log(p.metadata.name, "default", _preload_content=False).data.decode()
        for p in pods
    )
    assert logs == sorted(
        f"rank {p.metadata.annotations['batch.kubernetes.io/job-completion-index']} on {p.spec.node_name}\n"
        for p in pods
    )
    assert {p.spec.node_name for p in pods} == {"a", "b"}  # 8 GPUs each: one pod per node


def test_no_execute_taint_patched_over_http_evicts_the_pod(api_client):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "victim"},
            "spec": {"nodeName": "a", "containers": [{"name": "main", "image": "registry.example/app:1"}]},
        },
    )
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=60)
    patched = False
    seen = []
    for event in stream:
        pod = event["object"]
        seen.append((event["type"], pod.status.phase))
        if not patched and pod.status.phase == "Running":
            taint = {"key": "trainops.io/quarantine", "value": "xid", "effect": "NoExecute"}
            core.patch_node("a", {"spec": {"taints": [taint]}})
            patched = True
        if event["type"] == "DELETED":
            break
    assert patched and seen[-1][0] == "DELETED"
    reasons = [c.reason for c in pod.status.conditions or [] if c.type == "DisruptionTarget"]
    assert reasons == ["DeletionByTaintManager"]


def test_deployment_scaled_through_the_scale_subresource(api_client):
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(
        "default",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "llm"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "llm"}},
                "template": {
                    "metadata": {"labels": {"app": "llm"}},
                    "spec": {"containers": [{"name": "server", "image": "registry.example/llm:1"}]},
                },
            },
        },
    )
    apps.patch_namespaced_deployment_scale("llm", "default", {"spec": {"replicas": 3}})
    for event in watch.Watch().stream(apps.list_namespaced_deployment, "default", timeout_seconds=60):
        if (event["object"].status.ready_replicas or 0) == 3:
            break
    assert apps.read_namespaced_deployment_scale("llm", "default").status.replicas == 3
    assert len(core.list_namespaced_pod("default", label_selector="app=llm").items) == 3
