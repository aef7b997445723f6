"""Pod facts shared by the simulated controllers: phases, readiness, resource requests, ownership,
creating pods from a template and deleting them the way the API server does."""

from __future__ import annotations

import copy
import functools
import math

from trainops_devcluster import defaults, gc, kinds
from trainops_devcluster.conditions import condition_true
from trainops_devcluster.store import Conflict, NotFound, Store

TERMINAL_PHASES = ("Succeeded", "Failed")
DEFAULT_GRACE_SECONDS = 30


def phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def is_terminal(pod: dict) -> bool:
    return phase(pod) in TERMINAL_PHASES


def is_deleting(obj: dict) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def is_active(pod: dict) -> bool:
    """Neither finished nor being deleted: what controllers count as a live replica."""
    return not is_terminal(pod) and not is_deleting(pod)


def is_ready(pod: dict) -> bool:
    return condition_true(pod, "Ready")


def node_of(pod: dict) -> str:
    return (pod.get("spec") or {}).get("nodeName") or ""


def controller_uid(obj: dict) -> str | None:
    """The uid of the object's controller ownerReference, if any."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def owner_reference(owner: dict) -> dict:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


@functools.lru_cache(maxsize=4096)
def milli(quantity: str | int | float) -> int:
    """A resource quantity ("8", "500m", "64Gi") in thousandths, rounded up."""
    from kubernetes.utils.quantity import parse_quantity

    return math.ceil(parse_quantity(quantity) * 1000)


def pod_requests(pod: dict) -> dict[str, int]:
    """What the scheduler reserves for a pod, in thousandths: the sum over containers of their
    requests (a limit stands in for a missing request), at least the largest init container's."""
    spec = pod.get("spec") or {}

    def of(container: dict) -> dict[str, int]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: milli(value) for name, value in merged.items()}

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in of(container).items():
            total[name] = total.get(name, 0) + value
    for container in spec.get("initContainers") or []:
        for name, value in of(container).items():
            total[name] = max(total.get(name, 0), value)
    return total


def gpu_count(pod: dict) -> int:
    return pod_requests(pod).get("nvidia.com/gpu", 0) // 1000


def pod_from_template(
    template: dict, *, owner: dict, generate_name: str, labels: dict, annotations: dict | None = None
) -> dict:
    """A new pod for ``owner`` from its pod template, with the defaults the API server would add."""
    template = copy.deepcopy(template)
    metadata = template.get("metadata") or {}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": generate_name,
            "namespace": owner["metadata"]["namespace"],
            "labels": {**(metadata.get("labels") or {}), **labels},
            "annotations": {**(metadata.get("annotations") or {}), **(annotations or {})},
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": template.get("spec") or {},
        "status": {"phase": "Pending"},
    }
    defaults.apply(kinds.by_resource("pods"), pod, creating=True)
    return pod


def delete_pod(store: Store, namespace: str, name: str, uid: str | None = None) -> bool:
    """Delete a pod as a DELETE request does (a running pod gets ``deletionTimestamp`` and its kubelet
    stops it).  Returns ``False`` when that pod was already gone."""
    for _ in range(5):  # a concurrent status write makes the graceful mark conflict: read again
        try:
            gc.delete_object(store, "pods", namespace, name, uid=uid)
            return True
        except NotFound:
            return False
        except Conflict:
            if uid is None:
                continue
            current = store.find("pods", namespace, name)
            if current is None or current["metadata"]["uid"] != uid:
                return False
    return False
