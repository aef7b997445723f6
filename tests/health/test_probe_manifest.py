"""deploy/node-probe.yaml is what a GPU Operator cluster accepts: the nvidia runtime class, node-critical
priority, a host mount that never blocks the pod on a node without an RDMA driver, and a nodeSelector
GPU Operator's driver manager pauses (and waits for) before it unloads the driver of a node."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl
from tests.health.driver_upgrade_support import label_gpu_clients
from trainops.doctor.gpu_operator import CLIENT_LABEL, PAUSED

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "node-probe.yaml"


def daemon_set(text: str) -> dict:
    return next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet")


def test_the_probe_asks_for_the_gpus_as_gpu_operator_components_do():
    spec = daemon_set(MANIFEST.read_text())["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["priorityClassName"] == "system-node-critical"
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "nvidia.com/gpu" not in str(container["resources"])
    # every hostPath is one that exists on any Linux node, typed so the kubelet never creates it
    for volume in spec["volumes"]:
        host = volume["hostPath"]
        assert host["type"] == "Directory" and host["path"] == "/sys", volume
    mounted = {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")}
    ib_root = container["args"][container["args"].index("--ib-sysfs") + 1]
    assert any(ib_root.startswith(path + "/") for path in mounted)


def test_the_probe_follows_gpu_operators_client_pod_convention_and_lets_the_driver_go():
    """k8s-driver-manager (v0.12.0) waits for DaemonSet pods whose *nodeSelector* has the client label
    (not node affinity); the probe samples with NVML shut between samples and stops at SIGTERM."""
    spec = daemon_set(MANIFEST.read_text())["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", CLIENT_LABEL: "true"}
    assert "--hold-nvml" not in spec["containers"][0]["args"]
    assert spec["terminationGracePeriodSeconds"] <= 30


def probe_pods(cluster) -> list[dict]:
    pods, _ = cluster.store.list("pods", "kube-system")
    return [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == "trainops-node-probe"]


def test_the_daemonset_runs_with_node_critical_priority_and_a_missing_runtime_class_is_named(make_devcluster):
    cluster = make_devcluster(fleet="2*h100-sxm/ib-ndr, l4:pool=none/none")
    label_gpu_clients(cluster)  # as GPU Operator v26.7.0+ labels GPU nodes (the devcluster's is v25.10.0)
    kubectl(cluster.kubeconfig, "apply", "-f", str(MANIFEST))
    kubectl(
        cluster.kubeconfig,
        "rollout",
        "status",
        "daemonset/trainops-node-probe",
        "-n",
        "kube-system",
        "--timeout=60s",
    )
    pods = probe_pods(cluster)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(cluster.telemetry)  # the RDMA-less node too
    assert {(p["spec"]["priority"], p["spec"]["runtimeClassName"]) for p in pods} == {(2000001000, "nvidia")}

    # a cluster whose runtime class has another name: the DaemonSet says so instead of running blind
    wrong = MANIFEST.read_text().replace("runtimeClassName: nvidia ", "runtimeClassName: nvidia-cdi ")
    kubectl(cluster.kubeconfig, "apply", "-f", "-", stdin=wrong)

    def refused() -> list[str]:
        events, _ = cluster.store.list("events", "kube-system")
        return [e["message"] for e in events if e.get("reason") == "FailedCreate"]

    assert wait_for(refused)[-1] == (  # as kube-apiserver 1.36 refuses it: named by its generateName
        'Error creating: pods "trainops-node-probe-" is forbidden: pod rejected: RuntimeClass "nvidia-cdi" not found'
    )
    assert not probe_pods(cluster)


def awaited_by_driver_manager(cluster, node: str) -> list[dict]:
    """The pods on ``node`` that k8s-driver-manager v0.12.0 waits for before unloading the driver
    (``WaitForPodsWithNodeSelector``): any phase, controlled by a DaemonSet, with the client label's key
    in ``spec.nodeSelector``."""
    pods, _ = cluster.store.list("pods")  # every namespace, as the driver manager lists them
    return [
        p
        for p in pods
        if p["spec"].get("nodeName") == node
        and CLIENT_LABEL in (p["spec"].get("nodeSelector") or {})
        and any(
            o.get("controller") and o.get("kind") == "DaemonSet"
            for o in p["metadata"].get("ownerReferences") or []
        )
    ]


def test_a_driver_upgrade_moves_the_probe_off_its_node_and_back(make_devcluster):
    """What GPU Operator's driver manager does to a node's client label around a driver upgrade: "true"
    -> "paused-for-driver-upgrade" (then it waits for the probe pod to be gone) -> "true"."""
    cluster = make_devcluster(nodes=3)
    nodes = label_gpu_clients(cluster)
    kubectl(cluster.kubeconfig, "apply", "-f", str(MANIFEST))
    wait_for(
        lambda: sorted(p["spec"].get("nodeName") or "" for p in probe_pods(cluster)) == nodes,
        "a probe per node",
    )
    upgraded, others = nodes[1], [nodes[0], nodes[2]]
    assert awaited_by_driver_manager(cluster, upgraded)

    kubectl(cluster.kubeconfig, "label", "node", upgraded, f"{CLIENT_LABEL}={PAUSED}", "--overwrite")
    wait_for(
        lambda: not awaited_by_driver_manager(cluster, upgraded), "the probe pod gone, not only terminating"
    )
    # the other nodes keep theirs
    assert sorted(p["spec"].get("nodeName") or "" for p in probe_pods(cluster)) == others

    kubectl(cluster.kubeconfig, "label", "node", upgraded, f"{CLIENT_LABEL}=true", "--overwrite")
    wait_for(
        lambda: any(
            p["status"].get("phase") == "Running" for p in awaited_by_driver_manager(cluster, upgraded)
        ),
        "the probe pod back on the upgraded node",
    )
    assert sorted(p["spec"].get("nodeName") or "" for p in probe_pods(cluster)) == nodes
