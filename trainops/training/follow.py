"""Follow one attempt to its end: the Job, its pods, its Kueue Workload and its heartbeat.

``RunFollower.follow()`` watches (never polls) the API objects, reads the heartbeat from S3 every
``heartbeat_poll`` seconds (S3 has no watch), and returns an ``Outcome`` as soon as one of these
holds:

- ``succeeded``: the Job is Complete;
- ``failed``: a pod of the gang failed, or the Job is Failed (with the pods as last seen, for
  the failure classification);
- ``hang``: no new heartbeat within the learned bound (see ``progress``);
- ``start_timeout``: admitted, but the gang's pods are not all running within ``start_timeout``;
- ``admission_timeout``: not admitted by Kueue within ``admission_timeout``;
- ``deactivated``: the Workload was deactivated (``spec.active=false``) by someone else or by
  Kueue (requeuing limit);
- ``job_missing``: the Job is gone.

Preemption (Workload ``Evicted`` with reason ``Preempted``) and PodsReady timeouts are not
outcomes: Kueue requeues the Workload, so the follower counts them, restarts the admission
clock and keeps following the same attempt.  For ``hang`` and the timeouts the follower stops
the run before returning.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from trainops.training import kube
from trainops.training.progress import HangPolicy, ProgressTracker

log = logging.getLogger(__name__)

SUCCEEDED, FAILED, HANG = "succeeded", "failed", "hang"
START_TIMEOUT, ADMISSION_TIMEOUT = "start_timeout", "admission_timeout"
DEACTIVATED, JOB_MISSING = "deactivated", "job_missing"
FAILURE_SETTLE_S = 0.2  # gather pods that fail together (a lost node, a peer's abort)


@dataclass(frozen=True)
class FollowConfig:
    namespace: str
    job_name: str
    run_uri: str
    nodes: int
    hang: HangPolicy = field(default_factory=HangPolicy)
    admission_timeout: float | None = 3600.0
    start_timeout: float = 600.0
    heartbeat_poll: float = 2.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["hang"] = self.hang.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> FollowConfig:
        return cls(**{**data, "hang": HangPolicy(**data["hang"])})


@dataclass
class Outcome:
    status: str
    message: str
    job: str
    pods: list[dict] = field(default_factory=list)
    preemptions: list[str] = field(default_factory=list)
    heartbeat: dict | None = None
    seen_at: float = 0.0
    stopped: str | None = None
    workload: str | None = None  # the attempt's Kueue Workload, as the follower last saw it

    def to_dict(self) -> dict:
        return asdict(self)


def condition(obj: dict | None, kind: str) -> dict | None:
    """The condition of ``kind`` when its status is True."""
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind and item.get("status") == "True":
            return item
    return None


def slim_pod(pod: dict) -> dict:
    """What classification needs from a pod (keeps events small)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "deletionTimestamp", "annotations") if k in meta},
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {
            k: status[k]
            for k in ("phase", "reason", "message", "conditions", "containerStatuses")
            if k in status
        },
    }


