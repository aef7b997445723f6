"""Can Kueue admit the run at all?  Checked before anything is claimed, with reads only.

Kueue leaves a Workload pending for good when a resource its pods request is in none of its
ClusterQueue's ``coveredResources`` (0.13: ``Pending``, "resource rdma/ib unavailable in
ClusterQueue"): the run would wait for its admission timeout with its nodes claimed.  ``check_queue``
reads the run's LocalQueue and the ClusterQueue behind it, and raises ``QueueMismatch`` naming the
fix when either is missing, when the LocalQueue sends runs to another ClusterQueue than the one whose
quota the claim raises, or when a resource the run's pods request is not covered.  It also reads the
run's WorkloadPriorityClass: for a job that names a missing one, Kueue makes no Workload at all (0.13
to 0.19 say so only in their own log).
"""

from __future__ import annotations

from collections.abc import Iterable

from trainops.errors import PermanentError
from trainops.kube.client import Kube
from trainops.kube.retry import Deadline

QUEUES_MANIFEST = "deploy/kueue-queues.yaml"


class QueueMismatch(PermanentError, ValueError):
    """The run's Kueue queues cannot admit it; the message says what to change."""


def check_queue(
    kube: Kube,
    namespace: str,
    local_queue: str,
    resources: Iterable[str],
    deadline: Deadline,
    *,
    cluster_queue: str | None = None,
    priority_class: str | None = None,
) -> str:
    """The ClusterQueue behind LocalQueue ``namespace/local_queue``, once it is ``cluster_queue`` (when
    given) and covers every one of ``resources`` (the names one pod of the run requests, e.g.
    ``nvidia.com/gpu``, ``rdma/ib``), and WorkloadPriorityClass ``priority_class`` (when given)
    exists; else ``QueueMismatch``."""
    queue = kube.get(kube.kueue("localqueues"), local_queue, namespace, deadline=deadline)
    if queue is None:
        raise QueueMismatch(
            f"LocalQueue {namespace}/{local_queue} does not exist: create it (see {QUEUES_MANIFEST}) or name "
            "the LocalQueue the run is submitted to"
        )
    target = str((queue.get("spec") or {}).get("clusterQueue") or "")
    if cluster_queue is not None and target != cluster_queue:
        raise QueueMismatch(
            f"LocalQueue {namespace}/{local_queue} sends runs to ClusterQueue {target!r}, but the claim raises "
            f"the quota of ClusterQueue {cluster_queue!r}, so the run would never be admitted: point the "
            f"LocalQueue's spec.clusterQueue at {cluster_queue!r}, or claim for {target!r}"
        )
    found = kube.get(kube.kueue("clusterqueues", namespaced=False), target, deadline=deadline)
    if found is None:
        raise QueueMismatch(
            f"ClusterQueue {target!r} of LocalQueue {namespace}/{local_queue} does not exist: create it "
            f"(see {QUEUES_MANIFEST})"
        )
    groups = (found.get("spec") or {}).get("resourceGroups") or []
    covered = {name for group in groups for name in group.get("coveredResources") or []}
    missing = sorted(set(resources) - covered)
    if missing:
        names = ", ".join(missing)
        raise QueueMismatch(
            f"ClusterQueue {target} does not cover {names}, which each pod of the run requests: Kueue would "
            f'leave the run pending ("resource {missing[0]} unavailable in ClusterQueue"). Add {names} to '
            f"coveredResources of ClusterQueue {target}, with a nominalQuota in each flavor of that resource "
            f"group (see {QUEUES_MANIFEST}), or exclude it from Kueue's quota in Kueue's configuration "
            "(resources.excludeResourcePrefixes) and from the resources checked here"
        )
    if (
        priority_class
        and kube.get(kube.kueue("workloadpriorityclasses", namespaced=False), priority_class) is None
    ):
        raise QueueMismatch(
            f"WorkloadPriorityClass {priority_class!r} does not exist: Kueue would make no Workload for the run, "
            f"which would wait for its admission timeout; create it (see {QUEUES_MANIFEST}) or name another "
            "priority class"
        )
    return target
