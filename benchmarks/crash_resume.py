"""What the crash-to-resume benchmarks share (``bench_training.py`` under ``dag.test()``,
``bench_services.py`` on the real Airflow services): the trainer's arguments, the result line, the
timeline of Jobs and pods, the fault, and the nodes both sides train on.

The timeline is fed by whatever sees the cluster's changes: the devcluster's store listener in
process, or a watch through the Kubernetes API when the devcluster is a service of its own.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CRASH_AT_STEP = 50
CHECKPOINT_EVERY = 20
ARGS = ["--steps", "140", "--checkpoint-every", str(CHECKPOINT_EVERY), "--step-seconds", "0.02"]
NAMESPACE = "training"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
START_STEP = re.compile(r"resumed from \S+ \(step (\d+)\)|fresh start at step (0)")


def line(name: str, figures: str, ratio: float, target: str, ok: bool) -> None:
    print(f"bench {name}: {figures} ratio={ratio:.2f} target={target} {'PASS' if ok else 'FAIL'}", flush=True)


def phase(obj: dict) -> str | None:
    return (obj.get("status") or {}).get("phase")


class Timeline:
    """When each training Job was created and failed, and when each pod failed and ran (wall clock);
    the pods as last seen.  ``record(resource, type, obj)``: ``resource`` is ``jobs.batch`` or ``pods``."""

    def __init__(self) -> None:
        self.jobs_created: dict[str, float] = {}
        self.job_failed: dict[str, float] = {}
        self.pod_failed: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.pods: dict[str, dict] = {}

    def record(self, resource: str, type_: str, obj: dict) -> None:  # may run under a lock: record only
        now, name = time.time(), obj["metadata"]["name"]
        if obj["metadata"].get("namespace") != NAMESPACE:
            return
        if resource == "jobs.batch":
            if type_ == "ADDED":  # a watch that lists again sends ADDED again: the first one counts
                self.jobs_created.setdefault(name, now)
            elif name not in self.job_failed and any(
                c.get("type") == "Failed" and c.get("status") == "True"
                for c in (obj.get("status") or {}).get("conditions") or []
            ):
                self.job_failed[name] = now
        elif resource == "pods":
            self.pods[name] = obj
            if phase(obj) == "Failed":
                self.pod_failed.setdefault(name, now)
            elif phase(obj) == "Running":
                self.pod_running.setdefault(name, now)

    def jobs_after(self, since: float) -> list[tuple[float, str]]:
        return sorted((t, name) for name, t in list(self.jobs_created.items()) if t >= since)

    def job_pods(self, job: str) -> list[dict]:
        return [
            p for p in list(self.pods.values()) if p["metadata"].get("labels", {}).get(JOB_NAME_LABEL) == job
        ]

    def all_running(self, job: str, pods: int) -> float | None:
        """When the last of the Job's ``pods`` pods first ran (None: not all have yet)."""
        times = [self.pod_running.get(p["metadata"]["name"]) for p in self.job_pods(job)]
        ran = [t for t in times if t is not None]
        return max(ran) if len(ran) >= pods else None


@dataclass
class Crash:
    time: float = 0.0
    step: int = 0
    job: str = ""
    pod: str = ""
    node: str = ""
    resumed_step: int | None = None  # where the next attempt's rank 0 started (its log)
    done: threading.Event = field(default_factory=threading.Event)


def crash_first_attempt(
    timeline: Timeline,
    run_uri: str,
    since: float,
    inject_xid: Callable[[str], object],
    read_log: Callable[[str], str],
    ready: Callable[[], bool] = lambda: True,
) -> Crash:
    """On a thread: once the run's heartbeat reaches CRASH_AT_STEP and ``ready()``, XID 79
    (``inject_xid(node)``) on the node of rank 0 of the first Job created after ``since``; then read
    (``read_log(pod)``) the step the next attempt's rank 0 starts from."""
    from trainops.checkpoints.store import CheckpointStore
    from trainops.training.follow import read_heartbeat

    crash, store = Crash(), CheckpointStore()

    def rank0(since: float, running: bool = True) -> dict | None:
        jobs = timeline.jobs_after(since)
        pods = timeline.job_pods(jobs[0][1]) if jobs else []
        return next(
            (
                p
                for p in pods
                if p["metadata"].get("labels", {}).get(INDEX_LABEL) == "0"
                and (not running or phase(p) == "Running")
            ),
            None,
        )

    def started_at(pod: dict | None) -> int | None:
        match = START_STEP.search(read_log(pod["metadata"]["name"]) if pod else "")
        return None if match is None else int(match.group(1) or match.group(2))

    def loop() -> None:
        while True:
            beat = read_heartbeat(store, run_uri) or {}
            pod = rank0(since) if ready() and beat.get("step", 0) >= CRASH_AT_STEP else None
            if pod is not None:
                break
            time.sleep(0.02)
        crash.step, crash.job = beat["step"], pod["metadata"]["labels"][JOB_NAME_LABEL]
        crash.pod, crash.node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        crash.time = time.time()
        inject_xid(crash.node)
        crash.done.set()
        while crash.resumed_step is None:
            time.sleep(0.05)
            crash.resumed_step = started_at(rank0(crash.time, running=False))

    threading.Thread(target=loop, name="crash", daemon=True).start()
    return crash


def claim_idle_nodes(api, run: str) -> list[str]:
    """Claim for ``run`` the GPU nodes no pod runs on, with their queue quota: both sides of a
    benchmark get the same nodes and quota (the provider's operator cannot claim capacity)."""
    from kubernetes import client

    from trainops.capacity.procedure import claim
    from trainops.kube.client import Kube

    core = client.CoreV1Api(api)
    busy = {p.spec.node_name for p in core.list_pod_for_all_namespaces().items}
    idle = sorted(n.metadata.name for n in core.list_node().items if n.metadata.name not in busy)
    claim(Kube(api), run, idle, cluster_queue="training")
    return idle
