"""The health gate, Airflow-free: which candidate nodes a run may have, and which must be quarantined.

It lists the candidate nodes by label selector (paginated), reads the report each node probe
published (ConfigMaps ``trainops-system/node-health-<node>``, listed in pages), fills what the
probe could not read from dcgm-exporter metrics (a handful of fleet-wide Prometheus queries, never one per node), applies
the policy and gives the run nodes of one speed tier. It only reads; :func:`apply_quarantine`
then writes the quarantines (see ``quarantine.py``).

    result = run_gate(core_v1, GateConfig(min_nodes=8), prometheus=PrometheusClient(url))
    apply_quarantine(core_v1, result, Deadline(60))
    print(result.table())

A node with no report, an unreadable one or a stale one is unknown, never healthy. A node already
quarantined is never chosen, whatever its report says now: ``trainops health release`` re-checks it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trainops.conventions import (
    GPU_POOL_LABEL,
    HEALTH_NAMESPACE,
    QUARANTINE_TAINT,
)
from trainops.errors import TemporaryError
from trainops.health.expect import family
from trainops.health.memory import MemoryFit
from trainops.health.policy import DEFAULT_POLICY, NodeVerdict, Policy, evaluate
from trainops.health.prometheus import (
    FleetMetrics,
    PrometheusClient,
    PrometheusError,
    fleet_reports,
    label_mismatch,
)
from trainops.health.published import REPORT_SELECTOR, configmap_name, read_report, report_location
from trainops.health.report import HealthReport, Signal, merge_reports
from trainops.health.stragglers import UNKNOWN_SPEED, USABLE, Selection, choose_nodes, node_speed
from trainops.kube.client import json_of
from trainops.kube.lists import list_all
from trainops.kube.nodes import NodeState, allocatable_gpus
from trainops.kube.retry import Deadline, call
from trainops.placement.nodes import place_nodes
from trainops.placement.place import Placement
from trainops.placement.request import TopologyRequest

DEFAULT_SELECTOR = f"{GPU_POOL_LABEL}=true"
ON_UNAVAILABLE = ("fail", "probe-only")
SIDES = {
    "gpu": ("gpu", {"report_age", "gpu_count", "gpus_missing"}),
    "fabric": ("ib_port", {"report_age", "ib_port_count", "ib_ports_missing"}),
}


class GateError(TemporaryError):
    """The gate cannot decide, e.g. Prometheus is required and unreachable."""


@dataclass(frozen=True)
class GateConfig:
    """What to gate and how.

    ``node_names``: only these nodes (each read by name; for large fleets use ``selector``).
    ``gpus_per_node``: a node with fewer allocatable GPUs is excluded; when no candidate has that
    many, or fewer nodes than ``min_nodes`` match ``selector``, the gate raises ValueError at once
    (waiting for repairs cannot help).
    ``on_unavailable``: when Prometheus is given but cannot be read, ``fail`` raises GateError,
    ``probe-only`` gates on the probe reports alone and says so in ``GateResult.warnings``.
    ``speed_tiers``: choose nodes of like measured speed (the probe's GEMM speed, timed once per
    boot on idle GPUs). ``unknown_speed``: ``group`` (default) keeps nodes of unknown speed as a
    group of their own, chosen when no measured tier is large enough; ``exclude`` leaves them out.
    ``topology``: the chosen nodes must also hold the run (``min_nodes - spares`` nodes) in one domain of
    the requested level (``required``: else not enough, the reason shown), or as few as can be
    (``preferred``); ``GateResult.placement`` says where (``trainops.placement``).
    ``memory``: the run's GPU memory need; a risk on the chosen nodes is one of ``GateResult.warnings``
    (``trainops.health.memory``).
    """

    selector: str = DEFAULT_SELECTOR
    node_names: tuple[str, ...] = ()
    min_nodes: int = 1
    gpus_per_node: int | None = None
    policy: Policy = DEFAULT_POLICY
    speed_tiers: bool = True
    unknown_speed: str = "group"
    on_unavailable: str = "fail"
    page_size: int = 500
    api_deadline_s: float = 60.0
    topology: TopologyRequest = TopologyRequest()
    spares: int = 0
    memory: MemoryFit | None = None

    def __post_init__(self) -> None:
        if not _is_count(self.min_nodes):
            raise ValueError(f"min_nodes must be an integer >= 1, got {self.min_nodes!r}")
        if self.gpus_per_node is not None and not _is_count(self.gpus_per_node):
            raise ValueError(f"gpus_per_node must be an integer >= 1 or None, got {self.gpus_per_node!r}")
        if self.on_unavailable not in ON_UNAVAILABLE:
            raise ValueError(
                f"on_unavailable must be one of {', '.join(ON_UNAVAILABLE)}, got {self.on_unavailable!r}"
            )
        if self.unknown_speed not in UNKNOWN_SPEED:
            raise ValueError(
                f"unknown_speed must be one of {', '.join(UNKNOWN_SPEED)}, got {self.unknown_speed!r}"
            )
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if not isinstance(self.spares, int) or not 0 <= self.spares < self.min_nodes:
            raise ValueError(f"spares must be an integer from 0 to min_nodes - 1, got {self.spares!r}")
        object.__setattr__(self, "node_names", tuple(self.node_names))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def side_policy(policy: Policy, side: str) -> Policy:
    """Only the rows of one side: ``gpu`` (GPU rows, GPU count) or ``fabric`` (InfiniBand rows, port count)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    scope, node_rows = SIDES[side]
    return Policy(tuple(row for row in policy.rows if row.scope == scope or row.name in node_rows))


