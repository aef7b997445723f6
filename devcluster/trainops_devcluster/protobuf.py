"""Just enough of Kubernetes' protobuf encoding to read the bodies typed Go clients (kubectl's
``create deployment|job|configmap|secret|serviceaccount|namespace|token``, ``create role|clusterrole|
rolebinding|clusterrolebinding``, ``drain``,
``auth can-i``) send as protobuf.

Each message is a table of field number -> (JSON name, type), with the numbers of the
``generated.proto`` files of k8s.io/api and apimachinery.  Go's encoder writes every
non-pointer field, zero or not; a zero value means "unset" as ``omitempty`` does in JSON, so
unknown fields holding only zeros are skipped.  An unknown field with data is answered 415,
asking the client for JSON, rather than dropped.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

from trainops_devcluster.errors import BadRequest

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"


class Unsupported(Exception):
    """A protobuf body the devcluster does not decode (its kind, or a field of it)."""


# ---- wire format ---------------------------------------------------------------------------
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every field of a message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            value, pos = data[pos : pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _is_zero(wire: int, value: int | bytes, depth: int = 0) -> bool:
    """Whether a field holds nothing: 0, an empty string, or a message of zero fields."""
    if wire == 0:
        return value == 0
    if wire in (1, 5):
        return not any(value)
    if not value:
        return True
    if depth > 32:
        return False
    try:
        return all(_is_zero(w, v, depth + 1) for _, w, v in _fields(value))
    except ValueError:
        return False


# ---- types ---------------------------------------------------------------------------------
S, INT, BOOL, BYTES = "string", "int", "bool", "bytes"
INT_SET, BOOL_SET = "int!", "bool!"  # pointer fields: a zero is a value
QUANTITY, INT_OR_STRING, SKIP = "quantity", "intorstring", "skip"
Schema = dict[int, tuple[str, object]]


def rep(kind: object) -> tuple[str, object]:
    return ("repeated", kind)


def dict_of(kind: object) -> tuple[str, object]:
    return ("map", kind)


OBJECT_META: Schema = {
    1: ("name", S),
    2: ("generateName", S),
    3: ("namespace", S),
    5: ("uid", S),
    6: ("resourceVersion", S),
    7: ("generation", INT),
    11: ("labels", dict_of(S)),
    12: ("annotations", dict_of(S)),
    14: ("finalizers", rep(S)),
}
LABEL_SELECTOR: Schema = {
    1: ("matchLabels", dict_of(S)),
    2: ("matchExpressions", rep({1: ("key", S), 2: ("operator", S), 3: ("values", rep(S))})),
}
CONTAINER: Schema = {
    1: ("name", S),
    2: ("image", S),
    3: ("command", rep(S)),
    4: ("args", rep(S)),
    5: ("workingDir", S),
    6: (
        "ports",
        rep(
            {
                1: ("name", S),
                2: ("hostPort", INT),
                3: ("containerPort", INT),
                4: ("protocol", S),
                5: ("hostIP", S),
            }
        ),
    ),
    7: ("env", rep({1: ("name", S), 2: ("value", S)})),
    8: ("resources", {1: ("limits", dict_of(QUANTITY)), 2: ("requests", dict_of(QUANTITY))}),
    13: ("terminationMessagePath", S),
    14: ("imagePullPolicy", S),
    16: ("stdin", BOOL),
    17: ("stdinOnce", BOOL),
    18: ("tty", BOOL),
    20: ("terminationMessagePolicy", S),
}
POD_SPEC: Schema = {
    2: ("containers", rep(CONTAINER)),
    3: ("restartPolicy", S),
    4: ("terminationGracePeriodSeconds", INT_SET),
    5: ("activeDeadlineSeconds", INT_SET),
    6: ("dnsPolicy", S),
    7: ("nodeSelector", dict_of(S)),
    8: ("serviceAccountName", S),
    9: ("serviceAccount", S),
    10: ("nodeName", S),
    11: ("hostNetwork", BOOL),
    16: ("hostname", S),
    17: ("subdomain", S),
    19: ("schedulerName", S),
    20: ("initContainers", rep(CONTAINER)),
    22: (
        "tolerations",
        rep(
            {
                1: ("key", S),
                2: ("operator", S),
                3: ("value", S),
                4: ("effect", S),
                5: ("tolerationSeconds", INT_SET),
            }
        ),
    ),
    24: ("priorityClassName", S),
    25: ("priority", INT_SET),
}
POD_TEMPLATE: Schema = {1: ("metadata", OBJECT_META), 2: ("spec", POD_SPEC)}
DEPLOYMENT: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("replicas", INT_SET),
            2: ("selector", LABEL_SELECTOR),
            3: ("template", POD_TEMPLATE),
            4: (
                "strategy",
                {
                    1: ("type", S),
                    2: (
                        "rollingUpdate",
                        {1: ("maxUnavailable", INT_OR_STRING), 2: ("maxSurge", INT_OR_STRING)},
                    ),
                },
            ),
            5: ("minReadySeconds", INT),
            6: ("revisionHistoryLimit", INT_SET),
            7: ("paused", BOOL),
            9: ("progressDeadlineSeconds", INT_SET),
        },
    ),
    3: ("status", SKIP),  # a create drops what a client writes to status
}
JOB: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("parallelism", INT_SET),
            2: ("completions", INT_SET),
            3: ("activeDeadlineSeconds", INT_SET),
            4: ("selector", LABEL_SELECTOR),
            5: ("manualSelector", BOOL_SET),
            6: ("template", POD_TEMPLATE),
            7: ("backoffLimit", INT_SET),
            8: ("ttlSecondsAfterFinished", INT_SET),
            9: ("completionMode", S),
            10: ("suspend", BOOL_SET),
        },
    ),
    3: ("status", SKIP),
}
DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", INT_SET),
    2: ("preconditions", {1: ("uid", S), 2: ("resourceVersion", S)}),
    3: ("orphanDependents", BOOL_SET),
    4: ("propagationPolicy", S),
    5: ("dryRun", rep(S)),
}
POLICY_RULE: Schema = {
    1: ("verbs", rep(S)),
    2: ("apiGroups", rep(S)),
    3: ("resources", rep(S)),
    4: ("resourceNames", rep(S)),
    5: ("nonResourceURLs", rep(S)),
}
ROLE: Schema = {1: ("metadata", OBJECT_META), 2: ("rules", rep(POLICY_RULE))}
ROLE_BINDING: Schema = {
    1: ("metadata", OBJECT_META),
    2: ("subjects", rep({1: ("kind", S), 2: ("apiGroup", S), 3: ("name", S), 4: ("namespace", S)})),
    3: ("roleRef", {1: ("apiGroup", S), 2: ("kind", S), 3: ("name", S)}),
}
KINDS: dict[str, Schema] = {
    "Deployment": DEPLOYMENT,
    "Job": JOB,
    "ConfigMap": {
        1: ("metadata", OBJECT_META),
        2: ("data", dict_of(S)),
        3: ("binaryData", dict_of(BYTES)),
        4: ("immutable", BOOL_SET),
    },
    "Secret": {
        1: ("metadata", OBJECT_META),
        2: ("data", dict_of(BYTES)),
        3: ("type", S),
        4: ("stringData", dict_of(S)),
        5: ("immutable", BOOL_SET),
    },
    "ServiceAccount": {
        1: ("metadata", OBJECT_META),
        2: ("secrets", rep({1: ("kind", S), 2: ("namespace", S), 3: ("name", S), 5: ("apiVersion", S)})),
        3: ("imagePullSecrets", rep({1: ("name", S)})),
        4: ("automountServiceAccountToken", BOOL_SET),
    },
    "Namespace": {
        1: ("metadata", OBJECT_META),
        2: ("spec", {1: ("finalizers", rep(S))}),
        3: ("status", SKIP),
    },
    "Eviction": {1: ("metadata", OBJECT_META), 2: ("deleteOptions", DELETE_OPTIONS)},
    "DeleteOptions": DELETE_OPTIONS,
    # kubectl create role|clusterrole|rolebinding|clusterrolebinding
    "Role": ROLE,
    "ClusterRole": {**ROLE, 3: ("aggregationRule", {1: ("clusterRoleSelectors", rep(LABEL_SELECTOR))})},
    "RoleBinding": ROLE_BINDING,
    "ClusterRoleBinding": ROLE_BINDING,
    # kubectl create token [--bound-object-kind ... --bound-object-name ... --duration ...]
    "TokenRequest": {
        1: ("metadata", OBJECT_META),
        2: (
            "spec",
            {
                1: ("audiences", rep(S)),
                3: ("boundObjectRef", {1: ("kind", S), 2: ("apiVersion", S), 3: ("name", S), 4: ("uid", S)}),
                4: ("expirationSeconds", INT_SET),
            },
        ),
        3: ("status", SKIP),
    },
    # kubectl auth can-i
    "SelfSubjectAccessReview": {
        1: ("metadata", OBJECT_META),
        2: (
            "spec",
            {
                1: (
                    "resourceAttributes",
                    {
                        1: ("namespace", S),
                        2: ("verb", S),
                        3: ("group", S),
                        4: ("version", S),
                        5: ("resource", S),
                        6: ("subresource", S),
                        7: ("name", S),
                    },
                ),
                2: ("nonResourceAttributes", {1: ("path", S), 2: ("verb", S)}),
            },
        ),
        3: ("status", SKIP),
    },
}


# ---- decoding ------------------------------------------------------------------------------
def unwrap(body: bytes) -> tuple[str, str, bytes]:
    """The (apiVersion, kind, raw message) of a ``k8s\\0``-prefixed ``runtime.Unknown`` envelope."""
    if not body.startswith(_MAGIC):
        raise ValueError("missing the k8s protobuf prefix")
    api_version = kind = ""
    raw = b""
    for number, _, value in _fields(body[len(_MAGIC) :]):
        if number == 1:
            for sub, _, text in _fields(value):
                if sub == 1:
                    api_version = text.decode()
                elif sub == 2:
                    kind = text.decode()
        elif number == 2:
            raw = value
    return api_version, kind, raw


def to_json(body: bytes) -> dict:
    """Decode a protobuf body into its JSON form (400 if malformed, ``Unsupported`` if not understood)."""
    try:
        api_version, kind, raw = unwrap(body)
        if kind not in KINDS:
            raise Unsupported(kind or "an object without a kind")
        return {"apiVersion": api_version, "kind": kind, **_message(raw, KINDS[kind], kind)}
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the protobuf body is malformed: {exc}") from None


def _message(raw: bytes, schema: Schema, where: str) -> dict:
    out: dict = {}
    for number, wire, value in _fields(raw):
        if number not in schema:
            if _is_zero(wire, value):
                continue
            raise Unsupported(f"{where} field {number}")
        name, kind = schema[number]
        if kind == SKIP:
            continue
        path = f"{where}.{name}"
        if isinstance(kind, tuple) and kind[0] == "repeated":
            out.setdefault(name, []).append(_value(kind[1], wire, value, path))
        elif isinstance(kind, tuple) and kind[0] == "map":
            entry = {n: (w, v) for n, w, v in _fields(value)}
            key = entry[1][1].decode() if 1 in entry else ""
            out.setdefault(name, {})[key] = _value(kind[1], *entry.get(2, (2, b"")), path)
        else:
            decoded = _value(kind, wire, value, path)
            if decoded in ("", 0, False, {}) and kind not in (INT_SET, BOOL_SET):
                continue  # omitempty
            out[name] = decoded
    return out


def _value(kind: object, wire: int, value: int | bytes, where: str) -> object:
    if isinstance(kind, dict):
        return _message(value, kind, where)
    if kind == S:
        return value.decode()
    if kind in (INT, INT_SET):
        return _int64(value)
    if kind in (BOOL, BOOL_SET):
        return bool(value)
    if kind == BYTES:
        return base64.b64encode(value).decode()
    if kind == QUANTITY:
        return next((v.decode() for n, _, v in _fields(value) if n == 1), "0")
    if kind == INT_OR_STRING:
        parts = {n: v for n, _, v in _fields(value)}
        return parts.get(3, b"").decode() if parts.get(1) == 1 else _int64(parts.get(2, 0))
    raise ValueError(f"{where}: unknown field type {kind!r}")
