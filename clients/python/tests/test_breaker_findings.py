"""What an outside tester broke, each fixed and kept fixed: a fencing helper run inside an open
transaction (nested, or the caller's), a waiting acquire cancelled as it was granted, the token
carried by a redirect to another origin, and input the SDK took without a clear error."""

import asyncio
import http.server
import math
import secrets
import threading
import time

import pytest

import lockd_client
import lockd_client.aio
from lockd_client import fence

UPSERT = "INSERT INTO conformance VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v"


_held = []


@pytest.fixture(autouse=True)
def _release_held():
    """The leases a test took through stale_and_current end with it."""
    yield
    while _held:
        lock = _held.pop()
        try:
            lock.release()
        except lockd_client.LockdError:
            pass


def stale_and_current(testbed):
    """A lease made stale by a newer holder's write of `key`, that newer lease, and a current
    lease of another resource."""
    c = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    r = f"break/{secrets.token_hex(4)}"
    old = c.acquire(r, ttl=30)
    c.release(old.resource, old.lease.lease_id)
    new = c.acquire(r, ttl=30)
    other = c.acquire(r + "-other", ttl=30)
    _held.extend([old, new, other])
    return c, old, new, other


def value(testbed, key):
    import psycopg
    with psycopg.connect(testbed.servers["pg"]["dsn"], autocommit=True) as conn:
        row = conn.execute("SELECT v FROM conformance WHERE k = %s", (key,)).fetchone()
    return row and row[0]


def test_a_helper_inside_another_is_refused_and_no_stale_write_commits(testbed):
    import psycopg
    _, old, new, other = stale_and_current(testbed)
    key = old.resource
    with psycopg.connect(testbed.servers["pg"]["dsn"], autocommit=True) as conn:
        with fence.transaction(conn, new) as tx:
            tx.execute(UPSERT, (key, "newer"))
        with pytest.raises((lockd_client.InvalidArgument, lockd_client.StaleToken)):
            with fence.transaction(conn, old) as tx:
                with fence.transaction(conn, other) as inner:
                    inner.execute("SELECT 1")
                tx.execute(UPSERT, (key, "STALE"))
    assert value(testbed, key) == "newer"


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2", "sqlalchemy"])
def test_a_helper_refuses_the_callers_open_transaction(testbed, driver):
    _, _, new, _ = stale_and_current(testbed)
    key = new.resource + "-" + driver
    dsn = testbed.servers["pg"]["dsn"]
    if driver == "psycopg":
        import psycopg
        conn = psycopg.connect(dsn)
        conn.execute(UPSERT, (key, "callers"))
        target, rollback, close = conn, conn.rollback, conn.close
    elif driver == "psycopg2":
        import psycopg2
        conn = psycopg2.connect(dsn)
        conn.cursor().execute(UPSERT, (key, "callers"))
        target, rollback, close = conn, conn.rollback, conn.close
    else:
        import sqlalchemy
        engine = sqlalchemy.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))
        conn = engine.connect()
        conn.execute(sqlalchemy.text("INSERT INTO conformance VALUES (:k, 'callers')"), {"k": key})
        target, rollback = conn, conn.rollback
        close = lambda: (conn.close(), engine.dispose())  # noqa: E731
    try:
        with pytest.raises(lockd_client.InvalidArgument, match="already in a transaction"):
            with fence.transaction(target, new):
                pass
        rollback()
    finally:
        close()
    assert value(testbed, key) is None, "the caller's write was committed by the helper"


def test_asyncio_helpers_refuse_an_open_transaction(testbed):
    import asyncpg
    import psycopg

    async def go():
        _, _, new, _ = stale_and_current(testbed)
        dsn = testbed.servers["pg"]["dsn"]
        conn = await asyncpg.connect(dsn)
        try:
            tr = conn.transaction()
            await tr.start()
            with pytest.raises(lockd_client.InvalidArgument):
                async with fence.atransaction(conn, new):
                    pass
            await tr.rollback()
        finally:
            await conn.close()
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            await aconn.execute("SELECT 1")
            with pytest.raises(lockd_client.InvalidArgument):
                async with fence.atransaction(aconn, new):
                    pass
    asyncio.run(go())


def wait_free(client, resources):
    for r in resources:
        deadline = time.monotonic() + 10
        while client.describe(r).held:
            assert time.monotonic() < deadline, f"{r} stayed held: a cancelled acquire's grant was left behind"
            time.sleep(0.02)


def waiters(client, r, n):
    deadline = time.monotonic() + 30
    while client.describe(r).waiters != n:
        assert time.monotonic() < deadline, f"{r}: never {n} waiters"
        time.sleep(0.01)