def pod_failed(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Failed"


class RunState:
    """What the follower knows about the attempt; ``verdict(now)`` says whether it is over."""

    def __init__(self, config: FollowConfig, job: dict, baseline_beat: dict | None, now: float) -> None:
        self.config = config
        self.job = job
        self.workload: dict | None = None
        self.pods: dict[str, dict] = {}
        self.job_gone = False
        self.tracker = ProgressTracker(config.hang, baseline_beat)
        self.queued_since: float | None = now
        self.admitted_since: float | None = None
        self.preemptions: list[str] = []
        self._eviction_seen: str | None = None
        self.first_failure_at: float | None = None

    # ---- updates -----------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: dict, now: float) -> None:
        if kind == "job":
            if event == "DELETED":
                self.job_gone = True
            else:
                self.job = obj
        elif kind == "pod":
            # a deleted pod's last state stays: it is evidence of how the attempt ended
            self.pods[obj["metadata"]["name"]] = obj
            # A pod that fails while being deleted (preemption, suspension, a stop) is not by itself a
            # failure of the run; when it is one (a lost node), the Job's Failed condition says so.
            if (
                pod_failed(obj)
                and not obj["metadata"].get("deletionTimestamp")
                and self.first_failure_at is None
            ):
                self.first_failure_at = now
        elif kind == "workload" and event != "DELETED":
            self._workload(obj, now)
        self._clocks(now)

    def _workload(self, workload: dict, now: float) -> None:
        self.workload = workload
        evicted = condition(workload, "Evicted")
        marker = evicted and f"{evicted.get('reason')}@{evicted.get('lastTransitionTime')}"
        if evicted and marker != self._eviction_seen:
            self._eviction_seen = marker
            reason = evicted.get("reason") or ""
            if reason in ("Preempted", "PodsReadyTimeout", "NodeFailures"):
                if reason == "Preempted":
                    self.preemptions.append(evicted.get("message") or "preempted")
                log.info("Workload evicted (%s): %s; Kueue requeues it", reason, evicted.get("message"))
                self.queued_since, self.admitted_since = now, None
                self.tracker = ProgressTracker(self.config.hang, self.tracker.last)

    def _clocks(self, now: float) -> None:
        admitted = self.is_admitted()
        if admitted and self.admitted_since is None:
            self.admitted_since, self.queued_since = now, None
        running = [p for p in self.pods.values() if (p.get("status") or {}).get("phase") == "Running"]
        if admitted and len(running) >= self.config.nodes:
            self.tracker.running(now)

    def is_admitted(self) -> bool:
        admitted, evicted = condition(self.workload, "Admitted"), condition(self.workload, "Evicted")
        if admitted:
            return not evicted or evicted.get("lastTransitionTime", "") < admitted.get(
                "lastTransitionTime", ""
            )
        return self.workload is None and not (self.job.get("spec") or {}).get("suspend", False)

    def heartbeat(self, beat: dict | None, now: float) -> None:
        self.tracker.observe(beat, now)

    # ---- the verdict -------------------------------------------------------------------
    def verdict(self, now: float) -> tuple[str, str] | None:
        name = self.config.job_name
        if condition(self.job, "Complete"):
            return SUCCEEDED, f"Job {name} completed"
        failed = condition(self.job, "Failed")
        if failed:
            return FAILED, f"Job {name} failed ({failed.get('reason')}: {failed.get('message', '')})"
        if self.first_failure_at is not None and now >= self.first_failure_at + FAILURE_SETTLE_S:
            bad = sorted(n for n, p in self.pods.items() if pod_failed(p))
            return FAILED, f"pod(s) {', '.join(bad)} of Job {name} failed"
        if self.job_gone:
            return JOB_MISSING, f"Job {name} was deleted while the run was being followed"
        finished = condition(self.workload, "Finished")
        evicted = condition(self.workload, "Evicted")
        if (
            evicted
            and (evicted.get("reason") or "").startswith("Deactivated")
            or (self.workload and (self.workload.get("spec") or {}).get("active") is False)
        ):
            why = evicted.get("reason") if evicted else "spec.active=false"
            return DEACTIVATED, f"Workload {self.workload['metadata']['name']} was deactivated ({why})"
        if finished and not failed:
            return FAILED, f"Workload finished ({finished.get('reason')}: {finished.get('message', '')})"
        if self.queued_since is not None and self.config.admission_timeout is not None:
            if now >= self.queued_since + self.config.admission_timeout:
                return ADMISSION_TIMEOUT, (
                    f"not admitted by Kueue within {self.config.admission_timeout:g}s "
                    f"({self._pending_reason()}); raise the queue's quota or claim nodes for it"
                )
        if self.admitted_since is not None and self.tracker.deadline() is None:
            if now >= self.admitted_since + self.config.start_timeout:
                running = sum(
                    1 for p in self.pods.values() if (p.get("status") or {}).get("phase") == "Running"
                )
                return START_TIMEOUT, (
                    f"admitted, but only {running} of {self.config.nodes} pods running after "
                    f"{self.config.start_timeout:g}s"
                )
        if hung := self.tracker.hung(now):
            return HANG, f"hang: {hung}"
        return None

    def next_deadline(self, now: float) -> float:
        """The soonest time the verdict could change without a new event."""
        candidates = [now + 5.0]
        if self.first_failure_at is not None:
            candidates.append(self.first_failure_at + FAILURE_SETTLE_S)
        if self.queued_since is not None and self.config.admission_timeout is not None:
            candidates.append(self.queued_since + self.config.admission_timeout)
        if self.admitted_since is not None:
            candidates.append(self.admitted_since + self.config.start_timeout)
        if (deadline := self.tracker.deadline()) is not None:
            candidates.append(deadline)
        return min(candidates)

    def _pending_reason(self) -> str:
        for kind in ("QuotaReserved", "Admitted"):
            for item in ((self.workload or {}).get("status") or {}).get("conditions") or []:
                if item.get("type") == kind and item.get("status") == "False":
                    return f"{item.get('reason')}: {item.get('message', '')}"
        return "no Workload yet" if self.workload is None else "pending"


def read_heartbeat(run_uri: str) -> dict | None:
    """The run's ``heartbeat.json`` (None when absent or unreadable)."""
    from trainops.checkpoints.helper import HEARTBEAT_FILE
    from trainops.checkpoints.store import CheckpointStore
    from trainops.checkpoints.uri import S3Uri

    run = S3Uri.parse(run_uri, field="run_uri")
    try:
        data = CheckpointStore().read(run.bucket, run.key(HEARTBEAT_FILE), limit=64 << 10)
        return json.loads(data) if data else None
    except Exception as error:  # a flaky bucket must not end the run; staleness is the signal
        log.warning("heartbeat read failed: %s", error)
        return None


ClientFactory = Callable[[], Any]  # () -> async context manager yielding a kubernetes_asyncio ApiClient


class RunFollower:
    def __init__(
        self, config: FollowConfig, client_factory: ClientFactory, clock: Callable[[], float] = time.time
    ):
        self.config = config
        self.client_factory = client_factory
        self.clock = clock

    async def follow(self) -> Outcome:
        config = self.config
        async with self.client_factory() as api:
            job = await kube.read_job(api, config.namespace, config.job_name)
            if job is None:
                return Outcome(
                    JOB_MISSING, f"Job {config.namespace}/{config.job_name} does not exist", config.job_name
                )
            baseline = await asyncio.to_thread(read_heartbeat, config.run_uri)
            state = RunState(config, job, baseline, self.clock())
            queue: asyncio.Queue = asyncio.Queue()
            tasks = [
                asyncio.create_task(self._pump(resource, queue))
                for resource in kube.resources(api, config.namespace, config.job_name, job["metadata"]["uid"])
            ]
            tasks.append(asyncio.create_task(self._beats(queue)))
            try:
                return await self._loop(state, queue, api)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, state: RunState, queue: asyncio.Queue, api) -> Outcome:
        while True:
            now = self.clock()
            if verdict := state.verdict(now):
                status, message = verdict
                outcome = Outcome(
                    status,
                    message,
                    self.config.job_name,
                    pods=[slim_pod(p) for p in state.pods.values()],
                    preemptions=state.preemptions,
                    heartbeat=dict(state.tracker.last) if state.tracker.last else None,
                    seen_at=state.first_failure_at or now,
                    workload=(state.workload or {}).get("metadata", {}).get("name"),
                )
                if status in (HANG, START_TIMEOUT, ADMISSION_TIMEOUT):
                    outcome.stopped = await kube.stop_run(api, self.config.namespace, self.config.job_name)
                return outcome
            try:
                item = await asyncio.wait_for(queue.get(), timeout=max(0.01, state.next_deadline(now) - now))
            except TimeoutError:
                continue
            if isinstance(item, BaseException):
                raise item
            kind, event, obj = item
            if kind == "heartbeat":
                state.heartbeat(obj, self.clock())
            else:
                state.apply(kind, event, obj, self.clock())

    async def _pump(self, resource: kube.Resource, queue: asyncio.Queue) -> None:
        try:
            async for event, obj in kube.watch(resource):
                queue.put_nowait((resource.kind, event, obj))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a non-transient API error ends the follow with that error
            queue.put_nowait(error)

    async def _beats(self, queue: asyncio.Queue) -> None:
        last = None
        while True:
            beat = await asyncio.to_thread(read_heartbeat, self.config.run_uri)
            if beat is not None and beat != last:
                last = beat
                queue.put_nowait(("heartbeat", "MODIFIED", beat))
            await asyncio.sleep(self.config.heartbeat_poll)


async def stop(client_factory: ClientFactory, namespace: str, job_name: str) -> str:
    """Stop a run from outside a follow (user kill)."""
    async with client_factory() as api:
        return await kube.stop_run(api, namespace, job_name)
