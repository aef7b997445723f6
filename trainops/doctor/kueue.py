"""Kueue: a version trainops speaks is served with the resources it uses (its CRDs), and the queues
the lifecycle submits to exist, lead to each other, are active and cover the GPUs it asks for.

A real Kueue 0.13 serves only ``v1beta1``; 0.15 and later also ``v1beta2`` (trainops.kube.kueue).
A Workload that names a WorkloadPriorityClass that does not exist is never created, and Kueue says
so only in its own log; an inactive ClusterQueue admits nothing.  The queues and the priority class
are judged by the claim's own check (``trainops.capacity.coverage``).

A flavor with a ``topologyName`` (Topology Aware Scheduling) places pods only on nodes that carry
every level's label: Kueue leaves any other node out, so a cluster whose GPU nodes lack the
shipped Topology's labels (Kueue's documentation placeholders) admits no run at all.

Under TAS Kueue, not the kube-scheduler, picks each pod's node, and before 0.13.10 and 0.14.5 it
ignores the pods' required node affinity, which keeps a resume off the nodes trainops blames
(``trainops.kube.kueue_release``): ``check_api`` reads the controller's version and refuses those
releases when the training ClusterQueue has a TAS flavor.
"""

from __future__ import annotations

from trainops.capacity.coverage import QueueMismatch, check_queue
from trainops.conventions import GPU_RESOURCE
from trainops.doctor.node_probe import gpu_nodes
from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome, Problem
from trainops.kube.client import Kind
from trainops.kube.kueue import GROUP, KueueNotServed
from trainops.kube.kueue_release import (
    UPGRADE,
    controller_version,
    ignores_affinity,
    release_of,
    tas_honours_node_affinity,
)
from trainops.kube.queues import covered_resources, tas_flavors

#: the Kueue resources trainops reads or writes (and the priority classes its Workloads name)
RESOURCES = ("clusterqueues", "localqueues", "workloads", "resourceflavors", "workloadpriorityclasses")
INSTALL = (
    "install Kueue 0.13 or newer (its CRDs and controller), then kubectl apply -f deploy/kueue-queues.yaml"
)
QUEUES = "kubectl apply -f deploy/kueue-queues.yaml, or name the queues the lifecycle uses (--cluster-queue, --local-queue)"


def check_release(reads: Reads, config) -> tuple[str, list[Problem]]:
    """The controller's version for the summary, and a Problem when it is a release whose TAS ignores
    required node affinity while a flavor of the training ClusterQueue has a topologyName (without TAS
    the kube-scheduler places the pods, and it honours the affinity)."""
    version, where = controller_version(reads.kube, reads.deadline)
    release = release_of(version)
    if release is None:
        return f"controller version unknown ({where}; TAS needs 0.13.10, 0.14.5 or 0.15.0 and later)", []
    said = f"controller {version}"
    if release < (0, 13, 0):
        return said, [
            Problem(f"Kueue {version} ({where}) is older than 0.13, the oldest trainops speaks", UPGRADE)
        ]
    if tas_honours_node_affinity(release):
        return said, []
    flavors = list(tas_flavors(reads.kube, cluster_queue(reads, config) or {}, reads.deadline))
    why = ignores_affinity(version, where, flavors)
    if why is None:
        return f"{said} (no TAS flavor: the kube-scheduler places the pods)", []
    return said, [Problem(why, UPGRADE)]


def check_api(reads: Reads, config) -> Outcome:
    try:
        version = reads.kube.kueue("clusterqueues").version
    except KueueNotServed as error:
        return Outcome("Kueue is not served in a version trainops speaks", [Problem(str(error), INSTALL)])
    group = reads.get_path(f"/apis/{GROUP}", "Kueue's API group") or {}
    versions = [v.get("version") for v in group.get("versions") or []]
    served = reads.served_resources(GROUP, version) or set()
    problems = [
        Problem(f"{GROUP}/{version} does not serve {plural}: its CRD is not installed", INSTALL)
        for plural in RESOURCES
        if plural not in served
    ]
    crds = "some of its CRDs missing" if problems else "its CRDs are installed"
    release, too_old = check_release(reads, config) if not problems else ("", [])
    release = f"; {release}" if release else ""
    return Outcome(
        f"Kueue serves {', '.join(versions)}; trainops speaks {version}; {crds}{release}", problems + too_old
    )


