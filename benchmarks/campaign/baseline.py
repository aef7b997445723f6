"""The baseline policy: what a skilled Airflow user runs without trainops, on the same seeded fault.

Each choice, and why a skilled user makes it:

- The cncf provider's ``KubernetesJobOperator(deferrable=True, wait_until_job_complete=True)``
  (``benchmarks/dags/bench_training_provider.py``, the DAG ``bench_training`` and ``bench_services``
  measure), run with ``dag.test()``: Airflow's own retry loop, its trigger polling the Job every
  ``job_poll_interval`` (the provider's default 10 s, scaled), so no worker slot is held while it waits.
- As many retries as trainops' resume budget, after the **same retry delay as trainops' lifecycle DAG**
  (5 s, scaled; Airflow's 300 s default is for tasks whose retry is cheap to postpone, not for a gang
  holding GPUs; ``bench_training`` keeps the two equal too).
- The framework's own resume: the newest checkpoint by listing, unverified (the demo trainer's
  ``--resume newest-listed``, as torchtitan's and Megatron's loaders pick the latest step).
- Node problems handled only as stock Kubernetes handles them: NVIDIA's device plugin takes a GPU with a
  fatal XID (an NVLink that goes down under load, XID 74, included) or an uncorrectable ECC error out of the
  node's allocatable, so the scheduler places no pod that needs it there; a node that stops responding is
  tainted ``unreachable`` by the node lifecycle controller; nothing cordons or quarantines, and a fault no
  device plugin reports (a downed InfiniBand port) stays on a node the next try may land on (the devcluster
  keeps each fault until its repair: ``devcluster/README.md``).
- A hang ends when NCCL's watchdog aborts the ranks (its default timeout, scaled: ``strike.nccl_watchdog``).

Its nodes are a pool of the gang and a spare, the size of trainops' claim, set up by the same claim (a
team's reserved training nodes), so both policies hold the same GPUs; the pool is returned when the DAG
run has ended.  Faults trainops meets in its own machinery (the gate, the claim, the return, its
workers and their API and S3 calls) have no counterpart here: those runs of the baseline are plain.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from benchmarks.campaign import faults as kinds
from benchmarks.campaign.gpu_time import Account, account
from benchmarks.campaign.steps import GANG, RESUMES, STEPS, TRAIN_ARGS, Step, claim_step, give_back_step
from benchmarks.campaign.strike import JOB_NAME_LABEL, Strike, strike
from benchmarks.campaign.timeline import Heartbeats, run_times
from benchmarks.campaign.timing import Timing
from trainops.capacity.ranking import least_disruptive

REPO = Path(__file__).resolve().parents[2]
BENCH_DAGS = REPO / "benchmarks" / "dags"
DAG_ID = "bench_training_provider"
JOB_PREFIX = "job-bench-provider-"
# The faults the baseline meets too: the hardware, the node, the trainer's process and its checkpoints.
FAULTS = (*kinds.GATE, *kinds.TRAIN_NODE, "pod-crash", "hang", "torn-checkpoint")
ARGS = [*TRAIN_ARGS, "--resume", "newest-listed"]


class Airflow:
    """The provider DAG, parsed once, with the campaign's retries and the scaled retry delay and poll."""

    def __init__(self, timing: Timing, log: Path) -> None:
        from trainops_devcluster import airflow_home

        self.log = log
        self.dag = airflow_home.load_dag(DAG_ID, BENCH_DAGS)
        task = self.dag.get_task("train")
        task.retries = RESUMES  # as many restarts as trainops' resume budget
        task.retry_delay = timedelta(seconds=timing.retry_delay_s)  # the lifecycle DAG's, not Airflow's 300 s
        task.job_poll_interval = timing.job_poll_interval_s
        task.termination_grace_period = max(1, round(timing.termination_grace_s))  # as trainops' pods

    def run(self, run_uri: str) -> str:
        """One DAG run (``dag.test()``, its output to the log); its final state."""
        from trainops_devcluster import airflow_home

        with airflow_home.output_to(self.log):
            return str(self.dag.test(run_conf={"run_uri": run_uri, "args": ARGS}).state)


@dataclass
class BaselineResult:
    outcome: str = ""
    applied: bool = False  # the run's fault has a counterpart here
    landed: bool = False
    account: Account = field(default_factory=Account)
    attempts: int = 0
    notes: list[str] = field(default_factory=list)


def run_baseline(world, plan, airflow: Airflow, faulted: set[str]) -> BaselineResult:
    """Run ``plan`` under the baseline policy: its pool claimed, the fault struck (a gate fault on
    ``plan.target``, a training one on ``plan.rank``), the DAG run, the pool returned; its account.
    The nodes it faulted are added to ``faulted``."""
    fault = plan.fault
    result = BaselineResult(applied=fault in FAULTS)
    holder, run_uri = (
        f"campaign_baseline/run_{plan.index}",
        f"s3://{world.bucket}/runs/baseline-{plan.index}/",
    )
    started = time.time()
    if fault in kinds.GATE:
        kinds.node_fault(world.cluster, fault, plan.target)
        faulted.add(plan.target)
    nodes = world.gpu_nodes()
    if fault in kinds.GATE:  # a gate fault strikes a node of the team's pool
        others = [n for n in nodes if n != plan.target]
        nodes = [plan.target, *least_disruptive(others, world.cluster.store.list("pods")[0], GANG)]
    step = Step(world.kubeconfig, holder, run_uri, nodes, scale=world.timing.scale)
    pool = claim_step(step)
    result.landed = not result.applied or (fault in kinds.GATE and plan.target in pool)
    beats = Heartbeats(run_uri)
    beats.start()
    struck: list[Strike] = []

    def ours(pod: dict) -> bool:
        return (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "").startswith(JOB_PREFIX)

    def hit() -> None:
        struck.append(
            strike(
                world.cluster,
                fault,
                plan.rank,
                beats.step,
                ours,
                run_uri,
                world.timing.nccl_timeout_s,
                target=plan.target,
            )
        )
        if struck[-1].node and fault in kinds.TRAIN_NODE:
            faulted.add(struck[-1].node)

    if fault in kinds.STRUCK:
        threading.Thread(target=hit, daemon=True).start()
    try:
        result.outcome = airflow.run(run_uri)
    finally:
        beats.stopped.set()
        give_back_step(step)
    if struck:  # a gate fault's storm landed when it was in the pool
        result.landed = struck[0].landed and (fault not in kinds.GATE or result.landed)
        result.notes.append(struck[0].note or f"{fault} on {struck[0].node} at step {struck[0].step}")
    jobs = world.timeline.jobs_since(started, lambda job: job.name.startswith(JOB_PREFIX))
    result.attempts = len(jobs)
    audit = world.cluster.server.audit.entries()

    def detected(job) -> float | None:
        """The provider's trigger saw the Job end at its first poll after it did."""
        polls = [
            e["time"]
            for e in audit
            if e["method"] == "GET"
            and f"/jobs/{job.name}" in e["path"]
            and job.ended
            and e["time"] >= job.ended
        ]
        return min(polls, default=None)

    times = run_times(
        world.timeline,
        holder,
        jobs,
        beats,
        gang_gpus=GANG * 8,
        succeeded=result.outcome == "success",
        final_step=STEPS,
        faults=[s.at for s in struck if s.at is not None],
        detected=detected,
        slow={plan.target: kinds.SLOW_GPU_FACTOR} if fault == "slow-gpu" else None,
    )
    result.account = account(times)
    return result
