"""One lifecycle run under one fault: gate -> claim -> train -> verify -> give back, then the checks.

The steps are the core procedures the operators call (``steps.py``); Airflow's part is played here, with
its production intervals scaled (``timing``): the claim's wait for nodes held by another run and its
retries, the train task's tries (each a resume), a Clear, a worker killed (seen dead after the task
heartbeat timeout, retried after the lifecycle DAG's ``retry_delay``), and the teardown that gives back on
every path (its killed try retried the same way: the DAG run is still running, so the reaper, which returns
only what runs that are gone hold, leaves it to the retry).

After the run, in this order: the invariants on the end state (``invariants.py``), before any repair;
the harness's own repair (a return of what the run still holds: if it has anything to do, that is a
violation); the fault's own outcome (``outcomes.py``); the GPU-seconds (``gpu_time.py``).  Then the
fleet is healed and the same draw runs under the baseline policy (``baseline.py``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.campaign import faults as kinds
from benchmarks.campaign.gpu_time import Account, account
from benchmarks.campaign.invariants import (
    NAMESPACE,
    Recorder,
    end_state,
    gpu_quota,
    grants,
    holders,
    run_label,
)
from benchmarks.campaign.steps import GANG, STEPS, Step, claim_step, give_back_step, train_try
from benchmarks.campaign.strike import AT_STEP, Strike, strike
from benchmarks.campaign.timeline import Heartbeats, Timeline, run_times
from benchmarks.campaign.timing import Timing
from tests.capacity.helpers import default_seeded_objects, nodes_by_app, rival_writer, snapshot
from trainops.capacity.procedure import NodeQuarantined, NodesHeld
from trainops.capacity.ranking import least_disruptive
from trainops.checkpoints.latest import latest_verified
from trainops.checkpoints.store import CheckpointStore
from trainops.conventions import GPU_POOL_LABEL, QUARANTINE_TAINT
from trainops.errors import PermanentError
from trainops.health.gate import GateConfig, GateResult, run_gate
from trainops.health.quarantine import ReleaseRefused, apply_quarantine, release
from trainops.kube.client import Kube
from trainops.kube.retry import Deadline
from trainops.training.cluster import GangCluster
from trainops.training.decide import Fail, Succeed
from trainops.training.job import RUN_LABEL
from trainops.training.ledger import END_ANNOTATION, Ledger
from trainops.training.reconcile import TrainingRun

REPO = Path(__file__).resolve().parents[2]
TRIES = 4  # the train task's retries=3 (+1): a try that fails on its own (its worker killed) is retried
GPUS_PER_NODE = 8


@dataclass
class Plan:
    """One run's draws from the seed, the same for both policies: the fault, the rank a training fault
    strikes, and a gate fault's node (one a claim without the gate would take)."""

    index: int
    fault: str
    rank: int
    target: str
    rng: random.Random

    @classmethod
    def draw(cls, world: World, seed: int, index: int, faults: tuple[str, ...]) -> Plan:
        """Stratified: each round of ``len(faults)`` runs draws every kind once, in an order drawn from
        the seed, so that a campaign of k rounds meets each kind k times."""
        rnd, place = divmod(index, len(faults))
        order = list(faults)
        random.Random(seed * 1_000_003 + rnd).shuffle(order)
        rng = random.Random(seed * 1_000_003 + 500_000 + index)
        fault, rank = order[place], rng.randrange(GANG)
        first = least_disruptive(world.gpu_nodes(), world.cluster.store.list("pods")[0], GANG + 1)
        return cls(index, fault, rank, rng.choice(first), rng)


@dataclass
class RunResult:
    index: int
    fault: str
    outcome: str = "running"
    violations: list[str] = field(default_factory=list)
    landed: bool = False  # the fault did what it is for (a run where it did not is no coverage)
    checked: list[str] = field(default_factory=list)  # what its outcome was checked for
    account: Account = field(default_factory=Account)
    baseline: object = None  # baseline.BaselineResult, when the baseline ran
    notes: list[str] = field(default_factory=list)


