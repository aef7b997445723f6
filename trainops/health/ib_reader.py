"""Read InfiniBand port state and error counters from sysfs (kernel ABI sysfs-class-infiniband).

Layout: ``<root>/<device>/ports/<port>/{state,phys_state,rate,link_layer,counters/*}``.
A file that is missing or unreadable makes that signal unknown. Counters are cumulative and
reported as ``counter_<file name>``; the probe turns them into per-minute rates.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from trainops.errors import TemporaryError
from trainops.health.report import Signal, Signals


class IbUnavailable(TemporaryError):
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
        if not self.root.exists():
            raise IbUnavailable(f"no RDMA devices: {self.root} does not exist (no RDMA driver on this node)")
        try:
            devices = sorted(p for p in self.root.iterdir() if (p / "ports").is_dir())
        except OSError as err:
            raise IbUnavailable(f"cannot list {self.root}: {err.strerror or err}") from err
        if not devices:
            raise IbUnavailable(f"no RDMA devices under {self.root}")
        ports: dict[str, Signals] = {}
        for device in devices:
            for port_dir in sorted((device / "ports").iterdir(), key=lambda p: p.name):
                ports[f"{device.name}/{port_dir.name}"] = self._read_port(port_dir)
        return ports

    def _read_port(self, port_dir: Path) -> Signals:
        files = {name: _read_text(port_dir / name) for name in PORT_FILES}
        counters = port_dir / "counters"
        if counters.is_dir():
            files.update({f"counters/{c.name}": _read_text(c) for c in sorted(counters.iterdir())})
        return port_signals(files)


PORT_FILES = ("state", "phys_state", "rate", "link_layer")


def port_signals(files: dict[str, str | None]) -> Signals:
    """Signals of one port from its sysfs file texts (None: unreadable), e.g. ``{"state": "4: ACTIVE"}``."""
    parsers = {
        "state": parse_state,
        "phys_state": parse_state,
        "rate": parse_rate_gbps,
        "link_layer": str.strip,
    }
    names = {
        "state": "ib_state",
        "phys_state": "ib_phys_state",
        "rate": "ib_rate_gbps",
        "link_layer": "ib_link_layer",
    }
    signals: Signals = {}
    for file, text in files.items():
        counter = file.removeprefix("counters/")
        name = names.get(file) or f"counter_{counter}"
        parse = parsers.get(file) or (lambda t: int(t.strip()))
        if text is None:
            signals[name] = Signal.unknown(f"cannot read {file}")
            continue
        try:
            signals[name] = Signal(parse(text))
        except ValueError as err:
            signals[name] = Signal.unknown(f"cannot parse {file}: {err}")
    return signals


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
