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

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from crash_resume import (
    ARGS,
    CHECKPOINT_EVERY,
    NAMESPACE,
    Crash,
    Timeline,
    claim_idle_nodes,
    crash_first_attempt,
    line,
)
from results import record

BENCH_DAGS = Path(__file__).resolve().parent / "dags"


@dataclass
class Side:
    crash: Crash
    resumed_at: float
    resumed_job: str
    state: str
    history: list[dict]  # the train task's XCom: its attempts


def run_side(dev, timeline: Timeline, dag, run_uri: str) -> Side:
    from trainops_devcluster import airflow_home

    since = time.time()
    crash = crash_first_attempt(
        timeline,
        run_uri,
        since,
        inject_xid=lambda node: dev.inject("xid", node, code=79),
        read_log=lambda pod: dev.logs.read(NAMESPACE, pod),
    )
    dag_run = dag.test(run_conf={"run_uri": run_uri, "args": ARGS})
    if not crash.done.is_set():
        raise RuntimeError(f"{dag.dag_id}: the run ended ({dag_run.state}) before the fault was injected")
    resumed = timeline.jobs_after(crash.time)
    if not resumed:
        raise RuntimeError(f"{dag.dag_id}: no Job was created after the crash (run {dag_run.state})")
    if crash.resumed_step is None:
        raise RuntimeError(f"{dag.dag_id}: the next attempt's rank 0 never logged its start step")
    trained = airflow_home.xcom_value(dag_run, "train") or {}
    return Side(crash, resumed[0][0], resumed[0][1], str(dag_run.state), trained.get("history", []))


def main() -> int:
    from trainops_devcluster import airflow_home

    home = Path(tempfile.mkdtemp(prefix="bench-training-"))
    log = Path(os.environ.get("BENCH_TRAINING_LOG") or home / "dag-runs.log")  # set it to keep the logs
    airflow_home.configure(home / "airflow", {"bench-dags": BENCH_DAGS})  # before Airflow is imported
    try:
        with airflow_home.output_to(log):
            results = measure(home)
    except BaseException:
        print(f"bench training: error; logs kept in {log}", file=sys.stderr)
        raise
    shutil.rmtree(home, ignore_errors=True)
    for name, figures, ratio, target, ok, values in results:
        line(name, figures, ratio, target, ok)
        record(name, passed=ok, ratio=round(ratio, 3), target=target, **values)
    return 0 if all(result[4] for result in results) else 1


def measure(home: Path) -> list[tuple[str, str, float, str, bool, dict]]:
    """Both DAG runs; the benchmark lines' fields (and their figures as numbers)."""
    from kubernetes import config
    from trainops_devcluster import airflow_home
    from trainops_devcluster.cluster import DevCluster
    from trainops_devcluster.local_s3 import local_s3

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
        claim_idle_nodes(api, "bench/training")
        timeline = Timeline()
        dev.store.add_listener(lambda event: timeline.record(event.resource, event.type, event.object))

        ours = run_side(dev, timeline, ours_dag, "s3://bench-training/runs/trainops/")
        base = run_side(dev, timeline, base_dag, "s3://bench-training/runs/provider/")

        ours_seen = ours.history[0]["ended_at"] - timeline.pod_failed[ours.crash.pod]
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
            {"trainops_s": round(ours_seen, 3), "provider_trigger_s": round(base_seen, 3)},
        ),
        (
            "training-crash-to-resumed-job",
            f"trainops={ours_latency:.2f}s provider={base_latency:.2f}s "
            f"retry_delay={ours_task.retry_delay.total_seconds():g}s "
            f"provider_poll={base_task.job_poll_interval:g}s runs={ours.state}/{base.state}",
            speedup,
            ">=5",
            speedup >= 5 and runs_ok,
            {
                "trainops_s": round(ours_latency, 3),
                "provider_s": round(base_latency, 3),
                "runs": f"{ours.state}/{base.state}",
            },
        ),
        (
            "training-steps-lost-per-crash",
            f"trainops={ours_lost} from_scratch={ours.crash.step} provider_retry={base_lost} "
            f"checkpoint_interval={CHECKPOINT_EVERY}",
            ours_lost / max(ours.crash.step, 1),
            f"lost<={CHECKPOINT_EVERY}",
            ours_lost <= CHECKPOINT_EVERY,
            {"trainops_steps": ours_lost, "from_scratch_steps": ours.crash.step, "provider_steps": base_lost},
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