@dataclass
class World:
    """One devcluster and bucket for every run of a campaign, and the policies' settings."""

    cluster: object
    bucket: str
    store: CheckpointStore  # the worker's store (its client gets the S3 faults)
    s3_errors: kinds.S3Errors
    timing: Timing = field(default_factory=Timing)
    airflow: object = None  # baseline.Airflow: the baseline policy runs too
    recorder: Recorder = None
    timeline: Timeline = None
    quota_before: str = ""

    def __post_init__(self) -> None:
        default_seeded_objects(self.cluster)
        self.recorder = Recorder(self.cluster.store)
        self.timeline = Timeline(self.cluster.store)
        self.quota_before = gpu_quota(self.cluster)

    @property
    def kubeconfig(self) -> str:
        return str(self.cluster.kubeconfig)

    def gpu_nodes(self) -> list[str]:
        return sorted(
            n["metadata"]["name"]
            for n in self.cluster.store.list("nodes")[0]
            if n["metadata"].get("labels", {}).get(GPU_POOL_LABEL) == "true"
        )

    def heal(self, nodes: set[str]) -> None:
        """Repair ``nodes`` and lift their quarantines, so that every run starts on a whole fleet."""
        core = Kube.from_kubeconfig(self.kubeconfig).core
        for node in sorted(nodes):
            self.cluster.inject("repair", node)
            self.cluster.faults.node_ready(node)
            set_quarantine(self.cluster, node, False)
        for node in sorted(nodes):
            wait_for(lambda n=node: _released(core, n), 30, f"release of {node}", every=0.5)
            wait_for(lambda n=node: known(self, n), 30, f"{node} judged healthy again", every=0.5)


def wait_for(condition: Callable[[], object], timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(every)
    return found


class Said(logging.Handler):
    """What the product's procedures log (a task's log), kept for the checks."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# ---- the lifecycle's steps, as Airflow would run them -------------------------------------------
def gate(world: World) -> GateResult:
    """NodeHealthGateOperator: judge, quarantine the bad, wait (deferred) until enough pass."""
    core = Kube.from_kubeconfig(world.kubeconfig).core

    def enough() -> GateResult | None:
        result = run_gate(core, GateConfig(min_nodes=GANG + 1, gpus_per_node=GPUS_PER_NODE))
        apply_quarantine(core, result, Deadline(60))
        return result if result.enough else None

    return wait_for(enough, 60, "the health gate", every=1.0)


def known(world: World, node: str) -> bool:
    """The health gate would take ``node``, judged on every signal: its report is not the one from
    before a repair (a fault the baseline never quarantined), and none of its rates is unknown (a
    repaired node reboots: its probe needs two samples again)."""
    core = Kube.from_kubeconfig(world.kubeconfig).core
    result = run_gate(core, GateConfig(min_nodes=1, gpus_per_node=GPUS_PER_NODE))
    judged = next((n for n in result.nodes if n.name == node), None)
    return (
        judged is not None
        and judged.verdict in ("ok", "warn")
        and not any("unknown" in reason for reason in judged.reasons)
    )


def child(step_name: str, step: Step) -> subprocess.Popen:
    """The step in a process of its own (a worker), to be SIGKILLed."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.campaign.steps", step_name, json.dumps(asdict(step))],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def sigkill_when(process: subprocess.Popen, condition: Callable[[], bool], timeout: float) -> float:
    """SIGKILL ``process`` once ``condition()`` holds (or it ended by itself); returns when (wall clock)."""
    wait_for(lambda: condition() or process.poll() is not None, timeout, "the kill point", every=0.02)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return time.time()


