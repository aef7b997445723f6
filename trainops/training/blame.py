"""Quarantine a node blamed for a failed attempt, with the evidence (the health gate's quarantine)."""

from __future__ import annotations

import re
import time

from trainops.health.quarantine import quarantine_node as quarantine
from trainops.kube.retry import Deadline

EDIT_DEADLINE_S = 60.0
_CODES = (
    ("node not Ready", "node-not-ready"),
    ("node object is gone", "node-lost"),
    ("GPUHealthy=False", "gpu-unhealthy"),
    ("GPU(s) unhealthy", "gpu-unhealthy"),
)


def reason_code(problems: str) -> str:
    """A short taint value for the problems found (an XID first, wherever it is named):
    ``xid-79``, ``node-not-ready``, ``node-lost``, ``gpu-unhealthy``."""
    if xid := re.search(r"XID (\d+)|xid_events=\[(\d+)", problems):
        return f"xid-{xid.group(1) or xid.group(2)}"
    return next((code for marker, code in _CODES if marker in problems), "training-failure")


def quarantine_node(core_v1, node: str, reason: str, evidence: dict, current: dict | None = None) -> bool:
    """Quarantine ``node`` for ``reason`` with ``evidence``; returns whether it wrote anything.
    A node already quarantined keeps its first evidence (nothing un-quarantines silently).
    ``current``: the node as just read, to save the first GET (a stale copy costs one retry)."""
    record = {"source": "trainops.training", "quarantined_at": time.time(), "reason": reason, **evidence}
    return quarantine(core_v1, node, reason_code(reason), record, Deadline(EDIT_DEADLINE_S), current=current)
