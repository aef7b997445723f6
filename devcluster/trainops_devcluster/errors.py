"""API errors beyond the Store's, and their rendering as Kubernetes ``Status`` objects."""

from __future__ import annotations

from trainops_devcluster.store import StoreError


class BadRequest(StoreError):
    code, reason = 400, "BadRequest"


class Forbidden(StoreError):
    code, reason = 403, "Forbidden"


class MethodNotAllowed(StoreError):
    code, reason = 405, "MethodNotAllowed"


class UnsupportedMediaType(StoreError):
    code, reason = 415, "UnsupportedMediaType"


class Invalid(StoreError):
    """422: ``causes`` are ``(field, reason, message)`` triples such as
    ``("metadata.name", "FieldValueInvalid", 'Invalid value: "A": ...')``."""

    code, reason = 422, "Invalid"

    def __init__(self, kind: str, name: str, causes: list[tuple[str, str, str]]) -> None:
        self.kind, self.name, self.causes = kind, name, causes
        details = [f"{field}: {message}" for field, _, message in causes]
        joined = details[0] if len(details) == 1 else "[" + ", ".join(details) + "]"
        super().__init__(f'{kind} "{name}" is invalid: {joined}')


class Unprocessable(StoreError):
    """422 without field causes (a JSON patch ``test`` that failed, a path that does not exist)."""

    code, reason = 422, "Invalid"


class TooManyRequests(StoreError):
    code, reason = 429, "TooManyRequests"

    def __init__(
        self, message: str, causes: list[dict] | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.causes, self.retry_after = causes or [], retry_after


class InternalError(StoreError):
    code, reason = 500, "InternalError"


class ServiceUnavailable(StoreError):
    code, reason = 503, "ServiceUnavailable"


def status(error: StoreError, *, name: str = "", group: str = "", kind: str = "") -> dict:
    """The ``Status`` body the API server answers for ``error``; ``kind`` is the resource (plural)
    for most errors and the Kind for ``Invalid``, as on a real server."""
    details: dict = {}
    if isinstance(error, Invalid):
        name, kind = error.name, error.kind
        details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in error.causes]
    if isinstance(error, TooManyRequests):
        if error.causes:
            details["causes"] = error.causes
        if error.retry_after:
            details["retryAfterSeconds"] = error.retry_after
    for key, value in (("name", name), ("group", group), ("kind", kind)):
        if value:
            details[key] = value
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": str(error),
        "reason": error.reason,
        "code": error.code,
    }
    if details:
        body["details"] = details
    return body
