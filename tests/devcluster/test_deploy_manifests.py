"""``deploy/`` on a cluster as an operator meets it: the README's ``kubectl apply`` steps, in the
README's order, on a devcluster that starts as a fresh cluster does (only ``default`` and
``kube-*``), and GPU Operator's DaemonSets with ``deploy/gpu-operator-values.yaml``'s tolerations
beside every trainops taint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from trainops_devcluster import topology

from tests.capacity.helpers import kube_for
from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl
from tests.health.driver_upgrade_support import label_gpu_clients
from trainops.capacity.procedure import claim
from trainops.conventions import MODE_TAINT, QUARANTINE_TAINT

REPO = Path(__file__).parents[2]
STEPS = re.findall(r"^\s*kubectl apply -f (deploy/\S+)", (REPO / "README.md").read_text(), re.MULTILINE)


def test_the_readme_steps_apply_in_order_on_a_fresh_cluster(make_devcluster):
    assert STEPS[0] == "deploy/namespaces.yaml" and "deploy/node-probe-admission.yaml" in STEPS
    cluster = make_devcluster(nodes=2, fresh=True)
    names = sorted(n["metadata"]["name"] for n in cluster.store.list("namespaces")[0])
    assert names == ["default", "inference", "kube-node-lease", "kube-public", "kube-system"]
    # what a missed step looks like: nothing creates the namespaces rbac.yaml puts its Roles in
    early = kubectl(cluster.kubeconfig, "apply", "-f", str(REPO / "deploy/rbac.yaml"), check=False)
    assert early.returncode != 0 and 'namespaces "training" not found' in early.stderr

    label_gpu_clients(
        cluster
    )  # as GPU Operator v26.7.0+ labels GPU nodes (README; the devcluster's is v25.10.0)
    for step in STEPS:
        kubectl(cluster.kubeconfig, "apply", "-f", str(REPO / step))

    policies = cluster.store.list("validatingadmissionpolicies.admissionregistration.k8s.io")[0]
    assert [p["status"]["typeChecking"] for p in policies] == [{}] * len(policies) != []  # no warnings
    gpu_nodes = {"gpu-node-000", "gpu-node-001"}
    probes = lambda: {p["spec"].get("nodeName") for p in cluster.store.list("pods", "kube-system")[0]}  # noqa: E731
    wait_for(lambda: probes() == gpu_nodes, "a probe pod on every GPU node (kube-system allows its hostPath)")
    assert cluster.store.find("localqueues.kueue.x-k8s.io", "training", "training") is not None


def test_the_devclusters_namespaces_enforce_the_levels_deploy_ships():
    shipped = {
        d["metadata"]["name"]: d["metadata"]["labels"]
        for d in yaml.safe_load_all((REPO / "deploy/namespaces.yaml").read_text())
    }
    assert shipped == topology.POD_SECURITY


def daemon_set(name: str, tolerations: list[dict]) -> dict:
    spec = {"nodeSelector": {"nvidia.com/gpu.present": "true"}, "tolerations": tolerations}
    spec["containers"] = [{"name": name, "image": f"nvcr.io/nvidia/{name}:1"}]
    labels = {"app": name}
    template = {"metadata": {"labels": labels}, "spec": spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "gpu-operator"},
        "spec": {"selector": {"matchLabels": labels}, "template": template},
    }


def test_gpu_operator_daemonsets_run_on_every_trainops_taint_and_the_claim_leaves_them(make_devcluster):
    values = yaml.safe_load((REPO / "deploy/gpu-operator-values.yaml").read_text())
    cluster = make_devcluster(nodes=4, inference=[])  # only the operands run on the GPU nodes
    kube = kube_for(cluster)
    claim(kube, "train/run-1", ["gpu-node-001", "gpu-node-002"], cluster_queue="training")  # mode=training
    quarantine = {"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}
    node = cluster.store.get("nodes", "", "gpu-node-002")
    kubectl(
        cluster.kubeconfig,
        "taint",
        "node",
        "gpu-node-002",
        f"{quarantine['key']}={quarantine['value']}:NoSchedule",
    )
    taints = {
        n["metadata"]["name"]: {(t["key"], t.get("value")) for t in n["spec"].get("taints") or []}
        for n in cluster.store.list("nodes")[0]
    }
    assert (MODE_TAINT, "inference") in taints["gpu-node-000"] and (MODE_TAINT, "training") in taints[
        "gpu-node-001"
    ]
    assert {(MODE_TAINT, "training"), (QUARANTINE_TAINT, "xid-79")} <= taints["gpu-node-002"] and node
    kubectl(cluster.kubeconfig, "create", "namespace", "gpu-operator")
    operands = {
        "dcgm-exporter": values["daemonsets"]["tolerations"],
        "nfd-worker": values["node-feature-discovery"]["worker"]["tolerations"],
        "chart-default": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    for name, tolerations in operands.items():
        kubectl(cluster.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(daemon_set(name, tolerations)))

    def placed(app: str) -> set[str]:
        pods = cluster.store.list("pods", "gpu-operator")[0]
        return {
            p["spec"].get("nodeName")
            for p in pods
            if p["metadata"]["labels"].get("app") == app and p["spec"].get("nodeName")
        }

    gpu_nodes = {f"gpu-node-00{i}" for i in range(4)}
    wait_for(
        lambda: placed("dcgm-exporter") == placed("nfd-worker") == gpu_nodes, "operands on every GPU node"
    )
    assert placed("chart-default") == set()  # the chart's tolerations alone: no driver on any trainops node

    before = {p["metadata"]["uid"] for p in cluster.store.list("pods", "gpu-operator")[0]}
    claim(kube, "train/run-2", ["gpu-node-000", "gpu-node-003"], cluster_queue="training")
    assert {p["metadata"]["uid"] for p in cluster.store.list("pods", "gpu-operator")[0]} == before
    evicted = [e["path"] for e in cluster.server.audit.entries() if e["path"].endswith("/eviction")]
    assert not [path for path in evicted if "/namespaces/gpu-operator/" in path]


def test_devcluster_up_applies_what_it_serves_and_names_what_it_cannot(make_devcluster, tmp_path):
    cluster = make_devcluster(nodes=2)
    cluster.create_from_file(REPO / "deploy/node-probe-admission.yaml")  # was a bare StopIteration
    stored = cluster.store.list("validatingadmissionpolicybindings.admissionregistration.k8s.io")[0]
    assert len(stored) == 2
    unknown = tmp_path / "crd.yaml"
    unknown.write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: x}\n"
    )
    with pytest.raises(
        ValueError,
        match=r"CustomResourceDefinition 'x' \(apiextensions.k8s.io/v1\): the devcluster does not serve this kind",
    ):
        cluster.create_from_file(unknown)
    fresh = make_devcluster(nodes=1, inference=[], fresh=True)
    with pytest.raises(ValueError, match='Role .* namespaces "training" not found'):
        fresh.create_from_file(REPO / "deploy/rbac.yaml")
