"""Lending capacity from an inference object and giving it back, recorded on the object itself.

A *loan* is a set of fields a run changed on one object (a Deployment's ``spec.replicas``, an
HPA's bounds, an InferenceService's ``minReplicas``/``maxReplicas`` or ``serving.kserve.io/stop``
annotation).  The change and its record (annotation ``trainops.io/capacity-loans``, JSON
``{"<dag_id>/<run_id>": [{"path": [...], "prior": old, "set": new}, ...]}``) go in the same
guarded merge patch, so a claim killed at any moment leaves either both or neither.

Repaying a field: if it still holds what the run set, it gets its prior value back (exact); if
another run or an autoscaler moved a number since, the run's delta is added back instead
(``current + prior - set``), so loans of two runs on one Deployment come back right in either
order; any other field that was changed since is left as it is.  An integer field can also be
given back in parts (``repay_part_patch``: the gradual return of an overflow pool): the field and
the record's ``set`` move toward ``prior`` together, so the full repay that ends the loan is still exact.
"""

from __future__ import annotations

import json
from typing import Any

LOANS_ANNOTATION = "trainops.io/capacity-loans"
Path = tuple[str, ...]


def loans_of(obj: dict) -> dict[str, list[dict]]:
    raw = (obj["metadata"].get("annotations") or {}).get(LOANS_ANNOTATION)
    return json.loads(raw) if raw else {}


def get_path(obj: dict, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _set_path(patch: dict, path: Path, value: Any) -> None:
    for key in path[:-1]:
        patch = patch.setdefault(key, {})
    patch[path[-1]] = value


def _with_record(patch: dict, loans: dict[str, list[dict]]) -> dict:
    _set_path(
        patch,
        ("metadata", "annotations", LOANS_ANNOTATION),
        json.dumps(loans, sort_keys=True) if loans else None,
    )
    return patch


def lend_patch(obj: dict, run: str, fields: dict[Path, Any]) -> dict | None:
    """The merge patch that sets ``fields`` for ``run`` and records their prior values.

    ``None`` when ``run`` already has a loan on the object (a repeated claim).  When no field changes
    (the pods move by eviction), the loan is recorded empty: the return still finds the workload
    the run displaced and waits until it is Ready again.
    """
    loans = loans_of(obj)
    entries = [
        {"path": list(path), "prior": get_path(obj, path), "set": value}
        for path, value in fields.items()
        if get_path(obj, path) != value
    ]
    if run in loans:
        return None
    patch: dict = {}
    for entry in entries:
        _set_path(patch, tuple(entry["path"]), entry["set"])
    return _with_record(patch, {**loans, run: entries})


def repaid_value(current: Any, entry: dict) -> Any:
    """What a lent field goes back to (see the module docstring)."""
    prior, lent = entry["prior"], entry["set"]
    if current == lent:
        return prior
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (current, prior, lent)):
        return current + prior - lent
    return current


def repay_patch(obj: dict, run: str) -> dict | None:
    """The merge patch that gives ``run``'s loan back and drops its record (``None``: no loan)."""
    loans = loans_of(obj)
    entries = loans.pop(run, None)
    if entries is None:
        return None
    patch: dict = {}
    for entry in entries:
        path = tuple(entry["path"])
        _set_path(patch, path, repaid_value(get_path(obj, path), entry))
    return _with_record(patch, loans)


def repay_part_patch(obj: dict, run: str, path: Path, amount: int) -> dict | None:
    """The merge patch that gives up to ``amount`` of ``run``'s loan of the integer field ``path``
    back (the field and the record's ``set`` move toward ``prior`` together); ``None`` when nothing
    of it is left to give back."""
    loans = loans_of(obj)
    entry = next((e for e in loans.get(run) or [] if tuple(e["path"]) == path), None)
    current = get_path(obj, path)
    if (
        entry is None
        or amount <= 0
        or not all(isinstance(v, int) for v in (entry["prior"], entry["set"], current))
    ):
        return None
    step = max(-amount, min(amount, entry["prior"] - entry["set"]))
    if step == 0:
        return None
    entry["set"] += step
    patch: dict = {}
    _set_path(patch, path, current + step)
    return _with_record(patch, loans)
