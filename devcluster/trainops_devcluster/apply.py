"""Server-side apply and ``managedFields``, as small as the real semantics allow.

Every write through the API records which manager set which fields (``metadata.managedFields``,
``fieldsV1`` tries of ``f:``/``k:``/``v:`` keys).  An apply (``application/apply-patch+yaml``)
merges the manager's configuration into the object, drops the fields it applied before and no
longer does (unless another manager owns them), and answers 409 when it would change a field
another manager owns, unless ``force`` transfers the ownership.  Lists merge by the keys the
kind's OpenAPI schema declares (``x-kubernetes-list-type: map`` or the patch merge key); other
lists are atomic.  Custom resources have no schema here, so their lists are atomic.
"""

from __future__ import annotations

import copy
import json

import yaml

from trainops_devcluster import openapi, patch
from trainops_devcluster.errors import BadRequest, Invalid
from trainops_devcluster.kinds import Kind
from trainops_devcluster.store import Conflict, now_iso

Path = tuple[str, ...]
#: metadata no manager owns (set by the server, or naming the object)
_SERVER_META = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
)


class ApplyConflict(Conflict):
    """409 whose details hold only the conflicting fields (apimachinery ``NewApplyConflict``)."""

    def __init__(self, conflicts: list[tuple[str, str]]) -> None:
        """``conflicts``: (manager as described in messages, dotted field path)."""
        if len(conflicts) == 1:
            ((who, field),) = conflicts
            message = f"Apply failed with 1 conflict: conflict with {who}: {field}"
        else:
            groups: dict[str, list[str]] = {}
            for who, field in conflicts:
                groups.setdefault(who, []).append(field)
            message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(
                f"conflicts with {who}:" + "".join(f"\n- {f}" for f in fields)
                for who, fields in groups.items()
            )
        super().__init__(message)
        self.causes = [
            {"reason": "FieldManagerConflict", "message": f"conflict with {who}", "field": field}
            for who, field in conflicts
        ]


def manager_of(query: dict, user_agent: str) -> str:
    """The field manager of a request: ``?fieldManager=``, else the User-Agent before its first ``/``."""
    return query.get("fieldManager") or user_agent.split("/")[0] or "unknown"


def check_options(query: dict, applying: bool) -> None:
    """422 for patch options kube-apiserver refuses (``PatchOptions`` validation)."""
    manager = query.get("fieldManager", "")
    if applying and not manager:
        raise Invalid(
            "PatchOptions",
            "",
            [("fieldManager", "FieldValueRequired", "Required value: is required for apply patch")],
        )
    if len(manager) > 128 or not manager.isprintable():
        raise Invalid(
            "PatchOptions",
            "",
            [
                (
                    "fieldManager",
                    "FieldValueInvalid",
                    "Invalid value: must be at most 128 printable characters",
                )
            ],
        )
    if "force" in query and not applying:
        raise Invalid(
            "PatchOptions",
            "",
            [("force", "FieldValueForbidden", "Forbidden: may not be specified for non-apply patch")],
        )


def decode(kind: Kind, body: bytes, name: str) -> dict:
    """The applied configuration (YAML or JSON), checked as the real server checks it."""
    try:
        config = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise BadRequest(f"error decoding YAML: {exc}") from None
    if not isinstance(config, dict):
        raise BadRequest("error decoding patch: an apply configuration must be an object")
    if config.get("apiVersion") != kind.api_version:
        raise BadRequest(
            f"Incorrect version specified in apply patch. Specified patch version: {config.get('apiVersion')}, "
            f"expected: {kind.api_version}"
        )
    if config.get("kind") != kind.kind:
        raise BadRequest(f"the kind in the apply patch ({config.get('kind')}) must be {kind.kind}")
    meta = config.get("metadata")
    if not isinstance(meta, dict):
        raise BadRequest("metadata: an apply configuration needs metadata (an object)")
    if "managedFields" in meta:
        raise BadRequest("metadata.managedFields must be nil")
    if meta.get("name", name) != name:
        raise BadRequest(
            f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
        )
    return config


