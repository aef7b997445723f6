"""The simulated Kueue (as ``reference/kueue.md`` §1 documents it), serving ``v1beta2`` (Kueue 0.15 and
later) or ``v1beta1`` with the 0.13 line's reasons (``KueueConfig.version``; ``kueue_api.Release``).

``kueue_admission`` is the webhook (a queue-labelled Job is suspended at creation).  ``KueueController``
does what Kueue's Job reconciler, Workload controller and scheduler do, level-triggered over the store:

- a Workload per queue-labelled Job (``job-<name>-<hash>``, controller ownerReference, job-uid label,
  PodSet ``main``, priority from the ``kueue.x-k8s.io/priority-class`` WorkloadPriorityClass);
- all-or-nothing quota reservation and preemption (``kueue_scheduler``), then the Job unsuspended with
  the flavor's nodeLabels and tolerations injected (restored whenever the Job is stopped);
- with waitForPodsReady configured, PodsReady and its timeout with requeue backoff and deactivation
  after the limit (``DeactivationTarget``, then ``spec.active=false``, then ``Evicted``);
  ``spec.active=false``, Finished, and the Workload removed when its Job is gone.
"""

from __future__ import annotations

import copy
import math
import os
import re
import time
from dataclasses import dataclass, field

from trainops_devcluster import kueue_tas
from trainops_devcluster.controller import Controller
from trainops_devcluster.kinds import KUEUE_VERSIONS
from trainops_devcluster.kueue_admission import kueue_admission
from trainops_devcluster.kueue_api import (
    ADMITTED,
    CLUSTER_QUEUES,
    DEACTIVATED,
    DEACTIVATION_TARGET,
    EVICTED,
    FINISHED,
    FLAVORS,
    JOB_UID_LABEL,
    JOBS,
    LOCAL_QUEUES,
    MAIN_PODSET,
    NOT_READY_MESSAGE,
    PODS_READY,
    PODS_READY_TIMEOUT,
    PRIORITY_CLASSES,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    QUOTA_RESERVED,
    REQUEUED,
    WAIT_FOR_START,
    WORKLOAD_ANNOTATION,
    WORKLOADS,
    Release,
    Writer,
    condition,
    has_quota,
    is_active,
    is_finished,
    is_true,
    iso,
    parse_iso,
    remove_condition,
    workload_name,
)
from trainops_devcluster.kueue_scheduler import Scheduler
from trainops_devcluster.kueue_ungater import TopologyUngater
from trainops_devcluster.store import AlreadyExists, Event, NotFound, Store

__all__ = ["KueueConfig", "KueueController", "kueue_admission"]

JOB_COMPONENT = "batch/job-kueue-controller"
WORKLOAD_COMPONENT = "kueue-admission"
READY_MESSAGE = "All pods reached readiness and the workload is running"
VERSION_ENV = "TRAINOPS_DEVCLUSTER_KUEUE_VERSION"
TOPOLOGY_RETRY_S = 0.5


def controller_release(version: str | None) -> tuple[int, int, int] | None:
    """``v0.13.10`` -> ``(0, 13, 10)``; None for anything else."""
    found = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", str(version or ""))
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def tas_honours_node_affinity(release: tuple[int, int, int]) -> bool:
    """Kueue's TAS checks ``requiredDuringSchedulingIgnoredDuringExecution`` node affinity from 0.15.0
    (kueue PR #7899), 0.14.5 (#7937) and 0.13.10 (#7936) on."""
    return release >= (0, 15, 0) or (0, 14, 5) <= release < (0, 15, 0) or (0, 13, 10) <= release < (0, 14, 0)


