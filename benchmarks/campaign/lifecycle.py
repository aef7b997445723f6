"""One lifecycle run under one fault: gate -> claim -> train -> verify -> give back, then the invariants.

The steps are the core procedures the operators call (``steps.py``); Airflow's part is played here:
the claim's retries and its wait for nodes held by another run, the train task's tries (each a
resume), a Clear, the teardown that gives back on every path, and the reaper for a DAG run that died.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.campaign import faults as kinds
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
from tests.capacity.helpers import default_seeded_objects, nodes_by_app, rival_writer, snapshot
from trainops.capacity.procedure import NodeQuarantined, NodesHeld, give_back
from trainops.capacity.reaper import reap
from trainops.checkpoints.latest import latest_verified
from trainops.checkpoints.store import CheckpointStore
from trainops.conventions import QUARANTINE_TAINT
from trainops.errors import PermanentError
from trainops.health.gate import GateConfig, run_gate
from trainops.health.quarantine import ReleaseRefused, apply_quarantine, release
from trainops.kube.client import Kube
from trainops.kube.retry import Deadline
from trainops.training.decide import Fail, Succeed
from trainops.training.follow import read_heartbeat

REPO = Path(__file__).resolve().parents[2]
TRIES = 4  # the train task's retries=3 (+1): a try that fails on its own (its worker killed) is retried
FAULT_AT_STEP = 50  # training faults wait for this much progress (between two checkpoints)
REAPER_BOUND_S = 60.0


@dataclass
class RunResult:
    index: int
    fault: str
    outcome: str = "running"
    violations: list[str] = field(default_factory=list)
    recover_s: float | None = None
    useful_steps: int = 0
    paid_steps: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class World:
    """One devcluster and bucket for every run of a campaign."""

    cluster: object
    bucket: str
    store: CheckpointStore  # the worker's store (its client gets the S3 faults)
    s3_errors: kinds.S3Errors
    recorder: Recorder = None
    quota_before: str = ""

    def __post_init__(self) -> None:
        default_seeded_objects(self.cluster)
        self.recorder = Recorder(self.cluster.store)
        self.quota_before = gpu_quota(self.cluster)

    @property
    def kubeconfig(self) -> str:
        return str(self.cluster.kubeconfig)


def wait_for(condition: Callable[[], object], timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(every)
    return found


class Heartbeats(threading.Thread):
    """Samples the run's heartbeat (its own clean S3 client): (time written, step) of each one seen."""

    def __init__(self, run_uri: str) -> None:
        super().__init__(daemon=True)
        self.run_uri, self.store = run_uri, CheckpointStore()
        self.samples: dict[float, int] = {}
        self.stopped = threading.Event()

    def step(self) -> int:
        """The newest heartbeat's step (-1: none yet)."""
        samples = self.samples.copy()
        return samples[max(samples)] if samples else -1

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            try:
                if beat := read_heartbeat(self.store, self.run_uri):  # None: not written yet
                    self.samples[float(beat["time"])] = int(beat["step"])
            except Exception:  # noqa: BLE001 - a failed read: the next sample comes 0.2 s later
                pass


# ---- the lifecycle's steps, as Airflow would run them -------------------------------------------
def gate(world: World) -> list[str]:
    """NodeHealthGateOperator: judge, quarantine the bad, wait (deferred) until enough pass."""
    core = Kube.from_kubeconfig(world.kubeconfig).core

    def enough():
        result = run_gate(core, GateConfig(min_nodes=GANG + 1, gpus_per_node=8))
        apply_quarantine(core, result, Deadline(60))
        return result.selected if result.enough else None

    return wait_for(enough, 60, "the health gate", every=1.0)


def claim_task(world: World, step: Step, result: RunResult) -> list[str]:
    """ClaimNodesOperator with retries=2: wait while another run holds a node; re-gate when a chosen node
    was quarantined since the gate (the DAG's retry runs the gate's result again; the campaign re-gates)."""
    for attempt in range(1, 4):
        try:
            return claim_step(step)
        except NodesHeld as held:
            result.notes.append(f"claim try {attempt}: {held}")
            wait_for(lambda: not set(holders(world.cluster).values()) - {step.run}, 60, "nodes freed")
        except NodeQuarantined as quarantined:
            result.notes.append(f"claim try {attempt}: {quarantined}")
            step.nodes = gate(world)
        except Exception as error:  # noqa: BLE001 - a retry, as Airflow's
            result.notes.append(f"claim try {attempt}: {type(error).__name__}: {error}"[:300])
            if attempt == 3:
                raise
    raise RuntimeError(f"claim failed 3 times: {result.notes[-3:]}")


