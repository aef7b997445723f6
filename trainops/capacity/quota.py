"""The training ClusterQueue's GPU quota follows the claimed nodes.

Each run's grant is recorded on the ClusterQueue itself, in the annotation
``trainops.io/quota-grants`` (JSON: ``{"<dag_id>/<run_id>": {"flavor": "gpu", "gpus": 16}}``), in
the same guarded merge patch that changes ``nominalQuota``.  ``set_grant(run, n)`` moves the quota
by the difference between ``n`` and what the record says the run already has, so repeating a claim
or a return never counts twice; ``set_grant(run, 0)`` takes the grant back and drops the record.
ClusterQueue is a custom resource: merge patch only, never strategic merge.
"""

from __future__ import annotations

import copy
import json

from trainops.conventions import GPU_RESOURCE
from trainops.errors import PermanentError
from trainops.kube.client import Kube
from trainops.kube.guarded import Edited
from trainops.kube.retry import Deadline

GRANTS_ANNOTATION = "trainops.io/quota-grants"


class QuotaError(PermanentError, ValueError):
    """The ClusterQueue has no (or no unique) GPU quota entry to adjust."""


def grants_of(cluster_queue: dict) -> dict[str, dict]:
    raw = (cluster_queue["metadata"].get("annotations") or {}).get(GRANTS_ANNOTATION)
    return json.loads(raw) if raw else {}


def gpu_flavor(cluster_queue: dict, flavor: str | None) -> str:
    """The flavor whose ``nvidia.com/gpu`` quota trainops adjusts: ``flavor`` if given, else the only one."""
    found = [
        f["name"]
        for group in cluster_queue["spec"].get("resourceGroups") or []
        for f in group.get("flavors") or []
        if any(r["name"] == GPU_RESOURCE for r in f.get("resources") or [])
    ]
    name = cluster_queue["metadata"]["name"]
    if flavor is None and len(found) == 1:
        return found[0]
    if flavor is not None and flavor in found:
        return flavor
    raise QuotaError(
        f"ClusterQueue {name}: flavors with a {GPU_RESOURCE} quota are {found or 'none'}; "
        + (
            "pass the flavor to adjust (gpu_flavor=...)"
            if flavor is None
            else f"flavor {flavor!r} is not one of them"
        )
    )


def grant_patch(cluster_queue: dict, run: str, gpus: int, flavor: str | None = None) -> dict | None:
    """The merge patch that makes ``run``'s grant ``gpus`` (``None`` when it already is)."""
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    grants = grants_of(cluster_queue)
    had = grants.get(run, {"gpus": 0, "flavor": flavor})
    if had["gpus"] == gpus:
        return None
    flavor = gpu_flavor(cluster_queue, had["flavor"])
    groups = copy.deepcopy(cluster_queue["spec"]["resourceGroups"])
    entry = next(
        r
        for g in groups
        for f in g["flavors"]
        if f["name"] == flavor
        for r in f["resources"]
        if r["name"] == GPU_RESOURCE
    )
    entry["nominalQuota"] = _quantity_plus(entry["nominalQuota"], gpus - had["gpus"])
    if gpus:
        grants[run] = {"flavor": flavor, "gpus": gpus}
    else:
        grants.pop(run, None)
    annotation = json.dumps(grants, sort_keys=True) if grants else None
    return {"metadata": {"annotations": {GRANTS_ANNOTATION: annotation}}, "spec": {"resourceGroups": groups}}


def _quantity_plus(quantity: str | int, delta: int) -> str | int:
    """``quantity + delta`` (never below 0), in the type it came in (string or integer)."""
    from kubernetes.utils import parse_quantity

    total = max(0, int(parse_quantity(quantity)) + delta)
    return str(total) if isinstance(quantity, str) else total


def set_grant(
    kube: Kube, cluster_queue: str, run: str, gpus: int, deadline: Deadline, flavor: str | None = None
) -> Edited:
    """Make ``run``'s GPU grant on ClusterQueue ``cluster_queue`` equal ``gpus`` (0 takes it back), at
    the Kueue version the cluster serves.

    Idempotent; writes nothing when the record already matches.
    """
    return kube.edit(
        kube.kueue("clusterqueues", namespaced=False),
        cluster_queue,
        lambda cq: grant_patch(cq, run, gpus, flavor),
        deadline=deadline,
    )
