"""The namespaces trainops uses exist, and their Pod Security levels let its pods be created.

Pod Security Admission enforces the level in a namespace's ``pod-security.kubernetes.io/enforce``
label (``privileged`` when unlabelled, unless the API server's admission configuration says
otherwise).  The training pods trainops builds need ``baseline``; a run that asks for RDMA devices
adds the capability IPC_LOCK, which only ``privileged`` allows.  The node probe mounts the host's
``/sys`` (hostPath): its namespace must be ``privileged``.  ``trainops-system`` holds only reports.
"""

from __future__ import annotations

from trainops.conventions import HEALTH_NAMESPACE
from trainops.doctor.kueue import covered, served_version
from trainops.doctor.reads import Reads, path
from trainops.doctor.result import Outcome, Problem
from trainops.kube.kueue import GROUP, KueueNotServed

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


def _rdma_covered(reads: Reads, config) -> list[str]:
    """The RDMA resources the training ClusterQueue covers (runs may ask for them)."""
    try:
        version = served_version(reads)
    except KueueNotServed:
        return []
    queue = reads.get(path(GROUP, version, "clusterqueues", name=config.cluster_queue), "the ClusterQueue")
    return sorted(r for r in covered(queue or {}) if r.startswith(RDMA_PREFIX))


def _needs(reads: Reads, name: str, need: str, why: str) -> tuple[str, Problem | None]:
    namespace = reads.get(path("", "v1", "namespaces", name=name), f"namespace {name}")
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
    rdma = _rdma_covered(reads, config)
    training_needs = "privileged" if rdma else "baseline"
    why = (
        f"ClusterQueue {config.cluster_queue} covers {', '.join(rdma)}: runs that ask for it add IPC_LOCK and"
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
