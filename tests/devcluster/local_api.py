"""A small local API server for the tests that need only the store, the API server, the garbage
collector and the disruption controller (a tiny watch history makes 410 reachable)."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import yaml
from kubernetes import config
from trainops_devcluster.authn import ADMIN_TOKEN
from trainops_devcluster.disruption import DisruptionController
from trainops_devcluster.gc import GarbageCollector
from trainops_devcluster.logs import PodLogs
from trainops_devcluster.server import ApiServer
from trainops_devcluster.store import Store


class LocalApi:
    def __init__(self, tmp_path, history: int = 200, kueue_version: str = "v1beta2") -> None:
        self.store = Store(history=history)
        for ns in ("default", "team"):
            self.store.create("namespaces", {"metadata": {"name": ns}, "status": {"phase": "Active"}})
        for i in range(3):
            self.store.create("nodes", node(f"node-{i}", rack=f"r{i % 2}"))
        self.logs = PodLogs()
        self.controllers = [GarbageCollector(self.store), DisruptionController(self.store)]
        for controller in self.controllers:
            controller.start()
        self.server = ApiServer(self.store, logs=self.logs, kueue_version=kueue_version)
        self.url = self.server.start()
        self.kubeconfig = tmp_path / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.url)))
        self.client = config.new_client_from_config(config_file=str(self.kubeconfig))

    def raw(
        self, method: str, path: str, body: object = None, content_type: str = "application/json"
    ) -> tuple:
        """(status, headers, parsed JSON body) of one request."""
        conn = http.client.HTTPConnection(urlsplit(self.url).netloc, timeout=30)
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
        conn.request(
            method, path, body=data, headers={"Content-Type": content_type} if data is not None else {}
        )
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        try:
            parsed = json.loads(payload)
        except ValueError:
            parsed = payload.decode()
        return response.status, dict(response.getheaders()), parsed

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        for controller in self.controllers:
            controller.stop()


def kubeconfig(url: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": {"server": url}}],
        "users": [{"name": "dev", "user": {"token": ADMIN_TOKEN}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "dev", "namespace": "default"}}],
        "current-context": "dev",
    }


def node(name: str, rack: str = "r0") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"rack": rack, "kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(name: str, labels: dict | None = None, node_name: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }
