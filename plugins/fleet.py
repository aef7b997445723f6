"""The fleet view's data: every GPU node's mode, holder, health and quarantine, GPU model and pool,
from one paginated node list (the health verdict is the node probe's summary annotation on the node
itself); and, answered apart so that a slow or absent Prometheus never holds the fleet back, every
node's tensor-core activity from one Prometheus query for the whole fleet.

Each row has a ``status`` that reads the verdict against the node's mode: an inference node whose
GPUs run the inference server is ``serving``, a training node whose GPUs train is ``training`` (the
policy warns of busy GPUs because the gate will drain them, not because anything is wrong). What is
left, ``attention``, is what needs a person: a quarantine, a failing or excluded node, a warning the
mode does not explain, a node without a report. Its ``findings`` are the summary's reasons, one per
policy row with every GPU or port it applies to, each marked ``expected`` when the mode explains it.
"""

from __future__ import annotations

import json
import math
import queue
import re
import threading
from collections import Counter
from typing import Any

from trainops.conventions import (
    FABRIC_LABEL,
    GPU_HEALTHY_CONDITION,
    GPU_POOL_LABEL,
    MODE_INFERENCE,
    MODE_TAINT,
    MODE_TRAINING,
    QUARANTINE_EVIDENCE_ANNOTATION,
    QUARANTINE_TAINT,
)
from trainops.health.hardware import GPU_PRODUCT_LABEL
from trainops.health.prometheus import PrometheusClient
from trainops.health.published import read_summary
from trainops.kube.client import Kube, json_of
from trainops.kube.lists import PAGE, list_all
from trainops.kube.nodes import NodeState, allocatable_gpus, holder_of, is_quarantined
from trainops.kube.retry import Deadline
from trainops.placement.request import DEFAULT_LEVELS, HOSTNAME_LABEL

LIST_DEADLINE_S = 60.0
# Policy rows that describe a node doing its mode's work (busy GPUs), not a fault: the gate drains them.
MODE_WORK = {MODE_INFERENCE: {"gpu_in_use", "tensor_busy"}, MODE_TRAINING: {"gpu_in_use", "tensor_busy"}}
HEALTHY_STATUS = {MODE_INFERENCE: "serving", MODE_TRAINING: "training"}  # other modes: "idle"
ATTENTION = ("quarantined", "failing", "excluded", "warn", "unknown")  # what needs a person
# The summary's reason lines: "<row>, <row> [<target>, <target>] <reason>" (trainops.health.policy)
FINDING = re.compile(r"^(?P<rows>[a-z0-9_]+(?:, [a-z0-9_]+)*) \[(?P<targets>[^\]]*)\] (?P<text>.*)$", re.S)
DEFAULT_POOL = "default"  # a node without the pool label (trainops.health.fabric)
# dcgm-exporter's profiling metric: the fraction of cycles the GPU's tensor pipes were busy
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"


def tensor_activity(prometheus: PrometheusClient) -> dict[str, float]:
    """Each node's tensor-core activity (0-1, the mean over its GPUs): one query for the whole fleet.
    Prometheus answers only for nodes with a sample in its lookback window; a value that is not a
    finite number is left out like a missing one."""
    activity = {}
    label = prometheus.node_label  # as the health gate keys its series
    for item in prometheus.query(f"avg by ({label}) ({TENSOR_ACTIVE})"):
        try:
            node, value = item["metric"][label], float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            activity[node] = round(value, 4)
    return activity


def cluster_fleet(kube: Kube) -> dict[str, Any]:
    """``fleet`` of every node of the cluster, listed ``PAGE`` per request; each page's rows are built
    while the API server prepares the next one (a thread lists, this one builds)."""
    pages: queue.Queue = queue.Queue()

    def fetch(token: str | None) -> dict:
        page = json_of(kube.core.list_node(limit=PAGE, _continue=token, _preload_content=False))
        pages.put(page.get("items") or [])
        return {"metadata": page.get("metadata") or {}}

    def list_in_thread() -> None:
        try:
            list_all(fetch, Deadline(LIST_DEADLINE_S), "list nodes")
            pages.put(None)
        except BaseException as error:  # handed to the caller below
            pages.put(error)

    threading.Thread(target=list_in_thread, name="fleet-list", daemon=True).start()
    rows: list[dict] = []
    while (page := pages.get()) is not None:
        if isinstance(page, BaseException):
            raise page
        rows += (row for node in page if (row := node_row(node)))
    return fleet_rows(rows)


def _quarantine(state: NodeState) -> dict | None:
    """Reason (the taint's value) and since when, for a node the core counts as quarantined (taint or label)."""
    if not is_quarantined(state):
        return None
    since = None
    try:
        since = json.loads(state.annotations.get(QUARANTINE_EVIDENCE_ANNOTATION, "{}")).get("quarantined_at")
    except (ValueError, AttributeError):
        pass
    taint = state.taint(QUARANTINE_TAINT)
    return {
        "reason": taint.get("value", "") if taint else "",
        "since": since if isinstance(since, int | float) else None,
    }


