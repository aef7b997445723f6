"""The gang: one Kueue-managed Indexed Job per attempt, one pod per node, and its headless Service.

Kueue admits all ``nodes`` pods together or none (one PodSet of ``nodes`` pods).  The Job is
created suspended; Kueue's webhook would suspend it anyway and unsuspends it on admission.
``backoffLimit: 0``: the first pod failure fails the attempt, because trainops, not the Job
controller, decides whether and where the run resumes.

Rendezvous: the Job controller names each pod ``<job>-<index>``; with ``subdomain: <job>`` and the
headless Service ``<job>`` (``publishNotReadyAddresses``: ranks look rank 0 up before it is Ready),
rank 0 is ``<job>-0.<job>.<namespace>.svc``.  Every pod gets that as ``MASTER_ADDR`` and the
torchrun variables (``PET_*``) from its completion index.  Objects are plain API dicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainops.conventions import (
    GPU_POOL_LABEL,
    GPU_RESOURCE,
    HEALTH_LABEL,
    HEALTH_QUARANTINED,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    MODE_TAINT,
    MODE_TRAINING,
)
from trainops.placement.request import TopologyRequest
from trainops.training.naming import run_key
from trainops.training.podtemplate import merge_under

if TYPE_CHECKING:  # spec.py builds a trial Job to check itself: it imports this module, not the reverse
    from trainops.training.spec import TrainingSpec

CONTAINER_NAME = "trainer"  # the training container of every pod (a pod template's "trainer" merges into it)
RUN_LABEL = "trainops.io/run"
ATTEMPT_LABEL = "trainops.io/attempt"
DAG_RUN_ANNOTATION = "trainops.io/dag-run"
RESUME_ANNOTATION = "trainops.io/resume-from"
KEPT_OUT_ANNOTATION = "trainops.io/kept-out"
MAX_REASON = 200  # characters of a kept-out node's reason on the Job
MAX_KEPT_OUT = 192 << 10  # characters of trainops.io/kept-out (the API allows 256 KiB of annotations)
HOSTNAME_LABEL = "kubernetes.io/hostname"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
SHM_VOLUME = "dshm"
RENDEZVOUS_PORT_NAME = "rendezvous"
#: RDMA devices (``rdma/ib``, ``rdma/hca_shared_devices_a``...) need the memory registration RDMA
#: does, which pins memory: IPC_LOCK, which only Pod Security "privileged" allows
RDMA_PREFIX, RDMA_CAPABILITY = "rdma/", "IPC_LOCK"


def condition(obj: Mapping | None, kind: str) -> Mapping | None:
    """The condition of ``kind`` (of a Job, a Workload) when its status is True."""
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind and item.get("status") == "True":
            return item
    return None


def finished(job: Mapping) -> bool:
    """Whether the Job has ended: Complete or Failed."""
    return condition(job, "Complete") is not None or condition(job, "Failed") is not None


def master_addr(name: str, namespace: str) -> str:
    """Rank 0's stable DNS name: pod ``<job>-0`` under the Job's headless Service."""
    return f"{name}-0.{name}.{namespace}.svc"


def build_job(
    spec: TrainingSpec,
    *,
    name: str,
    dag_id: str,
    run_id: str,
    attempt: int,
    resume_from: str | None,
    excluded_nodes: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    nodes: int | None = None,
) -> dict:
    """The Job of one attempt.  ``excluded_nodes``: node name -> why it is kept out of this run (its
    node affinity, and the annotation ``trainops.io/kept-out``); ``annotations``: more for the Job
    (the ledger's, ``trainops.training.ledger``); ``nodes``: the gang's size (None: ``spec.nodes``;
    fewer after an elastic resume: the Job's completions and parallelism, Kueue's PodSet count and the
    world size every pod is told)."""
    excluded = dict(excluded_nodes or {})
    size = spec.nodes if nodes is None else nodes
    labels = {RUN_LABEL: run_key(dag_id, run_id), ATTEMPT_LABEL: str(attempt)}
    kept_out = json.dumps(
        {n: str(why)[:MAX_REASON] for n, why in sorted(excluded.items())}, separators=(",", ":")
    )
    if len(kept_out) > MAX_KEPT_OUT:  # thousands of nodes: their names are the record, not the reasons
        kept_out = json.dumps(dict.fromkeys(sorted(excluded), ""), separators=(",", ":"))
    annotations = {
        **(annotations or {}),
        DAG_RUN_ANNOTATION: f"{dag_id}/{run_id}",
        KEPT_OUT_ANNOTATION: kept_out,
    }
    if resume_from:
        annotations[RESUME_ANNOTATION] = resume_from
    template = merge_under(
        _owned_template(spec, name, labels, attempt, resume_from, excluded, size), _extras(spec), "parameters"
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": {**labels, KUEUE_QUEUE_LABEL: spec.queue, KUEUE_PRIORITY_LABEL: spec.priority_class},
            "annotations": annotations,
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": size,
            "parallelism": size,
            "backoffLimit": 0,
            "suspend": True,
            "template": merge_under(template, spec.pod_template, "pod_template"),
        },
    }


def build_service(spec: TrainingSpec, job: Mapping) -> dict:
    """The headless Service that gives the Job's pods their DNS names; owned by the Job (``job`` as
    created, with its uid), so it is deleted with it."""
    meta = job["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {
                k: v for k, v in (meta.get("labels") or {}).items() if k in (RUN_LABEL, ATTEMPT_LABEL)
            },
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_NAME_LABEL: meta["name"]},
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": spec.master_port,
                    "targetPort": spec.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def _owned_template(spec, name, labels, attempt, resume_from, excluded, size: int) -> dict:
    """The pod template fields trainops decides."""
    requests = {GPU_RESOURCE: str(spec.gpus_per_node)}
    if spec.cpu:
        requests["cpu"] = spec.cpu
    if spec.memory:
        requests["memory"] = spec.memory
    container = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": list(spec.command),
        "env": _env(spec, name, attempt, resume_from, size),
        "resources": {"requests": requests, "limits": {GPU_RESOURCE: str(spec.gpus_per_node)}},
    }
    if spec.args:
        container["args"] = list(spec.args)
    pod = {
        "containers": [container],
        "restartPolicy": "Never",
        "subdomain": name,
        "terminationGracePeriodSeconds": spec.termination_grace_seconds,
        "nodeSelector": {GPU_POOL_LABEL: "true"},
        "tolerations": [
            {"key": MODE_TAINT, "operator": "Equal", "value": MODE_TRAINING, "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": _node_affinity(spec.node_names, excluded),
            # one pod per node, for the kube-scheduler; Kueue's TAS never reads pod anti-affinity, so under
            # a TAS flavor the training task refuses a run two of whose pods one node could hold
            # (GangCluster.check_admissible).  The node affinity keeps the kept-out nodes out: TAS honours it
            # from Kueue 0.13.10, 0.14.5 and 0.15.0 (kueue#7728; trainops doctor refuses older ones), the
            # quarantine taint in every release.
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": dict(labels)}, "topologyKey": HOSTNAME_LABEL}
                ]
            },
        },
    }
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    if spec.shm_size is not None:  # the container default is 64 MiB: too small for NCCL and dataloaders
        pod["volumes"] = [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(spec.shm_size)}}
        ]
        container["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    meta = {"labels": dict(labels)}
    if spec.topology:  # Kueue's PodSet annotation: where in the fabric the gang goes
        meta["annotations"] = TopologyRequest.from_value(spec.topology).annotation()
    return {"metadata": meta, "spec": pod}


def _env(spec: TrainingSpec, name: str, attempt: int, resume_from: str | None, size: int) -> list[dict]:
    """trainops' variables and torchrun's (``PET_*`` are read by torchrun, the rest by
    ``init_process_group``) for a gang of ``size`` nodes; the Job controller adds ``JOB_COMPLETION_INDEX``."""
    index = {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}}
    address = master_addr(name, spec.namespace)
    values = {
        "TRAINOPS_RUN_URI": spec.run_path,
        "TRAINOPS_RESUME_FROM": resume_from or "",
        "TRAINOPS_ATTEMPT": str(attempt),
        "TRAINOPS_WORLD_SIZE": str(size),  # this attempt's nodes
        # the run's own size, on every attempt: an elastic resume's trainer keeps its global batch with them
        "TRAINOPS_ORIGINAL_NODES": str(spec.nodes),
        "TRAINOPS_ORIGINAL_WORLD_SIZE": str(spec.nodes * spec.procs_per_node),
        "MASTER_ADDR": address,
        "MASTER_PORT": str(spec.master_port),
        "WORLD_SIZE": str(size * spec.procs_per_node),
        "PET_MASTER_ADDR": address,
        "PET_MASTER_PORT": str(spec.master_port),
        "PET_NNODES": str(size),
        "PET_NPROC_PER_NODE": str(spec.procs_per_node),
    }
    env = [{"name": k, "value": v} for k, v in values.items()]
    ranks = ["NODE_RANK", "PET_NODE_RANK"] + (["RANK"] if spec.procs_per_node == 1 else [])
    return env + [{"name": k, **index} for k in ranks]


def _extras(spec: TrainingSpec) -> dict:
    """The typed extras (env, devices, capabilities, node labels, volumes) as a template layer."""
    container: dict = {"name": CONTAINER_NAME}
    if spec.env:
        container["env"] = [{"name": k, "value": str(v)} for k, v in sorted(spec.env.items())]
    if spec.extra_resources:
        extra = {k: str(v) for k, v in spec.extra_resources.items()}
        container["resources"] = {"requests": extra, "limits": dict(extra)}  # devices: requests == limits
    capabilities = list(spec.capabilities)
    if (
        any(name.startswith(RDMA_PREFIX) for name in spec.extra_resources)
        and RDMA_CAPABILITY not in capabilities
    ):
        capabilities.append(RDMA_CAPABILITY)
    if capabilities:  # none unless asked for or RDMA: a plain run meets Pod Security "baseline"
        container["securityContext"] = {"capabilities": {"add": capabilities}}
    if spec.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in spec.volume_mounts]
    pod: dict = {"containers": [container]}
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.volumes:
        pod["volumes"] = [dict(v) for v in spec.volumes]
    return {"spec": pod}


def _node_affinity(node_names, excluded: Mapping[str, str]) -> dict:
    expressions = [{"key": HEALTH_LABEL, "operator": "NotIn", "values": [HEALTH_QUARANTINED]}]
    if excluded:
        expressions.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(excluded)})
    if node_names:
        expressions.append({"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(node_names)})
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]
        }
    }
