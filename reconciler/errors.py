"""Typed errors: temporary ones are retried with backoff, permanent ones end the remediation.

The Kubernetes API's failures are classified as apimachinery's pkg/api/errors does it (v0.34): by the
`reason` of the Status object the API server returns (metav1.StatusReason, pkg/apis/meta/v1/types.go),
and by the HTTP code only when the reason is not one of the known ones. Never by message text.
"""
from __future__ import annotations

import json
from typing import Any


class TemporaryError(RuntimeError):
    """Worth retrying: a timeout, a conflict, an API server or slurmctld not answering, a PDB
    that blocks an eviction for now."""


class PermanentError(RuntimeError):
    """Retrying will not help: a missing object, a forbidden call, an invalid request."""


class ApiError(Exception):
    """A failed Kubernetes API call, with the Status object's code and reason."""

    code: int = 0
    reason: str = ""  # metav1.StatusReason

    def __init__(self, message: str, code: int | None = None, reason: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason


class Unauthorized(ApiError, PermanentError):
    """The credentials were refused."""

    code, reason = 401, "Unauthorized"


class Forbidden(ApiError, PermanentError):
    """RBAC refuses the call."""

    code, reason = 403, "Forbidden"


class NotFound(ApiError, PermanentError):
    """The object does not exist: permanent for a remediation, but something a node agent started
    before its Node object was registered waits for."""

    code, reason = 404, "NotFound"


class AlreadyExists(ApiError, PermanentError):
    """A create found the object there already (the same name: asked already)."""

    code, reason = 409, "AlreadyExists"


class Conflict(ApiError, TemporaryError):
    """A write with a stale resourceVersion lost to another writer: read again and retry."""

    code, reason = 409, "Conflict"


class Gone(ApiError, TemporaryError):
    """No longer available (a watch's resourceVersion): list again."""

    code, reason = 410, "Gone"


class Expired(ApiError, TemporaryError):
    """A watch's resourceVersion expired: list again."""

    code, reason = 410, "Expired"


class Invalid(ApiError, PermanentError):
    """The object was refused by validation."""

    code, reason = 422, "Invalid"


class BadRequest(ApiError, PermanentError):
    """The request can never succeed."""

    code, reason = 400, "BadRequest"


class MethodNotAllowed(ApiError, PermanentError):
    """Not supported on this resource."""

    code, reason = 405, "MethodNotAllowed"


class NotAcceptable(ApiError, PermanentError):
    """Content type not acceptable."""

    code, reason = 406, "NotAcceptable"


class RequestEntityTooLarge(ApiError, PermanentError):
    """The request is too large."""

    code, reason = 413, "RequestEntityTooLarge"


class UnsupportedMediaType(ApiError, PermanentError):
    """The content type sent is not accepted."""

    code, reason = 415, "UnsupportedMediaType"


class TooManyRequests(ApiError, TemporaryError):
    """Throttled, or an eviction a PodDisruptionBudget refuses for now."""

    code, reason = 429, "TooManyRequests"


class InternalError(ApiError, TemporaryError):
    """The server failed; the outcome is unknown."""

    code, reason = 500, "InternalError"


class ServerTimeout(ApiError, TemporaryError):
    """The server could not finish in time."""

    code, reason = 500, "ServerTimeout"


class StorageReadError(ApiError, TemporaryError):
    """The server's store failed."""

    code, reason = 500, "StorageReadError"


class ServiceUnavailable(ApiError, TemporaryError):
    """Try again later."""

    code, reason = 503, "ServiceUnavailable"


class Timeout(ApiError, TemporaryError):
    """The request timed out."""

    code, reason = 504, "Timeout"


BY_REASON: dict[str, type] = {c.reason: c for c in (
    Unauthorized, Forbidden, NotFound, AlreadyExists, Conflict, Gone, Expired, Invalid, BadRequest, MethodNotAllowed,
    NotAcceptable, RequestEntityTooLarge, UnsupportedMediaType, TooManyRequests, InternalError, ServerTimeout,
    StorageReadError, ServiceUnavailable, Timeout)}
# The reason an HTTP code stands for when the Status has no known reason (apimachinery's Is* fall back so).
BY_CODE: dict[int, type] = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone, 422: Invalid,
                            400: BadRequest, 405: MethodNotAllowed, 406: NotAcceptable, 413: RequestEntityTooLarge,
                            415: UnsupportedMediaType, 429: TooManyRequests, 500: InternalError,
                            503: ServiceUnavailable, 504: Timeout}


class ApiUnavailable(ApiError, TemporaryError):
    """No known reason: a server error, or a timeout (408)."""


class ApiRefused(ApiError, PermanentError):
    """No known reason: a client error."""


def status_of(body: Any) -> dict:
    """The Status object in an error response's body ({} when there is none)."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


def api_error(what: str, code: int | None, body: Any = None) -> ApiError:
    """The typed error for a failed call: by the Status's reason, else by the code."""
    status = status_of(body)
    reason = status.get("reason") or ""
    code = int(status.get("code") or code or 0)
    cls = BY_REASON.get(reason) or BY_CODE.get(code)
    if cls is None:
        cls = ApiUnavailable if code == 0 or code >= 500 or code == 408 else ApiRefused
    message = status.get("message") or (body if isinstance(body, str) else "")
    text = f"{what}: {code} {reason or cls.reason} {message[:300]}".strip()
    return cls(text, code, reason or cls.reason)
