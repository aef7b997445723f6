"""``TrainopsPlugin``: registered through the ``airflow.plugins`` entry point (``pip install`` is enough)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from trainops.plugins.app import app
from trainops.plugins.links import TrainingRunLink


class TrainopsPlugin(AirflowPlugin):
    name = "trainops"
    fastapi_apps = [{"app": app, "url_prefix": "/trainops", "name": "trainops"}]
    external_views = [
        {
            "name": "GPU fleet",
            "href": "/trainops/fleet",
            "destination": "nav",
            "category": "browse",
            "url_route": "trainops-fleet",
        },
        {
            "name": "Training run",
            "href": "/trainops/runs/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "trainops-run",
        },
    ]
    operator_extra_links = [TrainingRunLink()]
