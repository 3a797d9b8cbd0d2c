"""botocore's errors as the reconciler's typed errors: retry what may pass, stop on what will not."""
from __future__ import annotations

from gpufleet.reconciler.errors import PermanentError, TemporaryError

# Error codes AWS documents as retryable (throttling, capacity, transient service faults).
TEMPORARY_CODES = {
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "RequestLimitExceeded",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "RequestTimeout", "RequestTimeoutException",
    "ServiceUnavailable", "InternalError", "InternalFailure", "InternalServiceError", "ServiceFailure",
    "ResourceContentionFault", "ScalingActivityInProgressFault", "SlowDown",
}


def is_temporary(err: BaseException | None) -> bool:
    """Connection failures, timeouts, throttling and 5xx answers may pass; the rest will not."""
    from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError, HTTPClientError

    if isinstance(err, (BotoConnectionError, HTTPClientError)):
        return True
    if isinstance(err, ClientError):
        code = err.response.get("Error", {}).get("Code", "")
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in TEMPORARY_CODES or status >= 500 or status == 429
    return False


def typed(what: str, err: BaseException) -> RuntimeError:
    """The typed error for a failed AWS call, naming the call."""
    return (TemporaryError if is_temporary(err) else PermanentError)(f"AWS {what}: {err}")
