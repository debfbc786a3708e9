"""Pooled connections leak no token: with each driver, a fenced transaction (and one that fails)
on a pool of one connection, then the next user of that same connection reads its settings."""

import asyncio

import lockd_client
from lockd_client import fence

UPSERT = "INSERT INTO conformance VALUES ({}, {}) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
SETTINGS = ("SELECT coalesce(current_setting('fencing.resource', true), ''), "
            "coalesce(current_setting('fencing.token', true), ''), pg_backend_pid()")


class Boom(Exception):
    pass


def _clean(row, pid, driver):
    assert row[0] == "" and row[1] == "", f"{driver}: the next user sees {row[:2]}"
    assert row[2] == pid, f"{driver}: not the same pooled connection ({row[2]} != {pid})"


def check_pools(pg, lock, key):
    dsn = pg["dsn"]

    import psycopg
    with psycopg.connect(dsn) as conn:
        with fence.transaction(conn, lock) as tx:
            tx.execute(UPSERT.format("%s", "%s"), (key, "psycopg"))
            pid = tx.execute("SELECT pg_backend_pid()").fetchone()[0]
        _clean(conn.execute(SETTINGS).fetchone(), pid, "psycopg")
        conn.commit()  # the read began a transaction (autocommit off); the helper needs none open
        try:
            with fence.transaction(conn, lock) as tx:
                tx.execute(UPSERT.format("%s", "%s"), (key, "psycopg-failed"))
                raise Boom()
        except Boom:
            pass
        _clean(conn.execute(SETTINGS).fetchone(), pid, "psycopg after a rollback")

    import psycopg2
    conn = psycopg2.connect(dsn)
    try:
        with fence.transaction(conn, lock) as cur:
            cur.execute(UPSERT.format("%s", "%s"), (key, "psycopg2"))
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
        with conn, conn.cursor() as cur:
            cur.execute(SETTINGS)
            _clean(cur.fetchone(), pid, "psycopg2")
    finally:
        conn.close()

    import sqlalchemy
    engine = sqlalchemy.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"),
                                      pool_size=1, max_overflow=0)
    try:
        with fence.transaction(engine, lock) as conn:
            conn.execute(sqlalchemy.text(UPSERT.format(":k", ":v")), {"k": key, "v": "sqlalchemy"})
            pid = conn.execute(sqlalchemy.text("SELECT pg_backend_pid()")).scalar()
        with engine.connect() as conn:
            _clean(conn.execute(sqlalchemy.text(SETTINGS)).one(), pid, "SQLAlchemy")
    finally:
        engine.dispose()

    async def with_asyncpg():
        import asyncpg
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        try:
            async with fence.atransaction(pool, lock) as conn:
                await conn.execute(UPSERT.format("$1", "$2"), key, "asyncpg")
                pid = await conn.fetchval("SELECT pg_backend_pid()")
            async with pool.acquire() as conn:
                _clean(tuple(await conn.fetchrow(SETTINGS)), pid, "asyncpg")
        finally:
            await pool.close()
    asyncio.run(with_asyncpg())
