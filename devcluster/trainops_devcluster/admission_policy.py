"""ValidatingAdmissionPolicy, as kube-apiserver enforces it: the stored policies and their bindings,
their CEL evaluated by cel-python (``cel.py``) on what kube-apiserver gives it.

Every write the API server admits (create, update and patch, delete, and subresources such as
``nodes/status`` or ``pods/eviction``), and every pod a controller creates, is matched against the
stored ValidatingAdmissionPolicies (``matchConstraints``: resource rules with operations, groups,
versions, resources and subresources, resource names and scope, excluded rules, namespace and
object selectors) and their ValidatingAdmissionPolicyBindings (``matchResources``,
``validationActions``).  Then, as in kube-apiserver's ``validating/validator.go``: the
``matchConditions`` (one false: the policy does not apply; an error: ``failurePolicy``), the
``variables`` (lazily, once), every ``validation`` (false: denied with ``messageExpression``, else
``message``, else ``failed expression: ...``; an error: ``failurePolicy``).  The first denial
(``Deny``) is answered as kube-apiserver answers it: ``<resource> "<name>" is forbidden:
ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>``, with the
validation's ``reason`` (default ``Invalid``, 422).  ``Warn`` becomes a ``Warning`` header.

The CEL variables are built as kube-apiserver builds them: ``object`` and ``oldObject`` (``null``
for a create's old and a delete's new object), ``request`` (an ``AdmissionRequest`` converted as Go
serializes it: fields that are empty and ``omitempty`` are absent, so ``request.subResource`` of a
plain node request is an error and ``has(request.subResource)`` false), ``namespaceObject``,
``params`` (``null``) and ``variables``.

A policy is checked when it is written: expressions that do not compile are refused (422), and the
type check kube-apiserver runs against each matched kind's schema is written to
``status.typeChecking.expressionWarnings`` (fields that kind does not have, like ``object.spec`` on
a ConfigMap).  The devcluster's type check looks only at field selections on ``object``,
``oldObject`` and ``request``; policy parameters (``paramKind``) are not served.
"""

from __future__ import annotations

import threading
from collections import ChainMap
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainops_devcluster import cel, openapi
from trainops_devcluster.errors import AdmissionDenied, Invalid
from trainops_devcluster.kinds import KINDS, Kind
from trainops_devcluster.selectors import match_label_selector
from trainops_devcluster.store import Store

if TYPE_CHECKING:
    from trainops_devcluster.admission import Attributes

GROUP = "admissionregistration.k8s.io"
POLICIES = f"validatingadmissionpolicies.{GROUP}"
BINDINGS = f"validatingadmissionpolicybindings.{GROUP}"
NAMES = ("object", "oldObject", "request", "params", "namespaceObject", "variables")
_REQUEST_FIELDS = {
    "uid": None,
    "kind": {"group", "version", "kind"},
    "resource": {"group", "version", "resource"},
    "subResource": None,
    "requestKind": {"group", "version", "kind"},
    "requestResource": {"group", "version", "resource"},
    "requestSubResource": None,
    "name": None,
    "namespace": None,
    "operation": None,
    "userInfo": {"username", "uid", "groups", "extra"},
    "dryRun": None,
    "options": None,
}
_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413}


# ---- matching (admission/plugin/policy/matching) -----------------------------------------------------
def _rule_matches(rule: dict, attrs: Attributes) -> bool:
    k = attrs.kind
    if not _among(attrs.operation, rule.get("operations")):
        return False
    if not _among(k.group, rule.get("apiGroups")) or not _among(k.version, rule.get("apiVersions")):
        return False
    if not any(_resource_matches(r, k.plural, attrs.sub) for r in rule.get("resources") or ()):
        return False
    scope = rule.get("scope", "*")
    if scope != "*" and scope != ("Namespaced" if k.namespaced else "Cluster"):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs.name in names


def _among(value: str, allowed: list | None) -> bool:
    return bool(allowed) and ("*" in allowed or value in allowed)


def _resource_matches(pattern: str, plural: str, sub: str) -> bool:
    """``rules.go``: ``nodes`` is the resource alone, ``nodes/status`` one subresource, ``nodes/*`` the
    resource and all its subresources, ``*`` every resource, ``*/*`` everything."""
    resource, _, subresource = pattern.partition("/")
    return resource in ("*", plural) and subresource in ("*", sub)


