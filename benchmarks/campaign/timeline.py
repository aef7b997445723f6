"""What each run held and did, and when, as the cluster and the bucket showed it: the input of ``gpu_time``.

``Timeline`` listens to the devcluster's store (nothing between two polls is missed): which run holds
each node from when to when, each Job's creation, admission, pods running and end.  ``Heartbeats``
samples one run's heartbeat (each sample carries the trainer's own write time and the step it started
from).  ``run_times`` puts them together for one run of one policy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from benchmarks.campaign.gpu_time import AttemptTimes, RunTimes
from trainops.checkpoints.store import CheckpointStore
from trainops.kube.nodes import holder_of
from trainops.training.follow import read_heartbeat

NAMESPACE = "training"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
WORKLOADS = "workloads.kueue.x-k8s.io"


@dataclass
class JobSeen:
    name: str
    created: float
    labels: dict
    parallelism: int
    annotations: dict = field(default_factory=dict)  # as last seen
    admitted: float | None = None
    running: dict[str, float] = field(default_factory=dict)  # pod -> first seen Running
    failed: dict[str, float] = field(default_factory=dict)  # pod -> first seen Failed
    nodes: dict[str, str] = field(default_factory=dict)  # pod -> the node it was bound to
    ended: float | None = None  # the Job Complete or Failed


class Timeline:
    """Store listener: node holds by holder, training Jobs, their Workloads and pods."""

    def __init__(self, store) -> None:
        self._lock = threading.Lock()
        self.holds: list[list] = []  # [holder, node, from, to or None]
        self.jobs: dict[str, JobSeen] = {}
        self._open: dict[str, list] = {}
        for node in store.list("nodes")[0]:
            if holder := holder_of(node["metadata"].get("annotations")):
                self._hold(node["metadata"]["name"], holder, time.time())
        store.add_listener(self)

    def __call__(self, event) -> None:  # under the store lock: quick, and never raises
        try:
            now, obj = time.time(), event.object
            with self._lock:
                if event.resource == "nodes":
                    self._node(obj, now)
                elif obj["metadata"].get("namespace") != NAMESPACE:
                    return
                elif event.resource == "jobs.batch":
                    self._job(obj, now)
                elif event.resource == "pods" and event.type != "DELETED":
                    self._pod(obj, now)
                elif event.resource == WORKLOADS:
                    self._workload(obj, now)
        except Exception:  # noqa: BLE001,S110 - a missed mark shows as a gap in the account, never a broken store
            pass

    def _hold(self, node: str, holder: str, now: float) -> None:
        span = [holder, node, now, None]
        self.holds.append(span)
        self._open[node] = span

    def _node(self, node: dict, now: float) -> None:
        name, holder = node["metadata"]["name"], holder_of(node["metadata"].get("annotations"))
        span = self._open.get(name)
        if span is not None and span[0] != holder:
            span[3] = now
            del self._open[name]
            span = None
        if holder and span is None:
            self._hold(name, holder, now)

    def _job(self, job: dict, now: float) -> None:
        name = job["metadata"]["name"]
        seen = self.jobs.get(name)
        if seen is None:
            spec = job.get("spec") or {}
            seen = self.jobs[name] = JobSeen(
                name, now, dict(job["metadata"].get("labels") or {}), int(spec.get("parallelism") or 1)
            )
        seen.annotations = dict(job["metadata"].get("annotations") or {})
        conditions = (job.get("status") or {}).get("conditions") or []
        if seen.ended is None and any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
        ):
            seen.ended = now

    def _pod(self, pod: dict, now: float) -> None:
        seen = self.jobs.get((pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, ""))
        phase, name = (pod.get("status") or {}).get("phase"), pod["metadata"]["name"]
        if seen is not None and pod["spec"].get("nodeName"):
            seen.nodes[name] = pod["spec"]["nodeName"]
        if seen is not None and phase == "Running":
            seen.running.setdefault(name, now)
        elif seen is not None and phase == "Failed":
            seen.failed.setdefault(name, now)

    def _workload(self, workload: dict, now: float) -> None:
        if "admission" not in (workload.get("status") or {}):
            return
        for ref in workload["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job" and (seen := self.jobs.get(ref.get("name", ""))) is not None:
                if seen.admitted is None:
                    seen.admitted = now

    def spans(self, holder: str, until: float) -> dict[str, list[tuple[float, float]]]:
        """Each node ``holder`` held: [(from, to)] (a hold still open ends at ``until``)."""
        with self._lock:
            found: dict[str, list[tuple[float, float]]] = {}
            for who, node, start, end in self.holds:
                if who == holder:
                    found.setdefault(node, []).append((start, until if end is None else end))
            return found

    def jobs_since(self, since: float, match: Callable[[JobSeen], bool]) -> list[JobSeen]:
        """The training Jobs created since ``since`` that ``match``, oldest first."""
        with self._lock:
            found = [j for j in self.jobs.values() if j.created >= since and match(j)]
        return sorted(found, key=lambda j: j.created)


class Heartbeats(threading.Thread):
    """Samples one run's heartbeat (a clean S3 client of its own): time written -> (step, start step)."""

    def __init__(self, run_uri: str, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.run_uri, self.every, self.store = run_uri, every, CheckpointStore()
        self.samples: dict[float, tuple[int, int]] = {}
        self.save_s: list[float] = []  # each save's last_save_s seen
        self.stopped = threading.Event()

    def step(self) -> int:
        """The newest heartbeat's step (-1: none yet)."""
        samples = self.samples.copy()
        return samples[max(samples)][0] if samples else -1

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                beat = read_heartbeat(self.store, self.run_uri)
            except Exception:  # noqa: BLE001,S112 - a failed read: the next sample comes soon
                continue
            if beat and float(beat["time"]) not in self.samples:
                self.samples[float(beat["time"])] = (int(beat["step"]), int(beat.get("start_step") or 0))
                if "last_save_s" in beat:
                    self.save_s.append(float(beat["last_save_s"]))

    def between(self, start: float, end: float | None) -> list[tuple[float, int, int]]:
        return sorted(
            (t, s, first)
            for t, (s, first) in self.samples.copy().items()
            if t >= start and (end is None or t < end)
        )


def run_times(
    timeline: Timeline,
    holder: str,
    jobs: list[JobSeen],
    beats: Heartbeats,
    *,
    gang_gpus: int,
    succeeded: bool,
    final_step: int,
    faults: list[float],
    detected,
    dead: list[tuple[float, float]] = (),
    slow: Mapping[str, float] | None = None,
) -> RunTimes:
    """One run of one policy: ``jobs`` its attempts, ``faults`` when faults hit it (a harness's marks),
    ``detected(job) -> float | None`` when the policy saw that attempt end, ``slow``: slowed nodes' GPU
    speed (an attempt with a pod on one trains at that speed)."""
    now = time.time()
    attempts = []
    for job, after in zip(jobs, [*jobs[1:], None], strict=False):
        own = beats.between(job.created, after.created if after else None)
        ran = sorted(job.running.values())
        failed = None
        if after is not None or not succeeded:
            hit = [t for t in faults if job.created <= t < (after.created if after else now)]
            failed = min([*hit, *job.failed.values()], default=job.ended)
        attempts.append(
            AttemptTimes(
                job.name,
                job.created,
                start_step=own[0][2] if own else 0,
                admitted=job.admitted,
                running=ran[job.parallelism - 1] if len(ran) >= job.parallelism else None,
                beats=[(t, s) for t, s, _ in own],
                failed_at=failed,
                detected=detected(job) if failed is not None else None,
                speed=min([(slow or {}).get(n, 1.0) for n in job.nodes.values()], default=1.0),
            )
        )
    return RunTimes(
        timeline.spans(holder, now),
        attempts,
        gang_gpus=gang_gpus,
        succeeded=succeeded,
        final_step=final_step,
        dead=list(dead),
    )
