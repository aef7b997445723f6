"""The trigger a deferred ``GangTrainingOperator`` waits on: follows one attempt to its end.

It watches the Job, its pods and its Kueue Workload through ``kubernetes_asyncio`` (the cncf
provider's ``AsyncKubernetesHook`` connection) and the run's heartbeat in S3, and fires one event
with the ``Outcome`` (see ``trainops.training.follow``).  ``on_kill`` (the user marked the task
failed or success, or cleared it) stops the run; ``cleanup`` holds nothing to release, and must
not stop the run, because it also runs when the trigger merely moves to another triggerer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class GangRunTrigger(BaseTrigger):
    """``follow``: a ``FollowConfig`` as a dict.  ``kubeconfig``: use this file instead of the connection."""

    def __init__(
        self, follow: dict, kubernetes_conn_id: str = "kubernetes_default", kubeconfig: str | None = None
    ):
        super().__init__()
        self.follow = follow
        self.kubernetes_conn_id = kubernetes_conn_id
        self.kubeconfig = kubeconfig

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "follow": self.follow,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "kubeconfig": self.kubeconfig,
            },
        )

    def client(self):
        """An async context manager yielding a ``kubernetes_asyncio`` ApiClient."""
        if self.kubeconfig:
            from trainops.training.kube import kubeconfig_client

            return kubeconfig_client(self.kubeconfig)
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        return AsyncKubernetesHook(conn_id=self.kubernetes_conn_id).get_conn()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainops.training.follow import FollowConfig, RunFollower

        outcome = await RunFollower(FollowConfig.from_dict(self.follow), self.client).follow()
        yield TriggerEvent(outcome.to_dict())

    async def on_kill(self) -> None:
        from trainops.training.follow import stop

        done = await stop(self.client, self.follow["namespace"], self.follow["job_name"])
        self.log.info("task killed by a user: %s", done)
