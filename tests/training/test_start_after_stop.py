"""A try of ``train`` that finds its attempt stopped (a Clear's or a mark-failed's ``on_kill`` deactivated
the Workload) starts a new attempt from the last verified checkpoint; it does not reattach to the
stopped Job, whose follow would end at once as "deactivated" and fail the run the Clear was to resume.
Found by the fault campaign (issue 15): a Clear failed its run whenever the next try came before the
stopped Job happened to be marked Failed."""

from __future__ import annotations

import sys

from tests.devcluster.ctrl_support import wait_for
from tests.training.conftest import idle_nodes
from trainops.capacity.procedure import claim, give_back
from trainops.checkpoints.store import CheckpointStore
from trainops.kube.client import Kube
from trainops.training.attempts import RunLedger
from trainops.training.cluster import GangCluster
from trainops.training.failures import FailureKind
from trainops.training.runner import GangRun
from trainops.training.spec import TrainingSpec

ARGS = ["--steps", "400", "--checkpoint-every", "20", "--step-seconds", "0.02"]


def test_a_try_after_the_attempt_was_stopped_submits_a_new_attempt(cluster, api, s3, bucket):
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    nodes = idle_nodes(api)[:2]
    claim(kube, "dag/clear", nodes, cluster_queue="training")
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args=ARGS,
        run_uri=f"s3://{bucket}/runs/clear/",
        nodes=2,
        node_names=nodes,
    )
    state: dict = {}

    def a_try() -> GangRun:  # each try reads the ledger the previous one saved, as the task state store
        ledger = RunLedger.from_dict(state.get("ledger"))
        return GangRun(
            spec,
            "dag",
            "clear",
            GangCluster(kube),
            CheckpointStore(),
            ledger,
            lambda d: state.update(ledger=d),
        )

    first, _ = a_try().start()
    wait_for(lambda: GangCluster(kube).job_pods("training", first.job), "the attempt's pods")
    GangCluster(kube).stop("training", first.job)  # the trigger's on_kill

    second, reattached = a_try().start()

    assert not reattached and second.number == 2 and second.job != first.job
    ended = RunLedger.from_dict(state["ledger"]).attempts[0]
    assert ended.kind == FailureKind.STOPPED and "deactivated" in ended.ended
    GangCluster(kube).stop("training", second.job)
    give_back(kube, "dag/clear", cluster_queue="training")
