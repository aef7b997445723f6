"""Deployments keep their replicas and report readiness; PodDisruptionBudgets get their status."""

from __future__ import annotations

import time

from trainops_devcluster.deployments import DELETION_COST
from trainops_devcluster.podutil import delete_pod

from tests.devcluster.ctrl_support import NS, control_plane, node


def deployment(name: str, replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.example/llm:1",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}},
                        }
                    ]
                },
            },
        },
    }


def live_pods(plane, app: str) -> list[dict]:
    return [
        p
        for p in plane.store.list("pods", NS)[0]
        if p["metadata"]["labels"].get("app") == app and not p["metadata"].get("deletionTimestamp")
    ]


def ready_replicas(plane, name: str) -> int:
    return plane.store.get("deployments.apps", NS, name).get("status", {}).get("readyReplicas", 0)


def test_deployment_scales_up_and_down():
    with control_plane(node("a"), node("b")) as plane:
        plane.store.create("deployments.apps", deployment("llm", 2))
        plane.wait(lambda: ready_replicas(plane, "llm") == 2)
        status = plane.store.get("deployments.apps", NS, "llm")["status"]
        assert status["replicas"] == status["updatedReplicas"] == status["availableReplicas"] == 2
        available = next(c for c in status["conditions"] if c["type"] == "Available")
        assert available["status"] == "True" and available["reason"] == "MinimumReplicasAvailable"
        pod = live_pods(plane, "llm")[0]
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
        assert pod["metadata"]["name"].startswith(
            "llm-" + pod["metadata"]["labels"]["pod-template-hash"] + "-"
        )

        plane.store.mutate("deployments.apps", NS, "llm", lambda d: d["spec"].update(replicas=4))
        plane.wait(lambda: ready_replicas(plane, "llm") == 4)
        assert len({p["spec"]["nodeName"] for p in live_pods(plane, "llm")}) == 2

        plane.store.mutate("deployments.apps", NS, "llm", lambda d: d["spec"].update(replicas=1))
        plane.wait(lambda: len(plane.store.list("pods", NS)[0]) == 1)
        assert plane.wait(lambda: plane.store.get("deployments.apps", NS, "llm")["status"]["replicas"] == 1)


def test_deleted_deployment_pod_is_replaced():
    with control_plane(node("a")) as plane:
        plane.store.create("deployments.apps", deployment("llm", 1))
        plane.wait(lambda: ready_replicas(plane, "llm") == 1)
        first = live_pods(plane, "llm")[0]["metadata"]["name"]
        delete_pod(plane.store, NS, first)
        plane.wait(lambda: [p for p in live_pods(plane, "llm") if p["metadata"]["name"] != first])
        plane.wait(lambda: ready_replicas(plane, "llm") == 1 and plane.pod(first) is None)


def test_pod_disruption_budget_status_follows_the_pods():
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "llm"}}},
    }
    with control_plane(node("a")) as plane:
        plane.store.create("poddisruptionbudgets.policy", budget)
        plane.store.create("deployments.apps", deployment("llm", 2))

        def status():
            return plane.store.get("poddisruptionbudgets.policy", NS, "llm").get("status", {})

        plane.wait(lambda: status().get("currentHealthy") == 2)
        assert (
            status()["desiredHealthy"] == 1
            and status()["disruptionsAllowed"] == 1
            and status()["expectedPods"] == 2
        )
        assert status()["observedGeneration"] == 1
        plane.store.mutate("deployments.apps", NS, "llm", lambda d: d["spec"].update(replicas=1))
        plane.wait(lambda: status().get("currentHealthy") == 1 and status().get("disruptionsAllowed") == 0)
        allowed = next(c for c in status()["conditions"] if c["type"] == "DisruptionAllowed")
        assert allowed["status"] == "False" and allowed["reason"] == "InsufficientPods"


def test_a_scale_down_removes_the_pods_with_the_lowest_deletion_cost_first():
    """The ReplicaSet's order: without costs the newest pods go first; marked pods go before them."""
    with control_plane(node("a"), node("b")) as plane:
        plane.store.create("deployments.apps", deployment("llm", 2))
        plane.wait(lambda: ready_replicas(plane, "llm") == 2)
        oldest = sorted(p["metadata"]["name"] for p in live_pods(plane, "llm"))
        time.sleep(1.1)  # creationTimestamp has whole seconds: the next pods are newer
        plane.store.mutate("deployments.apps", NS, "llm", lambda d: d["spec"].update(replicas=4))
        plane.wait(lambda: ready_replicas(plane, "llm") == 4)
        for name in oldest:
            plane.store.mutate(
                "pods",
                NS,
                name,
                lambda p: p["metadata"].setdefault("annotations", {}).update({DELETION_COST: "-5"}),
            )

        plane.store.mutate("deployments.apps", NS, "llm", lambda d: d["spec"].update(replicas=2))
        plane.wait(lambda: len(live_pods(plane, "llm")) == 2)
        assert not {p["metadata"]["name"] for p in live_pods(plane, "llm")} & set(oldest)
