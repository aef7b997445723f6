"""The operator extra link "Training run" (on ``train`` and ``verify_checkpoint``): the run view."""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import BaseOperatorLink


class TrainingRunLink(BaseOperatorLink):
    name = "Training run"

    def get_link(self, operator, *, ti_key) -> str:
        return f"/trainops/runs/{quote(ti_key.dag_id, safe='')}/{quote(ti_key.run_id, safe='')}"
