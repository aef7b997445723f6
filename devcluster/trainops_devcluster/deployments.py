"""The apps/v1 Deployment controller (with the ReplicaSet layer folded in).

It keeps ``spec.replicas`` pods of the current pod template, named and labelled as a
ReplicaSet's would be (``<deployment>-<pod-template-hash>-<random>``, label
``pod-template-hash``) but owned by the Deployment itself, which ``kubectl get``/``drain`` accept.
A template change rolls pods over without losing ready replicas (maxUnavailable 0).  Status:
replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas,
observedGeneration and the ``Available``/``Progressing`` conditions.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math

from trainops_devcluster.conditions import set_condition
from trainops_devcluster.events import WARNING, EventRecorder
from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.podutil import (
    controller_uid,
    delete_pod,
    is_active,
    is_ready,
    node_of,
    phase,
    pod_from_template,
)
from trainops_devcluster.store import NotFound, Store, StoreError

HASH_LABEL = "pod-template-hash"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generated name suffixes


def template_hash(template: dict) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_SAFE[b % len(_SAFE)] for b in digest[:10])


def deletion_order(pods: list[dict]) -> list[dict]:
    """Pods in the order a ReplicaSet removes them: unbound, then not running, then not ready,
    then the newest."""
    newest_first = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
    return sorted(newest_first, key=lambda p: (bool(node_of(p)), phase(p) == "Running", is_ready(p)))


class DeploymentController(InformerController):
    watches = ("deployments.apps", "pods")

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.events = EventRecorder(store, "deployment-controller")
        self._pods_of: dict[str, set[Key]] = {}
        self._keys: dict[str, Key] = {}

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if resource == "deployments.apps":
            if new is None:
                self._pods_of.pop(old["metadata"]["uid"], None)
                self._keys.pop(old["metadata"]["uid"], None)
            else:
                self._keys[new["metadata"]["uid"]] = key_of(new)
                self.mark(key_of(new))
            return
        pod = new or old
        owner = controller_uid(pod)
        if owner is None:
            return
        if new is None:
            self._pods_of.get(owner, set()).discard(key_of(pod))
        else:
            self._pods_of.setdefault(owner, set()).add(key_of(pod))
        if owner in self._keys:
            self.mark(self._keys[owner])

    def reconcile(self, keys: set[Key]) -> None:
        for key in sorted(keys):
            deployment = self.cache["deployments.apps"].get(key)
            if deployment is not None and not deployment["metadata"].get("deletionTimestamp"):
                self._sync(deployment)

    def _sync(self, deployment: dict) -> None:
        spec = deployment["spec"]
        replicas = spec.get("replicas", 1)
        current_hash = template_hash(spec["template"])
        uid = deployment["metadata"]["uid"]
        pods = [self.cache["pods"][k] for k in self._pods_of.get(uid, ()) if k in self.cache["pods"]]
        active = [p for p in pods if is_active(p)]
        new = [p for p in active if p["metadata"].get("labels", {}).get(HASH_LABEL) == current_hash]
        old = [p for p in active if p["metadata"].get("labels", {}).get(HASH_LABEL) != current_hash]

        cut = max(0, len(new) - replicas)
        surplus, new = deletion_order(new)[:cut], deletion_order(new)[cut:]
        cut = max(0, len(old) + sum(1 for p in new if is_ready(p)) - replicas)
        retired, old = deletion_order(old)[:cut], deletion_order(old)[cut:]
        for pod in surplus + retired:
            if delete_pod(self.store, *key_of(pod), uid=pod["metadata"]["uid"]):
                self.events.record(deployment, "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}")
        for _ in range(replicas - len(new)):
            created = self._create(deployment, current_hash)
            if created is not None:
                new.append(created)
        self._write_status(deployment, new + old, new, replicas, current_hash)

    def _create(self, deployment: dict, current_hash: str) -> dict | None:
        name = deployment["metadata"]["name"]
        template = deployment["spec"]["template"]
        pod = pod_from_template(
            template,
            owner=deployment,
            generate_name=f"{name}-{current_hash}-",
            labels={HASH_LABEL: current_hash},
        )
        try:
            created = self.store.create("pods", pod)
        except StoreError as error:
            self.events.record(deployment, "FailedCreate", f"Error creating: {error}", WARNING)
            return None
        self.observe("pods", created)
        self.events.record(deployment, "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")
        return created

    def _write_status(
        self, deployment: dict, active: list[dict], new: list[dict], replicas: int, current_hash: str
    ) -> None:
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
        if status == (deployment.get("status") or {}):
            return
        uid = deployment["metadata"]["uid"]

        def write(current: dict) -> None:
            if current["metadata"]["uid"] != uid:
                raise NotFound("replaced")
            current["status"] = status

        try:
            self.observe(
                "deployments.apps", self.store.mutate("deployments.apps", *key_of(deployment), write)
            )
        except NotFound:
            pass


def _max_unavailable(deployment: dict, replicas: int) -> int:
    value = ((deployment["spec"].get("strategy") or {}).get("rollingUpdate") or {}).get(
        "maxUnavailable", "25%"
    )
    if isinstance(value, str) and value.endswith("%"):
        return math.floor(int(value[:-1]) * replicas / 100)
    return int(value)
