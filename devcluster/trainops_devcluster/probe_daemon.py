"""The devcluster's stand-in for the node-probe DaemonSet: the production probe, run per node.

Every ``interval_s`` it collects each node's report with the production code
(:func:`~trainops.health.probe.collect_report` over ``FakeNvml`` and ``TelemetryIbReader``,
one NVML reader kept open per node so XID events are seen, the previous report passed for rates)
and writes what the production :class:`~trainops.health.probe.Publisher` plans into the store, as
``trainops probe --publish`` does through the API: the report's ConfigMap
``trainops-system/node-health-<node>`` when the verdict or a thresholded signal changed, else
every ``report_heartbeat_s``; the node's summary annotation and ``GPUHealthy`` condition on a
change, else every ``node_heartbeat_s``. Reports age only while nothing is probing them. Between
rounds, every ``fabric_watch_s`` (the probe's ``--fabric-watch``, in the same proportion to the interval
as the shipped probe's 5 s to 60 s), a node whose fabric links went down or came back is probed at once.

A node whose telemetry is missing gets nothing new: its last report goes stale, or it never
has one. A repaired node (new ``boot_id``) gets a fresh NVML reader, as a restarted probe pod would.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from trainops.conventions import HEALTH_SUMMARY_ANNOTATION
from trainops.health.nvml_reader import NvmlReader
from trainops.health.policy import DEFAULT_POLICY, Policy
from trainops.health.probe import (
    FABRIC_WATCH_S,
    FAULT_WINDOW_S,
    LEGACY_REPORT_ANNOTATION,
    NODE_HEARTBEAT_S,
    PUBLISH_INTERVAL_S,
    REPORT_HEARTBEAT_S,
    Publisher,
    Writes,
    collect_report,
    link_states,
    read_link_states,
    replace_condition,
)
from trainops.health.report import HealthReport
from trainops_devcluster.controller import Controller
from trainops_devcluster.store import NotFound, Store
from trainops_devcluster.telemetry import FakeNvml, NodeTelemetry, TelemetryIbReader


@dataclass
class _NodeProbe:
    boot_id: int
    reader: NvmlReader
    publisher: Publisher
    previous: HealthReport | None = None


class ProbeDaemon(Controller):
    """Probes every node of ``telemetry`` on a timer and publishes into ``store``."""

    def __init__(
        self,
        store: Store,
        telemetry: Mapping[str, NodeTelemetry],
        *,
        interval_s: float = 1.0,
        report_heartbeat_s: float = REPORT_HEARTBEAT_S,
        node_heartbeat_s: float = NODE_HEARTBEAT_S,
        policy: Policy = DEFAULT_POLICY,
        gemm: bool = True,
        fault_window_s: float = FAULT_WINDOW_S,
        fabric_watch_s: float | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.heartbeats = {"report_heartbeat_s": report_heartbeat_s, "node_heartbeat_s": node_heartbeat_s}
        Publisher(policy, **self.heartbeats)  # refuses bad heartbeats now, not on the first round
        super().__init__(store)
        self.telemetry = telemetry
        self.interval_s = interval_s
        self.policy = policy
        self.gemm = gemm  # False: probe as deploy/node-probe.yaml runs it (no --gemm, speed unknown)
        self.fault_window_s = fault_window_s  # the probe's --fault-window
        # the probe's --fabric-watch, in the same proportion to the interval as the shipped probe's
        self.fabric_watch_s = (
            interval_s * FABRIC_WATCH_S / PUBLISH_INTERVAL_S if fabric_watch_s is None else fabric_watch_s
        )
        self._probes: dict[str, _NodeProbe] = {}
        self._rounds = 0
        self._round_done = threading.Condition()

    def start(self) -> None:
        super().start()
        self.after(0, self._round)
        if self.fabric_watch_s > 0:
            self.after(self.fabric_watch_s, self._watch_fabric)

    def _watch_fabric(self) -> None:
        """The probe's ``--fabric-watch``: a node whose fabric links changed since its last report is
        probed (and published) now."""
        try:
            for name, probe in list(self._probes.items()):
                telemetry = self.telemetry.get(name)
                if self._stopped.is_set() or telemetry is None or telemetry.missing or probe.previous is None:
                    continue
                if read_link_states(TelemetryIbReader(telemetry)) != link_states(probe.previous.ib_ports):
                    self._safely(lambda name=name: self.probe(name))
        finally:
            self.after(self.fabric_watch_s, self._watch_fabric)

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

    def probe(self, name: str, now: float | None = None) -> Writes | None:
        """Probe one node now (``now``: a simulated clock); what was written, None when nothing was probed."""
        telemetry = self.telemetry[name]
        if telemetry.missing:
            return None
        probe = self._probes.get(name)
        if probe is None or probe.boot_id != telemetry.boot_id:
            if probe:
                _close(probe.reader)
            probe = self._probes[name] = _NodeProbe(
                telemetry.boot_id,
                NvmlReader(FakeNvml(telemetry), xid_lookback_s=self.fault_window_s),
                Publisher(self.policy, **self.heartbeats),
            )
            probe.reader.start()
        report = collect_report(
            probe.reader,
            TelemetryIbReader(telemetry),
            name,
            speed_probe=telemetry.measure_speed if self.gemm else None,
            previous=probe.previous,
            now=now,
            window_s=self.fault_window_s,
        )
        probe.previous = report
        writes = probe.publisher.plan(report)
        try:
            self._apply(name, writes)
        except NotFound:  # the node object was deleted; its telemetry may outlive it
            return None
        probe.publisher.wrote(writes, report.collected_at)
        return writes

    def last_report(self, name: str) -> HealthReport | None:
        """The report last collected on node ``name`` (None before its first probe)."""
        probe = self._probes.get(name)
        return probe.previous if probe else None

    def _apply(self, name: str, writes: Writes) -> None:
        """What ``trainops.health.probe.publish`` writes through the API, into the store (nothing while
        its report's namespace does not exist: on a fresh cluster the probe's first write fails)."""
        report_namespace = (writes.configmap or {}).get("metadata", {}).get("namespace")
        if report_namespace and self.store.find("namespaces", "", report_namespace) is None:
            raise NotFound(f'namespaces "{report_namespace}" not found')
        if writes.condition is not None:

            def write(node: dict) -> None:
                annotations = node["metadata"].setdefault("annotations", {})
                annotations[HEALTH_SUMMARY_ANNOTATION] = writes.summary
                annotations.pop(LEGACY_REPORT_ANNOTATION, None)
                status = node.setdefault("status", {})
                status["conditions"] = replace_condition(status.get("conditions") or [], writes.condition)

            self.store.mutate("nodes", "", name, write)
        if writes.configmap is not None:
            body = writes.configmap
            meta = body["metadata"]
            if self.store.find("configmaps", meta["namespace"], meta["name"]) is None:
                self.store.create("configmaps", body)
            else:
                self.store.update("configmaps", body, check_version=False)

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
