"""Stock kubectl as a real client of the devcluster (the shared ``devcluster`` fixture)."""

from __future__ import annotations

import functools
import json

import pytest

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl as run_kubectl


@pytest.fixture
def kubectl(devcluster):
    return functools.partial(run_kubectl, devcluster.kubeconfig)


def _node(devcluster, name: str) -> dict:
    return devcluster.store.get("nodes", "", name)


def test_get_nodes_wide_and_by_label(kubectl, devcluster):
    wide = kubectl("get", "nodes", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:6] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP"]
    assert len(wide) == 1 + 16 + 2 and wide[1].split()[1] == "Ready"  # 16 GPU nodes, 2 system nodes
    assert [line.split()[:3] for line in wide[-2:]] == [
        ["system-node-0", "Ready", "system"],
        ["system-node-1", "Ready", "system"],
    ]
    block_a = kubectl("get", "nodes", "-l", "cloud.provider.com/topology-block=block-a", "-o", "name")
    assert block_a.stdout.split() == [f"node/gpu-node-{i:03d}" for i in range(8)]
    unracked = kubectl(
        "get", "nodes", "-l", "cloud.provider.com/topology-block notin (block-a,block-b)", "-o", "name"
    )
    assert unracked.stdout.split() == ["node/system-node-0", "node/system-node-1"]  # notin: label absent too


def test_taint_and_untaint(kubectl, devcluster):
    kubectl("taint", "nodes", "gpu-node-003", "maint=now:NoSchedule")
    taints = {(t["key"], t["effect"]) for t in _node(devcluster, "gpu-node-003")["spec"]["taints"]}
    assert ("maint", "NoSchedule") in taints and len(taints) == 2  # the seeded mode taint is kept
    kubectl("taint", "nodes", "gpu-node-003", "maint-")
    assert "maint" not in {t["key"] for t in _node(devcluster, "gpu-node-003")["spec"]["taints"]}


def test_cordon_and_uncordon(kubectl, devcluster):
    kubectl("cordon", "gpu-node-004")
    assert _node(devcluster, "gpu-node-004")["spec"]["unschedulable"] is True
    assert "SchedulingDisabled" in kubectl("get", "node", "gpu-node-004").stdout
    kubectl("uncordon", "gpu-node-004")
    assert not _node(devcluster, "gpu-node-004")["spec"].get("unschedulable")


def test_patch_types(kubectl, devcluster):
    kubectl("patch", "node", "gpu-node-005", "--type", "merge", "-p", '{"metadata":{"labels":{"a":"1"}}}')
    kubectl(
        "patch",
        "node",
        "gpu-node-005",
        "--type",
        "json",
        "-p",
        '[{"op":"add","path":"/metadata/labels/b","value":"2"}]',
    )
    kubectl(
        "patch", "node", "gpu-node-005", "--type", "strategic", "-p", '{"metadata":{"labels":{"a":null}}}'
    )
    labels = _node(devcluster, "gpu-node-005")["metadata"]["labels"]
    assert labels["b"] == "2" and "a" not in labels
    failed = kubectl(
        "patch",
        "node",
        "gpu-node-005",
        "--type",
        "json",
        "-p",
        '[{"op":"test","path":"/metadata/labels/b","value":"nope"}]',
        check=False,
    )
    assert failed.returncode != 0


def test_create_job_and_find_its_pods_by_node(kubectl, devcluster, tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        """apiVersion: batch/v1
kind: Job
metadata: {name: hello, namespace: training}
spec:
  completions: 2
  parallelism: 2
  completionMode: Indexed
  template:
    metadata:
      annotations: {devcluster.trainops.io/run-seconds: "60"}
    spec:
      restartPolicy: Never
      tolerations: [{operator: Exists}]  # the nodes start tainted for inference
      containers: [{name: main, image: "busybox:1.36", command: [sh, -c, "echo hi"]}]
"""
    )
    assert "job.batch/hello created" in kubectl("create", "-f", str(manifest)).stdout
    job = devcluster.store.get("jobs.batch", "training", "hello")
    assert job["spec"]["completionMode"] == "Indexed"
    pods = wait_for(
        lambda: [p for p in devcluster.store.list("pods", "training")[0] if p["spec"].get("nodeName")] or None
    )
    node = pods[0]["spec"]["nodeName"]
    out = kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "-o", "json").stdout
    names = {p["metadata"]["name"] for p in json.loads(out)["items"]}
    assert pods[0]["metadata"]["name"] in names
    assert all(p["spec"]["nodeName"] == node for p in json.loads(out)["items"])


