"""Speed evidence from work: nodes a training run's own step times show slower than the run's others.

The checkpoint helper's heartbeat carries ``node_step_s`` (``helper.heartbeat(...,
node_step_s=gather_step_seconds(seconds))``): per node rank, the seconds its GPUs spent computing the
last steps, without the wait in the step's collective (in synchronous training every rank's full
step lasts as long as the slowest's, so only the compute part tells nodes apart). A node is slow when
it is both an outlier among the run's nodes (modified z-score below ``z_threshold``, as for GEMM
stragglers, reference/health.md §6) and materially slower than their median (more than
``min_pct_slower`` percent; NVIDIA's straggler detector flags a rank at 0.75 of the best, 33% slower).

What is found is kept on the node (annotation ``trainops.io/slowdown``, see :func:`record`), so the
next run's gate keeps the node out for the fault window after it was seen, and a resume of this run
leaves it out, both showing the evidence.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from trainops.health.outliers import modified_z_scores
from trainops.kube.nodes import NodeState, edit_node
from trainops.kube.retry import Deadline

SLOWDOWN_ANNOTATION = "trainops.io/slowdown"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # an Indexed Job's pod: its node rank
MAX_NODES = 100_000  # node ranks one heartbeat may list
MAX_ANNOTATION_CHARS = 2048


@dataclass(frozen=True)
class Slowdown:
    """One node found slow: its step time against the run's median, when, and in which run."""

    node: str
    step_s: float
    median_s: float
    pct_slower: float
    at: float
    run: str = ""

    @property
    def reason(self) -> str:
        when = datetime.fromtimestamp(self.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        run = f" of run {self.run}" if self.run else ""
        return (
            f"slowed down in training{run}: {self.step_s:.3g}s per step against the run's median "
            f"{self.median_s:.3g}s ({self.pct_slower:.0f}% slower), seen {when}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_step_seconds(heartbeat: Mapping[str, Any]) -> dict[str, float]:
    """The heartbeat's ``node_step_s`` checked (a training pod wrote it: hostile input): node rank ->
    positive seconds. Absent: empty. Anything else raises ValueError naming the field."""
    raw = heartbeat.get("node_step_s")
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_NODES:
        raise ValueError(
            f"heartbeat node_step_s must be an object of at most {MAX_NODES} node ranks -> seconds"
        )
    seconds: dict[str, float] = {}
    for rank, value in raw.items():
        if not (isinstance(rank, str) and rank.isdigit() and len(rank) <= 6):
            raise ValueError(f"heartbeat node_step_s: {rank[:20]!r} is not a node rank (0, 1, ...)")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ValueError(
                f"heartbeat node_step_s[{rank}] must be positive seconds, got {str(value)[:40]!r}"
            )
        seconds[rank] = float(value)
    return seconds


def slow_nodes(
    heartbeat: Mapping[str, Any],
    nodes: Mapping[str, str],
    *,
    run: str = "",
    z_threshold: float = -2.0,
    min_pct_slower: float = 10.0,
) -> dict[str, Slowdown]:
    """The nodes ``heartbeat`` shows slow; ``nodes`` maps node rank (the pod's index) -> node name."""
    seconds = node_step_seconds(heartbeat)
    steps = {nodes[rank]: value for rank, value in seconds.items() if rank in nodes}
    if len(steps) < 3:  # no statistics over two nodes
        return {}
    z_scores = modified_z_scores({node: 1.0 / value for node, value in steps.items()})
    median_s = statistics.median(steps.values())
    at = float(heartbeat.get("time") or time.time())
    found = {}
    for node, step_s in steps.items():
        slower = 100.0 * (step_s / median_s - 1.0)
        if z_scores[node] < z_threshold and slower > min_pct_slower:
            found[node] = Slowdown(node, round(step_s, 4), round(median_s, 4), round(slower, 1), at, run)
    return found


def nodes_by_rank(pods: list[dict]) -> dict[str, str]:
    """Node rank (the Indexed Job pod's completion index) -> the node its pod ran on."""
    found = {}
    for pod in pods:
        index = ((pod.get("metadata") or {}).get("annotations") or {}).get(INDEX_ANNOTATION)
        node = (pod.get("spec") or {}).get("nodeName")
        if isinstance(index, str) and index.isdigit() and node:
            found[index] = node
    return found


def slowed_in_run(heartbeat: Mapping[str, Any] | None, pods: list[dict], run: str) -> dict[str, Slowdown]:
    """The nodes an attempt's last heartbeat shows slow, from its pods' placement; a malformed
    heartbeat (the trainer's to write) shows none."""
    try:
        return slow_nodes(heartbeat or {}, nodes_by_rank(pods), run=run)
    except ValueError:
        return {}


def record(core_v1: Any, slowdown: Slowdown, deadline: Deadline) -> bool:
    """Keep ``slowdown`` on its node (annotation ``trainops.io/slowdown``); True when this call wrote."""
    text = json.dumps(slowdown.to_dict(), sort_keys=True)[:MAX_ANNOTATION_CHARS]

    def change(state: NodeState) -> NodeState:
        return replace(state, annotations={**state.annotations, SLOWDOWN_ANNOTATION: text})

    return edit_node(core_v1, slowdown.node, change, deadline).wrote


def recorded(annotations: Mapping[str, str] | None) -> Slowdown | None:
    """The slowdown kept on a node (None: none, or one that is not a well-formed record)."""
    text = (annotations or {}).get(SLOWDOWN_ANNOTATION)
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION_CHARS:
        return None
    try:
        body = json.loads(text)
        found = Slowdown(
            str(body["node"]),
            float(body["step_s"]),
            float(body["median_s"]),
            float(body["pct_slower"]),
            float(body["at"]),
            str(body.get("run", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None
    return found if math.isfinite(found.at) else None
