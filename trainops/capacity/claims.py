"""Claiming a node for a training run and releasing it, as pure changes of a ``NodeState``.

A claim writes, in one patch: the mode taint flipped to ``trainops.io/mode=training:NoSchedule``
(never NoExecute: running pods are moved by the drain, through PodDisruptionBudgets), the claim
annotation ``trainops.io/claimed-by=<dag_id>/<run_id>``, the claim time, and the prior mode taint
(``trainops.io/claim-prior``, JSON) so that a release restores exactly what was there.  Releasing
puts the prior mode taint back in its place and removes the claim annotations; every other taint,
label and annotation (quarantine included) is left as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from trainops.conventions import CLAIMED_BY_ANNOTATION, MODE_TAINT, MODE_TRAINING
from trainops.errors import PermanentError, TemporaryError
from trainops.kube.nodes import NodeChange, NodeState, holder_of, is_quarantined, with_taint, without_taint

CLAIMED_AT_ANNOTATION = "trainops.io/claimed-at"
CLAIM_PRIOR_ANNOTATION = "trainops.io/claim-prior"
CLAIM_ANNOTATIONS = (CLAIMED_BY_ANNOTATION, CLAIMED_AT_ANNOTATION, CLAIM_PRIOR_ANNOTATION)
TRAINING_TAINT = {"key": MODE_TAINT, "value": MODE_TRAINING, "effect": "NoSchedule"}


class ClaimError(PermanentError):
    """A node cannot be claimed or released as asked until a person fixes it (the message says how)."""


class NodesHeld(TemporaryError):
    """Nodes are claimed by other runs (free again once those runs return them); ``holders``: node -> run."""

    def __init__(self, holders: dict[str, str]) -> None:
        listed = ", ".join(f"{node} (held by {run})" for node, run in sorted(holders.items()))
        super().__init__(f"{len(holders)} node(s) are claimed by other runs: {listed}")
        self.holders = holders


class NodeQuarantined(ClaimError):
    def __init__(self, node: str) -> None:
        super().__init__(
            f"node {node} is quarantined; release it with `trainops health release {node}` first"
        )
        self.node = node


def parse_run(run: str) -> str:
    """Check a run key ``<dag_id>/<run_id>``; returns it unchanged."""
    dag_id, sep, run_id = run.partition("/")
    if not sep or not dag_id or not run_id or "/" in run_id:
        raise ValueError(
            f"run {run!r} must be '<dag_id>/<run_id>' (exactly one '/'), e.g. 'train_llm/manual__1'"
        )
    return run


def claim_age_s(annotations: Mapping, now: datetime) -> float | None:
    """Seconds since the node was claimed (``CLAIMED_AT_ANNOTATION``, as ``claim`` writes it);
    None when the annotation is missing or malformed."""
    try:
        stamp = datetime.strptime(annotations.get(CLAIMED_AT_ANNOTATION) or "", "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        return None
    return (now - stamp.replace(tzinfo=UTC)).total_seconds()


def claim(run: str, claimed_at: str) -> NodeChange:
    """The change that claims a node for ``run``: a no-op when ``run`` already holds it; raises
    ``NodesHeld`` when another run does and ``NodeQuarantined`` for a quarantined node."""

    def change(state: NodeState) -> NodeState:
        holder = holder_of(state.annotations)
        if holder == run:
            return state
        if holder:
            raise NodesHeld({state.name: holder})
        if is_quarantined(state):
            raise NodeQuarantined(state.name)
        annotations = {
            **state.annotations,
            CLAIMED_BY_ANNOTATION: run,
            CLAIMED_AT_ANNOTATION: claimed_at,
            CLAIM_PRIOR_ANNOTATION: json.dumps({"modeTaint": state.taint(MODE_TAINT)}, sort_keys=True),
        }
        return with_taint(replace(state, annotations=annotations), TRAINING_TAINT)

    return change


def release(run: str) -> NodeChange:
    """The change that gives a node claimed by ``run`` back as it was; a no-op on any other node."""

    def change(state: NodeState) -> NodeState:
        if holder_of(state.annotations) != run:
            return state
        prior = prior_mode_taint(state)
        annotations = {k: v for k, v in state.annotations.items() if k not in CLAIM_ANNOTATIONS}
        state = replace(state, annotations=annotations)
        return with_taint(state, prior) if prior else without_taint(state, MODE_TAINT)

    return change


def prior_mode_taint(state: NodeState) -> dict | None:
    """The mode taint the node had before its claim (``None``: it had none)."""
    raw = state.annotations.get(CLAIM_PRIOR_ANNOTATION)
    try:
        prior = json.loads(raw)["modeTaint"]
    except (TypeError, ValueError, KeyError) as error:
        raise ClaimError(
            f"node {state.name}: annotation {CLAIM_PRIOR_ANNOTATION} is missing or not the JSON a claim writes "
            f"({raw!r}); set the mode taint by hand and remove the trainops.io/claim* annotations"
        ) from error
    if prior is not None and not (isinstance(prior, dict) and prior.get("key") == MODE_TAINT):
        raise ClaimError(
            f"node {state.name}: {CLAIM_PRIOR_ANNOTATION} holds {prior!r}, not a {MODE_TAINT} taint"
        )
    return prior