@dataclass
class NodeResult:
    """One candidate: its verdict for this run, the reasons, and what they rest on."""

    name: str
    verdict: str
    reasons: list[str]
    policy: NodeVerdict  # the policy's verdict with all evidence
    report: HealthReport
    quarantined: bool  # already carries the quarantine taint
    node: dict | None  # the node as read (None: not found)
    speed: float | None = None


@dataclass
class GateResult:
    nodes: list[NodeResult]
    selection: Selection
    min_nodes: int
    selector: str
    sources: list[str]
    warnings: list[str] = field(default_factory=list)
    # which source gave what: {"probe": {"nodes": n}, "prometheus": {"node_label", "nodes",
    # "filled": {signal: GPUs or ports it filled}, "not_exported": {metric: how to enable it}}}
    signal_sources: dict[str, Any] = field(default_factory=dict)
    placement: Placement | None = None  # where the run would go, when a topology is asked for

    @property
    def selected(self) -> list[str]:
        return self.selection.node_names if self.enough else []

    @property
    def enough(self) -> bool:
        placed = self.placement is None or self.placement.fits or not self.placement.request.required
        return self.selection.enough and placed

    @property
    def to_quarantine(self) -> list[NodeResult]:
        """Nodes the policy quarantines that do not carry the quarantine taint yet."""
        return [n for n in self.nodes if n.policy.verdict == "quarantine" and not n.quarantined and n.node]

    def missing(self) -> str | None:
        """Why the run cannot have ``min_nodes`` nodes (None when it can)."""
        if self.enough:
            return None
        if self.selection.enough:
            return f"placement ({self.placement.request.describe()}): {self.placement.reason}"
        usable = self.selection.node_names
        left_out = [n for n in self.nodes if n.name not in usable]
        listed = "; ".join(
            f"{n.name}: {n.verdict}: {n.reasons[0] if n.reasons else ''}" for n in left_out[:20]
        )
        more = f"; and {len(left_out) - 20} more" if len(left_out) > 20 else ""
        return (
            f"need {self.min_nodes} healthy node(s), have {len(usable)} of {len(self.nodes)} candidate(s) "
            f"(selector {self.selector!r}). Left out: {listed or 'none'}{more}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "name": n.name,
                    "verdict": n.verdict,
                    "reasons": n.reasons,
                    "not_applicable": n.policy.not_applicable,
                }
                for n in self.nodes
            ],
            "selected": self.selected,
            "enough": self.enough,
            "min_nodes": self.min_nodes,
            "missing": self.missing(),
            "tier": list(self.selection.tier) if self.selection.tier else None,
            "group": self.selection.group,
            "speed_unknown": self.selection.speed_unknown,
            "sources": self.sources,
            "signal_sources": self.signal_sources,
            "warnings": self.warnings,
            "placement": self.placement.to_dict() if self.placement else None,
        }

    def table(self) -> str:
        """A readable table: one line per node, the first reason, then a summary."""
        chosen = set(self.selected)
        rows = [("NODE", "VERDICT", "CHOSEN", "SPEED", "REASON")]
        for n in self.nodes:
            reason = (n.reasons[0] if n.reasons else "") + (
                f" (+{len(n.reasons) - 1} more)" if len(n.reasons) > 1 else ""
            )
            speed = f"{n.speed:.1f}" if n.speed is not None else "-"
            rows.append((n.name, n.verdict, "yes" if n.name in chosen else "no", speed, reason))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
        tier = self.selection.tier
        summary = (
            f"{len(self.selected)} of {len(self.nodes)} node(s) chosen (need {self.min_nodes})"
            + (f", speed tier {tier[0]:.1f}-{tier[1]:.1f}" if tier else f", {self.selection.group}")
            + (
                f", {len(self.selection.speed_unknown)} of unknown speed"
                if self.selection.speed_unknown
                else ""
            )
            + f"; sources: {'+'.join(self.sources)}"
        )
        if self.placement is not None and self.enough:
            summary += f"; placement ({self.placement.request.describe()}): {self.placement.reason}"
        lines.append(summary if self.enough else f"NOT ENOUGH: {self.missing()}")
        lines += self._source_lines()
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(line.rstrip() for line in lines)

    def _source_lines(self) -> list[str]:
        """What Prometheus gave, and what dcgm-exporter does not export and how to enable it."""
        prometheus = self.signal_sources.get("prometheus")
        if not prometheus:
            return []
        filled = ", ".join(f"{name} x{n}" for name, n in prometheus["filled"].items()) or "nothing"
        label = prometheus["node_label"]
        lines = [f"Prometheus (node label {label!r}) filled what the probe lacked: {filled}"]
        by_hint: dict[str, list[str]] = {}
        for metric, hint in prometheus["not_exported"].items():
            by_hint.setdefault(hint, []).append(metric)
        lines += [
            f"NOT EXPORTED by dcgm-exporter: {', '.join(names)} ({hint})" for hint, names in by_hint.items()
        ]
        return lines


