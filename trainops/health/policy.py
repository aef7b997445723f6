"""The health policy: one declarative table of rows, evaluated against a :class:`HealthReport`.

A row reads one signal in one scope (the node, every GPU, or every InfiniBand port), compares it
with ``threshold`` using ``test``, and when it trips gives ``verdict`` with ``reason``.
When the signal is unknown the row gives ``if_unknown`` instead: ``exclude`` for the signals a
gate cannot do without, ``warn`` for optional ones. A row whose verdict is ``ok`` is switched off.

Verdicts, mildest first: ``ok``, ``warn`` (keep the node, say why), ``exclude`` (leave it out of
this run), ``quarantine`` (taint it until ``trainops health release`` re-checks it).
Defaults follow reference/health.md §8 (sources there). What a node should have comes from the
node itself, added by the gate: ``gpu_count_expected`` (its ``nvidia.com/gpu`` capacity, allocatable
and GPU Feature Discovery count label) and ``ib_port_count_expected`` (its ``trainops.io/ib-port-count``
label); ``gpus_missing`` and ``ib_ports_missing`` are those minus what the probe sees. Without them
(no label, or the probe judging itself) those rows do not apply.
Override rows by name::

    DEFAULT_POLICY.with_overrides({"gpus_missing": {"threshold": 1}, "xid_warn": {"verdict": "exclude"}})
    load_policy("policy.yaml")   # the same mapping in JSON or YAML
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trainops.health.report import HealthReport, Signal, Signals, get_signal

VERDICTS = ("ok", "warn", "exclude", "quarantine")
SCOPES = ("node", "gpu", "ib_port")
OVERRIDABLE = ("threshold", "verdict", "if_unknown")

TESTS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    "not_in": lambda value, allowed: value not in allowed,
    "any_in": lambda values, listed: any(v in listed for v in values),
    "any_bit": lambda value, mask: bool(int(value) & int(mask)),
}

# NVIDIA XID catalog buckets (reference §4). 43, 45 and 154 are deliberately absent: they are
# ignorable or only annotate a companion XID (154: read the recovery action instead).
FATAL_XIDS = [46, 48, 62, 64, 74, 79, 95, 119, 120, 136, 140, 143, *range(144, 151), 155, 156, 158]
WARN_XIDS = [13, 31, 61, 63, 92, 94, 109]
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80  # HwSlowdown, SwThermal, HwThermal, HwPowerBrake


@dataclass(frozen=True)
class Row:
    name: str
    scope: str
    signal: str
    test: str
    threshold: Any
    verdict: str
    reason: str
    if_unknown: str = "warn"

    def trips(self, value: Any) -> bool:
        return TESTS[self.test](value, self.threshold)


MUST = {"if_unknown": "exclude"}  # rows a gate cannot do without; others warn when their signal is unknown

# fmt: off
DEFAULT_ROWS = (
    #   name                   scope      signal                         test      threshold      verdict       reason
    Row("report_age",          "node",    "report_age_s",                ">",      300,           "exclude",    "health report is stale", **MUST),
    Row("gpu_count",           "node",    "gpu_count",                   "<",      1,             "quarantine", "NVML sees no GPU (reboot)", **MUST),
    Row("gpus_missing",        "node",    "gpus_missing",                ">",      0,             "quarantine", "fewer GPUs than the node has (reboot)", if_unknown="ok"),
    Row("gpu_lost",            "gpu",     "gpu_lost",                    "==",     True,          "quarantine", "GPU is lost to NVML (fallen off the bus)"),
    Row("xid_fatal",           "gpu",     "xid_events",                  "any_in", FATAL_XIDS,    "quarantine", "fatal XID (reset/reboot)", **MUST),
    Row("xid_warn",            "gpu",     "xid_events",                  "any_in", WARN_XIDS,     "warn",       "non-fatal XID seen"),
    Row("recovery_action",     "gpu",     "recovery_action",             "not_in", ["NONE"],      "quarantine", "driver asks for recovery"),
    Row("ecc_uncorrectable",   "gpu",     "ecc_uncorrected_volatile",    ">",      0,             "quarantine", "uncorrectable ECC", **MUST),
    Row("ecc_correctable",     "gpu",     "ecc_corrected_volatile",      ">",      20_000_000,    "warn",       "high correctable ECC"),
    Row("row_remap_failure",   "gpu",     "row_remap_failure",           "==",     True,          "quarantine", "row remap failed (RMA)", **MUST),
    Row("row_remap_pending",   "gpu",     "row_remap_pending",           "==",     True,          "quarantine", "row remap pending (reset)", **MUST),
    Row("remapped_rows",       "gpu",     "remapped_rows_uncorrectable", ">=",     512,           "quarantine", "remap table full (RMA)"),
    # Retired pages are pre-Ampere; Ampere+ answer NOT_SUPPORTED and rely on row remapping.
    Row("retired_pages",       "gpu",     "retired_pages",               ">=",     63,            "quarantine", "too many retired pages", if_unknown="ok"),
    Row("retired_pending",     "gpu",     "retired_pages_pending",       "==",     True,          "quarantine", "retirement pending", if_unknown="ok"),
    Row("throttling",          "gpu",     "clock_event_reasons",         "any_bit", THROTTLE_BITS, "warn",      "hardware clock slowdown"),
    Row("thermal_warn",        "gpu",     "temperature_c",               ">=",     85,            "warn",       "GPU running hot"),
    Row("thermal_critical",    "gpu",     "temperature_c",               ">=",     95,            "exclude",    "GPU too hot", **MUST),
    Row("pcie_link",           "gpu",     "pcie_link_width_degraded",    "==",     True,          "exclude",    "PCIe link narrower than max"),
    Row("pcie_replay",         "gpu",     "pcie_replay_per_min",         ">",      31,            "warn",       "PCIe replays above BER bound (Gen5 x16)"),
    Row("nvlink_down",         "gpu",     "nvlink_inactive_links",       ">",      0,             "quarantine", "NVLink link inactive", **MUST),
    Row("nvlink_replay",       "gpu",     "nvlink_replay_per_min",       ">=",     1,             "quarantine", "NVLink replay errors"),
    Row("nvlink_recovery",     "gpu",     "nvlink_recovery_per_min",     ">=",     1,             "quarantine", "NVLink recovery errors"),
    Row("nvlink_crc_flit",     "gpu",     "nvlink_crc_flit_per_min",     ">=",     6000,          "quarantine", "NVLink CRC >= 100/s"),
    Row("nvlink_crc_data",     "gpu",     "nvlink_crc_data_per_min",     ">=",     6000,          "quarantine", "NVLink CRC >= 100/s"),
    Row("persistence_mode",    "gpu",     "persistence_mode",            "==",     False,         "warn",       "persistence mode off"),
    Row("gpu_in_use",          "gpu",     "running_processes",           ">",      0,             "warn",       "processes on the GPU (drained later)"),
    Row("tensor_busy",         "gpu",     "tensor_active",               ">",      0.05,          "warn",       "tensor cores busy", if_unknown="ok"),
    Row("ib_port_count",       "node",    "ib_port_count",               "<",      1,             "exclude",    "no InfiniBand port", **MUST),
    Row("ib_ports_missing",    "node",    "ib_ports_missing",            ">",      0,             "exclude",    "fewer InfiniBand ports than the node has", if_unknown="ok"),
    Row("ib_state",            "ib_port", "ib_state",                    "!=",     "ACTIVE",      "quarantine", "InfiniBand port not ACTIVE", **MUST),
    Row("ib_phys_state",       "ib_port", "ib_phys_state",               "!=",     "LinkUp",      "quarantine", "InfiniBand link not up", **MUST),
    Row("ib_rate",             "ib_port", "ib_rate_gbps",                "<",      400,           "exclude",    "InfiniBand rate degraded", **MUST),
    Row("ib_symbol_errors",    "ib_port", "symbol_error_per_min",        ">=",     10,            "exclude",    "InfiniBand symbol errors"),
    Row("ib_link_recovery",    "ib_port", "link_error_recovery_per_min", ">=",     10,            "exclude",    "IB link recoveries"),
    Row("ib_link_downed",      "ib_port", "link_downed_per_min",         ">=",     1,             "exclude",    "InfiniBand link flapped"),
    Row("ib_rcv_errors",       "ib_port", "port_rcv_errors_per_min",     ">=",     10,            "exclude",    "InfiniBand receive errors"),
    Row("ib_xmit_discards",    "ib_port", "port_xmit_discards_per_min",  ">=",     100,           "warn",       "InfiniBand xmit discards"),
)
# fmt: on


@dataclass(frozen=True)
class Policy:
    rows: tuple[Row, ...]

    @property
    def names(self) -> list[str]:
        return [row.name for row in self.rows]

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> Policy:
        """A copy with rows changed by name; bad names, fields or values raise ValueError."""
        by_name = {row.name: row for row in self.rows}
        for name, changes in overrides.items():
            if name not in by_name:
                raise ValueError(f"unknown health policy row {name!r}; valid rows: {', '.join(self.names)}")
            if not isinstance(changes, Mapping):
                raise ValueError(f"policy row {name!r}: expected a mapping of {OVERRIDABLE}, got {changes!r}")
            by_name[name] = _override(by_name[name], changes)
        return Policy(tuple(by_name[row.name] for row in self.rows))


DEFAULT_POLICY = Policy(DEFAULT_ROWS)


def _override(row: Row, changes: Mapping[str, Any]) -> Row:
    for key, value in changes.items():
        where = f"policy row {row.name!r} field {key!r}"
        if key not in OVERRIDABLE:
            raise ValueError(f"{where}: cannot be overridden; use one of {', '.join(OVERRIDABLE)}")
        if key in ("verdict", "if_unknown") and value not in VERDICTS:
            raise ValueError(f"{where}: {value!r} is not a verdict; use one of {', '.join(VERDICTS)}")
        if key == "threshold" and not _same_kind(row.threshold, value):
            raise ValueError(f"{where}: {value!r} is not like the default {row.threshold!r}")
    return replace(row, **changes)


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return type(default) is type(value)
    if isinstance(default, int | float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def load_policy(source: Mapping[str, Mapping[str, Any]] | str | Path | None = None) -> Policy:
    """The default policy with overrides from a mapping (DAG params) or a JSON/YAML file."""
    if source is None:
        return DEFAULT_POLICY
    if isinstance(source, Mapping):
        return DEFAULT_POLICY.with_overrides(source)
    path = Path(source)
    text = path.read_text()
    import yaml

    kind = "YAML" if path.suffix in (".yaml", ".yml") else "JSON"
    try:
        data = (yaml.safe_load(text) or {}) if kind == "YAML" else json.loads(text)
    except (ValueError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: not valid {kind}: {error}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping of row name -> overrides, got {type(data).__name__}")
    return DEFAULT_POLICY.with_overrides(data)


@dataclass
class NodeVerdict:
    """The outcome for one node: the worst verdict of all findings, the reasons behind it, all evidence."""

    name: str
    verdict: str
    reasons: list[str] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)

    @property
    def only_unknown(self) -> bool:
        """True when the verdict (not ok) comes only from unknown signals, no tripped threshold."""
        behind = [e for e in self.evidence if e["verdict"] == self.verdict != "ok"]
        return bool(behind) and all(e["kind"] == "unknown" for e in behind)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _targets(report: HealthReport, node_signals: Signals, scope: str) -> Iterator[tuple[str, Signals]]:
    if scope == "node":
        yield "node", node_signals
    elif scope == "gpu":
        yield from ((f"gpu {key}", signals) for key, signals in sorted(report.gpus.items()))
    else:
        yield from ((f"ib {key}", signals) for key, signals in sorted(report.ib_ports.items()))


def evaluate(report: HealthReport, policy: Policy = DEFAULT_POLICY, now: float | None = None) -> NodeVerdict:
    """Apply every row of ``policy`` to ``report``; ``now`` (default: the clock) ages the report."""
    now = time.time() if now is None else now
    node_signals = {
        **report.signals,
        "report_age_s": Signal(round(now - report.collected_at, 3)),
        "gpus_missing": _missing(report.signals, "gpu_count"),
        "ib_ports_missing": _missing(report.signals, "ib_port_count"),
    }
    evidence: list[dict[str, Any]] = []
    for row in policy.rows:
        if row.verdict == "ok":
            continue
        for target, signals in _targets(report, node_signals, row.scope):
            signal = get_signal(signals, row.signal)
            base = {"row": row.name, "target": target, "signal": row.signal}
            if not signal.known:
                reason = f"{row.signal} unknown: {signal.reason}"
                evidence.append({**base, "kind": "unknown", "verdict": row.if_unknown, "reason": reason})
            elif row.trips(signal.value):
                reason = f"{row.reason}: {row.signal}={signal.value!r} ({row.test} {row.threshold!r})"
                found = {"kind": "tripped", "verdict": row.verdict, "value": signal.value, "reason": reason}
                evidence.append({**base, **found})
    verdict = max((e["verdict"] for e in evidence), key=VERDICTS.index, default="ok")
    return NodeVerdict(report.node, verdict, _reasons(evidence, verdict), evidence)


def _missing(signals: Signals, count: str) -> Signal:
    """How many fewer ``count`` the probe sees than the node says it has (``<count>_expected``)."""
    seen, expected = get_signal(signals, count), get_signal(signals, f"{count}_expected")
    if not seen.known:
        return seen
    if not expected.known:
        return Signal.unknown(f"the node's own {count} is unknown ({expected.reason})")
    return Signal(max(0, expected.value - seen.value))


def _reasons(evidence: list[dict[str, Any]], verdict: str) -> list[str]:
    """One line per (row, reason) behind the final verdict, listing every target it applies to."""
    targets: dict[tuple[str, str], list[str]] = {}
    for e in evidence:
        if e["verdict"] == verdict != "ok":
            targets.setdefault((e["row"], e["reason"]), []).append(e["target"])
    return [f"{row} [{', '.join(where)}] {reason}" for (row, reason), where in targets.items()]
