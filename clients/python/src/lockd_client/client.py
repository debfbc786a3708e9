"""The threaded client: blocking calls, a renewal thread per held lock.

    client = lockd_client.Client("http://127.0.0.1:7420")
    with client.lock("inventory:sku-1", ttl=30, wait=10) as lock:
        lock.on_lost(lambda reason: stop_work())     # or check lock.lost (a threading.Event)
        write(lock.fence_token)

See docs/clients/python.md.
"""

from __future__ import annotations

import enum
import heapq
import logging
import threading
import time
from typing import Callable, List, Optional, Sequence, Union

import grpc

from . import _core
from ._core import (CALL_GRACE, CALL_WAIT_MAX, CLEAN_UP_FOR, TRANSPORT_RETRY_FOR, Backoff, Description, Lease,
                    Mode)
from ._proto import lock_pb2 as pb
from ._proto import lock_pb2_grpc as pb_grpc
from .errors import (Busy, Cancelled, InvalidArgument, LeaseNotCurrent, LockdError, LockLost,
                     QuotaExceeded, Unavailable, from_rpc, is_transient, never_sent)

log = logging.getLogger("lockd_client")


class LostReason(enum.Enum):
    """Why a lock was lost."""

    #: No renewal was confirmed before the lease's local deadline (lockd unreachable or slow).
    DEADLINE_PASSED = "deadline_passed"
    #: lockd said the lease is not current any more.
    NOT_CURRENT = "not_current"
    #: A renewal was refused for another reason.
    RENEW_REFUSED = "renew_refused"


class _Endpoints:
    """One channel per endpoint; calls go to the current one and move on after a failure."""

    def __init__(self, s: _core.Settings):
        self.settings = s
        self._stubs: List[Optional[pb_grpc.LockServiceStub]] = [None] * len(s.endpoints)
        self._channels: List[Optional[grpc.Channel]] = [None] * len(s.endpoints)
        self._current = 0
        self._lock = threading.Lock()

    def stub(self) -> "tuple[int, pb_grpc.LockServiceStub]":
        with self._lock:
            i = self._current
            if self._stubs[i] is None:
                ep = self.settings.endpoints[i]
                opts = list(self.settings.options)
                if ep.tls:
                    ch = grpc.secure_channel(ep.target, self.settings.credentials, options=opts)
                else:
                    ch = grpc.insecure_channel(ep.target, options=opts)
                self._channels[i] = ch
                self._stubs[i] = pb_grpc.LockServiceStub(ch)
            return i, self._stubs[i]

    def failed(self, i: int) -> None:
        with self._lock:
            if self._current == i:
                self._current = (i + 1) % len(self._stubs)

    def close(self) -> None:
        with self._lock:
            for ch in self._channels:
                if ch is not None:
                    ch.close()
            self._channels = [None] * len(self._channels)
            self._stubs = [None] * len(self._stubs)


class _Renewer:
    """One thread per client that wakes each held lock when its renewal or its local deadline
    is due, and sends renewals without waiting for them (their answers arrive on gRPC's own
    threads): a held lock costs no thread, and a slow answer delays no other lock."""

    def __init__(self) -> None:
        self._heap: List[tuple] = []
        self._seq = 0
        self._ended = 0
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def forget(self) -> None:
        """A lock ended: its entries are dropped when they are due, or all at once when they
        are most of the heap (so that it stays within twice the held locks)."""
        with self._cv:
            self._ended += 1
            if self._ended > 1024 and self._ended * 2 > len(self._heap):
                self._heap = [e for e in self._heap if not e[2]._ended]
                heapq.heapify(self._heap)
                self._ended = 0

    def wake(self, lock: "Lock", at: float) -> None:
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (at, self._seq, lock))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lockd-renew", daemon=True)
                self._thread.start()
            if self._heap[0][2] is lock:
                self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cv.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, lock = heapq.heappop(self._heap)
            try:
                lock._due()
            except Exception:  # a bug in one lock's step must not stop every other's renewal
                log.exception("renewal step of %s failed", lock.resource)


