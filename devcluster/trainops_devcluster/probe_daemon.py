"""The devcluster's stand-in for the node-probe DaemonSet: the production probe, run per node.

Every ``interval_s`` it collects each node's report with the production code
(:func:`~trainops.health.probe.collect_report` over ``FakeNvml`` and ``TelemetryIbReader``,
one NVML reader kept open per node so XID events are seen, the previous report passed for rates)
and writes the ``trainops.io/health-report`` annotation and the ``GPUHealthy`` condition into
the store, as ``trainops probe --publish`` does through the API. It writes when the report
changed, else every ``heartbeat_s`` (so reports age only while nothing is probing them).

A node whose telemetry is missing gets nothing new: its last report goes stale, or it never
has one. A repaired node (new ``boot_id``) gets a fresh NVML reader, as a restarted probe pod would.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from trainops.conventions import HEALTH_REPORT_ANNOTATION
from trainops.health.nvml_reader import NvmlReader
from trainops.health.policy import DEFAULT_POLICY, Policy, evaluate
from trainops.health.probe import collect_report, gpu_healthy_condition, replace_condition
from trainops.health.report import HealthReport
from trainops_devcluster.controller import Controller
from trainops_devcluster.store import NotFound, Store
from trainops_devcluster.telemetry import FakeNvml, NodeTelemetry, TelemetryIbReader


@dataclass
class _NodeProbe:
    boot_id: int
    reader: NvmlReader
    previous: HealthReport | None = None
    published: dict | None = None  # the last published report without its collection time
    published_at: float = 0.0


class ProbeDaemon(Controller):
    """Probes every node of ``telemetry`` on a timer and publishes into ``store``."""

    def __init__(
        self,
        store: Store,
        telemetry: Mapping[str, NodeTelemetry],
        *,
        interval_s: float = 1.0,
        heartbeat_s: float = 30.0,
        policy: Policy = DEFAULT_POLICY,
        gemm: bool = True,
    ) -> None:
        if interval_s <= 0 or heartbeat_s <= 0:
            raise ValueError(f"interval_s and heartbeat_s must be > 0, got {interval_s}, {heartbeat_s}")
        super().__init__(store)
        self.telemetry = telemetry
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self.policy = policy
        self.gemm = gemm  # False: probe as deploy/node-probe.yaml runs it (no --gemm, speed unknown)
        self._probes: dict[str, _NodeProbe] = {}
        self._rounds = 0
        self._round_done = threading.Condition()

    def start(self) -> None:
        super().start()
        self.after(0, self._round)

    def _round(self) -> None:
        try:
            for name in list(self.telemetry):
                if self._stopped.is_set():
                    return
                self._safely(lambda name=name: self.probe(name))
            with self._round_done:
                self._rounds += 1
                self._round_done.notify_all()
        finally:
            self.after(self.interval_s, self._round)

    def wait_rounds(self, count: int = 2, timeout: float = 60.0) -> None:
        """Block until ``count`` more full rounds have run: every node probed (and written if changed) since."""
        with self._round_done:
            target = self._rounds + count
            if not self._round_done.wait_for(lambda: self._rounds >= target, timeout):
                raise TimeoutError(f"the probe daemon did not finish {count} round(s) in {timeout:g}s")

    def probe(self, name: str) -> bool:
        """Probe one node now; True when a report was written."""
        telemetry = self.telemetry[name]
        if telemetry.missing:
            return False
        probe = self._probes.get(name)
        if probe is None or probe.boot_id != telemetry.boot_id:
            if probe:
                _close(probe.reader)
            probe = self._probes[name] = _NodeProbe(telemetry.boot_id, NvmlReader(FakeNvml(telemetry)))
            probe.reader.start()
        report = collect_report(
            probe.reader,
            TelemetryIbReader(telemetry),
            name,
            speed_probe=telemetry.measure_speed if self.gemm else None,
            previous=probe.previous,
        )
        probe.previous = report
        content = {**report.to_dict(), "collected_at": None}
        if content == probe.published and report.collected_at - probe.published_at < self.heartbeat_s:
            return False
        verdict = evaluate(report, self.policy, now=report.collected_at)
        condition = gpu_healthy_condition(verdict, now=report.collected_at)
        text = report.to_json()

        def write(node: dict) -> None:
            node["metadata"].setdefault("annotations", {})[HEALTH_REPORT_ANNOTATION] = text
            status = node.setdefault("status", {})
            status["conditions"] = replace_condition(status.get("conditions") or [], condition)

        try:
            self.store.mutate("nodes", "", name, write)
        except NotFound:  # the node object was deleted; its telemetry may outlive it
            return False
        probe.published, probe.published_at = content, report.collected_at
        return True

    def stop(self) -> None:
        super().stop()
        for probe in self._probes.values():
            _close(probe.reader)


def _close(reader: NvmlReader) -> None:
    """Close NVML; a driver that is gone (missing telemetry) has nothing left to close."""
    try:
        reader.close()
    except reader.nvml.NVMLError:
        pass
