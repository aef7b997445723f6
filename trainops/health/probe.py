"""The node probe: collect one node's health report and publish it.

Publishing (see :class:`Publisher` for when, ``published`` for where) writes the full report to
the ConfigMap ``trainops-system/node-health-<node>`` and, on the node, the summary annotation
``trainops.io/health-summary`` and the ``GPUHealthy`` NodeCondition (status subresource, the list
written whole with the node's resourceVersion as a precondition, re-read and retried on 409).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainops.conventions import HEALTH_SUMMARY_ANNOTATION as SUMMARY_ANNOTATION
from trainops.errors import TemporaryError
from trainops.health.expect import clock_under_load, compared_with_node
from trainops.health.ib_reader import IbReader, IbUnavailable
from trainops.health.nvml_reader import XIDS_BETWEEN_SAMPLES, NvmlReader
from trainops.health.policy import DEFAULT_POLICY, NodeVerdict, Policy, evaluate
from trainops.health.published import (
    DIGEST_ANNOTATION,
    report_configmap,
    report_digest,
    summary,
    summary_json,
)
from trainops.health.report import HealthReport, Signal, Signals, get_signal
from trainops.health.stragglers import node_speed
from trainops.kube.client import MERGE_PATCH

LEGACY_REPORT_ANNOTATION = "trainops.io/health-report"  # where probes before 0.2 put the report; removed
CONDITION_TYPE = "GPUHealthy"
REPORT_HEARTBEAT_S = 120.0
# How long a burst fault (error counters, clocks held down under load, XIDs) keeps showing after it
# was last seen: two hours, the XID lookback of Azure's health checks (reference/health.md §4).
FAULT_WINDOW_S = 7200.0
# Between samples the probe re-reads its fabric ports from sysfs this often (each port's small files:
# microseconds of work), and samples and publishes at once when a link went down or came back: a training run judging a
# crash waits for the node's own word, and a report every --interval (60 s) would keep it waiting.
FABRIC_WATCH_S = 5.0
PUBLISH_INTERVAL_S = 60.0  # trainops probe --publish's --interval (deploy/node-probe.yaml's)
NODE_HEARTBEAT_S = 600.0
MAX_CONFLICTS = 5

SpeedProbe = Callable[[int], list[Signal]]


def collect_report(
    nvml: Any,
    ib_reader: IbReader,
    node_name: str,
    *,
    speed_probe: SpeedProbe | None = None,
    previous: HealthReport | None = None,
    now: float | None = None,
    xid_wait_ms: int = 0,
    window_s: float = FAULT_WINDOW_S,
) -> HealthReport:
    """One report. ``nvml`` is an :class:`NvmlReader` -- held open (read as it is) or not (it opens
    NVML for this sample only: :meth:`NvmlReader.sample`) -- or a pynvml-like module (opened for this call).

    With ``previous`` (this node's last report), cumulative ``counter_*`` signals also become
    ``*_per_min`` rates, held for ``window_s`` after a burst (see ``add_window_signals``); without it
    the rates are unknown.
    """
    node, gpus = _read_gpus(nvml, xid_wait_ms)
    try:
        ib_ports = ib_reader.read_ports()
        node["ib_port_count"] = Signal(len(ib_ports))
    except IbUnavailable as err:
        ib_ports = {}
        node["ib_port_count"] = Signal.unknown(str(err))
    speeds = _speeds(gpus, speed_probe, previous)
    for key, speed in zip(sorted(gpus, key=int), speeds, strict=True):
        gpus[key]["gemm_tflops"] = speed
    report = HealthReport(node_name, time.time() if now is None else now, "probe", node, gpus, ib_ports)
    add_window_signals(report, previous, window_s)
    return report


def link_states(ports: Mapping[str, Signals]) -> dict[str, tuple]:
    """Each fabric port's (state, physical state): what a link going down or coming back changes."""
    return {
        port: (get_signal(signals, "ib_state").value, get_signal(signals, "ib_phys_state").value)
        for port, signals in ports.items()
    }


def wait_for_next_sample(
    stop: threading.Event, interval_s: float, watch_s: float, ib_reader: IbReader, before: Mapping
) -> bool:
    """Wait up to ``interval_s`` for the next sample, re-reading the fabric ports' link states every
    ``watch_s`` (0: not at all): True as soon as they differ from ``before`` (sample now), False when
    the interval passed or ``stop`` was set."""
    deadline = time.monotonic() + interval_s
    while (left := deadline - time.monotonic()) > 0:
        if stop.wait(min(watch_s, left) if watch_s > 0 else left):
            return False
        if watch_s > 0 and time.monotonic() < deadline and read_link_states(ib_reader) != before:
            return True
    return False


def read_link_states(ib_reader: IbReader) -> dict[str, tuple]:
    """The fabric ports' link states now ({} when the node has none to read, or they went away while
    being read: an adapter resetting)."""
    try:
        return link_states(ib_reader.read_ports())
    except (IbUnavailable, OSError):
        return {}


def _speeds(
    gpus: dict[str, Signals], speed_probe: SpeedProbe | None, previous: HealthReport | None
) -> list[Signal]:
    """Per GPU: timed now when every GPU is idle (never on GPUs serving inference), else the speed
    ``previous`` carried, else unknown."""
    if speed_probe is None:
        return [Signal.unknown("speed probe not run")] * len(gpus)
    if all(get_signal(signals, "running_processes").value == 0 for signals in gpus.values()):
        return speed_probe(len(gpus))
    before = [
        get_signal((previous.gpus if previous else {}).get(key, {}), "gemm_tflops")
        for key in sorted(gpus, key=int)
    ]
    if before and all(speed.known for speed in before):
        return before
    return [Signal.unknown("GPUs busy; the GEMM waits until they are idle")] * len(gpus)


def _read_gpus(nvml: Any, xid_wait_ms: int) -> tuple[Signals, dict[str, Signals]]:
    if isinstance(nvml, NvmlReader):
        return nvml.sample(xid_wait_ms)  # held: read as it is; else NVML is open for this sample only
    with NvmlReader(nvml) as reader:
        return reader.read(xid_wait_ms)


def add_window_signals(report: HealthReport, previous: HealthReport | None, window_s: float) -> None:
    """Add what ``previous`` (the last report) and ``report`` show together, kept for ``window_s``:

    * ``<name>_per_min`` for every ``counter_<name>``: the per-minute rate since ``previous``, or, for
      ``window_s`` after errors were last counted, the highest such rate (a burst keeps showing after
      it ended, so a gate that runs later still sees it);
    * ``slowdown_clock_pct``: the SM clock held down under load (``expect.clock_under_load``), the
      lowest seen within ``window_s``.

    Each carries ``<signal>_at``, when it was last seen, while it holds a value from the window."""
    elapsed = report.collected_at - previous.collected_at if previous else 0.0
    at = report.collected_at
    for kind in ("gpus", "ib_ports"):
        before_all = getattr(previous, kind) if previous else {}
        for key, signals in getattr(report, kind).items():
            before = before_all.get(key, {})
            for name, signal in list(signals.items()):
                if name.startswith("counter_"):
                    rate_name = name.removeprefix("counter_") + "_per_min"
                    rate = _rate(signal, before.get(name), elapsed)
                    signals.update(_held(rate_name, rate, before, at, window_s, max, healthy=0))
            if kind == "gpus":
                clock = clock_under_load(signals)
                signals.update(_held("slowdown_clock_pct", clock, before, at, window_s, min, healthy=100.0))


def _held(
    name: str, current: Signal, before: Signals, now: float, window_s: float, worse, healthy
) -> Signals:
    """``name`` now: ``current`` when healthy and nothing worse was seen within the window, else the
    worse of ``current`` and what ``before`` held, with when it was last seen."""
    held, held_at = get_signal(before, name), get_signal(before, f"{name}_at")
    recent = held.known and held_at.known and held_at.value >= now - window_s
    if current.known and current.value != healthy:
        value = worse(current.value, held.value) if recent else current.value
        return {name: Signal(value), f"{name}_at": Signal(now)}
    if recent:
        return {name: held, f"{name}_at": held_at}
    return {name: current}


def _rate(current: Signal, before: Signal | None, elapsed: float) -> Signal:
    if before is None or elapsed <= 0:
        return Signal.unknown("rate needs two samples (probe with --interval or --window)")
    if not current.known or not before.known:
        return current if not current.known else before
    if current.value < before.value:
        return Signal.unknown("counter reset since the previous sample")
    return Signal(round((current.value - before.value) * 60.0 / elapsed, 3))


def gpu_healthy_condition(verdict: NodeVerdict, now: float | None = None) -> dict[str, Any]:
    """The ``GPUHealthy`` NodeCondition for a verdict: True (ok/warn), Unknown (only unknowns), else False."""
    if verdict.verdict in ("ok", "warn"):
        status, reason = "True", "HealthChecksPassed"
    elif verdict.only_unknown:
        status, reason = "Unknown", "SignalsUnknown"
    else:
        status, reason = "False", "HealthChecksFailed"
    stamp = _timestamp(time.time() if now is None else now)
    message = f"{verdict.verdict}: " + ("; ".join(verdict.reasons) or "all checks passed")
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }


