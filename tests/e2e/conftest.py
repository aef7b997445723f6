"""The real ``dags/training_lifecycle.py`` against a devcluster and the local S3: fixtures and end-state checks.

Each scenario is short (2 training nodes + 1 spare of an 8-node cluster, a few dozen fast steps).
The package runs as the Airflow workers' ServiceAccount with ``deploy/rbac.yaml`` applied, so a call
RBAC denies fails the run; the tests' own checks (``api``) use the admin's kubeconfig.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from trainops_devcluster import airflow_home

from tests.training.conftest import heartbeat_step, pods, raw, when
from trainops.conventions import CLAIMED_BY_ANNOTATION, GPU_RESOURCE, MODE_TAINT, MODE_TRAINING
from trainops.kube.client import Kube

DAG_ID = "training_lifecycle"
RBAC = Path(__file__).parents[2] / "deploy" / "rbac.yaml"
#: the ServiceAccount deploy/rbac.yaml binds for the Airflow workers (the Helm chart's name)
WORKER = ("airflow", "airflow-worker")
WORKER_KUBECONFIG = "worker-kubeconfig"
WRITES = {"create", "update", "patch", "delete"}
TRAINER = [
    "python",
    "-m",
    "trainops_devcluster.demo.trainer",
    "--steps",
    "60",
    "--checkpoint-every",
    "10",
    "--step-seconds",
    "0.02",
    "--heartbeat-every",
    "5",
]


def process_env(s3) -> dict[str, str]:
    """The trainer's environment: the local S3, and this venv's ``python`` first on PATH."""
    return {**s3.env(), "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


@pytest.fixture
def cluster(s3, monkeypatch, tmp_path):
    """An 8-node devcluster (inference settled, every node probed once) with deploy/rbac.yaml applied;
    Airflow points at it as the workers' ServiceAccount (``worker_kubeconfig``)."""
    from trainops_devcluster.cluster import DevCluster

    with DevCluster(nodes=8, gpus_per_node=8, process_env=process_env(s3)) as dev:
        dev.wait_until_settled()
        dev.probe_daemon.wait_rounds(1)
        dev.create_from_file(RBAC)
        worker = dev.service_account_kubeconfig(*WORKER, tmp_path / WORKER_KUBECONFIG)
        monkeypatch.setenv("KUBECONFIG", str(worker))
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", airflow_home.kubernetes_connection(worker))
        yield dev


@pytest.fixture
def worker_kubeconfig(cluster, tmp_path) -> Path:
    """The kubeconfig the package runs with: a token of the workers' ServiceAccount."""
    return tmp_path / WORKER_KUBECONFIG


@pytest.fixture
def api(cluster):
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client
    client.close()


def lifecycle_conf(bucket: str, run_name: str, command=TRAINER, **params) -> dict:
    return {
        "run_name": run_name,
        "checkpoint_uri": f"s3://{bucket}/runs/",
        "command": list(command),
        **params,
    }


def writes(cluster) -> list[dict]:
    """The API writes (create/update/patch/delete) the devcluster served to trainops (the workers'
    ServiceAccount): the fixtures' own, such as applying deploy/rbac.yaml, are not the run's."""
    worker = "system:serviceaccount:{}:{}".format(*WORKER)
    return [e for e in cluster.server.audit.entries() if e["verb"] in WRITES and e["user"] == worker]


@dataclass
class Capacity:
    """What inference and the training queue hold: replicas per Deployment and the queue's GPU quota."""

    replicas: dict[str, int]
    gpu_quota: str

    @classmethod
    def read(cls, api) -> Capacity:
        from kubernetes import client

        deployments = raw(client.AppsV1Api(api).list_deployment_for_all_namespaces(_preload_content=False))
        kube = Kube.of(api)
        queue = kube.get(kube.kueue("clusterqueues", namespaced=False), "training")
        quota = [
            r["nominalQuota"]
            for group in queue["spec"]["resourceGroups"]
            for flavor in group["flavors"]
            for r in flavor["resources"]
            if r["name"] == GPU_RESOURCE
        ]
        return cls(
            {
                f"{d['metadata']['namespace']}/{d['metadata']['name']}": d["spec"]["replicas"]
                for d in deployments["items"]
            },
            str(quota[0]),
        )