@dataclass(frozen=True)
class KueueConfig:
    """The parts of Kueue's manager Configuration the devcluster honours; defaults are fast for tests.

    ``version``: the API version served, ``v1beta2`` (Kueue 0.15 and later) or ``v1beta1`` (the 0.13
    line, with its pending reasons); default ``$TRAINOPS_DEVCLUSTER_KUEUE_VERSION``, else ``v1beta2``.
    ``wait_for_pods_ready_timeout_s``: admitted -> PodsReady deadline (also the recovery timeout once
    running); ``None`` disables waitForPodsReady, and then, as in Kueue, no Workload has a PodsReady
    condition.  Unset, the release's default: on in v1beta2 (Kueue 0.19+ turns it on by default;
    10 s here, 30 min there), off in v1beta1 (0.13 needs ``enable: true``).  Requeue backoff after a
    timeout is ``base * 2**(n-1)`` seconds, capped at ``max``; ``backoff_limit_count`` requeues at
    most, then the Workload is deactivated (``None``: requeue forever, Kueue's default).
    ``topology_aware_scheduling``: the ``TopologyAwareScheduling`` feature gate (``kueue_tas``); unset,
    the release's default: on in v1beta2 (beta since 0.14), off in v1beta1 (alpha in 0.13).
    ``controller_version``: the Kueue release played, ``vX.Y.Z``; unset, ``v0.13.10`` for v1beta1 (the
    release measured, ``reference/realk8s.md``) and ``v0.19.2`` for v1beta2.  It decides what TAS honours
    (``tas_node_affinity``): before 0.13.10 and 0.14.5 TAS ignores the pods' required node affinity
    (kueue#7728, fixed in 0.15.0 by #7899, backported as #7936 and #7937); it honours their
    tolerations and nodeSelector in every release played, and ignores pod (anti-)affinity in all."""

    version: str = field(default_factory=lambda: os.environ.get(VERSION_ENV) or "v1beta2")
    wait_for_pods_ready_timeout_s: float | None = -1.0  # -1: the release's default
    requeue_backoff_base_s: float = 1.0
    requeue_backoff_max_s: float = 60.0
    backoff_limit_count: int | None = None
    topology_aware_scheduling: bool | None = None  # None: the release's default
    controller_version: str | None = None  # None: the API version's default release

    def __post_init__(self) -> None:
        if self.version not in KUEUE_VERSIONS:
            raise ValueError(
                f"the Kueue API version must be {' or '.join(KUEUE_VERSIONS)} (KueueConfig.version, ${VERSION_ENV}), "
                f"got {self.version!r}"
            )
        if self.controller_version is None:
            default = "v0.13.10" if self.version == "v1beta1" else "v0.19.2"
            object.__setattr__(self, "controller_version", default)
        release = controller_release(self.controller_version)
        if release is None or (release >= (0, 15, 0)) != (self.version == "v1beta2") or release < (0, 13, 0):
            raise ValueError(
                "controller_version must be a Kueue release vX.Y.Z that serves the API version: 0.13.0 to "
                f"0.14.x for v1beta1, 0.15.0 or later for v1beta2; got {self.controller_version!r} "
                f"with {self.version}"
            )
        if self.wait_for_pods_ready_timeout_s == -1.0:
            default = 10.0 if self.version == "v1beta2" else None
            object.__setattr__(self, "wait_for_pods_ready_timeout_s", default)
        if self.topology_aware_scheduling is None:
            object.__setattr__(self, "topology_aware_scheduling", self.version == "v1beta2")

    @property
    def release(self) -> Release:
        return Release(self.version)

    @property
    def tas_node_affinity(self) -> bool:
        """Whether TAS honours the pods' required node affinity: from 0.15.0, 0.14.5 and 0.13.10 on."""
        return tas_honours_node_affinity(controller_release(self.controller_version) or (0, 0, 0))

    def backoff_s(self, requeue_count: int) -> float:
        return min(self.requeue_backoff_base_s * 2 ** (requeue_count - 1), self.requeue_backoff_max_s)


