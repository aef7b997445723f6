"""A training fault, struck the same way at either policy's running attempt.

Both policies' attempts are struck at the same moment of their run (once the heartbeat passes
``AT_STEP``, between two checkpoints) and on the same rank (drawn from the run's seed, by completion
index), so that the seeded schedule is one schedule.  ``Strike`` says whether and how it landed.

A hang freezes every rank; NCCL's watchdog then aborts them after its timeout (``nccl_watchdog``), as
``ProcessGroupNCCL`` does with its default 10 minutes (scaled): a policy that sees the hang sooner stops
the attempt first.  A torn checkpoint is the newest committed one with a rank's shard cut short (a save
that crashed after its commit marker, as a tracker written before the barrier leaves it), and the ranks
then killed, so it is the checkpoint a resume is offered first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainops_devcluster.demo.trainer import newest_listed

from benchmarks.campaign import faults as kinds
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri

NAMESPACE = "training"
AT_STEP = 50  # between the checkpoints of steps 40 and 60
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
NCCL_ABORT = (
    "[PG ID 0 PG GUID 0 Rank {rank}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for {ms} milliseconds before timing out."
)


@dataclass
class Strike:
    kind: str
    at: float | None = None  # when it hit (None: it never found a running attempt)
    step: int = -1  # the heartbeat's step then
    job: str = ""
    pod: str = ""
    node: str = ""
    torn: str = ""  # the checkpoint torn (torn-checkpoint)
    note: str = ""

    @property
    def landed(self) -> bool:
        return self.at is not None and (self.kind != "torn-checkpoint" or bool(self.torn))


def running(cluster, is_ours: Callable[[dict], bool]) -> list[dict]:
    """The run's Running pods, by completion index."""
    pods = [
        p
        for p in cluster.store.list("pods", NAMESPACE)[0]
        if is_ours(p)
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]
    return sorted(pods, key=lambda p: int(p["metadata"].get("labels", {}).get(INDEX_LABEL) or 0))


def strike(
    cluster,
    kind: str,
    rank: int,
    step: Callable[[], int],
    is_ours: Callable[[dict], bool],
    run_uri: str,
    nccl_timeout_s: float,
    target: str = "",
    timeout: float = 180,
) -> Strike:
    """Wait until the run's heartbeat passes ``AT_STEP`` with all its ranks running, then strike rank
    ``rank`` (modulo the ranks) with ``kind``; ``nvlink`` strikes the link of ``target``, the node its storm
    degraded before the run, whoever runs there."""
    found, deadline = Strike(kind), time.monotonic() + timeout
    while not (step() >= AT_STEP and len(pods := running(cluster, is_ours)) >= 2):
        if time.monotonic() > deadline:
            found.note = f"no running attempt past step {AT_STEP} within {timeout:g} s"
            return found
        time.sleep(0.02)
    pod = pods[rank % len(pods)]
    found.job, found.pod = pod["metadata"]["labels"][JOB_NAME_LABEL], pod["metadata"]["name"]
    found.node, found.step = pod["spec"]["nodeName"], step()
    if kind == "torn-checkpoint":
        found.torn = tear_newest(run_uri)
        for each in pods:  # before the next commit: the torn one stays the newest
            crash(cluster, each, 137)
        found.at = time.time()
        if found.torn and newest_committed(run_uri) != found.torn:
            found.note, found.torn = f"a newer checkpoint than {found.torn} was committed meanwhile", ""
        return found
    found.at = time.time()
    if kind == "nvlink":
        killed = kinds.link_fails(cluster, target)["result"]["failed_pods"]
        found.node = target
        found.note = f"XID 74 on {target} GPU 0 at step {found.step}: " + (
            f"killed {', '.join(killed)}" if killed else "no pod there"
        )
    elif kind in kinds.TRAIN_NODE:
        kinds.node_fault(cluster, kind, found.node)
    elif kind == "pod-crash":
        crash(cluster, pod, 137)
    elif kind == "hang":
        cluster.inject("hang", f"{NAMESPACE}/{found.job}")
        nccl_watchdog(cluster, found.job, nccl_timeout_s)
    return found


def crash(cluster, pod: dict, code: int, message: str = "") -> None:
    try:
        cluster.inject("crash-pod", f"{NAMESPACE}/{pod['metadata']['name']}", exit_code=code, message=message)
    except Exception:  # noqa: BLE001,S110 - it ended by itself meanwhile
        pass


def nccl_watchdog(cluster, job: str, timeout_s: float) -> None:
    """In ``timeout_s``, abort the Job's ranks still running (hung), as NCCL's watchdog does."""

    def abort() -> None:
        for pod in running(cluster, lambda p: p["metadata"].get("labels", {}).get(JOB_NAME_LABEL) == job):
            rank = pod["metadata"]["labels"].get(INDEX_LABEL, "0")
            crash(cluster, pod, 134, NCCL_ABORT.format(rank=rank, ms=int(timeout_s * 1000)))

    timer = threading.Timer(timeout_s, abort)
    timer.daemon = True
    timer.start()


def newest_committed(run_uri: str) -> str:
    """The newest checkpoint with its commit marker, as the baseline's trainer lists it ("" if none)."""
    return newest_listed(CheckpointStore(), S3Uri.parse(run_uri, field="run_uri")) or ""


def tear_newest(run_uri: str) -> str:
    """Cut rank 1's shard of the newest committed checkpoint short; returns that checkpoint ("" if none)."""
    newest = newest_committed(run_uri)
    if newest:
        checkpoint = S3Uri.parse(newest, field="checkpoint")
        CheckpointStore().put(checkpoint.bucket, checkpoint.key("rank-1.bin"), b"torn")
    return newest
