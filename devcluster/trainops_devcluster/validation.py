"""What the API server validates before storing: structure against the OpenAPI schema (types,
required fields, unknown fields), object names per kind, label keys and values, and a few
semantic rules of the built-in kinds that the package could get wrong."""

from __future__ import annotations

import re

from trainops_devcluster import openapi
from trainops_devcluster.errors import BadRequest, Invalid
from trainops_devcluster.kinds import Kind

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(f"^{_LABEL}$")
DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_QUALIFIED_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
    "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)

Causes = list[tuple[str, str, str]]


def _invalid(field: str, value: object, why: str) -> tuple[str, str, str]:
    import json

    return field, "FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {why}"


def _required(field: str, why: str = "") -> tuple[str, str, str]:
    return field, "FieldValueRequired", "Required value" + (f": {why}" if why else "")


# ---- names and labels ------------------------------------------------------------------
def name_problems(name: str, rule: str, field: str = "metadata.name") -> Causes:
    pattern, msg, limit = (
        (DNS_LABEL, LABEL_MSG, 63) if rule == "label" else (DNS_SUBDOMAIN, SUBDOMAIN_MSG, 253)
    )
    causes = []
    if len(name) > limit:
        causes.append(_invalid(field, name, f"must be no more than {limit} characters"))
    if not pattern.match(name):
        causes.append(_invalid(field, name, msg))
    return causes


def qualified_name_problems(key: str, field: str) -> Causes:
    prefix, _, name = key.rpartition("/")
    causes = []
    if "/" in key and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        causes.append(_invalid(field, key, "prefix part " + SUBDOMAIN_MSG))
    if not name:
        causes.append(_invalid(field, key, "name part must be non-empty"))
    elif len(name) > 63:
        causes.append(_invalid(field, key, "name part must be no more than 63 characters"))
    elif not _QUALIFIED_NAME.match(name):
        causes.append(_invalid(field, key, _QUALIFIED_MSG))
    return causes


def label_problems(labels: dict | None, field: str) -> Causes:
    causes: Causes = []
    for key, value in (labels or {}).items():
        causes += qualified_name_problems(key, field)
        if not isinstance(value, str):
            continue  # a type error, reported by the structural check
        if len(value) > 63:
            causes.append(_invalid(f"{field}[{key}]", value, "must be no more than 63 characters"))
        elif not _LABEL_VALUE.match(value):
            causes.append(_invalid(f"{field}[{key}]", value, _VALUE_MSG))
    return causes


_STANDARD_FINALIZERS = ("kubernetes", "orphan", "foregroundDeletion")


def finalizer_problems(finalizers: list | None, field: str, *, builtin: bool) -> Causes:
    """Finalizer names as kube-apiserver checks them: a qualified name (the cause names the list, as
    apimachinery does), and on a built-in kind a standard name or one with a ``prefix/``."""
    causes: Causes = []
    for i, name in enumerate(finalizers or []):
        if not isinstance(name, str):
            continue  # a type error, reported by the structural check
        causes += qualified_name_problems(name, field)
        if builtin and "/" not in name and name not in _STANDARD_FINALIZERS:
            causes.append(
                _invalid(
                    f"{field}[{i}]",
                    name,
                    "name is neither a standard finalizer name nor is it fully qualified",
                )
            )
    return causes


def _meta_problems(meta: dict, field: str) -> Causes:
    causes = label_problems(meta.get("labels"), f"{field}.labels")
    for key in meta.get("annotations") or {}:
        causes += qualified_name_problems(key, f"{field}.annotations")
    return causes


# ---- structure -------------------------------------------------------------------------
_JSON_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}


def _type_ok(schema: dict, value: object) -> bool:
    if "oneOf" in schema:
        return any(_type_ok(option, value) for option in schema["oneOf"])
    types = schema.get("type")
    if types is None:
        return True
    types = [types] if isinstance(types, str) else types
    if value is None:
        return "null" in types
    for name in types:
        wanted = _JSON_TYPES.get(name)
        if (
            wanted
            and isinstance(value, wanted)
            and not (isinstance(value, bool) and name in ("integer", "number"))
        ):
            return True
    return False


def _walk(
    schema: dict | None, value: object, path: str, causes: Causes, unknown: list[str], types: list[str]
) -> None:
    """Check ``value`` against ``schema``; prune unknown fields (as decoding into Go types does)."""
    schema = openapi.resolve(schema)
    if not schema or schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return
    if not _type_ok(schema, value):
        types.append(f"{path or '<root>'}: expected {schema.get('type')}, got {type(value).__name__}")
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            # status is written by controllers, whose fields the server does not require
            for key in (schema.get("required") or ()) if not path.startswith("status") else ():
                if value.get(key) in (None, "", [], {}) and not isinstance(value.get(key), bool):
                    causes.append(_required(_join(path, key)))
            for key in list(value):
                if key in props:
                    _walk(props[key], value[key], _join(path, key), causes, unknown, types)
                elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                    unknown.append(_join(path, key))
                    del value[key]
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                _walk(schema["additionalProperties"], item, f"{path}[{key}]", causes, unknown, types)
    elif isinstance(value, list) and schema.get("items"):
        for i, item in enumerate(value):
            _walk(schema["items"], item, f"{path}[{i}]", causes, unknown, types)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---- kind-specific rules ---------------------------------------------------------------
