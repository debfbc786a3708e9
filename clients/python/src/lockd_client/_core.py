"""What the threaded and the asyncio clients share: endpoints and credentials, checks made
before any call, leases, request ids, backoff and the renewal schedule."""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import os
import random
import re
import secrets
import socket
import urllib.parse
from typing import List, Optional, Sequence, Tuple, Union

import grpc

from ._proto import lock_pb2 as pb
from .errors import EndpointError, InvalidArgument, Unavailable

#: Default endpoint of lockd.
DEFAULT_ENDPOINT = "http://127.0.0.1:7420"
#: How long transport failures are retried past the caller's wait before giving up.
TRANSPORT_RETRY_FOR = 10.0
#: Time allowed for a call beyond the wait it asks lockd for (network, fsync, queueing).
CALL_GRACE = 5.0
# How long the clean-up of a given-up acquire retries transport failures: the given-up call's
# connection may have just broken, and the first call on its channel fail.
CLEAN_UP_FOR = 10.0
#: Longest wait asked for in one call (lockd's default `limits.wait_max_ms`); a longer wait is
#: made of several calls.
CALL_WAIT_MAX = 300.0
#: First and largest retry delay, in seconds.
BACKOFF_MIN, BACKOFF_MAX = 0.05, 1.0

_RESOURCE = re.compile(r"[A-Za-z0-9\-_.:/@]{1,256}")


class Mode(enum.Enum):
    """What an acquire asks of a read-write lock (EXCLUSIVE: a lock or a semaphore's permit)."""

    EXCLUSIVE = 0
    READ = 1
    WRITE = 2


def check_resource(resource: str) -> None:
    if not isinstance(resource, str) or not _RESOURCE.fullmatch(resource):
        raise InvalidArgument(
            f"bad resource name {resource!r}: 1-256 bytes, allowed are ASCII letters, digits and - _ . : / @")


def new_request_id() -> str:
    """A fresh random request id (128 bits, URL-safe)."""
    return secrets.token_urlsafe(16)


def new_owner_id() -> str:
    """A fresh random owner id, for reentrant locks."""
    return secrets.token_urlsafe(16)


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def safety_margin(ttl: float) -> float:
    """How much earlier than lockd a lease is considered over: a tenth of the TTL, at least
    10 ms (the clocks' rate difference, and the time to notice and stop)."""
    return max(ttl / 10.0, 0.010)


class Backoff:
    """Retry delays: 50 ms doubling to 1 s, each drawn from the upper half of its base."""

    def __init__(self) -> None:
        self.base = BACKOFF_MIN

    def next_delay(self) -> float:
        base = self.base
        self.base = min(base * 2, BACKOFF_MAX)
        return base / 2 + random.uniform(0, base / 2)

    def reset(self) -> None:
        self.base = BACKOFF_MIN


def jittered(interval: float) -> float:
    return interval * random.uniform(0.9, 1.1)


@dataclasses.dataclass(frozen=True)
class Lease:
    """A lease as lockd granted it."""

    resource: str
    lease_id: str
    token: int
    #: The token signed by lockd (`TOKEN.KEY_ID.MAC`), when lockd signs tokens.
    signed_token: Optional[str]
    ttl: float
    expires_at_ms: int
    duplicate: bool
    holds: int
    owner: Optional[str]

    @property
    def fence_token(self) -> str:
        """The token as fence-proxy wants it: the signed form when lockd signs, else the number."""
        return self.signed_token or str(self.token)

    def __repr__(self) -> str:  # the lease id is a capability: never in logs
        return f"Lease(resource={self.resource!r}, token={self.token}, holds={self.holds})"


def set_leases(resources: Sequence[str], granted) -> List[Lease]:
    """The leases of a granted set, one per resource in the order asked."""
    leases = [lease_of(r, m, None) for r, m in zip(resources, granted.leases)]
    if len(granted.leases) != len(resources):
        raise Unavailable(f"lockd answered {len(granted.leases)} leases for {len(resources)}")
    return leases


def lease_of(resource: str, msg: "pb.Lease", owner: Optional[str]) -> Lease:
    return Lease(
        resource=msg.resource or resource,
        lease_id=msg.lease_id,
        token=msg.token,
        signed_token=msg.signed_token or None,
        ttl=msg.ttl_ms / 1000.0,
        expires_at_ms=msg.expires_at_ms,
        duplicate=msg.duplicate,
        holds=max(msg.holds, 1),
        owner=owner,
    )


