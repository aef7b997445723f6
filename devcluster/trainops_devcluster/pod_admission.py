"""What kube-apiserver's Priority and RuntimeClass admission plugins do to a pod at creation.

- ``priorityClassName``: resolved to ``spec.priority`` (a pod naming a class that does not exist is
  refused: ``no PriorityClass with name X was found``). The devcluster knows the two classes every
  cluster has, ``system-node-critical`` and ``system-cluster-critical``; it serves no PriorityClass
  objects.
- ``runtimeClassName``: a pod naming a RuntimeClass that does not exist is refused (``pod rejected:
  RuntimeClass "X" not found``). The devcluster's GPU nodes run as a GPU Operator cluster's do: the
  operator creates the RuntimeClass ``nvidia`` (its container toolkit's handler); no other exists.

The API server runs :func:`pod_admission` on pod creates; controllers that create pods through the
store (Job, Deployment, DaemonSet) call :func:`admit_pod` first, and record ``FailedCreate`` as the
real controllers do when the API refuses them.
"""

from __future__ import annotations

import copy

from trainops_devcluster.errors import Forbidden

BUILT_IN_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
RUNTIME_CLASSES = ("nvidia",)  # created by the NVIDIA GPU Operator (values.yaml operator.runtimeClass)


def admit_pod(pod: dict) -> dict:
    """The pod as admitted (``spec.priority`` set from its class), or Forbidden."""
    spec = pod.get("spec") or {}
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName", "")
    runtime = spec.get("runtimeClassName")
    if runtime is not None and runtime not in RUNTIME_CLASSES:
        raise Forbidden(f'pods "{name}" is forbidden: pod rejected: RuntimeClass "{runtime}" not found')
    priority_class = spec.get("priorityClassName")
    if priority_class is None:
        return pod
    if priority_class not in BUILT_IN_PRIORITY_CLASSES:
        raise Forbidden(f'pods "{name}" is forbidden: no PriorityClass with name {priority_class} was found')
    admitted = copy.deepcopy(pod)
    admitted["spec"]["priority"] = BUILT_IN_PRIORITY_CLASSES[priority_class]
    return admitted


def pod_admission(resource: str, operation: str, obj: dict, old: dict | None) -> dict:
    """The API server's admission hook: pods at creation, everything else as it is."""
    if resource == "pods" and operation == "CREATE":
        return admit_pod(obj)
    return obj
