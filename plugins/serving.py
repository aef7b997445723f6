"""The run view's inference: the workloads a run borrows from and their Ready replicas by pool, now.

One row per workload lending to the run (its loan records, ``trainops.capacity.loans``): the
primary's Ready and wanted replicas, its overflow companion's (``trainops.capacity.overflow``), and
how many replicas the run still borrows (``lent``) and keeps in the overflow pool (``offloaded``).
A return in waves shows here as the primary climbing back while the overflow drains.
"""

from __future__ import annotations

from typing import Any

from trainops.capacity.inference import DEPLOYMENT, WorkloadRef, loans_by_run
from trainops.capacity.overflow import lent, primary_of
from trainops.kube.client import DEPLOYMENTS, Kube
from trainops.kube.retry import Deadline


def _replicas(obj: dict | None) -> tuple[int | None, int | None]:
    if obj is None or "replicas" not in (obj.get("spec") or {}):
        return None, None
    return (obj.get("status") or {}).get("readyReplicas", 0), obj["spec"]["replicas"]


def serving(kube: Kube, run: str, deadline: Deadline) -> list[dict[str, Any]]:
    """The rows (see the module docstring), by workload."""
    rows: dict[WorkloadRef, dict[str, Any]] = {}
    companions: dict[WorkloadRef, dict] = {}
    for ref, obj in loans_by_run(kube.custom, deadline, run).get(run, []):
        primary = primary_of(ref, obj)
        if primary is not None:
            companions[primary] = obj
            continue
        ready, wanted = _replicas(obj)
        rows[ref] = {
            "workload": str(ref),
            "primary_ready": ready,
            "primary_replicas": wanted,
            "lent": lent(obj, run),
        }
    for primary, companion in companions.items():
        if primary not in rows:  # its own loan is given back already: read it for its replicas
            obj = kube.get(DEPLOYMENTS, primary.name, primary.namespace, deadline=deadline)
            ready, wanted = _replicas(obj)
            rows[primary] = {
                "workload": str(primary),
                "primary_ready": ready,
                "primary_replicas": wanted,
                "lent": 0,
            }
        ready, wanted = _replicas(companion)
        rows[primary].update(overflow_ready=ready, overflow_replicas=wanted, offloaded=lent(companion, run))
    for ref, row in rows.items():
        row.setdefault("overflow_ready", 0)
        row.setdefault("overflow_replicas", 0)
        row.setdefault("offloaded", 0)
        row["kind"] = ref.kind.name if ref.kind is not DEPLOYMENT else "Deployment"
    return sorted(rows.values(), key=lambda row: row["workload"])