def test_scale_deployment(kubectl, devcluster):
    kubectl("scale", "deployment", "llm-chat", "-n", "inference", "--replicas=3")
    assert devcluster.store.get("deployments.apps", "inference", "llm-chat")["spec"]["replicas"] == 3
    wait_for(
        lambda: (
            len(
                [
                    p
                    for p in devcluster.store.list("pods", "inference")[0]
                    if p["metadata"]["name"].startswith("llm-chat")
                ]
            )
            == 3
            or None
        )
    )


def test_drain_respects_the_pod_disruption_budget(kubectl, devcluster):
    pods = [
        p
        for p in devcluster.store.list("pods", "inference")[0]
        if p["metadata"]["labels"]["app"] == "llm-chat"
    ]
    replicas = devcluster.store.get("deployments.apps", "inference", "llm-chat")["spec"]["replicas"]
    budget = next(
        b["metadata"]["name"]
        for b in devcluster.store.list("poddisruptionbudgets.policy", "inference")[0]
        if b["spec"]["selector"]["matchLabels"].get("app") == "llm-chat"
    )
    node = pods[0]["spec"]["nodeName"]

    # A budget that allows no disruption: drain cordons, then eviction answers 429 until the timeout.
    kubectl(
        "patch",
        "pdb",
        budget,
        "-n",
        "inference",
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"minAvailable": replicas}}),
    )
    wait_for(
        lambda: (
            devcluster.store.get("poddisruptionbudgets.policy", "inference", budget)["status"].get(
                "disruptionsAllowed"
            )
            == 0
        )
    )
    result = kubectl(
        "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=6s", check=False
    )
    assert result.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget" in result.stderr
    assert devcluster.store.find("pods", "inference", pods[0]["metadata"]["name"]) is not None
    assert _node(devcluster, node)["spec"]["unschedulable"] is True

    # Allow one disruption: the pod is evicted, the Deployment replaces it elsewhere, the drain completes.
    kubectl(
        "patch",
        "pdb",
        budget,
        "-n",
        "inference",
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"minAvailable": replicas - 1}}),
    )
    out = kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s").stdout
    assert f"node/{node} drained" in out
    assert devcluster.store.find("pods", "inference", pods[0]["metadata"]["name"]) is None
    assert not [p for p in devcluster.store.list("pods", "inference")[0] if p["spec"].get("nodeName") == node]


def test_logs(kubectl, devcluster):
    pod = devcluster.store.list("pods", "inference")[0][0]
    devcluster.logs.append("inference", pod["metadata"]["name"], "serving on :8000\n")
    out = kubectl("logs", "-n", "inference", pod["metadata"]["name"]).stdout
    assert "serving on :8000" in out


def test_api_resources_and_kueue_workloads(kubectl, devcluster, tmp_path):
    lines = kubectl("api-resources").stdout.splitlines()
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert "no" in by_name["nodes"].split() and "po" in by_name["pods"].split()
    assert "kueue.x-k8s.io/v1beta2" in by_name["workloads"]
    assert "policy/v1" in by_name["poddisruptionbudgets"]
    job = tmp_path / "queued.yaml"
    job.write_text(
        """apiVersion: batch/v1
kind: Job
metadata:
  name: queued
  namespace: training
  labels: {kueue.x-k8s.io/queue-name: training}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: "busybox:1.36", resources: {limits: {nvidia.com/gpu: "1"}}}]
"""
    )
    kubectl("create", "-f", str(job))
    out = wait_for(
        lambda: (r := kubectl("get", "workloads.kueue.x-k8s.io", "-A").stdout) and "queued" in r and r
    )
    header = out.splitlines()[0].split()
    assert header[:3] == ["NAMESPACE", "NAME", "QUEUE"]