@dataclass
class Writes:
    """What one report makes the probe write; None: leave that object alone."""

    verdict: NodeVerdict
    configmap: dict[str, Any] | None  # the full report (see ``published``)
    summary: str | None  # the node's summary annotation
    condition: dict[str, Any] | None  # the node's GPUHealthy condition


@dataclass
class Publisher:
    """Decides, report by report, what one node's probe writes: only what changed, plus slow heartbeats.

    The report's ConfigMap is rewritten when the digest (the verdict, each thresholded signal and
    the measured speed) changes, else every ``report_heartbeat_s`` (keep it under the policy's ``report_age`` bound,
    300 s by default, or the gate reads the report as stale). The node (summary annotation and
    condition) is written when the digest changes, else every ``node_heartbeat_s``.
    """

    policy: Policy = DEFAULT_POLICY
    report_heartbeat_s: float = REPORT_HEARTBEAT_S
    node_heartbeat_s: float = NODE_HEARTBEAT_S
    digest: str | None = None  # as last written
    report_written_at: float = float("-inf")
    node_written_at: float = float("-inf")

    def __post_init__(self) -> None:
        if not 0 < self.report_heartbeat_s <= self.node_heartbeat_s:
            raise ValueError(
                "report_heartbeat_s and node_heartbeat_s must be > 0 with report_heartbeat_s <= "
                f"node_heartbeat_s, got {self.report_heartbeat_s} and {self.node_heartbeat_s}"
            )

    def plan(self, report: HealthReport) -> Writes:
        """What to write for ``report`` (call :meth:`wrote` once written)."""
        at = report.collected_at
        verdict = evaluate(report, own_view(report, self.policy), now=at)
        speed = node_speed(report)
        digest = report_digest(verdict, speed.value if speed.known else None, compared_with_node(report))
        changed = digest != self.digest
        writes = Writes(verdict, None, None, None)
        if changed or at - self.report_written_at >= self.report_heartbeat_s:
            writes.configmap = report_configmap(report, digest)
        if changed or at - self.node_written_at >= self.node_heartbeat_s:
            writes.summary = summary_json(summary(verdict, digest))
            writes.condition = gpu_healthy_condition(verdict, now=at)
        return writes

    def wrote(self, writes: Writes, at: float) -> None:
        """Record that ``writes`` (planned for a report collected at ``at``) are on the cluster."""
        if writes.configmap is not None:
            self.report_written_at = at
            self.digest = writes.configmap["metadata"]["annotations"][DIGEST_ANNOTATION]
        if writes.condition is not None:
            self.node_written_at = at