def _matches(constraints: dict | None, attrs: Attributes, store: Store, *, rules_required: bool) -> bool:
    """Whether ``attrs`` is among what ``constraints`` (a MatchResources) selects."""
    constraints = constraints or {}
    rules = constraints.get("resourceRules") or []
    if (rules or rules_required) and not any(_rule_matches(r, attrs) for r in rules):
        return False
    if any(_rule_matches(r, attrs) for r in constraints.get("excludeResourceRules") or ()):
        return False
    selector = constraints.get("objectSelector")
    if selector and not any(
        obj is not None and match_label_selector(selector, obj["metadata"].get("labels") or {})
        for obj in (attrs.obj, attrs.old)
    ):
        return False
    selector = constraints.get("namespaceSelector")
    if selector and attrs.kind.kind == "Namespace":
        obj = attrs.obj or attrs.old or {}
        return match_label_selector(selector, obj.get("metadata", {}).get("labels") or {})
    if selector and attrs.kind.namespaced:
        namespace = store.find("namespaces", "", attrs.namespace) or {"metadata": {}}
        return match_label_selector(selector, namespace["metadata"].get("labels") or {})
    return True


# ---- compiled policies -------------------------------------------------------------------------------
@dataclass
class _Compiled:
    conditions: list[tuple[str, cel.Program]]
    variables: list[tuple[str, cel.Program]]
    validations: list[tuple[dict, cel.Program, cel.Program | None]]
    failure_policy: str
    error: str = ""  # a configuration kube-apiserver would run but the devcluster cannot


def compile_policy(policy: dict) -> _Compiled:
    """The policy's expressions compiled; ``Invalid`` (as kube-apiserver's validation answers) when
    one does not compile."""
    spec = policy.get("spec") or {}
    name = policy["metadata"].get("name", "")
    problems: list[tuple[str, str, str]] = []

    def build(path: str, text: object) -> cel.Program | None:
        if not isinstance(text, str) or not text.strip():
            problems.append((path, "FieldValueRequired", "Required value"))
            return None
        try:
            program = cel.compile_expression(text, NAMES)
            _check_request_fields(program)
            return program
        except cel.CelError as error:
            problems.append(
                (path, "FieldValueInvalid", f"Invalid value: {text!r}: compilation failed: {error}")
            )
            return None

    conditions = [
        (c.get("name", ""), build(f"spec.matchConditions[{i}].expression", c.get("expression")))
        for i, c in enumerate(spec.get("matchConditions") or [])
    ]
    variables = [
        (v.get("name", ""), build(f"spec.variables[{i}].expression", v.get("expression")))
        for i, v in enumerate(spec.get("variables") or [])
    ]
    validations = []
    for i, v in enumerate(spec.get("validations") or []):
        program = build(f"spec.validations[{i}].expression", v.get("expression"))
        message = v.get("messageExpression")
        message_program = build(f"spec.validations[{i}].messageExpression", message) if message else None
        validations.append((v, program, message_program))
    if problems:
        raise Invalid(f"ValidatingAdmissionPolicy.{GROUP}", name, problems)
    error = "the devcluster does not serve policy parameters (paramKind)" if spec.get("paramKind") else ""
    return _Compiled(conditions, variables, validations, spec.get("failurePolicy") or "Fail", error)


def _check_request_fields(program: cel.Program) -> None:
    """``request`` is typed in kube-apiserver's CEL environment: a field it lacks does not compile."""
    for node in program.tree.iter_subtrees():
        chain = _select_chain(node)
        if not chain or chain[0][0] != "request" or len(chain) < 2:
            continue
        (_, _), (field_name, token) = chain[0], chain[1]
        if field_name not in _REQUEST_FIELDS:
            raise cel.CelError(
                cel.issue(
                    program.text, token.line, _dot(program.text, token), f"undefined field '{field_name}'"
                )
            )
        inner = _REQUEST_FIELDS[field_name]
        if inner is not None and len(chain) > 2 and chain[2][0] not in inner:
            token = chain[2][1]
            raise cel.CelError(
                cel.issue(
                    program.text, token.line, _dot(program.text, token), f"undefined field '{chain[2][0]}'"
                )
            )


def _select_chain(node) -> list[tuple[str, object]]:
    """``a.b.c`` (a ``member_dot`` tree whose root is an identifier) as [(a, token), (b, token), ...];
    empty for anything else (an index, a call, a literal at the root)."""
    if node.data == "member_dot":
        inner = node.children[0]
        head = _select_chain(inner.children[0]) if inner.data == "member" and inner.children else []
        return [*head, (str(node.children[1]), node.children[1])] if head else []
    if node.data == "primary" and node.children and getattr(node.children[0], "data", None) == "ident":
        token = node.children[0].children[0]
        return [(str(token), token)]
    return []


