"""Just enough of Kubernetes' protobuf encoding to read the bodies typed Go clients send as
protobuf that the devcluster must understand: ``Eviction`` (``kubectl drain``) and ``DeleteOptions``.
Any other protobuf body is answered 415, asking the client for JSON."""

from __future__ import annotations

from collections.abc import Iterator

from trainops_devcluster.errors import BadRequest

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def unwrap(body: bytes) -> tuple[str, str, bytes]:
    """The (apiVersion, kind, raw message) of a ``k8s\\0``-prefixed ``runtime.Unknown`` envelope."""
    if not body.startswith(_MAGIC):
        raise ValueError("missing the k8s protobuf prefix")
    api_version = kind = ""
    raw = b""
    for number, value in _fields(body[len(_MAGIC) :]):
        if number == 1:
            for sub, text in _fields(value):
                if sub == 1:
                    api_version = text.decode()
                elif sub == 2:
                    kind = text.decode()
        elif number == 2:
            raw = value
    return api_version, kind, raw


def _object_meta(raw: bytes) -> dict:
    names = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    return {names[n]: v.decode() for n, v in _fields(raw) if n in names}


def _delete_options(raw: bytes) -> dict:
    options: dict = {}
    for number, value in _fields(raw):
        if number == 1:
            options["gracePeriodSeconds"] = _int64(value)
        elif number == 2:
            pre = {1: "uid", 2: "resourceVersion"}
            options["preconditions"] = {pre[n]: v.decode() for n, v in _fields(value) if n in pre}
        elif number == 3:
            options["orphanDependents"] = bool(value)
        elif number == 4:
            options["propagationPolicy"] = value.decode()
        elif number == 5:
            options.setdefault("dryRun", []).append(value.decode())
    return options


def to_json(body: bytes) -> dict:
    """Decode an Eviction or DeleteOptions sent as protobuf into its JSON form (400 if malformed)."""
    try:
        api_version, kind, raw = unwrap(body)
        if kind == "Eviction":
            obj: dict = {"apiVersion": api_version, "kind": kind}
            for number, value in _fields(raw):
                if number == 1:
                    obj["metadata"] = _object_meta(value)
                elif number == 2:
                    obj["deleteOptions"] = _delete_options(value)
            return obj
        if kind == "DeleteOptions":
            return {"apiVersion": api_version, "kind": kind, **_delete_options(raw)}
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the protobuf body is malformed: {exc}") from None
    raise Unsupported(kind)


class Unsupported(Exception):
    """A protobuf body of a kind the devcluster does not decode."""