def test_a_wait_cancelled_as_it_is_granted_leaves_nothing_held(testbed):
    c = lockd_client.Client(testbed.servers["lockd"]["endpoint"])
    run = secrets.token_hex(4)
    names = [f"break/{run}/cancel-{i}" for i in range(20)]
    for r in names:
        a = c.acquire(r, ttl=30)
        cancel = threading.Event()
        got = []

        def wait_and_be_cancelled(r=r, cancel=cancel, got=got):
            try:
                got.append(c.acquire(r, ttl=30, wait=60, cancel=cancel))
            except lockd_client.Cancelled as e:
                got.append(e)
        t = threading.Thread(target=wait_and_be_cancelled, daemon=True)
        t.start()
        waiters(c, r, 1)
        go = threading.Barrier(2)
        rel = threading.Thread(target=lambda: (go.wait(), a.release()))
        rel.start()
        go.wait()
        cancel.set()
        rel.join()
        t.join(30)
        # Granted before the cancel was seen: a lock the caller holds and releases. Cancelled:
        # nothing may stay held.
        if isinstance(got[0], lockd_client.Lock):
            got[0].release()
    wait_free(c, names)


def test_an_asyncio_wait_cancelled_as_it_is_granted_leaves_nothing_held(testbed):
    run = secrets.token_hex(4)
    names = [f"break/{run}/aio-cancel-{i}" for i in range(20)]

    async def go():
        async with lockd_client.aio.Client(testbed.servers["lockd"]["endpoint"]) as c:
            for r in names:
                a = await c.acquire(r, ttl=30)
                task = asyncio.create_task(c.acquire(r, ttl=30, wait=60))
                while (await c.describe(r)).waiters != 1:
                    await asyncio.sleep(0.01)
                release = asyncio.create_task(a.release())
                await asyncio.sleep(0)  # the release is sent, then the wait is cancelled
                task.cancel()
                await release
                with pytest.raises(asyncio.CancelledError):
                    await task
    asyncio.run(go())  # close() waits for the clean-ups
    wait_free(lockd_client.Client(testbed.servers["lockd"]["endpoint"]), names)


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []
    redirect_to = ""

    def do_PUT(self):
        type(self).seen.append((self.server.server_port, self.headers.get("Fencing-Token")))
        if self.path == "/redirect":
            self.send_response(307)
            self.send_header("Location", type(self).redirect_to)
            self.end_headers()
        else:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args):
        pass


def test_a_redirect_to_another_origin_carries_no_token():
    import httpx
    import requests
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    a, b = (s.server_port for s in servers)
    lease = lockd_client.Lease("r", "id", 7, "7.k1.00", 30.0, 0, False, 1, None)
    try:
        # requests: to the other origin without the headers; to the same origin with them.
        _Recorder.seen, _Recorder.redirect_to = [], f"http://localhost:{b}/target"
        requests.put(f"http://127.0.0.1:{a}/redirect", data=b"{}", auth=fence.Auth(lease), timeout=10)
        assert _Recorder.seen == [(a, "7.k1.00"), (b, None)], _Recorder.seen
        _Recorder.seen, _Recorder.redirect_to = [], f"http://127.0.0.1:{a}/target"
        requests.put(f"http://127.0.0.1:{a}/redirect", data=b"{}", auth=fence.Auth(lease), timeout=10)
        assert _Recorder.seen == [(a, "7.k1.00"), (a, "7.k1.00")], _Recorder.seen
        # httpx follows redirects without asking its auth: the helper says so loudly.
        _Recorder.seen, _Recorder.redirect_to = [], f"http://localhost:{b}/target"
        with pytest.raises(lockd_client.FenceRefused, match="redirect"):
            httpx.put(f"http://127.0.0.1:{a}/redirect", content=b"{}", auth=fence.HttpxAuth(lease),
                      follow_redirects=True)
    finally:
        for s in servers:
            s.shutdown()


def test_bad_input_gets_a_clear_error(tmp_path):
    c = lockd_client.Client("http://127.0.0.1:9")
    for ttl in (math.inf, math.nan, "30", 1e10):
        with pytest.raises(lockd_client.InvalidArgument, match="ttl"):
            c.acquire("r", ttl=ttl)
    with pytest.raises(lockd_client.InvalidArgument, match="not one string"):
        c.acquire_all("abc")
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(lockd_client.InvalidArgument, match="no PEM certificate"):
        lockd_client.Client("https://127.0.0.1:9", ca=str(not_pem))
