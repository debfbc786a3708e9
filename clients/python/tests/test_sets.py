"""Sets of locks in both clients: the asyncio client's `acquire_all`, `acquire_ordered` and
`downgrade`, and a set's acquire given up (a `cancel` for the threaded client, a cancelled task
for asyncio), which leaves nothing held, even while its check of an earlier grant fails."""

import asyncio
import secrets
import threading
import time

import pytest

import lockd_client
import lockd_client.aio

from held import give_up_held_call


def names(what, n=2):
    run = secrets.token_hex(4)
    return [f"sets/{run}/{what}-{i}" for i in range(n)]


def free_soon(client, resources):
    """Each of `resources` is free within 10 s (long before the 30 s TTL of a lease left behind)."""
    for r in resources:
        deadline = time.monotonic() + 10
        while client.describe(r).held:
            assert time.monotonic() < deadline, f"{r} stayed held: a given-up set's grant was left behind"
            time.sleep(0.02)


def cancelled(acquire_all, rs, before_the_cancel, **kwargs):
    """What `acquire_all(rs, cancel=..., **kwargs)`, run on a thread, ends with when its cancel
    is set once `before_the_cancel()` returns."""
    cancel = threading.Event()
    got = []

    def run():
        try:
            got.append(acquire_all(rs, cancel=cancel, **kwargs))
        except lockd_client.LockdError as e:
            got.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    before_the_cancel()
    cancel.set()
    t.join(30)
    assert not t.is_alive(), "a cancelled acquire_all kept waiting"
    return got[0]


def test_a_set_wait_is_cancelled_and_leaves_nothing(testbed):
    c = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    rs = names("cancel")
    blocker = c.acquire(rs[1], ttl=30)
    got = cancelled(c.acquire_all, rs, lambda: None, ttl=30, wait=120)
    assert isinstance(got, lockd_client.Cancelled), got
    assert "the set" in str(got)
    assert blocker.release() is True
    free_soon(c, rs)


def test_a_set_given_up_while_its_check_of_the_held_grant_fails_is_released(testbed):
    # The set was granted under this request id; asked again through the lossy forwarder,
    # whose renewals' answers are all cut, the SDK keeps checking; cancelled then, it releases
    # the set in the background instead of leaving it held until its TTL.
    direct = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    lossy = lockd_client.Client(testbed.servers["lossy"]["endpoint"])
    rs = names("given-up")
    rid = f"set-given-up-{secrets.token_hex(4)}"
    first = direct.acquire_all(rs, ttl=30, request_id=rid)
    testbed.command("cut-renewals on")
    try:
        got = cancelled(lossy.acquire_all, rs, lambda: testbed.command("wait-cuts 1"), ttl=30,
                        request_id=rid)
        assert isinstance(got, lockd_client.Cancelled), got
        free_soon(direct, rs)
    finally:
        testbed.command("cut-renewals off")
    assert first.release() is False


def test_asyncio_sets_ordered_sets_and_a_downgrade(testbed):
    async def go():
        rs = names("aio", 3)
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            async with await c.acquire_all(rs, ttl=30) as s:
                assert [l.resource for l in s] == rs and len(s) == 3
                assert len({l.token for l in s}) >= 1 and all(l.token > 0 for l in s)
                with pytest.raises(lockd_client.Busy) as busy:
                    await c.acquire_all(list(reversed(rs)))
                assert busy.value.resource in rs
                with pytest.raises(lockd_client.Busy):
                    await c.acquire_ordered(rs)
            for r in rs:
                assert not (await c.describe(r)).held
            ordered = await c.acquire_ordered(list(reversed(rs)), ttl=30)
            assert [l.resource for l in ordered] == sorted(rs)
            assert await ordered.release() is True
            assert await ordered.release() is False
            rw = names("rw", 1)[0]
            writer = await c.acquire(rw, ttl=30, mode=lockd_client.Mode.WRITE)
            reader = await writer.downgrade()
            assert reader.resource.startswith(f"{rw}@read-") and reader.token > writer.token
            assert (await c.describe(rw)).readers == 1
            assert await writer.release() is False  # traded, not held twice
            with pytest.raises(lockd_client.Busy):
                await c.acquire(rw, mode=lockd_client.Mode.WRITE)
            second = await c.acquire(rw, ttl=30, mode=lockd_client.Mode.READ)
            assert await second.release() and await reader.release()
            # A downgrade that fails (of an exclusive lock) ends the Lock, and says so.
            exclusive = await c.acquire(rw + "-x", ttl=30)
            with pytest.raises(lockd_client.LockdError):
                await exclusive.downgrade()
            assert exclusive.lost.is_set()
            with pytest.raises(lockd_client.LockLost):
                exclusive.check()
            assert not (await c.describe(rw + "-x")).held
            # A request id of the caller's own is granted once, for a set too.
            rid = f"aio-set-{secrets.token_hex(4)}"
            once = await c.acquire_all(rs, ttl=30, request_id=rid)
            again = await c.acquire_all(rs, ttl=30, request_id=rid)
            assert [l.token for l in again] == [l.token for l in once]
            assert await once.release() is True
            with pytest.raises(lockd_client.InvalidArgument, match="grant has ended"):
                await c.acquire_all(rs, ttl=30, request_id=rid)
    asyncio.run(go())


