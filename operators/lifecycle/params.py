"""The trigger form of a lifecycle DAG: every param with its default and JSON schema, in one table.

To change the form, edit ``PARAM_SPECS``; the Airflow UI renders it and refuses a run whose conf
does not validate, naming the field. ``lifecycle_params(**defaults)`` hands it to ``DAG(params=...)``.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from trainops.health.policy import DEFAULT_POLICY
from trainops.placement.request import BLOCK_LABEL, DEFAULT_LEVELS
from trainops.training.naming import DNS_1123_LABEL

MAX_RESUMES = 10  # the largest max_resumes the form accepts
DEMO_BUCKET = "trainops-demo"
LOCAL_IMAGE = "devcluster.trainops.io/local"  # the devcluster runs this image's command as a local process
DEMO_COMMAND = [
    "python",
    "-m",
    "trainops_devcluster.demo.trainer",
    "--steps",
    "200",
    "--checkpoint-every",
    "20",
    "--step-seconds",
    "0.05",
]
S3_RUN_PREFIX = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
WORKLOAD_REF = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


def lifecycle_params(**defaults: Any) -> dict[str, Param]:
    """The trigger-form params of a lifecycle DAG; ``defaults`` replaces default values by name."""
    unknown = set(defaults) - set(PARAM_SPECS)
    if unknown:
        raise ValueError(f"lifecycle_params: unknown params {sorted(unknown)}; known: {sorted(PARAM_SPECS)}")
    return {
        name: Param(defaults.get(name, default), **schema) for name, (default, schema) in PARAM_SPECS.items()
    }


def _dns(title: str, description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "pattern": DNS_1123_LABEL.pattern,
        "maxLength": 63,
        "title": title,
        "description": description + " (DNS-1123 label: lower-case letters, digits and '-').",
    }


PARAM_SPECS: dict[str, tuple[Any, dict[str, Any]]] = {
    "run_name": (
        None,
        {
            "type": ["null", "string"],
            "pattern": f"^$|{DNS_1123_LABEL.pattern}",
            "maxLength": 63,
            "title": "Run name",
            "description": "Names the run: its checkpoints go under checkpoint_uri/run_name/. Empty: derived "
            "from this DAG run (<dag>-<date>-<time>-<hash>), so every trigger starts a run of its own. A name "
            "another DAG run already used is refused before any node is touched. (DNS-1123 label: "
            "lower-case letters, digits and '-'.)",
        },
    ),
    "preflight": (
        False,
        {
            "type": "boolean",
            "title": "Preflight",
            "description": "First run trainops doctor against the cluster (GPU Operator, node probe, dcgm-exporter, "
            "Kueue, taints, Pod Security, admission policy, permissions) and fail naming each problem and its fix. "
            "Read-only; the worker's account needs deploy/doctor-rbac.yaml.",
        },
    ),
    "image": (
        LOCAL_IMAGE,
        {
            "type": "string",
            "minLength": 1,
            "title": "Training image",
            "description": f"Container image of the trainer. {LOCAL_IMAGE} runs the command as a local "
            "process on the devcluster.",
        },
    ),
    "command": (
        DEMO_COMMAND,
        {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "title": "Command",
            "description": "The trainer's command and arguments. It gets TRAINOPS_RUN_URI and "
            "TRAINOPS_RESUME_FROM (empty on a fresh start).",
        },
    ),
    "nodes": (
        2,
        {
            "type": "integer",
            "minimum": 1,
            "title": "Nodes",
            "description": "How many GPU nodes the run trains on (one pod per node).",
        },
    ),
    "min_nodes": (
        None,
        {
            "type": ["null", "integer"],
            "minimum": 1,
            "title": "Min nodes (elastic resume)",
            "description": "When a resume lacks nodes (a node quarantined, no spare left) it waits up to "
            "elastic_wait_s for more, then resumes on the nodes there are, never fewer than this, from the last "
            "verified checkpoint; the trainer learns the smaller world size from WORLD_SIZE / TRAINOPS_WORLD_SIZE "
            "and must load its checkpoint at that size (DCP reshards). From 1 to nodes. Empty: always all nodes.",
        },
    ),
    "elastic_wait_s": (
        120,
        {
            "type": "number",
            "minimum": 0,
            "title": "Elastic wait (s)",
            "description": "With min_nodes below nodes: how long a resume short of nodes waits for them before it "
            "trains on fewer.",
        },
    ),
    "gpu_memory_gib": (
        None,
        {
            "type": ["null", "number"],
            "exclusiveMinimum": 0,
            "title": "Peak GPU memory per GPU (GiB)",
            "description": "The run's peak memory per GPU on all its nodes, when known. The health gate warns when "
            "a resume on min_nodes could exceed the chosen GPUs' memory (sharded state grows by nodes/min_nodes) "
            "and names the smallest safe min_nodes. Empty: not checked.",
        },
    ),
    "spare_nodes": (
        1,
        {
            "type": "integer",
            "minimum": 0,
            "title": "Spare nodes",
            "description": "How many extra healthy nodes are claimed so a resume after a node fault has "
            "somewhere to run.",
        },
    ),
    "gpus_per_node": (
        8,
        {"type": "integer", "minimum": 1, "title": "GPUs per node", "description": "GPUs each pod asks for."},
    ),
    "kueue_queue": (
        "training",
        _dns("Kueue LocalQueue", "The LocalQueue in namespace 'training' to submit to"),
    ),
    "cluster_queue": (
        "training",
        _dns(
            "Kueue ClusterQueue", "The ClusterQueue behind the LocalQueue; its GPU quota grows by the claim"
        ),
    ),
    "priority_class": (
        "training-standard",
        _dns("Priority class", "Kueue WorkloadPriorityClass of the run"),
    ),
    "checkpoint_uri": (
        f"s3://{DEMO_BUCKET}/runs/",
        {
            "type": "string",
            "pattern": S3_RUN_PREFIX,
            "title": "Checkpoint URI",
            "description": "s3://bucket/prefix under which the run's checkpoints and heartbeat live, as "
            "<prefix>/<run_name>/. The bucket is required.",
        },
    ),
    "max_resumes": (
        2,
        {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_RESUMES,
            "title": "Max resumes",
            "description": "How many times an infrastructure failure may resume the run from its last "
            "verified checkpoint.",
        },
    ),
    "hang_timeout_s": (
        None,
        {
            "type": ["null", "number"],
            "exclusiveMinimum": 0,
            "title": "Hang timeout (s)",
            "description": "Seconds without progress that count as a hang. Empty: learned from the run's "
            "own step times.",
        },
    ),
    "health_wait_s": (
        0,
        {
            "type": "number",
            "minimum": 0,
            "title": "Wait for healthy nodes (s)",
            "description": "With too few healthy nodes, the gate waits (deferred) this long; 0 fails at once.",
        },
    ),
    "inference_workloads": (
        ["inference/llm-chat", "inference/embeddings"],
        {
            "type": "array",
            "items": {"type": "string", "pattern": WORKLOAD_REF},
            "title": "Inference workloads to borrow from",
            "description": "namespace/name of the inference Deployments that may shrink while the run "
            "holds their nodes; restored by the teardown.",
        },
    ),
    "overflow_pool": (
        None,
        {
            "type": ["null", "object"],
            "properties": {
                "node_label": {"type": "string", "pattern": "^[^=,]+=[^=,]*(,[^=,]+=[^=,]*)*$"},
                "taint": {"type": "string", "pattern": "^[^=:]+(=[^=:]*)?$"},
                "min_ready": {"type": "integer", "minimum": 0},
            },
            "required": ["node_label"],
            "additionalProperties": False,
            "title": "Overflow pool for inference",
            "description": "Where displaced inference replicas keep serving while the run holds their nodes, e.g. "
            '{"node_label": "type=virtual-kubelet", "taint": "virtual-kubelet.io/provider"} (a Virtual Kubelet '
            "node, another cloud's GPUs): made Ready there before their pods go, moved back in waves by the "
            "return. For the Deployments without a trainops.io/overflow-pool annotation of their own. "
            "Empty: they shrink.",
        },
    ),
    "return_wave_nodes": (
        None,
        {
            "type": ["null", "integer"],
            "minimum": 1,
            "title": "Nodes per return wave",
            "description": "With replicas in an overflow pool, the return gives this many nodes back at a time "
            "and waits until inference is Ready on them before the overflow shrinks. Empty: a quarter "
            "of the run's nodes.",
        },
    ),
    "prometheus_conn_id": (
        None,
        {
            "type": ["null", "string"],
            "title": "Prometheus connection",
            "description": "Airflow http connection of a Prometheus that scrapes dcgm-exporter: the gate and "
            "the fabric check then also read DCGM (XID counts, health watches, tensor-core activity). "
            "Empty: the node probe's reports alone.",
        },
    ),
    "on_prometheus_unavailable": (
        "fail",
        {
            "type": "string",
            "enum": ["fail", "probe-only"],
            "title": "When Prometheus is unreachable",
            "description": "fail: the gate fails; probe-only: it gates on the node probe's reports alone "
            "and says so.",
        },
    ),
    "fabric_gate": (
        True,
        {
            "type": "boolean",
            "title": "Gate on the InfiniBand fabric",
            "description": "Check the nodes' InfiniBand ports in the gate, and the claimed nodes' ports "
            "again right before training (fabric_ready). Off for clusters without InfiniBand.",
        },
    ),
    "fabrics": (
        {},
        {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "required": {"type": "boolean"},
                    "link_layer": {"type": "string", "enum": ["auto", "InfiniBand", "Ethernet"]},
                    "hcas": {"type": "string"},
                    "rate_gbps": {"type": ["null", "number"], "exclusiveMinimum": 0},
                    "ports": {"type": ["null", "integer"], "minimum": 1},
                },
                "additionalProperties": False,
            },
            "title": "RDMA fabrics",
            "description": "The cluster's fabrics by name, picked per node by its trainops.io/fabric label "
            '(unlabelled: "default"; "none": a pool that needs no RDMA), e.g. {"default": {"rate_gbps": 400}, '
            '"roce": {"link_layer": "Ethernet", "hcas": "mlx5_0,mlx5_1", "rate_gbps": 200}}. '
            "hcas is an NCCL_IB_HCA list; only those ports are judged.",
        },
    ),
    "fault_window_s": (
        7200,
        {
            "type": "number",
            "exclusiveMinimum": 0,
            "title": "Fault window (s)",
            "description": "How long an XID seen in Prometheus, or a slowdown seen in a training run, keeps a "
            "node out after it was last seen.",
        },
    ),
    "speed_tiers": (
        True,
        {
            "type": "boolean",
            "title": "Speed tiers",
            "description": "Give the run nodes of like measured speed (GEMM timed by the probe on idle "
            "GPUs); nodes of unknown speed form a group of their own and are never left out for it.",
        },
    ),
    "topology": (
        "none",
        {
            "type": "string",
            "enum": ["none", "preferred", "required"],
            "title": "Topology",
            "description": "Place the run by the fabric (Kueue Topology Aware Scheduling): preferred puts its nodes "
            "in one topology_level domain when one holds them (else the fewest domains), required waits for one "
            "that does; spares go beside them. Needs the Topology and TAS flavor of deploy/kueue-queues.yaml and "
            "the level labels on the GPU nodes. none: quota alone.",
        },
    ),
    "topology_level": (
        BLOCK_LABEL,
        {
            "type": "string",
            "minLength": 1,
            "title": "Topology level",
            "description": "The node label of the level the run asks for, one of topology_levels (e.g. a "
            "block or a rack).",
        },
    ),
    "topology_levels": (
        list(DEFAULT_LEVELS),
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "title": "Topology levels",
            "description": "The node labels of the fabric's levels, widest first, as the cluster's Kueue "
            "Topology lists them (kubernetes.io/hostname last, if at all).",
        },
    ),
    "health_policy_overrides": (
        {},
        {
            "type": "object",
            "propertyNames": {"enum": [row.name for row in DEFAULT_POLICY.rows]},
            "additionalProperties": {"type": "object"},
            "title": "Health policy overrides",
            "description": 'Policy rows to change, e.g. {"xid_warn": {"verdict": "quarantine"}} '
            "(fields: threshold, verdict, if_unknown).",
        },
    ),
}
