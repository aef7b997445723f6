"""The plugin's two actions, through the same code as the CLI, each recorded on what it changed.

- release: ``trainops health release NODE`` (``trainops.health.quarantine.release``): a fresh
  re-check, and the quarantine lifted only when a report newer than it passes;
- return: ``trainops capacity return --run RUN`` (``trainops.capacity.procedure.give_back``).

The record is the annotation ``trainops.io/ui-action`` (JSON: who, when, what) on each node changed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

from trainops.health.prometheus import PrometheusClient
from trainops.kube.client import Kube
from trainops.kube.nodes import NodeState, edit_node
from trainops.kube.retry import Deadline

ACTION_ANNOTATION = "trainops.io/ui-action"
WRITE_DEADLINE_S = 60.0


def record(kube: Kube, node: str, who: str, what: str) -> dict[str, str]:
    """Write who did ``what`` to ``node`` and when on the node; returns the record."""
    entry = {"who": who, "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "what": what}

    def annotate(state: NodeState) -> NodeState:
        return replace(state, annotations={**state.annotations, ACTION_ANNOTATION: json.dumps(entry)})

    edit_node(kube.core, node, annotate, Deadline(WRITE_DEADLINE_S))
    return entry


def release_node(kube: Kube, node: str, who: str, prometheus: PrometheusClient | None) -> dict[str, Any]:
    """Re-check ``node`` (with dcgm-exporter's metrics too when ``prometheus`` is given) and lift its
    quarantine if it passes; raises ReleaseRefused/GateError otherwise."""
    from trainops.health.quarantine import release

    outcome = release(kube.core, node, Deadline(WRITE_DEADLINE_S), prometheus=prometheus)
    answer: dict[str, Any] = asdict(outcome)
    if outcome.released:
        answer["record"] = record(
            kube, node, who, f"released from quarantine after a re-check ({outcome.verdict})"
        )
    return answer


def return_capacity(
    kube: Kube, run: str, who: str, cluster_queue: str, training_namespace: str
) -> dict[str, Any]:
    """Stop ``run``'s training and give back every node and loan of it; raises ValueError (bad run
    key), ReturnIncomplete."""
    from trainops.capacity.procedure import give_back

    summary = give_back(kube, run, cluster_queue=cluster_queue, training_namespace=training_namespace)
    what = f"capacity of run {run} returned"
    return {
        **asdict(summary),
        "records": {node: record(kube, node, who, what) for node in summary.node_names},
    }