def child(step_name: str, step: Step, *args: str) -> subprocess.Popen:
    """The step in a process of its own (a worker), to be SIGKILLed."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.campaign.steps", step_name, json.dumps(asdict(step)), *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def sigkill_when(process: subprocess.Popen, condition: Callable[[], bool], timeout: float) -> float:
    """SIGKILL ``process`` once ``condition()`` holds (or it ended by itself); returns when."""
    wait_for(lambda: condition() or process.poll() is not None, timeout, "the kill point", every=0.02)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return time.monotonic()


# ---- one run -------------------------------------------------------------------------------------
class Run:
    def __init__(self, world: World, index: int, fault: str, rng) -> None:
        self.world, self.cluster, self.fault, self.rng = world, world.cluster, fault, rng
        self.result = RunResult(index, fault)
        self.run_uri = f"s3://{world.bucket}/runs/run-{index}/"
        self.step = Step(
            world.kubeconfig,
            f"campaign/run_{index}",
            self.run_uri,
        )
        self.rival = f"campaign/rival_{index}"
        self.faulted: set[str] = set()
        self.fault_at: float | None = None  # wall clock, as the recorder's
        self.beats = Heartbeats(self.run_uri)

    def go(self) -> RunResult:
        before = snapshot(self.cluster)
        self.world.recorder.take()
        self.beats.start()
        try:
            self.lifecycle()
            self.result.outcome = "succeeded"
        except Exception as error:  # noqa: BLE001 - the run failed; its teardown and the checks still run
            self.result.outcome = f"failed: {type(error).__name__}: {error}"[:400]
        finally:
            self.cluster.server.faults.clear()
            if self.fault == "s3-errors":
                self.result.notes.append(f"{self.world.s3_errors.injected} S3 requests answered 503")
            self.world.s3_errors.on = False
            self.beats.stopped.set()
        for key in (self.step.run, self.rival):  # the teardown, on every path
            try:
                give_back(Step(self.world.kubeconfig, key, "").kube(), key, cluster_queue="training")
            except Exception as error:  # noqa: BLE001 - a failed return is a violation
                self.result.violations.append(f"give_back({key}) raised {error!r}")
        seen = self.world.recorder.take()
        try:
            self.result.violations += end_state(
                self.cluster, seen, before, self.world.quota_before, self.world.store, faulted=self.faulted
            )
        except Exception as error:  # noqa: BLE001 - what cannot be checked counts as violated
            self.result.violations.append(f"the end state could not be checked: {error!r}")
        self.account(seen)
        try:
            self.heal(seen.quarantined | self.faulted)
        except Exception as error:  # noqa: BLE001 - the next runs have a smaller fleet; said, not fatal
            self.result.notes.append(f"healing the fleet failed: {error!r}")
        return self.result

    def lifecycle(self) -> None:
        fault = self.fault
        if fault in kinds.GATE:
            target = self.rng.choice(sorted(self.cluster.telemetry))
            kinds.node_fault(self.cluster, fault, target)
            self.faulted.add(target)
            time.sleep(2.5)  # the node probe publishes every second
        self.step.nodes = gate(self.world)
        for node in self.faulted:
            self.result.notes.append(f"the gate {'chose' if node in self.step.nodes else 'kept out'} {node}")
        self.step.nodes = self.claim_with_fault()
        if fault == "quarantined-candidate" and self.faulted & set(self.step.nodes):
            self.result.violations.append(
                f"claimed a quarantined node: {self.faulted & set(self.step.nodes)}"
            )
        self.train_with_fault()
        latest = latest_verified(self.run_uri, store=self.world.store).checkpoint
        if latest is None or latest.step != STEPS:
            raise RuntimeError(f"the latest verified checkpoint is {latest and latest.uri}, not step {STEPS}")
        self.result.useful_steps = STEPS
        if fault == "sigkill-return":
            self.return_killed_then_reaped()
        else:
            give_back_step(self.step)

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
            self.note_kill("claim")
            claimed = self.claim_task()
            self.result.recover_s = time.monotonic() - killed
            return claimed
        for thread in threads:
            thread.start()
        try:
            return self.claim_task()
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            cluster.server.faults.clear()

    def claim_task(self) -> list[str]:
        return claim_task(self.world, self.step, self.result)

    def rival_claim(self) -> None:
        """A second run claiming from the same gate result at the same time (so the same nodes); it
        holds what it won for a moment, then returns it."""
        rival = Step(self.world.kubeconfig, self.rival, "", list(self.step.nodes))
        kube = rival.kube()
        try:
            self.result.notes.append(f"the rival won {claim_step(rival)}")
            time.sleep(0.5)
        except NodesHeld as held:
            self.result.notes.append(f"the rival lost: {held}")
        except Exception as error:  # noqa: BLE001
            self.result.notes.append(f"rival: {error!r}"[:300])
        give_back(kube, self.rival, cluster_queue="training")

    # ---- train ---------------------------------------------------------------------------------
    def train_with_fault(self) -> None:
        fault, cluster = self.fault, self.cluster
        cleared = threading.Event()
        if fault == "api-burst-train":
            kinds.api_burst(cluster, kinds.TRAIN_BURST, fraction=0.2)
        if fault == "s3-errors":
            self.world.s3_errors.on, self.world.s3_errors.injected = True, 0
        if fault in (*kinds.TRAIN_NODE, "pod-crash", "hang", "torn-checkpoint", "drop-watches", "clear"):
            threading.Thread(target=self.inject_mid_train, args=(cleared,), daemon=True).start()
        killed_at = None

        def on_start() -> None:  # the next try took the run over
            nonlocal killed_at
            if killed_at is not None:
                self.result.recover_s, killed_at = time.monotonic() - killed_at, None

        if fault == "sigkill-train":
            process = child("train", self.step)
            killed_at = sigkill_when(process, lambda: self.beats.step() >= FAULT_AT_STEP, 180)
            self.fault_at = time.time()
            self.result.notes.append(f"train killed at step {self.beats.step()}")
        first = first_try = 1  # the try to make next; the try the resume budget counts from
        if fault == "sigkill-train":
            first = 2  # the killed worker's try was the first
        while (cleared_in := self.train_task(first, first_try, cleared, on_start)) is not None:
            # a Clear (its on_kill stopped the Job): the setups run again, then train with fresh tries
            # and a fresh resume budget
            cleared.clear()
            self.step.nodes = gate(self.world)
            self.step.nodes = self.claim_task()
            first = first_try = cleared_in + 1
        cluster.server.faults.clear()  # a burst belongs to the train phase

    def train_task(
        self, first: int, first_try: int, cleared: threading.Event, on_start: Callable[[], None]
    ) -> int | None:
        """The train task's tries from ``first`` to its last (Airflow numbers them on past a Clear: its
        tries are ``first_try`` to ``first_try + retries``); the try a Clear came in, or None."""
        for number in range(first, first_try + TRIES):
            try:
                action = train_try(self.step, self.world.store, number, first_try, cleared, on_start=on_start)
            except PermanentError:  # Airflow fails the task without a retry
                raise
            except Exception as error:  # noqa: BLE001 - Airflow fails the try and retries it
                self.result.notes.append(f"try {number} raised {type(error).__name__}: {error}"[:300])
                continue
            if action is None:
                return number
            if isinstance(action, Succeed):
                return None
            reason = action.reason if isinstance(action, Fail) else str(action)
            self.result.notes.append(f"try {number}: {reason}"[:300])
            raise RuntimeError(reason)  # GangTrainingOperator raises PermanentError: no retry
        raise RuntimeError(f"tries exhausted: {self.result.notes[-1]}")

    def inject_mid_train(self, cleared: threading.Event) -> None:
        try:
            pods = wait_for(
                lambda: self.beats.step() >= FAULT_AT_STEP and self.running_pods(), 180, "progress"
            )
        except TimeoutError:
            self.result.notes.append("the fault found no running attempt")
            return
        fault, pod = self.fault, self.rng.choice(pods)
        self.fault_at = time.time()
        if fault in kinds.TRAIN_NODE:
            self.faulted.add(pod["spec"]["nodeName"])
            kinds.node_fault(self.cluster, fault, pod["spec"]["nodeName"])
        elif fault == "pod-crash":
            self.cluster.inject("crash-pod", f"{NAMESPACE}/{pod['metadata']['name']}", exit_code=137)
        elif fault == "hang":
            self.cluster.inject(
                "hang", f"{NAMESPACE}/{pod['metadata']['labels']['batch.kubernetes.io/job-name']}"
            )
        elif fault == "torn-checkpoint":
            self.tear_newest_checkpoint()
            self.cluster.inject("crash-pod", f"{NAMESPACE}/{pod['metadata']['name']}", exit_code=137)
        elif fault == "drop-watches":
            for _ in range(3):
                self.cluster.inject("drop-watches")
                time.sleep(0.5)
        elif fault == "clear":
            cleared.set()

    def running_pods(self) -> list[dict]:
        label = run_label(self.step.run)
        return [
            p
            for p in self.cluster.store.list("pods", NAMESPACE)[0]
            if (p["metadata"].get("labels") or {}).get("trainops.io/run") == label
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def tear_newest_checkpoint(self) -> None:
        client = CheckpointStore().client
        bucket, _, prefix = self.run_uri[5:].partition("/")
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
        committed = sorted(
            (int(k.split("step-")[1].split("/")[0]), k) for k in keys if k.endswith("/_COMMITTED")
        )
        if committed:
            shard = committed[-1][1].replace("_COMMITTED", "rank-1.bin")
            client.put_object(Bucket=bucket, Key=shard, Body=b"torn")
            self.result.notes.append(f"tore {shard}")

    # ---- return --------------------------------------------------------------------------------
    def return_killed_then_reaped(self) -> None:
        """The returning worker SIGKILLed halfway; the DAG run is over, so the reaper returns the rest."""
        # throttled node writes slow the return down, so that the kill lands in its middle
        self.cluster.inject("api-fault", path=r"/api/v1/nodes/", status=429, count=4)
        process = child("give_back", self.step)
        held = set(holders(self.cluster))
        killed = sigkill_when(
            process,
            lambda: self.step.run not in grants(self.cluster) or set(holders(self.cluster)) < held,
            120,
        )
        self.note_kill("return")
        summary = reap(
            self.step.kube(), lambda run: run != self.step.run, cluster_queue="training", grace_s=0
        )
        self.result.recover_s = time.monotonic() - killed
        if summary.failed or self.result.recover_s > REAPER_BOUND_S:
            self.result.violations.append(
                f"the reaper did not return the run within {REAPER_BOUND_S:g} s: {summary}"
            )

    def note_kill(self, step: str) -> None:
        held = [n for n, run in holders(self.cluster).items() if run == self.step.run]
        granted = grants(self.cluster).get(self.step.run)
        self.result.notes.append(f"{step} killed holding {len(held)} node(s), quota {granted or 'none'}")

    # ---- after ---------------------------------------------------------------------------------
    def account(self, seen) -> None:
        """Steps paid for: each attempt's highest heartbeat less the step it started from."""
        label = run_label(self.step.run)
        jobs = sorted((j for j in seen.jobs if j.run == label), key=lambda j: j.at)
        for job, after in zip(jobs, [*jobs[1:], None], strict=True):
            start = int(job.resume_from.rstrip("/").rpartition("step-")[2]) if job.resume_from else 0
            steps = [
                s
                for t, s in self.beats.samples.copy().items()
                if t >= job.at and (after is None or t < after.at)
            ]
            self.result.paid_steps += max(0, max(steps, default=start) - start)
        if self.result.recover_s is None and self.fault_at is not None:
            later = [j.at for j in jobs if j.at > self.fault_at]
            if later:
                self.result.recover_s = later[0] - self.fault_at
        if self.result.outcome == "succeeded":
            self.result.paid_steps = max(self.result.paid_steps, STEPS)

    def heal(self, nodes: set[str]) -> None:
        """Repair what the run broke and lift its quarantines, so that every run starts on a whole fleet."""
        core = self.step.kube().core
        for node in sorted(nodes):
            self.cluster.inject("repair", node)
            self.cluster.faults.node_ready(node)
            set_quarantine(self.cluster, node, False)
        for node in sorted(nodes):
            wait_for(lambda n=node: _released(core, n), 30, f"release of {node}", every=0.5)


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
