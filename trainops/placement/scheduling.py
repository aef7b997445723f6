"""Where a pod template may run, as kube-scheduler and the DaemonSet controller decide it: the
node's labels against ``nodeSelector`` and the required node affinity, its taints against the
tolerations (``k8s.io/api/core/v1`` ``Toleration.ToleratesTaint``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainops.conventions import MODE_INFERENCE, MODE_TAINT, MODE_TRAINING, QUARANTINE_TAINT

SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None  # None: any value (only an ``Exists`` toleration tolerates every one)
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}{'' if self.value is None else '=' + self.value}:{self.effect}"

    def toleration(self) -> dict:
        """The toleration that tolerates this taint whatever its value."""
        return {"key": self.key, "operator": "Exists", "effect": self.effect}


def tolerations_for(taints) -> list[dict]:
    """The tolerations that tolerate ``taints`` whatever their values, each once (the inference and
    training taints share one)."""
    return list({(t.key, t.effect): t.toleration() for t in taints}.values())


#: every taint trainops puts on a GPU node (trainops.conventions): its resting state, while a run
#: holds it, and after a health failure (the value names the failure, so it varies)
TRAINOPS_TAINTS = (
    Taint(MODE_TAINT, MODE_INFERENCE),
    Taint(MODE_TAINT, MODE_TRAINING),
    Taint(QUARANTINE_TAINT, None),
)


def tolerates(toleration: dict, taint: Taint) -> bool:
    """Whether ``toleration`` (as in a pod spec) tolerates ``taint``."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and taint.value is not None and (toleration.get("value") or "") == taint.value


def untolerated(tolerations: list[dict], taints: tuple[Taint, ...] = TRAINOPS_TAINTS) -> list[Taint]:
    """The taints no toleration tolerates."""
    return [t for t in taints if not any(tolerates(tol, t) for tol in tolerations or [])]


def node_taints(node: dict) -> tuple[Taint, ...]:
    """The node's taints that keep pods off it (NoSchedule, NoExecute)."""
    return tuple(
        Taint(t.get("key", ""), t.get("value") or "", t.get("effect", ""))
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in SCHEDULING_EFFECTS
    )


def selects(pod_spec: dict, node: dict) -> bool:
    """Whether the node's labels (and name) meet the pod spec's ``nodeSelector`` and required node affinity."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    fields = {"metadata.name": meta.get("name", "")}
    return any(
        all(_meets(r, labels) for r in term.get("matchExpressions") or [])
        and all(_meets(r, fields) for r in term.get("matchFields") or [])
        for term in required.get("nodeSelectorTerms") or []
    )


def _meets(requirement: dict, values: dict) -> bool:
    key, operator, wanted = (
        requirement.get("key"),
        requirement.get("operator"),
        requirement.get("values") or [],
    )
    if operator == "Exists":
        return key in values
    if operator == "DoesNotExist":
        return key not in values
    if operator == "In":
        return key in values and values[key] in wanted
    if operator == "NotIn":
        return key not in values or values[key] not in wanted
    if operator in ("Gt", "Lt") and key in values and len(wanted) == 1:
        try:
            have, bound = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False
