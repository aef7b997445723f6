"""The apps/v1 Deployment controller (with the ReplicaSet layer folded in).

It keeps ``spec.replicas`` pods of the current pod template, named and labelled as a
ReplicaSet's would be (``<deployment>-<pod-template-hash>-<random>``, label
``pod-template-hash``) but owned by the Deployment itself, which ``kubectl get``/``drain`` accept.
A template change rolls pods over without losing ready replicas (maxUnavailable 0).  A scale-down
removes pods in the ReplicaSet's order, ``controller.kubernetes.io/pod-deletion-cost`` included.  Status:
replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas,
observedGeneration and the ``Available``/``Progressing`` conditions.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math

from trainops_devcluster.conditions import set_condition
from trainops_devcluster.owners import PodOwnerController
from trainops_devcluster.podutil import (
    is_active,
    is_ready,
    node_of,
    phase,
    pod_from_template,
)

HASH_LABEL = "pod-template-hash"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generated name suffixes


def template_hash(template: dict) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_SAFE[b % len(_SAFE)] for b in digest[:10])


def deletion_cost(pod: dict) -> int:
    """The pod's ``controller.kubernetes.io/pod-deletion-cost`` (0 when absent or not an int32, as
    the ReplicaSet controller reads it)."""
    raw = (pod["metadata"].get("annotations") or {}).get(DELETION_COST, "0")
    try:
        cost = int(raw)
    except ValueError:
        return 0
    return cost if -(2**31) <= cost < 2**31 else 0


def deletion_order(pods: list[dict]) -> list[dict]:
    """Pods in the order a ReplicaSet removes them: unbound, then not running, then not ready, then
    the lowest pod-deletion-cost, then the newest."""
    newest_first = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
    return sorted(
        newest_first,
        key=lambda p: (bool(node_of(p)), phase(p) == "Running", is_ready(p), deletion_cost(p)),
    )


class DeploymentController(PodOwnerController):
    owner = "deployments.apps"
    component = "deployment-controller"
    watches = ("deployments.apps", "pods")

    def sync(self, deployment: dict) -> None:
        spec = deployment["spec"]
        replicas = spec.get("replicas", 1)
        current_hash = template_hash(spec["template"])
        active = [p for p in self.pods_of(deployment) if is_active(p)]
        new = [p for p in active if p["metadata"].get("labels", {}).get(HASH_LABEL) == current_hash]
        old = [p for p in active if p["metadata"].get("labels", {}).get(HASH_LABEL) != current_hash]

        cut = max(0, len(new) - replicas)
        surplus, new = deletion_order(new)[:cut], deletion_order(new)[cut:]
        cut = max(0, len(old) + sum(1 for p in new if is_ready(p)) - replicas)
        retired, old = deletion_order(old)[:cut], deletion_order(old)[cut:]
        self.delete_pods(deployment, surplus + retired)
        for _ in range(replicas - len(new)):
            created = self.create_pod(
                deployment,
                pod_from_template(
                    spec["template"],
                    owner=deployment,
                    generate_name=f"{deployment['metadata']['name']}-{current_hash}-",
                    labels={HASH_LABEL: current_hash},
                ),
            )
            if created is not None:
                new.append(created)
        self.write_status(deployment, self._status(deployment, new + old, new, replicas, current_hash))

    def _status(
        self, deployment: dict, active: list[dict], new: list[dict], replicas: int, current_hash: str
    ) -> dict:
        ready = sum(1 for p in active if is_ready(p))
        status = copy.deepcopy(deployment.get("status") or {})
        status.update(
            observedGeneration=deployment["metadata"].get("generation", 1),
            replicas=len(active),
            updatedReplicas=len(new),
            readyReplicas=ready,
            availableReplicas=ready,
            unavailableReplicas=max(0, replicas - ready),
        )
        probe = {"status": status}
        if ready >= replicas - _max_unavailable(deployment, replicas):
            set_condition(
                probe, "Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability."
            )
        else:
            set_condition(
                probe,
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        replica_set = f"{deployment['metadata']['name']}-{current_hash}"
        if len(new) == replicas and ready == replicas == len(active):
            set_condition(
                probe,
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                f'ReplicaSet "{replica_set}" has successfully progressed.',
            )
        else:
            set_condition(
                probe,
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                f'ReplicaSet "{replica_set}" is progressing.',
            )
        return status


def _max_unavailable(deployment: dict, replicas: int) -> int:
    value = ((deployment["spec"].get("strategy") or {}).get("rollingUpdate") or {}).get(
        "maxUnavailable", "25%"
    )
    if isinstance(value, str) and value.endswith("%"):
        return math.floor(int(value[:-1]) * replicas / 100)
    return int(value)