def _dot(text: str, token) -> int:
    """cel-go reports a field selection at its dot: the column of the ``.`` before ``token``."""
    line = text.splitlines()[token.line - 1]
    position = line.rfind(".", 0, token.column - 1)
    return position + 1 if position >= 0 else token.column


def type_warnings(policy: dict) -> list[dict]:
    """``status.typeChecking.expressionWarnings``: each validation (and messageExpression) checked
    against the schema of every kind the policy's rules name (no wildcards, no subresources)."""
    kinds = _checked_kinds(policy)
    warnings = []
    for i, v in enumerate((policy.get("spec") or {}).get("validations") or []):
        for key in ("expression", "messageExpression"):
            text = v.get(key)
            if not text:
                continue
            program = cel.compile_expression(text, NAMES)
            found = [f"{_gvk(k)}: {issues}\n" for k in kinds if (issues := _undefined_fields(program, k))]
            if found:
                warnings.append({"fieldRef": f"spec.validations[{i}].{key}", "warning": "\n".join(found)})
    return warnings


def _checked_kinds(policy: dict) -> list[Kind]:
    found: dict[tuple, Kind] = {}
    for rule in ((policy.get("spec") or {}).get("matchConstraints") or {}).get("resourceRules") or []:
        groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
        if any("*" in g for g in groups) or any("*" in v for v in versions):
            continue
        for resource in rule.get("resources") or []:
            if "*" in resource or "/" in resource:
                continue
            for k in KINDS:
                if k.group in groups and k.version in versions and k.plural == resource:
                    found[(k.group, k.version, k.kind)] = k
    return [found[key] for key in sorted(found)]


def _gvk(kind: Kind) -> str:
    return f"{kind.group}/{kind.version}, Kind={kind.kind}"


def _undefined_fields(program: cel.Program, kind: Kind) -> str:
    issues = []
    for node in program.tree.iter_subtrees_topdown():
        chain = _select_chain(node)
        if len(chain) < 2 or chain[0][0] not in ("object", "oldObject") or node.data != "member_dot":
            continue
        schema = openapi.schema_of(kind)
        for name, token in chain[1:]:
            schema = openapi.resolve(schema) or {}
            properties = schema.get("properties")
            if properties is None or schema.get("x-kubernetes-preserve-unknown-fields"):
                break
            if name not in properties:
                where = _dot(program.text, token)
                issue = cel.issue(program.text, token.line, where, f"undefined field '{name}'")
                if issue not in issues:
                    issues.append(issue)
                break
            schema = properties[name]
    return "\n".join(issues)


# ---- evaluation ----------------------------------------------------------------------------------
def admission_request(attrs: Attributes) -> dict:
    """The ``request`` variable: ``admissionv1.AdmissionRequest`` as Go converts it (``omitempty``
    fields absent when empty; ``uid`` present, empty, as the CEL admission leaves it)."""
    k = attrs.kind
    object_kind = attrs.obj or attrs.old or {}
    group, _, version = (object_kind.get("apiVersion") or k.api_version).rpartition("/")
    kind = {"group": group, "version": version, "kind": object_kind.get("kind") or k.kind}
    resource = {"group": k.group, "version": k.version, "resource": k.plural}
    user = {
        "username": attrs.user.name,
        "uid": attrs.user.uid,
        "groups": list(attrs.user.groups),
        "extra": attrs.user.extra,
    }
    request = {
        "uid": "",
        "kind": kind,
        "resource": resource,
        "subResource": attrs.sub,
        "requestKind": dict(kind),
        "requestResource": dict(resource),
        "requestSubResource": attrs.sub,
        "name": attrs.name,
        "namespace": attrs.namespace,
        "operation": attrs.operation,
        "userInfo": {key: value for key, value in user.items() if value},
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    }
    return {key: value for key, value in request.items() if value not in ("", None) or key == "uid"}


def _message(attrs: Attributes) -> tuple[str, str]:
    """What ``admission.NewForbidden`` names: the resource and the object's name."""
    name = attrs.name or ((attrs.obj or attrs.old or {}).get("metadata") or {}).get("name", "")
    return attrs.kind.resource, name


