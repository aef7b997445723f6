"""A user's pod template merged under the pod trainops builds, refusing what would contradict it.

The template is plain API data (``{"metadata": ..., "spec": ...}`` with camelCase keys, or a
``kubernetes.client.V1PodTemplateSpec``).  Merging is one rule applied everywhere: a field only
the template sets is kept; a field both set must agree, or the merge stops with an error naming
the field; maps merge key by key; lists of named items (containers, env, volumes, mounts, ports)
merge item by item on their key; tolerations and added capabilities are unions.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from trainops.errors import PermanentError

# list field name -> the key its items merge on
_KEYED_LISTS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
_WHOLE_ITEMS = ("env", "volumes", "volumeMounts", "ports", "imagePullSecrets")  # same key: must be equal
_UNION_LISTS = ("tolerations", "add")  # spec.tolerations, securityContext.capabilities.add
# pod spec fields a template may not set at all: trainops (or the Job controller) decides them
_FORBIDDEN_SPEC = {
    "nodeName": "trainops places the pods through the scheduler; pin nodes with node_names",
    "hostname": "the Job controller names each pod <job>-<index>",
    "subdomain": "trainops points it at the Job's headless Service",
}


class TemplateConflict(PermanentError, ValueError):
    """The pod template sets a field trainops owns to something else."""


def normalize(template: Any) -> dict:
    """``template`` as plain, private API data; a clear error for anything but a pod template."""
    if template is None:
        return {}
    if not isinstance(template, Mapping):
        if not hasattr(template, "to_dict"):
            raise ValueError(
                "pod_template must be a dict like {'metadata': {...}, 'spec': {...}} or a "
                f"kubernetes.client.V1PodTemplateSpec, got {type(template).__name__}"
            )
        from kubernetes.client import ApiClient

        template = ApiClient().sanitize_for_serialization(template)
    template = copy.deepcopy(dict(template))
    if unknown := sorted(set(template) - {"metadata", "spec"}):
        raise ValueError(
            f"pod_template: unknown top-level field(s) {unknown}: a pod template has metadata and spec"
        )
    for part in ("metadata", "spec"):
        if not isinstance(template.get(part, {}), Mapping):
            raise ValueError(f"pod_template.{part} must be a mapping")
    for name, why in _FORBIDDEN_SPEC.items():
        if name in template.get("spec", {}):
            raise ValueError(f"pod_template.spec.{name} must not be set: {why}")
    for index, toleration in enumerate(template.get("spec", {}).get("tolerations") or []):
        _check_toleration(toleration, f"pod_template.spec.tolerations[{index}]")
    return template


def _check_toleration(toleration: Any, where: str) -> None:
    from trainops.conventions import MODE_TAINT, QUARANTINE_TAINT

    if not isinstance(toleration, Mapping):
        raise ValueError(f"{where} must be a mapping")
    key = toleration.get("key") or ""
    if not key and toleration.get("operator") == "Exists":
        raise ValueError(
            f"{where} tolerates every taint (no key, operator Exists), including {MODE_TAINT}=inference "
            f"and {QUARANTINE_TAINT}: tolerate the taints you mean by key"
        )
    if key in (MODE_TAINT, QUARANTINE_TAINT):
        raise ValueError(
            f"{where} tolerates {key}: trainops owns that taint (training pods tolerate only "
            f"{MODE_TAINT}=training, which it adds itself)"
        )


def merge_under(owned: dict, template: dict, where: str = "pod_template") -> dict:
    """``owned`` with the template's fields added under it; a ``TemplateConflict`` naming the first
    field both set to different values.  Neither argument is changed."""
    return _merge(copy.deepcopy(owned), template, where)


def _merge(owned: Any, theirs: Any, where: str, field: str = "") -> Any:
    if isinstance(owned, Mapping) and isinstance(theirs, Mapping):
        merged = dict(owned)
        for key, value in theirs.items():
            merged[key] = (
                copy.deepcopy(value)
                if key not in owned or owned[key] is None
                else _merge(owned[key], value, f"{where}.{key}", key)
            )
        return merged
    if isinstance(owned, list) and isinstance(theirs, list):
        if field in _UNION_LISTS:
            return owned + [copy.deepcopy(item) for item in theirs if item not in owned]
        if field in _KEYED_LISTS:
            return _merge_keyed(owned, theirs, where, _KEYED_LISTS[field], field in _WHOLE_ITEMS)
    _same(owned, theirs, where)
    return owned


def _same(owned: Any, theirs: Any, where: str) -> None:
    if owned != theirs:
        source = where.split(".", 1)[0].split("[", 1)[0]
        raise TemplateConflict(
            f"{where} is {theirs!r} but trainops sets it to {owned!r}: leave it out of {source} "
            "(image, command, args, GPUs, cpu, memory and env have parameters of their own)"
        )


def _merge_keyed(owned: list, theirs: list, where: str, key: str, whole: bool) -> list:
    merged = list(owned)
    positions = {item.get(key): i for i, item in enumerate(owned) if isinstance(item, Mapping)}
    for item in theirs:
        if not isinstance(item, Mapping) or key not in item:
            raise ValueError(f"{where}: every item needs a {key!r}, got {item!r}")
        at = positions.get(item[key])
        if at is None:
            merged.append(copy.deepcopy(item))
        elif whole:
            _same(owned[at], item, f"{where}[{key}={item[key]}]")
        else:
            merged[at] = _merge(owned[at], item, f"{where}[{key}={item[key]}]")
    return merged
