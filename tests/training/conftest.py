"""A devcluster whose process runtime talks to the local S3 server, and helpers for the gang tests."""

from __future__ import annotations

import json
import threading
import time

import pytest

from trainops.devcluster import airflow_home


@pytest.fixture
def cluster(s3, monkeypatch):
    """A 16-node devcluster (inference settled) with the trainer's S3 env; Airflow points at it."""
    from trainops.devcluster.cluster import DevCluster

    with DevCluster(nodes=16, gpus_per_node=8, process_env=s3.env()) as dev:
        dev.wait_until_settled()
        monkeypatch.setenv("KUBECONFIG", str(dev.kubeconfig))
        monkeypatch.setenv(
            "AIRFLOW_CONN_KUBERNETES_DEFAULT", airflow_home.kubernetes_connection(dev.kubeconfig)
        )
        yield dev


@pytest.fixture
def api(cluster):
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client
    client.close()


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