@dataclasses.dataclass(frozen=True)
class Description:
    resource: str
    held: bool
    holder: str
    token: Optional[int]
    waiters: int
    holds: Optional[int]
    ttl_ms: Optional[int]
    permits: Optional[int]
    permits_held: Optional[int]
    readers: Optional[int]


def description_of(resource: str, d: "pb.DescribeResponse") -> Description:
    return Description(
        resource=resource, held=d.held, holder=d.holder,
        token=d.token if d.held else None, waiters=d.waiters,
        holds=max(d.holds, 1) if d.held else None, ttl_ms=d.ttl_ms if d.held else None,
        permits=d.permits or None, permits_held=d.permits_held if d.permits else None,
        readers=d.readers if d.read_write else None)


@dataclasses.dataclass
class Endpoint:
    target: str
    tls: bool
    loopback: bool


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_endpoint(url: str) -> Endpoint:
    parsed = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise EndpointError(f"bad endpoint {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment or parsed.username:
        raise EndpointError(f"bad endpoint {url!r}: only a scheme, a host and a port")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError as e:
        raise EndpointError(f"bad endpoint {url!r}: {e}") from None
    host = parsed.hostname
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Endpoint(target=target, tls=parsed.scheme == "https", loopback=_is_loopback(host))


@dataclasses.dataclass
class Settings:
    """Checked connection settings of a client."""

    endpoints: List[Endpoint]
    credentials: Optional[grpc.ChannelCredentials]
    metadata: Tuple[Tuple[str, str], ...]
    holder: str
    options: Tuple[Tuple[str, object], ...]


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument(f"cannot read the {what} {path}: {e.strerror}") from None


def _pem(path: Optional[str], what: str, kind: bytes) -> Optional[bytes]:
    """A PEM file of `kind` (a certificate, a private key), read and checked at once."""
    data = _read(path, what)
    if data is not None and not re.search(rb"-----BEGIN [A-Z0-9 ]*" + kind + rb"-----", data):
        raise InvalidArgument(f"the {what} {path} holds no PEM {kind.decode().lower()}")
    return data


def settings(endpoints: Union[str, Sequence[str], None], ca: Optional[str], cert: Optional[str],
             key: Optional[str], token: Optional[str], token_file: Optional[str],
             holder: Optional[str]) -> Settings:
    if endpoints is None:
        endpoints = os.environ.get("LOCKD_ENDPOINT", DEFAULT_ENDPOINT)
    if isinstance(endpoints, str):
        endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
    parsed = [parse_endpoint(e) for e in endpoints]
    if not parsed:
        raise EndpointError("no endpoint given")
    if len({e.tls for e in parsed}) > 1:
        raise EndpointError("the endpoints mix http:// and https://: use one scheme")
    tls = parsed[0].tls
    if (cert is None) != (key is None):
        raise InvalidArgument("a client certificate needs its key, and a key its certificate (cert and key)")
    if not tls and (ca or cert):
        raise EndpointError("TLS files are given but the endpoints are http://; use https://")
    credentials = None
    if tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_pem(ca, "CA file", b"CERTIFICATE"),
            private_key=_pem(key, "client key", b"PRIVATE KEY"),
            certificate_chain=_pem(cert, "client certificate", b"CERTIFICATE"))
    if token is not None and token_file is not None:
        raise InvalidArgument("give a bearer token or a token file, not both")
    if token_file is not None:
        token = (_read(token_file, "token file") or b"").decode("ascii", "replace")
    metadata: Tuple[Tuple[str, str], ...] = ()
    if token is not None:
        token = token.strip()
        if not token or not all(33 <= ord(c) <= 126 for c in token):
            raise InvalidArgument("bearer token: it must be printable ASCII without spaces")
        if not tls and not all(e.loopback for e in parsed):
            raise InvalidArgument(
                "bearer token: not sent over plaintext to another host; use an https:// endpoint")
        metadata = (("authorization", f"Bearer {token}"),)
    options = (
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1_000),
    )
    return Settings(endpoints=parsed, credentials=credentials, metadata=metadata,
                    holder=holder or default_holder(), options=options)


