"""Verify a checkpoint, or find the newest verified one under a run path, from a DAG."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from trainops.operators._errors import translate_errors
from trainops.plugins.links import TrainingRunLink

from trainops.errors import TemporaryError


class CheckpointVerifyOperator(BaseOperator):
    """Verify ``uri`` (one checkpoint) or find the latest verified checkpoint under ``run_uri``.

    Returns (XCom ``return_value``) the checkpoint's ``uri``, ``step``, ``format``, ``level``,
    ``bytes``, ``files`` and, with ``run_uri``, ``skipped``: the newer checkpoints passed over and
    why.  Fails when the checkpoint, or every checkpoint under the run, does not verify.  Each Asset
    in ``outlets`` gets an event whose extra holds the checkpoint's ``uri``, ``step``, ``format`` and
    the ``dag_run`` (``<dag_id>/<run_id>``), for evaluation or serving DAGs.

    :param uri: one checkpoint to verify (``s3://bucket/runs/<run>/step-<N>/``). Templated.
    :param run_uri: a run path (``s3://bucket/runs/<run>/``): find its newest checkpoint that verifies. Templated.
    :param level: how deep to check: ``structural`` (the listing), ``metadata`` (default: also the small
        metadata objects, sizes and ETags; no request per shard) or ``deep`` (re-reads every object). Templated.
    :param aws_conn_id: Airflow ``aws`` connection of the S3 store (endpoint, credentials, region).
    """

    operator_extra_links = (TrainingRunLink(),)  # the run view of the UI plugin
    template_fields: Sequence[str] = ("uri", "run_uri", "level")

    def __init__(
        self,
        *,
        uri: str | None = None,
        run_uri: str | None = None,
        level: str = "metadata",
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (uri is None) == (run_uri is None):
            raise ValueError(
                "CheckpointVerifyOperator needs exactly one of uri= (one checkpoint) or run_uri= (latest)"
            )
        self.uri, self.run_uri, self.level, self.aws_conn_id = uri, run_uri, level, aws_conn_id

    @translate_errors
    def execute(self, context: Any) -> dict[str, Any]:
        from trainops.hooks.checkpoint_store import CheckpointStoreHook

        from trainops.checkpoints.latest import latest_verified
        from trainops.checkpoints.verify import verify_checkpoint

        store = CheckpointStoreHook(aws_conn_id=self.aws_conn_id).get_store()
        if self.uri is not None:
            result = verify_checkpoint(self.uri, level=self.level, store=store)
            self.log.info("%s", result.summary())
            if not result.ok:
                raise TemporaryError(f"{result.summary()}: " + "; ".join(result.reasons))
            return self._publish(context, result.to_dict())
        latest = latest_verified(self.run_uri, level=self.level, store=store)
        for skipped in latest.skipped:
            self.log.warning(
                "Skipped %s (step %s): %s", skipped.uri, skipped.step, "; ".join(skipped.reasons)
            )
        if latest.checkpoint is None:
            raise TemporaryError(
                f"No checkpoint under {latest.run_uri} verifies at {self.level} level "
                f"({latest.skipped_count} tried, the newest {len(latest.skipped)} logged above)"
            )
        self.log.info("Latest verified: %s", latest.checkpoint.summary())
        skipped = [s.to_dict() for s in latest.skipped]
        return self._publish(context, {**latest.checkpoint.to_dict(), "skipped": skipped})

    def _publish(self, context: Any, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """Put the verified checkpoint on every outlet Asset's event; returns it."""
        dag_run = context["dag_run"]
        for asset in self.outlets:
            context["outlet_events"][asset].extra = {
                **{key: checkpoint[key] for key in ("uri", "step", "format")},
                "dag_run": f"{dag_run.dag_id}/{dag_run.run_id}",
            }
        return checkpoint