def run_gate(
    core_v1: Any, config: GateConfig, *, prometheus: PrometheusClient | None = None, now: float | None = None
) -> GateResult:
    """Evaluate the candidates (reads only). ``core_v1``: a ``kubernetes.client.CoreV1Api``."""
    now = time.time() if now is None else now
    deadline = Deadline(config.api_deadline_s)
    pool = ThreadPoolExecutor(1, thread_name_prefix="gate-prometheus")
    read = None
    if prometheus is not None:
        read = functools.partial(
            fleet_reports, prometheus, now=now, fault_window_s=config.policy.fault_window_s
        )
    try:
        with gc_paused():
            # The fleet-wide queries run while the nodes and their reports are read and decoded.
            metrics = pool.submit(read) if read is not None else None
            return _run_gate(core_v1, config, metrics, read, now, deadline)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _run_gate(
    core_v1: Any,
    config: GateConfig,
    metrics: Future[FleetMetrics] | None,
    read: Callable[..., FleetMetrics] | None,
    now: float,
    deadline: Deadline,
) -> GateResult:
    listed = {node["metadata"]["name"]: node for node in candidate_nodes(core_v1, config, deadline)}
    if not config.node_names:
        check_fleet(list(listed.values()), config)
    names = list(config.node_names) or sorted(listed)
    held = published_configmaps(core_v1, config, names, deadline)
    reports = {name: read_report(held.get(configmap_name(name)), name, now) for name in names}
    sources, warnings = ["probe"], []
    signal_sources: dict[str, Any] = {
        "probe": {"nodes": sum(1 for r in reports.values() if r.signals["gpu_count"].known)}
    }
    if metrics is not None and read is not None:
        try:
            fleet = metrics.result()
            better = fleet.label_for(names)
            if better is not None and better != fleet.label:  # dcgm-exporter names nodes in another label
                fleet = read(label=better)
            filled: Counter = Counter()
            reports = {name: merge_reports(reports[name], fleet.report(name), filled) for name in names}
            sources.append("prometheus")
            signal_sources["prometheus"] = {
                "node_label": fleet.label,
                "nodes": sum(1 for name in names if name in fleet.reports),
                "filled": dict(sorted(filled.items())),
                "not_exported": fleet.missing(),
            }
            if mismatch := label_mismatch(fleet, names, read.args[0].node_label):
                warnings.append(mismatch)
        except PrometheusError as err:
            if config.on_unavailable == "fail":
                raise GateError(
                    f"{err}. The gate does not pass nodes without it; to gate on the node probe's reports "
                    "alone, set on_unavailable='probe-only' (CLI: --prometheus-optional)."
                ) from err
            warnings.append(f"Prometheus unavailable, gated on the node probe's reports alone: {err}")
    results = [judge(name, listed.get(name), reports[name], config, now) for name in names]
    speeds = {r.name: r.speed for r in results if r.verdict in USABLE} if config.speed_tiers else {}
    verdicts = [NodeVerdict(r.name, r.verdict, r.reasons) for r in results]
    families = {r.name: family(r.report, r.node) for r in results if r.name in speeds}
    selection = choose_nodes(
        verdicts, speeds, config.min_nodes, unknown_speed=config.unknown_speed, families=families
    )
    for r in results:
        if r.verdict in USABLE and r.name in selection.excluded:
            r.verdict = "exclude"
            r.reasons = [selection.excluded[r.name].removeprefix("exclude: "), *r.reasons]
    result = GateResult(
        results, selection, config.min_nodes, config.selector, sources, warnings, signal_sources
    )
    if config.topology.active and selection.enough:
        chosen = set(selection.node_names)
        nodes = [r.node for r in results if r.name in chosen and r.node]
        result.placement = place_nodes(
            nodes, config.min_nodes - config.spares, config.topology, spares=config.spares
        )
    if config.memory is not None and result.enough:
        chosen = set(result.selected)
        if risk := config.memory.risk([r.node for r in results if r.name in chosen and r.node]):
            result.warnings.append(risk)
    return result


