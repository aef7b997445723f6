"""Wait for a verified checkpoint newer than a step or younger than an age (a freshness alarm too)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowSensorTimeout
from trainops.provider.errors import translate_errors
from trainops.triggers.checkpoint import CheckpointTrigger

from trainops.errors import TemporaryError


class CheckpointSensor(BaseSensorOperator):
    """Succeeds once the newest verified checkpoint under ``run_uri`` has a step above
    ``newer_than_step`` and/or was written within ``max_age``; fails on ``timeout``.

    With ``deferrable=True`` it waits in the triggerer (no worker slot).  XCom: the checkpoint's
    ``uri``, ``step``, ``format``, ``level``, ``bytes``, ``files``.

    :param run_uri: the run path (``s3://bucket/runs/<run>/``) whose checkpoints are watched. Templated.
    :param newer_than_step: succeed once a verified checkpoint has a step above this. Templated.
    :param max_age: succeed once a verified checkpoint was written within this long (a freshness alarm
        when it times out).
    :param level: how deep to check: ``structural`` (the listing), ``metadata`` (default: also the small
        metadata objects, sizes and ETags; no request per shard) or ``deep`` (re-reads every object). Templated.
    :param aws_conn_id: Airflow ``aws`` connection of the S3 store (endpoint, credentials, region).
    :param deferrable: wait in the triggerer between checks instead of holding a worker slot (default:
        ``[operators] default_deferrable``).
    """

    template_fields: Sequence[str] = ("run_uri", "newer_than_step", "level")

    def __init__(
        self,
        *,
        run_uri: str,
        newer_than_step: int | None = None,
        max_age: timedelta | None = None,
        level: str = "metadata",
        aws_conn_id: str | None = "aws_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if newer_than_step is None and max_age is None:
            raise ValueError("CheckpointSensor needs newer_than_step= or max_age= (or both)")
        self.run_uri, self.newer_than_step, self.max_age = run_uri, newer_than_step, max_age
        self.level, self.aws_conn_id, self.deferrable = level, aws_conn_id, deferrable

    def _trigger(self, deadline: float | None = None) -> CheckpointTrigger:
        return CheckpointTrigger(
            self.run_uri,
            newer_than_step=int(self.newer_than_step) if self.newer_than_step is not None else None,
            max_age_seconds=self.max_age.total_seconds() if self.max_age is not None else None,
            level=self.level,
            aws_conn_id=self.aws_conn_id,
            poll_interval=self.poke_interval,
            deadline=deadline,
        )

    @translate_errors
    def poke(self, context: Any) -> PokeReturnValue:
        found = self._trigger().check()
        if found:
            self.log.info("Verified checkpoint %s (step %s)", found["uri"], found["step"])
        return PokeReturnValue(is_done=found is not None, xcom_value=found)

    @translate_errors
    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        found = self._trigger().check()
        if found is not None:
            return found
        self.defer(
            trigger=self._trigger(deadline=time.time() + self.timeout),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    @translate_errors
    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "timeout":
            raise AirflowSensorTimeout(f"Timed out after {self.timeout}s: {event['message']}")
        if event.get("status") != "success":
            raise TemporaryError(f"Checkpoint check failed: {event.get('message')}")
        self.log.info(
            "Verified checkpoint %s (step %s)", event["checkpoint"]["uri"], event["checkpoint"]["step"]
        )
        return event["checkpoint"]
