"""The versioned node health report: named signals per node, per GPU and per InfiniBand port.

Every signal is known (a JSON value), unknown (``value`` None plus a ``reason``: the probe could not
read it), or not applicable (``na``, with a ``reason``: this hardware does not have it, e.g. NVLink
on an L4, as NVML's NOT_SUPPORTED says). Nothing is ever defaulted to healthy: a signal that is
absent from a report reads as unknown.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

SCHEMA_VERSION = 1
MAX_REPORT_CHARS = 1 << 20  # a ConfigMap holds at most 1 MiB


class Signal(msgspec.Struct, frozen=True, gc=False):
    """One reading. ``reason`` is set exactly when there is no value: unknown, or not applicable (``na``).

    A msgspec struct: a gate reads millions of them, decoded straight from the reports' JSON in C
    (:meth:`HealthReport.from_json`), cheap to make, and left alone by the garbage collector.
    """

    value: Any = None
    reason: str | None = None
    na: bool = False

    @classmethod
    def unknown(cls, reason: str) -> Signal:
        return cls(None, reason)

    @classmethod
    def not_applicable(cls, reason: str) -> Signal:
        """This hardware does not have the signal (shown, never a fault)."""
        return cls(None, reason, True)

    @property
    def known(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict[str, Any]:
        if self.reason is None:
            return {"value": self.value}
        return (
            {"value": None, "reason": self.reason, "na": True}
            if self.na
            else {"value": None, "reason": self.reason}
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Signal:
        return cls(data.get("value"), data.get("reason"), data.get("na") is True)


Signals = dict[str, Signal]


NOT_IN_REPORT = Signal.unknown("not in report")


def get_signal(signals: Signals, name: str) -> Signal:
    """The named signal, or unknown when the report does not carry it."""
    return signals.get(name) or NOT_IN_REPORT


@dataclass
class HealthReport:
    """Health of one node. ``gpus`` is keyed by GPU index ("0"), ``ib_ports`` by "<device>/<port>"."""

    node: str
    collected_at: float
    source: str
    signals: Signals = field(default_factory=dict)
    gpus: dict[str, Signals] = field(default_factory=dict)
    ib_ports: dict[str, Signals] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def empty(cls, node: str, collected_at: float, source: str, reason: str) -> HealthReport:
        """A report that knows nothing, e.g. for a node with no telemetry at all."""
        return cls(node, collected_at, source, {"gpu_count": Signal.unknown(reason)})

    def to_dict(self) -> dict[str, Any]:
        def dump(signals: Signals) -> dict[str, Any]:
            return {name: s.to_dict() for name, s in signals.items()}

        return {
            "schema_version": self.schema_version,
            "node": self.node,
            "collected_at": self.collected_at,
            "source": self.source,
            "signals": dump(self.signals),
            "gpus": {key: dump(s) for key, s in self.gpus.items()},
            "ib_ports": {key: dump(s) for key, s in self.ib_ports.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HealthReport:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"health report schema_version {version!r} is not supported; this trainops reads "
                f"{SCHEMA_VERSION}. Upgrade trainops on the reading side or the node probe."
            )

        def load(raw: Any, where: str) -> Signals:
            try:
                return {name: Signal.from_dict(s) for name, s in raw.items()}
            except AttributeError:
                raise ValueError(
                    f"health report {where} must map names to {{value, reason}} objects"
                ) from None

        def load_each(field: str) -> dict[str, Signals]:
            groups = data.get(field, {})
            if type(groups) is not dict:
                raise ValueError(
                    f"health report {field} must be an object keyed by {field[:-1]}, not {type(groups).__name__}"
                )
            return {key: load(s, f"{field}[{key[:40]!r}]") for key, s in groups.items()}

        node, source = data.get("node"), data.get("source")
        if type(node) is not str or type(source) is not str:
            raise ValueError("health report node and source must be strings")
        try:
            collected_at = float(data["collected_at"])
        except (TypeError, ValueError, OverflowError):
            collected_at = math.nan
        if not math.isfinite(collected_at):
            raise ValueError(
                f"health report collected_at must be a finite number, not {data['collected_at']!r:.40}"
            )
        return cls(
            node=node,
            collected_at=collected_at,
            source=source,
            signals=load(data.get("signals", {}), "signals"),
            gpus=load_each("gpus"),
            ib_ports=load_each("ib_ports"),
        )

    @classmethod
    def from_json(cls, text: str) -> HealthReport:
        """Parse a report; anything but a well-formed report (too big, too deep, wrong shape) is a ValueError."""
        if len(text) > MAX_REPORT_CHARS:
            raise ValueError(f"health report is {len(text)} characters, over the {MAX_REPORT_CHARS} limit")
        try:  # a report as the probe writes it, decoded and type-checked in C
            wire = _decode_wire(text)
        except (msgspec.DecodeError, RecursionError):
            pass  # not shaped as the probe writes it: the checks below read it or say what is wrong
        else:
            if wire.schema_version == SCHEMA_VERSION and math.isfinite(wire.collected_at):
                return cls(wire.node, wire.collected_at, wire.source, wire.signals, wire.gpus, wire.ib_ports)
        try:
            data = json.loads(text)
        except RecursionError:
            raise ValueError("health report JSON is nested too deeply") from None
        if type(data) is not dict:
            raise ValueError(f"health report must be a JSON object, not {type(data).__name__}")
        return cls.from_dict(data)


class _Wire(msgspec.Struct):
    """A report as the probe writes it (:meth:`HealthReport.to_json`): :meth:`HealthReport.from_json`'s
    fast path, which reads exactly what :meth:`HealthReport.from_dict` would and refuses the rest."""

    schema_version: int
    node: str
    collected_at: float
    source: str
    signals: dict[str, Signal] = {}
    gpus: dict[str, dict[str, Signal]] = {}
    ib_ports: dict[str, dict[str, Signal]] = {}


_decode_wire = msgspec.json.Decoder(_Wire).decode


def merge_reports(
    primary: HealthReport, secondary: HealthReport, filled: Counter | None = None
) -> HealthReport:
    """``primary`` with its unknown or absent signals filled from ``secondary`` (e.g. probe + Prometheus).
    A signal ``primary`` knows not to apply stays so. ``filled`` counts, per signal, the targets
    (node, GPU, port) ``secondary`` filled with a value."""

    counted: list[str] = []

    def fill(first: Signals, second: Signals) -> Signals:
        merged = dict(first)
        for name, signal in second.items():
            mine = first.get(name)
            if mine is None or (mine.reason is not None and not mine.na):
                merged[name] = signal
                if signal.reason is None:
                    counted.append(name)
        return merged

    def fill_each(first: dict[str, Signals], second: dict[str, Signals]) -> dict[str, Signals]:
        merged = {key: fill(signals, second.get(key, _NONE)) for key, signals in first.items()}
        merged.update((key, fill(_NONE, signals)) for key, signals in second.items() if key not in first)
        return merged

    merged = HealthReport(
        node=primary.node,
        collected_at=min(primary.collected_at, secondary.collected_at),
        source=f"{primary.source}+{secondary.source}",
        signals=fill(primary.signals, secondary.signals),
        gpus=fill_each(primary.gpus, secondary.gpus),
        ib_ports=fill_each(primary.ib_ports, secondary.ib_ports),
    )
    if filled is not None:
        filled.update(counted)
    return merged


_NONE: Signals = {}
