"""The namespaces trainops uses exist, and their Pod Security levels let its pods be created.

Pod Security Admission enforces the level in a namespace's ``pod-security.kubernetes.io/enforce``
label (``privileged`` when unlabelled, unless the API server's admission configuration says
otherwise).  The training pods trainops builds need ``baseline``; a run that asks for RDMA devices
adds the capability IPC_LOCK, which only ``privileged`` allows: where GPU nodes offer an ``rdma/``
resource (an RDMA device plugin runs), runs will ask for it.  The node probe mounts the host's
``/sys`` (hostPath): its namespace must be ``privileged``.  ``trainops-system`` holds only reports.
"""

from __future__ import annotations

from trainops.conventions import HEALTH_NAMESPACE
from trainops.doctor.node_probe import gpu_nodes
from trainops.doctor.reads import NAMESPACES, Reads
from trainops.doctor.result import Outcome, Problem

ENFORCE = "pod-security.kubernetes.io/enforce"
LEVELS = ("restricted", "baseline", "privileged")  # each allows more than the one before
RDMA_PREFIX = "rdma/"
APPLY = "kubectl apply -f deploy/namespaces.yaml"


def enforced(namespace: dict) -> str:
    """The level Pod Security Admission enforces in ``namespace`` (unlabelled: privileged)."""
    level = ((namespace.get("metadata") or {}).get("labels") or {}).get(ENFORCE) or "privileged"
    return (
        level if level in LEVELS else "restricted"
    )  # an unknown level: the API server's own default, at worst


def _rdma_offered(reads: Reads, config) -> list[str]:
    """The RDMA resources GPU nodes offer (an RDMA device plugin runs: runs will ask for them)."""
    return sorted(
        {
            resource
            for node in gpu_nodes(reads, config)
            for resource in ((node.get("status") or {}).get("allocatable") or {})
            if resource.startswith(RDMA_PREFIX)
        }
    )


def _needs(reads: Reads, name: str, need: str, why: str) -> tuple[str, Problem | None]:
    namespace = reads.get(NAMESPACES, name)
    if namespace is None:
        return "missing", Problem(f"namespace {name} does not exist", APPLY)
    level = enforced(namespace)
    if LEVELS.index(level) >= LEVELS.index(need):
        return level, None
    return level, Problem(
        f"namespace {name} enforces Pod Security {level}; {why} need {need}: the API refuses those pods",
        f"kubectl label namespace {name} {ENFORCE}={need} --overwrite (deploy/namespaces.yaml says why)",
    )


def check(reads: Reads, config) -> Outcome:
    rdma = _rdma_offered(reads, config)
    training_needs = "privileged" if rdma else "baseline"
    why = (
        f"GPU nodes offer {', '.join(rdma)}: runs that ask for it add IPC_LOCK and"
        if rdma
        else "the training pods"
    )
    probe_namespace = config.probe[0]
    checked = [
        (config.training_namespace, *_needs(reads, config.training_namespace, training_needs, why)),
        (HEALTH_NAMESPACE, *_needs(reads, HEALTH_NAMESPACE, "restricted", "the probes' reports")),
        (
            probe_namespace,
            *_needs(reads, probe_namespace, "privileged", "the node probe (hostPath /sys) and its pods"),
        ),
    ]
    return Outcome(
        ", ".join(f"{name}: {level}" for name, level, _ in checked) + f" (training needs {training_needs})",
        [problem for _, _, problem in checked if problem],
    )