def _pod_spec_problems(spec: dict, field: str) -> Causes:
    causes: Causes = []
    for i, container in enumerate(spec.get("containers") or []):
        if isinstance(container, dict) and not container.get("image"):
            causes.append(_required(f"{field}.containers[{i}].image"))
    causes += label_problems(spec.get("nodeSelector"), f"{field}.nodeSelector")
    return causes


def _template_problems(spec: dict, field: str) -> Causes:
    template = spec.get("template") or {}
    causes = _meta_problems(template.get("metadata") or {}, f"{field}.template.metadata")
    return causes + _pod_spec_problems(template.get("spec") or {}, f"{field}.template.spec")


def _kind_problems(kind: Kind, obj: dict) -> Causes:
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    name = obj["metadata"].get("name", "")
    if kind.kind == "Pod":
        return _pod_spec_problems(spec, "spec")
    if kind.kind == "Job":
        causes = _template_problems(spec, "spec")
        restart = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
        if restart not in ("OnFailure", "Never"):
            causes.append(
                _required("spec.template.spec.restartPolicy", 'valid values: "OnFailure", "Never"')
                if restart is None
                else (
                    "spec.template.spec.restartPolicy",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{restart}": supported values: "OnFailure", "Never"',
                )
            )
        if len(name) > 63:  # the name becomes the batch.kubernetes.io/job-name label of its pods
            causes.append(_invalid("metadata.name", name, "must be no more than 63 characters"))
        return causes
    if kind.kind == "Deployment":
        causes = _template_problems(spec, "spec")
        selector = spec.get("selector") or {}
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        from trainops_devcluster.selectors import match_label_selector

        if selector and not match_label_selector(selector, labels):
            causes.append(
                _invalid(
                    "spec.template.metadata.labels", labels, "`selector` does not match template `labels`"
                )
            )
        return causes
    if kind.kind == "Node":
        causes = []
        for i, taint in enumerate(spec.get("taints") or []):
            effect = taint.get("effect") if isinstance(taint, dict) else None
            if effect and effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                causes.append(
                    (
                        f"spec.taints[{i}].effect",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{effect}": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"',
                    )
                )
        return causes
    return []


# ---- entry point -----------------------------------------------------------------------
def validate(kind: Kind, obj: dict, *, field_validation: str = "") -> list[str]:
    """Validate ``obj`` (changed in place: unknown fields are dropped) and return warnings.

    Raises ``Invalid`` (422) with every cause, or ``BadRequest`` (400) for wrong JSON types and,
    with ``field_validation="Strict"``, unknown fields.
    """
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise Invalid(kind.kind, "", [_required("metadata.name", "name or generateName is required")])
    name = meta.get("name") or ""
    causes: Causes = []
    unknown: list[str] = []
    types: list[str] = []
    _walk(openapi.schema_of(kind), obj, "", causes, unknown, types)
    if types:
        raise BadRequest(
            f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: ' + "; ".join(types)
        )
    if field_validation == "Strict" and unknown:
        raise BadRequest("strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in unknown))
    if not name and not meta.get("generateName"):
        causes.append(_required("metadata.name", "name or generateName is required"))
    elif name:
        causes += name_problems(name, kind.name_rule)
    else:
        causes += name_problems(meta["generateName"] + "x", kind.name_rule, "metadata.generateName")
    causes += _meta_problems(meta, "metadata")
    causes += finalizer_problems(meta.get("finalizers"), "metadata.finalizers", builtin=not kind.custom)
    causes += _kind_problems(kind, obj)
    if causes:
        raise Invalid(kind.kind, name, causes)
    return [f'unknown field "{f}"' for f in unknown]


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates")


def _pod_spec_fixed_part(spec: dict) -> dict:
    fixed = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
    for field in ("containers", "initContainers"):
        if isinstance(spec.get(field), list):
            fixed[field] = [
                {k: v for k, v in c.items() if k != "image"} for c in spec[field] if isinstance(c, dict)
            ]
    return fixed


def validate_update(kind: Kind, new: dict, old: dict) -> None:
    """Rules that compare an update with the stored object (pods: most of the spec is immutable)."""
    if kind.kind != "Pod":
        return
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    causes: Causes = []
    if old_spec.get("schedulingGates"):  # a gated pod may gain nodeSelector entries (1.27+, Kueue's TAS)
        old_selector, new_selector = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
        if any(new_selector.get(k) != v for k, v in old_selector.items()):
            causes.append(
                (
                    "spec.nodeSelector",
                    "FieldValueForbidden",
                    "Forbidden: only additions to spec.nodeSelector are allowed (no mutations or deletions)",
                )
            )
        old_spec = {**old_spec, "nodeSelector": new_spec.get("nodeSelector")}
    if _pod_spec_fixed_part(new_spec) != _pod_spec_fixed_part(old_spec):
        causes.append(
            (
                "spec",
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to "
                "existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
                "previously negative)",
            )
        )
    old_tolerations = old_spec.get("tolerations") or []
    if any(t not in (new_spec.get("tolerations") or []) for t in old_tolerations):
        causes.append(
            (
                "spec.tolerations",
                "FieldValueForbidden",
                "Forbidden: existing toleration can not be modified except its tolerationSeconds",
            )
        )
    if causes:
        raise Invalid(kind.kind, new["metadata"].get("name", ""), causes)