def test_an_asyncio_set_wait_is_cancelled_and_leaves_nothing(testbed):
    rs = names("aio-cancel")

    async def go():
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            blocker = await c.acquire(rs[0], ttl=30)
            task = asyncio.create_task(c.acquire_all(rs, ttl=30, wait=120))
            await asyncio.sleep(0)  # the task starts and asks
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await blocker.release() is True
    asyncio.run(go())  # close() waits for the clean-ups
    free_soon(lockd_client.Client(testbed.servers["lockd"]["endpoint"]), rs)


def test_an_asyncio_set_given_up_while_its_check_of_the_held_grant_fails_is_released(testbed):
    rs = names("aio-given-up")
    rid = f"aio-set-given-up-{secrets.token_hex(4)}"

    async def go():
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as a:
            first = await a.acquire_all(rs, ttl=30, request_id=rid)
            lossy = lockd_client.aio.Client(testbed.servers["lossy"]["endpoint"])
            testbed.command("cut-renewals on")
            try:
                task = asyncio.create_task(lossy.acquire_all(rs, ttl=30, request_id=rid))
                await asyncio.to_thread(testbed.command, "wait-cuts 1")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await lossy.close()  # waits for the clean-up
            finally:
                testbed.command("cut-renewals off")
            await asyncio.to_thread(free_soon, lockd_client.Client(testbed.servers["lockd"]["endpoint"]), rs)
            assert await first.release() is False
    asyncio.run(go())


def test_sets_handled_after_they_were_given_up_leave_nothing_held(testbed):
    # The test bed holds the AcquireAll back, drops its cancellation, and passes it on once
    # lockd has answered a later call on the connection (the clean-up's): lockd then grants the
    # given-up set, which the clean-up must find and release. Threaded, then asyncio.
    direct = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    rs = names("late")
    lossy = lockd_client.Client(testbed.servers["lossy"]["endpoint"])
    testbed.command("hold-next-call")
    got = cancelled(lossy.acquire_all, rs, lambda: testbed.command("wait-held"), ttl=30, wait=60)
    assert isinstance(got, lockd_client.Cancelled), got
    testbed.command("wait-held-answered")
    free_soon(direct, rs)

    rs = names("aio-late")

    async def go():
        c = lockd_client.aio.Client(testbed.servers["lossy"]["endpoint"])
        await give_up_held_call(testbed, lambda: c.acquire_all(rs, ttl=30, wait=60))
        await c.close()  # waits for the clean-up
    asyncio.run(go())
    for r in rs:
        assert not direct.describe(r).held, f"{r} stayed held: the given-up set's grant was left behind"


def test_a_set_clean_up_releases_every_member_though_one_release_fails(testbed):
    # The clean-up of a given-up set asks again under its request id and releases member by
    # member: a release that fails (its answer lost every time) keeps none of the others held.
    from lockd_client._proto import lock_pb2 as pb
    c = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    rs = names("clean-up", 3)
    rid = f"clean-up-{secrets.token_hex(4)}"
    for lock in c.acquire_all(rs, ttl=30, request_id=rid):
        lock.detach()  # renewed by nobody, as a grant whose answer was lost
    real = c._call_for_a_while

    def first_release_fails(name, request):
        if name == "Release" and request.resource == rs[0]:
            raise lockd_client.Unavailable("the release's answer was lost")
        return real(name, request)
    c._call_for_a_while = first_release_fails
    c._clean_up_set(pb.AcquireAllRequest(resources=rs, request_id=rid, ttl_ms=30000))
    assert c.describe(rs[0]).held
    assert [c.describe(r).held for r in rs[1:]] == [False, False]
    c._call_for_a_while = real
    c._clean_up_set(pb.AcquireAllRequest(resources=rs, request_id=rid, ttl_ms=30000))
    assert not c.describe(rs[0]).held


