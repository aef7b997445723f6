"""Crash-to-resume on the devcluster, as two real Airflow DAG runs (``dag.test()``) in one process:

- trainops: ``GangTrainingOperator`` (``benchmarks/dags/bench_training_trainops.py``);
- baseline: the cncf provider's ``KubernetesJobOperator(deferrable=True, wait_until_job_complete=True)``
  with an equivalent Indexed Job and Airflow retries (``benchmarks/dags/bench_training_provider.py``).

Same devcluster, same claimed nodes and queue quota, same trainer and arguments, same retries and
``retry_delay`` (checked here), same fault: XID 79 on a node of the first attempt's gang once the
run's heartbeat reaches step 50.  Times come from the devcluster itself: a store listener stamps
pod failures, Job failures and Job creations, and the API audit log shows when the provider's
trigger polled.

The provider keeps its defaults (``job_poll_interval=10``) except ``discover_pods_retry_number`` (see
its DAG).  ``BENCH_TRAINING_LOG=<file>`` keeps the DAG runs' logs.

Lines: failure seen after the pod failed; crash -> next attempt's Job created (ratio vs baseline);
training steps lost per crash (vs a restart from scratch).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DAGS = Path(__file__).resolve().parent / "dags"
CRASH_AT_STEP = 50
CHECKPOINT_EVERY = 20
ARGS = ["--steps", "140", "--checkpoint-every", str(CHECKPOINT_EVERY), "--step-seconds", "0.02"]
NAMESPACE = "training"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
START_STEP = re.compile(r"resumed from \S+ \(step (\d+)\)|fresh start at step (0)")


def line(name: str, figures: str, ratio: float, target: str, ok: bool) -> None:
    print(f"bench {name}: {figures} ratio={ratio:.2f} target={target} {'PASS' if ok else 'FAIL'}", flush=True)


class Timeline:
    """Store listener: when each Job was created and failed, and when each pod failed (wall clock)."""

    def __init__(self) -> None:
        self.jobs_created: list[tuple[float, str]] = []
        self.job_failed: dict[str, float] = {}
        self.pod_failed: dict[str, float] = {}

    def __call__(self, event) -> None:  # runs under the store lock: record only
        now, obj = time.time(), event.object
        name = obj["metadata"]["name"]
        if event.resource == "jobs.batch" and obj["metadata"].get("namespace") == NAMESPACE:
            if event.type == "ADDED":
                self.jobs_created.append((now, name))
            elif name not in self.job_failed and any(
                c.get("type") == "Failed" and c.get("status") == "True"
                for c in (obj.get("status") or {}).get("conditions") or []
            ):
                self.job_failed[name] = now
        elif event.resource == "pods" and (obj.get("status") or {}).get("phase") == "Failed":
            self.pod_failed.setdefault(name, now)

    def jobs_after(self, since: float) -> list[tuple[float, str]]:
        return [(t, name) for t, name in list(self.jobs_created) if t >= since]


@dataclass
class Crash:
    time: float = 0.0
    step: int = 0
    job: str = ""
    pod: str = ""
    node: str = ""
    resumed_step: int | None = None  # where the next attempt's rank 0 started (its log)
    done: threading.Event = field(default_factory=threading.Event)


def crash_first_attempt(dev, timeline: Timeline, run_uri: str, since: float) -> Crash:
    """On a thread: once the run's heartbeat reaches CRASH_AT_STEP, XID 79 on the node of rank 0 of
    the first Job created after ``since``; then read the step the next attempt's rank 0 starts from."""
    from trainops.checkpoints.store import CheckpointStore
    from trainops.training.follow import read_heartbeat

    crash, store = Crash(), CheckpointStore()

    def rank0(since: float, phase: str | None = "Running"):
        jobs = timeline.jobs_after(since)
        if not jobs:
            return None
        pods, _ = dev.store.list("pods", NAMESPACE)
        return next(
            (
                p
                for p in pods
                if p["metadata"].get("labels", {}).get(JOB_NAME_LABEL) == jobs[0][1]
                and p["metadata"].get("labels", {}).get(INDEX_LABEL) == "0"
                and phase in (None, (p.get("status") or {}).get("phase"))
            ),
            None,
        )

    def started_at(pod) -> int | None:
        match = START_STEP.search(dev.logs.read(NAMESPACE, pod["metadata"]["name"]) if pod else "")
        return None if match is None else int(match.group(1) or match.group(2))

    def loop():
        while True:
            beat = read_heartbeat(store, run_uri) or {}
            pod = rank0(since) if beat.get("step", 0) >= CRASH_AT_STEP else None
            if pod is not None:
                break
            time.sleep(0.02)
        crash.step, crash.job, crash.pod = (
            beat["step"],
            pod["metadata"]["labels"][JOB_NAME_LABEL],
            pod["metadata"]["name"],
        )
        crash.node = pod["spec"]["nodeName"]
        crash.time = time.time()
        dev.inject("xid", crash.node, code=79)
        crash.done.set()
        while crash.resumed_step is None:
            time.sleep(0.02)
            crash.resumed_step = started_at(rank0(crash.time, phase=None))

    threading.Thread(target=loop, name="crash", daemon=True).start()
    return crash


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's stdout/stderr (Airflow's task logs included) to ``path`` meanwhile."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as out:
        os.dup2(out.fileno(), 1), os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


@dataclass
class Side:
    crash: Crash
    resumed_at: float
    resumed_job: str
    state: str