class Client:
    """A client of one or several lockd endpoints (any instance serves; after UNAVAILABLE the
    next is tried). Thread-safe; share one per process.

    `endpoints`: a URL, a list, or a comma-separated string (default: `$LOCKD_ENDPOINT`, else
    http://127.0.0.1:7420); `https://` with `ca` (and `cert`/`key` for mutual TLS);
    `token`/`token_file`: a bearer token for a lockd with a policy (refused over plaintext to
    another host); `holder`: how this process describes itself (default host:pid).
    """

    def __init__(self, endpoints: Union[str, Sequence[str], None] = None, *, ca: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, holder: Optional[str] = None):
        self._s = _core.settings(endpoints, ca, cert, key, token, token_file, holder)
        self._eps = _Endpoints(self._s)
        self._renewer = _Renewer()

    def close(self) -> None:
        """Closes the connections. Locks still held stop renewing when their next renewal fails."""
        self._eps.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------------------

    def _call_once(self, name: str, request, timeout: float, cancel: Optional[threading.Event] = None,
                   acquired=None, what: str = ""):
        """One call to the current endpoint. With `cancel`, answered unless it is set first:
        then the call is cancelled, what the acquire request `acquired` may have been granted
        is released in the background, and `Cancelled` ("`what` was cancelled") is raised."""
        i, stub = self._eps.stub()
        try:
            if cancel is None:
                # The blocking call: a future costs gRPC a thread per call.
                return getattr(stub, name)(request, timeout=timeout, metadata=self._s.metadata)
            future = getattr(stub, name).future(request, timeout=timeout, metadata=self._s.metadata)
            return _answer_unless_cancelled(future, cancel, lambda: self._forget_abandoned(acquired), what)
        except grpc.FutureCancelledError:
            raise Cancelled(f"{what} was cancelled") from None
        except grpc.RpcError as e:
            if is_transient(e):
                self._eps.failed(i)
            raise

    def _call(self, name: str, request, timeout: float = 10.0, repeatable: bool = True):
        """A call other than an acquire, tried on each endpoint in turn while they are unreachable
        when it is `repeatable`; otherwise (a release: a repeat would end one more hold of a
        reentrant lease) on another only when it was never sent."""
        last: Optional[grpc.RpcError] = None
        for _ in range(len(self._s.endpoints)):
            try:
                return self._call_once(name, request, timeout)
            except grpc.RpcError as e:
                last = e
                if not (is_transient(e) if repeatable else never_sent(e)):
                    break
        assert last is not None
        raise from_rpc(last) from None

    def _call_for_a_while(self, name: str, request):
        """`_call`, its transport failures retried with backoff for `CLEAN_UP_FOR` (a clean-up's)."""
        until = time.monotonic() + CLEAN_UP_FOR
        backoff = Backoff()
        while True:
            try:
                return self._call(name, request, CALL_GRACE)
            except Unavailable:
                if time.monotonic() >= until:
                    raise
            time.sleep(backoff.next_delay())

    def acquire(self, resource: str, *, ttl: Optional[float] = None, wait: float = 0.0,
                request_id: Optional[str] = None, owner: Optional[str] = None, permits: int = 0,
                mode: Mode = Mode.EXCLUSIVE, holder: Optional[str] = None,
                cancel: Optional[threading.Event] = None, on_lost: Optional[Callable] = None) -> "Lock":
        """Acquires the lock of `resource`, waiting up to `wait` seconds (0: try once).

        Raises `Busy` (held, no wait), `WaitTimedOut`, `Cancelled` (when `cancel` is set),
        and the errors of `lockd_client.errors`. Transport failures are retried with the same
        request id (a grant whose answer was lost is returned, never doubled) until
        `TRANSPORT_RETRY_FOR` past the wait.
        """
        _core.check_acquire(resource, ttl, wait, owner, permits, mode)
        _core.check_texts(request_id=request_id, owner=owner, holder=holder)
        _not_cancelled(cancel, f"the acquire of {resource}")
        return self._acquire(resource, ttl, wait, request_id, owner, permits, mode, holder, cancel,
                             on_lost, "")

    def _acquire(self, resource, ttl, wait, request_id, owner, permits, mode, holder, cancel,
                 on_lost, downgrade) -> "Lock":
        own_id = bool(request_id)
        request_id = request_id or _core.new_request_id()
        deadline = time.monotonic() + wait
        backoff = Backoff()
        while True:
            unanswered = False  # the request may have been granted, its answer lost
            remaining = max(deadline - time.monotonic(), 0.0)
            call_wait = min(remaining, CALL_WAIT_MAX)
            req = _core.acquire_request(resource, request_id, ttl, call_wait, holder or self._s.holder,
                                        owner, permits, mode, downgrade)
            sent = time.monotonic()
            try:
                resp = self._call_once("Acquire", req, call_wait + CALL_GRACE, cancel, req,
                                       f"the acquire of {resource}")
            except grpc.RpcError as e:
                exhausted = e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                budget = deadline if exhausted else deadline + TRANSPORT_RETRY_FOR
                if not (is_transient(e) or exhausted) or time.monotonic() >= budget:
                    raise from_rpc(e) from None
                log.debug("acquire of %s failed (%s); retrying with the same request id", resource, e.code())
                unanswered = True
            else:
                outcome = resp.WhichOneof("outcome")
                if outcome == "granted":
                    lease = _core.lease_of(resource, resp.granted, owner)
                    if not lease.duplicate:
                        return Lock(self, lease, sent, on_lost)
                    # The grant of an earlier attempt whose answer was lost: nobody renewed it
                    # and when it was made is unknown, so renew it now to learn a safe deadline.
                    # If it has ended under an id this call made, it was never used: ask anew;
                    # under the caller's own id it may have been, and is never granted twice.
                    if resp.granted.held:
                        renew_sent = time.monotonic()
                        try:
                            self._check_grant(lease, cancel, req, f"the acquire of {resource}")
                            return Lock(self, lease, renew_sent, on_lost)
                        except LeaseNotCurrent:
                            pass
                        except Unavailable:
                            # Not seen to end (the renewal did not get through): asked again
                            # under the same id, as a transport failure of the acquire is.
                            if time.monotonic() >= deadline + TRANSPORT_RETRY_FOR:
                                raise
                            self._pause(backoff, cancel, req, f"the acquire of {resource}", granted=True)
                            continue
                    if own_id:
                        raise _core.grant_ended(request_id)
                    request_id = _core.new_request_id()
                    continue
                if outcome == "not_granted":
                    if time.monotonic() >= deadline:
                        raise _core.not_granted(resource, resp.not_granted, wait > 0)
                else:
                    raise Unavailable("lockd sent an empty AcquireResponse")
            self._pause(backoff, cancel, req, f"the acquire of {resource}", granted=unanswered)

    def _check_grant(self, lease: Lease, cancel: Optional[threading.Event], req, what: str) -> None:
        """Renews a grant answered as a duplicate to `req`, to learn that it is still the
        caller's; a `cancel` set meanwhile ends the acquire (`Cancelled`) and releases the
        grant in the background."""
        if cancel is None:
            self.renew(lease.resource, lease.lease_id)
            return
        try:
            self._call_once("Renew", pb.RenewRequest(resource=lease.resource, lease_id=lease.lease_id),
                            10.0, cancel, req, what)
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    def _pause(self, backoff: Backoff, cancel: Optional[threading.Event], req, what: str,
               granted: bool) -> None:
        """The pause before an acquire (of a lock, or of a set: `req` an AcquireAllRequest) asks
        again. A cancel during it ends the acquire, and what its request may have been granted
        (`granted`) is released in the background."""
        pause = backoff.next_delay()
        if cancel is None:
            time.sleep(pause)
        elif cancel.wait(pause):
            if granted:
                self._forget_abandoned(req)
            raise Cancelled(f"{what} was cancelled")

    def _forget_abandoned(self, req) -> None:
        """An acquire given up while it waited may have been granted as it was cancelled, its
        answer dropped: nobody would renew or release that lease until its TTL ran out. In
        the background, ask once more under the same request id without waiting, and release
        whatever that grants (the original grant, or a new one). For a set (`req` an
        AcquireAllRequest, try-only at lockd) the same request again, each member released."""
        if isinstance(req, pb.AcquireAllRequest):
            return self._forget_abandoned_set(req)
        again = pb.AcquireRequest()
        again.CopyFrom(req)
        again.wait_timeout_ms = 0

        def clean_up() -> None:
            try:
                # Asked again whatever the resource looks like: the given-up call may still be
                # on its way to lockd, and a resource free now would be granted to it next. This
                # call either finds that grant, or comes first: granted (and released here), the
                # late call then finds that grant ended; busy, the late call joins the queue and
                # its cancellation, sent after it, takes it out.
                resp = self._call_for_a_while("Acquire", again)
                if resp.WhichOneof("outcome") == "granted":
                    self.release(resp.granted.resource or again.resource, resp.granted.lease_id)
            except LockdError as e:
                log.warning("after a cancelled acquire of %s: %s (a lease granted as it was cancelled "
                            "ends at its TTL)", again.resource, e)
        threading.Thread(target=clean_up, name="lockd-cancelled-acquire", daemon=True).start()

    def _forget_abandoned_set(self, req: "pb.AcquireAllRequest") -> None:
        threading.Thread(target=self._clean_up_set, args=(req,), name="lockd-cancelled-acquire-all",
                         daemon=True).start()

    def _clean_up_set(self, req: "pb.AcquireAllRequest") -> None:
        """What a given-up set may have been granted, asked for again and released."""
        try:
            resp = self._call_for_a_while("AcquireAll", req)
        except LockdError as e:
            log.warning("after a cancelled acquire of the set %s: %s (leases granted as it was "
                        "cancelled end at their TTL)", list(req.resources), e)
            return
        if resp.WhichOneof("outcome") == "granted":
            # Member by member, each retried (a set's leases are never reentrant, so a
            # repeated release ends nothing more): one that fails keeps none of the others.
            for r, lease in zip(req.resources, resp.granted.leases):
                try:
                    self._call_for_a_while("Release", pb.ReleaseRequest(
                        resource=lease.resource or r, lease_id=lease.lease_id))
                except LockdError as e:
                    log.warning("after a cancelled acquire of a set: releasing %s: %s (it ends at "
                                "its TTL)", lease.resource or r, e)

    def lock(self, resource: str, **kwargs) -> "Lock":
        """`acquire`, for `with client.lock(...) as lock:` (released when the block ends)."""
        return self.acquire(resource, **kwargs)

    def renew(self, resource: str, lease_id: str, timeout: float = 10.0) -> "pb.RenewResponse":
        """Renews a lease once (a Lock does this by itself)."""
        return self._call("Renew", pb.RenewRequest(resource=resource, lease_id=lease_id), timeout)

    def _renew_async(self, resource: str, lease_id: str, timeout: float, done: Callable) -> None:
        """Sends one renewal to the current endpoint; `done(error or None)` gets the outcome."""
        i, stub = self._eps.stub()
        future = stub.Renew.future(pb.RenewRequest(resource=resource, lease_id=lease_id),
                                   timeout=timeout, metadata=self._s.metadata)

        def finished(f) -> None:
            try:
                f.result()
            except grpc.RpcError as e:
                if is_transient(e):
                    self._eps.failed(i)
                return done(from_rpc(e))
            except Exception as e:  # cancelled: the channel closed
                return done(Unavailable(f"the renewal was not answered: {e!r}"))
            done(None)
        future.add_done_callback(finished)

    def release(self, resource: str, lease_id: str) -> bool:
        """Releases a lease (or one hold of a reentrant one); False when it was not current."""
        r = self._call("Release", pb.ReleaseRequest(resource=resource, lease_id=lease_id),
                                    repeatable=False)
        return r.released

    def describe(self, resource: str) -> Description:
        """Who holds `resource`, with which token, and how many wait."""
        _core.check_resource(resource)
        return _core.description_of(resource, self._call("Describe", pb.DescribeRequest(resource=resource)))

    def acquire_all(self, resources: Sequence[str], *, ttl: Optional[float] = None, wait: float = 0.0,
                    request_id: Optional[str] = None, holder: Optional[str] = None,
                    cancel: Optional[threading.Event] = None) -> "LockSet":
        """Takes every resource at once, or none (one commit at lockd; at most 32). Try-only at
        lockd: with a wait, asked again with backoff until it ends. Raises `Busy` /
        `WaitTimedOut` naming the first held member, and `Cancelled` when `cancel` is set (a
        set that may have been granted by then is released in the background)."""
        _core.check_set(resources, ttl, wait, request_id=request_id, holder=holder)
        what = f"the acquire of the set {list(resources)}"
        _not_cancelled(cancel, what)
        own_id = bool(request_id)
        request_id = request_id or _core.new_request_id()
        deadline = time.monotonic() + wait
        backoff = Backoff()
        while True:
            unanswered = False  # the request may have been granted, its answer lost
            req = pb.AcquireAllRequest(resources=list(resources), request_id=request_id,
                                       ttl_ms=_core.ttl_ms(ttl), holder=holder or self._s.holder)
            sent = time.monotonic()
            try:
                resp = self._call_once("AcquireAll", req, CALL_GRACE, cancel, req, what)
            except grpc.RpcError as e:
                if not is_transient(e) or time.monotonic() >= deadline + TRANSPORT_RETRY_FOR:
                    raise from_rpc(e) from None
                unanswered = True
            else:
                if resp.WhichOneof("outcome") == "granted":
                    leases = _core.set_leases(resources, resp.granted)
                    if any(l.duplicate for l in leases):
                        sent = time.monotonic()
                        try:
                            for l in leases:
                                self._check_grant(l, cancel, req, what)
                        except LeaseNotCurrent:
                            if own_id:
                                raise _core.grant_ended(request_id) from None
                            request_id = _core.new_request_id()
                            continue
                        except Unavailable:
                            if time.monotonic() >= deadline + TRANSPORT_RETRY_FOR:
                                raise
                            self._pause(backoff, cancel, req, what, granted=True)
                            continue
                    return LockSet([Lock(self, l, sent, None) for l in leases])
                if time.monotonic() >= deadline:
                    raise _core.not_granted(resp.busy_resource or resources[0], resp.not_granted, wait > 0)
            self._pause(backoff, cancel, req, what, granted=unanswered)

    def acquire_ordered(self, resources: Sequence[str], *, ttl: Optional[float] = None, wait: float = 0.0,
                        holder: Optional[str] = None, cancel: Optional[threading.Event] = None) -> "LockSet":
        """Takes each lock in sorted order, waiting in each queue, within one `wait`; on any
        failure releases those taken, last first. Two callers never deadlock."""
        ordered = _core.check_set(resources, ttl, wait, holder=holder)
        _not_cancelled(cancel, f"the acquire of the set {list(resources)}")
        deadline = time.monotonic() + wait
        taken: List[Lock] = []
        try:
            for r in ordered:
                taken.append(self.acquire(r, ttl=ttl, wait=max(deadline - time.monotonic(), 0.0),
                                          holder=holder, cancel=cancel))
        except BaseException:
            for lock in reversed(taken):
                try:
                    lock.release()
                except LockdError:
                    pass
            raise
        return LockSet(taken)


