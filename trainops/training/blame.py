"""Quarantine a node blamed for a failed attempt, with the evidence, through ``edit_node``.

Interim: the health gate owns quarantine (DESIGN §2); when ``trainops.health`` offers its
quarantine function, this module should call it instead.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

from trainops.cluster.nodes import NodeState, edit_node, with_taint
from trainops.cluster.retry import Deadline
from trainops.conventions import HEALTH_LABEL, HEALTH_QUARANTINED, HEALTH_REPORT_ANNOTATION, QUARANTINE_TAINT

EDIT_DEADLINE_S = 60.0


def taint_value(reason: str) -> str:
    """A label-value-safe short reason for the taint (``xid-79``, ``node-not-ready``)."""
    value = re.sub(r"[^A-Za-z0-9.-]+", "-", reason.lower()).strip("-.")[:63].strip("-.")
    return value or "training-failure"


def quarantine_node(core_v1, node: str, reason: str, evidence: dict) -> bool:
    """Taint, label and annotate ``node`` as quarantined; returns whether it wrote anything.
    A node already quarantined keeps its first evidence (nothing un-quarantines silently)."""
    report = json.dumps({"source": "trainops.training", "time": time.time(), "reason": reason, **evidence})

    def change(state: NodeState) -> NodeState:
        if state.labels.get(HEALTH_LABEL) == HEALTH_QUARANTINED and state.taint(QUARANTINE_TAINT):
            return state
        tainted = with_taint(
            state, {"key": QUARANTINE_TAINT, "value": taint_value(reason), "effect": "NoSchedule"}
        )
        return replace(
            tainted,
            labels={**state.labels, HEALTH_LABEL: HEALTH_QUARANTINED},
            annotations={**state.annotations, HEALTH_REPORT_ANNOTATION: report},
        )

    return edit_node(core_v1, node, change, Deadline(EDIT_DEADLINE_S)).wrote