def check_fleet(nodes: list[dict], config: GateConfig) -> None:
    """Raise ValueError, naming the field, when the candidates can never hold the run however healthy
    they become: fewer than ``min_nodes``, or none with ``gpus_per_node`` allocatable GPUs."""
    if len(nodes) < config.min_nodes:
        raise ValueError(
            f"min_nodes: {config.min_nodes} node(s) needed, but the cluster has {len(nodes)} node(s) "
            f"matching {config.selector!r}; ask for fewer nodes"
        )
    most = max((allocatable_gpus(node) for node in nodes), default=0)
    if config.gpus_per_node is not None and most < config.gpus_per_node:
        raise ValueError(
            f"gpus_per_node: {config.gpus_per_node} asked, but no node matching {config.selector!r} "
            f"has more than {most} GPUs"
        )


def judge(name: str, node: dict | None, report: HealthReport, config: GateConfig, now: float) -> NodeResult:
    """One candidate's result: the policy over its report and Node object, then what the node itself
    rules out (not found, already quarantined, too few allocatable GPUs for the run). A report whose
    values the policy cannot compare (a string where a count belongs) excludes its node alone."""
    try:
        verdict = evaluate(report, config.policy, now=now, node=node)
        speed = node_speed(report)
    except (TypeError, ValueError) as err:
        where = report_location(name)
        reason = f"unreadable report at {where}: {err}; check the node probe on {name}"
        verdict, speed = NodeVerdict(name, "exclude", [reason]), Signal.unknown(reason)
    result = NodeResult(
        name,
        verdict.verdict,
        list(verdict.reasons),
        verdict,
        report,
        False,
        node,
        speed.value if speed.known else None,
    )
    if node is None:
        result.verdict, result.reasons = "exclude", ["node not found"]
        return result
    taint = NodeState.of(node).taint(QUARANTINE_TAINT)
    if taint is not None:
        result.quarantined = True
        if verdict.verdict != "quarantine":
            held = f"quarantined ({QUARANTINE_TAINT}={taint.get('value', '')}); `trainops health release {name}` re-checks it"
            result.verdict, result.reasons = "exclude", [held, *verdict.reasons]
    gpus = allocatable_gpus(node)
    if result.verdict in USABLE and config.gpus_per_node is not None and gpus < config.gpus_per_node:
        short = f"{gpus} allocatable GPUs, the run needs {config.gpus_per_node} per node"
        result.verdict, result.reasons = "exclude", [short, *verdict.reasons]
    return result


