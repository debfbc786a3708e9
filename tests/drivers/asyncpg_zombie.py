"""The zombie scenario with asyncpg, declaring tokens its idiomatic way: server_settings,
which asyncpg sends as start-up parameters of their own.

Usage: asyncpg_zombie.py HOST PORT. Prints one JSON object per case.
"""
import asyncio
import json
import sys

import asyncpg

host, port = sys.argv[1], int(sys.argv[2])
UPDATE = "UPDATE acct SET owner = $1 WHERE id = 1"


async def report(case, coro):
    try:
        await coro
        print(json.dumps({"case": case, "ok": True}))
    except Exception as e:  # noqa: BLE001 - the report says what the driver raised
        print(json.dumps({
            "case": case, "ok": False,
            "sqlstate": getattr(e, "sqlstate", None),
            "message": f"{type(e).__name__}: {e}",
        }))
    sys.stdout.flush()


async def connect(token):
    return await asyncpg.connect(
        host=host, port=port, user="postgres", database="postgres",
        server_settings={"fencing.resource": "acct:1", "fencing.token": str(token)})


async def main():
    a = await connect(41)
    tr = a.transaction()
    await tr.start()
    await a.execute(UPDATE, "A")
    b = await connect(42)
    await report("newer_write", b.execute(UPDATE, "B"))
    await report("zombie_commit", tr.commit())
    c = await connect(41)
    await report("stale_autocommit", c.execute(UPDATE, "C"))
    d = await connect(42)
    await report("current_write", d.execute(UPDATE, "D"))


asyncio.run(main())
