"""What a run asks of the cluster's topology: ``TopologyRequest(mode, level, levels)``.

The levels are node labels, from the widest domain to the narrowest, as a Kueue ``Topology`` lists
them (``spec.levels[].nodeLabel``).  The defaults are the labels of Kueue's own documentation and
sample ``Topology`` (``cloud.provider.com/topology-block``, ``cloud.provider.com/topology-rack``,
``kubernetes.io/hostname``); name your provider's labels instead where they differ (GKE:
``cloud.google.com/gce-topology-block``/``-subblock``/``-host``; AWS:
``topology.k8s.aws/network-node-layer-1``..``-3``).  ``kubernetes.io/hostname`` may only be the last.

``mode``: ``none`` (no topology: the run is placed by quota alone, as before), ``preferred`` (all pods
in one domain of ``level`` if one holds them, else the next level up, else spread over as few domains
as can be: Kueue's ``podset-preferred-topology``) or ``required`` (all pods in one domain of
``level``, or wait: ``podset-required-topology``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

BLOCK_LABEL = "cloud.provider.com/topology-block"
RACK_LABEL = "cloud.provider.com/topology-rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_LEVELS = (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)
NONE, PREFERRED, REQUIRED = "none", "preferred", "required"
MODES = (NONE, PREFERRED, REQUIRED)
#: the PodSet annotations on the pod template (Kueue's ``kueue.x-k8s.io/podset-<mode>-topology``)
ANNOTATIONS = {
    PREFERRED: "kueue.x-k8s.io/podset-preferred-topology",
    REQUIRED: "kueue.x-k8s.io/podset-required-topology",
}
#: the scheduling gate Kueue puts on the pods of a topology-assigned Workload until it places each
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
# a qualified label key: an optional DNS subdomain prefix and a name of at most 63 characters
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def check_levels(levels: Sequence[str], field_name: str = "topology_levels") -> tuple[str, ...]:
    """``levels`` as a tuple, or ValueError naming ``field_name`` and the fix."""
    if isinstance(levels, str) or not isinstance(levels, Sequence) or not levels:
        raise ValueError(
            f"{field_name} must be a list of node label keys, widest first, e.g. {list(DEFAULT_LEVELS)}"
        )
    for label in levels:
        prefix, _, name = str(label).rpartition("/")
        if not isinstance(label, str) or len(name) > 63 or len(prefix) > 253 or not _LABEL_KEY.match(label):
            raise ValueError(f"{field_name}: {label!r} is not a node label key such as {BLOCK_LABEL!r}")
    if len(set(levels)) != len(levels):
        raise ValueError(f"{field_name} names a level twice: {list(levels)}")
    if HOSTNAME_LABEL in levels[:-1]:
        raise ValueError(f"{field_name}: {HOSTNAME_LABEL} can only be the last (narrowest) level")
    return tuple(levels)


@dataclass(frozen=True)
class TopologyRequest:
    """A run's placement request; bad values raise ValueError naming the field (see the module docstring)."""

    mode: str = NONE
    level: str = BLOCK_LABEL
    levels: tuple[str, ...] = field(default=DEFAULT_LEVELS)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"topology must be one of {', '.join(MODES)}, got {self.mode!r}")
        object.__setattr__(self, "levels", check_levels(self.levels))
        if self.active and self.level not in self.levels:
            raise ValueError(
                f"topology_level {self.level!r} is not one of the topology's levels {list(self.levels)}; "
                "name one of them, or add it to topology_levels (as the cluster's Kueue Topology lists it)"
            )

    @property
    def active(self) -> bool:
        return self.mode != NONE

    @property
    def required(self) -> bool:
        return self.mode == REQUIRED

    def annotation(self) -> dict[str, str]:
        """The PodSet annotation for the pod template (none when the mode is ``none``)."""
        return {ANNOTATIONS[self.mode]: self.level} if self.active else {}

    def describe(self) -> str:
        return "no topology" if not self.active else f"{self.mode} {self.level}"

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "level": self.level, "levels": list(self.levels)}

    @classmethod
    def from_value(cls, value: TopologyRequest | Mapping | None) -> TopologyRequest:
        """A request from itself, its ``to_dict()``, or None (no topology)."""
        if value is None or isinstance(value, TopologyRequest):
            return value or cls()
        if not isinstance(value, Mapping) or set(value) - {"mode", "level", "levels"}:
            raise ValueError(f"topology must be a mapping with mode, level and levels, got {value!r}")
        return cls(
            str(value.get("mode", NONE)),
            str(value.get("level") or BLOCK_LABEL),
            tuple(value.get("levels") or DEFAULT_LEVELS),
        )
