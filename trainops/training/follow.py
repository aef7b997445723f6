"""Follow one attempt to its end: the Job, its pods, its Kueue Workload and its progress.

``RunFollower.follow()`` watches (never polls) the API objects, reads the heartbeat from S3 every
``heartbeat_poll`` seconds (S3 has no watch) and, while the trainer has written no heartbeat, lists
the run path's checkpoint directories every ``CHECKPOINT_POLLS`` heartbeat polls (progress from
checkpoints, see ``progress``). It returns an ``Outcome`` as soon as one of these holds:

- ``succeeded``: the Job is Complete;
- ``failed``: a pod of the gang failed, the Job is Failed, or its Workload Finished without the
  Job completing (confirmed on the Job and its pods read again, which the outcome carries for the
  failure classification);
- ``hang``: no new heartbeat (or, for a trainer without one, no new checkpoint) within the
  learned bound (see ``progress``);
- ``start_timeout``: admitted, but the gang's pods are not all running within ``start_timeout``;
- ``admission_timeout``: not admitted by Kueue within ``admission_timeout``;
- ``never_admitted``: Kueue answered that its queue can never admit the request as the queue and the
  request stand (``QuotaReserved=False``: "resource rdma/ib unavailable in ClusterQueue", a flavor
  whose taints, labels or topology the pods can never match: ``trainops.kube.queues.never_admits``),
  not an answer that may change (quota short, a preemption under way);
- ``pods_refused``: the API refuses the Job's pods (Pod Security, an admission policy or webhook):
  the Job controller's ``FailedCreate`` event, whose message is the API's.  A pod over a namespace's
  ResourceQuota is refused too, but the quota may clear (other pods end): that refusal is named in
  the ``start_timeout`` message instead;
- ``deactivated``: the Workload was deactivated (``spec.active=false``) by someone else;
- ``kueue_deactivated``: Kueue deactivated it (its requeuing limit, a maximum execution time, a
  rejected admission check), reported with Kueue's reason;
- ``job_missing``: the Job is gone;
- ``heartbeat_unreadable``: the heartbeat could not be read (from the store of the Airflow AWS
  connection) for longer than the hang bound; every failed read is logged and counted, and no
  run is called hung while its heartbeat cannot be read.

Preemption (Workload ``Evicted`` with reason ``Preempted``), PodsReady timeouts and every other
eviction but a deactivation are not outcomes: Kueue requeues the Workload, so the follower counts
preemptions, restarts the admission clock and keeps following the same attempt.  The Workload is
read by meaning, in either Kueue API version (``trainops.kube.kueue.workload_facts``).  The
follower only watches: judging and stopping the attempt are ``reconcile``'s.  The watches are async
(``trainops.kube.aio``); the other cluster calls are ``GangCluster``'s, run in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from trainops.checkpoints.store import CheckpointStore
from trainops.conventions import KUEUE_JOB_UID_LABEL
from trainops.kube.aio import Resource, collection, watch
from trainops.kube.client import EVENTS, JOBS, PODS, Kind
from trainops.kube.kueue import BY_KUEUE, BY_USER, deactivation_message, workload_facts
from trainops.kube.queues import never_admits
from trainops.training.cluster import GangCluster
from trainops.training.job import JOB_NAME_LABEL, condition
from trainops.training.progress import HangPolicy, ProgressTracker

log = logging.getLogger(__name__)

FAILURE_SETTLE_S = 0.2  # gather pods that fail together (a lost node, a peer's abort)
CHECKPOINT_POLLS = 5  # without a heartbeat: list the run's checkpoints every 5th heartbeat poll


class Status(StrEnum):
    """How an attempt ended, as the follower saw it (see the module docstring)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    HANG = "hang"
    HEARTBEAT_UNREADABLE = "heartbeat_unreadable"
    START_TIMEOUT = "start_timeout"
    ADMISSION_TIMEOUT = "admission_timeout"
    PODS_REFUSED = "pods_refused"
    NEVER_ADMITTED = "never_admitted"
    DEACTIVATED = "deactivated"
    KUEUE_DEACTIVATED = "kueue_deactivated"
    JOB_MISSING = "job_missing"


# a FailedCreate whose message is the API refusing the pod, not a transient failure to reach it
_REFUSED = (" is forbidden: ", " is invalid: ", " denied the request")
# ... of which these may clear by themselves: a ResourceQuota frees up as other pods end
_MAY_CLEAR = (" exceeded quota: ",)


