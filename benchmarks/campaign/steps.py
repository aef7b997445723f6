"""The lifecycle's steps, Airflow-free, through the product's own calls: claim, one try of ``train``
(``TrainingRun.reconcile`` as ``execute`` calls it, ``follow_to_end`` as its trigger runs it, ``halt``
as a Clear's ``on_kill`` calls it, ``reconcile`` again as ``execute_complete``), give back.

Each takes a ``Step`` (what an Airflow task would have from its context and connections: the
cluster, the run key, the run path) so it runs the same in the campaign's process and in a child
process it SIGKILLs (``python -m benchmarks.campaign.steps STEP JSON``).  The run's ledger is its Jobs,
as in Airflow; the S3 endpoint comes from the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Awaitable
from dataclasses import dataclass, field

from benchmarks.campaign.timing import Timing
from trainops.capacity.procedure import Deadlines, claim, give_back
from trainops.checkpoints.store import CheckpointStore
from trainops.kube.client import Kube
from trainops.training.cluster import GangCluster
from trainops.training.decide import Action, Budget, Follow, Options, Succeed
from trainops.training.follow import FollowConfig
from trainops.training.progress import HangPolicy
from trainops.training.reconcile import TrainingRun
from trainops.training.spec import TrainingSpec

DEPLOYMENTS = ["inference/llm-chat", "inference/embeddings"]
DEADLINES = Deadlines(api_s=60, drain_s=120, ready_s=120, drain_stall_s=10)
QUEUE = NAMESPACE = "training"
GANG = 2  # training nodes; the claim takes one spare
STEPS, CHECKPOINT_EVERY, STEP_S = 100, 20, 0.02
TRAIN_ARGS = [
    *("--steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY)),
    *("--step-seconds", str(STEP_S), "--heartbeat-every", "5"),
]
RESUMES = 3  # max_resumes: the trigger's resumes per run, a fresh budget after a Clear


@dataclass
class Step:
    kubeconfig: str
    run: str  # <dag_id>/<run_id>, the claim key
    run_uri: str
    nodes: list[str] = field(default_factory=list)  # claim: candidates; train: the claimed nodes
    scale: float = Timing.scale  # the campaign's time scale (``timing``)

    def kube(self) -> Kube:
        return Kube.from_kubeconfig(self.kubeconfig)

    @property
    def timing(self) -> Timing:
        return Timing(self.scale)


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
        give_back_step(step)
        raise
    return summary.node_names


def give_back_step(step: Step):
    """ReturnCapacityOperator (the teardown): the run's Jobs stopped, its nodes and quota returned."""
    return give_back(
        step.kube(), step.run, cluster_queue=QUEUE, training_namespace=NAMESPACE, deadlines=DEADLINES
    )


def training_run(step: Step, store: CheckpointStore, try_number: int = 1, first_try: int = 1) -> TrainingRun:
    """The train task's run for one try, as ``GangTrainingOperator.training_run`` makes it: its resume
    budget counts from try ``first_try``."""
    dag_id, _, run_id = step.run.partition("/")
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args=TRAIN_ARGS,
        run_uri=step.run_uri,
        nodes=GANG,
        node_names=step.nodes,
        termination_grace_seconds=max(
            1, round(step.timing.termination_grace_s)
        ),  # a hung trainer holds its nodes
    )
    timing = step.timing
    hang = HangPolicy(
        floor=timing.hang_floor_s,
        startup_timeout=timing.startup_timeout_s,
        save_timeout=timing.save_timeout_s,
    )
    # start and admission deadlines are generous here: a loaded machine starts pods slowly
    follow = FollowConfig(
        NAMESPACE,
        "",
        step.run_uri,
        GANG,
        hang=hang,
        start_timeout=60,
        admission_timeout=120,
        heartbeat_poll=0.2,
    )
    return TrainingRun(
        GangCluster(step.kube()),
        NAMESPACE,
        dag_id,
        run_id,
        spec=spec,
        store=store,
        budget=Budget(try_number, first_try, max_resumes=RESUMES, unconfirmed_fault_retries=1),
        options=Options(evidence_wait_s=timing.evidence_wait_s),
        follow_config=follow,
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


async def _until_cleared(followed: Awaitable[Action], cleared: threading.Event) -> Action | None:
    """``followed``'s end, or None when ``cleared`` is set first (the trigger is killed)."""
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
) -> Action | None:
    """One try of ``train``: ``execute`` (reconcile), its trigger (rebuilt from ``to_dict`` as the triggerer
    does; ``follow_to_end``), ``execute_complete`` (reconcile): ``Succeed`` or ``Fail``.  None when
    ``cleared`` killed the trigger first (its ``on_kill``: ``halt``).  ``on_start()``: called once the
    try has its attempt (followed, or begun)."""
    run = training_run(step, store, try_number, first_try)
    action = run.reconcile()
    on_start()
    if not isinstance(action, Follow):
        return action
    trigger = TrainingRun.from_dict(run.to_dict(), GangCluster(step.kube()), store)
    following = trigger.follow_to_end(trigger.follower(async_client(step.kubeconfig)))
    ended = asyncio.run(_until_cleared(following, cleared or threading.Event()))
    if ended is None:
        trigger.halt("the task was killed (Clear)")
        return None
    return run.reconcile()


def main(argv: list[str]) -> int:
    name, step = argv[0], Step(**json.loads(argv[1]))
    if name == "claim":
        claim_step(step)
    elif name == "train":
        action = train_try(step, CheckpointStore(), try_number=1, first_try=1)
        print(action)
        return 0 if isinstance(action, Succeed) else 1
    elif name == "give_back":
        give_back_step(step)
    else:
        raise SystemExit(f"unknown step {name!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
