"""The lifecycle's steps, Airflow-free, as the operators run them: claim, one try of ``train`` (with its
trigger's resumes), give back.

Each takes a ``Step`` (what an Airflow task would have from its context and connections: the
cluster, the run key, the run's task state) so it runs the same in the campaign's process and in a
child process it SIGKILLs (``python -m benchmarks.campaign.steps STEP JSON``).  The ledger, which
Airflow keeps in the task state store, is a JSON file here; the S3 endpoint comes from the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainops.capacity.procedure import Deadlines, claim, give_back
from trainops.checkpoints.store import CheckpointStore
from trainops.kube.client import Kube
from trainops.training.attempts import RunLedger
from trainops.training.cluster import GangCluster
from trainops.training.follow import FollowConfig, Outcome, RunFollower
from trainops.training.progress import HangPolicy
from trainops.training.runner import Decision, GangRun, Verdict
from trainops.training.spec import TrainingSpec

DEPLOYMENTS = ["inference/llm-chat", "inference/embeddings"]
DEADLINES = Deadlines(api_s=60, drain_s=120, ready_s=120, drain_stall_s=10)
QUEUE = "training"
GANG = 2  # training nodes; the claim takes one spare
STEPS = 100
TRAIN_ARGS = [
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    "20",
    "--step-seconds",
    "0.02",
    "--heartbeat-every",
    "5",
]
RESUMES = 3  # max_resumes: the trigger's resumes per run, a fresh budget after a Clear
# a save takes well under a second here: a trainer hung in one is caught in 10 s, not the default 30 min
HANG = HangPolicy(floor=3.0, startup_timeout=30.0, safety_factor=5.0, save_timeout=10.0)


@dataclass
class Step:
    kubeconfig: str
    run: str  # <dag_id>/<run_id>, the claim key
    run_uri: str
    ledger: str  # the task state store's file
    nodes: list[str] = field(default_factory=list)  # claim: candidates; train: the claimed nodes

    def kube(self) -> Kube:
        return Kube.from_kubeconfig(self.kubeconfig)

    def load_ledger(self) -> RunLedger:
        path = Path(self.ledger)
        return RunLedger.from_dict(json.loads(path.read_text()) if path.exists() else None)

    def save_ledger(self, ledger: dict) -> None:
        tmp = Path(self.ledger).with_suffix(".tmp")
        tmp.write_text(json.dumps(ledger))
        tmp.replace(self.ledger)  # atomic: a SIGKILL leaves the old state or the new


def claim_step(step: Step) -> list[str]:
    """ClaimNodesOperator: claim ``GANG + 1`` of the gate's nodes; a failed claim gives back what it took."""
    kube = step.kube()
    try:
        summary = claim(
            kube,
            step.run,
            step.nodes,
            count=GANG + 1,
            cluster_queue=QUEUE,
            deployments=DEPLOYMENTS,
            deadlines=DEADLINES,
        )
    except Exception:
        give_back(kube, step.run, cluster_queue=QUEUE, deadlines=DEADLINES)
        raise
    return summary.node_names


def give_back_step(step: Step) -> None:
    """ReturnCapacityOperator (the teardown)."""
    give_back(step.kube(), step.run, cluster_queue=QUEUE, deadlines=DEADLINES)


def gang_run(step: Step, store: CheckpointStore, try_number: int = 1, first_try: int = 1) -> GangRun:
    """The train task's run for one try; its resume budget counts from try ``first_try``."""
    dag_id, _, run_id = step.run.partition("/")
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args=TRAIN_ARGS,
        run_uri=step.run_uri,
        nodes=GANG,
        node_names=step.nodes,
        termination_grace_seconds=5,  # a hung trainer holds its nodes this long after the stop
    )
    return GangRun(
        spec,
        dag_id,
        run_id,
        GangCluster(step.kube()),
        store,
        step.load_ledger(),
        save=step.save_ledger,
        unconfirmed_fault_retries=1,
        evidence_wait_s=5,
        try_number=try_number,
        max_resumes=RESUMES,
        first_try=first_try,
    )


def async_client(kubeconfig: str):
    """``() -> async context manager`` of a kubernetes_asyncio ApiClient of ``kubeconfig`` (a trigger's client)."""

    @contextlib.asynccontextmanager
    async def client():
        from kubernetes_asyncio import config

        api = await config.new_client_from_config(config_file=kubeconfig)
        try:
            yield api
        finally:
            await api.close()

    return client


async def _until_cleared(followed: Awaitable[Verdict], cleared: threading.Event) -> Verdict | None:
    """``followed``'s verdict, or None when ``cleared`` is set first (the trigger is killed)."""
    task = asyncio.ensure_future(followed)
    while not task.done():
        if cleared.is_set():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None
        await asyncio.wait([task], timeout=0.1)
    return task.result()


def train_try(
    step: Step,
    store: CheckpointStore,
    try_number: int,
    first_try: int,
    cleared: threading.Event | None = None,
    on_start=lambda: None,
) -> Verdict | None:
    """GangTrainingOperator.execute (start), its trigger (follow, judge, resume while the budget counted
    from try ``first_try`` allows), execute_complete (the ledger saved).  None when ``cleared`` stopped the trigger first (the Clear's
    on_kill stops the Job; the trigger's ledger is lost, as in Airflow).
    ``on_start()``: called once the attempt is submitted or reattached."""
    run = gang_run(step, store, try_number, first_try)
    run.start()
    on_start()
    trigger = GangRun.from_dict(run.to_dict(), run.cluster, store)
    client = async_client(step.kubeconfig)

    def follow_attempt(job: str) -> Awaitable[Outcome]:
        config = FollowConfig(
            "training",
            job,
            step.run_uri,
            GANG,
            hang=HANG,
            start_timeout=60,
            admission_timeout=120,
            heartbeat_poll=0.2,
        )
        return RunFollower(config, trigger.cluster, client, store).follow()

    verdict = asyncio.run(_until_cleared(trigger.run_attempts(follow_attempt), cleared or threading.Event()))
    if verdict is None:
        GangCluster(step.kube()).stop("training", trigger.stop_submitting())  # the trigger's on_kill
        return None
    step.save_ledger(trigger.ledger.to_dict())
    return verdict


def main(argv: list[str]) -> int:
    name, step = argv[0], Step(**json.loads(argv[1]))
    if name == "claim":
        claim_step(step)
    elif name == "train":
        verdict = train_try(step, CheckpointStore(), try_number=1, first_try=1)
        print(json.dumps(asdict(verdict), default=str))
        return 0 if verdict.decision is Decision.SUCCEEDED else 1
    elif name == "give_back":
        give_back_step(step)
    else:
        raise SystemExit(f"unknown step {name!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