def refusal(event: dict) -> tuple[str, bool] | None:
    """The API's refusal of a pod, from the Job controller's ``FailedCreate`` event, and whether it is
    permanent (Pod Security, an admission policy or webhook: nothing changes until a person does; a
    ResourceQuota may clear); None for other events and transient failures."""
    message = event.get("message") or ""
    if event.get("reason") != "FailedCreate" or not any(mark in message for mark in _REFUSED):
        return None
    return message.removeprefix("Error creating: ")[:2000], not any(mark in message for mark in _MAY_CLEAR)


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
    status: Status
    message: str
    job: str
    pods: list[dict] = field(default_factory=list)
    preemptions: list[str] = field(default_factory=list)
    heartbeat: dict | None = None
    seen_at: float = 0.0

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    def to_dict(self) -> dict:
        return asdict(self)


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

    def __init__(
        self,
        config: FollowConfig,
        job: dict,
        baseline_beat: dict | None,
        now: float,
        baseline_checkpoint: int | None = None,
    ) -> None:
        self.config = config
        self.job = job
        self.workload: dict | None = None
        self.pods: dict[str, dict] = {}
        self.job_gone = False
        self.tracker = ProgressTracker(config.hang, baseline_beat, baseline_checkpoint)
        self.queued_since: float | None = now
        self.admitted_since: float | None = None
        self.preemptions: list[str] = []
        self._eviction_seen: str | None = None
        self.first_failure_at: float | None = None
        self.unreadable_since: float | None = None
        self.refused: str | None = None  # the API's permanent refusal of the pods
        self.held: str | None = None  # its refusal that may clear (a quota), for the start timeout
        self.failed_reads = 0
        self.last_read_error = ""

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
        elif kind == "event" and event != "DELETED":
            if found := refusal(obj):
                message, permanent = found
                if permanent:
                    self.refused = message
                else:
                    self.held = message
        self._clocks(now)

    def _workload(self, workload: dict, now: float) -> None:
        self.workload = workload
        facts = workload_facts(workload)
        evicted = facts.evicted
        marker = evicted and f"{evicted.reason}@{evicted.since}"
        if evicted and marker != self._eviction_seen:
            self._eviction_seen = marker
            if facts.requeued:
                if evicted.reason == "Preempted":
                    self.preemptions.append(evicted.message or "preempted")
                log.info("Workload evicted (%s); Kueue requeues it", evicted)
                self.queued_since, self.admitted_since = now, None
                self.tracker = self.tracker.requeued()

    def _clocks(self, now: float) -> None:
        admitted = self.is_admitted()
        if admitted and self.admitted_since is None:
            self.admitted_since, self.queued_since = now, None
        running = [  # a pod being deleted (evicted, preempted) no longer runs this admission
            p
            for p in self.pods.values()
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        if admitted and len(running) >= self.config.nodes:
            self.tracker.running(now)

    def is_admitted(self) -> bool:
        if self.workload is not None:
            return workload_facts(self.workload).admitted
        return not (self.job.get("spec") or {}).get("suspend", False)

    def heartbeat(self, beat: dict | None, now: float) -> None:
        """A heartbeat read succeeded (``beat`` None: there is none yet)."""
        self.unreadable_since = None
        self.tracker.observe(beat, now)

    def checkpoint(self, step: int | None, now: float) -> None:
        """The newest checkpoint step under the run path, as read at ``now``."""
        if self.tracker.observe_checkpoint(step, now):
            log.info("progress: new checkpoint at step %s", step)

    def heartbeat_failed(self, error: BaseException, now: float) -> None:
        """A heartbeat read failed: logged, counted, and timed (see ``verdict``)."""
        self.failed_reads += 1
        self.last_read_error = f"{type(error).__name__}: {error}"
        if self.unreadable_since is None:
            self.unreadable_since = now
        log.warning("heartbeat read failed (%d so far): %s", self.failed_reads, self.last_read_error)

    def _unreadable_deadline(self) -> float | None:
        """When unreadable heartbeats end the run: a hang bound after the reads began to fail, once
        hang detection runs (all pods running)."""
        if self.unreadable_since is None or self.tracker.deadline() is None:
            return None
        return self.unreadable_since + self.tracker.bound()[0]

    # ---- the verdict -------------------------------------------------------------------
    def verdict(self, now: float) -> tuple[Status, str] | None:
        name = self.config.job_name
        if condition(self.job, "Complete"):
            return Status.SUCCEEDED, f"Job {name} completed"
        failed = condition(self.job, "Failed")
        if failed:
            return Status.FAILED, f"Job {name} failed ({failed.get('reason')}: {failed.get('message', '')})"
        if self.first_failure_at is not None and now >= self.first_failure_at + FAILURE_SETTLE_S:
            bad = sorted(n for n, p in self.pods.items() if pod_failed(p))
            return Status.FAILED, f"pod(s) {', '.join(bad)} of Job {name} failed"
        if self.job_gone:
            return Status.JOB_MISSING, f"Job {name} was deleted while the run was being followed"
        if self.refused:
            return Status.PODS_REFUSED, (
                f"the API refuses the pods of Job {name}: {self.refused}; change what the run asks for, or "
                "the namespace's Pod Security level, quota or admission policy"
            )
        facts = workload_facts(self.workload) if self.workload is not None else None
        if facts and facts.deactivated_by == BY_KUEUE:
            return Status.KUEUE_DEACTIVATED, deactivation_message(facts)
        if facts and facts.deactivated_by == BY_USER:
            return Status.DEACTIVATED, deactivation_message(facts)
        if facts and facts.finished:
            return Status.FAILED, f"Workload finished ({facts.finished})"
        if facts and facts.pending and not facts.admitted and (never := never_admits(facts.pending.message)):
            queue = f"LocalQueue {self.config.namespace}/{(self.workload.get('spec') or {}).get('queueName')}"
            return Status.NEVER_ADMITTED, (
                f"Kueue can never admit Workload {facts.name} as its queue and the run's request stand "
                f"(QuotaReserved=False, {facts.pending}): {never.fix(queue)}"
            )
        if self.queued_since is not None and self.config.admission_timeout is not None:
            if now >= self.queued_since + self.config.admission_timeout:
                return Status.ADMISSION_TIMEOUT, (
                    f"not admitted by Kueue within {self.config.admission_timeout:g}s "
                    f"({self._pending_reason()}); raise the queue's quota or claim nodes for it"
                )
        if self.admitted_since is not None and self.tracker.deadline() is None:
            if now >= self.admitted_since + self.config.start_timeout:
                running = sum(
                    1 for p in self.pods.values() if (p.get("status") or {}).get("phase") == "Running"
                )
                held = f"; the API last refused a pod: {self.held}" if self.held else ""
                return Status.START_TIMEOUT, (
                    f"admitted, but only {running} of {self.config.nodes} pods running after "
                    f"{self.config.start_timeout:g}s{held}"
                )
        if self.unreadable_since is not None:  # no progress can be judged without the heartbeat
            deadline = self._unreadable_deadline()
            if deadline is not None and now >= deadline:
                return Status.HEARTBEAT_UNREADABLE, (
                    f"heartbeat unreadable for {now - self.unreadable_since:.1f}s, longer than the hang "
                    f"bound ({self.failed_reads} failed reads; last: {self.last_read_error}); check the "
                    "AWS connection's endpoint and credentials for the run path"
                )
            return None
        if hung := self.tracker.hung(now):
            return Status.HANG, f"hang: {hung}"
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
        if (deadline := self._unreadable_deadline()) is not None:
            candidates.append(deadline)
        return min(candidates)

    def _pending_reason(self) -> str:
        if self.workload is None:
            return "no Workload yet"
        return str(workload_facts(self.workload).pending or "pending")


def read_heartbeat(store: CheckpointStore, run_uri: str) -> dict | None:
    """The run's ``heartbeat.json`` (None while there is none); read errors and a malformed heartbeat
    are raised (``trainops.checkpoints.helper.read_heartbeat``; the trainer's clock is compared only
    with its own earlier heartbeats here, so no skew check)."""
    from trainops.checkpoints import helper
    from trainops.checkpoints.uri import S3Uri

    return helper.read_heartbeat(store, S3Uri.parse(run_uri, field="run_uri"))


def newest_checkpoint_step(store: CheckpointStore, run_uri: str) -> int | None:
    """The highest step among the run path's checkpoint directories (one LIST; None while none)."""
    from trainops.checkpoints.formats.base import step_from_name
    from trainops.checkpoints.uri import S3Uri

    names, _ = store.list_dir(S3Uri.parse(run_uri, field="run_uri"))
    return max((step for name in names if (step := step_from_name(name)) is not None), default=None)


def watched(api, namespace: str, job_name: str, job_uid: str, workloads: Kind) -> list[Resource]:
    """The Job, its pods, its Kueue Workload (``workloads``: the kind at the served version) and its
    FailedCreate events, as watchable collections (``api``: a ``kubernetes_asyncio`` ApiClient)."""
    return [
        collection(api, "job", JOBS, namespace, fields=f"metadata.name={job_name}"),
        collection(api, "pod", PODS, namespace, labels=f"{JOB_NAME_LABEL}={job_name}"),
        collection(api, "workload", workloads, namespace, labels=f"{KUEUE_JOB_UID_LABEL}={job_uid}"),
        collection(
            api, "event", EVENTS, namespace, fields=f"involvedObject.uid={job_uid},reason=FailedCreate"
        ),
    ]


AsyncClient = Callable[[], AbstractAsyncContextManager]  # () -> a kubernetes_asyncio ApiClient


class RunFollower:
    """Follows one attempt: ``cluster`` for reads and the stop, ``async_client`` for the watches,
    ``store`` for the heartbeat."""

    def __init__(
        self,
        config: FollowConfig,
        cluster: GangCluster,
        async_client: AsyncClient,
        store: CheckpointStore,
        clock: Callable[[], float] = time.time,
    ):
        self.config, self.cluster, self.async_client, self.store = config, cluster, async_client, store
        self.clock = clock

    async def follow(self) -> Outcome:
        config = self.config
        job = await asyncio.to_thread(self.cluster.read_job, config.namespace, config.job_name)
        if job is None:
            return Outcome(
                Status.JOB_MISSING,
                f"Job {config.namespace}/{config.job_name} does not exist",
                config.job_name,
            )
        try:
            baseline, unread = await asyncio.to_thread(read_heartbeat, self.store, config.run_uri), None
        except Exception as error:  # counted below; without a baseline every heartbeat counts as new
            baseline, unread = None, error
        checkpoint = await self._checkpoint_step()
        workloads = await asyncio.to_thread(self.cluster.workload_kind)
        state = RunState(config, job, baseline, self.clock(), checkpoint)
        if unread is not None:
            state.heartbeat_failed(unread, self.clock())
        async with self.async_client() as api:
            queue: asyncio.Queue = asyncio.Queue()
            tasks = [
                asyncio.create_task(self._pump(resource, queue))
                for resource in watched(
                    api, config.namespace, config.job_name, job["metadata"]["uid"], workloads
                )
            ]
            tasks.append(asyncio.create_task(self._beats(queue, state)))
            try:
                return await self._loop(state, queue)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, state: RunState, queue: asyncio.Queue) -> Outcome:
        while True:
            now = self.clock()
            if verdict := state.verdict(now):
                if verdict[0] is Status.FAILED:
                    await self._refresh(state)
                    now = self.clock()
                    verdict = state.verdict(now) or verdict
                status, message = verdict
                outcome = Outcome(
                    status,
                    message,
                    self.config.job_name,
                    pods=[slim_pod(p) for p in state.pods.values()],
                    preemptions=state.preemptions,
                    heartbeat=dict(state.tracker.last) if state.tracker.last else None,
                    seen_at=state.first_failure_at or now,
                )
                return outcome
            try:
                item = await asyncio.wait_for(queue.get(), timeout=max(0.01, state.next_deadline(now) - now))
            except TimeoutError:
                continue
            if isinstance(item, BaseException):
                raise item
            kind, event, obj = item
            if kind == "checkpoint":
                state.checkpoint(obj, self.clock())
            elif kind != "heartbeat":
                state.apply(kind, event, obj, self.clock())
            elif event == "ERROR":
                state.heartbeat_failed(obj, self.clock())
            else:
                state.heartbeat(obj, self.clock())

    async def _refresh(self, state: RunState) -> None:
        """Read the Job and its pods again before a failure is judged on them.  The watches deliver
        them and the Workload on separate streams, so one can lag another: Kueue marks the Workload
        Finished once the Job has completed, and the pods fail before their Job does; on a follow that
        starts late, the Job read at the start may already be Failed before any pod was listed."""
        namespace, name = self.config.namespace, self.config.job_name
        job = await asyncio.to_thread(self.cluster.read_job, namespace, name)
        pods = await asyncio.to_thread(self.cluster.job_pods, namespace, name)
        now = self.clock()
        state.apply("job", "DELETED" if job is None else "MODIFIED", job or state.job, now)
        for pod in pods:
            state.apply("pod", "MODIFIED", pod, now)

    async def _pump(self, resource: Resource, queue: asyncio.Queue) -> None:
        try:
            async for event, obj in watch(resource):
                queue.put_nowait((resource.kind, event, obj))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a non-transient API error ends the follow with that error
            queue.put_nowait(error)

    async def _checkpoint_step(self) -> int | None:
        """``newest_checkpoint_step``; a failed listing is logged and reads as no new progress."""
        try:
            return await asyncio.to_thread(newest_checkpoint_step, self.store, self.config.run_uri)
        except Exception as error:
            log.warning("listing the run's checkpoints failed: %s: %s", type(error).__name__, error)
            return None

    async def _beats(self, queue: asyncio.Queue, state: RunState) -> None:
        last, failing, polls = None, False, 0
        while True:
            polls += 1
            if polls % CHECKPOINT_POLLS == 0 and not state.tracker.by_heartbeat:
                queue.put_nowait(("checkpoint", "MODIFIED", await self._checkpoint_step()))
            try:
                beat = await asyncio.to_thread(read_heartbeat, self.store, self.config.run_uri)
            except Exception as error:  # surfaced: RunState logs, counts and times it
                failing = True
                queue.put_nowait(("heartbeat", "ERROR", error))
            else:
                if beat != last or failing:
                    last, failing = beat, False
                    queue.put_nowait(("heartbeat", "MODIFIED", beat))
            await asyncio.sleep(self.config.heartbeat_poll)
