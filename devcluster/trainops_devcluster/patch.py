"""The three patch formats of the API server: JSON merge patch (RFC 7386), JSON patch (RFC 6902)
and strategic merge patch, whose list rules come from the kind's OpenAPI schema."""

from __future__ import annotations

import copy
import json

import jsonpatch
import jsonpointer

from trainops_devcluster import openapi
from trainops_devcluster.errors import BadRequest, Unprocessable, UnsupportedMediaType
from trainops_devcluster.kinds import Kind

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def media_type(kind: Kind, content_type: str) -> str:
    """The patch type of a request's Content-Type; 415 for one ``kind`` does not take."""
    media = content_type.split(";")[0].strip()
    if media not in (MERGE, JSON_PATCH, APPLY) and (media != STRATEGIC or kind.custom):
        accepted = [JSON_PATCH, MERGE] + ([] if kind.custom else [STRATEGIC]) + [APPLY]
        raise UnsupportedMediaType(
            f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}"
        )
    return media


def apply(kind: Kind, content_type: str, body: bytes, target: dict) -> dict:
    """Return ``target`` (not changed) with a merge, JSON or strategic merge patch applied."""
    media = media_type(kind, content_type)
    try:
        patch = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"error decoding patch: {exc}") from None
    if media == JSON_PATCH:
        return json_patch(target, patch)
    if not isinstance(patch, dict):
        raise BadRequest("error decoding patch: the patch must be a JSON object")
    if media == MERGE:
        return merge_patch(target, patch)
    return strategic_merge(target, patch, openapi.schema_of(kind))


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict, operations: object) -> dict:
    """RFC 6902; a failed ``test`` or a bad path answers 422 as the real server does."""
    if not isinstance(operations, list):
        raise BadRequest("error decoding patch: a JSON patch must be a list of operations")
    try:
        patch = jsonpatch.JsonPatch(operations)
        return patch.apply(target)
    except jsonpatch.InvalidJsonPatch as exc:
        raise BadRequest(f"error decoding patch: {exc}") from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise Unprocessable(str(exc)) from None


# ---- strategic merge patch -------------------------------------------------------------
_DIRECTIVE = "$patch"
_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_RETAIN = "$retainKeys"


def strategic_merge(target: dict, patch: dict, schema: dict | None) -> dict:
    merged = _merge_map(target, patch, schema)
    return merged if merged is not None else {}


def _merge_map(target: object, patch: dict, schema: dict | None) -> dict | None:
    directive = patch.get(_DIRECTIVE)
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != _DIRECTIVE}
    if directive is not None:
        raise BadRequest(f"Unknown patch type: {directive!r} in strategic merge patch")
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get(_RETAIN)
    for key, value in patch.items():
        if key == _RETAIN or key.startswith(_ORDER):
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            field = key[len(_DELETE_PRIMITIVE) :]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        sub = openapi.child(schema, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and _is_map_schema(sub):
            merged = _merge_map(result.get(key), value, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, sub)
        else:
            result[key] = copy.deepcopy(value)
    for key, order in patch.items():
        if key.startswith(_ORDER) and isinstance(result.get(key[len(_ORDER) :]), list):
            field = key[len(_ORDER) :]
            result[field] = _reorder(result[field], order, _merge_key(openapi.child(schema, field)))
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _is_map_schema(schema: dict | None) -> bool:
    schema = openapi.resolve(schema)
    if schema is None:
        return True
    return (
        "properties" in schema
        or "additionalProperties" in schema
        or schema.get("type") in ("object", ["object", "null"])
    )


def _strategy(schema: dict | None) -> str:
    return (schema or {}).get("x-kubernetes-patch-strategy", "")


def _merge_key(schema: dict | None) -> str | None:
    return (schema or {}).get("x-kubernetes-patch-merge-key")


def _merge_list(target: object, patch: list, schema: dict | None) -> list:
    current = list(target) if isinstance(target, list) else []
    if "merge" not in _strategy(schema).split(","):
        return [item for item in copy.deepcopy(patch) if not (isinstance(item, dict) and _DIRECTIVE in item)]
    key = _merge_key(schema)
    if any(isinstance(item, dict) and item.get(_DIRECTIVE) == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and _DIRECTIVE in i)]
    if key is None:  # a set of primitives: union, keeping order
        return current + [copy.deepcopy(v) for v in patch if v not in current]
    item_schema = openapi.items(schema)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise BadRequest(f"map: {item!r} does not contain declared merge key: {key}")
        index = next(
            (i for i, old in enumerate(current) if isinstance(old, dict) and old.get(key) == item[key]), None
        )
        if item.get(_DIRECTIVE) == "delete":
            if index is not None:
                current.pop(index)
        elif index is None:
            current.append(_merge_map({}, item, item_schema))
        else:
            current[index] = _merge_map(current[index], item, item_schema)
    return current


def _reorder(values: list, order: list, key: str | None) -> list:
    def identity(v: object) -> object:
        return json.dumps(v.get(key) if key and isinstance(v, dict) else v, sort_keys=True)

    rank = {identity(v): i for i, v in enumerate(order)}
    return sorted(values, key=lambda v: rank.get(identity(v), len(rank)))