def grant_ended(request_id: str) -> InvalidArgument:
    """The error for an acquire under the caller's own request id whose grant has ended since:
    acquiring again under it would grant one request twice (docs/api.md, `request_id`)."""
    return InvalidArgument(
        f"request id {request_id!r} was granted before and that grant has ended (released or "
        "expired): acquiring under it again would grant the same request twice; use a new "
        "request id to acquire again")


def acquire_request(resource: str, request_id: str, ttl: Optional[float], wait: float,
                    holder: str, owner: Optional[str], permits: int, mode: Mode,
                    downgrade: str = "") -> "pb.AcquireRequest":
    return pb.AcquireRequest(
        resource=resource, request_id=request_id, ttl_ms=ttl_ms(ttl), wait_timeout_ms=ms(wait),
        holder=holder, owner=owner or "", permits=permits, mode=mode.value,
        downgrade_lease_id=downgrade)


def check_acquire(resource: str, ttl: Optional[float], wait: float, owner: Optional[str],
                  permits: int, mode: Mode) -> None:
    check_resource(resource)
    check_times(ttl, wait)
    if not isinstance(mode, Mode):
        raise InvalidArgument(f"mode must be a lockd_client.Mode, not {mode!r}")
    if not isinstance(permits, int) or isinstance(permits, bool) or not 0 <= permits <= 1000:
        raise InvalidArgument(f"permits must be 0 (a lock) or 1..1000, not {permits!r}")
    if owner is not None and (permits or mode is not Mode.EXCLUSIVE):
        raise InvalidArgument("owner (reentrancy) is for exclusive locks, not semaphores or read-write locks")
    if permits and mode is not Mode.EXCLUSIVE:
        raise InvalidArgument("permits and mode do not go together")


def check_times(ttl: Optional[float], wait: float) -> None:
    if ttl is not None and not (isinstance(ttl, (int, float)) and not isinstance(ttl, bool)
                                and 0 < ttl < 4294967.0):
        raise InvalidArgument(f"ttl must be positive seconds below 4294967 (lockd's limit), not {ttl!r}")
    if not (isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait >= 0):
        raise InvalidArgument(f"wait must be zero or positive seconds (math.inf: for ever), not {wait!r}")
    try:
        float(wait)
    except OverflowError:
        raise InvalidArgument(f"wait is too large for seconds (math.inf: for ever): {wait!r}") from None


def check_texts(**fields) -> None:
    """Each of `fields` (request_id, holder, ...) is None or a string."""
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a string, not {value!r}")


def check_set(resources: Sequence[str], ttl: Optional[float], wait: float, **texts) -> List[str]:
    """The checks of an acquire of a set, before any call; the names in sorted order."""
    ordered = sorted_unique(resources)
    check_times(ttl, wait)
    check_texts(**texts)
    return ordered


def ms(seconds: Optional[float]) -> int:
    return 0 if seconds is None else max(int(round(seconds * 1000)), 0)


def ttl_ms(ttl: Optional[float]) -> int:
    """A lease's length in lockd's milliseconds: 0 for lockd's default, and at least 1 for any
    length given (a TTL below a millisecond is not the default)."""
    return 0 if ttl is None else max(int(round(ttl * 1000)), 1)


def not_granted(resource: str, ng: "pb.NotGranted", waited: bool):
    from .errors import Busy, WaitTimedOut

    token = ng.token or None
    held = f"; held by {ng.holder!r} with token {token}, {ng.waiters} waiting" if token else ""
    if ng.reason == pb.NotGranted.WAIT_TIMEOUT or waited:
        return WaitTimedOut(f"{resource}: the wait ran out{held}", resource, ng.holder, token, ng.waiters)
    return Busy(f"{resource}: busy{held}", resource, ng.holder, token, ng.waiters)


def sorted_unique(resources: Sequence[str]) -> List[str]:
    if isinstance(resources, (str, bytes)):
        raise InvalidArgument("a set is a list of resource names, not one string")
    if not isinstance(resources, (list, tuple)):
        raise InvalidArgument(f"a set is a list of resource names, not {resources!r}")
    for r in resources:
        check_resource(r)
    if len(set(resources)) != len(resources):
        raise InvalidArgument("a resource is named twice in the set")
    if not 1 <= len(resources) <= 32:
        raise InvalidArgument("a set has 1 to 32 resources")
    return sorted(resources)
