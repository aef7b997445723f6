"""Kueue's API vocabulary for the simulated Kueue: resource keys, labels, Workload names, conditions,
and what differs between the releases it plays (``Release``).

Everything here follows ``reference/kueue.md`` §1 so that code written against a real Kueue reads the
devcluster's objects unchanged.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from trainops_devcluster.conditions import condition_true as is_true
from trainops_devcluster.conditions import find_condition as condition
from trainops_devcluster.conditions import set_condition
from trainops_devcluster.events import EventRecorder
from trainops_devcluster.store import NotFound, Store

__all__ = ["condition", "is_true"]  # re-exported for the kueue modules

GROUP = "kueue.x-k8s.io"
JOBS = "jobs.batch"
WORKLOADS = f"workloads.{GROUP}"
CLUSTER_QUEUES = f"clusterqueues.{GROUP}"
LOCAL_QUEUES = f"localqueues.{GROUP}"
FLAVORS = f"resourceflavors.{GROUP}"
PRIORITY_CLASSES = f"workloadpriorityclasses.{GROUP}"

QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
JOB_UID_LABEL = f"{GROUP}/job-uid"
PODSET_LABEL = f"{GROUP}/podset"
WORKLOAD_ANNOTATION = f"{GROUP}/workload"
MAIN_PODSET = "main"

# condition types
QUOTA_RESERVED, ADMITTED, PODS_READY = "QuotaReserved", "Admitted", "PodsReady"
EVICTED, PREEMPTED, REQUEUED, FINISHED = "Evicted", "Preempted", "Requeued", "Finished"
DEACTIVATION_TARGET = "DeactivationTarget"
# reasons used in more than one place
DEACTIVATED, PODS_READY_TIMEOUT, WAIT_FOR_START = "Deactivated", "PodsReadyTimeout", "WaitForStart"
NOT_READY_MESSAGE = "Not all pods are ready or succeeded"


# QuotaReserved=False reasons of Kueue 0.13 (apis/kueue/v1beta1/workload_types.go, pkg/scheduler):
# ``Inadmissible`` when the queues themselves are missing or stopped, ``Pending`` for everything else.
INADMISSIBLE, PENDING = "Inadmissible", "Pending"


@dataclass(frozen=True)
class Release:
    """The Kueue release the devcluster plays, by the API version it serves: ``v1beta1`` is the 0.13
    line (serves nothing else), ``v1beta2`` is 0.15 and later as of HEAD (granular pending reasons)."""

    version: str = "v1beta2"

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    def priority_class(self, name: str) -> dict:
        """The Workload spec fields that name its WorkloadPriorityClass."""
        if self.version == "v1beta1":
            return {"priorityClassName": name, "priorityClassSource": f"{GROUP}/workloadpriorityclass"}
        return {"priorityClassRef": {"group": GROUP, "kind": "WorkloadPriorityClass", "name": name}}

    def pending_reason(self, reason: str) -> str:
        """The QuotaReserved=False reason this release writes for a granular ``reason``."""
        if self.version == "v1beta1":
            return INADMISSIBLE if reason == INADMISSIBLE else PENDING
        return reason

    def pod_marks(self, workload: dict, assignment: dict) -> tuple[dict, dict]:
        """The labels and annotations Kueue puts on an admitted PodSet's pod template: the podset label;
        from 0.17 the queue-name labels (``AssignQueueLabelsForPods``) and the workload annotation
        (0.13 writes that one only with TAS on, off by default there)."""
        labels = {PODSET_LABEL: assignment["name"]}
        if self.version == "v1beta1":
            return labels, {}
        queues = {
            f"{GROUP}/local-queue-name": workload["spec"].get("queueName", ""),
            f"{GROUP}/cluster-queue-name": workload["status"]["admission"]["clusterQueue"],
        }
        return labels | queues, {WORKLOAD_ANNOTATION: workload["metadata"]["name"]}

    @property
    def local_queue_usage(self) -> str:
        """The LocalQueue status field of admitted usage (v1beta2 renamed ``flavorUsage``)."""
        return "flavorUsage" if self.version == "v1beta1" else "flavorsUsage"


def workload_name(kind: str, group: str, owner_name: str, owner_uid: str) -> str:
    """Kueue's ``<lowercase kind>-<owner name, truncated>-<5 hex of sha1(kind, group, name, uid)>``."""
    digest = hashlib.sha1("\n".join((kind, group, owner_name, owner_uid)).encode()).hexdigest()
    return f"{f'{kind.lower()}-{owner_name}'[: 253 - 6]}-{digest[:5]}"


def iso(seconds: float | None = None) -> str:
    """A metav1.Time: RFC 3339 in UTC with whole seconds."""
    return datetime.fromtimestamp(time.time() if seconds is None else seconds, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_iso(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def remove_condition(obj: dict, kind: str) -> None:
    conditions = obj.get("status", {}).get("conditions", [])
    conditions[:] = [cond for cond in conditions if cond["type"] != kind]


def has_quota(workload: dict) -> bool:
    return is_true(workload, QUOTA_RESERVED)


def is_active(workload: dict) -> bool:
    return workload.get("spec", {}).get("active", True) is not False


def is_finished(workload: dict) -> bool:
    return is_true(workload, FINISHED)


def holds_quota(workload: dict) -> bool:
    """Counted in its ClusterQueue's usage: quota reserved and not finished."""
    return has_quota(workload) and not is_finished(workload) and "admission" in workload.get("status", {})


def priority(workload: dict) -> int:
    return int(workload.get("spec", {}).get("priority") or 0)


class Writer:
    """Kueue's writes through the store: read-modify-write, conditions with precise transition times
    (conditions carry whole seconds, deadlines need better), and Events."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._since: dict[tuple[str, str], float] = {}
        self._recorders: dict[str, EventRecorder] = {}

    def write(self, resource: str, obj: dict, change: Callable[[dict], object]) -> dict | None:
        """Apply ``change`` to the stored object; ``None`` when it is gone."""
        meta = obj["metadata"]
        try:
            return self.store.mutate(resource, meta.get("namespace", ""), meta["name"], change)
        except NotFound:
            return None

    def set(self, obj: dict, kind: str, status: bool, reason: str, message: str) -> None:
        """Set a condition the way Kueue does (with observedGeneration)."""
        before = condition(obj, kind)
        wanted = "True" if status else "False"
        generation = obj["metadata"].get("generation", 1)
        set_condition(obj, kind, wanted, reason, message, observedGeneration=generation)
        if before is None or before["status"] != wanted:
            self._since[(obj["metadata"]["uid"], kind)] = time.time()

    def since(self, obj: dict, kind: str) -> float:
        """When the condition last changed status (precise if this process set it)."""
        precise = self._since.get((obj["metadata"]["uid"], kind))
        if precise is not None:
            return precise
        cond = condition(obj, kind)
        return parse_iso(cond["lastTransitionTime"]) if cond else time.time()

    def forget(self, alive_uids: set[str]) -> None:
        self._since = {key: value for key, value in self._since.items() if key[0] in alive_uids}

    def event(self, obj: dict, kind: str, reason: str, message: str, component: str) -> None:
        """Record a core/v1 Event about ``obj`` (what ``kubectl describe`` lists)."""
        if component not in self._recorders:
            self._recorders[component] = EventRecorder(self.store, component)
        self._recorders[component].record(obj, reason, message, kind)
