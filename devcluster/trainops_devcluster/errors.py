"""API errors beyond the Store's, and their rendering as Kubernetes ``Status`` objects."""

from __future__ import annotations

from trainops_devcluster.store import Gone, StoreError


class BadRequest(StoreError):
    code, reason = 400, "BadRequest"


class Unauthorized(StoreError):
    code, reason = 401, "Unauthorized"


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
        details = [f"{field}: {message}" for field, _, message in causes]
        joined = details[0] if len(details) == 1 else "[" + ", ".join(details) + "]"
        super().__init__(f'{kind} "{name}" is invalid: {joined}', name=name)
        self.kind, self.causes = kind, causes


class Unprocessable(StoreError):
    """422 without field causes (a JSON patch ``test`` that failed, a path that does not exist)."""

    code, reason = 422, "Invalid"


class AdmissionDenied(StoreError):
    """An admission policy's denial (``admission.NewForbidden`` recast as the policy's reason,
    422 ``Invalid`` by default): ``message`` names the object, ``causes`` holds the denial."""

    code, reason = 422, "Invalid"

    def __init__(
        self, denial: str, *, resource: str, name: str, reason: str = "Invalid", code: int = 422
    ) -> None:
        qualified = f'{resource} "{name}"' if name else resource
        super().__init__(f"{qualified} is forbidden: {denial}", resource=resource, name=name)
        self.causes = [{"message": denial}]
        self.reason, self.code = reason, code


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


def status(error: StoreError) -> dict:
    """The ``Status`` body kube-apiserver answers for ``error`` (apimachinery ``errors.go``):
    ``details`` names the object (``kind`` is the resource plural, ``group`` absent for core;
    the Kind for ``Invalid``), carries ``causes`` and ``retryAfterSeconds``, and is ``{}`` when
    there is nothing to say."""
    details: dict = {}
    if error.name:
        details["name"] = error.name
    if isinstance(error, Invalid):
        details["kind"] = error.kind
        details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in error.causes]
    elif error.resource:
        plural, _, group = error.resource.partition(".")
        if group:
            details["group"] = group
        details["kind"] = plural
        if isinstance(error, AdmissionDenied):
            details["causes"] = error.causes
    elif getattr(error, "causes", None):  # a PodDisruptionBudget's 429, an apply conflict
        details["causes"] = error.causes
    if isinstance(error, TooManyRequests) and error.retry_after:
        details["retryAfterSeconds"] = error.retry_after
    if isinstance(error, InternalError):
        details["causes"] = [{"message": str(error).removeprefix("Internal error occurred: ")}]
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": str(error),
        "reason": error.reason,
        "details": details,
        "code": error.code,
    }
    if isinstance(error, Gone | BadRequest | Unauthorized):  # NewResourceExpired, NewBadRequest,
        # and the authentication filter's 401: no details
        del body["details"]
    return body
