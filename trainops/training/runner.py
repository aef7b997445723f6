"""One try of the gang training task, Airflow-free: reattach or submit an attempt, follow it, judge how
it ended and resume it.

``GangRun.start()`` reattaches to the current attempt's Job when it is still alive (also when the
previous try's worker died right after submitting: the ledger names the Job before it is
created, and the name is deterministic), and otherwise submits a new attempt that resumes from
the latest verified checkpoint.  ``GangRun.finish(outcome)`` classifies the end of an attempt
and returns a ``Verdict``: succeeded, retry (a resume), or fail now.  ``GangRun.run_attempts(...)``
(the trigger's loop) follows the attempt and, while the verdict is a resume and the budget allows,
starts the next attempt at once and follows that: a crash is resumed within a second, without a
round trip through the scheduler and a worker.  A trigger rebuilt after a triggerer restart holds
the ledger it was deferred with, as does the try after a Clear that killed a trigger before its event:
``start()`` (``catch_up``) finds the attempts begun since by their Jobs, named by attempt number,
instead of making them twice or taking a stopped one for the next.
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
from dataclasses import dataclass, field
from enum import StrEnum

from trainops.checkpoints.owner import claim_run_path
from trainops.checkpoints.store import CheckpointStore
from trainops.errors import PermanentError
from trainops.health.slowdown import record as record_slowdown
from trainops.health.slowdown import slowed_in_run
from trainops.kube.retry import Deadline
from trainops.training import follow
from trainops.training.attempts import UNRECORDED, AttemptRecord, Phase, RunLedger
from trainops.training.blame import quarantine_node
from trainops.training.cluster import GangCluster
from trainops.training.failures import Failure, FailureKind, classify
from trainops.training.follow import Status
from trainops.training.job import (
    build_job,
    build_service,
    condition,
    finished,
    kept_out,
    master_addr,
    resume_point,
)
from trainops.training.naming import job_name
from trainops.training.spec import CONTAINER_NAME, TrainingSpec

log = logging.getLogger(__name__)


class Decision(StrEnum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAIL = "fail"


@dataclass
class Verdict:
    decision: Decision
    message: str
    failure: Failure | None = None
    result: dict = field(default_factory=dict)


@dataclass
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


SLOWDOWN_WRITE_S = 60.0  # how long recording a slowed node on the Node may retry
_STATUS_KIND = {  # how the follower ended an attempt -> the failure it is judged as
    Status.HANG: FailureKind.HANG,
    Status.HEARTBEAT_UNREADABLE: FailureKind.HEARTBEAT_UNREADABLE,
    Status.START_TIMEOUT: FailureKind.START_TIMEOUT,
    Status.ADMISSION_TIMEOUT: FailureKind.ADMISSION_TIMEOUT,
    Status.PODS_REFUSED: FailureKind.PODS_REFUSED,
    Status.DEACTIVATED: FailureKind.STOPPED,
    Status.KUEUE_DEACTIVATED: FailureKind.KUEUE_DEACTIVATED,
    Status.JOB_MISSING: FailureKind.INFRASTRUCTURE,
}


# The trigger's blocking work runs here, not in the event loop's default executor, which every trigger
# in the triggerer shares: judging may wait up to ``evidence_wait_s`` on the nodes' reports.
_RUN_THREADS = ThreadPoolExecutor(thread_name_prefix="trainops-gang-run")


async def _in_thread(fn: Callable, *args):
    """``asyncio.to_thread`` (the context, logging's included, goes along) in ``_RUN_THREADS``."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_RUN_THREADS, call)


# what a trigger gets to judge and resume the run as the try would (``to_dict``)
OPTIONS = (
    "fail_fast_on_user_error",
    "unconfirmed_fault_retries",
    "quarantine_culprits",
    "evidence_wait_s",
    "max_resumes",
    "first_try",
)


class GangRun:
    """``cluster``: the run's Jobs and nodes; ``store``: the checkpoint store of the run path (Airflow:
    from the AWS connection); ``save(ledger_dict)`` persists the ledger (Airflow: the task state store);
    ``try_number``: the Airflow try this is (recorded on the attempts it begins); ``max_resumes``: the
    resumes allowed since try ``first_try`` (the run's start or its last Clear: each Clear gives a fresh
    budget)."""

    def __init__(
        self,
        spec: TrainingSpec,
        dag_id: str,
        run_id: str,
        cluster: GangCluster,
        store: CheckpointStore,
        ledger: RunLedger,
        save: Callable[[dict], None],
        *,
        fail_fast_on_user_error: bool = True,
        unconfirmed_fault_retries: int = 0,
        quarantine_culprits: bool = True,
        evidence_wait_s: float = 0.0,
        try_number: int = 1,
        max_resumes: int = 0,
        first_try: int = 1,
        logger: logging.Logger = log,
    ) -> None:
        self.spec, self.dag_id, self.run_id, self.try_number = spec, dag_id, run_id, try_number
        self.cluster, self.store, self.ledger, self._save = cluster, store, ledger, save
        self.fail_fast_on_user_error = fail_fast_on_user_error
        self.unconfirmed_fault_retries = unconfirmed_fault_retries
        self.quarantine_culprits = quarantine_culprits
        self.evidence_wait_s = evidence_wait_s
        self.max_resumes, self.first_try = max_resumes, first_try
        self.log = logger
        self.submit_lock = threading.Lock()  # held while a Job is created
        self.killed = False  # set under submit_lock by ``stop_submitting``: no Job is created after it

    def save(self) -> None:
        self._save(self.ledger.to_dict())

    @property
    def resumes_left(self) -> int:
        return max(0, self.max_resumes - self.ledger.resumes_since(self.first_try))

    # ---- handing the run to the trigger --------------------------------------------------
    def to_dict(self) -> dict:
        """What a trigger needs to go on with this run (JSON: it is stored with the trigger)."""
        return {
            "spec": json.loads(json.dumps(dataclasses.asdict(self.spec))),
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "try_number": self.try_number,
            "ledger": self.ledger.to_dict(),
            **{name: getattr(self, name) for name in OPTIONS},
        }

    @classmethod
    def from_dict(
        cls, data: dict, cluster: GangCluster, store: CheckpointStore, logger: logging.Logger = log
    ) -> GangRun:
        """The run ``to_dict`` described; its ledger is kept in memory (the trigger's event carries it)."""
        return cls(
            TrainingSpec(**data["spec"]),
            data["dag_id"],
            data["run_id"],
            cluster,
            store,
            RunLedger.from_dict(data["ledger"]),
            save=lambda _ledger: None,
            try_number=data["try_number"],
            logger=logger,
            **{name: data[name] for name in OPTIONS},
        )

    def event(self, verdict: Verdict) -> dict:
        """The trigger's event: the verdict on the run and the ledger that led to it."""
        return {
            "decision": str(verdict.decision),
            "message": verdict.message,
            "result": verdict.result,
            "ledger": self.ledger.to_dict(),
        }

    def adopt(self, event: dict) -> Verdict:
        """Take the ledger the trigger kept (saved first: a resume it made must not be lost) and its verdict."""
        self.ledger = RunLedger.from_dict(event["ledger"])
        self.save()
        return Verdict(Decision(event["decision"]), event["message"], result=event["result"])

    # ---- start -------------------------------------------------------------------------
    def start(self, resume_stopped: bool = True) -> tuple[AttemptRecord, bool]:
        """Reattach or submit; returns the attempt and whether this try reattached.  What was decided
        since the run's start or its last Clear stands (a worker may die after it saved the trigger's
        event): an attempt that failed while no try watched is judged first, one judged to fail or with
        no resume left raises ``PermanentError``, and one that succeeded is followed again.  An attempt
        stopped by someone else (a Clear's or mark-failed's ``on_kill``, the teardown) is resumed, as a try
        after a Clear must; with ``resume_stopped=False`` (a trigger) it is followed, and the follow ends it
        as stopped: a trigger that starts after the teardown stopped the run must not resume it."""
        if claim_run_path(self.store, self.spec.run_path, f"{self.dag_id}/{self.run_id}"):
            self.log.info("run path %s now belongs to this DAG run", self.spec.run_path)
        self.catch_up()
        live = self.ledger.live
        if live is not None:
            job = self.cluster.read_job(self.spec.namespace, live.job)
            running = job is not None and not finished(job)
            stopped = self.cluster.stopped(self.spec.namespace, job) if running and resume_stopped else None
            if stopped is not None:
                # stopped (a Clear's or a mark-failed's on_kill) before it ended: a new attempt, not a
                # reattach, whose follow would end at once as deactivated and fail the run
                self.log.info(
                    "attempt %d's Job %s was stopped (Workload %s deactivated)",
                    live.number,
                    live.job,
                    stopped,
                )
                self.ledger.end(
                    FailureKind.STOPPED, f"stopped while no try was watching: Workload {stopped} deactivated"
                )
                self.save()
                return self._next_attempt(), False
            if running:
                self.log.info("attempt %d's Job %s is running: following it", live.number, live.job)
                self.cluster.create_service(build_service(self.spec, job))  # gone if a try died mid-submit
                return live, True
            if job is None and live.phase is Phase.SUBMITTING:
                self.log.info(
                    "attempt %d's Job %s was never created (the try died first): creating it",
                    live.number,
                    live.job,
                )
                with self.submit_lock:
                    self._submit(live)
                return live, False
            if job is None:
                self.ledger.end(FailureKind.INFRASTRUCTURE, f"Job {live.job} disappeared")
            elif condition(job, "Complete"):
                self.ledger.end(Status.SUCCEEDED, "completed while no try was watching")
                self.save()
                return live, True
            else:
                pods = self.cluster.job_pods(self.spec.namespace, live.job)
                outcome = follow.Outcome(Status.FAILED, "failed while no try was watching", live.job, pods)
                verdict = self._judge_failure(outcome)
                if verdict.decision is not Decision.RETRY:  # the user's code, say: no resume
                    self.save()
                    raise PermanentError(verdict.message)
            self.save()
        elif (last := self.ledger.current) is not None and last.try_number >= self.first_try:
            # ended with no Clear since: the worker died after it saved the trigger's event
            if last.kind == Status.SUCCEEDED:
                self.log.info("attempt %d already succeeded: following its completed Job", last.number)
                return last, True
            if last.verdict == Decision.FAIL:
                raise PermanentError(f"attempt {last.number} failed, no resume ({last.kind}): {last.ended}")
        return self._next_attempt(), False

    def _next_attempt(self) -> AttemptRecord:
        """``new_attempt`` from ``start()``, when the budget allows it: the first attempt since the run's
        start or its last Clear is free, each after that is a resume."""
        if any(a.try_number >= self.first_try for a in self.ledger.attempts):
            if self.resumes_left <= 0:
                raise PermanentError(self.exhausted_message(self.ledger.current.ended or "no resume left"))
            self.log.info("resuming (%d more resumes left)", self.resumes_left - 1)
        return self.new_attempt()

    def catch_up(self) -> int:
        """Put in the ledger the attempts a trigger began that it never handed back (the triggerer
        restarted, or a Clear or mark-failed killed the trigger before its event): their Jobs exist under
        the next attempt numbers, and say where they resumed from and which nodes they kept out.  The
        attempt each one replaced was judged a resume by that trigger, whose reasons are lost: it ends
        ``unrecorded``.  Returns how many it found."""
        found = 0
        while job := self.cluster.read_job(
            self.spec.namespace, job_name(self.dag_id, self.run_id, self.ledger.next_number())
        ):
            if self.ledger.live is not None:
                self.ledger.end(UNRECORDED, "resumed by a trigger whose ledger was lost")
            for node in sorted(kept_out(job)):
                self.ledger.exclude(node, "kept out by a trigger whose ledger was lost")
            earlier, (resume_from, resume_step) = self.ledger.current, resume_point(job)
            record = self.ledger.begin(
                job["metadata"]["name"],
                resume_from,
                resume_step,
                "found on the cluster (begun by a trigger)",
                earlier.try_number if earlier else self.try_number,
            )
            record.phase = Phase.SUBMITTED
            self.log.info("attempt %d (Job %s) was begun by a trigger", record.number, record.job)
            found += 1
        if found:
            self.save()
        return found

    def stop_submitting(self) -> str:
        """The task was killed: no Job is created from now on (a start or resume still running in a thread
        of a cancelled trigger fails instead).  Returns the current attempt's Job, to be stopped: a submit
        under way holds ``submit_lock``, so it is that attempt's Job, created."""
        with self.submit_lock:
            self.killed = True
            return self.ledger.current.job

    def new_attempt(self) -> AttemptRecord:
        """Submit the next attempt, resuming from the latest verified checkpoint (or a fresh start).
        ``submit_lock`` is held meanwhile (a stop waits on it, then stops the Job this makes)."""
        with self.submit_lock:
            return self._new_attempt()

    def _new_attempt(self) -> AttemptRecord:
        checkpoint, skipped = latest_checkpoint(self.spec.run_path, self.store)
        number = self.ledger.next_number()
        record = self.ledger.begin(
            job_name(self.dag_id, self.run_id, number),
            checkpoint.uri,
            checkpoint.step,
            checkpoint.how,
            self.try_number,
        )
        self.save()  # before the submit: a worker dying now leaves the Job's name behind
        self.log.info("attempt %d: Job %s", number, record.job)
        if checkpoint.uri:
            self.log.info("resuming from %s (step %s, %s)", checkpoint.uri, checkpoint.step, checkpoint.how)
        else:
            self.log.info("fresh start: %s", checkpoint.how)
        for reason in skipped:
            self.log.info("skipped newer checkpoint %s", reason)
        if self.ledger.excluded:
            for node, why in sorted(self.ledger.excluded.items()):
                self.log.info("excluded node %s: %s", node, why)
        else:
            self.log.info("excluded nodes: none")
        self._submit(record)
        return record

    def _submit(self, record: AttemptRecord) -> None:
        if self.killed:
            raise PermanentError(
                f"the task was killed: attempt {record.number}'s Job {record.job} is not created"
            )
        job = build_job(
            self.spec,
            name=record.job,
            dag_id=self.dag_id,
            run_id=self.run_id,
            attempt=record.number,
            resume_from=record.resume_from,
            excluded_nodes=self.ledger.excluded,
        )
        submitted, created = self.cluster.create_job(job)
        self.log.info(
            "%s Job %s/%s",
            "submitted" if created else "found already submitted",
            self.spec.namespace,
            record.job,
        )
        if self.cluster.create_service(build_service(self.spec, submitted)):
            self.log.info(
                "created headless Service %s (rank 0: %s)",
                record.job,
                master_addr(record.job, self.spec.namespace),
            )
        record.phase = Phase.SUBMITTED
        self.save()

    # ---- follow, judge, resume ------------------------------------------------------------
    async def run_attempts(self, follow_attempt: Callable[[str], Awaitable[follow.Outcome]]) -> Verdict:
        """Follow the current attempt (``follow_attempt(job)``) to its end and judge it; while the verdict
        is a resume and the budget allows, start the next attempt and follow that.  It starts with
        ``start()``, as a try does: a trigger rebuilt after a triggerer restart holds the ledger it was
        deferred with, and the run may have moved on since (another attempt begun; one stopped by someone
        else is followed to its end as stopped, not resumed: ``start(resume_stopped=False)``).  The
        blocking judging and submitting run in threads of their own (``_RUN_THREADS``)."""
        await _in_thread(self.start, False)
        while True:
            outcome = await follow_attempt(self.ledger.current.job)
            verdict = await _in_thread(self.finish, outcome.to_dict())
            if verdict.decision is not Decision.RETRY or self.resumes_left <= 0:
                return verdict
            self.log.info(
                "resuming at once (%d more resumes left): %s", self.resumes_left - 1, verdict.message
            )
            await _in_thread(self.new_attempt)

    # ---- finish ------------------------------------------------------------------------
    def finish(self, event: dict) -> Verdict:
        outcome = follow.Outcome(**event)
        self._keep_out_slowed(outcome)
        for message in outcome.preemptions:
            self.ledger.preemptions += 1
            self.log.info("preempted and requeued by Kueue (no resume used): %s", message)
        if outcome.status is Status.SUCCEEDED:
            self.ledger.end(Status.SUCCEEDED, outcome.message, seen_at=outcome.seen_at)
            self.save()
            return Verdict(Decision.SUCCEEDED, outcome.message, result=self.result())
        if outcome.stopped:
            self.log.info("stopped the run: %s", outcome.stopped)
        verdict = self._judge_failure(outcome)
        self.save()
        return verdict

    def _keep_out_slowed(self, outcome: follow.Outcome) -> None:
        """Nodes the attempt's own step times (its last heartbeat) show slowed down: kept on the node
        for the next run's gate, and out of this run's next attempt (``trainops.health.slowdown``)."""
        run = f"{self.dag_id}/{self.run_id}"
        for node, slow in sorted(slowed_in_run(outcome.heartbeat, outcome.pods, run).items()):
            self.log.info("keeping node %s out: %s", node, slow.reason)
            record_slowdown(self.cluster.core, slow, Deadline(SLOWDOWN_WRITE_S))
            self.ledger.exclude(node, slow.reason)

    def _judge_failure(self, outcome: follow.Outcome) -> Verdict:
        """The verdict on a failed attempt, recorded on it (a try after a lost worker reads it)."""
        verdict = self._verdict(outcome)
        self.ledger.current.verdict = str(verdict.decision)
        self.log.info("attempt %d ended: %s", self.ledger.current.number, verdict.message)
        return verdict

    def _verdict(self, outcome: follow.Outcome) -> Verdict:
        nodes: dict[str, dict | None] = {}
        if outcome.status is Status.FAILED:
            nodes, logs = self.cluster.failure_evidence(self.spec.namespace, outcome.pods)
            failure = classify(outcome.pods, nodes, logs, container=CONTAINER_NAME)
            failure, nodes = self._await_node_evidence(failure, outcome, nodes, logs)
        else:
            failure = Failure(_STATUS_KIND[outcome.status], outcome.message)
        for line in failure.evidence:
            self.log.info("evidence: %s", line)
        for line in failure.hints:
            self.log.info("hint (not evidence against a node): %s", line)
        if failure.kind is FailureKind.INFRASTRUCTURE:
            self._blame(failure, nodes)
            self.log.info("stopping the attempt: %s", self._stop_attempt(outcome))
        self.ledger.end(failure.kind, failure.reason, failure.hints, seen_at=outcome.seen_at)
        if failure.kind is FailureKind.USER_CODE and failure.hints:
            # the pods printed GPU/NCCL errors no node confirms: the user's code, or a fault the nodes
            # cannot see (a flaky link, an NCCL timeout): a small cap of its own (each retry is still a resume)
            used = sum(1 for a in self.ledger.attempts if a.kind == FailureKind.USER_CODE and a.hints)
            if used <= self.unconfirmed_fault_retries:
                return Verdict(
                    Decision.RETRY,
                    f"unconfirmed fault ({used} of {self.unconfirmed_fault_retries} such retries): {failure.reason}",
                    failure,
                )
        if failure.kind is FailureKind.USER_CODE and self.fail_fast_on_user_error:
            return Verdict(Decision.FAIL, f"user code failed (no resume used): {failure.reason}", failure)
        if failure.retryable or failure.kind is FailureKind.USER_CODE:
            return Verdict(Decision.RETRY, f"{failure.kind}: {failure.reason}", failure)
        return Verdict(Decision.FAIL, f"{failure.kind}: {failure.reason}", failure)

    def _await_node_evidence(
        self, failure: Failure, outcome: follow.Outcome, nodes: dict[str, dict | None], logs: dict[str, str]
    ) -> tuple[Failure, dict[str, dict | None]]:
        """When the pods printed GPU or NCCL errors but no node confirms one, watch the nodes for up to
        ``evidence_wait_s``: the node probe reports a real fault within its interval, and the watch
        judges the moment it does."""
        if failure.kind is not FailureKind.USER_CODE or not failure.hints or self.evidence_wait_s <= 0:
            return failure, nodes
        self.log.info(
            "the pods printed GPU/NCCL errors; waiting up to %gs for the nodes' own health reports",
            self.evidence_wait_s,
        )
        names, until = sorted(nodes), time.monotonic() + self.evidence_wait_s
        for nodes in self.cluster.node_changes(names, until):  # noqa: B020 - the latest reading of the same nodes
            failure = classify(outcome.pods, nodes, logs, container=CONTAINER_NAME)
            if failure.kind is not FailureKind.USER_CODE:
                break
        return failure, nodes

    def _stop_attempt(self, outcome: follow.Outcome) -> str:
        """Deactivate the Workload the follower saw (one call); without one (no Kueue Workload, or it
        is gone), the full ``GangCluster.stop``."""
        if outcome.workload and self.cluster.deactivate_workload(self.spec.namespace, outcome.workload):
            return f"deactivated Workload {outcome.workload} (spec.active=false)"
        return self.cluster.stop(self.spec.namespace, outcome.job)

    def _blame(self, failure: Failure, nodes: dict[str, dict | None]) -> None:
        """Quarantine the culprits; ``nodes``: those just read for the classification (saves a read)."""
        for node, evidence in sorted(failure.culprits.items()):
            reason = "; ".join(evidence["problems"])
            if self.quarantine_culprits:
                wrote = quarantine_node(
                    self.cluster.core,
                    node,
                    reason,
                    {"problems": evidence["problems"], "run": f"{self.dag_id}/{self.run_id}"},
                    nodes.get(node),
                )
                self.log.info(
                    "quarantined node %s%s: %s", node, "" if wrote else " (already quarantined)", reason
                )
            self.ledger.exclude(node, reason)

    def result(self) -> dict:
        checkpoint, _ = latest_checkpoint(self.spec.run_path, self.store)
        current = self.ledger.current
        return {
            "run_uri": self.spec.run_path,
            "job": current.job if current else None,
            "attempts": len(self.ledger.attempts),
            "resumes_used": self.ledger.resumes_used,
            "preemptions": self.ledger.preemptions,
            "excluded_nodes": self.ledger.excluded,
            "history": self.ledger.to_dict()["attempts"],
            "checkpoint": {"uri": checkpoint.uri, "step": checkpoint.step, "verified": checkpoint.how},
        }

    def exhausted_message(self, last: str) -> str:
        checkpoint, _ = latest_checkpoint(self.spec.run_path, self.store)
        where = f"{checkpoint.uri} (step {checkpoint.step})" if checkpoint.uri else "none"
        return (
            f"resumes exhausted after {len(self.ledger.attempts)} attempts; last: {last}. "
            f"Latest verified checkpoint: {where}. Excluded nodes: {self.ledger.excluded or 'none'}. "
            "Fix the cause, then Clear the task to resume from that checkpoint."
        )
