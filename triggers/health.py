"""The deferrable wait of the health gate and sensors: re-evaluate until enough nodes pass, or a deadline.

The trigger runs ``GateSpec.evaluate()`` (``trainops.hooks.health_gate``) in a worker thread
(``asyncio.to_thread``) every ``poll_interval_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from trainops.hooks.health_gate import GateSpec

from trainops.health.gate import GateError


class HealthGateTrigger(BaseTrigger):
    """Fires ``{"status": "ready", "selected": [...]}`` once the check passes,
    ``{"status": "timeout", "message": <what is missing>}`` at ``deadline`` (epoch seconds),
    or ``{"status": "error", "message": ...}`` when the check cannot be made (e.g. Prometheus required and down).
    Every event also carries the ``deadline``.
    """

    def __init__(self, spec: dict[str, Any], deadline: float, poll_interval_s: float = 30.0) -> None:
        super().__init__()
        self.spec, self.deadline, self.poll_interval_s = dict(spec), float(deadline), float(poll_interval_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"spec": self.spec, "deadline": self.deadline, "poll_interval_s": self.poll_interval_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        spec = GateSpec(**self.spec)
        while True:
            try:
                result = await asyncio.to_thread(spec.evaluate)
            except (GateError, ValueError) as err:
                yield TriggerEvent({"status": "error", "message": str(err), "deadline": self.deadline})
                return
            if result.enough:
                yield TriggerEvent(
                    {"status": "ready", "selected": result.selected, "deadline": self.deadline}
                )
                return
            remaining = self.deadline - time.time()
            if remaining <= 0:
                yield TriggerEvent(
                    {"status": "timeout", "message": result.missing(), "deadline": self.deadline}
                )
                return
            self.log.info("health: waiting, %s", result.missing())
            await asyncio.sleep(min(self.poll_interval_s, remaining))
