"""The trigger a deferred ``GangTrainingOperator`` waits on: follows one attempt to its end.

It watches the Job, its pods and its Kueue Workload (``KubernetesClusterHook``: the
``kubernetes`` connection, or ``kubeconfig``) and reads the run's heartbeat from the store of the
AWS connection, and fires one event with the ``Outcome`` (see ``trainops.training.follow``).
``on_kill`` (the user marked the task failed or success, or cleared it) stops the run;
``cleanup`` holds nothing to release, and must not stop the run, because it also runs when the
trigger merely moves to another triggerer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class GangRunTrigger(BaseTrigger):
    """``follow``: a ``FollowConfig`` as a dict.  ``kubeconfig``: this file instead of the connection's."""

    def __init__(
        self,
        follow: dict,
        kubernetes_conn_id: str = "kubernetes_default",
        kubeconfig: str | None = None,
        aws_conn_id: str | None = "aws_default",
    ):
        super().__init__()
        self.follow = follow
        self.kubernetes_conn_id = kubernetes_conn_id
        self.kubeconfig = kubeconfig
        self.aws_conn_id = aws_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "follow": self.follow,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "kubeconfig": self.kubeconfig,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    def _hook(self):
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        return KubernetesClusterHook(conn_id=self.kubernetes_conn_id, config_file=self.kubeconfig)

    async def _cluster(self):
        """The run's ``GangCluster`` (the connection is read in a thread: it blocks)."""
        from trainops.training.cluster import GangCluster

        return GangCluster(await asyncio.to_thread(lambda: self._hook().kube()))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainops.hooks.checkpoint_store import CheckpointStoreHook

        from trainops.training.follow import FollowConfig, RunFollower

        store = await asyncio.to_thread(lambda: CheckpointStoreHook(aws_conn_id=self.aws_conn_id).get_store())
        follower = RunFollower(
            FollowConfig.from_dict(self.follow), await self._cluster(), self._hook().async_client, store
        )
        outcome = await follower.follow()
        yield TriggerEvent(outcome.to_dict())

    async def on_kill(self) -> None:
        # One thread does it all: the triggerer may cancel this coroutine again while it runs (it
        # re-sends the cancel until the trigger is gone), and a cancelled await must not skip the stop.
        from trainops.training.cluster import GangCluster

        def stop() -> str:
            cluster = GangCluster(self._hook().kube())
            return cluster.stop(self.follow["namespace"], self.follow["job_name"])

        done = await asyncio.shield(asyncio.to_thread(stop))
        self.log.info("task killed by a user: %s", done)