def run_side(dev, timeline: Timeline, dag, run_uri: str, conf: dict) -> Side:
    since = time.time()
    crash = crash_first_attempt(dev, timeline, run_uri, since)
    dag_run = dag.test(run_conf={"run_uri": run_uri, "args": ARGS, **conf})
    if not crash.done.is_set():
        raise RuntimeError(f"{dag.dag_id}: the run ended ({dag_run.state}) before the fault was injected")
    resumed = timeline.jobs_after(crash.time)
    if not resumed:
        raise RuntimeError(f"{dag.dag_id}: no Job was created after the crash (run {dag_run.state})")
    if crash.resumed_step is None:
        raise RuntimeError(f"{dag.dag_id}: the next attempt's rank 0 never logged its start step")
    return Side(crash, resumed[0][0], resumed[0][1], str(dag_run.state))


def main() -> int:
    from trainops_devcluster import airflow_home

    home = Path(tempfile.mkdtemp(prefix="bench-training-"))
    log = Path(os.environ.get("BENCH_TRAINING_LOG") or home / "dag-runs.log")  # set it to keep the logs
    airflow_home.configure(home / "airflow", {"bench-dags": BENCH_DAGS})  # before Airflow is imported
    try:
        with output_to(log):
            results = measure(home)
    except BaseException:
        print(f"bench training: error; logs kept in {log}", file=sys.stderr)
        raise
    shutil.rmtree(home, ignore_errors=True)
    for result in results:
        line(*result)
    return 0 if all(ok for *_, ok in results) else 1


def measure(home: Path) -> list[tuple[str, str, float, str, bool]]:
    """Both DAG runs; the benchmark lines' fields."""
    from kubernetes import client, config
    from trainops_devcluster import airflow_home
    from trainops_devcluster.cluster import DevCluster
    from trainops_devcluster.local_s3 import local_s3

    from trainops.capacity.procedure import claim
    from trainops.kube.client import Kube

    with local_s3() as s3, DevCluster(nodes=16, gpus_per_node=8, process_env=s3.env()) as dev:
        os.environ.update(s3.env())
        os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = s3.airflow_connection_uri()
        os.environ["KUBECONFIG"] = str(dev.kubeconfig)
        os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = airflow_home.kubernetes_connection(dev.kubeconfig)
        s3.create_bucket("bench-training")
        airflow_home.migrate()
        ours_dag = airflow_home.load_dag("bench_training_trainops", BENCH_DAGS)
        base_dag = airflow_home.load_dag("bench_training_provider", BENCH_DAGS)
        ours_task, base_task = ours_dag.get_task("train"), base_dag.get_task("train")
        if (ours_task.retries, ours_task.retry_delay) != (base_task.retries, base_task.retry_delay):
            raise ValueError("the two benchmark DAGs must use the same retries and retry_delay")
        dev.wait_until_settled()
        api = config.new_client_from_config(config_file=str(dev.kubeconfig))
        core = client.CoreV1Api(api)
        busy = {p.spec.node_name for p in core.list_pod_for_all_namespaces().items}
        idle = sorted(n.metadata.name for n in core.list_node().items if n.metadata.name not in busy)
        # both sides get the same quota and nodes (the provider's operator cannot claim capacity)
        claim(Kube(api), "bench/training", idle, cluster_queue="training")
        timeline = Timeline()
        dev.store.add_listener(timeline)

        timings = home / "trainops-timings.jsonl"
        ours = run_side(
            dev, timeline, ours_dag, "s3://bench-training/runs/trainops/", {"timings": str(timings)}
        )
        base = run_side(dev, timeline, base_dag, "s3://bench-training/runs/provider/", {})

        seen_at = json.loads(timings.read_text().splitlines()[0])["seen_at"]
        ours_seen = seen_at - timeline.pod_failed[ours.crash.pod]
        base_failed = timeline.job_failed[base.crash.job]
        polled = min(
            e["time"]
            for e in dev.server.audit.entries()
            if e["method"] == "GET" and f"/jobs/{base.crash.job}" in e["path"] and e["time"] >= base_failed
        )
        base_seen = polled - timeline.pod_failed[base.crash.pod]
        ours_lost = ours.crash.step - ours.crash.resumed_step
        base_lost = base.crash.step - base.crash.resumed_step
        api.close()

    ours_latency, base_latency = ours.resumed_at - ours.crash.time, base.resumed_at - base.crash.time
    speedup = base_latency / ours_latency
    runs_ok = ours.state == base.state == "success"
    return [
        (
            "training-failure-seen",
            f"trainops={ours_seen:.3f}s provider_trigger={base_seen:.2f}s",
            base_seen / max(ours_seen, 1e-3),
            "seen<=1s",
            ours_seen <= 1.0,
        ),
        (
            "training-crash-to-resumed-job",
            f"trainops={ours_latency:.2f}s provider={base_latency:.2f}s "
            f"retry_delay={ours_task.retry_delay.total_seconds():g}s "
            f"provider_poll={base_task.job_poll_interval:g}s runs={ours.state}/{base.state}",
            speedup,
            ">=5",
            speedup >= 5 and runs_ok,
        ),
        (
            "training-steps-lost-per-crash",
            f"trainops={ours_lost} from_scratch={ours.crash.step} provider_retry={base_lost} "
            f"checkpoint_interval={CHECKPOINT_EVERY}",
            ours_lost / max(ours.crash.step, 1),
            f"lost<={CHECKPOINT_EVERY}",
            ours_lost <= CHECKPOINT_EVERY,
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
