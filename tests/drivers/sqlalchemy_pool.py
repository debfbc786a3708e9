"""SQLAlchemy's pool through the proxy, with one connection (pool_size=1: every checkout is the
same server session), declaring tokens both ways docs/fence-proxy.md names: per transaction
with set_config(..., true), which reaches no later checkout, and a session-level SET, which
does (the pool only rolls back on return), as the docs warn.

Usage: sqlalchemy_pool.py HOST PORT. Prints one JSON object per case: its name, whether it
succeeded, the token the next checkout sees, and the SQLSTATE of a refusal.
"""
import json
import sys

from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

host, port = sys.argv[1], sys.argv[2]
engine = create_engine(
    f"postgresql+psycopg://postgres@{host}:{port}/postgres", pool_size=1, max_overflow=0
)
DECLARE = text(
    "SELECT set_config('fencing.resource', :r, true), set_config('fencing.token', :t, true)"
)


def report(case, fn):
    try:
        value = fn()
        print(json.dumps({"case": case, "ok": True, "value": value}))
    except DBAPIError as e:
        sqlstate = getattr(e.orig, "sqlstate", None)
        print(json.dumps({"case": case, "ok": False, "sqlstate": sqlstate, "message": str(e.orig)}))
    sys.stdout.flush()


def token_seen():
    with engine.connect() as conn:
        return conn.execute(text("SELECT current_setting('fencing.token', true)")).scalar()


def fenced_write(token, owner):
    with engine.begin() as conn:
        conn.execute(DECLARE, {"r": "acct:1", "t": str(token)})
        conn.execute(text("UPDATE acct SET owner = :o WHERE id = 1"), {"o": owner})


def unrelated_write():
    with engine.begin() as conn:
        conn.execute(text("UPDATE other SET v = v + 1"))


def session_set(token):
    with engine.connect() as conn:
        conn.execute(text("SET fencing.resource = 'acct:1'"))
        conn.execute(text(f"SET fencing.token = '{int(token)}'"))
        conn.commit()


report("per_transaction_write", lambda: fenced_write(50, "holder"))
report("per_transaction_next_checkout", token_seen)
report("per_transaction_unrelated_write", unrelated_write)
report("per_transaction_stale_write", lambda: fenced_write(49, "zombie"))
report("session_set", lambda: session_set(49))
report("session_set_next_checkout", token_seen)
report("session_set_unrelated_write", unrelated_write)
engine.dispose()
