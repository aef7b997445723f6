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


# --- Test tiers ------------------------------------------------------------------------------------------
# `make test` runs every test. `make test-fast` runs `pytest -m "not servers"`: the pure logic, with no
# devcluster API server, local S3, Airflow services stack, Prometheus, Chromium or torch ranks.
#
# A test is marked `servers`
#   - automatically, when it uses a fixture named in SERVER_FIXTURES, directly or through other fixtures;
#   - by hand (`@pytest.mark.servers`, or `pytestmark = pytest.mark.servers` for a whole module), when it
#     or a fixture of its own module starts a server, a listening socket, `python -m ...` or torch ranks.
# A run that selects no `servers` test (`make test-fast`, or `pytest` on pure files) refuses, in the test
# process, to listen on a socket, to start a child other than FAST_TIER_PROGRAMS or Python without `-m`, and
# to start a multiprocessing process: a test missing its mark fails, saying so.

SERVER_FIXTURES = {
    "s3_server": "the local S3 server (s3, bucket and the checkpoint fixtures use it)",
    "make_devcluster": "a devcluster: API server, controllers, process pods (devcluster, k8s use it)",
    "cluster": "a running devcluster (the fixture of that name in every module that has one)",
    "api": "a devcluster API server (tests/devcluster) or a client of a running devcluster",
    "services": "the Airflow services stack (`make up`)",
    "build": "the three wheels built from a clone and installed into fresh virtualenvs",
}
FAST_TIER_PROGRAMS = {"git", "file", "true", "sleep"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "servers: starts a server, torch ranks, a browser or a build; `make test-fast` leaves it out "
        "(tests/conftest.py, Test tiers)",
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)
    items.sort(key=lambda item: worker_group(item.nodeid) != SERVICES)  # the longest group starts first


SERVICES = "tests/services"


def worker_group(nodeid: str) -> str:
    """What one of `make test`'s parallel workers takes whole: a module, so its module-scoped servers start
    once, and all of tests/services, whose tests share one services stack in order (test_least_privilege,
    last, judges what the others did)."""
    module = nodeid.partition("::")[0]
    return SERVICES if module.startswith(SERVICES + "/") else module


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's workers (`make test`, `-n`) take whole ``worker_group``s. (xdist's own ``xdist_group``
    mark does not reach its scheduler under pytest 9.2: it rewrites ``item._nodeid``, which pytest no longer
    reads.)"""
    from xdist.scheduler import LoadFileScheduling

    class WholeGroups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return WholeGroups(config, log)


def _server_free(items: list[pytest.Item]) -> bool:
    return bool(items) and not any(item.get_closest_marker("servers") for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _server_free(session.items):
        _NO_SERVERS.install()


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    if _server_free(items):
        return "no `servers` test selected: listening sockets and server processes are refused"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    _NO_SERVERS.current = item.nodeid
    yield
    _NO_SERVERS.current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = (yield).get_result()
    refused = _NO_SERVERS.refused.pop(item.nodeid, None)
    if refused and report.passed:  # the test swallowed the refusal: it still fails
        report.outcome, report.longrepr = "failed", "\n".join(refused)


class ServerRefused(RuntimeError):
    """A test without the `servers` mark started a server in a run that selects no `servers` test."""


class _NoServers:
    def __init__(self) -> None:
        self.current: str | None = None
        self.refused: dict[str, list[str]] = {}
        self.installed = False

    def refuse(self, what: str) -> None:
        test = self.current or "outside any test"
        message = (
            f"{test} {what}, in a run that selects no `servers` test (make test-fast): mark it "
            "@pytest.mark.servers, or have it use a fixture in SERVER_FIXTURES (tests/conftest.py)"
        )
        self.refused.setdefault(test, []).append(message)
        raise ServerRefused(message)

    def install(self) -> None:
        import multiprocessing.process
        import socket
        import subprocess

        if self.installed:
            return
        self.installed = True
        guard = self
        listen, popen_init, start = (
            socket.socket.listen,
            subprocess.Popen.__init__,
            multiprocessing.process.BaseProcess.start,
        )

        def guarded_listen(sock, *args):
            guard.refuse(f"listened on a socket ({sock.getsockname()})")
            return listen(sock, *args)

        def guarded_popen_init(popen, args, *rest, **kwargs):
            if not _fast_tier_program(args):
                guard.refuse(f"started {args!r}")
            return popen_init(popen, args, *rest, **kwargs)

        def guarded_start(process):
            guard.refuse(f"started the process {process!r}")
            return start(process)

        socket.socket.listen = guarded_listen
        subprocess.Popen.__init__ = guarded_popen_init
        multiprocessing.process.BaseProcess.start = guarded_start


_NO_SERVERS = _NoServers()


def _fast_tier_program(args) -> bool:
    """A program in FAST_TIER_PROGRAMS, or Python running inline code or a script, not a module: the
    devcluster, Airflow and torch ranks all start as ``python -m ...``."""
    import os
    import shlex

    if isinstance(args, str | bytes):
        argv = shlex.split(os.fsdecode(args))
    elif isinstance(args, os.PathLike):
        argv = [os.fspath(args)]
    else:
        argv = [os.fsdecode(arg) for arg in args]
    if not argv:
        return False
    program = Path(argv[0]).name
    if program in FAST_TIER_PROGRAMS:
        return True
    if not program.startswith("python"):
        return False
    options = iter(argv[1:])
    for option in options:
        if option in ("-X", "-W"):
            next(options, None)
        elif option == "-m":
            return False
        elif option == "-c" or not option.startswith("-"):
            return True
    return False
