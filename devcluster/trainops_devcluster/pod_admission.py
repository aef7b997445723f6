"""What kube-apiserver's Priority and RuntimeClass admission plugins do to a pod at creation.

- ``priorityClassName``: resolved to ``spec.priority`` (a pod naming a class that does not exist is
  refused: ``no PriorityClass with name X was found``). The devcluster knows the two classes every
  cluster has, ``system-node-critical`` and ``system-cluster-critical``; it serves no PriorityClass
  objects.
- ``runtimeClassName``: a pod naming a RuntimeClass that does not exist (in the store: the devcluster
  serves ``node.k8s.io/v1`` RuntimeClasses) is refused (``pod rejected: RuntimeClass "X" not found``).
  The devcluster's GPU nodes run as a GPU Operator cluster's do: every devcluster starts with the
  operator's RuntimeClass ``nvidia`` (its container toolkit's handler; ``topology.gpu_operator_objects``).

The API server runs the hook :func:`pod_admission` makes on pod creates; controllers that create pods
through the store (Job, Deployment, DaemonSet) call :func:`admit_pod` first, and record
``FailedCreate`` as the real controllers do when the API refuses them.
"""

from __future__ import annotations

import copy

from trainops_devcluster.errors import Forbidden
from trainops_devcluster.store import Store

BUILT_IN_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
RUNTIME_CLASSES = "runtimeclasses.node.k8s.io"


def admit_pod(pod: dict, store: Store) -> dict:
    """The pod as admitted (``spec.priority`` set from its class), or Forbidden."""
    spec = pod.get("spec") or {}
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName", "")
    runtime = spec.get("runtimeClassName")
    if runtime is not None and store.find(RUNTIME_CLASSES, "", runtime) is None:
        raise Forbidden(
            f'pods "{name}" is forbidden: pod rejected: RuntimeClass "{runtime}" not found',
            resource="pods",
            name=name,
        )
    priority_class = spec.get("priorityClassName")
    if priority_class is None:
        return pod
    if priority_class not in BUILT_IN_PRIORITY_CLASSES:
        raise Forbidden(
            f'pods "{name}" is forbidden: no PriorityClass with name {priority_class} was found',
            resource="pods",
            name=name,
        )
    admitted = copy.deepcopy(pod)
    admitted["spec"]["priority"] = BUILT_IN_PRIORITY_CLASSES[priority_class]
    return admitted


def pod_admission(store: Store):
    """The API server's admission hook: pods at creation, everything else as it is."""

    def admit(resource: str, operation: str, obj: dict, old: dict | None) -> dict:
        if resource == "pods" and operation == "CREATE":
            return admit_pod(obj, store)
        return obj

    return admit
