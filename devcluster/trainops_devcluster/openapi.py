"""Kubernetes' own OpenAPI schemas (from the ``kubernetes-validate`` package), loaded once, lazily.

One source for three jobs: the ``/openapi/v3`` documents kubectl downloads before ``create -f``,
the strategic-merge-patch rules (which lists merge by which key, which are atomic) and the
server's structural validation (types, required fields, unknown fields).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from trainops_devcluster.kinds import K8S_VERSION, KUEUE_VERSIONS, Kind, Served, served

_REF = "#/$defs/"


@functools.cache
def definitions() -> dict[str, dict]:
    """Every definition of the Kubernetes release the devcluster claims to be, keyed like
    ``io.k8s.api.batch.v1.Job``; custom kinds get an open schema of their own."""
    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    defs = json.loads((root / f"v{K8S_VERSION}-local" / "_definitions.json").read_text())["$defs"]
    for kind in dict.fromkeys(k for version in KUEUE_VERSIONS for k in served(version).kinds):
        if kind.custom:
            defs[custom_schema_name(kind)] = {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "x-kubernetes-group-version-kind": [
                    {"group": kind.group, "version": kind.version, "kind": kind.kind}
                ],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"$ref": _REF + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
                },
            }
    return defs


def custom_schema_name(kind: Kind) -> str:
    reversed_group = ".".join(reversed(kind.group.split(".")))
    return f"{reversed_group}.{kind.version}.{kind.kind}"


def schema_of(kind: Kind) -> dict:
    return definitions()[kind.schema or custom_schema_name(kind)]


def resolve(schema: dict | None) -> dict | None:
    """Follow a ``$ref`` (one level is all the definitions use)."""
    if schema and "$ref" in schema:
        return definitions()[schema["$ref"][len(_REF) :]]
    return schema


def child(schema: dict | None, key: str) -> dict | None:
    """The schema of property ``key`` of an object schema (a map's value schema for maps)."""
    schema = resolve(schema)
    if not schema:
        return None
    props = schema.get("properties")
    if props and key in props:
        return props[key]
    return (
        schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
    )


def items(schema: dict | None) -> dict | None:
    schema = resolve(schema)
    return schema.get("items") if schema else None


# ---- the /openapi/v3 documents ---------------------------------------------------------
def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@functools.cache
def v3_document(path: str, kinds_served: Served) -> bytes | None:
    """The OpenAPI v3 document of one group version (``api/v1``, ``apis/batch/v1``), or ``None``."""
    kinds = [k for k in kinds_served.kinds if _gv_path(k.group, k.version) == path]
    if not kinds:
        return None
    defs = definitions()
    names = _closure([k.schema or custom_schema_name(k) for k in kinds], defs)
    paths = {}
    for k in kinds:
        gvk = [{"group": k.group, "version": k.version, "kind": k.kind}]
        scope = "/namespaces/{namespace}" if k.namespaced else ""
        ref = {"$ref": "#/components/schemas/" + (k.schema or custom_schema_name(k))}
        body = {"content": {"application/json": {"schema": ref}}}
        params = [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
        ]
        operation = {
            "x-kubernetes-group-version-kind": gvk[0],
            "parameters": params,
            "responses": {"200": body},
        }
        paths[f"/{path}{scope}/{k.plural}/{{name}}"] = {
            "get": {"x-kubernetes-action": "get", **operation},
            "put": {"x-kubernetes-action": "put", "requestBody": body, **operation},
            "patch": {"x-kubernetes-action": "patch", **operation},
        }
        paths[f"/{path}{scope}/{k.plural}"] = {
            "post": {"x-kubernetes-action": "post", "requestBody": body, **operation}
        }
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": f"v{K8S_VERSION}"},
        "paths": paths,
        "components": {"schemas": {name: defs[name] for name in sorted(names)}},
    }
    return json.dumps(doc).replace('"' + _REF, '"#/components/schemas/').encode()


@functools.cache
def v3_root(kinds_served: Served) -> bytes:
    entries = {}
    for group, version in kinds_served.group_versions():
        path = _gv_path(group, version)
        digest = hashlib.sha512(path.encode() + K8S_VERSION.encode()).hexdigest()[:32].upper()
        entries[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return json.dumps({"paths": entries}).encode()


def _closure(roots: list[str], defs: dict[str, dict]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_refs(defs[name]))
    return seen


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"][len(_REF) :]] if isinstance(node.get("$ref"), str) else []
        for value in node.values():
            found.extend(_refs(value))
        return found
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []
