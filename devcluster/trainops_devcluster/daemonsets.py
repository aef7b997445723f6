"""The apps/v1 DaemonSet controller: one pod per eligible node.

A node is eligible when it matches the pod template's ``nodeSelector`` and required node
affinity and its NoSchedule/NoExecute taints are tolerated (an unschedulable node is not
excluded, as for the real controller).  Each pod is pinned to its node with the
``metadata.name`` node-affinity field the real controller writes, and the scheduler binds it.
Pods on nodes that stopped being eligible, duplicates, and pods of an older template (label
``controller-revision-hash``) are deleted; the missing ones are created.  Status: the
``*NumberScheduled``, ``numberReady``/``Available``/``Unavailable`` counts and
``observedGeneration`` that ``kubectl rollout status`` reads.
"""

from __future__ import annotations

import copy

from trainops_devcluster.deployments import template_hash
from trainops_devcluster.owners import PodOwnerController
from trainops_devcluster.podutil import is_active, is_ready, pod_from_template
from trainops_devcluster.scheduler import matches_node_selector_term, untolerated_taint

HASH_LABEL = "controller-revision-hash"
#: tolerations the DaemonSet controller adds to every pod (pkg/controller/daemon/util)
_DAEMON_TOLERATIONS = [
    {"key": f"node.kubernetes.io/{name}", "operator": "Exists", "effect": effect}
    for name, effect in (
        ("not-ready", "NoExecute"),
        ("unreachable", "NoExecute"),
        ("disk-pressure", "NoSchedule"),
        ("memory-pressure", "NoSchedule"),
        ("pid-pressure", "NoSchedule"),
        ("unschedulable", "NoSchedule"),
    )
]


def eligible(template_spec: dict, node: dict) -> bool:
    """Whether a DaemonSet with this pod spec runs a pod on ``node``."""
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (template_spec.get("nodeSelector") or {}).items()):
        return False
    required = ((template_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None:
        view = _NodeView(node["metadata"]["name"], labels)
        if not any(matches_node_selector_term(t, view) for t in required.get("nodeSelectorTerms") or []):
            return False
    tolerations = (template_spec.get("tolerations") or []) + _DAEMON_TOLERATIONS
    taints = (node.get("spec") or {}).get("taints") or []
    return untolerated_taint(tolerations, taints, ("NoSchedule", "NoExecute")) is None


class _NodeView:
    """What ``matches_node_selector_term`` reads of a node."""

    def __init__(self, name: str, labels: dict) -> None:
        self.name, self.labels = name, labels


class DaemonSetController(PodOwnerController):
    owner = "daemonsets.apps"
    component = "daemonset-controller"
    watches = ("daemonsets.apps", "pods", "nodes")

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if resource == "nodes":
            self.mark_all()
        else:
            super().changed(resource, old, new)

    def sync(self, daemon_set: dict) -> None:
        template = daemon_set["spec"]["template"]
        current_hash = template_hash(template)
        wanted = {
            node["metadata"]["name"]
            for node in self.cache["nodes"].values()
            if eligible(template.get("spec") or {}, node)
        }
        by_node: dict[str, list[dict]] = {}
        for pod in self.pods_of(daemon_set):
            if is_active(pod):
                by_node.setdefault(_node_of(pod), []).append(pod)
        kept: list[dict] = []
        for node, on_node in by_node.items():
            current = [
                p for p in on_node if (p["metadata"].get("labels") or {}).get(HASH_LABEL) == current_hash
            ]
            keep = current[:1] if node in wanted else []
            self.delete_pods(daemon_set, [p for p in on_node if p not in keep])
            kept += keep
        for node in sorted(wanted - {_node_of(p) for p in kept} - set(by_node)):
            created = self._create(daemon_set, node, current_hash)
            if created is None:  # refused (FailedCreate): the next sync tries again
                break
            kept.append(created)
        self.write_status(daemon_set, _status(daemon_set, kept, len(wanted), current_hash))

    def _create(self, daemon_set: dict, node: str, current_hash: str) -> dict | None:
        template = copy.deepcopy(daemon_set["spec"]["template"])
        spec = template.setdefault("spec", {})
        spec["tolerations"] = (spec.get("tolerations") or []) + _DAEMON_TOLERATIONS
        pin = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        spec["affinity"] = {
            **(spec.get("affinity") or {}),
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [pin]}},
        }
        pod = pod_from_template(
            template,
            owner=daemon_set,
            generate_name=f"{daemon_set['metadata']['name']}-",
            labels={HASH_LABEL: current_hash},
        )
        return self.create_pod(daemon_set, pod)


def _status(daemon_set: dict, pods: list[dict], desired: int, current_hash: str) -> dict:
    ready = sum(1 for p in pods if is_ready(p))
    return {
        **(daemon_set.get("status") or {}),
        "observedGeneration": daemon_set["metadata"].get("generation", 1),
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": len(pods),
        "numberMisscheduled": 0,
        "numberReady": ready,
        "numberAvailable": ready,
        "numberUnavailable": max(0, desired - ready),
        "updatedNumberScheduled": sum(
            1 for p in pods if (p["metadata"].get("labels") or {}).get(HASH_LABEL) == current_hash
        ),
    }


def _node_of(pod: dict) -> str:
    """The node a DaemonSet pod is for: bound, or pinned by its node-affinity field."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return field["values"][0]
    return ""
