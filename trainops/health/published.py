"""Where the node probe's results live: a compact summary on the node, the full report beside it.

The node object carries only what scheduling and people need: the ``GPUHealthy`` condition and
the annotation ``trainops.io/health-summary`` (verdict, first reasons, a digest of what the
verdict rests on, where the report is; at most ``SUMMARY_MAX_BYTES``). Every node write fans out
to every node watcher of the cluster (kube-scheduler, kube-proxy, CNI agents, autoscalers), so
the bulky report is kept off it, as node-problem-detector and NVSentinel do.

The full report is the ConfigMap ``node-health-<node>`` in namespace ``trainops-system`` (key
``report.json``, label ``trainops.io/node-health-report=true``): only trainops reads it, and the
gate lists all of them in one paginated list.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trainops.conventions import HEALTH_NAMESPACE, HEALTH_SUMMARY_ANNOTATION
from trainops.health.policy import NodeVerdict
from trainops.health.report import HealthReport

CONFIGMAP_PREFIX = "node-health-"
REPORT_KEY = "report.json"
REPORT_LABEL = "trainops.io/node-health-report"
REPORT_SELECTOR = f"{REPORT_LABEL}=true"
DIGEST_ANNOTATION = "trainops.io/health-digest"
SUMMARY_REASONS = 3
SUMMARY_REASON_CHARS = 200
SUMMARY_MAX_BYTES = 2048
MAX_NAME = 253


def configmap_name(node: str) -> str:
    """``node-health-<node>``; a name too long for the API gets a hash in place of its tail."""
    name = CONFIGMAP_PREFIX + node
    if len(name) <= MAX_NAME:
        return name
    tail = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11].rstrip('.-')}-{tail}"


def report_location(node: str) -> str:
    """``<namespace>/<configmap>``: where the full report of ``node`` is."""
    return f"{HEALTH_NAMESPACE}/{configmap_name(node)}"


def report_digest(verdict: NodeVerdict, speed: float | None, compared: list | None = None) -> str:
    """A short hash of what the gate decides on: each row that tripped, read unknown or does not
    apply, per target, the node's measured speed (3 significant digits; speed tiers group by it) and
    ``compared``: what the gate compares with the Node object (``expect.compared_with_node``).

    Readings that move without crossing a threshold (power, temperature, counters) leave it alone,
    so it changes only when the verdict, a thresholded signal, a count or the speed does.
    """
    basis = sorted((e["row"], e["target"], e["kind"], e["verdict"]) for e in verdict.evidence)
    shown_speed = None if speed is None else float(f"{speed:.3g}")
    body = json.dumps([verdict.verdict, basis, shown_speed, compared or []], default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def summary(verdict: NodeVerdict, digest: str) -> dict[str, Any]:
    """The node's compact summary: verdict, the first reasons (shortened), digest, report location."""
    reasons = [
        r if len(r) <= SUMMARY_REASON_CHARS else r[: SUMMARY_REASON_CHARS - 3] + "..."
        for r in verdict.reasons
    ]
    shown = reasons[:SUMMARY_REASONS]
    if len(reasons) > SUMMARY_REASONS:
        shown.append(f"(+{len(reasons) - SUMMARY_REASONS} more in the report)")
    body = {
        "verdict": verdict.verdict,
        "reasons": shown,
        "digest": digest,
        "report": report_location(verdict.name),
    }
    while len(summary_json(body)) > SUMMARY_MAX_BYTES and body["reasons"]:
        body["reasons"] = body["reasons"][:-1]
    return body


def summary_json(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def report_configmap(report: HealthReport, digest: str) -> dict[str, Any]:
    """The ConfigMap that holds ``report`` in full."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(report.node),
            "namespace": HEALTH_NAMESPACE,
            "labels": {REPORT_LABEL: "true"},
            "annotations": {DIGEST_ANNOTATION: digest},
        },
        "data": {REPORT_KEY: report.to_json()},
    }


def read_report(configmap: dict | None, name: str, now: float) -> HealthReport:
    """The report of node ``name`` held in ``configmap``; a report that knows nothing when absent or unreadable."""
    where = report_location(name)
    if configmap is None:
        return HealthReport.empty(name, now, "probe", f"no report at {where} (is the node probe running?)")
    text = (configmap.get("data") or {}).get(REPORT_KEY)
    if not isinstance(text, str):
        return HealthReport.empty(name, now, "probe", f"{where} has no {REPORT_KEY}")
    try:
        report = HealthReport.from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return HealthReport.empty(name, now, "probe", f"unreadable report at {where}: {err}")
    if report.node != name:
        return HealthReport.empty(name, now, "probe", f"{where} holds a report of node {report.node!r}")
    return report


def read_summary(annotations: dict | None) -> dict[str, Any] | None:
    """The node's health summary (``verdict``, ``reasons``, ``digest``, ``report``) from its annotations;
    None when the node has none, or one that is not a bounded JSON object with a string verdict."""
    text = (annotations or {}).get(HEALTH_SUMMARY_ANNOTATION)
    if not isinstance(text, str) or len(text) > 4 * SUMMARY_MAX_BYTES:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("verdict"), str):
        return None
    reasons = body.get("reasons")
    body["reasons"] = [str(r) for r in reasons] if isinstance(reasons, list) else []
    return body
