"""Quarantine a failing node, and release it only after a fresh report passes.

A quarantined node carries the taint ``trainops.io/quarantine=<rows>:NoSchedule`` (the policy rows
that tripped), the label ``trainops.io/health=quarantined`` and the evidence as JSON in the
annotation ``trainops.io/quarantine-evidence``. Every write goes through ``edit_node`` (one merge
patch guarded by resourceVersion, foreign taints kept). Quarantining a node that already carries
the taint changes nothing: the first evidence stays.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from typing import Any

from trainops.conventions import (
    HEALTH_LABEL,
    HEALTH_QUARANTINED,
    QUARANTINE_EVIDENCE_ANNOTATION,
    QUARANTINE_TAINT,
)
from trainops.errors import TemporaryError
from trainops.health.gate import GateConfig, GateResult, NodeResult, run_gate
from trainops.health.policy import DEFAULT_POLICY, Policy
from trainops.health.prometheus import PrometheusClient
from trainops.health.published import report_location
from trainops.health.stragglers import USABLE
from trainops.kube.nodes import NodeState, edit_node, with_taint, without_taint
from trainops.kube.retry import Deadline

EVIDENCE_ANNOTATION = QUARANTINE_EVIDENCE_ANNOTATION
MAX_EVIDENCE = 16


def taint_value(reason: str) -> str:
    """``reason`` as a taint value (label-value syntax, <= 63 characters): ``xid_fatal.gpu_lost``, ``xid-79``."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:63]
    return value.strip("._-") or "health-check-failed"


def quarantine_node(
    core_v1: Any,
    node: str,
    reason: str,
    evidence: dict[str, Any],
    deadline: Deadline,
    current: dict | None = None,
) -> bool:
    """Taint, label and annotate ``node`` as quarantined with ``evidence``; True when this call wrote.

    Idempotent: a node already quarantined keeps its taint and its first evidence.
    """
    taint = {"key": QUARANTINE_TAINT, "value": taint_value(reason), "effect": "NoSchedule"}
    record = json.dumps(evidence, sort_keys=True, default=str)

    def change(state: NodeState) -> NodeState:
        if state.taint(QUARANTINE_TAINT) is None:
            state = with_taint(state, taint)
        labels = {**state.labels, HEALTH_LABEL: HEALTH_QUARANTINED}
        annotations = {EVIDENCE_ANNOTATION: record, **state.annotations}  # the first evidence stays
        return replace(state, labels=labels, annotations=annotations)

    return edit_node(core_v1, node, change, deadline, current=current).wrote


def evidence(result: NodeResult, now: float) -> dict[str, Any]:
    """What the node's quarantine annotation records: the rows that tripped (at most ``MAX_EVIDENCE``)
    and where the full report is; kept small, since it lives on the node object."""
    tripped = [e for e in result.policy.evidence if e["verdict"] == "quarantine"]
    return {
        "quarantined_at": now,
        "source": "trainops.health.gate",
        "verdict": result.policy.verdict,
        "reasons": result.policy.reasons,
        "evidence": tripped[:MAX_EVIDENCE],
        "evidence_left_out": max(0, len(tripped) - MAX_EVIDENCE),
        "report": {
            "source": result.report.source,
            "collected_at": result.report.collected_at,
            "at": report_location(result.name),  # the full report, as the probe keeps publishing it
        },
    }


def quarantine(core_v1: Any, result: NodeResult, deadline: Deadline, now: float | None = None) -> bool:
    """Quarantine the node of a failing gate ``result``; True when this call wrote to it."""
    rows = sorted({e["row"] for e in result.policy.evidence if e["verdict"] == "quarantine"})
    record = evidence(result, time.time() if now is None else now)
    return quarantine_node(core_v1, result.name, ".".join(rows), record, deadline, current=result.node)


def apply_quarantine(core_v1: Any, result: GateResult, deadline: Deadline) -> list[str]:
    """Quarantine every node the gate found failing; returns the nodes written now."""
    return [n.name for n in result.to_quarantine if quarantine(core_v1, n, deadline)]


class ReleaseRefused(TemporaryError):
    """The node still fails (or has no report since its quarantine); it stays quarantined."""


@dataclass
class Released:
    node: str
    released: bool  # False: the node was not quarantined
    verdict: str
    reasons: list[str]


def release(
    core_v1: Any,
    name: str,
    deadline: Deadline,
    *,
    policy: Policy = DEFAULT_POLICY,
    prometheus: PrometheusClient | None = None,
    on_unavailable: str = "fail",
    now: float | None = None,
) -> Released:
    """Re-check a quarantined node and lift the quarantine only when a report newer than it passes.

    Raises ReleaseRefused (naming why) otherwise, GateError when Prometheus is required and unreachable.
    """
    config = GateConfig(node_names=(name,), policy=policy, speed_tiers=False, on_unavailable=on_unavailable)
    checked = run_gate(core_v1, config, prometheus=prometheus, now=now).nodes[0]
    if checked.node is None:
        raise ReleaseRefused(f"node {name} not found")
    state = NodeState.of(checked.node)
    if state.taint(QUARANTINE_TAINT) is None and state.labels.get(HEALTH_LABEL) != HEALTH_QUARANTINED:
        return Released(name, False, checked.policy.verdict, checked.policy.reasons)
    if checked.policy.verdict not in USABLE:
        raise ReleaseRefused(
            f"node {name} still fails its health checks ({checked.policy.verdict}): "
            + "; ".join(checked.policy.reasons)
        )
    since = _quarantined_at(state)
    if checked.report.collected_at <= since:
        raise ReleaseRefused(
            f"node {name}: no health report since its quarantine (report from {checked.report.collected_at:.0f}, "
            f"quarantined at {since:.0f}); wait for the node probe to publish a new one"
        )

    def lift(current: NodeState) -> NodeState:
        current = without_taint(current, QUARANTINE_TAINT)
        labels = {k: v for k, v in current.labels.items() if k != HEALTH_LABEL}
        annotations = {k: v for k, v in current.annotations.items() if k != EVIDENCE_ANNOTATION}
        return replace(current, labels=labels, annotations=annotations)

    edit_node(core_v1, name, lift, deadline, current=checked.node)
    return Released(name, True, checked.policy.verdict, checked.policy.reasons)


def _quarantined_at(state: NodeState) -> float:
    """When the node was quarantined, from its evidence (0 when there is none to read)."""
    try:
        return float(json.loads(state.annotations.get(EVIDENCE_ANNOTATION, "{}")).get("quarantined_at", 0))
    except (ValueError, TypeError, AttributeError):
        return 0.0
