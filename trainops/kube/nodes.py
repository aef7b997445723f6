"""The one safe way to edit a node: ``edit_node``.  Every part of trainops that changes a node
(the capacity claim and return, the health gate's quarantine) goes through it.

A change is a pure function of a ``NodeState`` (labels, annotations, taints, unschedulable)
returning the wanted ``NodeState``.  ``edit_node`` reads the node, applies the change and, when
something differs, writes one JSON merge patch with ``metadata.resourceVersion`` as a
precondition: changed label/annotation keys only, the taints list whole (the list is atomic on
the API server; the change function keeps foreign taints because it only edits its own keys),
``spec.unschedulable`` when it changed.  A 409 re-reads and re-applies the change; 429/5xx back
off until the deadline.  When nothing changes, nothing is written.

    from trainops.kube.nodes import edit_node, with_taint

    edit_node(core_v1, "gpu-node-003",
              lambda s: with_taint(s, {"key": "trainops.io/quarantine", "value": "xid-79", "effect": "NoSchedule"}),
              Deadline(60))

What trainops's own marks on a node say is read here too, for every part that needs it: the run
holding the node (``holder_of``) and whether it is quarantined (``is_quarantined``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trainops.conventions import (
    CLAIMED_BY_ANNOTATION,
    GPU_RESOURCE,
    HEALTH_LABEL,
    HEALTH_QUARANTINED,
    QUARANTINE_TAINT,
)
from trainops.kube.client import NODES, Kube, json_of
from trainops.kube.guarded import Edited, merge_patch_of
from trainops.kube.retry import Deadline


@dataclass(frozen=True)
class NodeState:
    """The parts of a node trainops may change.  Taints are dicts as in the API (key, value, effect)."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)
    unschedulable: bool = False

    @classmethod
    def of(cls, node: dict) -> NodeState:
        meta, spec = node["metadata"], node.get("spec") or {}
        return cls(
            name=meta["name"],
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            taints=[dict(t) for t in spec.get("taints") or []],
            unschedulable=bool(spec.get("unschedulable", False)),
        )

    def taint(self, key: str) -> dict | None:
        return next((t for t in self.taints if t["key"] == key), None)


NodeChange = Callable[[NodeState], NodeState]


def with_taint(state: NodeState, taint: dict) -> NodeState:
    """``state`` with ``taint`` set: replaces the taint of the same key in place, else appends it."""
    if state.taint(taint["key"]) is None:
        return replace(state, taints=[*state.taints, taint])
    return replace(state, taints=[taint if t["key"] == taint["key"] else t for t in state.taints])


def without_taint(state: NodeState, key: str) -> NodeState:
    return replace(state, taints=[t for t in state.taints if t["key"] != key])


def holder_of(annotations: dict[str, str] | None) -> str | None:
    """The run holding a node, from its annotations (``None`` when free)."""
    return (annotations or {}).get(CLAIMED_BY_ANNOTATION) or None


def is_quarantined(state: NodeState) -> bool:
    return state.taint(QUARANTINE_TAINT) is not None or state.labels.get(HEALTH_LABEL) == HEALTH_QUARANTINED


def node_patch(before: NodeState, after: NodeState) -> dict | None:
    """The merge patch from ``before`` to ``after`` (taints whole), or ``None`` when equal."""
    patch: dict = {}
    metadata = merge_patch_of(
        {"labels": before.labels, "annotations": before.annotations},
        {"labels": after.labels, "annotations": after.annotations},
    )
    if metadata:
        patch["metadata"] = metadata
    if before.taints != after.taints:
        patch.setdefault("spec", {})["taints"] = after.taints
    if before.unschedulable != after.unschedulable:
        patch.setdefault("spec", {})["unschedulable"] = after.unschedulable
    return patch or None


def read_node(kube: Any, name: str) -> dict:
    """The node as a plain dict (as the API serves it); ``kube``: a ``Kube`` or a typed client."""
    return json_of(Kube.of(kube).core.read_node(name, _preload_content=False))


def gpus(node: dict, part: str = "allocatable") -> int | None:
    """The node's ``nvidia.com/gpu`` in ``status.<part>`` (``capacity`` or ``allocatable``); None when it
    says none, or not as a plain count."""
    value = ((node.get("status") or {}).get(part) or {}).get(GPU_RESOURCE)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def allocatable_gpus(node: dict) -> int:
    """The node's allocatable ``nvidia.com/gpu`` (0 when it has none)."""
    return gpus(node) or 0


def unhealthy_gpus(node: dict) -> int:
    """GPUs the node's device plugin reports unhealthy: ``capacity`` counts every device, ``allocatable``
    only the healthy ones (kubelet reserves nothing of an extended resource).  None allocatable is no
    such word: the device plugin is gone (restarted, or paused for a driver upgrade), not every GPU."""
    capacity, allocatable = gpus(node, "capacity"), gpus(node)
    if capacity is None or not allocatable:
        return 0
    return max(0, capacity - allocatable)


def list_nodes(kube: Any, label_selector: str = "") -> list[dict]:
    """Every node matching ``label_selector`` (paged); ``kube``: a ``Kube`` or a typed client."""
    return Kube.of(kube).list(NODES, labels=label_selector)


def edit_node(
    kube: Any, name: str, change: NodeChange, deadline: Deadline | None = None, *, current: dict | None = None
) -> Edited:
    """Apply ``change`` to node ``name`` safely (see the module docstring).

    ``kube``: a ``Kube`` (or a typed client on the same connection).  ``current``: the node as just
    read (for example from a list), to save the first GET.  Exceptions raised by ``change`` propagate
    (that is how a change refuses, e.g. a node claimed by someone else).  Returns the node as a dict
    and whether it was written.
    """

    def node_change(node: dict) -> dict | None:
        before = NodeState.of(node)
        return node_patch(before, change(before))

    return Kube.of(kube).edit(NODES, name, node_change, current=current, deadline=deadline)
