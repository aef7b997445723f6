"""The versioned node health report: named signals per node, per GPU and per InfiniBand port.

Every signal is either known (a JSON value) or unknown (``value`` None plus a ``reason``).
Nothing is ever defaulted to healthy: a signal that is absent from a report reads as unknown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

SCHEMA_VERSION = 1


class Signal(NamedTuple):
    """One reading. ``reason`` is set exactly when the value is unknown.

    A named tuple, not a dataclass: a gate builds millions of them, and a tuple of plain values
    is cheap to make and is left alone by the garbage collector.
    """

    value: Any = None
    reason: str | None = None

    @classmethod
    def unknown(cls, reason: str) -> Signal:
        return cls(None, reason)

    @property
    def known(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value} if self.reason is None else {"value": None, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Signal:
        return cls(data.get("value"), data.get("reason"))


Signals = dict[str, Signal]
new_signal = tuple.__new__  # Signal's constructor without its Python-level wrapper, for decoding


def get_signal(signals: Signals, name: str) -> Signal:
    """The named signal, or unknown when the report does not carry it."""
    return signals.get(name) or Signal.unknown("not in report")


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

        def load(raw: dict[str, Any]) -> Signals:
            return {name: new_signal(Signal, (s.get("value"), s.get("reason"))) for name, s in raw.items()}

        return cls(
            node=data["node"],
            collected_at=float(data["collected_at"]),
            source=data["source"],
            signals=load(data.get("signals", {})),
            gpus={key: load(s) for key, s in data.get("gpus", {}).items()},
            ib_ports={key: load(s) for key, s in data.get("ib_ports", {}).items()},
        )

    @classmethod
    def from_json(cls, text: str) -> HealthReport:
        return cls.from_dict(json.loads(text))


def merge_reports(primary: HealthReport, secondary: HealthReport) -> HealthReport:
    """``primary`` with its unknown or absent signals filled from ``secondary`` (e.g. probe + Prometheus)."""

    def fill(first: Signals, second: Signals) -> Signals:
        merged = dict(second)
        merged.update({name: s for name, s in first.items() if s.known or name not in second})
        return merged

    def fill_each(first: dict[str, Signals], second: dict[str, Signals]) -> dict[str, Signals]:
        return {key: fill(first.get(key, {}), second.get(key, {})) for key in first.keys() | second.keys()}

    return HealthReport(
        node=primary.node,
        collected_at=min(primary.collected_at, secondary.collected_at),
        source=f"{primary.source}+{secondary.source}",
        signals=fill(primary.signals, secondary.signals),
        gpus=fill_each(primary.gpus, secondary.gpus),
        ib_ports=fill_each(primary.ib_ports, secondary.ib_ports),
    )
