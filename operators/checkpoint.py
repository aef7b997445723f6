"""Reserve a run path for a DAG run; verify a checkpoint, or find the newest verified one under a run path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from trainops.plugins.links import TrainingRunLink
from trainops.provider.errors import translate_errors

from trainops.errors import TemporaryError


class RunPathOperator(BaseOperator):
    """Reserve the run path ``<checkpoint_uri>/<run_name>/`` for this DAG run, before anything is claimed.

    One conditional write to S3 (``trainops-run.json``, see ``trainops.checkpoints.owner``); a retry or a
    Clear of the same DAG run finds the path its own.  A path another DAG run owns fails the task at once,
    naming that run and what to do, so the tasks after it never touch a node.  With ``run_name`` empty
    the name is derived from the DAG run (``<dag>-<YYYYmmdd-HHMMSS>-<hash>``): triggering twice with the
    same form gives two runs, each with its own path.  Returns (XCom) ``run_uri``, ``run_name`` and
    ``owner`` (``<dag_id>/<run_id>``).

    :param checkpoint_uri: ``s3://bucket/prefix/`` under which the run's path is made. Templated.
    :param run_name: the run path's last segment, a DNS-1123 label; None or empty: derived from the DAG
        run. Templated.
    :param aws_conn_id: Airflow ``aws`` connection of the S3 store (endpoint, credentials, region).
    """

    template_fields: Sequence[str] = ("checkpoint_uri", "run_name")
    ui_color = "#eef4e8"

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        run_name: str | None = None,
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint_uri, self.run_name, self.aws_conn_id = checkpoint_uri, run_name, aws_conn_id

    @translate_errors
    def execute(self, context: Any) -> dict[str, str]:
        from trainops.hooks.checkpoint_store import CheckpointStoreHook

        from trainops.checkpoints.owner import claim_run_path
        from trainops.training.naming import derived_run_name, run_path

        dag_run = context["dag_run"]
        owner = f"{dag_run.dag_id}/{dag_run.run_id}"
        name = self.run_name or derived_run_name(dag_run.dag_id, dag_run.run_id, dag_run.run_after)
        run_uri = run_path(self.checkpoint_uri, name)
        store = CheckpointStoreHook(aws_conn_id=self.aws_conn_id).get_store()
        if claim_run_path(store, run_uri, owner):
            self.log.info("Run path %s reserved for DAG run %s", run_uri, owner)
        else:
            self.log.info("Run path %s already belongs to this DAG run (a retry or a Clear)", run_uri)
        return {"run_uri": run_uri, "run_name": name, "owner": owner}


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
