"""The trigger a deferred ``GangTrainingOperator`` waits on: follows the run, and resumes it after a crash.

It watches the Job, its pods and its Kueue Workload (``KubernetesClusterHook``: the
``kubernetes`` connection, or ``kubeconfig``) and reads the run's heartbeat from the store of the
AWS connection.  When an attempt ends it judges it (``GangRun.finish``: quarantine the culprits,
stop the attempt) and, when that calls for a resume and the run's budget allows, submits the next
attempt from the latest verified checkpoint and follows it, all in the triggerer: a crash is
resumed without waiting for the scheduler and a worker.  It fires one event at the end: the
verdict and the attempt ledger (``GangRun.event``), which the task saves.
``on_kill`` (the user marked the task failed or success, or cleared it) stops the current attempt;
``cleanup`` holds nothing to release, and must not stop the run, because it also runs when the
trigger merely moves to another triggerer (which then follows the run again from the ledger it
was given: the judgements repeat and the attempts' Jobs, named by number, are found, not remade).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class GangRunTrigger(BaseTrigger):
    """``follow``: a ``FollowConfig`` as a dict; ``run``: ``GangRun.to_dict()`` (with its resume budget);
    ``kubeconfig``: this file instead of the connection's."""

    def __init__(
        self,
        follow: dict,
        run: dict,
        kubernetes_conn_id: str = "kubernetes_default",
        kubeconfig: str | None = None,
        aws_conn_id: str | None = "aws_default",
    ):
        super().__init__()
        self.follow, self.run_state = follow, run
        self.kubernetes_conn_id = kubernetes_conn_id
        self.kubeconfig = kubeconfig
        self.aws_conn_id = aws_conn_id
        self._run = None  # the GangRun while ``run`` goes on

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "follow": self.follow,
                "run": self.run_state,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "kubeconfig": self.kubeconfig,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    def _hook(self):
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        return KubernetesClusterHook(conn_id=self.kubernetes_conn_id, config_file=self.kubeconfig)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainops.hooks.checkpoint_store import CheckpointStoreHook

        from trainops.training.cluster import GangCluster
        from trainops.training.follow import FollowConfig, RunFollower
        from trainops.training.runner import GangRun

        store = await asyncio.to_thread(lambda: CheckpointStoreHook(aws_conn_id=self.aws_conn_id).get_store())
        cluster = GangCluster(await asyncio.to_thread(lambda: self._hook().kube()))
        config = FollowConfig.from_dict(self.follow)
        self._run = GangRun.from_dict(self.run_state, cluster, store, logger=self.log)

        def follow_attempt(job: str):
            attempt = dataclasses.replace(config, job_name=job)
            return RunFollower(attempt, cluster, self._hook().async_client, store).follow()

        verdict = await self._run.run_attempts(follow_attempt)
        yield TriggerEvent(self._run.event(verdict))

    async def on_kill(self) -> None:
        # One thread does the stop: the triggerer may cancel this coroutine again while it runs (it
        # re-sends the cancel until the trigger is gone), and a cancelled await must not skip the stop.
        from trainops.training.cluster import GangCluster

        run = self._run

        def stop() -> str:
            # killed before run() began; else no Job is created after this one (a start or resume still
            # running in this cancelled trigger's thread would make one)
            job = self.follow["job_name"] if run is None else run.stop_submitting()
            return GangCluster(self._hook().kube()).stop(self.follow["namespace"], job)

        done = await asyncio.shield(asyncio.to_thread(stop))
        self.log.info("task killed by a user: %s", done)
