"""``TrainingRun.reconcile()``: observe the run's Jobs, decide, act, until the next step is to follow an
attempt, or the run has succeeded or failed.  Every caller uses it: a try of ``train`` (``execute``,
``execute_complete``), its trigger (``follow_to_end``: follow, then reconcile what the follower saw),
the trigger's and the task's ``on_kill`` and the teardown, the UI and the reaper (``stop``), the run view
(``observe``: it reads, it never acts) and the fault campaign.

Each act is idempotent, so two callers that race (a try and a trigger, a resume and a teardown) converge:

- judging writes the ``End`` on the attempt's Job only when it has none (the first judgement stands);
- beginning attempt N creates the Job named for N: a second begin finds it (409) and follows it;
- stopping deactivates the attempt's Workload (``spec.active=false``), which is what it is once stopped.

Within one process, ``halt`` (the task was killed) makes every later begin fail, under the lock a
begin holds while it creates its Job: a cancelled trigger's thread still deciding cannot start an
attempt after its ``on_kill`` stopped the run.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from trainops.checkpoints.owner import claim_run_path
from trainops.checkpoints.store import CheckpointStore
from trainops.errors import PermanentError, TemporaryError
from trainops.health.slowdown import record as record_slowdown
from trainops.health.slowdown import slowed_in_run
from trainops.kube.kueue import BY_KUEUE
from trainops.kube.retry import Deadline
from trainops.training import follow
from trainops.training.blame import quarantine_node
from trainops.training.cluster import GangCluster
from trainops.training.decide import (
    Action,
    Begin,
    Budget,
    Fail,
    Follow,
    Judge,
    Options,
    Stop,
    Stopped,
    Succeed,
    Wait,
    Want,
    decide,
    follower_failure,
    verdict_of,
)
from trainops.training.failures import Failure, FailureKind, classify
from trainops.training.follow import FollowConfig, Outcome, RunFollower, Status
from trainops.training.job import CONTAINER_NAME, build_job, build_service, master_addr
from trainops.training.ledger import Attempt, End, Ledger, State, Verdict, begun_annotation, read_ledger
from trainops.training.naming import job_name
from trainops.training.spec import TrainingSpec

log = logging.getLogger(__name__)
MAX_STEPS = 12  # acts in one reconcile: a run settles in at most judge, stop, begin (a few more on races)
STOP_POLL_S = 0.5
WAIT_POLL_S = 5.0  # an elastic resume waiting for nodes reads them again this often

# The trigger's blocking work runs here, not in the event loop's default executor, which every trigger
# in the triggerer shares: judging may wait up to ``evidence_wait_s`` on the nodes' reports.
_RUN_THREADS = ThreadPoolExecutor(thread_name_prefix="trainops-training-run")


async def _in_thread(fn: Callable, *args, **kwargs):
    """``asyncio.to_thread`` (the context, logging's included, goes along) in ``_RUN_THREADS``."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_RUN_THREADS, call)


@dataclass(frozen=True)
class Checkpoint:
    uri: str | None
    step: int | None
    how: str


def latest_checkpoint(run_uri: str, store: CheckpointStore) -> tuple[Checkpoint, list[str]]:
    """Where a new attempt resumes (None: fresh start), and why newer checkpoints were skipped."""
    from trainops.checkpoints.latest import latest_verified

    latest = latest_verified(run_uri, store=store)
    skipped = [f"{r.uri}: {'; '.join(r.reasons)}" for r in latest.skipped]
    found = latest.checkpoint
    if found is None:
        return Checkpoint(None, None, "no verified checkpoint under the run path"), skipped
    return Checkpoint(found.uri, found.step, f"verified at level {found.level} ({found.format})"), skipped


class TrainingRun:
    """One DAG run's training (``dag_id``/``run_id``, Jobs in ``namespace``).  ``spec`` and ``store`` (the run
    path's checkpoint store) are needed to begin attempts; observing and stopping need neither.
    ``budget``: the try reconciling and its resume budget; ``options``: how failures are judged;
    ``follow_config``: how an attempt is followed (its ``job_name`` is filled in per attempt)."""

    def __init__(
        self,
        cluster: GangCluster,
        namespace: str,
        dag_id: str,
        run_id: str,
        *,
        spec: TrainingSpec | None = None,
        store: CheckpointStore | None = None,
        budget: Budget | None = None,
        options: Options | None = None,
        follow_config: FollowConfig | None = None,
        logger: logging.Logger = log,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster, self.namespace, self.dag_id, self.run_id = cluster, namespace, dag_id, run_id
        self.spec, self.store = spec, store
        self.budget, self.options = budget or Budget(), options or Options()
        self.follow_config = follow_config
        self.log, self.clock = logger, clock
        self.lock = threading.Lock()  # held while a Job is created
        self.halted = False  # set under the lock by ``halt``: no Job is created after it
        self.followed: Attempt | None = None  # the attempt this process last followed
        self.stops: list[str] = []  # what stopping did, in this process
        self._path_claimed = False

    @property
    def run(self) -> str:
        return f"{self.dag_id}/{self.run_id}"

    @property
    def who(self) -> str:
        return f"try {self.budget.try_number}"

    # ---- handing the run to the trigger --------------------------------------------------------
    def to_dict(self) -> dict:
        """What a trigger needs to go on with this run (JSON: it is stored with the trigger); the
        ledger is not in it: the trigger reads it from the cluster, as everyone does."""
        return {
            "namespace": self.namespace,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "spec": json.loads(json.dumps(dataclasses.asdict(self.spec))) if self.spec else None,
            "budget": dataclasses.asdict(self.budget),
            "options": dataclasses.asdict(self.options),
            "follow": self.follow_config.to_dict() if self.follow_config else None,
        }

    @classmethod
    def from_dict(
        cls, data: dict, cluster: GangCluster, store: CheckpointStore | None, logger: logging.Logger = log
    ) -> TrainingRun:
        return cls(
            cluster,
            data["namespace"],
            data["dag_id"],
            data["run_id"],
            spec=TrainingSpec(**data["spec"]) if data.get("spec") else None,
            store=store,
            budget=Budget(**data["budget"]),
            options=Options(**data["options"]),
            follow_config=FollowConfig.from_dict(data["follow"]) if data.get("follow") else None,
            logger=logger,
        )

    # ---- observe, decide, act --------------------------------------------------------------------
    def observe(self) -> Ledger:
        """The run's ledger as the cluster shows it (its Jobs and their Workloads)."""
        jobs = self.cluster.run_jobs(self.namespace, self.run)
        workloads = self.cluster.run_workloads(self.namespace, jobs)
        known = (self.followed,) if self.followed is not None else ()
        return read_ledger(jobs, workloads, lambda n: job_name(self.dag_id, self.run_id, n), known)

    def next_action(
        self, ledger: Ledger, want: Want = Want.RUN, seen: Outcome | None = None, by: str = ""
    ) -> Action:
        """``decide`` on ``ledger``, with what the follower of its newest attempt saw (if it is the one),
        and, for an elastic run whose newest attempt is over, how many nodes a next attempt has."""
        newest = ledger.newest
        if seen is not None and (
            newest is None or self.followed is None or newest.number != self.followed.number
        ):
            seen = None
        sizing = self.spec.sizing if self.spec is not None else None
        free = None
        if (
            want is Want.RUN
            and sizing is not None
            and sizing.elastic
            and newest is not None
            and not newest.live
        ):
            free = len(self.cluster.free_nodes(self.spec.node_names, ledger.excluded, self.run))
        return decide(ledger, self.budget, self.clock(), want, seen, by, sizing, free)

    def reconcile(self, *, want: Want = Want.RUN, seen: Outcome | None = None, by: str = "") -> Action:
        """Observe, decide and act until the action is to follow an attempt, to wait for nodes, to
        succeed or to fail (or, ``want=STOP``, until nothing runs any more); returns that action."""
        for _ in range(MAX_STEPS):
            ledger = self.observe()
            action = self.next_action(ledger, want, seen, by)
            if isinstance(action, Follow | Wait | Succeed | Fail | Stopped):
                if isinstance(action, Wait):
                    self.log.info("%s", action.why)
                return action
            self.act(action, ledger)
            if isinstance(action, Judge):
                seen = None  # what the follower saw is judged now
        raise TemporaryError(
            f"run {self.run}: its attempts did not settle in {MAX_STEPS} steps (last: {action})"
        )

    def act(self, action: Action, ledger: Ledger) -> None:
        if isinstance(action, Judge):
            self._judge(action.attempt, action.seen, ledger)
        elif isinstance(action, Stop):
            self._stop(action)
        elif isinstance(action, Begin):
            self._begin(action, ledger)

    # ---- judge -----------------------------------------------------------------------------------
    def _judge(self, attempt: Attempt, seen: Outcome | None, ledger: Ledger) -> None:
        """How ``attempt`` ended, recorded on its Job (the culprits quarantined first)."""
        at = (seen.seen_at if seen and seen.seen_at else None) or attempt.finished_at or self.clock()
        preemptions = len(seen.preemptions) if seen else 0
        slowed = self._keep_out_slowed(seen)
        for message in seen.preemptions if seen else ():
            self.log.info("preempted and requeued by Kueue (no resume used): %s", message)
        if attempt.state is State.SUCCEEDED or (seen and seen.status is Status.SUCCEEDED):
            reason = seen.message if seen else f"Job {attempt.job} completed while no try was watching"
            end = End(
                "succeeded",
                Verdict.SUCCEEDED,
                reason,
                at=at,
                preemptions=preemptions,
                by=self.who,
                slowed=slowed,
            )
            self.log.info("attempt %d succeeded: %s", attempt.number, reason)
            self.cluster.record_end(self.namespace, attempt.job, end)
            return
        failure, nodes = self._failure(attempt, seen)
        for line in failure.evidence:
            self.log.info("evidence: %s", line)
        for line in failure.hints:
            self.log.info("hint (not evidence against a node): %s", line)
        if failure.kind is FailureKind.INFRASTRUCTURE:
            self._blame(failure, nodes)
        verdict, message = verdict_of(failure, ledger, self.budget, self.options)
        self.log.info("attempt %d ended: %s", attempt.number, message)
        culprits = {node: "; ".join(e["problems"]) for node, e in failure.culprits.items()}
        end = End(
            str(failure.kind),
            verdict,
            failure.reason,
            culprits,
            tuple(failure.hints),
            at,
            preemptions,
            self.who,
            slowed,
        )
        self.cluster.record_end(self.namespace, attempt.job, end)

    def _keep_out_slowed(self, seen: Outcome | None) -> dict[str, str]:
        """Nodes the attempt's own step times (its last heartbeat) show slowed down: recorded on the node
        for the next run's gate, and kept out of this run's next attempt (``trainops.health.slowdown``)."""
        slowed = slowed_in_run(seen.heartbeat, seen.pods, self.run) if seen else {}
        for node, slow in sorted(slowed.items()):
            self.log.info("keeping node %s out: %s", node, slow.reason)
            record_slowdown(self.cluster.kube, slow, self.cluster.kube.deadline())
        return {node: slow.reason for node, slow in slowed.items()}

    def _failure(self, attempt: Attempt, seen: Outcome | None) -> tuple[Failure, dict[str, dict | None]]:
        """The failure ``attempt`` ended with, and the nodes read to find it."""
        if seen is not None and (failure := follower_failure(seen.status, seen.message)) is not None:
            return failure, {}
        if attempt.state is State.STOPPED and not (seen and seen.status is Status.FAILED):
            kind = FailureKind.KUEUE_DEACTIVATED if attempt.stopped_by == BY_KUEUE else FailureKind.STOPPED
            return Failure(kind, attempt.stop_reason or f"Job {attempt.job} was stopped"), {}
        pods = seen.pods if seen and seen.pods else self.cluster.job_pods(self.namespace, attempt.job)
        nodes, logs = self.cluster.failure_evidence(self.namespace, pods)
        failure = classify(pods, nodes, logs, container=CONTAINER_NAME)
        return self._await_node_evidence(failure, pods, nodes, logs)

    def _await_node_evidence(
        self, failure: Failure, pods: list[dict], nodes: dict[str, dict | None], logs: dict[str, str]
    ) -> tuple[Failure, dict[str, dict | None]]:
        """When the pods printed GPU or NCCL errors but no node confirms one, watch the nodes for up to
        ``evidence_wait_s``: the node probe reports a real fault within its interval, and the watch
        judges the moment it does."""
        wait = self.options.evidence_wait_s
        if failure.kind is not FailureKind.USER_CODE or not failure.hints or wait <= 0:
            return failure, nodes
        self.log.info(
            "the pods printed GPU/NCCL errors; waiting up to %gs for the nodes' own health reports", wait
        )
        for nodes in self.cluster.node_changes(sorted(nodes), time.monotonic() + wait):  # noqa: B020
            failure = classify(pods, nodes, logs, container=CONTAINER_NAME)
            if failure.kind is not FailureKind.USER_CODE:
                break
        return failure, nodes

    def _blame(self, failure: Failure, nodes: dict[str, dict | None]) -> None:
        """Quarantine the culprits; ``nodes``: those just read for the classification (saves a read)."""
        for node, evidence in sorted(failure.culprits.items()):
            # what its pods printed (an XID) says what the node's own word (a GPU out of allocatable) means
            printed = [hint for hint in failure.hints if f" on {node} printed " in hint]
            reason = "; ".join(evidence["problems"] + printed)
            if not self.options.quarantine_culprits:
                continue
            wrote = quarantine_node(
                self.cluster.kube,
                node,
                reason,
                {"problems": evidence["problems"], "pods_printed": printed, "run": self.run},
                nodes.get(node),
            )
            self.log.info(
                "quarantined node %s%s: %s", node, "" if wrote else " (already quarantined)", reason
            )

    # ---- stop --------------------------------------------------------------------------------------
    def _stop(self, action: Stop) -> None:
        if action.mark is not None:  # first: a begin that races this stop finds it
            self.cluster.mark_run_stopped(self.namespace, action.mark.job, action.end.by)
        for attempt in action.attempts:
            if attempt.end is None and action.end is not None:
                self.cluster.record_end(self.namespace, attempt.job, action.end)
            done = self.cluster.stop(self.namespace, attempt.job, attempt.workload)
            self.stops.append(done)
            self.log.info("stopping attempt %d: %s", attempt.number, done)

    def begin_nothing(self) -> None:
        """No Job is created from now on in this process (a begin under way finishes first: it holds
        the lock)."""
        with self.lock:
            self.halted = True

    def halt(self, by: str) -> Action:
        """The deferred task was killed (the trigger's ``on_kill``): ``begin_nothing``, and every attempt
        still running is stopped and recorded as stopped ``by``, the run marked stopped."""
        self.begin_nothing()
        return self.reconcile(want=Want.STOP, by=by)

    def stop(self, by: str, deadline: Deadline) -> list[str]:
        """Stop the run for good (its capacity is given back): ``halt``, then wait until ``deadline`` for
        its pods to go, stopping again any attempt a racing try began meanwhile; returns what was done."""
        self.halt(by)
        while live := self.cluster.live_pods(self.namespace, self.run):
            deadline.sleep(STOP_POLL_S, f"the pods of run {self.run} to stop ({', '.join(live)})")
            self.reconcile(want=Want.STOP, by=by)
        return list(self.stops)

    # ---- begin -------------------------------------------------------------------------------------
    def _begin(self, action: Begin, ledger: Ledger) -> None:
        if self.spec is None or self.store is None:
            raise ValueError(f"run {self.run}: beginning an attempt needs the run's spec and store")
        name = job_name(self.dag_id, self.run_id, action.number)
        with self.lock:
            if self.halted:
                raise PermanentError(
                    f"the task was killed: attempt {action.number}'s Job {name} is not created"
                )
            if not self._path_claimed:
                if claim_run_path(self.store, self.spec.run_path, self.run):
                    self.log.info("run path %s now belongs to this DAG run", self.spec.run_path)
                self._path_claimed = True
            checkpoint, skipped = latest_checkpoint(self.spec.run_path, self.store)
            if action.number > 1:
                self.log.info(
                    "resuming (%d of %d resumes since try %d): %s",
                    action.spent.resumes,
                    self.budget.max_resumes,
                    action.spent.since_try,
                    action.why,
                )
            nodes = self.spec.nodes if action.nodes is None else action.nodes
            self.log.info("attempt %d: Job %s on %d of %d nodes", action.number, name, nodes, self.spec.nodes)
            if checkpoint.uri:
                self.log.info(
                    "resuming from %s (step %s, %s)", checkpoint.uri, checkpoint.step, checkpoint.how
                )
            else:
                self.log.info("fresh start: %s", checkpoint.how)
            for reason in skipped:
                self.log.info("skipped newer checkpoint %s", reason)
            for node, why in sorted(action.kept_out.items()) or [("none", "")]:
                self.log.info("excluded node %s%s", node, f": {why}" if why else "")
            job = build_job(
                self.spec,
                name=name,
                dag_id=self.dag_id,
                run_id=self.run_id,
                attempt=action.number,
                resume_from=checkpoint.uri,
                excluded_nodes=action.kept_out,
                annotations=begun_annotation(self.budget.try_number, self.clock(), action.spent),
                nodes=action.nodes,
            )
            # before the run's first Job (the task's worker submits it), whether Kueue could ever admit it
            # or TAS would misplace it: fail now; later attempts ask for what it asked for (a resume in the
            # triggerer, whose account reads no queues)
            if action.number == 1:
                self.cluster.check_admissible(job, coverage=self.options.check_queue)
            submitted, created = self.cluster.create_job(job)
        self.log.info(
            "%s Job %s/%s", "submitted" if created else "found already submitted", self.namespace, name
        )
        if self.cluster.create_service(build_service(self.spec, submitted)):
            self.log.info("created headless Service %s (rank 0: %s)", name, master_addr(name, self.namespace))

    # ---- following (the trigger) ---------------------------------------------------------------------
    def follower(self, async_client: follow.AsyncClient) -> Callable[[Attempt], Awaitable[Outcome]]:
        """Follow one attempt with ``RunFollower`` (its watches on ``async_client``) until it ends."""
        if self.follow_config is None or self.store is None:
            raise ValueError(f"run {self.run}: following needs the follow config and the store")

        def follow_attempt(attempt: Attempt) -> Awaitable[Outcome]:
            nodes = attempt.nodes or self.follow_config.nodes
            config = dataclasses.replace(self.follow_config, job_name=attempt.job, nodes=nodes)
            return RunFollower(config, self.cluster, async_client, self.store).follow()

        return follow_attempt

    async def follow_to_end(self, follow_attempt: Callable[[Attempt], Awaitable[Outcome]]) -> Action:
        """Reconcile; while the next step is to follow an attempt, follow it (``follow_attempt``, e.g.
        ``follower(async_client)``) and reconcile what was seen: judge, stop, resume at once, follow the
        next; an elastic resume short of nodes is decided again every ``WAIT_POLL_S`` until it may begin.
        Returns the end: ``Succeed`` or ``Fail``.  The blocking steps run in ``_RUN_THREADS``."""
        seen = None
        while True:
            action = await _in_thread(self.reconcile, seen=seen)
            if isinstance(action, Wait):
                await asyncio.sleep(max(0.0, min(WAIT_POLL_S, action.until - self.clock())))
                seen = None
                continue
            if not isinstance(action, Follow):
                return action
            self.followed = action.attempt
            seen = await follow_attempt(action.attempt)

    # ---- what the task returns or raises ------------------------------------------------------------
    def result(self, ledger: Ledger | None = None) -> dict:
        """The task's return value: the run path, the attempts and the latest verified checkpoint."""
        ledger = ledger or self.observe()
        checkpoint, _ = latest_checkpoint(self.spec.run_path, self.store)
        newest = ledger.newest
        return {
            "run_uri": self.spec.run_path,
            "job": newest.job if newest else None,
            "attempts": len(ledger.attempts),
            "resumes_used": max(0, len(ledger.attempts) - 1),
            "preemptions": ledger.preemptions,
            "excluded_nodes": ledger.excluded,
            "history": ledger.to_dict()["attempts"],
            "checkpoint": {"uri": checkpoint.uri, "step": checkpoint.step, "verified": checkpoint.how},
        }

    def failure_message(self, action: Fail, ledger: Ledger) -> str:
        """``action``'s reason, and for a spent budget where to resume from once the cause is fixed
        (``ledger``: the run's, as the caller read it)."""
        if not action.exhausted:
            return action.reason
        checkpoint, _ = latest_checkpoint(self.spec.run_path, self.store)
        where = f"{checkpoint.uri} (step {checkpoint.step})" if checkpoint.uri else "none"
        return (
            f"{action.reason}. Latest verified checkpoint: {where}. Excluded nodes: "
            f"{ledger.excluded or 'none'}. Fix the cause, then Clear the task to resume from that checkpoint."
        )


def stop_run(cluster: GangCluster, namespace: str, run: str, by: str, deadline: Deadline) -> list[str]:
    """Stop every attempt of ``run`` (``<dag_id>/<run_id>``) and wait until its pods are gone (the
    teardown, the reaper and the UI's return call it before the run's nodes go back)."""
    dag_id, _, run_id = run.partition("/")
    return TrainingRun(cluster, namespace, dag_id, run_id).stop(by, deadline)
