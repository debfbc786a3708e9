"""The zombie scenario with psycopg 3, declaring tokens its idiomatic ways: SET (through
psycopg.sql, since a SET takes no bound parameters) and start-up options in the conninfo.

Usage: psycopg_zombie.py HOST PORT. Prints one JSON object per case: its name, whether it
succeeded, and the SQLSTATE and message the driver reports.
"""
import json
import sys

import psycopg
from psycopg import sql

host, port = sys.argv[1], sys.argv[2]
base = f"host={host} port={port} user=postgres dbname=postgres"
UPDATE = "UPDATE acct SET owner = %s WHERE id = 1"


def report(case, fn):
    try:
        fn()
        print(json.dumps({"case": case, "ok": True}))
    except psycopg.Error as e:
        print(json.dumps({"case": case, "ok": False, "sqlstate": e.sqlstate, "message": str(e)}))
    sys.stdout.flush()


def declare(conn, resource, token):
    # Autocommit off (psycopg's default): the SETs run in a transaction; commit keeps them.
    conn.execute(sql.SQL("SET fencing.resource = {}").format(sql.Literal(resource)))
    conn.execute(sql.SQL("SET fencing.token = {}").format(sql.Literal(str(token))))
    conn.commit()


# A, token 41 by SET: opens a transaction, writes, and stalls.
a = psycopg.connect(base)
declare(a, "acct:1", 41)
a.execute(UPDATE, ["A"])
# B, token 42 by start-up options: its write waits for A, then PostgreSQL ends A's transaction.
b = psycopg.connect(base + " options='-c fencing.resource=acct:1 -c fencing.token=42'")
report("newer_write", lambda: (b.execute(UPDATE, ["B"]), b.commit()))
# A wakes up and commits.
report("zombie_commit", a.commit)
# C, token 41 again by SET, in autocommit: a stale write.
c = psycopg.connect(base, autocommit=True)
c.execute(sql.SQL("SET fencing.resource = {}").format(sql.Literal("acct:1")))
c.execute(sql.SQL("SET fencing.token = {}").format(sql.Literal("41")))
report("stale_autocommit", lambda: c.execute(UPDATE, ["C"]))
# D, the current token by options: still writes.
d = psycopg.connect(base + " options='-c fencing.resource=acct:1 -c fencing.token=42'", autocommit=True)
report("current_write", lambda: d.execute(UPDATE, ["D"]))
