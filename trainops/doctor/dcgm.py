"""dcgm-exporter in Prometheus, read as the gate reads it (``trainops.health.prometheus.fleet_reports``):
a series for every metric the gate reads, the node label the gate keys them by naming the GPU
nodes, and a fresh sample of every GPU node.
"""

from __future__ import annotations

from trainops.doctor.node_probe import gpu_nodes, no_gpu_nodes
from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome, Problem, Skip
from trainops.health.prometheus import GAUGES, fleet_reports

LABEL_FIX = (
    "give dcgm-exporter NODE_NAME (GPU Operator and its Helm chart do), or relabel "
    "__meta_kubernetes_pod_node_name into a label and name it (--prometheus-node-label)"
)


def check(reads: Reads, config) -> Outcome:
    prometheus = config.prometheus
    if prometheus is None:
        raise Skip("no Prometheus named (--prometheus URL): the gate then reads the probes' reports alone")
    nodes = {n["metadata"]["name"] for n in gpu_nodes(reads, config)}
    fleet = fleet_reports(prometheus)
    problems = [
        Problem(
            f"no {metric} series: the gate reads {GAUGES[metric][0] if metric in GAUGES else 'XIDs'} from it",
            hint,
        )
        for metric, hint in fleet.missing().items()
    ]
    if not nodes:
        return Outcome("no GPU nodes", [no_gpu_nodes(config), *problems])
    if not fleet.series:
        return Outcome(f"Prometheus at {prometheus.base_url} has no dcgm-exporter series", problems)
    naming = fleet.label_for(nodes)
    if naming is None:
        held = "; ".join(f"{label!r} holds e.g. {min(v)!r}" for label, v in fleet.values.items() if v)
        problems.append(
            Problem(
                f"no label of dcgm-exporter's series names a GPU node ({held or 'none is set'})", LABEL_FIX
            )
        )
    elif naming != fleet.label:
        problems.append(
            Problem(
                f"the gate keys dcgm-exporter's series by label {fleet.label!r}, which names no GPU node; "
                f"{naming!r} does",
                f"set the Prometheus connection's node_label (CLI: --prometheus-node-label) to {naming}",
            )
        )
    else:
        for node in sorted(nodes):
            if not _fresh(fleet, node):
                reason = fleet.report(node).signals["gpu_count"].reason
                problems.append(
                    Problem(
                        f"{node}: {reason}",
                        "is dcgm-exporter running on it, and scraped? (its pod on that node; Prometheus' targets page)",
                    )
                )
    fresh = sum(1 for node in nodes if _fresh(fleet, node))
    missing = len(fleet.missing())
    exported = (
        f"{missing} metric(s) the gate reads not exported"
        if missing
        else "every metric the gate reads exported"
    )
    return Outcome(
        f"{exported}; label {fleet.label} names {fresh} of {len(nodes)} GPU node(s) with fresh samples",
        problems,
    )


def _fresh(fleet, node: str) -> bool:
    count = fleet.report(node).signals.get("gpu_count")
    return count is not None and count.known
