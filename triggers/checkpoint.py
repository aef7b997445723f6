"""The async trigger behind the deferrable ``CheckpointSensor``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class CheckpointTrigger(BaseTrigger):
    """Polls the run path (the blocking core runs in a thread) until a verified checkpoint is newer
    than ``newer_than_step`` and younger than ``max_age_seconds``; yields it as the event, or a
    ``timeout`` event once ``deadline`` (epoch seconds) passes."""

    def __init__(
        self,
        run_uri: str,
        *,
        newer_than_step: int | None = None,
        max_age_seconds: float | None = None,
        level: str = "metadata",
        aws_conn_id: str | None = "aws_default",
        poll_interval: float = 60.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.run_uri = run_uri
        self.newer_than_step = newer_than_step
        self.max_age_seconds = max_age_seconds
        self.level = level
        self.aws_conn_id = aws_conn_id
        self.poll_interval = poll_interval
        self.deadline = deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "run_uri": self.run_uri,
                "newer_than_step": self.newer_than_step,
                "max_age_seconds": self.max_age_seconds,
                "level": self.level,
                "aws_conn_id": self.aws_conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    def check(self) -> dict[str, Any] | None:
        """One blocking check: the qualifying checkpoint as a dict, or None."""
        from trainops.hooks.checkpoint_store import CheckpointStoreHook

        from trainops.checkpoints.latest import fresh_checkpoint

        max_age = timedelta(seconds=self.max_age_seconds) if self.max_age_seconds is not None else None
        result = fresh_checkpoint(
            self.run_uri,
            newer_than_step=self.newer_than_step,
            max_age=max_age,
            level=self.level,
            store=CheckpointStoreHook(aws_conn_id=self.aws_conn_id).get_store(),
        )
        return result.to_dict() if result else None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                found = await asyncio.to_thread(self.check)
            except Exception as error:  # reported to the task, which fails with it
                yield TriggerEvent({"status": "error", "message": f"{type(error).__name__}: {error}"})
                return
            if found is not None:
                yield TriggerEvent({"status": "success", "checkpoint": found})
                return
            if self.deadline is not None and time.time() + self.poll_interval > self.deadline:
                yield TriggerEvent(
                    {"status": "timeout", "message": f"no qualifying checkpoint under {self.run_uri}"}
                )
                return
            self.log.info("No verified checkpoint under %s meets the condition yet", self.run_uri)
            await asyncio.sleep(self.poll_interval)
