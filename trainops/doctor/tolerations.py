"""Every DaemonSet that runs on GPU nodes tolerates every trainops taint (inference, training,
quarantine), and so does GPU Operator's ClusterPolicy, which its DaemonSets take theirs from.

A DaemonSet pod is not created on a node with a NoSchedule taint it does not tolerate: the pods
there keep running, but after an upgrade or on a new node the driver, device plugin or
dcgm-exporter never arrive, and the node loses its GPUs.  A DaemonSet runs on GPU nodes when its
nodeSelector and required node affinity match one of them.
"""

from __future__ import annotations

from trainops.doctor.gpu_operator import INSTALL, cluster_policy
from trainops.doctor.node_probe import gpu_nodes, no_gpu_nodes
from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome, Problem
from trainops.placement.scheduling import TRAINOPS_TAINTS, selects, tolerations_for, untolerated

VALUES = "deploy/gpu-operator-values.yaml"


def _fix(daemon_set: dict, missing: list) -> str:
    meta = daemon_set["metadata"]
    labels = meta.get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") == "gpu-operator":  # GPU Operator's operand label
        return f"its tolerations come from the ClusterPolicy: {INSTALL}"
    if (
        "node-feature-discovery" in meta["name"]
        or labels.get("app.kubernetes.io/name") == "node-feature-discovery"
    ):
        return f"set node-feature-discovery.worker.tolerations as {VALUES} does"
    wanted = ", ".join(str(t) for t in tolerations_for(missing))
    return f"add to spec.template.spec.tolerations: {wanted}"


def check(reads: Reads, config) -> Outcome:
    nodes = gpu_nodes(reads, config)
    if not nodes:
        return Outcome("no GPU nodes", [no_gpu_nodes(config)])
    problems, on_gpu = [], 0
    for daemon_set in reads.daemon_sets():
        spec = ((daemon_set.get("spec") or {}).get("template") or {}).get("spec") or {}
        if not any(selects(spec, node) for node in nodes):
            continue
        on_gpu += 1
        missing = untolerated(spec.get("tolerations") or [])
        if missing:
            meta = daemon_set["metadata"]
            problems.append(
                Problem(
                    f"DaemonSet {meta['namespace']}/{meta['name']} does not tolerate "
                    f"{', '.join(map(str, missing))}: no pod of it is created on such a node",
                    _fix(daemon_set, missing),
                )
            )
    policy = cluster_policy(reads)
    if policy:
        missing = untolerated(((policy.get("spec") or {}).get("daemonsets") or {}).get("tolerations") or [])
        if missing:
            problems.append(
                Problem(
                    f"ClusterPolicy {policy['metadata']['name']} spec.daemonsets.tolerations lacks "
                    f"{', '.join(map(str, missing))}: GPU Operator's DaemonSets (driver, device plugin, "
                    "dcgm-exporter) are not created on such nodes",
                    INSTALL,
                )
            )
    taints = ", ".join(map(str, TRAINOPS_TAINTS))
    lacking = sum(1 for p in problems if p.what.startswith("DaemonSet "))
    summary = (
        f"{lacking} of {on_gpu} DaemonSet(s) on GPU nodes miss a trainops taint"
        if lacking
        else f"{on_gpu} DaemonSet(s) on GPU nodes, each tolerating {taints}"
    )
    policy_lacks = len(problems) > lacking
    return Outcome(summary + ("; the ClusterPolicy's tolerations miss one" if policy_lacks else ""), problems)
