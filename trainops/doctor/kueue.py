"""Kueue: a version trainops speaks is served with the resources it uses (its CRDs), and the queues
the lifecycle submits to exist, are active and cover the GPUs it asks for.

A real Kueue 0.13 serves only ``v1beta1``; 0.15 and later also ``v1beta2`` (trainops.kube.kueue).
A Workload that names a WorkloadPriorityClass that does not exist is never created, and Kueue says
so only in its own log; an inactive ClusterQueue admits nothing.
"""

from __future__ import annotations

from trainops.conventions import GPU_RESOURCE
from trainops.doctor.reads import Reads, path
from trainops.doctor.result import Outcome, Problem
from trainops.kube.kueue import GROUP, KueueNotServed, pick_version

#: the Kueue resources trainops reads or writes (and the priority classes its Workloads name)
RESOURCES = ("clusterqueues", "localqueues", "workloads", "resourceflavors", "workloadpriorityclasses")
INSTALL = (
    "install Kueue 0.13 or newer (its CRDs and controller), then kubectl apply -f deploy/kueue-queues.yaml"
)
QUEUES = "kubectl apply -f deploy/kueue-queues.yaml (or pass the queues the lifecycle uses: --cluster-queue, --local-queue)"


def served_version(reads: Reads) -> str:
    """The version trainops speaks with this cluster's Kueue (KueueNotServed names the fix)."""
    return reads.shared(
        "kueue version", lambda: pick_version(reads.get(f"/apis/{GROUP}", "Kueue's API group"))
    )


def check_api(reads: Reads, config) -> Outcome:
    try:
        version = served_version(reads)
    except KueueNotServed as error:
        return Outcome("Kueue is not served in a version trainops speaks", [Problem(str(error), INSTALL)])
    group = reads.get(f"/apis/{GROUP}", "Kueue's API group") or {}
    versions = [v.get("version") for v in group.get("versions") or []]
    served = reads.served_resources(GROUP, version) or set()
    problems = [
        Problem(f"{GROUP}/{version} does not serve {plural}: its CRD is not installed", INSTALL)
        for plural in RESOURCES
        if plural not in served
    ]
    return Outcome(
        f"Kueue serves {', '.join(versions)}; trainops speaks {version}; CRDs of {', '.join(RESOURCES)}",
        problems,
    )


def _active(obj: dict, what: str) -> Problem | None:
    conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
    active = conditions.get("Active")
    if active is None:
        return Problem(
            f"{what} has no Active condition: Kueue's controller has not reconciled it",
            "is Kueue's controller running? kubectl get pods -n kueue-system",
        )
    if active.get("status") != "True":
        return Problem(
            f"{what} is inactive: {active.get('reason')}: {active.get('message')}",
            "fix what Kueue names (a missing ResourceFlavor or ClusterQueue); Kueue admits nothing to it until then",
        )
    return None


def covered(cluster_queue: dict) -> set[str]:
    """Every resource the ClusterQueue's resource groups cover."""
    return {
        name
        for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []
        for name in group.get("coveredResources") or []
    }


def check_queues(reads: Reads, config) -> Outcome:
    try:
        version = served_version(reads)
    except KueueNotServed as error:
        return Outcome("Kueue is not served", [Problem(str(error), INSTALL)])
    problems = []
    cq_name, lq_name, namespace = config.cluster_queue, config.local_queue, config.training_namespace
    cluster_queue = reads.get(path(GROUP, version, "clusterqueues", name=cq_name), f"ClusterQueue {cq_name}")
    if cluster_queue is None:
        problems.append(
            Problem(f"ClusterQueue {cq_name} does not exist: the claim has no quota to raise", QUEUES)
        )
    else:
        problems += [p for p in [_active(cluster_queue, f"ClusterQueue {cq_name}")] if p]
        if GPU_RESOURCE not in covered(cluster_queue):
            problems.append(
                Problem(
                    f"ClusterQueue {cq_name} does not cover {GPU_RESOURCE} (covers {sorted(covered(cluster_queue))}): "
                    "Kueue refuses a Workload that asks for a resource its queue does not cover",
                    f"add {GPU_RESOURCE} to a resource group's coveredResources, with a flavor quota (deploy/kueue-queues.yaml)",
                )
            )
    local_queue = reads.get(
        path(GROUP, version, "localqueues", namespace, lq_name), f"LocalQueue {namespace}/{lq_name}"
    )
    if local_queue is None:
        problems.append(
            Problem(f"LocalQueue {namespace}/{lq_name} does not exist: runs cannot be submitted", QUEUES)
        )
    else:
        target = (local_queue.get("spec") or {}).get("clusterQueue")
        if target != cq_name:
            problems.append(
                Problem(
                    f"LocalQueue {namespace}/{lq_name} feeds ClusterQueue {target}, not {cq_name}: the claim raises "
                    "the quota of a queue the run is not in",
                    f"set the LocalQueue's spec.clusterQueue to {cq_name}, or pass --cluster-queue {target}",
                )
            )
        else:
            problems += [p for p in [_active(local_queue, f"LocalQueue {namespace}/{lq_name}")] if p]
    priority = config.priority_class
    if (
        reads.get(
            path(GROUP, version, "workloadpriorityclasses", name=priority),
            f"WorkloadPriorityClass {priority}",
        )
        is None
    ):
        problems.append(
            Problem(
                f"WorkloadPriorityClass {priority} does not exist: Kueue makes no Workload for a run that "
                "names it, and says so only in its own log",
                f"{QUEUES}; or pass the class your runs use: --priority-class",
            )
        )
    resources = sorted(covered(cluster_queue or {}))
    return Outcome(
        f"ClusterQueue {cq_name} (covers {', '.join(resources) or 'nothing'}), LocalQueue {namespace}/{lq_name}, "
        f"WorkloadPriorityClass {priority}",
        problems,
    )
