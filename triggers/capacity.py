"""Deferrable wait until nodes claimed by other runs are free again, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from trainops.kube.nodes import holder_of


class NodesFreeTrigger(BaseTrigger):
    """Fires ``{"status": "free"}`` once none of ``node_names`` is claimed by a run other than ``run``,
    or ``{"status": "timeout", "holders": {node: run}, "message": ...}`` at ``deadline`` (epoch seconds)."""

    def __init__(
        self,
        node_names: list[str],
        run: str,
        kubernetes_conn_id: str,
        deadline: float,
        poll_interval_s: float = 10.0,
    ) -> None:
        super().__init__()
        self.node_names, self.run_key = list(node_names), run
        self.kubernetes_conn_id, self.deadline, self.poll_interval_s = (
            kubernetes_conn_id,
            deadline,
            poll_interval_s,
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "node_names": self.node_names,
                "run": self.run_key,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "deadline": self.deadline,
                "poll_interval_s": self.poll_interval_s,
            },
        )

    async def holders(self) -> dict[str, str]:
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        from trainops.kube.client import NODES

        def read() -> dict[str, dict | None]:  # the named nodes (a GET each): a fleet list is not needed
            return (
                KubernetesClusterHook(conn_id=self.kubernetes_conn_id).kube().get_all(NODES, self.node_names)
            )

        held = {
            name: holder_of(node["metadata"].get("annotations") or {})
            for name, node in (await asyncio.to_thread(read)).items()
            if node is not None
        }
        return {name: holder for name, holder in held.items() if holder and holder != self.run_key}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            held = await self.holders()
            if not held:
                yield TriggerEvent({"status": "free", "deadline": self.deadline})
                return
            remaining = self.deadline - time.time()
            if remaining <= 0:
                listed = ", ".join(f"{node} (held by {run})" for node, run in sorted(held.items()))
                yield TriggerEvent(
                    {
                        "status": "timeout",
                        "holders": held,
                        "message": f"nodes still claimed by other runs: {listed}",
                    }
                )
                return
            self.log.info(
                "waiting for %d node(s) held by other runs: %s", len(held), sorted(set(held.values()))
            )
            await asyncio.sleep(min(self.poll_interval_s, remaining))
