"""The trigger a deferred ``GangTrainingOperator`` waits on: follows the run, and resumes it after a crash.

``run()`` is ``TrainingRun.follow_to_end``: it reconciles the run from its Jobs (the cluster is the
ledger: a trigger rebuilt after a triggerer restart, or started late, sees what everyone sees), follows
the running attempt (watches on the Job, its pods, its Workload and its FailedCreate events through
``KubernetesClusterHook``; the heartbeat from the store of the AWS connection), and reconciles what it
saw: it judges the end (quarantine the culprits, record the end on the Job), stops the attempt and, when
that calls for a resume and the budget allows, begins the next attempt from the latest verified
checkpoint and follows it, all in the triggerer.  It fires one event when the run succeeded or failed;
the task then reconciles once more and returns or fails on what the cluster shows.
``on_kill`` (the user marked the task failed or success, or cleared it) stops the run and records the
stop on its attempt; ``cleanup`` holds nothing to release, and must not stop the run, because it also
runs when the trigger merely moves to another triggerer (which then goes on from the cluster).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class GangRunTrigger(BaseTrigger):
    """``run``: ``TrainingRun.to_dict()`` (the run, its budget, how to judge and follow it);
    ``kubeconfig``: this file instead of the connection's."""

    def __init__(
        self,
        run: dict,
        kubernetes_conn_id: str = "kubernetes_default",
        kubeconfig: str | None = None,
        aws_conn_id: str | None = "aws_default",
    ):
        super().__init__()
        self.run_state = run
        self.kubernetes_conn_id = kubernetes_conn_id
        self.kubeconfig = kubeconfig
        self.aws_conn_id = aws_conn_id
        self._run = None  # the TrainingRun while ``run`` goes on

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "run": self.run_state,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "kubeconfig": self.kubeconfig,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    def _hook(self):
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        return KubernetesClusterHook(conn_id=self.kubernetes_conn_id, config_file=self.kubeconfig)

    def _training_run(self, store):
        from trainops.training.cluster import GangCluster
        from trainops.training.reconcile import TrainingRun

        return TrainingRun.from_dict(self.run_state, GangCluster(self._hook().kube()), store, logger=self.log)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainops.hooks.checkpoint_store import CheckpointStoreHook

        from trainops.training.decide import Succeed

        store = await asyncio.to_thread(lambda: CheckpointStoreHook(aws_conn_id=self.aws_conn_id).get_store())
        self._run = await asyncio.to_thread(self._training_run, store)
        action = await self._run.follow_to_end(self._run.follower(self._hook().async_client))
        succeeded = isinstance(action, Succeed)
        message = f"attempt {action.attempt.number} succeeded" if succeeded else getattr(action, "reason", "")
        yield TriggerEvent({"status": "succeeded" if succeeded else "failed", "message": message})

    async def on_kill(self) -> None:
        # One thread does the stop: the triggerer may cancel this coroutine again while it runs (it
        # re-sends the cancel until the trigger is gone), and a cancelled await must not skip the stop.
        run = self._run

        def stop():
            # killed before run() began: a run of its own to stop; else this one, so that a begin still
            # running in this cancelled trigger's thread creates no Job after the stop
            return (run or self._training_run(None)).halt(
                "the task was killed (Clear, mark failed or success)"
            )

        done = await asyncio.shield(asyncio.to_thread(stop))
        self.log.info("task killed by a user: %s", done)