def own_view(report: HealthReport, policy: Policy) -> Policy:
    """The policy for the probe's own verdict (its node's condition and summary) on ``report``.

    A probe that lets NVML go between samples cannot say no XID was raised between them, and says so
    (``xid_events`` unknown, ``XIDS_BETWEEN_SAMPLES``); the gate fills that from dcgm-exporter. The
    probe, which has no such second source, warns of it instead of excluding its node, so a healthy
    node's ``GPUHealthy`` stays True (the reason in its message). Any other unknown XID watch is judged
    as the policy says."""
    watches = [get_signal(signals, "xid_events") for signals in report.gpus.values()]
    unknown = [signal for signal in watches if not signal.known and not signal.na]
    if not unknown or any(signal.reason != XIDS_BETWEEN_SAMPLES for signal in unknown):
        return policy
    rows = [
        row.name for row in policy.rows if row.signal == "xid_events" and row.if_unknown not in ("ok", "warn")
    ]
    return policy.with_overrides({name: {"if_unknown": "warn"} for name in rows})


def publish(report: HealthReport, core_api: Any, publisher: Publisher) -> Writes:
    """Write what ``publisher`` plans for ``report``: its ConfigMap and node ``report.node``.

    ``core_api`` is a ``kubernetes.client.CoreV1Api``. The summary is one merge patch of our own
    annotation; the condition list is written whole, guarded by resourceVersion.
    """
    writes = publisher.plan(report)
    if writes.configmap is not None:
        put_configmap(core_api, writes.configmap)
    if writes.summary is not None:
        annotations = {SUMMARY_ANNOTATION: writes.summary, LEGACY_REPORT_ANNOTATION: None}
        core_api.patch_node(
            report.node, {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH
        )
    if writes.condition is not None:

        def conditions_body(node: Any) -> dict[str, Any]:
            current = core_api.api_client.sanitize_for_serialization(node.status.conditions or [])
            return {"status": {"conditions": replace_condition(current, writes.condition)}}

        _patch_node(core_api.read_node_status, core_api.patch_node_status, report.node, conditions_body)
    publisher.wrote(writes, report.collected_at)
    return writes


def put_configmap(core_api: Any, body: dict[str, Any]) -> None:
    """Replace the ConfigMap ``body`` names (unconditionally: the node's probe is its only writer); create it when absent."""
    from kubernetes.client.exceptions import ApiException

    meta = body["metadata"]
    try:
        core_api.replace_namespaced_config_map(meta["name"], meta["namespace"], body)
    except ApiException as err:
        if err.status != 404:
            raise
        core_api.create_namespaced_config_map(meta["namespace"], body)


def replace_condition(conditions: list[dict[str, Any]], condition: dict[str, Any]) -> list[dict[str, Any]]:
    """The full list (merge patch replaces lists) with ours updated; transition time kept if status is."""
    ours = dict(condition)
    for old in conditions:
        if old.get("type") == CONDITION_TYPE and old.get("status") == ours["status"]:
            ours["lastTransitionTime"] = old.get("lastTransitionTime", ours["lastTransitionTime"])
    return [c for c in conditions if c.get("type") != CONDITION_TYPE] + [ours]


def _patch_node(read: Callable, patch: Callable, name: str, build: Callable[[Any], dict[str, Any]]) -> None:
    from kubernetes.client.exceptions import ApiException

    for _ in range(MAX_CONFLICTS):
        node = read(name)
        body = build(node)
        body.setdefault("metadata", {})["resourceVersion"] = node.metadata.resource_version
        try:
            patch(name, body, _content_type=MERGE_PATCH)
            return
        except ApiException as err:
            if err.status != 409:
                raise
    raise TemporaryError(f"node {name}: gave up after {MAX_CONFLICTS} resourceVersion conflicts in a row")


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