def apply(kind: Kind, current: dict | None, config: dict, manager: str, *, force: bool) -> dict:
    """The object after ``manager`` applies ``config`` to ``current`` (``None``: absent)."""
    schema = openapi.schema_of(kind) if not kind.custom else None
    entries = _entries(current)
    applied = fields_of(config, schema)
    base = copy.deepcopy(current) if current is not None else {"metadata": {}}
    conflicts: list[tuple[dict, Path]] = []
    for entry in entries:
        if (entry["manager"], entry["operation"]) == (manager, "Apply"):
            continue
        for path in sorted(applied & entry["fields"]):
            if _value(config, path) != _value(base, path):
                conflicts.append((entry, path))
    if conflicts and not force:
        raise ApplyConflict([(_describe(entry), _dotted(path)) for entry, path in conflicts])
    for entry, path in conflicts:  # forced: the applier takes the field over
        entry["fields"].discard(path)
    mine = next((e for e in entries if (e["manager"], e["operation"]) == (manager, "Apply")), None)
    others = [e for e in entries if e is not mine]
    owned_by_others = set().union(*(e["fields"] for e in others)) if others else set()
    for path in sorted((mine["fields"] if mine else set()) - applied, reverse=True):
        if not any(_under(other, path) for other in owned_by_others):
            _remove(base, path)
    body = {k: v for k, v in config.items() if k not in ("apiVersion", "kind", "status")}
    merged = patch.strategic_merge(base, body, schema) if schema else patch.merge_patch(base, body)
    new_mine = {"manager": manager, "operation": "Apply", "fields": applied}
    _store(merged, kind, [*(e for e in others if e["fields"]), new_mine])
    return merged


def record_update(kind: Kind, old: dict | None, new: dict, manager: str, subresource: str = "") -> None:
    """Give ``manager`` (an Update) the fields a create, update or non-apply patch set or changed."""
    schema = openapi.schema_of(kind) if not kind.custom else None
    entries = _entries(old)
    before, after = (fields_of(old, schema) if old else set()), fields_of(new, schema)
    changed = {p for p in after if p not in before or _value(new, p) != _value(old, p)}
    for entry in entries:
        entry["fields"] = (entry["fields"] & after) - changed
    mine = next(
        (
            e
            for e in entries
            if (e["manager"], e["operation"], e.get("subresource", "")) == (manager, "Update", subresource)
        ),
        None,
    )
    if mine is None and changed:
        mine = {"manager": manager, "operation": "Update", "fields": set(), "subresource": subresource}
        entries.append(mine)
    if mine is not None and changed:
        mine["fields"] |= changed
        mine.pop("time", None)  # stamped now
    _store(new, kind, [e for e in entries if e["fields"]])


# ---- field sets ----------------------------------------------------------------------------
def fields_of(obj: dict, schema: dict | None) -> set[Path]:
    """The leaf paths of every field ``obj`` sets, as fieldsV1 keys, without server-owned metadata."""
    out: set[Path] = set()
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "status"):
            continue
        if key == "metadata" and isinstance(value, dict):
            meta = {k: v for k, v in value.items() if k not in _SERVER_META}
            if meta:
                _collect(meta, openapi.child(schema, key), ("f:metadata",), out)
        else:
            _collect(value, openapi.child(schema, key), (f"f:{key}",), out)
    return out


def _collect(value: object, schema: dict | None, prefix: Path, out: set[Path]) -> None:
    keys = _list_keys(schema)
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _collect(item, openapi.child(schema, key), (*prefix, f"f:{key}"), out)
    elif isinstance(value, list) and value and keys is not None:
        item_schema = openapi.items(schema)
        for item in value:
            if not keys and not isinstance(item, dict | list):
                out.add((*prefix, "v:" + _json(item)))
            elif isinstance(item, dict) and keys and all(k in item for k in keys):
                at = (*prefix, "k:" + _json({k: item[k] for k in keys}))
                out.add((*at, "."))
                _collect(item, item_schema, at, out)
            else:
                out.add(prefix)  # not keyed as declared: the list is owned whole
                return
    else:
        out.add(prefix)