def _reported_at(node: dict) -> str | None:
    """When the node probe last wrote the node's verdict (its ``GPUHealthy`` condition's heartbeat)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    found = next((c for c in conditions if c.get("type") == GPU_HEALTHY_CONDITION), None)
    return found.get("lastHeartbeatTime") if found else None


def node_row(node: dict, levels: tuple[str, ...] = DEFAULT_LEVELS) -> dict[str, Any] | None:
    """The fleet row of ``node``; None for a node that is not a GPU node.  ``domain``: its place in the
    fabric, the values of the topology ``levels`` above the node (``["block-a", "rack-2"]``; None where
    a label is missing)."""
    meta = node.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    gpus = allocatable_gpus(node)
    if not gpus and GPU_POOL_LABEL not in labels:
        return None
    state = NodeState(meta.get("name"), labels, annotations, (node.get("spec") or {}).get("taints") or [])
    mode = (state.taint(MODE_TAINT) or {}).get("value") or "none"
    summary = read_summary(annotations)
    health = summary["verdict"] if summary else "unknown"
    reasons = (
        summary["reasons"] if summary else ["no health summary on the node (is the node probe running?)"]
    )
    found = findings(reasons, mode)
    quarantine = _quarantine(state)
    status = node_status(health, mode, found, quarantine is not None)
    return {
        "name": meta.get("name"),
        "mode": mode,
        "status": status,
        "attention": status in ATTENTION,
        "health": health,
        "reasons": reasons,
        "findings": found,
        "quarantine": quarantine,
        "claimed_by": holder_of(annotations),
        "gpus": gpus,
        "gpu_model": labels.get(GPU_PRODUCT_LABEL),
        "pool": labels.get(FABRIC_LABEL) or DEFAULT_POOL,
        "report": summary.get("report") if summary else None,
        "reported_at": _reported_at(node),
        "domain": [labels.get(level) for level in levels if level != HOSTNAME_LABEL],
    }


def node_status(health: str, mode: str, found: list[dict], quarantined: bool) -> str:
    """What the node is doing, or why it needs a person (one of ``ATTENTION``)."""
    if quarantined:
        return "quarantined"
    if health in ("quarantine", "exclude", "unknown"):
        return {"quarantine": "failing", "exclude": "excluded", "unknown": "unknown"}[health]
    if health != "ok" and not all(f["expected"] for f in found):
        return "warn"
    return HEALTHY_STATUS.get(mode, "idle")


def findings(reasons: list[str], mode: str) -> list[dict[str, Any]]:
    """The summary's reason lines as ``{"rows", "targets", "text", "expected"}``: ``targets`` lists every GPU
    or port the line applies to, once; ``expected`` when every row is the work of the node's mode.  A
    line in no known form (a report's own words, "(+2 more in the report)") is never expected."""
    work = MODE_WORK.get(mode, set())
    found = []
    for reason in reasons:
        match = FINDING.match(reason)
        if match is None:
            found.append({"rows": [], "targets": [], "text": reason, "expected": False})
            continue
        rows = match["rows"].split(", ")
        targets = [t for t in match["targets"].split(", ") if t]
        found.append({"rows": rows, "targets": targets, "text": match["text"], "expected": set(rows) <= work})
    return found


def fleet_rows(rows: list[dict]) -> dict[str, Any]:
    """``{"nodes": [...rows by name], "counts": {"total", "attention", "status", "mode", "health",
    "quarantined", "claimed"}, "blocks": {block: {"total", "free", "claimed", "quarantined"}}}``
    (``free``: healthy, neither claimed nor quarantined; the block is the widest topology level,
    ``(none)`` without it)."""
    rows.sort(key=lambda r: r["name"])
    blocks: dict[str, Counter] = {}
    for r in rows:
        block = blocks.setdefault((r["domain"] or [None])[0] or "(none)", Counter())
        block["total"] += 1
        block["claimed"] += bool(r["claimed_by"])
        block["quarantined"] += bool(r["quarantine"])
        block["free"] += not r["claimed_by"] and not r["quarantine"] and r["health"] in ("ok", "warn")
    return {
        "blocks": {
            name: {k: c[k] for k in ("total", "free", "claimed", "quarantined")}
            for name, c in sorted(blocks.items())
        },
        "nodes": rows,
        "counts": {
            "total": len(rows),
            "attention": sum(1 for r in rows if r["attention"]),
            "status": dict(Counter(r["status"] for r in rows)),
            "mode": dict(Counter(r["mode"] for r in rows)),
            "health": dict(Counter(r["health"] for r in rows)),
            "quarantined": sum(1 for r in rows if r["quarantine"]),
            "claimed": sum(1 for r in rows if r["claimed_by"]),
        },
    }
