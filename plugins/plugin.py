"""``TrainopsPlugin``: registered through the ``airflow.plugins`` entry point (``pip install`` is enough).

The two views are React apps of the Airflow UI (``react_apps``, Airflow 3.1+): ES modules the UI loads
into its own page, rendered with the UI's React and Chakra UI (its globals ``React``, ``ChakraUI``,
``ReactRouterDOM``), so they take its theme and colour mode, its navigation and its timezone setting.
**GPU fleet** is an entry of the Browse menu; **Training run** a tab of every DAG run.  Their data
comes from the JSON API of the FastAPI app at ``/trainops``.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from trainops.plugins.app import app
from trainops.plugins.links import FLEET_ROUTE, RUN_ROUTE, TrainingRunLink


class TrainopsPlugin(AirflowPlugin):
    name = "trainops"
    fastapi_apps = [{"app": app, "url_prefix": "/trainops", "name": "trainops"}]
    react_apps = [
        {
            "name": "GPU fleet",
            "bundle_url": "trainops/static/fleet.js",  # resolved against the UI's base URL
            "destination": "nav",
            "category": "browse",
            "url_route": FLEET_ROUTE,
            "icon": "trainops/static/gpu.svg",
        },
        {
            "name": "Training run",
            "bundle_url": "trainops/static/run.js",
            "destination": "dag_run",
            "url_route": RUN_ROUTE,
            "icon": "trainops/static/gpu.svg",
        },
    ]
    operator_extra_links = [TrainingRunLink()]
