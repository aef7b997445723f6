"""Crash-to-resume on the real Airflow services: ``make up``'s stack (PostgreSQL, Redis, a Celery
worker, api-server, scheduler, dag-processor, triggerer, the devcluster, S3) with the benchmark DAGs
(``benchmarks/dags/``), each run triggered through REST API v2 as the UI does:

- trainops: ``GangTrainingOperator`` (its trigger in the triggerer follows the run and resumes it);
- baseline: ``KubernetesJobOperator(deferrable=True, wait_until_job_complete=True)`` and Airflow
  retries with the same ``retry_delay`` (checked through the API).

The fault and the timeline are ``bench_training.py``'s (``crash_resume``): XID 79 on rank 0's node once
the heartbeat reaches step 50, here also only once the try's trigger has run in the triggerer for 5 s
(steady state for both sides; for the provider, half its poll interval after its first poll).  The devcluster is a process of its own here, so the timeline is fed
by a watch on the training namespace's Jobs and pods, and each try's start and end come from the
API (``taskInstances/train/tries``).  The services log to ``<state>/logs`` (named on an error;
``BENCH_SERVICES_KEEP=1`` keeps them).

Line: crash -> the next attempt's pods all Running (ratio vs baseline), with the absolute times and
where they go, each after the crash: the pod failed; for trainops, its trigger saw it and judged it
(attempt 1's ``ended_at``) and began attempt 2 (``began_at``, from the train task's XCom); for the
provider, try 1 ended and try 2 started (retry_delay, scheduler, Celery); then the next Job created
and its pods Running.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from crash_resume import (
    CHECKPOINT_EVERY,
    NAMESPACE,
    Crash,
    Timeline,
    claim_idle_nodes,
    crash_first_attempt,
    line,
)
from results import record

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.services.conftest import TERMINAL, AirflowApi, wait_for  # noqa: E402

BENCH_DAGS = REPO / "benchmarks" / "dags"
# The stack runs each Airflow service as its own ServiceAccount with deploy/rbac.yaml (trainops' needs);
# the baseline's KubernetesJobOperator gets the grants it needs from this manifest.
PROVIDER_RBAC = REPO / "benchmarks" / "provider-rbac.yaml"
OURS, BASE = "bench_training_trainops", "bench_training_provider"
NODES = 2  # per attempt, both DAGs
RUN_TIMEOUT_S = 600
# Slower steps than bench_training's, so that the crash can wait until the try's trigger has run for
# FOLLOWING_S: a crash in steady state (not while the triggerer starts the trigger), half the provider's
# poll interval (job_poll_interval=10) after its first poll, which is its average delay.
ARGS = ["--steps", "400", "--checkpoint-every", str(CHECKPOINT_EVERY), "--step-seconds", "0.1"]
FOLLOWING_S = 5.0


def watch_into(timeline: Timeline, api, stop: threading.Event) -> None:
    """Feed ``timeline`` from watches on the training namespace's Jobs and pods (threads)."""
    from kubernetes import client, watch

    lists = {
        "jobs.batch": client.BatchV1Api(api).list_namespaced_job,
        "pods": client.CoreV1Api(api).list_namespaced_pod,
    }

    def pump(resource: str) -> None:
        stream, version = watch.Watch(), None
        while not stop.is_set():
            try:
                for event in stream.stream(
                    lists[resource], NAMESPACE, resource_version=version, timeout_seconds=30
                ):
                    timeline.record(resource, event["type"], event["raw_object"])
            except Exception:
                if stop.is_set():  # the stack is going down
                    return
                raise
            version = stream.resource_version

    for resource in lists:
        threading.Thread(target=pump, args=(resource,), name=f"watch-{resource}", daemon=True).start()


@dataclass
class Side:
    crash: Crash
    job_created: float  # the next attempt's Job
    running: float  # all of its pods Running
    tries: list[dict]  # REST API: each try's start_date and end_date
    pod_failed: float  # the crashed pod
    state: str
    history: list[dict]  # the train task's XCom (trainops): its attempts


def run_side(airflow: AirflowApi, timeline: Timeline, at, core, dag_id: str, conf: dict) -> Side:
    import requests
    from kubernetes.client.exceptions import ApiException

    def read_log(pod: str) -> str:
        try:
            return core.read_namespaced_pod_log(pod, NAMESPACE)
        except ApiException:  # not started yet
            return ""

    def inject_xid(node: str) -> None:
        answer = requests.post(
            f"{at.devcluster_url}/devcluster/faults/xid", json={"target": node, "code": 79}, timeout=30
        )
        answer.raise_for_status()

    run_id, since, following_since = f"bench-{int(time.time())}", time.time(), []

    def followed() -> bool:
        """The try's trigger has run in the triggerer for FOLLOWING_S (asked through the API)."""
        if not following_since:
            ti = airflow.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/train")
            if ti.status_code == 200 and (ti.json()["trigger"] or {}).get("triggerer_id") is not None:
                following_since.append(time.time())
        return bool(following_since) and time.time() >= following_since[0] + FOLLOWING_S

    crash = crash_first_attempt(timeline, conf["run_uri"], since, inject_xid, read_log, ready=followed)
    answer = airflow.trigger(dag_id, run_id, {"args": ARGS, **conf})
    if answer.status_code != 200:
        raise RuntimeError(f"{dag_id}: trigger refused: {answer.status_code} {answer.text}")
    airflow.follow(dag_id, run_id, lambda run, _: run["state"] in TERMINAL, timeout_s=RUN_TIMEOUT_S)
    state = airflow.run(dag_id, run_id)["state"]
    if not crash.done.is_set():
        raise RuntimeError(f"{dag_id}: the run ended ({state}) before the fault was injected")
    resumed = timeline.jobs_after(crash.time)
    if not resumed:
        raise RuntimeError(f"{dag_id}: no Job was created after the crash (run {state})")
    created, job = resumed[0]
    wait_for(
        lambda: timeline.all_running(job, NODES) is not None, f"{dag_id}: the pods of {job} seen Running"
    )
    wait_for(lambda: crash.resumed_step is not None, f"{dag_id}: the resumed rank 0's start step")
    tries = airflow.ok("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/train/tries")["task_instances"]
    running = timeline.all_running(job, NODES)
    xcom = airflow.call(
        "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/train/xcomEntries/return_value"
    )
    history = (xcom.json()["value"] or {}).get("history", []) if xcom.status_code == 200 else []
    return Side(crash, created, running, tries, timeline.pod_failed[crash.pod], state, history)


def stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def breakdown(side: Side) -> str:
    """Where the crash-to-running time went, each mark relative to the crash."""
    marks = [("pod_failed", side.pod_failed)]
    if len(side.history) > 1:  # trainops: the resume was its trigger's, within try 1
        marks += [("seen", side.history[0]["ended_at"]), ("resumed", side.history[1]["began_at"])]
    else:
        marks += [
            ("try1_end", stamp(side.tries[0]["end_date"])),
            ("try2_start", stamp(side.tries[1]["start_date"])),
        ]
    marks += [("job", side.job_created), ("running", side.running)]
    return ",".join(f"{name}+{at - side.crash.time:.2f}" for name, at in marks)


def measure(at, state: Path) -> list[tuple[str, str, float, str, bool]]:
    from kubernetes import client, config, utils
    from trainops_devcluster.stack_spec import BUCKET, s3_environment

    os.environ.update(s3_environment(at))  # the crash thread reads the heartbeat
    api = config.new_client_from_config(config_file=at.kubeconfig)
    core = client.CoreV1Api(api)
    wait_for(
        lambda: all(p.status.phase == "Running" for p in core.list_pod_for_all_namespaces().items),
        "the devcluster's inference pods Running",
    )
    claim_idle_nodes(api, "bench/services")
    utils.create_from_yaml(api, str(PROVIDER_RBAC))
    airflow = AirflowApi(f"http://127.0.0.1:{at.api_port}")
    for dag_id in (OURS, BASE):
        airflow.unpause(dag_id)
    ours_task, base_task = (airflow.ok("GET", f"/dags/{d}/tasks/train") for d in (OURS, BASE))
    if (ours_task["retries"], ours_task["retry_delay"]) != (base_task["retries"], base_task["retry_delay"]):
        raise ValueError("the two benchmark DAGs must use the same retries and retry_delay")

    timeline, stop = Timeline(), threading.Event()
    watch_into(timeline, api, stop)
    try:
        ours = run_side(airflow, timeline, at, core, OURS, {"run_uri": f"s3://{BUCKET}/runs/trainops/"})
        base = run_side(airflow, timeline, at, core, BASE, {"run_uri": f"s3://{BUCKET}/runs/provider/"})
    finally:
        stop.set()
    api.close()

    ours_s, base_s = ours.running - ours.crash.time, base.running - base.crash.time
    speedup = base_s / ours_s
    delay = ours_task["retry_delay"]
    return [
        (
            "services-crash-to-resumed-pods-running",
            f"trainops={ours_s:.2f}s provider={base_s:.2f}s "
            f"retry_delay={delay['days'] * 86400 + delay['seconds']:g}s runs={ours.state}/{base.state} "
            f"trainops_marks=[{breakdown(ours)}] provider_marks=[{breakdown(base)}] "
            f"resumed_step={ours.crash.resumed_step}/{base.crash.resumed_step}",
            speedup,
            ">=5",
            speedup >= 5 and ours.state == base.state == "success",
            {
                "trainops_s": round(ours_s, 3),
                "provider_s": round(base_s, 3),
                "runs": f"{ours.state}/{base.state}",
            },
        )
    ]


def main() -> int:
    from trainops_devcluster import stack
    from trainops_devcluster.local_s3 import free_port

    state = Path(tempfile.mkdtemp(prefix="bench-services-"))
    try:
        at = stack.up(state, api_port=free_port(), nodes=16, dags=BENCH_DAGS)
        try:
            results = measure(at, state)
        finally:
            stack.down(state)
    except BaseException:
        print(f"bench services: error; the services' logs are kept in {state}/logs", file=sys.stderr)
        raise
    if os.environ.get("BENCH_SERVICES_KEEP"):
        print(f"bench services: the services' logs are in {state}/logs", file=sys.stderr)
    else:
        shutil.rmtree(state, ignore_errors=True)
    for name, figures, ratio, target, ok, values in results:
        line(name, figures, ratio, target, ok)
        record(name, passed=ok, ratio=round(ratio, 3), target=target, **values)
    return 0 if all(result[4] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
