"""How statekeeper reads S3's failures: which error codes mean what, and which are worth retrying.

botocore retries whole requests itself (the client's retry mode, see `client.py`); what is left
for statekeeper's own code are the failures botocore cannot see: per-key errors inside a 200
DeleteObjects answer, and a response body that breaks off mid-stream. Both use the code sets and
the jittered back-off here, so there is one notion of "transient" for the whole backend.
"""

from __future__ import annotations

import random

import botocore.exceptions as bce
import urllib3.exceptions

EXISTS_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
DENIED_CODES = frozenset(
    {"AccessDenied", "403", "AllAccessDisabled", "AccountProblem", "InvalidAccessKeyId", "SignatureDoesNotMatch"}
)
CREDENTIAL_CODES = frozenset({"ExpiredToken", "InvalidToken", "TokenRefreshRequired", "InvalidAccessKeyId"})
RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "OperationAborted",
        "500",
        "502",
        "503",
        "504",
    }
)
STREAM_ERRORS: tuple[type[BaseException], ...] = (
    bce.ResponseStreamingError,
    bce.IncompleteReadError,
    bce.ReadTimeoutError,
    bce.ConnectionClosedError,
    bce.EndpointConnectionError,
    bce.ConnectTimeoutError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)
"""Failures of a response body being read: the reader resumes with a ranged GET (`download.py`)."""


def error_code(e: bce.ClientError) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a client error; the code falls back to the status."""
    err = e.response.get("Error", {})
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(err.get("Code", "") or status), status


def is_conflict(e: bce.ClientError) -> bool:
    """A conditional write (`If-None-Match: *`) refused because the key exists."""
    code, status = error_code(e)
    return code in EXISTS_CODES or status in (409, 412)


def backoff(attempt: int, base: float = 0.05, cap: float = 5.0) -> float:
    """Exponential backoff with jitter, so parallel workers do not retry in lockstep."""
    return float(min(cap, base * 2**attempt) * random.uniform(0.5, 1.0))
