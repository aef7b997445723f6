"""dcgm-exporter in Prometheus: a series for every metric the gate reads (trainops.health.prometheus),
and the node label it keys them by naming the GPU nodes.

A handful of instant queries, whatever the fleet's size: one count per metric name, one per
value of the node label, and, when that label names no node, a few whole series to find the label
that does.
"""

from __future__ import annotations

from trainops.doctor.node_probe import gpu_nodes, no_gpu_nodes
from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome, Problem, Skip
from trainops.health.prometheus import FRESHNESS, GAUGES, XID_COUNT, XID_LAST

#: every series the gate reads; XID_COUNT has series only for XIDs seen lately, so none is no fault
GATE_METRICS = (*GAUGES, XID_LAST)
SAMPLE_SERIES = 5
COUNTERS_FIX = (
    "add it to dcgm-exporter's counters CSV (GPU Operator: the ConfigMap named by "
    "dcgmExporter.config.name; ECC, row-remap pending, clock events and NVLink errors are off by default)"
)


def _values(result: list[dict], label: str) -> set[str]:
    return {item["metric"][label] for item in result if item.get("metric", {}).get(label)}


def check(reads: Reads, config) -> Outcome:
    prometheus = config.prometheus
    if prometheus is None:
        raise Skip("no Prometheus named (--prometheus URL): the gate then reads the probes' reports alone")
    label = prometheus.node_label
    names = "|".join(GATE_METRICS)
    present = _values(prometheus.query(f'count by (__name__) ({{__name__=~"{names}"}})'), "__name__")
    problems = [
        Problem(
            f"no {metric} series: the gate reads {GAUGES[metric][0] if metric in GAUGES else 'XIDs'} from it",
            COUNTERS_FIX,
        )
        for metric in GATE_METRICS
        if metric not in present
    ]
    nodes = {n["metadata"]["name"] for n in gpu_nodes(reads, config)}
    if not nodes:
        return Outcome("no GPU nodes", [no_gpu_nodes(config), *problems])
    if FRESHNESS not in present:
        return Outcome(f"Prometheus at {prometheus.base_url} has no dcgm-exporter series", problems)
    seen = _values(prometheus.query(f"count by ({label}) ({FRESHNESS})"), label)
    covered = nodes & seen
    if not covered:
        problems.append(_label_problem(prometheus, label, seen, nodes))
    else:
        problems += [
            Problem(
                f'{node}: no dcgm-exporter series with {label}="{node}"',
                "is dcgm-exporter running on it, and scraped? (its pod on that node; Prometheus' targets page)",
            )
            for node in sorted(nodes - covered)
        ]
    xid_window = (
        "on"
        if XID_COUNT in _values(prometheus.query(f"count by (__name__) ({XID_COUNT})"), "__name__")
        else "no XIDs lately"
    )
    return Outcome(
        f"{len(present)} of {len(GATE_METRICS)} metrics the gate reads; label {label} names "
        f"{len(covered)} of {len(nodes)} GPU node(s); XID counts: {xid_window}",
        problems,
    )


def _label_problem(prometheus, label: str, seen: set[str], nodes: set[str]) -> Problem:
    """The node label names no GPU node: which label of the series does, if one does."""
    sample = prometheus.query(f"topk({SAMPLE_SERIES}, {FRESHNESS})")
    holding = sorted(
        {name for item in sample for name, value in item.get("metric", {}).items() if value in nodes}
    )
    shown = f"values such as {min(seen)!r}" if seen else "no values"
    if holding:
        fix = (
            f"set the Prometheus connection's node_label (CLI: --prometheus-node-label) to {holding[0]}: "
            "that label holds the node names"
        )
    else:
        fix = (
            "no label of dcgm-exporter's series holds the node name: give dcgm-exporter NODE_NAME (GPU "
            "Operator and its Helm chart do), or relabel __meta_kubernetes_pod_node_name into a label and name it"
        )
    return Problem(f"label {label!r} of dcgm-exporter's series names no GPU node ({shown})", fix)
