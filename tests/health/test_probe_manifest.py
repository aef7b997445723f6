"""deploy/node-probe.yaml is what a GPU Operator cluster accepts: the nvidia runtime class, node-critical
priority, and a host mount that never blocks the pod on a node without an RDMA driver."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl

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


def probe_pods(cluster) -> list[dict]:
    pods, _ = cluster.store.list("pods", "kube-system")
    return [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == "trainops-node-probe"]


def test_the_daemonset_runs_with_node_critical_priority_and_a_missing_runtime_class_is_named(make_devcluster):
    cluster = make_devcluster(fleet="2*h100-sxm/ib-ndr, l4:pool=none/none")
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