class Policies:
    """The ValidatingAdmissionPolicies stored in ``store``, enforced."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._compiled: dict[tuple[str, str], _Compiled] = {}

    def validate(self, attrs: Attributes) -> list[str]:
        """Raise ``AdmissionDenied`` on the first denial; return the warnings (``Warn`` actions)."""
        policies = sorted(self.store.list(POLICIES)[0], key=lambda p: p["metadata"]["name"])
        if not policies or attrs.kind.group == GROUP:  # policies never apply to themselves
            return []
        bindings = sorted(self.store.list(BINDINGS)[0], key=lambda b: b["metadata"]["name"])
        warnings: list[str] = []
        values = _Values(attrs, self.store)
        for policy in policies:
            constraints = (policy.get("spec") or {}).get("matchConstraints")
            if not _matches(constraints, attrs, self.store, rules_required=True):
                continue
            compiled = self._compile(policy)
            for binding in bindings:
                spec = binding.get("spec") or {}
                if spec.get("policyName") != policy["metadata"]["name"]:
                    continue
                if not _matches(spec.get("matchResources"), attrs, self.store, rules_required=False):
                    continue
                for message, reason in _decide(compiled, values):
                    text = (
                        f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
                        f"'{binding['metadata']['name']}' denied request: {message}"
                    )
                    actions = spec.get("validationActions") or []
                    if "Warn" in actions:
                        warnings.append(
                            f"Validation failed for ValidatingAdmissionPolicy '{policy['metadata']['name']}' "
                            f"with binding '{binding['metadata']['name']}': {message}"
                        )
                    if "Deny" in actions:
                        resource, name = _message(attrs)
                        raise AdmissionDenied(
                            text, resource=resource, name=name, reason=reason, code=_CODES.get(reason, 422)
                        )
        return warnings

    def _compile(self, policy: dict) -> _Compiled:
        key = (policy["metadata"].get("uid", ""), policy["metadata"].get("resourceVersion", ""))
        with self._lock:
            if key not in self._compiled:
                self._compiled = {k: v for k, v in self._compiled.items() if k[0] != key[0]}
                self._compiled[key] = compile_policy(policy)
            return self._compiled[key]


class _Values(dict):
    """The CEL variables of one request, each converted on first use (a node is a large object)."""

    def __init__(self, attrs: Attributes, store: Store) -> None:
        super().__init__()
        self.attrs, self.store = attrs, store

    def __missing__(self, name: str) -> object:
        attrs = self.attrs
        if name == "request":
            value = admission_request(attrs)
        elif name in ("object", "oldObject"):
            obj = attrs.obj if name == "object" else attrs.old
            value = (
                None
                if obj is None
                else {"apiVersion": attrs.kind.api_version, "kind": attrs.kind.kind, **obj}
            )
        elif name == "namespaceObject" and attrs.kind.namespaced:
            value = self.store.find("namespaces", "", attrs.namespace)
        else:
            value = None  # params (not served), namespaceObject of a cluster-scoped object
        self[name] = cel.to_cel(value)
        return self[name]


def _decide(compiled: _Compiled, base: _Values) -> list[tuple[str, str]]:
    """The denials of one policy for one binding: (message, reason), in the validations' order."""
    activation = ChainMap({}, base)
    activation["variables"] = cel.LazyMap(
        {name: (lambda program=program: program.evaluate(activation)) for name, program in compiled.variables}
    )
    fail = compiled.failure_policy != "Ignore"
    if compiled.error:
        return [(f"failed to configure binding: {compiled.error}", "Invalid")] if fail else []
    errors = []
    for _, program in compiled.conditions:
        try:
            if cel.from_cel(program.evaluate(activation)) is False:
                return []
        except cel.CelError as error:
            errors.append(f"expression '{program.text}' resulted in error: {error}")
    if errors:
        joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        return [(joined, "Invalid")] if fail else []
    denials = []
    for validation, program, message_program in compiled.validations:
        try:
            result = cel.from_cel(program.evaluate(activation))
        except cel.CelError as error:
            if fail:
                denials.append((f"expression '{program.text}' resulted in error: {error}", "Invalid"))
            continue
        if result is True:
            continue
        denials.append(
            (_denial_message(validation, message_program, activation), validation.get("reason") or "Invalid")
        )
    return denials


def _denial_message(validation: dict, message_program: cel.Program | None, activation: dict) -> str:
    message = ""
    if message_program is not None:
        try:
            value = cel.from_cel(message_program.evaluate(activation))
        except cel.CelError:
            value = None
        if isinstance(value, str) and "\n" not in value.strip() and len(value.strip()) <= 5000:
            message = value.strip()
    if not message:
        message = (validation.get("message") or "").strip()
    return message or f"failed expression: {validation.get('expression', '').strip()}"


def prepare(kind: Kind, obj: dict) -> None:
    """A ValidatingAdmissionPolicy being written: refused (``Invalid``) when an expression does not
    compile; its type check's warnings go to ``status.typeChecking`` (what kube-apiserver's
    type-checking controller writes there shortly after)."""
    if kind.resource != POLICIES:
        return
    compile_policy(obj)
    warnings = type_warnings(obj)
    obj["status"] = {"typeChecking": {"expressionWarnings": warnings} if warnings else {}}