@pytest.fixture
def capacity_before(api) -> Capacity:
    return Capacity.read(api)


def assert_capacity_back(api, before: Capacity) -> None:
    """No node claimed or in training mode, inference at full replicas and Ready, the quota as before."""
    from kubernetes import client

    for node in raw(client.CoreV1Api(api).list_node(_preload_content=False))["items"]:
        name = node["metadata"]["name"]
        assert CLAIMED_BY_ANNOTATION not in (node["metadata"].get("annotations") or {}), (
            f"{name} still claimed"
        )
        modes = [t.get("value") for t in node["spec"].get("taints") or [] if t["key"] == MODE_TAINT]
        assert MODE_TRAINING not in modes, f"{name} still in training mode"
    after = Capacity.read(api)
    assert after == before
    deployments = raw(client.AppsV1Api(api).list_deployment_for_all_namespaces(_preload_content=False))
    for d in deployments["items"]:
        assert d["status"].get("readyReplicas") == d["spec"]["replicas"], d["metadata"]["name"]


def task_instances(dag_run) -> dict:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: ti for ti in dag_run.get_task_instances(session=session)}


class MarkedFailed(RuntimeError):
    """The user marked the deferred task failed; the trigger was cancelled and its on_kill ran."""


@pytest.fixture
def triggerer_honours_mark_failed(monkeypatch):
    """Make dag.test() do what the triggerer does when a user marks a deferred task failed.

    ``dag.test()`` runs each trigger inline to its first event and never looks at the task's state
    meanwhile. The triggerer does: it cancels the trigger and awaits ``on_kill()``. This wraps the
    inline run so that a task instance set to ``failed`` in the metadata database (the UI's "Mark
    failed") cancels the trigger and runs its ``on_kill``; the task then ends failed.
    """
    from airflow.sdk.definitions import dag as dag_module

    inline = dag_module._run_inline_trigger

    def run_inline(trigger, task_sdk_ti):
        return inline(_Cancellable(trigger, task_sdk_ti.id), task_sdk_ti)

    monkeypatch.setattr(dag_module, "_run_inline_trigger", run_inline)


class _Cancellable:
    def __init__(self, trigger, ti_id) -> None:
        self.trigger, self.ti_id = trigger, ti_id

    async def run(self):
        following = asyncio.ensure_future(anext(self.trigger.run(), None))
        while not following.done():
            if await asyncio.to_thread(_marked_failed, self.ti_id):
                following.cancel()
                await self.trigger.on_kill()
                raise MarkedFailed(f"task instance {self.ti_id} marked failed by a user")
            await asyncio.wait({following}, timeout=0.2)
        yield following.result()


def _marked_failed(ti_id) -> bool:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.get(TaskInstance, ti_id).state == "failed"


def mark_failed(dag_id: str, task_id: str) -> None:
    """What the UI's "Mark failed" does to a running task instance: set its state in the database.

    (``dag.test()`` keeps a task it runs a trigger for in ``queued``.)"""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id, TaskInstance.state == "queued"
            )
        ).one()
        ti.state = "failed"


def training_running(s3, run_uri: str, step: int):
    """A condition: the run's heartbeat has reached ``step``."""
    return lambda: heartbeat_step(s3, run_uri) >= step


def running_training_pod(api, attempt: str) -> dict | None:
    """A Running pod of attempt ``attempt`` (``"1"``, ...), or None."""
    return next(
        (
            p
            for p in pods(api)
            if p["metadata"]["labels"].get("trainops.io/attempt") == attempt
            and p["status"].get("phase") == "Running"
        ),
        None,
    )


def xid_mid_run(cluster, api, s3, run_uri: str, step: int = 25) -> dict:
    """Once the run's heartbeat reaches ``step`` with attempt 1 running, an XID 79 on that pod's node.
    Returns a dict that holds the node hit under ``"node"`` once the fault fired."""
    fault: dict = {}

    def inject():
        fault["node"] = running_training_pod(api, "1")["spec"]["nodeName"]
        cluster.inject("xid", fault["node"], code=79)

    when(lambda: training_running(s3, run_uri, step)() and running_training_pod(api, "1"), inject)
    return fault