def _not_cancelled(cancel: Optional[threading.Event], what: str) -> None:
    """`cancel` is an Event (or None), not set yet: an acquire cancelled before it began sends
    nothing."""
    if cancel is not None and not isinstance(cancel, threading.Event):
        raise InvalidArgument(f"cancel must be a threading.Event, not {cancel!r}")
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"{what} was cancelled before it began")


def _answer_unless_cancelled(future, cancel: threading.Event, abandon: Callable[[], None], what: str):
    """The answer of a call in flight, unless `cancel` is set first: then the call is cancelled,
    `abandon()` cleans up what it may have been granted, and `Cancelled` is raised."""
    done = threading.Event()
    future.add_done_callback(lambda _f: done.set())
    while not done.wait(0.05):
        if cancel.is_set():
            future.cancel()
            abandon()
            raise Cancelled(f"{what} was cancelled")
    return future.result()


class _ReleasedByWith:
    """`with` releases; an error of the release is raised unless the block is raising one."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except LockdError:
            if exc_type is None:
                raise


class Lock(_ReleasedByWith):
    """A held lock: renews itself at a third of its TTL (jittered) and says when it is lost.

    Lost is final: `lost` (a threading.Event) is set and the `on_lost` callbacks run (on the
    renewal thread) when lockd refuses a renewal, or when no renewal was confirmed before the
    lease's local deadline: the send time of the request that last extended it, plus the TTL,
    minus a safety margin. That deadline ends before lockd's, so stop working under the token
    when it fires. `release()` is idempotent; `with` releases.
    """

    def __init__(self, client: Client, lease: Lease, extended_at: float, on_lost: Optional[Callable]):
        self._client = client
        self.lease = lease
        self.lost = threading.Event()
        self.lost_reason: Optional[LostReason] = None
        self.lost_detail = ""
        self.deadline = extended_at + lease.ttl - _core.safety_margin(lease.ttl)
        self._callbacks: List[Callable] = [on_lost] if on_lost else []
        self._cb_lock = threading.Lock()
        self._ended = False
        self._in_flight = False
        self._backoff = Backoff()
        self._next_at = time.monotonic() + _core.jittered(lease.ttl / 3)
        client._renewer.wake(self, min(self._next_at, self.deadline))

    resource = property(lambda self: self.lease.resource)
    token = property(lambda self: self.lease.token, doc="The fencing token's number.")
    signed_token = property(lambda self: self.lease.signed_token)
    fence_token = property(lambda self: self.lease.fence_token,
                           doc="The token to attach to every write: signed when lockd signs.")
    holds = property(lambda self: self.lease.holds)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("ended" if self._ended else "held")
        return f"Lock({self.lease.resource!r}, token={self.lease.token}, {state})"

    def on_lost(self, callback: Callable[["Lock"], None]) -> None:
        """Calls `callback(lock)` once when the lock is lost (at once if it already is)."""
        with self._cb_lock:
            if not self.lost.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def check(self) -> None:
        """Raises `LockLost` if the lock is lost (call it between steps of long work)."""
        if self.lost.is_set():
            raise LockLost(f"the lock of {self.resource} (token {self.token}) was lost: "
                           f"{self.lost_reason.value}: {self.lost_detail}")

    def _lose(self, reason: LostReason, detail: str, ended_too: bool = False) -> None:
        """Signals the loss once; not for a lock already ended (released, detached), unless
        `ended_too` (a downgrade that failed after its renewals stopped)."""
        with self._cb_lock:
            if (self._ended and not ended_too) or self.lost.is_set():
                return
            self.lost_reason, self.lost_detail = reason, detail
            self.lost.set()
            callbacks, self._callbacks = self._callbacks, []
        log.warning("lock of %s (token %d) lost: %s %s", self.resource, self.token, reason.value, detail)
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("an on_lost callback failed")

    def _due(self) -> None:
        """The renewer's wake-up: the local deadline passed, or a renewal is due."""
        with self._cb_lock:
            if self._ended or self.lost.is_set():
                return
            now = time.monotonic()
            if now >= self.deadline:
                lose = True      # even with a renewal in flight: its answer comes too late
            elif self._in_flight:
                return
            elif now < self._next_at:
                self._client._renewer.wake(self, min(self._next_at, self.deadline))
                return
            else:
                lose = False
                self._in_flight = True
        if lose:
            return self._lose(LostReason.DEADLINE_PASSED,
                              "no renewal was confirmed before the lease's local deadline")
        sent = time.monotonic()
        # Until the answer comes, the deadline must still fire: wake then too.
        self._client._renewer.wake(self, self.deadline)
        self._client._renew_async(self.lease.resource, self.lease.lease_id,
                                  max(self.deadline - sent, 0.001), lambda e: self._answered(sent, e))

    def _answered(self, sent: float, error: Optional[LockdError]) -> None:
        ttl = self.lease.ttl
        with self._cb_lock:
            self._in_flight = False
            if self._ended or self.lost.is_set():
                return
            if error is None:
                self.deadline = sent + ttl - _core.safety_margin(ttl)
                self._backoff.reset()
                self._next_at = sent + _core.jittered(ttl / 3)
            elif isinstance(error, Unavailable):
                log.warning("renewal of %s failed (%s); retrying until the local deadline", self.resource, error)
                self._next_at = time.monotonic() + self._backoff.next_delay()
        if error is None or isinstance(error, Unavailable):
            self._client._renewer.wake(self, min(self._next_at, self.deadline))
        elif isinstance(error, LeaseNotCurrent):
            self._lose(LostReason.NOT_CURRENT, str(error))
        else:
            self._lose(LostReason.RENEW_REFUSED, str(error))

    def _stop_renewing(self) -> bool:
        """Stops renewing; False if the lock had already ended. A renewal in flight may still
        be answered: its answer is ignored."""
        with self._cb_lock:
            if self._ended:
                return False
            self._ended = True
        self._client._renewer.forget()
        return True

    def release(self) -> bool:
        """Stops renewing and releases (one hold of a reentrant lease). True when this call
        ended it at lockd; False when it was not current any more, or already released."""
        if not self._stop_renewing():
            return False
        return self._client.release(self.lease.resource, self.lease.lease_id)

    def detach(self) -> Lease:
        """Stops renewing without releasing, and hands the lease over."""
        self._stop_renewing()
        return self.lease

    def reenter(self) -> "Lock":
        """One more hold of this reentrant lease (acquired with an `owner`): the same lease
        and token, a Lock of its own that releases that hold."""
        if self.lease.owner is None:
            raise InvalidArgument(f"the lease of {self.resource} has no owner: acquire it with one to nest it")
        try:
            inner = self._client.acquire(self.lease.resource, ttl=self.lease.ttl, owner=self.lease.owner)
        except Busy:
            inner = None
        if inner is None or inner.lease.lease_id != self.lease.lease_id:
            if inner is not None:
                inner.release()
            raise LeaseNotCurrent(f"the lease of {self.resource} with token {self.token} has ended")
        return inner

    def downgrade(self) -> "Lock":
        """Trades this write lease of a read-write lock for a read lease in one step at lockd.
        This Lock ends either way: when the downgrade fails, its lease is released and it is
        lost (`lost` set, `check()` raises), and the error is raised."""
        if not self._stop_renewing():
            raise LeaseNotCurrent(f"this Lock of {self.resource} has ended (released, detached or "
                                  f"downgraded before)")
        try:
            return self._client._acquire(self.lease.resource, self.lease.ttl, 0.0, None, None, 0,
                                         Mode.READ, None, None, None, self.lease.lease_id)
        except LockdError as e:
            try:
                self._client.release(self.lease.resource, self.lease.lease_id)
            except LockdError:
                pass
            self._lose(LostReason.NOT_CURRENT, f"the downgrade failed and the lease was released: {e}",
                       ended_too=True)
            raise



class LockSet(_ReleasedByWith):
    """Several held locks (`acquire_all`, `acquire_ordered`); `with` releases them all."""

    def __init__(self, locks: List[Lock]):
        self.locks = locks

    def __iter__(self):
        return iter(self.locks)

    def __len__(self) -> int:
        return len(self.locks)

    def release(self) -> bool:
        """Releases every lock, last first; True when each was current."""
        results = [lock.release() for lock in reversed(self.locks)]
        return all(results)



__all__ = ["Client", "Lock", "LockSet", "LostReason", "Mode", "QuotaExceeded"]
