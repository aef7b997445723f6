"""The health policy: one declarative table of rows, evaluated against a :class:`HealthReport`.

A row reads one signal in one scope (the node, every GPU, or every RDMA port), compares it with
``threshold`` using ``test``, and when it trips gives ``verdict`` with ``reason``. A signal the
probe could not read on hardware that has it is unknown: the row gives ``if_unknown`` instead
(``exclude`` for the signals a gate cannot do without, ``warn`` for optional ones), and the reason
names the fix. A signal this hardware does not have (``expect``: NVLink on an L4, ECC counters with
ECC off, row remapping on a V100 or under MIG, a port beside the fabric) is not applicable: shown
in the evidence and ``NodeVerdict.not_applicable``, never a reason to exclude. A row whose verdict
is ``ok`` is switched off.

Verdicts, mildest first: ``ok``, ``warn`` (keep the node, say why), ``exclude`` (leave it out of
this run), ``quarantine`` (taint it until ``trainops health release`` re-checks it).
Defaults follow reference/health.md §8 (sources there); XIDs follow NVIDIA's catalog (``xids``).
What a node should have comes from the node itself when the gate passes it (``evaluate(...,
node=...)``): its GPU count under its MIG strategy, its fabric (``policy.fabrics``, picked by the
``trainops.io/fabric`` label), its ``trainops.io/ib-port-count`` label. Without a node (the probe
judging itself) the rows that compare with it do not apply.
Override rows by name::

    DEFAULT_POLICY.with_overrides({"gpus_missing": {"threshold": 1}, "xid_warn": {"verdict": "exclude"}})
    load_policy("policy.yaml")   # the same mapping in JSON or YAML
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainops.health import xids
from trainops.health.expect import THROTTLE_BITS, derive
from trainops.health.fabric import Fabrics
from trainops.health.report import NOT_IN_REPORT, HealthReport, Signal

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
    "any_not_in": lambda values, listed: any(v not in listed for v in values),
    "any_bit": lambda value, mask: bool(int(value) & int(mask)),
}


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


MUST = {"if_unknown": "exclude"}  # rows a gate cannot do without; others warn when their signal is unknown

# fmt: off
DEFAULT_ROWS = (
    #   name                   scope      signal                         test      threshold      verdict       reason
    Row("report_age",          "node",    "report_age_s",                ">",      300,           "exclude",    "health report is stale", **MUST),
    Row("gpu_count",           "node",    "gpu_count",                   "<",      1,             "quarantine", "NVML sees no GPU (reboot)", **MUST),
    Row("slowed_in_training",  "node",    "slowdown_pct",                ">",      0,             "exclude",    "slowed down in a training run (% slower than the run's median step)"),
    Row("gpus_missing",        "node",    "gpus_missing",                ">",      0,             "quarantine", "fewer GPUs (or MIG devices) than the node advertises (reboot)"),
    Row("gpu_lost",            "gpu",     "gpu_lost",                    "==",     True,          "quarantine", "GPU is lost to NVML (fallen off the bus)"),
    Row("xid_fatal",           "gpu",     "xid_events",                  "any_in", xids.FATAL,    "quarantine", "fatal XID (NVIDIA catalog: reset/reboot)", **MUST),
    Row("xid_undecoded",       "gpu",     "xid_events",                  "any_in", xids.UNDECODED, "exclude",   "NVLink5 XID, fatal or not by its sub-code (kernel log)"),
    Row("xid_warn",            "gpu",     "xid_events",                  "any_not_in", xids.NOT_WARNED, "warn", "non-fatal XID seen (application-side, or not in the catalog table)"),
    Row("recovery_action",     "gpu",     "recovery_action",             "not_in", ["NONE"],      "quarantine", "driver asks for recovery"),
    Row("ecc_uncorrectable",   "gpu",     "ecc_uncorrected_volatile",    ">",      0,             "quarantine", "uncorrectable ECC", **MUST),
    Row("ecc_correctable",     "gpu",     "ecc_corrected_volatile",      ">",      20_000_000,    "warn",       "high correctable ECC"),
    Row("row_remap_failure",   "gpu",     "row_remap_failure",           "==",     True,          "quarantine", "row remap failed (RMA)", **MUST),
    Row("row_remap_pending",   "gpu",     "row_remap_pending",           "==",     True,          "quarantine", "row remap pending (reset)", **MUST),
    Row("remapped_rows",       "gpu",     "remapped_rows_uncorrectable", ">=",     512,           "quarantine", "remap table full (RMA)"),
    # Page retirement is Volta/Turing's; Ampere and later remap rows instead (not applicable there).
    Row("retired_pages",       "gpu",     "retired_pages",               ">=",     63,            "quarantine", "too many retired pages", **MUST),
    Row("retired_pending",     "gpu",     "retired_pages_pending",       "==",     True,          "quarantine", "page retirement pending (reload the driver)", **MUST),
    Row("throttling",          "gpu",     "clock_event_reasons",         "any_bit", THROTTLE_BITS, "warn",      "hardware clock slowdown"),
    Row("clock_slowdown",      "gpu",     "slowdown_clock_pct",          "<",      90,            "exclude",    "hardware held the SM clock down under load (% of max)"),
    Row("thermal_warn",        "gpu",     "temperature_c",               ">=",     85,            "warn",       "GPU running hot"),
    Row("thermal_critical",    "gpu",     "temperature_c",               ">=",     95,            "exclude",    "GPU too hot", **MUST),
    Row("pcie_link",           "gpu",     "pcie_link_width_degraded",    "==",     True,          "exclude",    "PCIe link narrower than max"),
    Row("pcie_replay",         "gpu",     "pcie_replay_per_min",         ">",      31,            "warn",       "PCIe replays above BER bound (Gen5 x16)"),
    Row("nvlink_down",         "gpu",     "nvlink_links_down",           ">",      0,             "quarantine", "NVLink links the GPU has are inactive", **MUST),
    Row("nvlink_replay",       "gpu",     "nvlink_replay_per_min",       ">=",     1,             "quarantine", "NVLink replay errors"),
    Row("nvlink_recovery",     "gpu",     "nvlink_recovery_per_min",     ">=",     1,             "quarantine", "NVLink recovery errors"),
    Row("nvlink_crc_flit",     "gpu",     "nvlink_crc_flit_per_min",     ">=",     6000,          "quarantine", "NVLink CRC >= 100/s"),
    Row("nvlink_crc_data",     "gpu",     "nvlink_crc_data_per_min",     ">=",     6000,          "quarantine", "NVLink CRC >= 100/s"),
    Row("persistence_mode",    "gpu",     "persistence_mode",            "==",     False,         "warn",       "persistence mode off"),
    Row("gpu_in_use",          "gpu",     "running_processes",           ">",      0,             "warn",       "processes on the GPU (drained later)"),
    Row("tensor_busy",         "gpu",     "tensor_active",               ">",      0.05,          "warn",       "tensor cores busy", if_unknown="ok"),
    Row("ib_port_count",       "node",    "fabric_ports",                "<",      1,             "exclude",    "no RDMA port of the node's fabric", **MUST),
    Row("ib_ports_missing",    "node",    "ib_ports_missing",            ">",      0,             "exclude",    "fewer fabric ports than the node has", if_unknown="ok"),
    Row("ib_state",            "ib_port", "ib_state",                    "!=",     "ACTIVE",      "quarantine", "fabric port not ACTIVE", **MUST),
    Row("ib_phys_state",       "ib_port", "ib_phys_state",               "!=",     "LinkUp",      "quarantine", "fabric link not up", **MUST),
    Row("ib_rate",             "ib_port", "ib_rate_shortfall_gbps",      ">",      0,             "exclude",    "fabric port below the fabric's rate (Gb/s short)", **MUST),
    Row("ib_symbol_errors",    "ib_port", "symbol_error_per_min",        ">=",     10,            "exclude",    "fabric symbol errors"),
    Row("ib_link_recovery",    "ib_port", "link_error_recovery_per_min", ">=",     10,            "exclude",    "fabric link recoveries"),
    Row("ib_link_downed",      "ib_port", "link_downed_per_min",         ">=",     1,             "exclude",    "fabric link flapped"),
    Row("ib_rcv_errors",       "ib_port", "port_rcv_errors_per_min",     ">=",     10,            "exclude",    "fabric receive errors"),
    Row("ib_xmit_discards",    "ib_port", "port_xmit_discards_per_min",  ">=",     100,           "warn",       "fabric xmit discards"),
)
# fmt: on


FAULT_WINDOW_S = 7200.0  # 2 h: the XID lookback of Azure's health checks (reference/health.md §4)


@dataclass(frozen=True)
class Policy:
    """The rows, the cluster's fabrics, and ``fault_window_s``: how long a fault seen in a burst (XIDs,
    a slowdown in training) keeps a node out after it was last seen."""

    rows: tuple[Row, ...]
    fabrics: Fabrics = field(default_factory=Fabrics)
    fault_window_s: float = FAULT_WINDOW_S

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
        return replace(self, rows=tuple(by_name[row.name] for row in self.rows))

    def with_settings(
        self,
        fabrics: Mapping[str, Any] | None = None,
        fabric_label: str | None = None,
        fault_window_s: float | None = None,
    ) -> Policy:
        """A copy with the cluster's fabrics (see ``fabric.Fabrics.from_mapping``) and fault window;
        bad settings raise ValueError naming them."""
        window = self.fault_window_s if fault_window_s is None else fault_window_s
        if isinstance(window, bool) or not isinstance(window, int | float) or not 0 < window <= 30 * 86400:
            raise ValueError(f"fault_window_s must be seconds in (0, 30 days], got {window!r}")
        label = fabric_label or self.fabrics.label
        chosen = Fabrics.from_mapping(fabrics, label) if fabrics is not None or fabric_label else self.fabrics
        return replace(self, fabrics=chosen, fault_window_s=float(window))


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
    def not_applicable(self) -> list[str]:
        """What this hardware does not have, one line per reason: the rows and targets it spares."""
        return _grouped([e for e in self.evidence if e["kind"] == "n/a"], by="reason")

    @property
    def only_unknown(self) -> bool:
        """True when the verdict (not ok) comes only from unknown signals, no tripped threshold."""
        behind = [e for e in self.evidence if e["verdict"] == self.verdict != "ok"]
        return bool(behind) and all(e["kind"] == "unknown" for e in behind)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(
    report: HealthReport, policy: Policy = DEFAULT_POLICY, now: float | None = None, node: dict | None = None
) -> NodeVerdict:
    """Apply every row of ``policy`` to ``report``; ``now`` (default: the clock) ages the report;
    ``node``: the Node object as read (the gate's), what the node says it has."""
    now = time.time() if now is None else now
    derived = derive(report, node, policy.fabrics, now, policy.fault_window_s)
    node_signals = {
        **report.signals,
        "report_age_s": Signal(round(now - report.collected_at, 3)),
        **derived.node,
    }
    scopes = {
        "node": [("node", node_signals)],
        "gpu": [(f"gpu {key}", {**s, **derived.gpus.get(key, {})}) for key, s in sorted(report.gpus.items())],
        "ib_port": [
            (f"ib {key}", {**s, **derived.ports.get(key, {})}) for key, s in sorted(report.ib_ports.items())
        ],
    }
    evidence: list[dict[str, Any]] = []
    for row in policy.rows:
        if row.verdict == "ok":
            continue
        name, test, threshold = row.signal, TESTS[row.test], row.threshold
        for target, signals in scopes[row.scope]:
            signal = signals.get(name) or NOT_IN_REPORT
            if signal.na:
                found = {"kind": "n/a", "verdict": "ok", "reason": signal.reason}
            elif signal.reason is not None:
                reason = f"{name} unknown: {signal.reason}"
                found = {"kind": "unknown", "verdict": row.if_unknown, "reason": reason}
            else:
                try:
                    if not test(signal.value, threshold):
                        continue
                except (TypeError, ValueError, OverflowError):  # a string where a count belongs, an infinity
                    shown = repr(signal.value)[:80]
                    raise ValueError(f"{target} {name}={shown} is not a value this signal can have") from None
                at = signals.get(f"{name}_at") or NOT_IN_REPORT
                reason = f"{row.reason}: {name}={signal.value!r} ({row.test} {_shown(threshold)}){_seen(at)}"
                found = {"kind": "tripped", "verdict": row.verdict, "value": signal.value, "reason": reason}
            evidence.append({"row": row.name, "target": target, "signal": name, **found})
    verdict = max((e["verdict"] for e in evidence), key=VERDICTS.index, default="ok")
    return NodeVerdict(report.node, verdict, _reasons(evidence, verdict), evidence)


def _seen(at: Signal) -> str:
    """`` (last seen <UTC time>)`` for a burst signal that says when it was last seen (a time no
    clock can show, as a node may write, is left out)."""
    if not at.known or not isinstance(at.value, int | float):
        return ""
    try:
        seen = datetime.fromtimestamp(at.value, UTC)
    except (OverflowError, ValueError, OSError):
        return ""
    return f" (last seen {seen.strftime('%Y-%m-%dT%H:%M:%SZ')})"


def _shown(threshold: Any) -> str:
    """A threshold as a reason shows it: long code lists shortened."""
    text = repr(threshold)
    return text if len(text) <= 60 else text[:56] + "...]"


def _reasons(evidence: list[dict[str, Any]], verdict: str) -> list[str]:
    """One line per (row, reason) behind the final verdict, listing every target it applies to."""
    return _grouped([e for e in evidence if e["verdict"] == verdict != "ok"], by="row")


def _grouped(evidence: list[dict[str, Any]], by: str) -> list[str]:
    """Lines ``<rows> [<targets>] <reason>``: one per (row, reason), or per reason listing its rows."""
    lines: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for e in evidence:
        key = (e["row"] if by == "row" else "", e["reason"])
        rows, targets = lines.setdefault(key, ([], []))
        if e["row"] not in rows:
            rows.append(e["row"])
        if e["target"] not in targets:
            targets.append(e["target"])
    return [
        f"{', '.join(rows)} [{', '.join(targets)}] {reason}" for (_, reason), (rows, targets) in lines.items()
    ]