# ---- one run -------------------------------------------------------------------------------------
class Run:
    def __init__(self, world: World, plan: Plan) -> None:
        self.world, self.cluster, self.plan, self.fault = world, world.cluster, plan, plan.fault
        self.timing = world.timing
        self.result = RunResult(plan.index, plan.fault)
        self.run_uri = f"s3://{world.bucket}/runs/run-{plan.index}/"
        self.step = Step(
            world.kubeconfig, f"campaign/run_{plan.index}", self.run_uri, scale=self.timing.scale
        )
        self.rival = f"campaign/rival_{plan.index}"
        self.faulted: set[str] = set()
        self.beats = Heartbeats(self.run_uri)
        self.said = Said()
        # what the checks read (outcomes.py) and the account's marks
        self.started = 0.0
        self.gated: GateResult | None = None
        self.chosen: list[str] = []  # the gate's choice the claim started from
        self.claim_failures: list[str] = []
        self.struck: Strike | None = None
        self.cleared_at: float | None = None
        self.cleared_try: int | None = None
        self.killed: dict[str, float] = {}  # step -> when its worker was SIGKILLed
        self.dead: list[tuple[float, float]] = []  # no worker ran the task from .. to
        self.returned_at: float | None = None  # a killed return's retry gave everything back
        self.rival_outcome, self.rival_nodes = "", []
        self.held_at_kill: list[str] = []  # what the killed worker's run held (nodes, and "quota")
        self.step_at_kill = -1
        self.burst: tuple[float, float] | None = None  # an API burst's window
        self.ledger: Ledger | None = None

    def go(self) -> RunResult:
        before = snapshot(self.cluster)
        self.world.recorder.take()
        reconcile_log = logging.getLogger("trainops.training.reconcile")
        reconcile_log.addHandler(self.said)
        level, reconcile_log.level = reconcile_log.level, logging.INFO
        self.started = time.time()
        self.beats.start()
        try:
            self.lifecycle()
            self.result.outcome = "succeeded"
        except Exception as error:  # noqa: BLE001 - the run failed; the checks still run
            self.result.outcome = f"failed: {type(error).__name__}: {error}"[:400]
        finally:
            self.cluster.server.faults.clear()
            self.world.s3_errors.disarm()
            self.beats.stopped.set()
            reconcile_log.removeHandler(self.said)
            reconcile_log.level = level
        seen = self.world.recorder.take()
        try:  # the end state as the lifecycle left it: nothing repaired yet
            self.result.violations += end_state(
                self.cluster, seen, before, self.world.quota_before, self.world.store, faulted=self.faulted
            )
        except Exception as error:  # noqa: BLE001 - what cannot be checked counts as violated
            self.result.violations.append(f"the end state could not be checked: {error!r}")
        self.result.violations += self.repair()
        self.ledger = TrainingRun(
            GangCluster(self.step.kube()), NAMESPACE, *self.step.run.split("/")
        ).observe()
        from benchmarks.campaign.outcomes import check

        self.result.landed, self.result.checked, failures = check(self, seen)
        if self.result.landed:
            self.result.violations += [f"the fault's outcome: {failure}" for failure in failures]
        else:  # counted apart, with why
            self.result.notes += failures
        self.result.account = self.gpu_seconds()
        try:
            self.world.heal(seen.quarantined | self.faulted)
        except Exception as error:  # noqa: BLE001 - the next runs have a smaller fleet; said, not fatal
            self.result.notes.append(f"healing the fleet failed: {error!r}")
        if self.world.airflow is not None:
            self.result.baseline = self.baseline()
        return self.result

    def repair(self) -> list[str]:
        """The harness returns what the run (or its rival) still holds; each return it had to make is a
        violation (the lifecycle's own teardown should have made it)."""
        found = []
        for key in (self.step.run, self.rival):
            held = sorted(n for n, run in holders(self.cluster).items() if run == key)
            granted = grants(self.cluster).get(key)
            if held or granted:
                found.append(
                    f"the harness had to return what {key} still held: nodes {held}, quota {granted}"
                )
                try:
                    give_back_step(Step(self.world.kubeconfig, key, ""))
                except Exception as error:  # noqa: BLE001 - said with the violation
                    found.append(f"and its return failed: {error!r}")
        return found

    def baseline(self):
        """The same draw under the baseline policy; a harness error there is said in its outcome (the run
        then has no baseline account: its fault is not compared)."""
        from benchmarks.campaign.baseline import BaselineResult, run_baseline

        faulted: set[str] = set()
        try:
            return run_baseline(self.world, self.plan, self.world.airflow, faulted)
        except Exception as error:  # noqa: BLE001 - one run's harness error does not end the campaign
            return BaselineResult(outcome=f"harness error: {error!r}"[:300])
        finally:
            try:
                self.world.heal(faulted)
            except Exception as error:  # noqa: BLE001 - the next runs have a smaller fleet; said, not fatal
                self.result.notes.append(f"healing the baseline's nodes failed: {error!r}")

    # ---- the lifecycle -------------------------------------------------------------------------
    def lifecycle(self) -> None:
        fault = self.fault
        if fault in kinds.GATE:  # once the gate knows the node's rates (a repaired one's probe starts afresh)
            target = self.plan.target
            wait_for(lambda: known(self.world, target), 60, f"{target}'s rates known to the gate", every=0.5)
            kinds.node_fault(self.cluster, fault, target)
            self.faulted.add(self.plan.target)
            time.sleep(2.5 * self.timing.node_probe_s)  # the node probe publishes its next reports
        returned = False
        try:
            self.gated = gate(self.world)
            self.chosen = self.step.nodes = list(self.gated.selected)
            self.step.nodes = self.claim_with_fault()
            self.train_with_fault()
            latest = latest_verified(self.run_uri, store=self.world.store).checkpoint
            if latest is None or latest.step != STEPS:
                raise RuntimeError(
                    f"the latest verified checkpoint is {latest and latest.uri}, not step {STEPS}"
                )
            returned = True
            if fault == "sigkill-return":
                self.return_killed_then_retried()
            else:
                give_back_step(self.step)
        finally:
            if not returned:  # the teardown runs on every path
                give_back_step(self.step)

    def airflow_retry(self) -> None:
        """A failed try is retried after the lifecycle DAG's ``retry_delay``."""
        time.sleep(self.timing.retry_delay_s)

    def retried_after(self) -> float:
        """How long a killed worker's task waits for its next try: Airflow sees the worker dead after the
        task heartbeat timeout and retries the task after the lifecycle DAG's ``retry_delay``."""
        return self.timing.task_heartbeat_timeout_s + self.timing.retry_delay_s

    def worker_killed(self, step: str, at: float, dead_s: float) -> None:
        """No process runs the task for ``dead_s`` after ``at`` (until Airflow sees it dead and retries it,
        or hands its trigger to another triggerer)."""
        self.killed[step] = at
        self.held_at_kill = self.holding()
        self.result.notes.append(f"{step} killed holding {self.held_at_kill or 'nothing'}")
        time.sleep(max(0.0, at + dead_s - time.time()))
        self.dead.append((at, time.time()))

    # ---- claim ---------------------------------------------------------------------------------
    def claim_with_fault(self) -> list[str]:
        fault, cluster, stop, threads = self.fault, self.cluster, threading.Event(), []
        if fault == "api-burst":
            kinds.api_burst(cluster, kinds.CLAIM_BURST)
        elif fault == "killed-mid-claim":  # the first node write after the claim's reads answers 500
            cluster.inject("api-fault", path=r"/api/v1/nodes/[^/?]+(\?.*)?$", status=500, count=2)
        elif fault == "quarantined-candidate":  # the claim would take an idle node first
            idle = [n for n in self.step.nodes if n in nodes_by_app(cluster)["idle"]] or self.step.nodes
            self.faulted.add(idle[0])
            set_quarantine(cluster, idle[0], True)
        elif fault == "rival-writer":
            threads.append(
                threading.Thread(target=rival_writer, args=(cluster, self.step.nodes, stop), daemon=True)
            )
        elif fault == "race":
            threads.append(threading.Thread(target=self.rival_claim, daemon=True))
        elif fault == "sigkill-claim":
            process = child("claim", self.step)
            killed = sigkill_when(process, lambda: self.step.run in holders(cluster).values(), 120)
            self.worker_killed("claim", killed, self.retried_after())
            return self.claim_task()
        self.burst = (time.time(), 0.0)
        for thread in threads:
            thread.start()
        try:
            return self.claim_task()
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            cluster.server.faults.clear()
            self.burst = (self.burst[0], time.time())

    def claim_task(self) -> list[str]:
        """ClaimNodesOperator with retries=2: wait (deferred) while another run holds a node; re-gate when
        a chosen node was quarantined since the gate (its retry runs on the gate's new result)."""
        for attempt in range(1, 4):
            try:
                return claim_step(self.step)
            except NodesHeld as held:
                self.claim_failures.append(f"claim try {attempt}: {held}")
                wait_for(lambda: not set(holders(self.cluster).values()) - {self.step.run}, 60, "nodes freed")
            except NodeQuarantined as quarantined:
                self.claim_failures.append(f"claim try {attempt}: {quarantined}")
                self.airflow_retry()
                self.step.nodes = list(gate(self.world).selected)
            except Exception as error:  # noqa: BLE001 - a retry, as Airflow's
                self.claim_failures.append(f"claim try {attempt}: {type(error).__name__}: {error}"[:300])
                if attempt == 3:
                    raise
                self.airflow_retry()
        raise RuntimeError(f"claim failed 3 times: {self.claim_failures[-3:]}")

    def rival_claim(self) -> None:
        """A second run claiming from the same gate result at the same time (so the same nodes); it
        holds what it won for a moment, then returns it."""
        rival = Step(self.world.kubeconfig, self.rival, "", list(self.step.nodes))
        try:
            self.rival_nodes = claim_step(rival)
            self.rival_outcome = f"won {self.rival_nodes}"
            time.sleep(0.5)
        except NodesHeld as held:
            self.rival_outcome = f"lost: {held}"
        except Exception as error:  # noqa: BLE001
            self.rival_outcome = f"failed: {error!r}"[:300]
        give_back_step(rival)

    # ---- train ---------------------------------------------------------------------------------
    def ours(self, pod: dict) -> bool:
        return (pod["metadata"].get("labels") or {}).get(RUN_LABEL) == run_label(self.step.run)

    def train_with_fault(self) -> None:
        fault, cluster = self.fault, self.cluster
        cleared = threading.Event()
        if fault == "api-burst-train":
            kinds.api_burst(cluster, kinds.TRAIN_BURST, count=2)
            self.burst = (time.time(), 0.0)
        if fault == "s3-errors":
            self.world.s3_errors.arm()
        if fault in kinds.STRUCK:
            threading.Thread(target=self.strike, daemon=True).start()
        elif fault in ("drop-watches", "clear"):
            threading.Thread(target=self.mid_train, args=(cleared,), daemon=True).start()
        first = first_try = 1  # the try to make next; the try the resume budget counts from
        if fault == "sigkill-train":
            process = child("train", self.step)
            killed = sigkill_when(process, lambda: self.beats.step() >= AT_STEP, 180)
            self.step_at_kill = self.beats.step()
            self.result.notes.append(f"train killed at step {self.step_at_kill}")
            # the deferred try's trigger was in the killed process: another triggerer takes it over once
            # the dead one misses its health check; it follows the same attempt
            self.worker_killed("train", killed, self.timing.triggerer_health_check_s)
            first = 2  # the killed worker's try was the first
        while (cleared_in := self.train_task(first, first_try, cleared)) is not None:
            # a Clear (its on_kill stopped the Job): the setups run again, then train with fresh tries
            # and a fresh resume budget
            cleared.clear()
            self.cleared_try = cleared_in
            self.step.nodes = list(gate(self.world).selected)
            self.step.nodes = self.claim_task()
            first = first_try = cleared_in + 1
        cluster.server.faults.clear()  # a burst belongs to the train phase
        if self.burst is not None and fault == "api-burst-train":
            self.burst = (self.burst[0], time.time())

    def train_task(self, first: int, first_try: int, cleared: threading.Event) -> int | None:
        """The train task's tries from ``first`` to its last (Airflow numbers them on past a Clear: its
        tries are ``first_try`` to ``first_try + retries``); the try a Clear came in, or None."""
        for number in range(first, first_try + TRIES):
            try:
                action = train_try(self.step, self.world.store, number, first_try, cleared)
            except PermanentError:  # Airflow fails the task without a retry
                raise
            except Exception as error:  # noqa: BLE001 - Airflow fails the try and retries it
                self.result.notes.append(f"try {number} raised {type(error).__name__}: {error}"[:300])
                self.airflow_retry()
                continue
            if action is None:
                return number
            if isinstance(action, Succeed):
                return None
            reason = action.reason if isinstance(action, Fail) else str(action)
            self.result.notes.append(f"try {number}: {reason}"[:300])
            raise RuntimeError(reason)  # GangTrainingOperator raises PermanentError: no retry
        raise RuntimeError(f"tries exhausted: {self.result.notes[-1]}")

    def strike(self) -> None:
        self.struck = strike(
            self.cluster,
            self.fault,
            self.plan.rank,
            self.beats.step,
            self.ours,
            self.run_uri,
            self.timing.nccl_timeout_s,
            target=self.plan.target,
        )
        if self.struck.node and self.fault in kinds.TRAIN_NODE:
            self.faulted.add(self.struck.node)

    def mid_train(self, cleared: threading.Event) -> None:
        """Once the run has made progress: drop every watch (three times), or Clear the train task."""
        try:
            wait_for(lambda: self.beats.step() >= AT_STEP and self.live(), 180, "progress", every=0.02)
        except TimeoutError:
            return
        self.struck = Strike(self.fault, at=time.time(), step=self.beats.step())
        if self.fault == "drop-watches":
            for _ in range(3):
                self.cluster.inject("drop-watches")
                time.sleep(0.5)
        else:
            self.cleared_at = time.time()
            cleared.set()

    def live(self) -> bool:
        from benchmarks.campaign.strike import running

        return bool(running(self.cluster, self.ours))

    # ---- return --------------------------------------------------------------------------------
    def return_killed_then_retried(self) -> None:
        """The returning worker SIGKILLed halfway.  The teardown's try failed, not the DAG run (Airflow
        keeps a run whose teardown is pending running), so its retry returns the rest; the reaper, which
        returns only what runs that are gone hold, has nothing to do with it."""
        # throttled node writes slow the return down, so that the kill lands in its middle
        self.cluster.inject("api-fault", path=r"/api/v1/nodes/", status=429, count=4)
        process = child("give_back", self.step)
        held = set(holders(self.cluster))
        killed = sigkill_when(
            process,
            lambda: self.step.run not in grants(self.cluster) or set(holders(self.cluster)) < held,
            120,
        )
        self.worker_killed("return", killed, self.retried_after())
        give_back_step(self.step)
        if not self.holding():
            self.returned_at = time.time()

    def holding(self) -> list[str]:
        """The nodes the run holds, and "quota" when it holds a grant."""
        nodes = sorted(n for n, run in holders(self.cluster).items() if run == self.step.run)
        return nodes + (["quota"] if self.step.run in grants(self.cluster) else [])

    # ---- after ---------------------------------------------------------------------------------
    def gpu_seconds(self) -> Account:
        jobs = self.world.timeline.jobs_since(
            self.started, lambda job: job.labels.get(RUN_LABEL) == run_label(self.step.run)
        )

        def detected(job) -> float | None:
            """When trainops saw the attempt end: its judged end's ``at``."""
            try:
                return float(json.loads(job.annotations.get(END_ANNOTATION) or "{}").get("at"))
            except (TypeError, ValueError):
                return None

        marks = [t for t in (self.struck and self.struck.at, self.cleared_at) if t]
        times = run_times(
            self.world.timeline,
            self.step.run,
            jobs,
            self.beats,
            gang_gpus=GANG * GPUS_PER_NODE,
            succeeded=self.result.outcome == "succeeded",
            final_step=STEPS,
            faults=marks,
            detected=detected,
            dead=self.dead,
            slow={self.plan.target: kinds.SLOW_GPU_FACTOR} if self.fault == "slow-gpu" else None,
        )
        return account(times)


def _released(core, node: str) -> bool:
    try:
        release(core, node, Deadline(30))
        return True
    except ReleaseRefused:
        return False


def set_quarantine(cluster, node: str, on: bool) -> None:
    def change(obj: dict) -> None:
        taints = [t for t in obj["spec"].get("taints") or [] if t["key"] != QUARANTINE_TAINT]
        if on:
            taints.append({"key": QUARANTINE_TAINT, "value": "campaign", "effect": "NoSchedule"})
        obj["spec"]["taints"] = taints

    cluster.store.mutate("nodes", "", node, change)
