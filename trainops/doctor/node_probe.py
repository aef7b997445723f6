"""The node probe: its DaemonSet has a ready pod on every GPU node, and every GPU node's report is
fresh where the gate reads it (ConfigMap ``trainops-system/node-health-<node>``, trainops.health.published).

GPU nodes are the gate's candidates (``--selector``, ``trainops.io/gpu-pool=true`` by default).  A
node without a probe pod is explained from the DaemonSet's own placement rules: a label its
nodeSelector wants, a taint it does not tolerate, or a pod that is not ready.
"""

from __future__ import annotations

import time

from trainops.conventions import HEALTH_NAMESPACE
from trainops.doctor.gpu_operator import CLIENT_LABEL, PAUSED, probe_daemon_set
from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome, Problem
from trainops.health.policy import DEFAULT_POLICY
from trainops.health.published import REPORT_SELECTOR, configmap_name, read_report
from trainops.kube.client import CONFIGMAPS, NODES, PODS
from trainops.placement.scheduling import node_taints, selects, untolerated

# who sets the labels the shipped DaemonSet selects on
LABEL_SETTERS = {
    "nvidia.com/gpu.present": "GPU Feature Discovery sets it",
    CLIENT_LABEL: "GPU Operator sets it from v26.7.0",
}
APPLY_PROBE = "kubectl apply -f deploy/node-probe.yaml (or name yours: --probe-daemonset NAMESPACE/NAME)"
REPORT_AGE_S = next(row.threshold for row in DEFAULT_POLICY.rows if row.name == "report_age")


def gpu_nodes(reads: Reads, config) -> list[dict]:
    """The gate's candidate nodes."""
    return reads.shared(
        "gpu nodes",
        lambda: reads.list(NODES, labels=config.selector),
    )


def no_gpu_nodes(config) -> Problem:
    return Problem(
        f"no node matches {config.selector!r}: the health gate has no candidates",
        f"label the GPU nodes ({config.selector}; README: Point it at a real cluster), or pass --selector",
    )


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return status.get("phase") == "Running" and ready


def _not_running(namespace: str, name: str, template: dict, node: dict, pod: dict | None) -> Problem:
    """Why ``node`` has no ready probe, by the DaemonSet's own placement rules, and the fix."""
    spec, node_name = template.get("spec") or {}, node["metadata"]["name"]
    if not selects(spec, node):
        labels = node["metadata"].get("labels") or {}
        wanted = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if labels.get(k) != v}
        want = " ".join(f"{k}={v}" for k, v in wanted.items())
        if any(labels.get(k) == PAUSED for k in wanted):
            return Problem(
                f"{node_name}: no probe pod: GPU Operator's driver manager paused it for a driver upgrade "
                f"({CLIENT_LABEL}={PAUSED}); its report goes stale meanwhile",
                "wait for the upgrade: the driver manager sets the label back to true and the probe returns",
            )
        setters = ", ".join(f"{k}: {LABEL_SETTERS[k]}" for k in wanted if k in LABEL_SETTERS)
        return Problem(
            f"{node_name}: no probe pod: the node does not match the DaemonSet's {want or 'required node affinity'}",
            f"kubectl label node {node_name} {want}{f' ({setters})' if setters else ''}, or widen the "
            "DaemonSet's nodeSelector"
            if want
            else "widen the DaemonSet's node affinity to GPU nodes",
        )
    blocked = untolerated(spec.get("tolerations") or [], node_taints(node))
    if blocked:
        return Problem(
            f"{node_name}: no probe pod: the DaemonSet does not tolerate the node's taint {blocked[0]}",
            "tolerate every taint, as deploy/node-probe.yaml does ({operator: Exists})",
        )
    if pod is not None:
        status = pod.get("status") or {}
        waiting = [
            (c.get("state") or {}).get("waiting", {}).get("reason")
            for c in status.get("containerStatuses") or []
        ]
        why = ", ".join(w for w in waiting if w)
        return Problem(
            f"{node_name}: probe pod {pod['metadata']['name']} is {status.get('phase', 'Pending')}, not ready"
            + (f" ({why})" if why else ""),
            f"kubectl describe pod -n {namespace} {pod['metadata']['name']}",
        )
    return Problem(
        f"{node_name}: no probe pod: the DaemonSet has not created one",
        f"kubectl describe daemonset -n {namespace} {name}: its events name the refusal (Pod Security, a "
        "RuntimeClass, a quota)",
    )


def check_daemon_set(reads: Reads, config) -> Outcome:
    namespace, name = config.probe
    daemon_set = probe_daemon_set(reads, config)
    if daemon_set is None:
        return Outcome(
            f"no DaemonSet {namespace}/{name}",
            [
                Problem(
                    f"DaemonSet {namespace}/{name} does not exist: no node publishes a health report, "
                    "so the gate finds every node unknown",
                    APPLY_PROBE,
                )
            ],
        )
    nodes = gpu_nodes(reads, config)
    if not nodes:
        return Outcome("no GPU nodes", [no_gpu_nodes(config)])
    match = ",".join(
        f"{k}={v}" for k, v in ((daemon_set["spec"].get("selector") or {}).get("matchLabels") or {}).items()
    )
    uid = daemon_set["metadata"].get("uid")
    pods = [
        p
        for p in reads.list(PODS, namespace, labels=match)
        if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])
    ]
    on_node = {(p.get("spec") or {}).get("nodeName"): p for p in sorted(pods, key=_ready)}  # a ready one wins
    template = daemon_set["spec"].get("template") or {}
    problems = []
    for node in nodes:
        node_name = node["metadata"]["name"]
        pod = on_node.get(node_name)
        if pod is not None and _ready(pod):
            continue
        problems.append(_not_running(namespace, name, template, node, pod))
    ready = len(nodes) - len(problems)
    return Outcome(
        f"DaemonSet {namespace}/{name}: a ready probe on {ready} of {len(nodes)} GPU node(s)", problems
    )


def check_reports(reads: Reads, config) -> Outcome:
    nodes = gpu_nodes(reads, config)
    if not nodes:
        return Outcome("no GPU nodes", [no_gpu_nodes(config)])
    held = {
        cm["metadata"]["name"]: cm for cm in reads.list(CONFIGMAPS, HEALTH_NAMESPACE, labels=REPORT_SELECTOR)
    }
    namespace, name = config.probe
    logs = f"kubectl logs -n {namespace} the {name} pod on that node: it says why it cannot read or publish"
    now, problems = time.time(), []
    for node in nodes:
        node_name = node["metadata"]["name"]
        report = read_report(held.get(configmap_name(node_name)), node_name, now)
        count = report.signals.get("gpu_count")
        if count is not None and not count.known:
            problems.append(Problem(f"{node_name}: {count.reason}", logs))
        elif now - report.collected_at > REPORT_AGE_S:
            problems.append(
                Problem(
                    f"{node_name}: its report is {now - report.collected_at:.0f}s old (the gate excludes a "
                    f"node whose report is older than {REPORT_AGE_S}s)",
                    logs,
                )
            )
    fresh = len(nodes) - len(problems)
    return Outcome(
        f"{fresh} of {len(nodes)} GPU node(s) have a fresh report in {HEALTH_NAMESPACE} (at most {REPORT_AGE_S}s old)",
        problems,
    )
