"""What a fresh devcluster holds: GPU nodes, inference workloads with PodDisruptionBudgets and
Services, Kueue queues, and optionally Virtual-Kubelet-like nodes (an overflow pool).

The shapes follow the cluster conventions of DESIGN §2: every GPU node starts in inference
mode (``trainops.io/mode=inference:NoSchedule``); inference pods tolerate that taint; training
runs go through the ``training`` LocalQueue and ClusterQueue, whose GPU quota starts at zero
and is raised by the capacity claim.  A virtual node looks as Virtual Kubelet registers one
(label ``type=virtual-kubelet``, taint ``virtual-kubelet.io/provider=devcluster:NoSchedule``, room
for ``VIRTUAL_NODE_PODS`` GPU pods): another provider's GPUs, outside the GPU pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainops.capacity.overflow import OVERFLOW_ANNOTATION
from trainops.conventions import (
    FABRIC_LABEL,
    GPU_POOL_LABEL,
    HEALTH_NAMESPACE,
    MODE_INFERENCE,
    MODE_TAINT,
    QUARANTINE_TAINT,
)
from trainops.health.hardware import GPU_PRODUCT_LABEL, MIG_STRATEGY_LABEL
from trainops.health.memory import GPU_MEMORY_LABEL
from trainops.placement.request import BLOCK_LABEL, RACK_LABEL
from trainops_devcluster import kinds
from trainops_devcluster.hardware import NodeProfile
from trainops_devcluster.runtime import LOCAL_IMAGE, VIRTUAL_NODE_LABEL, VIRTUAL_NODE_VALUE

RDMA_RESOURCE, RDMA_DEVICES = "rdma/ib", "1k"  # k8s-rdma-shared-dev-plugin: rdmaHcaMax per node
INFERENCE_NAMESPACE = "inference"
TRAINING_NAMESPACE = "training"
_PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "Topology": "topologies",
}
VIRTUAL_TAINT = {"key": "virtual-kubelet.io/provider", "value": "devcluster", "effect": "NoSchedule"}
VIRTUAL_NODE_PODS = 8  # GPU pods (of gpus_per_node GPUs each) one virtual node has room for
# The overflow pool of the virtual nodes, as a workload's trainops.io/overflow-pool annotation names it
VIRTUAL_POOL = {"node_label": f"{VIRTUAL_NODE_LABEL}={VIRTUAL_NODE_VALUE}", "taint": VIRTUAL_TAINT["key"]}
SERVER_PORT = 8080  # the demo inference server's containerPort; its Service listens on port 80
SERVER_COMMAND = ["python", "-m", "trainops_devcluster.demo.inference_server"]
# A clean hand-off, as vLLM's Kubernetes guide sets one up: a preStop sleep above the endpoint
# propagation trainops assumes (5 s), the server's own drain after SIGTERM, a grace period above both
PRESTOP_S, SHUTDOWN_TIMEOUT_S, GRACE_S = 6, 10, 30


@dataclass(frozen=True)
class InferenceWorkload:
    """An inference Deployment (one pod per GPU node), the PodDisruptionBudget that guards it and
    the Service in front of it.  ``server``: its pods run the demo inference server as local
    processes (arguments ``server_args``), else they are simulated; ``overflow``: it is annotated
    with the virtual nodes' overflow pool.  ``handoff``: its pods are set up to leave without
    failing requests (a readinessProbe on ``/health``, a ``preStop`` sleep of ``PRESTOP_S``, the
    server's ``--shutdown-timeout``, ``terminationGracePeriodSeconds`` above both); False: none
    of these (Ready before the model loads, aborts in-flight requests on SIGTERM), which
    trainops' claim drains the safe way or refuses."""

    name: str
    replicas: int
    min_available: int
    server: bool = False
    server_args: tuple[str, ...] = ()
    overflow: bool = False
    handoff: bool = True


def node_name(index: int) -> str:
    return f"gpu-node-{index:03d}" if index < 1000 else f"gpu-node-{index:04d}"


def default_inference(nodes: int) -> list[InferenceWorkload]:
    """Inference fills about three quarters of the nodes, leaving the rest idle."""
    chat = max(1, nodes // 2)
    embed = max(1, nodes // 4)
    return [
        InferenceWorkload("llm-chat", chat, min_available=max(1, chat - 2)),
        InferenceWorkload("embeddings", embed, min_available=max(1, embed - 1)),
    ]


@dataclass(frozen=True)
class Fabric:
    """Where each GPU node sits: blocks of racks of nodes, as the node labels of Kueue's Topology
    levels say it (``cloud.provider.com/topology-block``, ``-rack``; ``deploy/kueue-queues.yaml``).

    ``blocks``: per block, its racks' node counts, filled in node order (``((4, 4), (4, 4))``: two
    blocks of two racks of four).  Racks are named per block (``rack-1`` of ``block-a`` and of
    ``block-b`` are two racks, as Kueue allows)."""

    blocks: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.blocks or not all(self.blocks) or any(n < 1 for racks in self.blocks for n in racks):
            raise ValueError(f"fabric: every block needs racks of at least one node, got {self.blocks!r}")

    @property
    def nodes(self) -> int:
        return sum(sum(racks) for racks in self.blocks)

    @classmethod
    def uniform(cls, nodes: int, nodes_per_rack: int = 4, racks_per_block: int = 2) -> Fabric:
        """``nodes`` in racks of ``nodes_per_rack`` and blocks of ``racks_per_block`` (the last ones short)."""
        racks = [min(nodes_per_rack, nodes - start) for start in range(0, nodes, nodes_per_rack)]
        return cls(
            tuple(tuple(racks[i : i + racks_per_block]) for i in range(0, len(racks), racks_per_block))
        )

    @classmethod
    def parse(cls, text: str) -> Fabric:
        """``"4,4/4,2"``: blocks separated by ``/``, each a list of rack sizes (the CLI's ``--fabric``)."""
        try:
            return cls(tuple(tuple(int(n) for n in block.split(",")) for block in text.split("/")))
        except ValueError:
            raise ValueError(
                f"fabric {text!r}: give blocks separated by '/', each a comma-separated list of rack sizes, "
                "e.g. '4,4/4,2' (two blocks: racks of 4 and 4, and of 4 and 2)"
            ) from None

    def describe(self) -> str:
        """``2 blocks (block-a: racks of 4, 4; block-b: racks of 4, 4)``."""
        parts = [
            f"block-{_letters(b)}: racks of {', '.join(map(str, racks))}"
            for b, racks in enumerate(self.blocks)
        ]
        return f"{len(self.blocks)} block(s) ({'; '.join(parts)})"

    def labels(self) -> list[dict[str, str]]:
        """The topology labels of each node, in node order."""
        result = []
        for b, racks in enumerate(self.blocks):
            for r, size in enumerate(racks):
                block = f"block-{_letters(b)}"
                result += [{BLOCK_LABEL: block, RACK_LABEL: f"rack-{r + 1}"}] * size
        return result


def _letters(index: int) -> str:
    """a, b, ..., z, aa, ab, ...: a name per block."""
    return _letters(index // 26 - 1) + chr(97 + index % 26) if index >= 26 else chr(97 + index)


def gpu_node(index: int, profile: NodeProfile) -> dict:
    """A GPU node labelled as GPU Feature Discovery labels it, its GPUs advertised as the device
    plugin advertises them under the profile's MIG strategy."""
    name = node_name(index)
    gpus, spec_ = profile.gpu_count, profile.spec
    product, count = spec_.gfd_product, gpus
    labels = {
        "node.kubernetes.io/instance-type": f"gpu-{gpus}x-{profile.gpu}",
        "topology.kubernetes.io/zone": f"zone-{'abcd'[index // 256 % 4]}",
        "nvidia.com/gpu.present": "true",
        GPU_POOL_LABEL: "true",
    }
    gpu_resources = {"nvidia.com/gpu": str(gpus)}
    if profile.mig:
        devices = gpus * profile.mig_instances
        labels[MIG_STRATEGY_LABEL] = profile.strategy
        if profile.strategy == "single":  # nvidia.com/gpu, its product and count are the MIG devices
            product, count = f"{product}-MIG-{profile.mig}", devices
            gpu_resources = {"nvidia.com/gpu": str(devices)}
        else:  # mixed: one resource per MIG type, nvidia.com/gpu for the GPUs without MIG
            labels[f"nvidia.com/mig-{profile.mig}.count"] = str(devices)
            gpu_resources = {"nvidia.com/gpu": "0", f"nvidia.com/mig-{profile.mig}": str(devices)}
    if profile.ports:  # the RDMA shared device plugin's resource (the README's rdma/ib), which TAS counts
        gpu_resources[RDMA_RESOURCE] = RDMA_DEVICES
    labels.update(
        {
            GPU_PRODUCT_LABEL: product,
            "nvidia.com/gpu.count": str(count),
            GPU_MEMORY_LABEL: str(profile.device_memory_mib),
        }
    )
    if profile.pool is not None:
        labels[FABRIC_LABEL] = profile.pool
    spec = {
        "podCIDR": f"10.{index // 256}.{index % 256}.0/24",
        "taints": [{"key": MODE_TAINT, "value": MODE_INFERENCE, "effect": "NoSchedule"}],
    }
    resources = {
        "cpu": "192",
        "memory": "2048Gi",
        **gpu_resources,
        "pods": "110",
        "ephemeral-storage": "7000Gi",
    }
    return _node(name, labels, spec, resources, f"10.0.{index // 256}.{index % 256}", series=0, index=index)


def virtual_node(index: int, gpus: int) -> dict:
    """A Virtual-Kubelet-like node: its pods run at another provider (no GPU processes here)."""
    labels = {VIRTUAL_NODE_LABEL: VIRTUAL_NODE_VALUE, "kubernetes.io/role": "agent"}
    spec = {"taints": [dict(VIRTUAL_TAINT)]}
    pods = VIRTUAL_NODE_PODS
    resources = {
        "cpu": str(16 * pods),
        "memory": f"{128 * pods}Gi",
        "nvidia.com/gpu": str(gpus * pods),
        "pods": "110",
        "ephemeral-storage": "7000Gi",
    }
    return _node(
        f"virtual-node-{index}", labels, spec, resources, f"10.254.0.{index + 1}", series=0xFFFE, index=index
    )


def system_node(index: int) -> dict:
    """An untainted CPU node where system pods land (no GPUs, not in the GPU pool)."""
    labels = {"node.kubernetes.io/instance-type": "cpu-16", "node-role.kubernetes.io/system": ""}
    spec = {"podCIDR": f"10.255.{index}.0/24"}
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    return _node(
        f"system-node-{index}", labels, spec, resources, f"10.255.0.{index + 1}", series=0xFFFF, index=index
    )


def _node(name: str, labels: dict, spec: dict, resources: dict, ip: str, *, series: int, index: int) -> dict:
    """A Ready node as a kubelet registers it; ``series`` and ``index`` make its machine ids unique."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
        },
        "spec": spec,
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "machineID": f"{(series << 16) + index:032x}",
                "systemUUID": f"00000000-0000-0000-{series:04x}-{index:012x}",
                "bootID": f"b007{series:04x}0000{index:020x}",
                "kubeletVersion": "v1.32.0",
                "kubeProxyVersion": "v1.32.0",
                "containerRuntimeVersion": "devcluster://0.1",
                "osImage": "devcluster",
                "kernelVersion": "6.8.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


#: the Pod Security levels of ``deploy/namespaces.yaml`` (a test keeps the two the same)
POD_SECURITY = {
    TRAINING_NAMESPACE: {
        "pod-security.kubernetes.io/enforce": "baseline",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "baseline",
        "pod-security.kubernetes.io/warn-version": "latest",
    },
    HEALTH_NAMESPACE: {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    },
}


def namespaces(*, fresh: bool, inference: bool) -> list[str]:
    """The namespaces a devcluster starts with: a fresh cluster's (``default`` and ``kube-*``), the
    inference workloads', and unless ``fresh`` those ``deploy/namespaces.yaml`` creates."""
    names = (
        ["default", "kube-system", "kube-public", "kube-node-lease"] if fresh else ["default", "kube-system"]
    )
    names += [INFERENCE_NAMESPACE] if inference or not fresh else []
    return names + ([] if fresh else [HEALTH_NAMESPACE, TRAINING_NAMESPACE])


def namespace(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, **({"labels": dict(POD_SECURITY[name])} if name in POD_SECURITY else {})},
        "status": {"phase": "Active"},
    }


def inference_deployment(workload: InferenceWorkload, gpus: int) -> dict:
    labels = {"app": workload.name, "trainops.io/role": "inference"}
    container = {
        "name": "server",
        "image": f"registry.example/{workload.name}:1.0",
        "resources": {
            "requests": {"nvidia.com/gpu": str(gpus), "cpu": "8", "memory": "64Gi"},
            "limits": {"nvidia.com/gpu": str(gpus)},
        },
    }
    if workload.server:
        shutdown = ("--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)) if workload.handoff else ()
        container.update(
            image=LOCAL_IMAGE,
            command=[*SERVER_COMMAND, *workload.server_args, *shutdown],
            ports=[{"name": "http", "containerPort": SERVER_PORT}],
        )
    if workload.handoff:
        container.update(
            readinessProbe={"httpGet": {"path": "/health", "port": SERVER_PORT}, "periodSeconds": 1},
            lifecycle={"preStop": {"sleep": {"seconds": PRESTOP_S}}},
        )
    meta = {"name": workload.name, "namespace": INFERENCE_NAMESPACE, "labels": labels}
    if workload.overflow:
        meta["annotations"] = {OVERFLOW_ANNOTATION: json.dumps(VIRTUAL_POOL)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": workload.replicas,
            "selector": {"matchLabels": {"app": workload.name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **({"terminationGracePeriodSeconds": GRACE_S} if workload.handoff else {}),
                    "nodeSelector": {GPU_POOL_LABEL: "true"},
                    "tolerations": [
                        {
                            "key": MODE_TAINT,
                            "operator": "Equal",
                            "value": MODE_INFERENCE,
                            "effect": "NoSchedule",
                        }
                    ],
                    "containers": [container],
                },
            },
        },
    }


def inference_service(workload: InferenceWorkload) -> dict:
    """The ClusterIP Service in front of the workload's pods: port 80 to the server's port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": workload.name, "namespace": INFERENCE_NAMESPACE},
        "spec": {
            "selector": {"app": workload.name},
            "ports": [{"name": "http", "port": 80, "targetPort": SERVER_PORT}],
        },
    }


def pod_disruption_budget(workload: InferenceWorkload) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": workload.name, "namespace": INFERENCE_NAMESPACE},
        "spec": {"minAvailable": workload.min_available, "selector": {"matchLabels": {"app": workload.name}}},
    }


#: what NVIDIA GPU Operator (Helm chart v25.10.0, installed with deploy/gpu-operator-values.yaml) leaves
#: in the API: its ClusterPolicy and the RuntimeClass its container toolkit registers.  The devcluster's
#: GPU nodes behave as such a cluster's (driver, device plugin and dcgm-exporter are simulated, not pods).
GPU_OPERATOR_VERSION = "v25.10.0"
GPU_OPERATOR_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": MODE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
    {"key": QUARANTINE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
]


def gpu_operator_objects() -> list[tuple[str, dict]]:
    """The ClusterPolicy ``cluster-policy`` (ready, CDI on, RuntimeClass ``nvidia``) and RuntimeClass ``nvidia``."""
    labels = {
        "app.kubernetes.io/name": "gpu-operator",
        "app.kubernetes.io/version": GPU_OPERATOR_VERSION,
        "helm.sh/chart": f"gpu-operator-{GPU_OPERATOR_VERSION}",
    }
    policy = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "labels": labels},
        "spec": {
            "operator": {"defaultRuntime": "containerd", "runtimeClass": "nvidia"},
            "cdi": {"enabled": True, "default": False},
            "daemonsets": {
                "tolerations": GPU_OPERATOR_TOLERATIONS,
                "priorityClassName": "system-node-critical",
            },
            "dcgmExporter": {"enabled": True},
        },
        "status": {"state": "ready", "namespace": "gpu-operator"},
    }
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia", "labels": {"app.kubernetes.io/component": "gpu-operator"}},
        "handler": "nvidia",
    }
    return [("clusterpolicies.nvidia.com", policy), ("runtimeclasses.node.k8s.io", runtime_class)]


def kueue_objects(version: str = "v1beta2") -> list[tuple[str, dict]]:
    """The training queues of the product's ``deploy/kueue-queues.yaml`` (linked here, so the wheel carries it):
    the GPU nodes' Topology, a GPU flavor that names it, a ClusterQueue with zero GPU quota, a LocalQueue
    and two priority classes, at Kueue API ``version`` (their fields are the same in v1beta1 and v1beta2;
    the Topology of Kueue 0.13 is ``v1alpha1``)."""
    manifests = yaml.safe_load_all((Path(__file__).parent / "kueue-queues.yaml").read_text())
    served = kinds.served(version)
    objects = []
    for obj in manifests:
        resource = f"{_PLURALS[obj['kind']]}.kueue.x-k8s.io"
        objects.append((resource, {**obj, "apiVersion": served.of(resource).api_version}))
    return objects
