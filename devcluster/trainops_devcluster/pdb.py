"""PodDisruptionBudget maths, as the disruption controller and the Eviction subresource do it.

``compute_status`` is what the disruption controller writes; ``check_eviction`` is what the
API server decides when a pod is evicted (allowed: the budget's new status; not: 429).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from trainops_devcluster.errors import Forbidden, TooManyRequests
from trainops_devcluster.selectors import match_label_selector
from trainops_devcluster.store import now_iso

#: an evicted pod counts as disrupted for this long, or until it is gone (the real default)
DISRUPTED_POD_TIMEOUT = timedelta(minutes=2)

ScaleOf = Callable[[dict, str], int | None]  # (controller ownerReference, namespace) -> replicas


def matches(pdb: dict, pod: dict) -> bool:
    """A PDB covers pods of its namespace matched by its selector (an empty selector matches all)."""
    if pdb["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    return match_label_selector(selector, pod["metadata"].get("labels") or {})


def is_ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not pod["metadata"].get("deletionTimestamp")


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def _controller(pod: dict) -> dict | None:
    return next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


def expected_pods(pdb: dict, pods: list[dict], scale_of: ScaleOf) -> int:
    """The pods the budget is about: the matched pods for an integer minAvailable, else the summed
    scale of their controllers (pods of a controller whose scale is unknown are counted as found)."""
    spec = pdb.get("spec") or {}
    if "minAvailable" in spec and not str(spec["minAvailable"]).endswith("%"):
        return len(pods)
    total, seen = 0, set()
    for pod in pods:
        ref = _controller(pod)
        if ref is None:
            total += 1
            continue
        if ref["uid"] in seen:
            continue
        seen.add(ref["uid"])
        scale = scale_of(ref, pod["metadata"].get("namespace", ""))
        total += (
            scale
            if scale is not None
            else sum(1 for p in pods if (_controller(p) or {}).get("uid") == ref["uid"])
        )
    return total


def compute_status(pdb: dict, pods: list[dict], scale_of: ScaleOf = lambda ref, ns: None) -> dict:
    """The PDB status the disruption controller writes, from the pods of its namespace."""
    covered = [p for p in pods if matches(pdb, p)]
    spec = pdb.get("spec") or {}
    expected = expected_pods(pdb, covered, scale_of)
    if "minAvailable" in spec:
        desired = _scaled(spec["minAvailable"], expected)
    elif "maxUnavailable" in spec:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = expected
    now = datetime.now(UTC)
    disrupted = {}
    for name, stamp in ((pdb.get("status") or {}).get("disruptedPods") or {}).items():
        since = datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
        if now - since < DISRUPTED_POD_TIMEOUT and any(p["metadata"]["name"] == name for p in covered):
            disrupted[name] = stamp
    healthy = sum(1 for p in covered if is_ready(p) and p["metadata"]["name"] not in disrupted)
    allowed = max(0, healthy - desired)
    status = {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [_allowed_condition(allowed > 0, pdb)],
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    return status


def _allowed_condition(allowed: bool, pdb: dict) -> dict:
    old = next(
        (
            c
            for c in (pdb.get("status") or {}).get("conditions") or []
            if c.get("type") == "DisruptionAllowed"
        ),
        {},
    )
    status = "True" if allowed else "False"
    return {
        "type": "DisruptionAllowed",
        "status": status,
        "reason": "SufficientPods" if allowed else "InsufficientPods",
        "message": "",
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "lastTransitionTime": old.get("lastTransitionTime") if old.get("status") == status else now_iso(),
    }


def needs_budget(pod: dict) -> bool:
    """Pods that are finished, pending or already being deleted are evicted without consulting a PDB."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed", "Pending") and not pod["metadata"].get("deletionTimestamp")


def check_eviction(pdb: dict, pod: dict) -> dict | None:
    """Decide an eviction of ``pod`` under ``pdb``: the PDB's new status (a disruption consumed), or
    ``None`` when the pod can go without consuming one; raises 429 when the budget forbids it."""
    name = pdb["metadata"]["name"]
    status = pdb.get("status") or {}
    if not is_ready(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if policy == "AlwaysAllow" or status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0:
            return None
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        raise _violation(f"The disruption budget {name} is still being processed by the server.")
    allowed = status.get("disruptionsAllowed", 0)
    if allowed < 0:
        raise Forbidden("pdb disruptions allowed is negative")
    if allowed == 0:
        raise _violation(
            f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods and has "
            f"{status.get('currentHealthy', 0)} currently"
        )
    disrupted = dict(status.get("disruptedPods") or {})
    disrupted[pod["metadata"]["name"]] = now_iso()
    return status | {"disruptionsAllowed": allowed - 1, "disruptedPods": disrupted}


def _violation(cause: str) -> TooManyRequests:
    return TooManyRequests(
        "Cannot evict pod as it would violate the pod's disruption budget.",
        causes=[{"reason": "DisruptionBudget", "message": cause}],
    )
