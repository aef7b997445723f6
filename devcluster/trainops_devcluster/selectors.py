"""Label and field selectors: parsed from their query-string form, matched against objects."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from trainops_devcluster.store import StoreError


class BadSelector(StoreError):
    code, reason = 400, "BadRequest"


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        try:  # gt / lt compare integers; a non-integer label never matches
            number, bound = int(value), int(self.values[0])
        except (TypeError, ValueError):
            return False
        return number > bound if self.op == "gt" else number < bound


Selector = Callable[[dict], bool]

_TOKEN = re.compile(r"\s*(\(|\)|,|!=|==|=|>|<|!|[^\s(),!=<>]+)")
_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def parse_labels(text: str) -> list[Requirement]:
    """Parse ``a=b,c!=d,e in (x,y),f notin (z),g,!h`` into requirements (400 on a syntax error)."""
    tokens = [t for t in _TOKEN.findall(text or "")]
    reqs: list[Requirement] = []
    pos = 0

    def fail(why: str) -> BadSelector:
        return BadSelector(f"unable to parse requirement: {why} in label selector {text!r}")

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise fail("unexpected end")
        pos += 1
        return tokens[pos - 1]

    while pos < len(tokens):
        token = take()
        if token == "!":
            key = take()
            _check_key(key, fail)
            reqs.append(Requirement(key, "!"))
        else:
            key = token
            _check_key(key, fail)
            nxt = tokens[pos] if pos < len(tokens) else ","
            if nxt == ",":
                reqs.append(Requirement(key, "exists"))
            elif nxt in ("=", "==", "!=", ">", "<"):
                take()
                value = tokens[pos] if pos < len(tokens) and tokens[pos] != "," else ""
                if value:
                    take()
                op = {"==": "=", ">": "gt", "<": "lt"}.get(nxt, nxt)
                reqs.append(Requirement(key, op, (value,)))
            elif nxt in ("in", "notin"):
                take()
                if take() != "(":
                    raise fail(f"expected '(' after {nxt}")
                values = []
                while (tok := take()) != ")":
                    if tok != ",":
                        values.append(tok)
                reqs.append(Requirement(key, nxt, tuple(values)))
            else:
                raise fail(f"unexpected {nxt!r} after {key!r}")
        if pos < len(tokens):
            if take() != ",":
                raise fail("expected ','")
    return reqs


def _check_key(key: str, fail: Callable[[str], BadSelector]) -> None:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise fail(f"invalid label key {key!r}")


def label_selector(text: str | None) -> Selector | None:
    """A predicate on an object's labels, or ``None`` for an empty selector."""
    reqs = parse_labels(text) if text else []
    if not reqs:
        return None
    return lambda obj: all(r.matches(obj.get("metadata", {}).get("labels") or {}) for r in reqs)


def match_label_selector(selector: dict | None, labels: dict) -> bool:
    """Match a ``metav1.LabelSelector`` (matchLabels + matchExpressions); an empty one matches all."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        req = Requirement(expr["key"], ops[expr["operator"]], tuple(expr.get("values") or ()))
        if not req.matches(labels):
            return False
    return True


# ---- field selectors ------------------------------------------------------------------
_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
FIELDS: dict[str, tuple[str, ...]] = {
    "pods": _COMMON_FIELDS
    + (
        "spec.nodeName",
        "status.phase",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "nodes": _COMMON_FIELDS + ("spec.unschedulable",),
    "namespaces": _COMMON_FIELDS + ("status.phase",),
    "jobs.batch": _COMMON_FIELDS + ("status.successful",),
    "events": _COMMON_FIELDS
    + (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
}


def field_value(obj: dict, path: str) -> str:
    """The string a field selector compares: missing fields are ``""``, booleans ``"true"``/``"false"``."""
    value: object = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return "false" if path == "spec.unschedulable" else ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_selector(text: str | None, resource: str) -> Selector | None:
    """A predicate for ``metadata.name=x,spec.nodeName!=y``; 400 for a field the kind does not support."""
    if not text:
        return None
    allowed = FIELDS.get(resource, _COMMON_FIELDS)
    terms = field_terms(text)
    for path, _, _ in terms:
        if path not in allowed:
            raise BadSelector(f"field label not supported: {path}")
    return lambda obj: all((field_value(obj, p) == v) == eq for p, eq, v in terms)


def field_terms(text: str) -> list[tuple[str, bool, str]]:
    """The (field, equals, value) terms of a field selector (``!=``: equals is False); 400 if malformed."""
    terms = []
    for term in text.split(","):
        match = re.fullmatch(r"\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*", term)
        if not match:
            raise BadSelector(f"invalid selector: {text!r}; can't understand {term!r}")
        path, op, value = match.groups()
        terms.append((path, op != "!=", value))
    return terms
