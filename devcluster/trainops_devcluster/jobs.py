"""The batch/v1 Job controller, as kube-controller-manager's (pod replacement policy
``TerminatingOrFailed``, the default without a podFailurePolicy).

It keeps ``parallelism`` pods running until ``completions`` succeed (one per completion index
for ``completionMode: Indexed``), counts failed pods against ``backoffLimit`` (a pod deleted
before it succeeded counts as failed, unless this controller deleted it because of scale-down or
suspension), deletes the pods of a suspended Job and creates none, and keeps the status counters
and conditions: ``Suspended``, ``FailureTarget``/``Failed`` (``BackoffLimitExceeded``,
``DeadlineExceeded``), ``SuccessCriteriaMet``/``Complete`` (``CompletionsReached``).

A pod the API refuses (Pod Security, an admission policy, a quota) is a ``FailedCreate`` event with
the API's message (``Error creating: pods "<pod>" is forbidden: violates PodSecurity ...``); the Job
gets no condition for it (its status: ``startTime``, ``active: 0``), and the controller tries again
after 1 s, 2 s, 4 s ... at most 60 s (its sync error backoff), one pod per try, as the real one's
slow start stops at the first failure of a batch.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from trainops_devcluster.admission import ValidatingAdmission
from trainops_devcluster.conditions import condition_true, set_condition
from trainops_devcluster.events import WARNING
from trainops_devcluster.informer import Key, key_of
from trainops_devcluster.owners import PodOwnerController
from trainops_devcluster.podutil import (
    is_active,
    is_deleting,
    is_ready,
    is_terminal,
    phase,
    pod_from_template,
)
from trainops_devcluster.store import Store, now_iso

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
SYNC_BATCH_S = 0.05  # a burst of pod changes becomes one sync per Job (real: 1 s) ...
SYNC_SHARE = 0.1  # ... and syncs of huge Jobs are spaced to take at most this share of the time
MAX_BACKOFF_S = 60.0  # after a refused pod the sync is retried in 1 s, doubling up to this (MaxJobApiBackOff)


@dataclass
class Tracking:
    """What a Job's pods have done, counted once per pod (the job-tracking finalizer's role)."""

    succeeded: set[str] = field(default_factory=set)
    succeeded_indexes: set[int] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    not_failures: set[str] = field(default_factory=set)  # pods this controller deleted on purpose
    refused: int = 0  # pod creations the API refused in a row


def completion_index(pod: dict) -> int | None:
    raw = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
    return int(raw) if raw is not None and raw.isdigit() else None


def format_indexes(indexes: set[int]) -> str:
    """``{0,1,2,5}`` -> ``"0-2,5"`` as in ``status.completedIndexes``."""
    ranges: list[str] = []
    for index in sorted(indexes):
        if ranges and ranges[-1][1] == index - 1:
            ranges[-1] = (ranges[-1][0], index)
        else:
            ranges.append((index, index))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def is_finished(job: dict) -> bool:
    return condition_true(job, "Complete") or condition_true(job, "Failed")


class JobController(PodOwnerController):
    owner = "jobs.batch"
    component = "job-controller"
    watches = ("jobs.batch", "pods")

    def __init__(self, store: Store, admission: ValidatingAdmission | None = None) -> None:
        super().__init__(store, admission)
        self._tracking: dict[str, Tracking] = {}
        self._flush_seconds = 0.0

    # ---- watching ----------------------------------------------------------------------
    def forget(self, uid: str) -> None:
        super().forget(uid)
        self._tracking.pop(uid, None)

    def pod_changed(self, owner_uid: str, pod: dict, gone: bool) -> None:
        """Count what the pod did (the job-tracking finalizer's role)."""
        tracking = self._tracking.setdefault(owner_uid, Tracking())
        uid = pod["metadata"]["uid"]
        if phase(pod) == "Succeeded":
            tracking.succeeded.add(uid)
            index = completion_index(pod)
            if index is not None:
                tracking.succeeded_indexes.add(index)
        elif (phase(pod) == "Failed" or is_deleting(pod) or gone) and uid not in tracking.not_failures:
            tracking.failed.add(uid)

    def batch_delay(self) -> float:
        return max(SYNC_BATCH_S, self._flush_seconds / SYNC_SHARE)

    def reconcile(self, keys: set[Key]) -> None:
        started = time.monotonic()
        for key in sorted(keys):
            job = self.cache["jobs.batch"].get(key)
            if job is not None and not is_finished(job):
                self.sync(job)
        self._flush_seconds = time.monotonic() - started

    # ---- reconciling -------------------------------------------------------------------
    def sync(self, job: dict) -> None:
        spec = job["spec"]
        tracking = self._tracking.setdefault(job["metadata"]["uid"], Tracking())
        pods = self.pods_of(job)
        active = [p for p in pods if is_active(p)]
        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")
        status = copy.deepcopy(job.get("status") or {})
        probe = {"status": status}
        succeeded = len(tracking.succeeded_indexes if indexed else tracking.succeeded)
        failed = len(tracking.failed)

        failure = self._failure(job, failed)
        if completions is None:
            success = succeeded > 0 and not active
        else:
            success = succeeded >= completions and not active
        if failure is not None:
            reason, message = failure
            if set_condition(probe, "FailureTarget", "True", reason, message):
                self.events.record(job, reason, message, WARNING)
            self.delete_pods(job, active)
            active = []
        elif spec.get("suspend"):
            if set_condition(probe, "Suspended", "True", "JobSuspended", "Job suspended"):
                self.events.record(job, "Suspended", "Job suspended")
            self._delete(job, active, tracking)
            active = []
        else:
            if condition_true(probe, "Suspended"):
                set_condition(probe, "Suspended", "False", "JobResumed", "Job resumed")
                self.events.record(job, "Resumed", "Job resumed")
                status["startTime"] = now_iso()
            status.setdefault("startTime", now_iso())
            if success:
                set_condition(
                    probe,
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                )
            else:
                active = self._manage(job, active, tracking, indexed)
                self._schedule_deadline(job, status)

        terminating = sum(1 for p in pods if is_deleting(p) and not is_terminal(p))
        status.update(
            active=len(active),
            ready=sum(1 for p in active if is_ready(p)),
            succeeded=succeeded,
            failed=len(tracking.failed),
            terminating=terminating,
        )
        if indexed:
            completed = format_indexes({i for i in tracking.succeeded_indexes if i < (completions or 0)})
            if completed:
                status["completedIndexes"] = completed
        if not terminating and not active:
            if condition_true(probe, "FailureTarget"):
                target = next(c for c in status["conditions"] if c["type"] == "FailureTarget")
                set_condition(probe, "Failed", "True", target["reason"], target["message"])
            elif condition_true(probe, "SuccessCriteriaMet"):
                set_condition(
                    probe,
                    "Complete",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                )
                status["completionTime"] = now_iso()
                self.events.record(job, "Completed", "Job completed")
        self.write_status(job, status)

    def _failure(self, job: dict, failed: int) -> tuple[str, str] | None:
        spec = job["spec"]
        if condition_true(job, "FailureTarget"):
            target = next(c for c in job["status"]["conditions"] if c["type"] == "FailureTarget")
            return target["reason"], target["message"]
        if failed > spec.get("backoffLimit", 6):
            return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        deadline = spec.get("activeDeadlineSeconds")
        start = (job.get("status") or {}).get("startTime")
        if deadline is not None and start and not spec.get("suspend") and _age_seconds(start) >= deadline:
            return "DeadlineExceeded", "Job was active longer than specified deadline"
        return None

    def _schedule_deadline(self, job: dict, status: dict) -> None:
        deadline = job["spec"].get("activeDeadlineSeconds")
        if deadline is not None:
            key = key_of(job)
            self.after(max(0.0, deadline - _age_seconds(status["startTime"])) + 0.01, lambda: self.mark(key))

    def _manage(self, job: dict, active: list[dict], tracking: Tracking, indexed: bool) -> list[dict]:
        """Create missing pods and delete surplus ones; returns the active pods afterwards."""
        spec = job["spec"]
        parallelism = spec.get("parallelism", 1)
        completions = spec.get("completions")
        if indexed:
            seen: set[int] = set()
            keep, surplus = [], []
            for pod in active:
                index = completion_index(pod)
                if index is None or index >= (completions or 0) or index in seen:
                    surplus.append(pod)
                else:
                    seen.add(index)
                    keep.append(pod)
            room = max(0, parallelism - len(keep))
            missing = [
                i for i in range(completions or 0) if i not in tracking.succeeded_indexes and i not in seen
            ]
            missing = missing[:room]
        else:
            if completions is None:  # a work queue: no new pods once one succeeded
                wanted = len(active) if tracking.succeeded else parallelism
            else:
                wanted = min(parallelism, completions - len(tracking.succeeded))
            newest_first = sorted(
                active, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True
            )
            cut = max(0, len(active) - wanted)
            surplus, keep = newest_first[:cut], newest_first[cut:]
            missing = [None] * max(0, wanted - len(keep))
        active = keep
        self._delete(job, surplus, tracking)
        for index in missing:
            created = self._create(job, index)
            if created is None:  # refused: try again after the backoff, as the sync error requeues
                tracking.refused += 1
                self._retry(job, min(MAX_BACKOFF_S, 2.0 ** (tracking.refused - 1)))
                break
            tracking.refused = 0
            active.append(created)
        return active

    def _retry(self, job: dict, delay: float) -> None:
        key = key_of(job)
        self.after(delay, lambda: self.mark(key))

    def _create(self, job: dict, index: int | None) -> dict | None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        labels = {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        annotations = {}
        if index is not None:
            labels[INDEX_KEY] = annotations[INDEX_KEY] = str(index)
        pod = pod_from_template(
            job["spec"]["template"],
            owner=job,
            generate_name=f"{name}-" if index is None else f"{name}-{index}-",
            labels=labels,
            annotations=annotations,
        )
        if index is not None:
            pod["spec"]["hostname"] = f"{name}-{index}"
            index_env = {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}},
            }
            for container in pod["spec"].get("containers") or []:
                container["env"] = [*(container.get("env") or []), index_env]
        return self.create_pod(job, pod)

    def _delete(self, job: dict, pods: list[dict], tracking: Tracking) -> None:
        tracking.not_failures.update(pod["metadata"]["uid"] for pod in pods)
        self.delete_pods(job, pods)


def _age_seconds(stamp: str) -> float:
    started = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return (datetime.now(UTC) - started).total_seconds()
