"""Typed errors of the SDK. Every error it raises is a `LockdError`."""

from __future__ import annotations

from typing import Optional

import grpc

#: Metadata key of lockd's stable error code (docs/api.md).
ERROR_CODE_KEY = "lockd-error"


class LockdError(Exception):
    """Base class of every error the SDK raises."""


class InvalidArgument(LockdError):
    """The request is invalid as written (checked here, or refused by lockd)."""


class EndpointError(InvalidArgument):
    """An endpoint is not a usable URL, or a setting does not go with it."""


class NotGranted(LockdError):
    """The lock was not granted. `holder`, `token` and `waiters` describe who held it."""

    def __init__(self, message: str, resource: str, holder: str = "", token: Optional[int] = None,
                 waiters: int = 0):
        super().__init__(message)
        self.resource = resource
        self.holder = holder
        self.token = token
        self.waiters = waiters


class Busy(NotGranted):
    """The resource was held and no wait was asked for (a try)."""


class WaitTimedOut(NotGranted):
    """The wait ran out before the lock was handed over."""


class LeaseNotCurrent(LockdError):
    """The lease is not the resource's current lease (expired, released, or never was)."""


class PermissionDenied(LockdError):
    """The caller may not use this resource (another tenant's)."""


class Unauthenticated(PermissionDenied):
    """lockd has a policy and the call carried no identity it knows (no bearer token, no
    client certificate it trusts)."""


class QuotaExceeded(LockdError):
    """A limit of lockd or of the caller's tenant (RESOURCE_EXHAUSTED); `code` says which."""

    def __init__(self, message: str, code: Optional[str]):
        super().__init__(message)
        self.code = code


class Unavailable(LockdError):
    """lockd could not be reached, or did not answer, within the retry budget."""


class TlsError(LockdError):
    """The TLS connection to lockd failed (a certificate refused on either side, bad TLS
    files). Not retried: nothing will change by itself."""


class Rejected(LockdError):
    """lockd refused the call for another reason; `status` is the gRPC status code and `code`
    lockd's stable error code."""

    def __init__(self, message: str, status: grpc.StatusCode, code: Optional[str]):
        super().__init__(message)
        self.status = status
        self.code = code


class FenceRefused(LockdError):
    """fence-proxy (or PostgreSQL's fence check) refused a write: `code` is the SQLSTATE
    (`FN00x`) or the HTTP problem type, `status` the HTTP status (0 for PostgreSQL)."""

    def __init__(self, message: str, code: str, status: int = 0, resource: Optional[str] = None,
                 token: Optional[str] = None, highest: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.status = status
        self.resource = resource
        self.token = token
        self.highest = highest


class StaleToken(FenceRefused):
    """The write's token is older than one already accepted for its resource (FN001; FN003
    when PostgreSQL ended the session's transaction for a newer token; HTTP 409): a newer
    holder exists, so stop working under this lock."""


class LockLost(LockdError):
    """Work was attempted under a lock that is known to be lost."""


def _code_of(err: grpc.RpcError) -> Optional[str]:
    try:
        for key, value in err.trailing_metadata() or ():
            if key == ERROR_CODE_KEY:
                return value if isinstance(value, str) else value.decode()
    except Exception:  # a locally made error has no metadata
        return None
    return None


_TLS_WORDS = ("ssl", "handshake", "certificate", "tls")


def is_tls_failure(err: grpc.RpcError) -> bool:
    details = (err.details() or "").lower()
    return err.code() == grpc.StatusCode.UNAVAILABLE and any(w in details for w in _TLS_WORDS)


#: Status codes after which the same request may be sent again: it may not have reached
#: lockd, or lockd could not serve it right now.
TRANSIENT = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
})


def never_sent(err: grpc.RpcError) -> bool:
    """The call failed before it was sent: no connection to the endpoint could be made."""
    details = (err.details() or "").lower()
    return err.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in details or "connection refused" in details)


def is_transient(err: grpc.RpcError) -> bool:
    return err.code() in TRANSIENT and not is_tls_failure(err)


def from_rpc(err: grpc.RpcError, hint: str = "") -> LockdError:
    """The SDK's error for a failed call."""
    status = err.code()
    details = err.details() or str(status)
    code = _code_of(err)
    if is_tls_failure(err):
        return TlsError(f"TLS with lockd failed: {details}{hint}")
    if status == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(details)
    if status == grpc.StatusCode.FAILED_PRECONDITION and code in (None, "lease_not_current"):
        return LeaseNotCurrent(details)
    if status == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(details)
    if status == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(details)
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return QuotaExceeded(details, code)
    if status in TRANSIENT or status == grpc.StatusCode.CANCELLED:
        return Unavailable(f"lockd is unreachable ({status.name}): {details}{hint}")
    return Rejected(f"lockd refused the call ({status.name}{', ' + code if code else ''}): {details}",
                    status, code)


class Cancelled(LockdError):
    """The caller cancelled the wait (the `cancel` event was set); nothing is held."""
