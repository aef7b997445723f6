"""Which RDMA ports a node's training fabric uses, and what they should look like.

A node's pool names its fabric with the label ``trainops.io/fabric`` (``Fabrics.label``); a node
without it is on ``default``. Each :class:`Fabric` says whether the pool needs RDMA at all
(``required``: an inference or single-node pool does not), which ports belong to it (``link_layer``
and ``hcas``, the latter as ``NCCL_IB_HCA`` writes it) and what they should run at (``rate_gbps``,
``ports``). Ports that are not the fabric's (a storage NIC in Ethernet mode beside an InfiniBand
fabric) are shown as not applicable, never judged.

Defaults, right for a mixed cluster without configuration: ``default`` takes the node's InfiniBand
ports when it has any, else its Ethernet (RoCE) ports, expects them all at the rate of the node's
fastest such port, and needs at least one; ``none`` needs no RDMA. Set ``rate_gbps`` per fabric
(400 for NDR or 400GbE RoCE, 200 for HDR...) to also catch a node whose ports all trained slow.

    Fabrics.from_mapping({"default": {"rate_gbps": 400}, "roce": {"link_layer": "Ethernet",
                          "hcas": "mlx5_0,mlx5_1,mlx5_2,mlx5_3", "rate_gbps": 200}})
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from trainops.conventions import FABRIC_LABEL

LINK_LAYERS = ("auto", "InfiniBand", "Ethernet")
HCA_ENTRY = re.compile(r"[A-Za-z0-9_.-]+(:[0-9]{1,3})?")


@dataclass(frozen=True)
class Fabric:
    """One fabric's rules (see the module docstring)."""

    name: str
    required: bool = True
    link_layer: str = "auto"
    hcas: str = ""
    rate_gbps: float | None = None
    ports: int | None = None

    def __post_init__(self) -> None:
        where = f"fabric {self.name!r}"
        if self.link_layer not in LINK_LAYERS:
            raise ValueError(
                f"{where}: link_layer must be one of {', '.join(LINK_LAYERS)}, got {self.link_layer!r}"
            )
        if not isinstance(self.required, bool):
            raise ValueError(f"{where}: required must be true or false, got {self.required!r}")
        if self.rate_gbps is not None and (
            isinstance(self.rate_gbps, bool)
            or not isinstance(self.rate_gbps, int | float)
            or self.rate_gbps <= 0
        ):
            raise ValueError(
                f"{where}: rate_gbps must be a positive number of Gb/s (e.g. 400), got {self.rate_gbps!r}"
            )
        if self.ports is not None and (
            isinstance(self.ports, bool) or not isinstance(self.ports, int) or self.ports < 1
        ):
            raise ValueError(f"{where}: ports must be an integer >= 1, got {self.ports!r}")
        if not isinstance(self.hcas, str) or (self.hcas and not _hca_entries(self.hcas)):
            raise ValueError(
                f"{where}: hcas must be an NCCL_IB_HCA list such as 'mlx5_0,mlx5_1', '=mlx5_0:1' or '^mlx5_8', "
                f"got {self.hcas!r}"
            )

    def selects(self, device: str, port: int) -> bool:
        """Whether ``hcas`` takes port ``device/port`` (NCCL_IB_HCA: names are prefixes unless the list
        starts with ``=``; ``^`` excludes instead; ``:N`` names one port)."""
        if not self.hcas:
            return True
        text = self.hcas
        exclude = text.startswith("^")
        text = text.lstrip("^")
        exact = text.startswith("=")
        matched = False
        for name, wanted_port in _hca_entries(text.lstrip("=")) or []:
            same = device == name if exact else device.startswith(name)
            if same and (wanted_port is None or wanted_port == port):
                matched = True
                break
        return matched != exclude

    def describe(self) -> str:
        if not self.required:
            return f"fabric {self.name!r} (needs no RDMA)"
        layer = "InfiniBand, else Ethernet" if self.link_layer == "auto" else self.link_layer
        parts = [layer] + ([f"HCAs {self.hcas}"] if self.hcas else [])
        return f"fabric {self.name!r} ({', '.join(parts)})"


def _hca_entries(text: str) -> list[tuple[str, int | None]] | None:
    entries = []
    for entry in text.lstrip("^").lstrip("=").split(","):
        if not HCA_ENTRY.fullmatch(entry):
            return None
        name, _, port = entry.partition(":")
        entries.append((name, int(port) if port else None))
    return entries


BUILT_IN = {"default": Fabric("default"), "none": Fabric("none", required=False)}


@dataclass(frozen=True)
class Fabrics:
    """The cluster's fabrics by name, and the node label that picks one (see the module docstring)."""

    by_name: Mapping[str, Fabric] = field(default_factory=lambda: dict(BUILT_IN))
    label: str = FABRIC_LABEL

    @classmethod
    def from_mapping(cls, specs: Mapping[str, Any] | None, label: str = FABRIC_LABEL) -> Fabrics:
        """Fabrics from ``{name: {required, link_layer, hcas, rate_gbps, ports}}`` over the built-in
        ``default`` and ``none``; a bad name or field raises ValueError naming it."""
        if not isinstance(label, str) or not label:
            raise ValueError(f"fabric_label must be a node label key, got {label!r}")
        if specs is None:
            return cls(dict(BUILT_IN), label)
        if not isinstance(specs, Mapping):
            raise ValueError(f"fabrics: expected a mapping of fabric name -> settings, got {specs!r}")
        known = [f.name for f in fields(Fabric) if f.name != "name"]
        by_name = dict(BUILT_IN)
        for name, settings in specs.items():
            if not isinstance(name, str) or not re.fullmatch(
                r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", name
            ):
                raise ValueError(f"fabrics: {name!r} is not a label value (the node label names the fabric)")
            if not isinstance(settings, Mapping):
                raise ValueError(
                    f"fabrics[{name!r}]: expected a mapping of {', '.join(known)}, got {settings!r}"
                )
            unknown = sorted(set(settings) - set(known))
            if unknown:
                raise ValueError(
                    f"fabrics[{name!r}]: unknown setting(s) {', '.join(unknown)}; use {', '.join(known)}"
                )
            by_name[name] = Fabric(name, **settings)
        return cls(by_name, label)

    def of(self, labels: Mapping[str, str] | None) -> tuple[Fabric | None, str]:
        """The node's fabric (None when its label names one the cluster does not define) and why."""
        name = (labels or {}).get(self.label)
        if name is None:
            return self.by_name["default"], f"no {self.label} label: fabric 'default'"
        fabric = self.by_name.get(name)
        if fabric is None:
            return None, (
                f"the node's label {self.label}={name} names no fabric the gate knows ({', '.join(sorted(self.by_name))}): "
                "add it to the gate's fabrics or fix the label"
            )
        return fabric, f"{self.label}={name}"
