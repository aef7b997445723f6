"""A devcluster whose process runtime talks to the local S3 server, and helpers for the gang tests."""

from __future__ import annotations

import json
import threading
import time

import pytest


@pytest.fixture
def devcluster(make_devcluster, s3):
    """The default devcluster, whose process runtime (the trainer) talks to the local S3 server."""
    return make_devcluster(process_env=s3.env())


@pytest.fixture
def cluster(devcluster):
    return devcluster


@pytest.fixture
def api(k8s):
    return k8s


def raw(response) -> dict:
    return json.loads(response.data)


def idle_nodes(api) -> list[str]:
    """GPU nodes no pod runs on (inference leaves a quarter of the fleet idle)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    busy = {
        p["spec"].get("nodeName")
        for p in raw(core.list_pod_for_all_namespaces(_preload_content=False))["items"]
    }
    return sorted(
        n["metadata"]["name"]
        for n in raw(core.list_node(_preload_content=False))["items"]
        if n["metadata"]["name"] not in busy
    )


def jobs(api, namespace="training") -> list[dict]:
    from kubernetes import client

    return raw(client.BatchV1Api(api).list_namespaced_job(namespace, _preload_content=False))["items"]


def pods(api, namespace="training") -> list[dict]:
    from kubernetes import client

    return raw(client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False))["items"]


def node(api, name) -> dict:
    from kubernetes import client

    return raw(client.CoreV1Api(api).read_node(name, _preload_content=False))


def heartbeat_step(s3, run_uri: str) -> int:
    bucket, _, prefix = run_uri[5:].partition("/")
    try:
        body = s3.client().get_object(Bucket=bucket, Key=f"{prefix}heartbeat.json")["Body"].read()
    except Exception:
        return -1
    return json.loads(body)["step"]


def when(condition, action, name="fault") -> threading.Thread:
    """Run ``action()`` on a thread once ``condition()`` holds (the DAG run blocks the test thread)."""
    done: dict = {}

    def loop():
        while not condition():
            time.sleep(0.05)
        done["result"] = action()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.result = done
    thread.start()
    return thread


def claimed_run(cluster, api, bucket: str, run_id: str, args: list[str], claimed: int = 2):
    """Claim ``claimed`` idle nodes for the DAG run ``dag/<run_id>``; returns a ``Kube`` and the demo
    trainer's two-node ``TrainingSpec`` on those nodes, under ``s3://<bucket>/runs/<run_id>/``."""
    import sys

    from trainops.capacity.procedure import claim
    from trainops.kube.client import Kube
    from trainops.training.spec import TrainingSpec

    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    nodes = idle_nodes(api)[:claimed]
    claim(kube, f"dag/{run_id}", nodes, cluster_queue="training")
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args=args,
        run_uri=f"s3://{bucket}/runs/{run_id}/",
        nodes=2,
        node_names=nodes,
    )
    return kube, spec


def training_run(kube, spec, run_id: str, try_number: int = 1, first_try: int = 1, **options):
    """The run ``dag/<run_id>`` as a try ``try_number`` of ``train`` makes it (its resume budget counting from
    try ``first_try``: ``max_resumes`` 3 and ``unconfirmed_fault_retries`` 1 unless given), followed with a
    0.2 s heartbeat poll; ``options``: the budget's and ``Options``' fields, and ``hang`` (a HangPolicy)."""
    from trainops.checkpoints.store import CheckpointStore
    from trainops.training.cluster import GangCluster
    from trainops.training.decide import Budget, Options
    from trainops.training.follow import FollowConfig
    from trainops.training.progress import HangPolicy
    from trainops.training.reconcile import TrainingRun

    budget = Budget(
        try_number,
        first_try,
        options.pop("max_resumes", 3),
        options.pop("unconfirmed_fault_retries", 1),
    )
    hang = options.pop("hang", HangPolicy())
    follow = FollowConfig("training", "", spec.run_uri, spec.nodes, hang=hang, heartbeat_poll=0.2)
    return TrainingRun(
        GangCluster(kube),
        "training",
        "dag",
        run_id,
        spec=spec,
        store=CheckpointStore(),
        budget=budget,
        options=Options(**options),
        follow_config=follow,
    )


def run_to_end(cluster, run):
    """What the trigger does with ``run``: ``follow_to_end`` with its follower, to ``Succeed`` or ``Fail``."""
    import asyncio

    from benchmarks.campaign.steps import async_client

    return asyncio.run(run.follow_to_end(run.follower(async_client(str(cluster.kubeconfig)))))
