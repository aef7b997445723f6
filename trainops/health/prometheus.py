"""Fleet-wide GPU signals from dcgm-exporter metrics through the Prometheus HTTP API.

A fixed number of instant queries covers the whole fleet (never one per node): one per metric,
one for the sample timestamps (freshness, and each GPU's ``modelName``), one for the XIDs counted
within the fault window, one for the last-XID gauges that changed within it, and one ``increase()``
per error counter. A node whose newest sample is older than ``max_age_s``, or that has no series at
all, gets a report that knows nothing; a metric missing for a GPU makes that signal unknown.

The label naming the node is found among the client's own ``node_label`` and the names
dcgm-exporter uses (``Hostname`` in its 4.x releases, ``hostname`` on its main branch): the first
that the series carry (see :class:`FleetMetrics`). ``DCGM_FI_DEV_XID_ERRORS`` is the last XID, a
gauge: a value that changed within the fault window is an XID seen there, judged like any other.

dcgm-exporter's default counters leave out ECC totals, row-remap pending, page retirement, clock
event reasons, the maximum SM clock, NVLink errors and the XID count; ``deploy/dcgm-exporter-counters.csv``
adds them (``DEFAULT_COUNTERS`` is what the defaults hold). Names are released go-dcgm's:
``DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION`` (dcgm-exporter 4.5.1-4.8.0 and later), never the
unreleased ``DCGM_FI_DEV_GPU_RECOVERY_ACTION``.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from trainops.errors import TemporaryError
from trainops.health.expect import clock_under_load
from trainops.health.report import HealthReport, Signal, Signals

RECOVERY_ACTIONS = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET"}
RECOVERY_ACTION = "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"

GAUGES: dict[str, tuple[str, Callable[[float], Any]]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", float),
    "DCGM_FI_DEV_MEMORY_TEMP": ("memory_temperature_c", float),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", float),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected_volatile", int),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected_volatile", int),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_corrected_aggregate", int),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_uncorrected_aggregate", int),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", int),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", int),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("row_remap_failure", bool),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("row_remap_pending", bool),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages_sbe", int),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages_dbe", int),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages_pending", bool),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", int),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", float),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("sm_clock_max_mhz", float),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_pct", float),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter_pcie_replay", int),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter_nvlink_replay", int),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("counter_nvlink_recovery", int),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter_nvlink_crc_flit", int),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("counter_nvlink_crc_data", int),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", float),
    RECOVERY_ACTION: ("recovery_action", lambda v: RECOVERY_ACTIONS.get(int(v), f"code {v:g}")),
}
XID_LAST = "DCGM_FI_DEV_XID_ERRORS"  # the last XID (a gauge that keeps its value)
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"  # label xid, count within the exporter's window
FRESHNESS = "DCGM_FI_DEV_GPU_TEMP"  # on by default; its sample time is the node's last scrape
COUNTERS = [name for name, (signal, _) in GAUGES.items() if signal.startswith("counter_")]
# What dcgm-exporter's etc/default-counters.csv (every 4.x release) exports of the above.
DEFAULT_COUNTERS = frozenset(
    {
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        XID_LAST,
    }
)
COUNTERS_FILE = "deploy/dcgm-exporter-counters.csv"
# Absent fleet-wide for reasons other than the counters file: XID counts exist only for XIDs seen,
# page retirement only on Volta and Turing.
SOMETIMES_ABSENT = frozenset(
    {XID_COUNT, "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"}
)
EXPORTER_NODE_LABELS = ("Hostname", "hostname")  # dcgm-exporter 4.x releases; its main branch (d5e5f51)


class PrometheusError(TemporaryError):
    """Prometheus could not be reached or refused a query."""


DEFAULT_NODE_LABEL = "Hostname"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # Prometheus' label name syntax


class PrometheusClient:
    """Instant queries against ``<base_url>/api/v1/query`` with a ``requests`` session.

    ``node_label``: the label that names the Kubernetes node in dcgm-exporter's series.  dcgm-exporter
    fills ``Hostname`` (``hostname`` on its main branch) from its ``NODE_NAME`` variable, which the GPU
    Operator and its Helm chart set to the node's name (without it, ``Hostname`` is the exporter
    *pod*'s name, unless it runs with hostNetwork).  A Prometheus that relabels the node's name into a
    label of its own (e.g. ``node`` from ``__meta_kubernetes_pod_node_name``) names that one here; it
    is tried first, then dcgm-exporter's own names."""

    def __init__(
        self, base_url: str, session: Any = None, timeout: float = 30.0, node_label: str = DEFAULT_NODE_LABEL
    ):
        import requests

        if not isinstance(node_label, str) or not LABEL_NAME.fullmatch(node_label):
            raise ValueError(
                f"node_label must be a Prometheus label name (letters, digits, _; not starting with a digit), "
                f"e.g. 'Hostname' or 'node', got {node_label!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()
        self.timeout, self.node_label = timeout, node_label

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The result vector of an instant query; raises PrometheusError with the cause."""
        import requests

        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        url = f"{self.base_url}/api/v1/query"
        try:
            response = self.session.get(url, params=params, timeout=self.timeout)
            body = response.json()
        except (requests.RequestException, ValueError) as err:
            raise PrometheusError(
                f"Prometheus at {self.base_url} unreachable or not answering JSON: {err}"
            ) from err
        if body.get("status") != "success":
            raise PrometheusError(
                f"Prometheus refused {promql!r}: {body.get('errorType')}: {body.get('error')}"
            )
        if body["data"].get("resultType") != "vector":
            raise PrometheusError(
                f"query {promql!r} returned {body['data'].get('resultType')}, expected a vector"
            )
        return body["data"]["result"]


@dataclass
class FleetMetrics:
    """What Prometheus knows of the fleet: one report per node named in ``label``, and what tells
    whether that was the right label and what the exporters leave out."""

    reports: dict[str, HealthReport]
    label: str  # the label read as the node's name
    values: dict[str, set[str]]  # each label tried -> the values its series carry
    exported: set[str] = field(default_factory=set)  # metrics with at least one series
    now: float = 0.0
    series: int = 0  # GPUs with a fresh sample, whatever their labels

    def report(self, node: str) -> HealthReport:
        """``node``'s report; one that knows nothing when Prometheus has no series of it."""
        return self.reports.get(node) or no_series(node, self.now, self.label)

    def label_for(self, nodes: Iterable[str]) -> str | None:
        """The label among those tried whose values name most of ``nodes`` (None: no label does)."""
        wanted = set(nodes)
        best = max(self.values, key=lambda label: len(self.values[label] & wanted), default=None)
        return best if best is not None and self.values[best] & wanted else None

    def missing(self) -> dict[str, str]:
        """Each metric the gate reads that no exporter serves, and how to get it."""
        hints = {}
        for metric in [*GAUGES, XID_LAST]:
            if metric in self.exported or metric in SOMETIMES_ABSENT:
                continue
            if metric == RECOVERY_ACTION:
                hints[metric] = f"needs dcgm-exporter 4.5.1-4.8.0 or later; uncomment it in {COUNTERS_FILE}"
            elif metric in DEFAULT_COUNTERS:
                hints[metric] = "in dcgm-exporter's default counters, yet absent: check its counters file"
            else:
                hints[metric] = f"off in dcgm-exporter's default counters; {COUNTERS_FILE} enables it"
        return hints


def fleet_reports(
    client: PrometheusClient,
    *,
    now: float | None = None,
    max_age_s: float = 120.0,
    rate_window_s: int = 300,
    fault_window_s: float = 7200.0,
    label: str | None = None,
) -> FleetMetrics:
    """One report per node seen in Prometheus, keyed by ``label`` (default: the first of the client's
    ``node_label``, ``Hostname``, ``hostname`` that the series carry). XIDs count when seen within
    ``fault_window_s``; error counters are ``increase()`` over ``rate_window_s``."""
    now = time.time() if now is None else now
    tried = list(dict.fromkeys([client.node_label, *EXPORTER_NODE_LABELS]))
    by = ", ".join(tried)
    window = f"{int(fault_window_s)}s"

    def ask(expr: str, labels: str = "") -> list[dict[str, Any]]:
        # Only the labels the reports need: a dcgm-exporter series carries ten (UUID, modelName,
        # driver version...), so this moves and decodes a fraction of the raw series.
        return client.query(f"max by ({by}, gpu{labels}) ({expr})", at=now)

    # one selector per metric: Prometheus answers a ``{__name__=~"A|B|..."}`` regex over the whole
    # fleet 2-3x slower than the same series asked for by name (measured, 2.42, 1,024 nodes)
    scraped = ask(f"timestamp({FRESHNESS})", ", modelName")
    values = {name: {item["metric"][name] for item in scraped if item["metric"].get(name)} for name in tried}
    label = label or next((name for name in tried if values[name]), client.node_label)
    series = {name: ask(name) for name in [*GAUGES, XID_LAST]}
    xid_counts = ask(f"max_over_time({XID_COUNT}[{window}])", ", xid")
    # the last XID counts when it changed within the window, or its series began within it
    xid_recent = client.query(
        f"max by ({by}, gpu) (changes({XID_LAST}[{window}])) > 0 "
        f"or max by ({by}, gpu) ({XID_LAST} unless {XID_LAST} offset {window})",
        at=now,
    )
    rates = {name: ask(f"increase({name}[{rate_window_s}s])") for name in COUNTERS}

    def key(labels: dict[str, str]) -> tuple[str, str] | None:
        node, gpu = labels.get(label), labels.get("gpu")
        return (node, gpu) if node and gpu is not None else None

    last_scrape: dict[str, float] = defaultdict(float)
    fresh_gpus: dict[str, set[str]] = defaultdict(set)
    models: dict[tuple[str, str], str] = {}
    for item in scraped:
        if k := key(item["metric"]):
            last_scrape[k[0]] = max(last_scrape[k[0]], float(item["value"][1]))
            fresh_gpus[k[0]].add(k[1])
            models[k] = item["metric"].get("modelName", "")
    # node -> gpu -> metric values (grouped by node once, so building the reports is linear)
    readings: dict[str, dict[str, dict[str, Any]]] = defaultdict(lambda: defaultdict(dict))

    def read(result: list[dict[str, Any]], metric: str, per_minute: bool = False) -> None:
        for item in result:  # the fleet's GPUs times the metrics: key() inlined
            labels = item["metric"]
            node, gpu = labels.get(label), labels.get("gpu")
            value = float(item["value"][1])
            if node and gpu is not None and math.isfinite(value):  # NaN or an infinity is no reading
                readings[node][gpu][metric] = value * 60.0 / rate_window_s if per_minute else value

    xids: dict[tuple[str, str], set[int]] = defaultdict(set)
    exported = {metric for metric, result in series.items() if result}
    for metric, result in series.items():
        read(result, metric)
    for item in xid_recent:
        if k := key(item["metric"]):
            last = readings[k[0]][k[1]].get(XID_LAST)
            if last:  # 0: no XID since the exporter started
                xids[k].add(int(last))
    if xid_counts:
        exported.add(XID_COUNT)
    for item in xid_counts:
        if k := key(item["metric"]):
            readings[k[0]].setdefault(k[1], {})  # a GPU seen only through its XID count still gets an entry
            readings[k[0]][k[1]][XID_COUNT] = 1.0
            xid = item["metric"].get("xid", "")
            # NaN > 0 is False; a label that is not a number names no XID
            if float(item["value"][1]) > 0 and xid.isdigit():
                xids[k].add(int(xid))
    for name, result in rates.items():
        read(result, f"rate:{name}", per_minute=True)

    reports: dict[str, HealthReport] = {}
    for node in sorted(readings.keys() | last_scrape.keys()):
        age = now - last_scrape[node] if node in last_scrape else None
        if age is None or age > max_age_s:
            why = "no scrape time" if age is None else f"last sample {age:.0f}s old (bound {max_age_s:.0f}s)"
            reports[node] = HealthReport.empty(node, now, "prometheus", f"dcgm-exporter data stale: {why}")
            continue
        gpus = {
            gpu: _gpu_signals(metrics, xids[(node, gpu)], models.get((node, gpu)))
            for gpu, metrics in readings[node].items()
        }
        signals = {"gpu_count": Signal(len(fresh_gpus[node]))}
        reports[node] = HealthReport(node, now, "prometheus", signals, gpus)
    return FleetMetrics(reports, label, values, exported, now, len(scraped))


def no_series(node: str, now: float, node_label: str) -> HealthReport:
    """The report of a node Prometheus has no dcgm-exporter series for: it knows nothing."""
    return HealthReport.empty(node, now, "prometheus", f'no dcgm-exporter series with {node_label}="{node}"')


def label_mismatch(fleet: FleetMetrics, nodes: Iterable[str], configured: str) -> str | None:
    """Why no node has series while Prometheus has dcgm-exporter series: no label tried names a node."""
    if not fleet.series or fleet.label_for(nodes):
        return None
    tried = ", ".join(repr(label) for label in fleet.values)
    held = [f"{label!r} holds e.g. {min(values)!r}" for label, values in fleet.values.items() if values]
    return (
        f"Prometheus has dcgm-exporter series for {fleet.series} GPUs, but none of the labels tried "
        f"({tried}) names one of these nodes ({'; '.join(held) or 'none of them is set'}): give "
        "dcgm-exporter NODE_NAME (the GPU Operator does), or set the Prometheus connection's node_label "
        f"(CLI: --prometheus-node-label; now {configured!r}) to the label that holds the node's name"
    )


def _gpu_signals(values: dict[str, Any], xids: set[int], model: str | None) -> Signals:
    signals: Signals = {}
    for metric, name, convert, missing in _GAUGE_TABLE:
        value = values.get(metric)
        signals[name] = missing if value is None else Signal(convert(value))
    for key, name, missing in _RATE_TABLE:
        rate = values.get(key)
        signals[name] = missing if rate is None else Signal(round(rate, 3))
    if XID_LAST in values or XID_COUNT in values:
        signals["xid_events"] = Signal(sorted(xids))
    else:
        signals["xid_events"] = _XID_UNWATCHED
    sbe, dbe = signals.pop("retired_pages_sbe"), signals.pop("retired_pages_dbe")
    signals["retired_pages"] = (
        Signal(sbe.value + dbe.value) if sbe.known and dbe.known else sbe if not sbe.known else dbe
    )
    if model:
        signals["model"] = Signal(model)
    signals["slowdown_clock_pct"] = clock_under_load(signals)
    return signals


# Built once: (metric, signal, convert, the signal when the series is missing) per gauge, and
# (values key, signal, missing) per counter rate, so a fleet's worth of GPUs makes no strings.
_GAUGE_TABLE = [
    (metric, name, convert, Signal.unknown(f"no {metric} series (or not a number)"))
    for metric, (name, convert) in GAUGES.items()
]
_RATE_TABLE = [
    (
        f"rate:{metric}",
        GAUGES[metric][0].removeprefix("counter_") + "_per_min",
        Signal.unknown(f"no {metric} series (or not a number)"),
    )
    for metric in COUNTERS
]
_XID_UNWATCHED = Signal.unknown(f"no {XID_LAST} or {XID_COUNT} series (or not a number; XID watch off?)")
