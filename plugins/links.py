"""Where the plugin's views are in the Airflow UI, and the operator extra link "Training run" (on
``train`` and ``verify_checkpoint``) to the run's tab."""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

FLEET_ROUTE = "trainops-fleet"  # the Browse menu's page: /plugin/trainops-fleet
RUN_ROUTE = "trainops-run"  # the DAG run's tab: /dags/<dag_id>/runs/<run_id>/plugin/trainops-run


def run_path(dag_id: str, run_id: str) -> str:
    """The Training run tab of a DAG run, a path of the Airflow UI."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/plugin/{RUN_ROUTE}"


class TrainingRunLink(BaseOperatorLink):
    name = "Training run"

    def get_link(self, operator, *, ti_key) -> str:
        return run_path(ti_key.dag_id, ti_key.run_id)
