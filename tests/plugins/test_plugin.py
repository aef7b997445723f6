"""The plugin as Airflow finds it: through the ``airflow.plugins`` entry point, with its app, its two
React apps (a Browse page and a DAG run tab) and the extra link that ``train`` and ``verify_checkpoint``
carry to the run's tab."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_airflow_loads_the_plugin_from_its_entry_point(airflow_db):
    from airflow import plugins_manager
    from trainops.plugins.app import app
    from trainops.plugins.links import TrainingRunLink

    apps, _ = plugins_manager.get_fastapi_plugins()
    assert {"app": app, "url_prefix": "/trainops", "name": "trainops"} in apps
    external_views, react_apps = plugins_manager._get_ui_plugins()
    assert not any(v["name"] in ("GPU fleet", "Training run") for v in external_views)  # no iframes
    views = {v["name"]: v for v in react_apps}
    assert views["GPU fleet"] | {"icon": None} == {
        "name": "GPU fleet",
        "bundle_url": "trainops/static/fleet.js",
        "destination": "nav",
        "category": "browse",
        "url_route": "trainops-fleet",
        "icon": None,
    }
    assert (
        views["Training run"]["destination"] == "dag_run"
        and views["Training run"]["url_route"] == "trainops-run"
    )
    assert any(isinstance(link, TrainingRunLink) for link in plugins_manager.get_operator_extra_links())


def test_train_and_verify_link_to_the_run_view(airflow_db):
    from airflow.models.taskinstancekey import TaskInstanceKey
    from trainops_devcluster import airflow_home

    dag = airflow_home.load_dag("training_lifecycle", REPO / "dags")
    key = TaskInstanceKey("training_lifecycle", "train", "manual__2026-11-30T17:00:00+00:00", 1)
    for task_id in ("train", "verify_checkpoint"):
        (link,) = dag.get_task(task_id).operator_extra_links
        assert link.name == "Training run"
        assert (
            link.get_link(dag.get_task(task_id), ti_key=key)
            == "/dags/training_lifecycle/runs/manual__2026-11-30T17%3A00%3A00%2B00%3A00/plugin/trainops-run"
        )
    assert not dag.get_task("claim_nodes").operator_extra_links
