"""The asyncio client: the same API as `lockd_client.Client`, awaited; a renewal task per held
lock; a wait is cancelled by cancelling its task (`asyncio.timeout`, `task.cancel()`).

    async with lockd_client.aio.Client("http://127.0.0.1:7420") as client:
        async with await client.acquire("inventory:sku-1", ttl=30, wait=10) as lock:
            await write(lock.fence_token)        # lock.lost is an asyncio.Event

See docs/clients/python.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, List, Optional, Sequence, Union

import grpc
import grpc.aio

from . import _core
from ._core import (CALL_GRACE, CALL_WAIT_MAX, CLEAN_UP_FOR, TRANSPORT_RETRY_FOR, Backoff, Description, Lease,
                    Mode)
from ._proto import lock_pb2 as pb
from ._proto import lock_pb2_grpc as pb_grpc
from .client import LostReason
from .errors import (Busy, InvalidArgument, LeaseNotCurrent, LockdError, LockLost, Unavailable,
                     from_rpc, is_transient, never_sent)

log = logging.getLogger("lockd_client")


class Client:
    """The asyncio client; arguments as `lockd_client.Client`. Create it inside the event loop
    that uses it, and `await client.close()` (or `async with`)."""

    def __init__(self, endpoints: Union[str, Sequence[str], None] = None, *, ca: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, holder: Optional[str] = None):
        self._s = _core.settings(endpoints, ca, cert, key, token, token_file, holder)
        self._channels: List[Optional[grpc.aio.Channel]] = [None] * len(self._s.endpoints)
        self._stubs: List[Optional[pb_grpc.LockServiceStub]] = [None] * len(self._s.endpoints)
        self._current = 0
        self._cleanups: set = set()

    async def close(self) -> None:
        if self._cleanups:  # the clean-ups of cancelled acquires finish first
            await asyncio.gather(*self._cleanups, return_exceptions=True)
        for ch in self._channels:
            if ch is not None:
                await ch.close()
        self._channels = [None] * len(self._channels)
        self._stubs = [None] * len(self._stubs)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _stub(self):
        i = self._current
        if self._stubs[i] is None:
            ep = self._s.endpoints[i]
            opts = list(self._s.options)
            ch = (grpc.aio.secure_channel(ep.target, self._s.credentials, options=opts) if ep.tls
                  else grpc.aio.insecure_channel(ep.target, options=opts))
            self._channels[i], self._stubs[i] = ch, pb_grpc.LockServiceStub(ch)
        return i, self._stubs[i]

    def _failed(self, i: int) -> None:
        if self._current == i:
            self._current = (i + 1) % len(self._stubs)

    async def _call_once(self, name: str, request, timeout: float):
        i, stub = self._stub()
        try:
            return await getattr(stub, name)(request, timeout=timeout, metadata=self._s.metadata)
        except grpc.RpcError as e:
            if is_transient(e):
                self._failed(i)
            raise

    async def _call(self, name: str, request, timeout: float = 10.0, repeatable: bool = True):
        last = None
        for _ in range(len(self._s.endpoints)):
            try:
                return await self._call_once(name, request, timeout)
            except grpc.RpcError as e:
                last = e
                if not (is_transient(e) if repeatable else never_sent(e)):
                    break
        raise from_rpc(last) from None

    async def _call_for_a_while(self, name: str, request):
        """`_call`, its transport failures retried with backoff for `CLEAN_UP_FOR` (a clean-up's)."""
        until = time.monotonic() + CLEAN_UP_FOR
        backoff = Backoff()
        while True:
            try:
                return await self._call(name, request, CALL_GRACE)
            except Unavailable:
                if time.monotonic() >= until:
                    raise
            await asyncio.sleep(backoff.next_delay())

    async def acquire(self, resource: str, *, ttl: Optional[float] = None, wait: float = 0.0,
                      request_id: Optional[str] = None, owner: Optional[str] = None, permits: int = 0,
                      mode: Mode = Mode.EXCLUSIVE, holder: Optional[str] = None,
                      on_lost: Optional[Callable] = None) -> "Lock":
        """As `lockd_client.Client.acquire`; cancel the awaiting task to give up the wait."""
        _core.check_acquire(resource, ttl, wait, owner, permits, mode)
        _core.check_texts(request_id=request_id, owner=owner, holder=holder)
        return await self._acquire(resource, ttl, wait, request_id, owner, permits, mode, holder,
                                   on_lost, "")

    async def _acquire(self, resource, ttl, wait, request_id, owner, permits, mode, holder, on_lost,
                       downgrade) -> "Lock":
        own_id = bool(request_id)
        request_id = request_id or _core.new_request_id()
        deadline = time.monotonic() + wait
        backoff = Backoff()
        while True:
            unanswered = False  # the request may have been granted, its answer lost
            call_wait = min(max(deadline - time.monotonic(), 0.0), CALL_WAIT_MAX)
            req = _core.acquire_request(resource, request_id, ttl, call_wait, holder or self._s.holder,
                                        owner, permits, mode, downgrade)
            sent = time.monotonic()
            try:
                resp = await self._call_once("Acquire", req, call_wait + CALL_GRACE)
            except asyncio.CancelledError:
                self._forget_abandoned(req)
                raise
            except grpc.RpcError as e:
                exhausted = e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                budget = deadline if exhausted else deadline + TRANSPORT_RETRY_FOR
                if not (is_transient(e) or exhausted) or time.monotonic() >= budget:
                    raise from_rpc(e) from None
                unanswered = True
            else:
                outcome = resp.WhichOneof("outcome")
                if outcome == "granted":
                    lease = _core.lease_of(resource, resp.granted, owner)
                    if not lease.duplicate:
                        return Lock(self, lease, sent, on_lost)
                    if resp.granted.held:
                        renew_sent = time.monotonic()
                        try:
                            await self.renew(lease.resource, lease.lease_id)
                            return Lock(self, lease, renew_sent, on_lost)
                        except asyncio.CancelledError:
                            self._forget_abandoned(req)
                            raise
                        except LeaseNotCurrent:
                            pass
                        except Unavailable:
                            # Not seen to end (the renewal did not get through): asked again
                            # under the same id, as a transport failure of the acquire is.
                            if time.monotonic() >= deadline + TRANSPORT_RETRY_FOR:
                                raise
                            await self._pause(backoff, req)
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
            await self._pause(backoff, req if unanswered else None)

    async def _pause(self, backoff: Backoff, granted) -> None:
        """The pause before an acquire asks again. Cancelled during it, what request `granted`
        may have been granted is released in the background."""
        try:
            await asyncio.sleep(backoff.next_delay())
        except asyncio.CancelledError:
            if granted is not None:
                self._forget_abandoned(granted)
            raise

    def _forget_abandoned(self, req) -> None:
        """As `lockd_client.Client`'s: after a cancelled wait, in a task of its own, ask once
        more under the same request id without waiting, and release whatever that grants. For
        a set (`req` an AcquireAllRequest, try-only at lockd), the same request again, each
        member released."""
        if isinstance(req, pb.AcquireAllRequest):
            self._background(self._clean_up_set(req))
        else:
            again = pb.AcquireRequest()
            again.CopyFrom(req)
            again.wait_timeout_ms = 0
            self._background(self._clean_up_one(again))

    def _background(self, work, awaited: bool = False) -> "asyncio.Task":
        """Runs `work` in a task of its own, which a cancel of its awaiter does not stop
        (`close()` waits for it); a failure is logged unless the task is `awaited` (its awaiter
        gets the error)."""
        task = asyncio.get_running_loop().create_task(work)
        self._cleanups.add(task)

        def done(t: "asyncio.Task") -> None:
            self._cleanups.discard(t)
            if not t.cancelled() and t.exception() is not None and not awaited:
                log.warning("in the background: %s (a lease left held ends at its TTL)", t.exception())
        task.add_done_callback(done)
        return task

    async def _clean_up_one(self, again: "pb.AcquireRequest") -> None:
        # Whatever the resource looks like (see the threaded client's).
        resp = await self._call_for_a_while("Acquire", again)
        if resp.WhichOneof("outcome") == "granted":
            await self.release(resp.granted.resource or again.resource, resp.granted.lease_id)

    async def _clean_up_set(self, req: "pb.AcquireAllRequest") -> None:
        resp = await self._call_for_a_while("AcquireAll", req)
        if resp.WhichOneof("outcome") == "granted":
            # Member by member, each retried (see the threaded client's).
            for r, lease in zip(req.resources, resp.granted.leases):
                try:
                    await self._call_for_a_while("Release", pb.ReleaseRequest(
                        resource=lease.resource or r, lease_id=lease.lease_id))
                except LockdError as e:
                    log.warning("after a cancelled acquire of a set: releasing %s: %s (it ends at its "
                                "TTL)", lease.resource or r, e)

    async def acquire_all(self, resources: Sequence[str], *, ttl: Optional[float] = None, wait: float = 0.0,
                          request_id: Optional[str] = None, holder: Optional[str] = None) -> "LockSet":
        """As `lockd_client.Client.acquire_all`: every resource at once, or none; cancel the
        awaiting task to give up (a set that may have been granted by then is released in the
        background, and `close()` waits for that)."""
        _core.check_set(resources, ttl, wait, request_id=request_id, holder=holder)
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
                resp = await self._call_once("AcquireAll", req, CALL_GRACE)
            except asyncio.CancelledError:
                self._forget_abandoned(req)
                raise
            except grpc.RpcError as e:
                if not is_transient(e) or time.monotonic() >= deadline + TRANSPORT_RETRY_FOR:
                    raise from_rpc(e) from None
                unanswered = True
            else:
                if resp.WhichOneof("outcome") == "granted":
                    leases = _core.set_leases(resources, resp.granted)
                    if any(l.duplicate for l in leases):
                        # An earlier attempt's grant, its answer lost: renewed now to learn a
                        # safe deadline (see `acquire`); ended under the caller's own id, an error.
                        sent = time.monotonic()
                        try:
                            for l in leases:
                                await self.renew(l.resource, l.lease_id)
                        except asyncio.CancelledError:
                            self._forget_abandoned(req)
                            raise
                        except LeaseNotCurrent:
                            if own_id:
                                raise _core.grant_ended(request_id) from None
                            request_id = _core.new_request_id()
                            continue
                        except Unavailable:
                            if time.monotonic() >= deadline + TRANSPORT_RETRY_FOR:
                                raise
                            await self._pause(backoff, req)
                            continue
                    return LockSet([Lock(self, l, sent, None) for l in leases])
                if time.monotonic() >= deadline:
                    raise _core.not_granted(resp.busy_resource or resources[0], resp.not_granted, wait > 0)
            await self._pause(backoff, req if unanswered else None)

    async def acquire_ordered(self, resources: Sequence[str], *, ttl: Optional[float] = None,
                              wait: float = 0.0, holder: Optional[str] = None) -> "LockSet":
        """As `lockd_client.Client.acquire_ordered`: each lock in sorted order, within one
        `wait`; on any failure (a cancel too) releases those taken, last first."""
        ordered = _core.check_set(resources, ttl, wait, holder=holder)
        deadline = time.monotonic() + wait
        taken: List[Lock] = []
        try:
            for r in ordered:
                taken.append(await self.acquire(r, ttl=ttl, wait=max(deadline - time.monotonic(), 0.0),
                                                holder=holder))
        except BaseException:
            for lock in reversed(taken):
                try:
                    await lock.release()
                except LockdError:
                    pass
            raise
        return LockSet(taken)

    def lock(self, resource: str, **kwargs) -> "_Acquiring":
        """`async with client.lock(resource, ...) as lock:` acquires, and releases at the end."""
        return _Acquiring(self.acquire(resource, **kwargs))

    async def renew(self, resource: str, lease_id: str, timeout: float = 10.0):
        return await self._call("Renew", pb.RenewRequest(resource=resource, lease_id=lease_id), timeout)

    async def release(self, resource: str, lease_id: str) -> bool:
        r = await self._call("Release", pb.ReleaseRequest(resource=resource, lease_id=lease_id),
                                    repeatable=False)
        return r.released

    async def describe(self, resource: str) -> Description:
        _core.check_resource(resource)
        d = await self._call("Describe", pb.DescribeRequest(resource=resource))
        return _core.description_of(resource, d)


class _Acquiring:
    def __init__(self, coro):
        self._coro = coro
        self._lock: Optional[Lock] = None

    async def __aenter__(self) -> "Lock":
        self._lock = await self._coro
        return self._lock

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._lock.__aexit__(exc_type, exc, tb)


class _ReleasedByAsyncWith:
    """`async with` releases; an error of the release is raised unless the block is raising one."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            await self.release()
        except LockdError:
            if exc_type is None:
                raise


class Lock(_ReleasedByAsyncWith):
    """A held lock (asyncio): as `lockd_client.Lock`, with `lost` an asyncio.Event, the
    renewal a task, and `await lock.release()`."""

    def __init__(self, client: Client, lease: Lease, extended_at: float, on_lost: Optional[Callable]):
        self._client = client
        self.lease = lease
        self.lost = asyncio.Event()
        self.lost_reason: Optional[LostReason] = None
        self.lost_detail = ""
        self.deadline = extended_at + lease.ttl - _core.safety_margin(lease.ttl)
        self._callbacks: List[Callable] = [on_lost] if on_lost else []
        self._ended = False
        self._task = asyncio.get_running_loop().create_task(self._renew_loop())

    resource = property(lambda self: self.lease.resource)
    token = property(lambda self: self.lease.token)
    signed_token = property(lambda self: self.lease.signed_token)
    fence_token = property(lambda self: self.lease.fence_token)
    holds = property(lambda self: self.lease.holds)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("ended" if self._ended else "held")
        return f"Lock({self.lease.resource!r}, token={self.lease.token}, {state})"

    def on_lost(self, callback: Callable[["Lock"], None]) -> None:
        if self.lost.is_set():
            callback(self)
        else:
            self._callbacks.append(callback)

    def check(self) -> None:
        if self.lost.is_set():
            raise LockLost(f"the lock of {self.resource} (token {self.token}) was lost: "
                           f"{self.lost_reason.value}: {self.lost_detail}")

    def _lose(self, reason: LostReason, detail: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason, self.lost_detail = reason, detail
        self.lost.set()
        log.warning("lock of %s (token %d) lost: %s %s", self.resource, self.token, reason.value, detail)
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("an on_lost callback failed")

    async def _renew_loop(self) -> None:
        ttl = self.lease.ttl
        interval, margin = ttl / 3, _core.safety_margin(ttl)
        next_at = time.monotonic() + _core.jittered(interval)
        backoff = Backoff()
        while True:
            await asyncio.sleep(max(min(next_at, self.deadline) - time.monotonic(), 0.0))
            now = time.monotonic()
            if now >= self.deadline:
                return self._lose(LostReason.DEADLINE_PASSED,
                                  "no renewal was confirmed before the lease's local deadline")
            if now < next_at:
                continue
            sent = time.monotonic()
            try:
                await self._client.renew(self.lease.resource, self.lease.lease_id,
                                         timeout=max(self.deadline - sent, 0.001))
            except LeaseNotCurrent as e:
                return self._lose(LostReason.NOT_CURRENT, str(e))
            except Unavailable as e:
                log.warning("renewal of %s failed (%s); retrying until the local deadline", self.resource, e)
                next_at = time.monotonic() + backoff.next_delay()
            except LockdError as e:
                return self._lose(LostReason.RENEW_REFUSED, str(e))
            else:
                self.deadline = sent + ttl - margin
                backoff.reset()
                next_at = sent + _core.jittered(interval)

    async def _stop_renewing(self) -> bool:
        if self._ended:
            return False
        self._ended = True
        self._task.cancel()
        # asyncio.wait, not `await self._task`: the renewal task's own CancelledError is not
        # raised here, and the caller's (its task cancelled meanwhile) is not swallowed.
        await asyncio.wait([self._task])
        return True

    async def release(self) -> bool:
        """Stops renewing and releases; idempotent (False when not current, or already released).
        Cancelled, it raises the cancellation, and the release still goes out (sent once: a
        repeat would end one more hold of a reentrant lease)."""
        try:
            if not await self._stop_renewing():
                return False
        except asyncio.CancelledError:
            self._client._background(self._client.release(self.lease.resource, self.lease.lease_id))
            raise
        release = self._client.release(self.lease.resource, self.lease.lease_id)
        return await asyncio.shield(self._client._background(release, awaited=True))

    async def detach(self) -> Lease:
        await self._stop_renewing()
        return self.lease

    async def reenter(self) -> "Lock":
        if self.lease.owner is None:
            raise InvalidArgument(f"the lease of {self.resource} has no owner: acquire it with one to nest it")
        try:
            inner = await self._client.acquire(self.lease.resource, ttl=self.lease.ttl, owner=self.lease.owner)
        except Busy:
            inner = None
        if inner is None or inner.lease.lease_id != self.lease.lease_id:
            if inner is not None:
                await inner.release()
            raise LeaseNotCurrent(f"the lease of {self.resource} with token {self.token} has ended")
        return inner

    async def downgrade(self) -> "Lock":
        """Trades this write lease of a read-write lock for a read lease in one step at lockd.
        This Lock ends either way: when the downgrade fails, its lease is released and it is
        lost (`lost` set, `check()` raises), and the error is raised."""
        if self._ended:
            raise LeaseNotCurrent(f"this Lock of {self.resource} has ended (released, detached or "
                                  f"downgraded before)")
        try:
            await self._stop_renewing()
            return await self._client._acquire(self.lease.resource, self.lease.ttl, 0.0, None, None, 0,
                                               Mode.READ, None, None, self.lease.lease_id)
        except LockdError as e:
            try:
                await self._client.release(self.lease.resource, self.lease.lease_id)
            except LockdError:
                pass
            self._lose(LostReason.NOT_CURRENT, f"the downgrade failed and the lease was released: {e}")
            raise
        except asyncio.CancelledError:
            # Given up: the write lease is released in the background (a downgrade in flight is
            # also asked for again and its reader released, `_forget_abandoned`).
            self._client._background(self._client.release(self.lease.resource, self.lease.lease_id))
            self._lose(LostReason.NOT_CURRENT, "the downgrade was cancelled and the lease released")
            raise



class LockSet(_ReleasedByAsyncWith):
    """Several held locks (asyncio: `acquire_all`, `acquire_ordered`); `async with` releases
    them all."""

    def __init__(self, locks: List[Lock]):
        self.locks = locks

    def __iter__(self):
        return iter(self.locks)

    def __len__(self) -> int:
        return len(self.locks)

    async def release(self) -> bool:
        """Releases every lock, last first; True when each was current."""
        results = [await lock.release() for lock in reversed(self.locks)]
        return all(results)