def cluster_queue(reads: Reads, config) -> dict | None:
    kind = reads.kube.kueue("clusterqueues", namespaced=False)
    return reads.shared("clusterqueue", lambda: reads.get(kind, config.cluster_queue))


def _inactive(obj: dict | None, what: str) -> Problem | None:
    conditions = {c.get("type"): c for c in ((obj or {}).get("status") or {}).get("conditions") or []}
    active = conditions.get("Active")
    if obj is None or (active and active.get("status") == "True"):
        return None
    if active is None:
        return Problem(
            f"{what} has no Active condition: Kueue's controller has not reconciled it",
            "is Kueue's controller running? kubectl get pods -n kueue-system",
        )
    return Problem(
        f"{what} is inactive: {active.get('reason')}: {active.get('message')}",
        "fix what Kueue names (a missing ResourceFlavor or ClusterQueue): it admits nothing until then",
    )


def check_queues(reads: Reads, config) -> Outcome:
    try:
        kind = reads.kube.kueue("localqueues")
    except KueueNotServed as error:
        return Outcome("Kueue is not served", [Problem(str(error), INSTALL)])
    namespace, local = config.training_namespace, config.local_queue
    problems = []
    try:
        check_queue(
            reads.kube,
            namespace,
            local,
            [GPU_RESOURCE],
            reads.deadline,
            cluster_queue=config.cluster_queue,
            priority_class=config.priority_class,
        )
    except QueueMismatch as mismatch:
        problems.append(Problem(str(mismatch), QUEUES))
    queue = cluster_queue(reads, config)
    for obj, what in (
        (queue, f"ClusterQueue {config.cluster_queue}"),
        (reads.get(kind, local, namespace), f"LocalQueue {namespace}/{local}"),
    ):
        problems += [p for p in [_inactive(obj, what)] if p]
    problems += _unplaceable_nodes(reads, config, queue or {})
    priority = config.priority_class
    resources = ", ".join(sorted(covered_resources(queue or {}))) or "nothing"
    return Outcome(
        f"LocalQueue {namespace}/{local} -> ClusterQueue {config.cluster_queue} (covers {resources}), "
        f"WorkloadPriorityClass {priority}",
        problems,
    )


def _topology(reads: Reads, name: str) -> dict | None:
    """The Topology ``name``: at Kueue's served version, or at v1alpha1 (Kueue 0.13 serves it there)."""
    for version in dict.fromkeys((reads.kube.kueue("topologies", namespaced=False).version, "v1alpha1")):
        if "topologies" in (reads.served_resources(GROUP, version) or set()):
            return reads.get(Kind(GROUP, version, "topologies", namespaced=False), name)
    return None


def _unplaceable_nodes(reads: Reads, config, queue: dict) -> list[Problem]:
    """For each TAS flavor the run's GPUs go through (``tas_flavors``): the GPU nodes (the gate's
    candidates) it selects that lack a level label of its Topology.  Other nodes (CPU, system) need no
    fabric labels."""
    problems = []
    for name, spec in tas_flavors(reads.kube, queue, reads.deadline).items():
        topology = _topology(reads, spec["topologyName"])
        if topology is None:
            problems.append(
                Problem(
                    f"ResourceFlavor {name} names Topology {spec['topologyName']}, which does not exist: "
                    "Kueue admits nothing to it",
                    "kubectl apply -f deploy/kueue-queues.yaml (its Topology), or remove the flavor's topologyName",
                )
            )
            continue
        levels = [lv.get("nodeLabel") for lv in (topology.get("spec") or {}).get("levels") or []]
        wanted = (spec.get("nodeLabels") or {}).items()
        nodes = [n for n in gpu_nodes(reads, config) if wanted <= (n["metadata"].get("labels") or {}).items()]
        for level in levels:
            lacking = sorted(
                n["metadata"]["name"] for n in nodes if level not in ((n["metadata"].get("labels")) or {})
            )
            if lacking:
                problems.append(
                    Problem(
                        f"{len(lacking)} of {len(nodes)} node(s) of ResourceFlavor {name} lack the label {level} "
                        f"of Topology {spec['topologyName']} (e.g. {', '.join(lacking[:3])}): Kueue's Topology "
                        "Aware Scheduling places no pod there",
                        "label the GPU nodes with your provider's fabric labels and name them in the Topology's "
                        "levels and the DAG's topology_levels (deploy/kueue-queues.yaml), or remove the "
                        "flavor's topologyName to schedule without TAS",
                    )
                )
    return problems
