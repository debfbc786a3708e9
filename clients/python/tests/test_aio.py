"""The asyncio client against the test bed: the wait cancelled as a task, the loss signal as an
asyncio.Event, fencing through asyncpg, psycopg's AsyncConnection and httpx."""

import asyncio
import secrets
import time

import pytest

import lockd_client
import lockd_client.aio
from lockd_client import fence

from held import give_up_held_call


def run(coro):
    return asyncio.run(coro)


def name(what):
    return f"aio/{secrets.token_hex(4)}/{what}"


async def waiters(client, resource, n):
    deadline = time.monotonic() + 60
    while (await client.describe(resource)).waiters != n:
        assert time.monotonic() < deadline, f"{resource}: never {n} waiters"
        await asyncio.sleep(0.02)


def test_lock_hand_off_and_idempotent_release(testbed):
    async def go():
        r = name("handoff")
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            async with c.lock(r, ttl=30) as a:
                assert a.signed_token and a.fence_token.startswith(f"{a.token}.")
                with pytest.raises(lockd_client.Busy) as busy:
                    await c.acquire(r)
                assert busy.value.token == a.token
                b_task = asyncio.create_task(c.acquire(r, ttl=30, wait=60))
                await waiters(c, r, 1)
            b = await b_task
            assert b.token > a.token
            assert await b.release() is True
            assert await b.release() is False
            assert await a.release() is False
    run(go())


def test_a_request_id_whose_grant_ended_is_not_granted_again(testbed):
    async def go():
        r = name("ended")
        rid = f"once-{secrets.token_hex(4)}"
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            a = await c.acquire(r, ttl=30, request_id=rid)
            again = await c.acquire(r, ttl=30, request_id=rid)
            assert again.token == a.token
            assert await a.release() is True
            with pytest.raises(lockd_client.InvalidArgument, match="grant has ended"):
                await c.acquire(r, ttl=30, request_id=rid)
            assert not (await c.describe(r)).held
            b = await c.acquire(r, ttl=30)
            assert b.token > a.token
            assert await b.release() is True
    run(go())


def test_a_retry_whose_check_of_the_held_grant_is_cut_gets_that_grant(testbed):
    # The retry finds the grant held and renews it; that renewal's answer is lost (the lossy
    # forwarder passes the Acquire's answer and cuts the next): asked again, the same grant.
    async def go():
        r = name("held")
        rid = f"held-{secrets.token_hex(4)}"
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as a, \
                lockd_client.aio.Client(testbed.servers["lossy"]["endpoint"]) as lossy:
            first = await a.acquire(r, ttl=30, request_id=rid)
            testbed.command("drop-next-answer 1")
            again = await lossy.acquire(r, ttl=30, request_id=rid)
            assert again.token == first.token
            assert await first.release() is True
            assert await again.release() is False
    run(go())


def test_a_retry_given_up_while_its_check_of_the_held_grant_fails_releases_that_grant(testbed):
    # Every renewal's answer is lost, so the retry keeps asking under the same id; cancelled
    # then, it releases the grant in the background instead of leaving it held.
    async def go():
        r = name("given-up")
        rid = f"given-up-{secrets.token_hex(4)}"
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as a:
            lossy = lockd_client.aio.Client(testbed.servers["lossy"]["endpoint"])
            first = await a.acquire(r, ttl=30, request_id=rid)
            testbed.command("cut-renewals on")
            try:
                task = asyncio.create_task(lossy.acquire(r, ttl=30, request_id=rid))
                await asyncio.to_thread(testbed.command, "wait-cuts 1")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await lossy.close()
                deadline = time.monotonic() + 10
                while (await a.describe(r)).held:
                    assert time.monotonic() < deadline, f"{r} stayed held"
                    await asyncio.sleep(0.02)
            finally:
                testbed.command("cut-renewals off")
            assert await first.release() is False
    run(go())


def test_an_acquire_handled_after_it_was_given_up_leaves_nothing_held(testbed):
    # The test bed holds the acquire back until the clean-up's first call is answered, and
    # drops its cancellation: lockd grants it after the task was cancelled. The clean-up must
    # not stop at a resource it finds free.
    async def go():
        r = name("handled-late")
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as a:
            lossy = lockd_client.aio.Client(testbed.servers["lossy"]["endpoint"])
            await give_up_held_call(testbed, lambda: lossy.acquire(r, ttl=30, wait=60))
            await lossy.close()  # waits for the clean-up
            assert not (await a.describe(r)).held, f"{r} stayed held by a grant nobody holds"
    run(go())


def test_a_cancelled_wait_leaves_no_waiter(testbed):
    async def go():
        r = name("cancel")
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            a = await c.acquire(r, ttl=30)
            task = asyncio.create_task(c.acquire(r, wait=120))
            await waiters(c, r, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await waiters(c, r, 0)
            # asyncio.timeout gives a bounded wait the language's way.
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await c.acquire(r, wait=120)
            await waiters(c, r, 0)
            assert await a.release()
    run(go())


def test_loss_is_signalled_before_the_lease_could_end(testbed):
    async def go():
        r = name("paused")
        async with lockd_client.aio.Client(testbed.servers["pausable"]["endpoint"]) as c:
            called = []
            lock = await c.acquire(r, ttl=1.5, on_lost=called.append)
            paused = time.monotonic()
            testbed.command("pause pausable")
            try:
                await asyncio.wait_for(lock.lost.wait(), 60)
                lost = time.monotonic()
            finally:
                testbed.command("resume pausable")
            assert lost < paused + 1.5, f"lost {lost - paused:.3f}s after the pause"
            assert lock.lost_reason is lockd_client.LostReason.DEADLINE_PASSED
            assert called == [lock]
            with pytest.raises(lockd_client.LockLost):
                lock.check()
    run(go())


def test_fencing_with_asyncpg_psycopg_async_and_httpx(testbed):
    import asyncpg
    import httpx
    import psycopg

    async def go():
        r = name("fenced")
        key = r.replace("/", "-")
        pg = testbed.servers["pg"]
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            old = await c.acquire(r, ttl=30)
            await c.release(old.resource, old.lease.lease_id)   # ended behind its back
            new = await c.acquire(r, ttl=30)
            conn = await asyncpg.connect(pg["dsn"])
            try:
                async with fence.atransaction(conn, new) as tx:
                    await tx.execute("INSERT INTO conformance VALUES ($1, 'new')", key)
                with pytest.raises(lockd_client.StaleToken) as e:
                    async with fence.atransaction(conn, old) as tx:
                        await tx.execute("UPDATE conformance SET v = 'old' WHERE k = $1", key)
                assert e.value.code == "FN001"
            finally:
                await conn.close()
            async with await psycopg.AsyncConnection.connect(pg["dsn"]) as aconn:
                with pytest.raises(lockd_client.StaleToken):
                    async with fence.atransaction(aconn, old) as tx:
                        await tx.execute("UPDATE conformance SET v = 'old' WHERE k = %s", (key,))
                cur = await aconn.execute("SELECT v FROM conformance WHERE k = %s", (key,))
                assert (await cur.fetchone())[0] == "new"
            url = testbed.servers["http"]["url"] + f"/items/{key}"
            async with httpx.AsyncClient() as h:
                assert (await h.put(url, content=b"{}", auth=fence.HttpxAuth(new))).status_code == 200
                with pytest.raises(lockd_client.StaleToken) as e:
                    await h.put(url, content=b"{}", auth=fence.HttpxAuth(old))
                assert e.value.status == 409 and e.value.highest == new.token
            await new.release()
            await old.release()
    run(go())
