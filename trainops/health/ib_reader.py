"""Read InfiniBand port state and error counters from sysfs (kernel ABI sysfs-class-infiniband).

Layout: ``<root>/<device>/ports/<port>/{state,phys_state,rate,link_layer,counters/*}``.
A file that is missing or unreadable makes that signal unknown. Counters are cumulative and
reported as ``counter_<file name>``; the probe turns them into per-minute rates.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from trainops.health.report import Signal, Signals


class IbUnavailable(Exception):
    """The node has no readable InfiniBand tree at all."""


class IbReader(Protocol):
    def read_ports(self) -> dict[str, Signals]:
        """Signals per port keyed "<device>/<port>"; raises IbUnavailable when there is nothing to read."""
        ...


def parse_state(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``"5: LinkUp"`` -> ``"LinkUp"``."""
    return text.split(":", 1)[-1].strip()


def parse_rate_gbps(text: str) -> float:
    """``"400 Gb/sec (4X NDR)"`` -> ``400.0``."""
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", text)
    if not match:
        raise ValueError(f"unrecognised InfiniBand rate {text!r}")
    return float(match.group(1))


class SysfsIbReader:
    """An :class:`IbReader` over a sysfs root (default ``/sys/class/infiniband``)."""

    def __init__(self, root: str | Path = "/sys/class/infiniband"):
        self.root = Path(root)

    def read_ports(self) -> dict[str, Signals]:
        try:
            devices = sorted(p for p in self.root.iterdir() if (p / "ports").is_dir())
        except OSError as err:
            raise IbUnavailable(f"cannot list {self.root}: {err.strerror or err}") from err
        if not devices:
            raise IbUnavailable(f"no InfiniBand devices under {self.root}")
        ports: dict[str, Signals] = {}
        for device in devices:
            for port_dir in sorted((device / "ports").iterdir(), key=lambda p: p.name):
                ports[f"{device.name}/{port_dir.name}"] = self._read_port(port_dir)
        return ports

    def _read_port(self, port_dir: Path) -> Signals:
        signals = {
            "ib_state": _read_file(port_dir / "state", parse_state),
            "ib_phys_state": _read_file(port_dir / "phys_state", parse_state),
            "ib_rate_gbps": _read_file(port_dir / "rate", parse_rate_gbps),
            "ib_link_layer": _read_file(port_dir / "link_layer", str.strip),
        }
        counters = port_dir / "counters"
        if counters.is_dir():
            for counter in sorted(counters.iterdir()):
                signals[f"counter_{counter.name}"] = _read_file(counter, lambda text: int(text.strip()))
        return signals


def _read_file(path: Path, parse) -> Signal:
    try:
        return Signal(parse(path.read_text()))
    except OSError as err:
        return Signal.unknown(f"cannot read {path}: {err.strerror or err}")
    except ValueError as err:
        return Signal.unknown(f"cannot parse {path}: {err}")
