"""Shared fixtures: a local S3 server over real HTTP, a throw-away Airflow home, and the devcluster.

Airflow reads its configuration at import, so the Airflow home is configured here, before any
test module imports Airflow.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from trainops_devcluster import airflow_home
from trainops_devcluster.local_s3 import LocalS3, local_s3

REPO = Path(__file__).resolve().parent.parent
REPO_DAGS = REPO / "dags"
TEST_DAGS = REPO / "tests" / "dags"
BENCH_DAGS = REPO / "benchmarks" / "dags"  # the fault campaign's baseline runs its provider DAG
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="trainops-airflow-"))
airflow_home.configure(
    AIRFLOW_HOME, {"dags-folder": REPO_DAGS, "test-dags": TEST_DAGS, "bench-dags": BENCH_DAGS}
)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server() -> LocalS3:
    with local_s3() as server:
        yield server


@pytest.fixture
def s3(s3_server: LocalS3, monkeypatch: pytest.MonkeyPatch) -> LocalS3:
    """The local S3 server, with boto3's environment and Airflow's ``aws_default`` pointing at it."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", s3_server.airflow_connection_uri())
    return s3_server


@pytest.fixture
def bucket(s3: LocalS3) -> str:
    """A fresh, empty bucket for one test."""
    return s3.create_bucket(f"test-{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite metadata database; returns the Airflow home."""
    airflow_home.migrate()
    return AIRFLOW_HOME


@pytest.fixture
def run_dag(airflow_db: Path):
    """``run_dag(dag_id, conf=None)`` runs a DAG from ``dags/`` or ``tests/dags/`` with ``dag.test()``
    and returns the DagRun."""

    def run(dag_id: str, conf: dict | None = None):
        folder = REPO_DAGS if (REPO_DAGS / f"{dag_id}.py").exists() else TEST_DAGS
        return airflow_home.load_dag(dag_id, folder).test(run_conf=conf)

    return run


@pytest.fixture
def make_devcluster(monkeypatch: pytest.MonkeyPatch):
    """``make_devcluster(**DevCluster options)`` starts a devcluster for this test (16 nodes of 8 GPUs
    unless told otherwise), waits until inference is settled, and points ``KUBECONFIG`` and Airflow's
    ``kubernetes_default`` at it.  Stopped when the test ends."""
    from trainops_devcluster.cluster import DevCluster

    with contextlib.ExitStack() as running:

        def make(**options):
            cluster = running.enter_context(DevCluster(**{"nodes": 16, "gpus_per_node": 8, **options}))
            cluster.wait_until_settled()
            monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
            monkeypatch.setenv(
                "AIRFLOW_CONN_KUBERNETES_DEFAULT", airflow_home.kubernetes_connection(cluster.kubeconfig)
            )
            return cluster

        yield make


@pytest.fixture
def devcluster(make_devcluster):
    """A running 16-node devcluster (see ``make_devcluster``).

    Attributes: ``url``, ``kubeconfig`` (Path), ``store``, ``server`` (``.audit``, ``.faults``),
    ``telemetry``, ``inject(fault, target, **options)``.
    """
    return make_devcluster()


@pytest.fixture
def k8s(devcluster):
    """The official ``kubernetes`` client's ApiClient, configured from the devcluster's kubeconfig."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(devcluster.kubeconfig))
    yield client
    client.close()