def _list_keys(schema: dict | None) -> tuple[str, ...] | None:
    """Keys of an associative list, ``()`` for a set, ``None`` for an atomic list."""
    if not schema:
        return None
    resolved = openapi.resolve(schema) or {}
    list_type = schema.get("x-kubernetes-list-type") or resolved.get("x-kubernetes-list-type")
    if list_type == "map":
        return tuple(
            schema.get("x-kubernetes-list-map-keys") or resolved.get("x-kubernetes-list-map-keys") or ()
        )
    if list_type == "set":
        return ()
    if "merge" in (schema.get("x-kubernetes-patch-strategy") or "").split(","):
        key = schema.get("x-kubernetes-patch-merge-key")
        return (key,) if key else ()
    return None


def _value(obj: object, path: Path) -> object:
    """The value at ``path`` (``None`` where it is absent)."""
    for element in path:
        if element == ".":
            return obj is not None
        kind, text = element[0], element[2:]
        if kind == "f":
            obj = obj.get(text) if isinstance(obj, dict) else None
        elif kind == "k":
            wanted = json.loads(text)
            obj = next(
                (
                    i
                    for i in obj or ()
                    if isinstance(i, dict) and all(i.get(k) == v for k, v in wanted.items())
                ),
                None,
            )
        else:  # "v": a set member is its own value
            wanted = json.loads(text)
            return wanted if isinstance(obj, list) and wanted in obj else None
    return obj


def _remove(obj: dict, path: Path) -> None:
    parent, last = obj, path[-1]
    if last == ".":
        path, last = path[:-1], path[-2]
    for element in path[:-1]:
        parent = _value(parent, (element,))
        if parent is None:
            return
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif isinstance(parent, list):
        target = _value(parent, (last,)) if last.startswith("k:") else json.loads(last[2:])
        if target in parent:
            parent.remove(target)


def _under(path: Path, prefix: Path) -> bool:
    stem = prefix[:-1] if prefix[-1] == "." else prefix
    return path[: len(stem)] == stem


def _dotted(path: Path) -> str:
    out = ""
    for element in path:
        if element == ".":
            continue
        out += "." + element[2:] if element.startswith("f:") else f"[{element[2:]}]"
    return out


def _describe(entry: dict) -> str:
    who = f'"{entry["manager"]}"'
    return who if entry["operation"] == "Apply" else f"{who} using {entry['apiVersion']}"


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# ---- managedFields <-> field sets ------------------------------------------------------------
def _entries(obj: dict | None) -> list[dict]:
    out = []
    for entry in ((obj or {}).get("metadata") or {}).get("managedFields") or ():
        out.append({**entry, "fields": _paths(entry.get("fieldsV1") or {}, ())})
    return out


def _paths(trie: dict, prefix: Path) -> set[Path]:
    out: set[Path] = set()
    for key, sub in trie.items():
        if key == ".":
            out.add((*prefix, "."))
        elif sub:
            out |= _paths(sub, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


def _trie(paths: set[Path]) -> dict:
    root: dict = {}
    for path in sorted(paths):
        node = root
        for element in path:
            node = node.setdefault(element, {})
    return root


def _store(obj: dict, kind: Kind, entries: list[dict]) -> None:
    managed = []
    for entry in entries:
        item = {
            "manager": entry["manager"],
            "operation": entry["operation"],
            "apiVersion": entry.get("apiVersion", kind.api_version),
            "time": entry.get("time") or now_iso(),
            "fieldsType": "FieldsV1",
            "fieldsV1": _trie(entry["fields"]),
        }
        if entry.get("subresource"):
            item["subresource"] = entry["subresource"]
        managed.append(item)
    obj.setdefault("metadata", {})["managedFields"] = managed
