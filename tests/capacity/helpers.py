"""Shared checks for the capacity tests: cluster snapshots, inference health, nodes by workload."""

from __future__ import annotations

import copy
import threading

from trainops.conventions import GPU_POOL_LABEL, HEALTH_SUMMARY_ANNOTATION
from trainops.kube import client as api
from trainops.kube.client import Kube

MANAGED = ("resourceVersion", "generation", "managedFields")
DEPLOYMENTS = ["inference/llm-chat", "inference/embeddings"]


def kube_for(cluster) -> Kube:
    return Kube.from_kubeconfig(str(cluster.kubeconfig))


def _object(obj: dict) -> dict:
    """The object without its status and the server-managed metadata (resourceVersion, generation);
    empty metadata fields dropped, as the API's omitempty serialization does."""
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    for key in MANAGED:
        obj["metadata"].pop(key, None)
    annotations = obj["metadata"].get("annotations") or {}
    annotations.pop(HEALTH_SUMMARY_ANNOTATION, None)  # the node probe refreshes it at its own pace
    obj["metadata"] = {k: v for k, v in obj["metadata"].items() if v not in ({}, "", None)}
    return obj


def default_seeded_objects(cluster) -> None:
    """Send the seeded ClusterQueue through the API once (an empty merge patch).

    The devcluster seeds its store directly, so it lacks the defaults the API server fills in on
    every write (``queueingStrategy``...); a real cluster never serves it so.  (Deployments are
    compared without their pod template for the same reason: defaulting it would roll them out.)"""
    kube = kube_for(cluster)
    kube.patch(kube.kueue("clusterqueues", namespaced=False), "training", {})


def snapshot(cluster) -> dict:
    """Nodes, Deployments, PDBs and ClusterQueues as the API serves them, for exact before/after comparison."""
    kube = kube_for(cluster)
    kinds = {
        "nodes": api.NODES,
        "deployments": api.DEPLOYMENTS,
        "poddisruptionbudgets": api.Kind("policy", "v1", "poddisruptionbudgets"),
        "clusterqueues": kube.kueue("clusterqueues", namespaced=False),
    }
    out = {name: {o["metadata"]["name"]: _object(o) for o in kube.list(kind)} for name, kind in kinds.items()}
    for deployment in out["deployments"].values():
        deployment["spec"] = {k: deployment["spec"].get(k) for k in ("replicas", "selector")}
    return out


def nodes_by_app(cluster) -> dict[str, list[str]]:
    """Which nodes run pods of each inference app, plus ``"idle"``: GPU nodes running none."""
    found: dict[str, list[str]] = {}
    for pod in cluster.store.list("pods")[0]:
        app = pod["metadata"].get("labels", {}).get("app")
        if app and pod["spec"].get("nodeName"):
            found.setdefault(app, []).append(pod["spec"]["nodeName"])
    busy = {n for names in found.values() for n in names}
    found["idle"] = sorted(
        n["metadata"]["name"]
        for n in cluster.store.list("nodes")[0]
        if n["metadata"]["name"] not in busy and n["metadata"].get("labels", {}).get(GPU_POOL_LABEL) == "true"
    )
    return {app: sorted(names) for app, names in found.items()}


def healthy(pod: dict) -> bool:
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])
    )
    return ready and not pod["metadata"].get("deletionTimestamp")


class HealthSampler:
    """Records, at every pod change, each PDB-guarded app's healthy pods; ``lowest`` is the minimum seen."""

    def __init__(self, cluster) -> None:
        self.store = cluster.store
        self.min_available = {
            p["spec"]["selector"]["matchLabels"]["app"]: p["spec"]["minAvailable"]
            for p in self.store.list("poddisruptionbudgets.policy")[0]
        }
        self.lowest = {app: 10**9 for app in self.min_available}
        self.samples = 0
        self._lock = threading.Lock()
        self._on = True
        self.store.add_listener(self._sample)

    def _sample(self, event) -> None:  # runs under the store lock: read only, never raise
        if not self._on or event.resource != "pods":
            return
        try:
            counts = dict.fromkeys(self.min_available, 0)
            for pod in self.store.list("pods")[0]:
                app = pod["metadata"].get("labels", {}).get("app")
                if app in counts and healthy(pod):
                    counts[app] += 1
            with self._lock:
                self.samples += 1
                for app, count in counts.items():
                    self.lowest[app] = min(self.lowest[app], count)
        except Exception:  # noqa: BLE001 - a sampler must never break the store
            pass

    def stop(self) -> None:
        self._on = False


def writes(cluster) -> list[dict]:
    return [e for e in cluster.server.audit.entries() if e["verb"] in ("create", "update", "patch", "delete")]


def rival_writer(cluster, nodes: list[str], stop: threading.Event) -> None:
    """Another controller writing the same nodes until ``stop`` is set: real 409s for a claim's writes."""
    while not stop.is_set():
        for name in nodes:
            cluster.store.mutate(
                "nodes", "", name, lambda n: n["metadata"].setdefault("labels", {}).update(churn="x")
            )
            cluster.store.mutate("nodes", "", name, lambda n: n["metadata"]["labels"].pop("churn"))
        stop.wait(0.02)
