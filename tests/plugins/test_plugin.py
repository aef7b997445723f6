"""The plugin as Airflow finds it: through the ``airflow.plugins`` entry point, with its app, views
and the extra link that ``train`` and ``verify_checkpoint`` carry."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_airflow_loads_the_plugin_from_its_entry_point(airflow_db):
    from airflow import plugins_manager
    from trainops.plugins.app import app
    from trainops.plugins.links import TrainingRunLink

    apps, _ = plugins_manager.get_fastapi_plugins()
    assert {"app": app, "url_prefix": "/trainops", "name": "trainops"} in apps
    views = {v["name"]: v for v in plugins_manager._get_ui_plugins()[0]}
    assert views["GPU fleet"]["destination"] == "nav" and views["GPU fleet"]["href"] == "/trainops/fleet"
    assert views["Training run"]["href"] == "/trainops/runs/{DAG_ID}/{RUN_ID}"
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
            == "/trainops/runs/training_lifecycle/manual__2026-11-30T17%3A00%3A00%2B00%3A00"
        )
    assert not dag.get_task("claim_nodes").operator_extra_links