class KueueController(Controller):
    """Kueue's controllers; ``sync()`` is one full level-triggered pass, run shortly after any change."""

    watches = (JOBS, WORKLOADS, CLUSTER_QUEUES, LOCAL_QUEUES, FLAVORS, PRIORITY_CLASSES)
    debounce_s = 0.01

    def __init__(self, store: Store, config: KueueConfig | None = None) -> None:
        self.config = config or KueueConfig()
        if self.config.topology_aware_scheduling:  # capacity for TAS: nodes and Topologies too
            self.watches = (*self.watches, "nodes", kueue_tas.TOPOLOGIES)
        super().__init__(store)
        self.release = self.config.release
        self.writer = Writer(store)
        self.scheduler = Scheduler(
            self.writer,
            self.release,
            bool(self.config.topology_aware_scheduling),
            node_affinity=self.config.tas_node_affinity,
        )
        self._sync_requested = False
        self._requeue_at: dict[str, float] = {}
        self._wakeups: set[float] = set()
        self._warned: set[tuple[str, str]] = set()
        self.ungater = TopologyUngater(store) if self.config.topology_aware_scheduling else None

    def start(self) -> None:
        self._request_sync()
        super().start()
        if self.ungater:
            self.ungater.start()

    def stop(self) -> None:
        if self.ungater:
            self.ungater.stop()
        super().stop()

    def handle(self, event: Event) -> None:
        self._request_sync()

    def _request_sync(self) -> None:
        if not self._sync_requested:
            self._sync_requested = True
            self.after(self.debounce_s, self._run_sync)

    def _run_sync(self) -> None:
        self._sync_requested = False
        self.sync()

    def _wake_in(self, seconds: float) -> None:
        """Sync again in ``seconds`` (a deadline); one timer per deadline."""
        due = round(time.time() + seconds, 2)
        if due not in self._wakeups:
            self._wakeups.add(due)
            self.after(seconds + 0.005, lambda: (self._wakeups.discard(due), self._request_sync()))

    # ---- the pass ----------------------------------------------------------------------------
    def sync(self) -> None:
        workloads = self.store.list(WORKLOADS)[0]
        by_job = {w["metadata"].get("labels", {}).get(JOB_UID_LABEL): w for w in workloads}
        job_uids = set()
        for job in self.store.list(JOBS)[0]:
            job_uids.add(job["metadata"]["uid"])
            if QUEUE_LABEL in (job["metadata"].get("labels") or {}):
                self._reconcile_job(job, by_job.get(job["metadata"]["uid"]))
        alive = set()
        for workload in self.store.list(WORKLOADS)[0]:
            owner = _job_owner(workload)
            if owner and owner["uid"] not in job_uids:
                self._delete_orphan(workload)
                continue
            alive.add(workload["metadata"]["uid"])
            self._reconcile_workload(workload)
        self.writer.forget(alive)
        self._requeue_at = {uid: at for uid, at in self._requeue_at.items() if uid in alive}
        self.scheduler.schedule()
        self.scheduler.publish_status()
        if self.scheduler.topology_pending:  # pods Kueue does not watch here may free nodes: try again
            self._wake_in(TOPOLOGY_RETRY_S)

    # ---- Job reconciler ----------------------------------------------------------------------
    def _reconcile_job(self, job: dict, workload: dict | None) -> None:
        if workload is None:
            if _job_finished(job) is None:
                self._create_workload(job)
            return
        if is_finished(workload):
            return
        outcome = _job_finished(job)
        if outcome is not None:
            succeeded, message = outcome
            reason = "Succeeded" if succeeded else "Failed"
            self.writer.write(
                WORKLOADS, workload, lambda w: self.writer.set(w, FINISHED, True, reason, message)
            )
            return
        workload = self._sync_workload_spec(job, workload) or workload
        evicted = condition(workload, EVICTED)
        if evicted and evicted["status"] == "True":
            if not _suspended(job):
                self._stop_job(job, workload, evicted["message"])
            elif has_quota(workload) and not _job_active(job):
                self._release(workload, evicted)
            return
        if _suspended(job):
            if is_true(workload, ADMITTED):
                self._start_job(job, workload)
        elif not is_true(workload, ADMITTED):
            self._stop_job(job, workload, "Not admitted by cluster queue")
        self._sync_pods_ready(job, workload)

    def _workload_spec(self, job: dict) -> dict | None:
        """The Workload spec the Job asks for; ``None`` (and a Warning Event) when its priority class is missing."""
        labels = job["metadata"].get("labels") or {}
        podset = {"name": MAIN_PODSET, "count": _pods_count(job), "template": job["spec"].get("template", {})}
        if self.config.topology_aware_scheduling:
            podset["topologyRequest"] = kueue_tas.topology_request(podset["template"])
        spec = {
            "active": True,
            "podSets": [podset],
            "priority": 0,
            "queueName": labels[QUEUE_LABEL],
        }
        class_name = labels.get(PRIORITY_LABEL)
        if class_name:
            priority_class = self.store.find(PRIORITY_CLASSES, "", class_name)
            if priority_class is None:
                self._warn_missing_class(job, class_name)
                return None
            spec["priority"] = int(priority_class.get("value") or 0)
            spec.update(self.release.priority_class(class_name))
        return copy.deepcopy(spec)

    def _create_workload(self, job: dict) -> None:
        spec = self._workload_spec(job)
        if spec is None:
            return
        meta = job["metadata"]
        name = workload_name("Job", "batch", meta["name"], meta["uid"])
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
        workload = {
            "apiVersion": self.release.api_version,
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [owner | {"controller": True, "blockOwnerDeletion": True}],
            },
            "spec": spec,
        }
        try:
            self.store.create(WORKLOADS, workload)
        except AlreadyExists:
            return
        self.writer.event(
            job, "Normal", "CreatedWorkload", f"Created Workload: {meta['namespace']}/{name}", JOB_COMPONENT
        )

    def _sync_workload_spec(self, job: dict, workload: dict) -> dict | None:
        """Follow the Job's priority class (any time) and its queue and PodSet (while it waits)."""
        wanted = self._workload_spec(job)
        if wanted is None:
            return None
        spec = workload["spec"]
        class_keys = list(self.release.priority_class(""))
        keys = ["priority", *class_keys] if class_keys[0] in wanted else []
        if _suspended(job) and not has_quota(workload):
            keys += ["queueName", "podSets"]
        changes = {key: wanted[key] for key in keys if spec.get(key) != wanted[key]}
        if not changes:
            return None
        return self.writer.write(WORKLOADS, workload, lambda w: w["spec"].update(changes))

    def _warn_missing_class(self, job: dict, class_name: str) -> None:
        """A Warning Event, as Kueue's main branch (0.20) records; 0.13 to 0.19 only log it."""
        key = (job["metadata"]["uid"], class_name)
        if key not in self._warned and self.release.version == "v1beta2":
            self._warned.add(key)
            message = f'WorkloadPriorityClass "{class_name}" not found'
            self.writer.event(job, "Warning", "WorkloadPriorityClassNotFound", message, JOB_COMPONENT)

    def _start_job(self, job: dict, workload: dict) -> None:
        """Unsuspend with the flavors' nodeLabels and tolerations and the release's labels and annotations;
        a topology assignment adds the ``kueue.x-k8s.io/topology`` scheduling gate and the workload
        annotation (and marks an implied request unconstrained), as Kueue's ``podset.FromAssignment`` does."""
        admission = workload["status"]["admission"]
        assignment = admission["podSetAssignments"][0]
        gated = "topologyAssignment" in assignment
        implied = not kueue_tas.explicit(workload["spec"]["podSets"][0].get("topologyRequest"))
        node_labels: dict = {}
        tolerations: list = []
        for name in sorted(set(assignment["flavors"].values())):
            flavor = self.store.find(FLAVORS, "", name) or {}
            node_labels.update(flavor.get("spec", {}).get("nodeLabels") or {})
            tolerations += flavor.get("spec", {}).get("tolerations") or []

        def change(j: dict) -> None:
            template = j["spec"].setdefault("template", {})
            pod, meta = template.setdefault("spec", {}), template.setdefault("metadata", {})
            if node_labels:
                pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **node_labels}
            if tolerations:
                existing = pod.get("tolerations") or []
                pod["tolerations"] = existing + [t for t in tolerations if t not in existing]
            labels, annotations = self.release.pod_marks(workload, assignment)
            if gated:  # TAS: the gate, and the workload annotation its ungater finds the pods by
                gates = pod.get("schedulingGates") or []
                pod["schedulingGates"] = gates + [g for g in [{"name": kueue_tas.GATE}] if g not in gates]
                annotations = {**annotations, WORKLOAD_ANNOTATION: workload["metadata"]["name"]}
                if implied:
                    annotations[kueue_tas.UNCONSTRAINED] = "true"
            meta["labels"] = {**(meta.get("labels") or {}), **labels}
            if annotations:
                meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
            j["spec"]["suspend"] = False

        if self.writer.write(JOBS, job, change):
            message = f"Admitted by clusterQueue {admission['clusterQueue']}"
            self.writer.event(job, "Normal", "Started", message, JOB_COMPONENT)

    def _stop_job(self, job: dict, workload: dict, message: str) -> None:
        """Suspend (the Job controller deletes the pods) and restore the pod template Kueue changed."""
        original = workload["spec"]["podSets"][0].get("template", {})

        def change(j: dict) -> None:
            j["spec"]["suspend"] = True
            template = j["spec"].setdefault("template", {})
            for part, key in (
                ("metadata", "labels"),
                ("metadata", "annotations"),
                ("spec", "nodeSelector"),
                ("spec", "tolerations"),
                ("spec", "schedulingGates"),
            ):
                value = original.get(part, {}).get(key)
                section = template.setdefault(part, {})
                if value is None:
                    section.pop(key, None)
                else:
                    section[key] = copy.deepcopy(value)

        if self.writer.write(JOBS, job, change):
            self.writer.event(job, "Normal", "Stopped", message, JOB_COMPONENT)

    def _release(self, workload: dict, evicted: dict) -> None:
        """The evicted Job's pods are gone: give the quota back and requeue (preemption requeues at once)."""

        def change(w: dict) -> None:
            if not has_quota(w):
                return
            reason, message = evicted["reason"], evicted["message"]
            self.writer.set(w, REQUEUED, reason in ("Preempted", kueue_tas.NODE_FAILURES), reason, message)
            self.writer.set(w, QUOTA_RESERVED, False, "Pending", message)
            w["status"].pop("admission", None)
            w["status"].pop("unhealthyNodes", None)
            self.writer.set(w, ADMITTED, False, "NoReservation", "The workload has no reservation")
            if self.config.wait_for_pods_ready_timeout_s is not None:
                self.writer.set(w, PODS_READY, False, WAIT_FOR_START, NOT_READY_MESSAGE)

        self.writer.write(WORKLOADS, workload, change)

    def _sync_pods_ready(self, job: dict, workload: dict) -> None:
        """PodsReady, written only with waitForPodsReady configured (``reconciler.go``, step 5)."""
        if self.config.wait_for_pods_ready_timeout_s is None:
            return
        current = condition(workload, PODS_READY)
        status = job.get("status", {})
        ready = (status.get("ready") or 0) + (status.get("succeeded") or 0) >= workload["spec"]["podSets"][0][
            "count"
        ]
        if not is_true(workload, ADMITTED) or (current is None and not ready):
            wanted = ("False", WAIT_FOR_START, NOT_READY_MESSAGE)
        elif ready:
            recovering = current is not None and current["reason"] in ("WaitForRecovery", "Recovered")
            wanted = ("True", "Recovered" if recovering else "Started", READY_MESSAGE)
        elif current["status"] == "True":
            wanted = ("False", "WaitForRecovery", "At least one pod has failed, waiting for recovery")
        else:
            return
        if current and (current["status"], current["reason"], current["message"]) == wanted:
            return
        self.writer.write(
            WORKLOADS, workload, lambda w: self.writer.set(w, PODS_READY, wanted[0] == "True", *wanted[1:])
        )

    def _delete_orphan(self, workload: dict) -> None:
        meta = workload["metadata"]
        try:
            self.store.delete(WORKLOADS, meta["namespace"], meta["name"])
        except NotFound:
            pass

    # ---- Workload controller -----------------------------------------------------------------
    def _reconcile_workload(self, workload: dict) -> None:
        if is_finished(workload):
            return
        if not is_active(workload):
            if not is_true(workload, EVICTED):
                self._deactivate(workload)
            return
        if is_true(workload, DEACTIVATION_TARGET):
            self.writer.write(WORKLOADS, workload, lambda w: w["spec"].update(active=False))
            return
        requeued = condition(workload, REQUEUED)
        if requeued and requeued["status"] == "False":
            if requeued["reason"].startswith(DEACTIVATED):
                self._set(workload, REQUEUED, True, "Reactivated", "The workload was reactivated")
            elif requeued["reason"] == PODS_READY_TIMEOUT:
                self._finish_backoff(workload)
        if is_true(workload, ADMITTED) and not is_true(workload, EVICTED):
            self._check_pods_ready_timeout(workload)

    def _set(self, workload: dict, kind: str, status: bool, reason: str, message: str) -> None:
        self.writer.write(WORKLOADS, workload, lambda w: self.writer.set(w, kind, status, reason, message))

    def _deactivate(self, workload: dict) -> None:
        target = condition(workload, DEACTIVATION_TARGET)
        reason, message = DEACTIVATED, "The workload is deactivated"
        if target:
            reason, message = f"{reason}DueTo{target['reason']}", f"{message} due to {target['message']}"

        def change(w: dict) -> None:
            self.writer.set(w, EVICTED, True, reason, message)
            remove_condition(w, DEACTIVATION_TARGET)
            w["status"].pop("requeueState", None)

        self._requeue_at.pop(workload["metadata"]["uid"], None)
        if self.writer.write(WORKLOADS, workload, change) and has_quota(workload):
            self.writer.event(workload, "Normal", f"EvictedDueTo{reason}", message, WORKLOAD_COMPONENT)

    def _check_pods_ready_timeout(self, workload: dict) -> None:
        timeout = self.config.wait_for_pods_ready_timeout_s
        ready = condition(workload, PODS_READY)
        if timeout is None or (ready and ready["status"] == "True"):
            return
        recovering = ready is not None and ready["reason"] == "WaitForRecovery"
        started = self.writer.since(workload, PODS_READY if recovering else ADMITTED)
        remaining = started + timeout - time.time()
        if remaining > 0:
            self._wake_in(remaining)
            return
        count = int((workload["status"].get("requeueState") or {}).get("count") or 0) + 1
        limit = self.config.backoff_limit_count
        if limit is not None and count > limit:
            self._set(
                workload,
                DEACTIVATION_TARGET,
                True,
                "RequeuingLimitExceeded",
                "exceeding the maximum number of re-queuing retries",
            )
            return
        meta = workload["metadata"]
        requeue_at = time.time() + self.config.backoff_s(count)
        message = f"Exceeded the PodsReady timeout {meta['namespace']}/{meta['name']}"

        def change(w: dict) -> None:
            w["status"]["requeueState"] = {"count": count, "requeueAt": iso(math.ceil(requeue_at))}
            self.writer.set(w, EVICTED, True, PODS_READY_TIMEOUT, message)

        self._requeue_at[meta["uid"]] = requeue_at
        if self.writer.write(WORKLOADS, workload, change):
            self.writer.event(
                workload, "Normal", f"EvictedDueTo{PODS_READY_TIMEOUT}", message, WORKLOAD_COMPONENT
            )

    def _finish_backoff(self, workload: dict) -> None:
        state = workload["status"].get("requeueState") or {}
        fallback = parse_iso(state["requeueAt"]) if state.get("requeueAt") else 0.0
        remaining = self._requeue_at.get(workload["metadata"]["uid"], fallback) - time.time()
        if remaining > 0:
            self._wake_in(remaining)
            return

        def change(w: dict) -> None:
            (w["status"].get("requeueState") or {}).pop("requeueAt", None)
            self.writer.set(w, REQUEUED, True, "BackoffFinished", "The workload backoff was finished")

        self.writer.write(WORKLOADS, workload, change)


def _job_owner(workload: dict) -> dict | None:
    for ref in workload["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Job" and ref.get("apiVersion") == "batch/v1":
            return ref
    return None


def _suspended(job: dict) -> bool:
    return job.get("spec", {}).get("suspend") is True


def _job_active(job: dict) -> bool:
    status = job.get("status", {})
    return (status.get("active") or 0) + (status.get("terminating") or 0) > 0


def _pods_count(job: dict) -> int:
    """Kueue's count for a batch Job: parallelism, at most completions."""
    parallelism = job["spec"].get("parallelism")
    parallelism = 1 if parallelism is None else int(parallelism)
    completions = job["spec"].get("completions")
    return parallelism if completions is None else min(parallelism, int(completions))


def _job_finished(job: dict) -> tuple[bool, str] | None:
    """(succeeded, message) once the Job has Complete or Failed, else ``None``."""
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            succeeded = cond["type"] == "Complete"
            return succeeded, cond.get("message") or (
                "Job finished successfully" if succeeded else "Job failed"
            )
    return None
