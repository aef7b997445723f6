"""A small simulated control plane for the controller tests: a Store with nodes, the controllers
running on it, and helpers to create objects and wait for an outcome."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

from trainops_devcluster import defaults, kinds
from trainops_devcluster.controllers import Controllers, start_controllers
from trainops_devcluster.logs import PodLogs
from trainops_devcluster.store import Store
from trainops_devcluster.telemetry import NodeTelemetry

NS = "default"


def wait_for(check: Callable[[], object], what: str = "", timeout: float = 60.0) -> object:
    """Poll until ``check()`` is truthy and return it (the timeout only stops a broken test hanging)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.02)
    return value


def node(name: str, gpus: int = 8, labels: dict | None = None, taints: list | None = None, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], **spec},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": f"192.168.0.{len(name)}"}],
        },
    }


def pod(
    name: str,
    *,
    gpus: int = 1,
    image: str = "registry.example/app:1",
    annotations: dict | None = None,
    **spec,
) -> dict:
    container = {"name": "main", "image": image, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    container.update(spec.pop("container", {}))
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
        "status": {"phase": "Pending"},
    }
    defaults.apply(kinds.by_resource("pods"), obj, creating=True)  # as the API server would
    return obj


def job(
    name: str,
    *,
    completions: int = 4,
    parallelism: int = 4,
    indexed: bool = True,
    container: dict | None = None,
    **spec,
) -> dict:
    main = {
        "name": "train",
        "image": "registry.example/train:1",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    main.update(container or {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "completionMode": "Indexed" if indexed else "NonIndexed",
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": spec.pop("pod_annotations", {})},
                "spec": {"restartPolicy": "Never", "containers": [main]},
            },
            **spec,
        },
    }


def pods_of(plane, name: str) -> list[dict]:
    return [
        p
        for p in plane.store.list("pods", NS)[0]
        if (p["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name") == name
    ]


class Plane:
    def __init__(self, store: Store, logs: PodLogs, telemetry: dict, controllers: Controllers) -> None:
        self.store, self.logs, self.telemetry, self.controllers = store, logs, telemetry, controllers
        self.faults = controllers.faults

    def pod(self, name: str) -> dict | None:
        return self.store.find("pods", NS, name)

    def wait(self, what: Callable[[], object], timeout: float = 60.0) -> object:
        return wait_for(what, timeout=timeout)

    def wait_phase(self, name: str, phase: str) -> dict:
        return self.wait(lambda: (p := self.pod(name)) and p["status"].get("phase") == phase and p)

    def job_condition(self, name: str, kind: str) -> dict | None:
        job = self.store.get("jobs.batch", NS, name)
        return next(
            (
                c
                for c in job.get("status", {}).get("conditions", [])
                if c["type"] == kind and c["status"] == "True"
            ),
            None,
        )

    def events(self, reason: str) -> list[dict]:
        return [e for e in self.store.list("events")[0] if e["reason"] == reason]


@contextmanager
def control_plane(*nodes: dict, process_env: dict | None = None):
    store = Store()
    logs = PodLogs()
    telemetry = {}
    for obj in nodes:
        store.create("nodes", obj)
        gpus = int(obj["status"]["allocatable"]["nvidia.com/gpu"])
        telemetry[obj["metadata"]["name"]] = NodeTelemetry.healthy(obj["metadata"]["name"], max(gpus, 1))
    controllers = start_controllers(store, logs, telemetry, process_env or {})
    try:
        yield Plane(store, logs, telemetry, controllers)
    finally:
        controllers.stop()
