"""``status.conditions`` lists as every Kubernetes kind keeps them."""

from __future__ import annotations

from trainops_devcluster.store import now_iso


def find_condition(obj: dict, kind: str) -> dict | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def condition_true(obj: dict, kind: str) -> bool:
    condition = find_condition(obj, kind)
    return condition is not None and condition.get("status") == "True"


def set_condition(obj: dict, kind: str, status: str, reason: str = "", message: str = "", **extra) -> bool:
    """Set a condition on ``obj`` (in place); ``lastTransitionTime`` moves only when the status does.
    Returns whether anything changed."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    wanted = {"type": kind, "status": status, **extra}
    if reason:
        wanted["reason"] = reason
    if message:
        wanted["message"] = message
    for index, current in enumerate(conditions):
        if current.get("type") != kind:
            continue
        same_status = current.get("status") == status
        changed_fields = {k: v for k, v in current.items() if not k.endswith("Time")} != wanted
        if same_status and not changed_fields:
            return False
        wanted["lastTransitionTime"] = (
            current.get("lastTransitionTime") if same_status else None
        ) or now_iso()
        conditions[index] = wanted
        return True
    conditions.append({**wanted, "lastTransitionTime": now_iso()})
    return True