def candidate_nodes(core_v1: Any, config: GateConfig, deadline: Deadline) -> list[dict]:
    """The named nodes (one GET each), or every node matching the selector (paginated list)."""
    if not config.node_names:
        return list_paginated(core_v1.list_node, config.selector, config.page_size, deadline, "nodes")
    found = (
        _get(lambda name=name: core_v1.read_node(name, _preload_content=False), deadline, f"read node {name}")
        for name in config.node_names
    )
    return [node for node in found if node is not None]


def published_configmaps(
    core_v1: Any, config: GateConfig, names: list[str], deadline: Deadline
) -> dict[str, dict]:
    """The probes' report ConfigMaps by name: each named node's (one GET each), or all of them (paginated)."""
    if not config.node_names:
        lister = functools.partial(core_v1.list_namespaced_config_map, HEALTH_NAMESPACE)
        found = list_paginated(lister, REPORT_SELECTOR, config.page_size, deadline, "node health reports")
        return {cm["metadata"]["name"]: cm for cm in found}
    wanted = [configmap_name(name) for name in names]
    read = core_v1.read_namespaced_config_map
    found = {
        cm: _get(lambda cm=cm: read(cm, HEALTH_NAMESPACE, _preload_content=False), deadline, f"read {cm}")
        for cm in wanted
    }
    return {cm: body for cm, body in found.items() if body is not None}


def _get(read: Any, deadline: Deadline, what: str) -> dict | None:
    """``read()`` decoded, with the retry policy; None on 404."""
    from kubernetes.client.exceptions import ApiException

    try:
        return call(lambda: json_of(read()), deadline, what)
    except ApiException as err:
        if err.status != 404:
            raise
        return None


def list_paginated(lister: Any, selector: str, page_size: int, deadline: Deadline, what: str) -> list[dict]:
    """Every object ``lister`` (e.g. ``core_v1.list_node``) returns for ``selector``, ``page_size`` per request."""

    def fetch(token: str | None) -> dict:
        return json_of(
            lister(label_selector=selector, limit=page_size, _continue=token, _preload_content=False)
        )

    return list_all(fetch, deadline, f"list {what}")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage-collection passes inside: a gate builds millions of short-lived containers, and each
    pass would walk all of them (4,096 nodes: 2.0 s instead of 3.1-3.6 s). Collection resumes (as it
    was) on the way out. The pause is process-wide: in a triggerer every other trigger's cyclic
    garbage waits those seconds too, which holds memory a little longer and changes nothing else."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
