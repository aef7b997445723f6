"""The node probe: collect one node's health report and publish it on the node object.

Publishing writes the report as annotation ``trainops.io/health-report`` and a ``GPUHealthy``
NodeCondition (status subresource), each by merge patch with the node's resourceVersion as a
precondition, re-reading and retrying on 409 Conflict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from trainops.errors import TemporaryError
from trainops.health.ib_reader import IbReader, IbUnavailable
from trainops.health.nvml_reader import NvmlReader
from trainops.health.policy import DEFAULT_POLICY, NodeVerdict, Policy, evaluate
from trainops.health.report import HealthReport, Signal, Signals, get_signal
from trainops.kube.client import MERGE_PATCH

ANNOTATION = "trainops.io/health-report"
CONDITION_TYPE = "GPUHealthy"
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
) -> HealthReport:
    """One report. ``nvml`` is an open :class:`NvmlReader` or a pynvml-like module (opened for this call).

    With ``previous`` (an earlier report of this node), cumulative ``counter_*`` signals also
    become ``*_per_min`` rates; without it the rates are unknown.
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
    add_counter_rates(report, previous)
    return report


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
        return nvml.read(xid_wait_ms)
    with NvmlReader(nvml) as reader:
        return reader.read(xid_wait_ms)


def add_counter_rates(report: HealthReport, previous: HealthReport | None) -> None:
    """Add ``<name>_per_min`` for every ``counter_<name>`` signal, from the change since ``previous``."""
    elapsed = report.collected_at - previous.collected_at if previous else 0.0
    for kind in ("gpus", "ib_ports"):
        before_all = getattr(previous, kind) if previous else {}
        for key, signals in getattr(report, kind).items():
            before = before_all.get(key, {})
            for name, signal in list(signals.items()):
                if name.startswith("counter_"):
                    rate_name = name.removeprefix("counter_") + "_per_min"
                    signals[rate_name] = _rate(signal, before.get(name), elapsed)


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


def publish(report: HealthReport, core_api: Any, policy: Policy = DEFAULT_POLICY) -> dict[str, Any]:
    """Write ``report`` and its ``GPUHealthy`` condition to node ``report.node``; returns the condition.

    ``core_api`` is a ``kubernetes.client.CoreV1Api``.
    """
    condition = gpu_healthy_condition(
        evaluate(report, policy, now=report.collected_at), now=report.collected_at
    )
    _patch_node(
        core_api.read_node,
        core_api.patch_node,
        report.node,
        lambda node: {"metadata": {"annotations": {ANNOTATION: report.to_json()}}},
    )

    def conditions_body(node: Any) -> dict[str, Any]:
        current = core_api.api_client.sanitize_for_serialization(node.status.conditions or [])
        return {"status": {"conditions": replace_condition(current, condition)}}

    _patch_node(core_api.read_node_status, core_api.patch_node_status, report.node, conditions_body)
    return condition


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