@pytest.mark.parametrize("bad", [
    {"resources": (r for r in ["a", "b"])}, {"resources": None}, {"ttl": -5}, {"ttl": "1"},
    {"ttl": True}, {"wait": "1"}, {"request_id": 1}, {"holder": 1},
])
def test_bad_set_input_is_refused_before_any_call(bad):
    # No server: a call would fail with Unavailable, not InvalidArgument.
    c = lockd_client.Client("http://127.0.0.1:9")
    args = {"resources": ["a", "b"], **bad}
    resources = args.pop("resources")
    with pytest.raises(lockd_client.InvalidArgument):
        c.acquire_all(resources, **args)
    if "request_id" not in args:  # acquire_ordered takes none
        with pytest.raises(lockd_client.InvalidArgument):
            c.acquire_ordered(resources, **args)

    async def aio():
        with pytest.raises(lockd_client.InvalidArgument):
            await lockd_client.aio.Client("http://127.0.0.1:9").acquire_all(resources, **args)
    asyncio.run(aio())


def test_a_cancel_set_before_the_acquire_sends_nothing(testbed):
    c = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    rs = names("pre-cancelled")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(lockd_client.Cancelled):
        c.acquire_all(rs, ttl=30, cancel=cancel)
    with pytest.raises(lockd_client.Cancelled):
        c.acquire(rs[0], ttl=30, cancel=cancel)
    with pytest.raises(lockd_client.InvalidArgument):
        c.acquire(rs[0], ttl=30, cancel=True)
    assert [c.describe(r).held for r in rs] == [False, False]
    # A TTL below a millisecond is a millisecond, not lockd's default.
    from lockd_client import _core
    assert _core.ttl_ms(0.0001) == 1 and _core.ttl_ms(None) == 0


def test_a_failed_downgrade_ends_the_lock_and_says_so(testbed):
    c = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    r = names("downgrade", 1)[0]
    exclusive = c.acquire(r, ttl=30)
    with pytest.raises(lockd_client.LockdError):
        exclusive.downgrade()
    assert exclusive.lost.is_set() and exclusive.lost_reason is lockd_client.LostReason.NOT_CURRENT
    with pytest.raises(lockd_client.LockLost):
        exclusive.check()
    assert not c.describe(r).held


def test_asyncio_cancellation_reaches_the_caller_and_a_cancelled_downgrade_ends_the_lock(testbed):
    async def go():
        r = names("aio-cancel-downgrade", 1)[0]
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            # A cancel that lands while the renewal task is stopped is the caller's: raised.
            lock = await c.acquire(r, ttl=30)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0):
                    await lock.release()
            # A downgrade cancelled before its answer: the Lock is lost, nothing stays held.
            writer = await c.acquire(r + "-rw", ttl=30, mode=lockd_client.Mode.WRITE)
            task = asyncio.create_task(writer.downgrade())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert writer.lost.is_set()
            with pytest.raises(lockd_client.LockLost):
                writer.check()
            # A Lock downgraded once is not downgraded again, nor reported lost for it.
            w2 = await c.acquire(r + "-rw2", ttl=30, mode=lockd_client.Mode.WRITE)
            reader = await w2.downgrade()
            with pytest.raises(lockd_client.LeaseNotCurrent):
                await w2.downgrade()
            assert not w2.lost.is_set()
            assert await reader.release()
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            for name in (r, r + "-rw", r + "-rw2"):
                d = await c.describe(name)
                assert not d.held and not d.readers, f"{name}: {d}"
    asyncio.run(go())  # close() waited for the clean-ups


def test_a_lock_downgraded_once_is_not_downgraded_again_nor_lost(testbed):
    c = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    r = names("twice", 1)[0]
    writer = c.acquire(r, ttl=30, mode=lockd_client.Mode.WRITE)
    reader = writer.downgrade()
    with pytest.raises(lockd_client.LeaseNotCurrent):
        writer.downgrade()
    assert not writer.lost.is_set()
    assert reader.release()
    released = c.acquire(r + "-released", ttl=30, mode=lockd_client.Mode.WRITE)
    assert released.release()
    with pytest.raises(lockd_client.LeaseNotCurrent):
        released.downgrade()
    assert not released.lost.is_set()


@pytest.mark.parametrize("bad", [
    {"wait": 10 ** 400}, {"mode": "read"}, {"permits": True}, {"owner": 1}, {"ttl": float("nan")},
])
def test_bad_acquire_input_is_refused_before_any_call(bad):
    c = lockd_client.Client("http://127.0.0.1:9")  # nothing listens: a call would be Unavailable
    with pytest.raises(lockd_client.InvalidArgument):
        c.acquire("r", **bad)

    async def aio():
        with pytest.raises(lockd_client.InvalidArgument):
            await lockd_client.aio.Client("http://127.0.0.1:9").acquire("r", **bad)
    asyncio.run(aio())
