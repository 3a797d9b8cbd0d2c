"""Typed errors: temporary ones are retried with backoff, permanent ones end the remediation."""
from __future__ import annotations


class TemporaryError(RuntimeError):
    """Worth retrying: a timeout, a conflict, an API server or slurmctld not answering, a PDB
    that blocks an eviction for now."""


class PermanentError(RuntimeError):
    """Retrying will not help: a missing object, a forbidden call, an invalid request."""


class NotFound(PermanentError):
    """The object does not exist (404): permanent for a remediation, but something a node agent
    started before its Node object was registered waits for."""


def classify_api_status(status: int | None) -> type[RuntimeError]:
    if status == 404:
        return NotFound
    if status is None or status in (408, 409, 429) or status >= 500:
        return TemporaryError
    return PermanentError
