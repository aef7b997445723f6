"""A throw-away Airflow home for tests and the demo: SQLite, our DAG folders as bundles, no examples.

``configure`` must run before Airflow is first imported, because Airflow reads its configuration
at import time.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path


def configure(home: Path, bundles: dict[str, Path]) -> dict[str, str]:
    """Point Airflow at ``home`` and serve ``bundles`` (bundle name -> DAG folder; the first is also
    ``[core] dags_folder``).

    Returns the environment it set, so a subprocess can be given the same.
    """
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(next(iter(bundles.values()))),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
            [
                {
                    "name": name,
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(path)},
                }
                for name, path in bundles.items()
            ]
        ),
    }
    os.environ.update(env)
    return env


def migrate() -> None:
    """Create the metadata database (SQLite) if it is not there yet."""
    from airflow.utils import db

    db.initdb()


def load_dag(dag_id: str, folder: Path):
    """Parse ``folder`` and return one DAG, failing with the import errors when it is missing."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(folder))
    dag = bag.get_dag(dag_id)
    if dag is None:
        raise LookupError(f"DAG {dag_id!r} not found in {folder}; import errors: {bag.import_errors}")
    return dag


def kubernetes_connection(kubeconfig: Path) -> str:
    """An Airflow ``kubernetes`` connection (JSON) that uses ``kubeconfig``."""
    return json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}})


def xcom_value(dag_run, task_id: str, key: str = "return_value"):
    """The XCom ``key`` that ``task_id`` pushed in ``dag_run`` (``None`` when it pushed none)."""

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key)
        row = session.execute(query.with_only_columns(XComModel.value)).first()
    return None if row is None else XComModel.deserialize_value(row)


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's stdout/stderr (Airflow's task logs included) to ``path`` meanwhile."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as out:
        os.dup2(out.fileno(), 1), os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
