"""Can Kueue admit the run at all?  Checked before anything is claimed, with reads only.
(The training run checks its Job's own requests before its first Job: both read the queues through
``trainops.kube.queues``.)

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

from trainops.kube.client import Kube
from trainops.kube.queues import QUEUES_MANIFEST, QueueMismatch, coverage_fix, read_queues, uncovered
from trainops.kube.retry import Deadline

__all__ = ["QUEUES_MANIFEST", "QueueMismatch", "check_queue"]


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
    queue, target, found = read_queues(kube, namespace, local_queue, deadline)
    if queue is None:
        raise QueueMismatch(
            f"LocalQueue {namespace}/{local_queue} does not exist: create it (see {QUEUES_MANIFEST}) or name "
            "the LocalQueue the run is submitted to"
        )
    if cluster_queue is not None and target != cluster_queue:
        raise QueueMismatch(
            f"LocalQueue {namespace}/{local_queue} sends runs to ClusterQueue {target!r}, but the claim raises "
            f"the quota of ClusterQueue {cluster_queue!r}, so the run would never be admitted: point the "
            f"LocalQueue's spec.clusterQueue at {cluster_queue!r}, or claim for {target!r}"
        )
    if found is None:
        raise QueueMismatch(
            f"ClusterQueue {target!r} of LocalQueue {namespace}/{local_queue} does not exist: create it "
            f"(see {QUEUES_MANIFEST})"
        )
    missing = uncovered(found, resources)
    if missing:
        raise QueueMismatch(
            f"ClusterQueue {target} does not cover {', '.join(missing)}, which each pod of the run requests: "
            f'Kueue would leave the run pending ("resource {missing[0]} unavailable in ClusterQueue"). '
            f"{coverage_fix(target, missing)}, or exclude it from Kueue's quota in Kueue's configuration "
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
