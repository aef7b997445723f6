"""Fleet-wide GPU signals from dcgm-exporter metrics through the Prometheus HTTP API.

A fixed number of instant queries covers the whole fleet (never one per node): one per metric,
one for the sample timestamps (freshness) and one ``increase()`` per error counter. Series are keyed
by the client's ``node_label`` and ``gpu`` labels. A node whose newest sample is older than ``max_age_s``, or that has no series at all,
gets a report that knows nothing; a metric missing for a GPU makes that signal unknown.

Enable the non-default counters in dcgm-exporter's CSV (ECC, row-remap pending, NVLink errors,
``DCGM_EXP_XID_ERRORS_COUNT`` with ``--xid-count-window-size`` set to the XID lookback).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from trainops.errors import TemporaryError
from trainops.health.report import HealthReport, Signal, Signals, new_signal

RECOVERY_ACTIONS = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET"}

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
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", int),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter_pcie_replay", int),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter_nvlink_replay", int),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("counter_nvlink_recovery", int),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter_nvlink_crc_flit", int),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("counter_nvlink_crc_data", int),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", float),
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": (
        "recovery_action",
        lambda v: RECOVERY_ACTIONS.get(int(v), f"code {v:g}"),
    ),
}
XID_LAST = "DCGM_FI_DEV_XID_ERRORS"  # last XID value; its presence proves XIDs are watched
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"  # label xid, count within the exporter's window
FRESHNESS = "DCGM_FI_DEV_GPU_TEMP"  # on by default; its sample time is the node's last scrape
COUNTERS = [name for name, (signal, _) in GAUGES.items() if signal.startswith("counter_")]


class PrometheusError(TemporaryError):
    """Prometheus could not be reached or refused a query."""


DEFAULT_NODE_LABEL = "Hostname"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # Prometheus' label name syntax


class PrometheusClient:
    """Instant queries against ``<base_url>/api/v1/query`` with a ``requests`` session.

    ``node_label``: the label that names the Kubernetes node in dcgm-exporter's series.  dcgm-exporter
    fills ``Hostname`` from its ``NODE_NAME`` variable, which the GPU Operator and its Helm chart set to
    the node's name (without it, or before dcgm-exporter 3.1.6, ``Hostname`` is the exporter *pod*'s
    name, unless it runs with hostNetwork).  A Prometheus that relabels the node's name into a label of
    its own (e.g. ``node`` from ``__meta_kubernetes_pod_node_name``) names that one here."""

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


def fleet_reports(
    client: PrometheusClient,
    nodes: Iterable[str] | None = None,
    *,
    now: float | None = None,
    max_age_s: float = 120.0,
    rate_window_s: int = 300,
) -> dict[str, HealthReport]:
    """One report per node seen in Prometheus, plus an empty one for each of ``nodes`` not seen."""
    now, node_label = time.time() if now is None else now, client.node_label

    def ask(expr: str, labels: str = "") -> list[dict[str, Any]]:
        # Only the labels the reports need: a dcgm-exporter series carries ten (UUID, modelName,
        # driver version...), so this moves and decodes a fraction of the raw series.
        return client.query(f"max by ({node_label}, gpu{labels}) ({expr})", at=now)

    # one selector per metric: Prometheus answers a ``{__name__=~"A|B|..."}`` regex over the whole
    # fleet 2-3x slower than the same series asked for by name (measured, 2.42, 1,024 nodes)
    series = {name: ask(name) for name in [*GAUGES, XID_LAST]}
    xid_counts = ask(XID_COUNT, ", xid")
    scraped = ask(f"timestamp({FRESHNESS})")
    rates = {name: ask(f"increase({name}[{rate_window_s}s])") for name in COUNTERS}

    def key(labels: dict[str, str]) -> tuple[str, str] | None:
        node, gpu = labels.get(node_label), labels.get("gpu")
        return (node, gpu) if node and gpu is not None else None

    last_scrape: dict[str, float] = defaultdict(float)
    fresh_gpus: dict[str, set[str]] = defaultdict(set)
    for item in scraped:
        if k := key(item["metric"]):
            last_scrape[k[0]] = max(last_scrape[k[0]], float(item["value"][1]))
            fresh_gpus[k[0]].add(k[1])
    # node -> gpu -> metric values (grouped by node once, so building the reports is linear)
    values: dict[str, dict[str, dict[str, Any]]] = defaultdict(lambda: defaultdict(dict))
    xids: dict[tuple[str, str], set[int]] = defaultdict(set)
    for metric, result in series.items():
        for item in result:
            if k := key(item["metric"]):
                values[k[0]][k[1]][metric] = float(item["value"][1])
    for item in xid_counts:
        if k := key(item["metric"]):
            values[k[0]].setdefault(k[1], {})  # a GPU seen only through its XID count still gets an entry
            if float(item["value"][1]) > 0:
                xids[k].add(int(item["metric"]["xid"]))
    for name, result in rates.items():
        for item in result:
            if k := key(item["metric"]):
                values[k[0]][k[1]][f"rate:{name}"] = float(item["value"][1]) * 60.0 / rate_window_s

    reports: dict[str, HealthReport] = {}
    for node in sorted(values.keys() | last_scrape.keys()):
        age = now - last_scrape[node] if node in last_scrape else None
        if age is None or age > max_age_s:
            why = "no scrape time" if age is None else f"last sample {age:.0f}s old (bound {max_age_s:.0f}s)"
            reports[node] = HealthReport.empty(node, now, "prometheus", f"dcgm-exporter data stale: {why}")
            continue
        gpus = {gpu: _gpu_signals(metrics, xids[(node, gpu)]) for gpu, metrics in values[node].items()}
        signals = {"gpu_count": Signal(len(fresh_gpus[node]))}
        reports[node] = HealthReport(node, now, "prometheus", signals, gpus)
    for node in nodes or ():
        if node not in reports:
            reports[node] = no_series(node, now, node_label)
    return reports


def no_series(node: str, now: float, node_label: str) -> HealthReport:
    """The report of a node Prometheus has no dcgm-exporter series for: it knows nothing."""
    return HealthReport.empty(node, now, "prometheus", f'no dcgm-exporter series with {node_label}="{node}"')


def label_mismatch(seen: Iterable[str], nodes: Iterable[str], node_label: str) -> str | None:
    """Why no node has series when Prometheus has series all the same: ``node_label`` holds no node names."""
    seen, nodes = set(seen), set(nodes)
    if not seen or seen & nodes:
        return None
    return (
        f"Prometheus has dcgm-exporter series for {len(seen)} values of label {node_label!r} (such as "
        f"{min(seen)!r}) but none for these nodes: set the Prometheus connection's node_label "
        "(CLI: --prometheus-node-label) to the label that holds the node's name"
    )


def _gpu_signals(values: dict[str, Any], xids: set[int]) -> Signals:
    signals: Signals = {}
    for metric, name, convert, missing in _GAUGE_TABLE:
        value = values.get(metric)
        signals[name] = missing if value is None else new_signal(Signal, (convert(value), None, False))
    for key, name, missing in _RATE_TABLE:
        rate = values.get(key)
        signals[name] = missing if rate is None else new_signal(Signal, (round(rate, 3), None, False))
    if XID_LAST in values or xids:
        signals["xid_events"] = Signal(sorted(xids))
    else:
        signals["xid_events"] = _XID_UNWATCHED
    return signals


# Built once: (metric, signal, convert, the signal when the series is missing) per gauge, and
# (values key, signal, missing) per counter rate, so a fleet's worth of GPUs makes no strings.
_GAUGE_TABLE = [
    (metric, name, convert, Signal.unknown(f"no {metric} series"))
    for metric, (name, convert) in GAUGES.items()
]
_RATE_TABLE = [
    (
        f"rate:{metric}",
        GAUGES[metric][0].removeprefix("counter_") + "_per_min",
        Signal.unknown(f"no {metric} series"),
    )
    for metric in COUNTERS
]
_XID_UNWATCHED = Signal.unknown(f"no {XID_LAST} series (XID watch off?)")
