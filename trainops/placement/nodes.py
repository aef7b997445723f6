"""Placement over Kubernetes nodes: the one call the gate and the claim make (``place_nodes``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from trainops.placement.place import Placement, Slot, place
from trainops.placement.request import TopologyRequest


def place_nodes(
    nodes: Iterable[Mapping],
    count: int,
    request: TopologyRequest,
    *,
    spares: int = 0,
    taken: Collection[str] = (),
    cost: Mapping[str, float] | None = None,
) -> Placement:
    """Place ``count`` run nodes and ``spares`` among ``nodes`` (API dicts): one pod per node; ``taken``
    nodes (held by another run) are not free; ``cost``: node -> what taking it disturbs."""
    slots = [
        Slot(
            name := node["metadata"]["name"],
            node["metadata"].get("labels") or {},
            0 if name in taken else 1,
            (cost or {}).get(name, 0.0),
        )
        for node in nodes
    ]
    return place(slots, count, request, spares)
