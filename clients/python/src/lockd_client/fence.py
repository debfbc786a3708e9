"""Fencing in one line: a lock's token on every write, and a refused write as `StaleToken`.

PostgreSQL through fence-proxy (the token is declared for one transaction with
`set_config(..., true)`, so a pooled connection never carries it to its next user):

    with fence.transaction(conn, lock) as tx:        # psycopg 3, psycopg2, SQLAlchemy
        tx.execute("UPDATE stock SET n = n - 1 WHERE sku = 'a'")

    async with fence.atransaction(conn, lock) as tx:   # asyncpg (connection or pool), psycopg 3 async
        await tx.execute("UPDATE ...")

HTTP through fence-proxy (`Fencing-Resource` and `Fencing-Token` on every request; a 409 as
`StaleToken`):

    requests.put(url, json=body, auth=fence.Auth(lock))      # requests
    httpx.put(url, json=body, auth=fence.HttpxAuth(lock))     # httpx, sync or async

`lock` is anything with `resource` and `fence_token` (a Lock of either client, or a Lease).
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from typing import Any, Optional

from .errors import FenceRefused, InvalidArgument, StaleToken

#: The statement that declares a lock's resource and token for the current transaction only.
DECLARE = "SELECT set_config('fencing.resource', {r}, true), set_config('fencing.token', {t}, true)"
#: SQLSTATEs of a stale token: FN001 (below the highest accepted), FN003 (ended for a newer one).
STALE_SQLSTATES = frozenset({"FN001", "FN003"})


def _refusal(e: BaseException) -> Optional[FenceRefused]:
    """The fence's refusal carried by a driver's error (or one it wraps), if it is one."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if isinstance(state, str) and state.startswith("FN"):
            kind = StaleToken if state in STALE_SQLSTATES else FenceRefused
            diag = getattr(e, "diag", None)
            text = getattr(diag, "message_primary", None) or str(e).strip().splitlines()[0]
            return kind(f"fence-proxy refused the write ({state}): {text}", state)
        e = getattr(e, "orig", None) or e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def _translated():
    try:
        yield
    except FenceRefused:
        raise
    except Exception as e:
        refused = _refusal(e)
        if refused is None:
            raise
        raise refused from e


def _kind(target: Any) -> str:
    module = type(target).__module__
    if module.startswith("psycopg2"):
        return "psycopg2"
    if module.startswith("psycopg"):
        return "psycopg"
    if module.startswith("sqlalchemy"):
        return "sqlalchemy"
    if module.startswith("asyncpg"):
        return "asyncpg"
    raise TypeError(f"fence.transaction does not know {type(target).__qualname__}: give a psycopg, "
                    "psycopg2 or SQLAlchemy connection (asyncpg: fence.atransaction)")


class NotIdle(InvalidArgument):
    """The connection given to a fencing helper is already in a transaction."""


def _refuse_open(what: str) -> None:
    # The helper's declaration lives until its own transaction ends. Run inside a caller's
    # transaction it would be a savepoint's (which RELEASE SAVEPOINT keeps in force, so the
    # caller's later writes would be judged with this lock's token), or it would commit the
    # caller's earlier writes under this lock's token: never.
    raise NotIdle(f"fence: the {what} is already in a transaction; the fencing helper opens its own "
                  "transaction (commit or roll back the open one first, or use another connection)")


def _check_idle(kind: str, target: Any) -> None:
    if kind == "psycopg":
        from psycopg.pq import TransactionStatus
        if target.info.transaction_status != TransactionStatus.IDLE:
            _refuse_open("psycopg connection")
    elif kind == "psycopg2":
        from psycopg2.extensions import TRANSACTION_STATUS_IDLE
        if target.get_transaction_status() != TRANSACTION_STATUS_IDLE:
            _refuse_open("psycopg2 connection")
    elif kind == "asyncpg":
        if target.is_in_transaction():
            _refuse_open("asyncpg connection")
    elif kind == "sqlalchemy":
        from sqlalchemy.engine import Engine
        if not isinstance(target, Engine) and target.in_transaction():
            _refuse_open("SQLAlchemy connection or session")


@contextlib.contextmanager
def transaction(target: Any, lock: Any):
    """A transaction in which `lock`'s resource and token are declared; commits at the end of
    the block, rolls back on an error. Yields what runs statements: the psycopg 3 connection,
    a psycopg2 cursor, a SQLAlchemy connection (from an Engine, or the Connection or Session
    given). A fence refusal is raised as `StaleToken` / `FenceRefused`."""
    kind = _kind(target)
    _check_idle(kind, target)
    resource, token = lock.resource, lock.fence_token
    with _translated():
        if kind == "psycopg":
            with target.transaction():
                target.execute(DECLARE.format(r="%s", t="%s"), (resource, token))
                yield target
        elif kind == "psycopg2":
            if target.autocommit:
                raise InvalidArgument("fence.transaction needs a psycopg2 connection with autocommit off: "
                                 "in autocommit the token would hold for its own statement only")
            # `with conn` commits at the end (or rolls back) and leaves the connection open.
            with target:
                with target.cursor() as cur:
                    cur.execute(DECLARE.format(r="%s", t="%s"), (resource, token))
                    yield cur
        else:
            from sqlalchemy import text
            from sqlalchemy.engine import Engine
            declare = text(DECLARE.format(r=":r", t=":t"))
            if isinstance(target, Engine):
                with target.begin() as conn:
                    conn.execute(declare, {"r": resource, "t": token})
                    yield conn
            else:  # a Connection or a Session: a transaction of its own
                with target.begin():
                    target.execute(declare, {"r": resource, "t": token})
                    yield target


@contextlib.asynccontextmanager
async def atransaction(target: Any, lock: Any):
    """`transaction` for asyncio drivers: an asyncpg Connection or Pool (a connection is taken
    from the pool for the transaction), or a psycopg 3 AsyncConnection."""
    resource, token = lock.resource, lock.fence_token
    module = type(target).__module__
    with _translated():
        if module.startswith("asyncpg"):
            if hasattr(target, "acquire") and not hasattr(target, "transaction"):
                async with target.acquire() as conn:
                    _check_idle("asyncpg", conn)
                    async with conn.transaction():
                        await conn.execute(DECLARE.format(r="$1", t="$2"), resource, token)
                        yield conn
            else:
                _check_idle("asyncpg", target)
                async with target.transaction():
                    await target.execute(DECLARE.format(r="$1", t="$2"), resource, token)
                    yield target
        elif module.startswith("psycopg"):
            _check_idle("psycopg", target)
            async with target.transaction():
                await target.execute(DECLARE.format(r="%s", t="%s"), (resource, token))
                yield target
        else:
            raise TypeError(f"fence.atransaction does not know {type(target).__qualname__}")


def headers(lock: Any) -> dict:
    """The two headers fence-proxy reads."""
    return {"Fencing-Resource": lock.resource, "Fencing-Token": lock.fence_token}


def check_response(status: int, body: bytes, content_type: str) -> None:
    """Raises `StaleToken` for fence-proxy's 409, `FenceRefused` for its other refusals of the
    token (a problem+json whose type is a fencing problem); returns for anything else."""
    if "problem+json" not in (content_type or ""):
        return
    try:
        problem = json.loads(body or b"{}")
    except ValueError:
        return
    kind = str(problem.get("type", ""))
    if not kind.startswith("urn:fencing:problem:"):
        return
    name = kind.rsplit(":", 1)[-1]
    if name not in ("stale-token", "forged-token", "unsigned-token", "malformed-token",
                    "malformed-resource", "fencing-required"):
        return
    cls = StaleToken if status == 409 else FenceRefused
    raise cls(f"fence-proxy refused the request ({status} {name}): {problem.get('detail', '')}", name,
              status, problem.get("resource"), problem.get("token"), problem.get("highest"))


class Auth:
    """requests' auth: `requests.put(url, auth=fence.Auth(lock))`, or `session.auth = ...`.
    Adds the headers, and raises `StaleToken` / `FenceRefused` when fence-proxy refuses."""

    def __init__(self, lock: Any):
        self.lock = lock

    def __call__(self, request):
        request.headers.update(headers(self.lock))
        request.register_hook("response", self._check)
        return request

    @staticmethod
    def _check(response, *args, **kwargs):
        if response.is_redirect:
            # requests builds the next request from this one after the hooks ran: to another
            # origin, it goes without the token (a write capability), as Authorization does.
            location = urllib.parse.urljoin(response.url, response.headers.get("location", ""))
            if _origin(location) != _origin(response.request.url):
                for name in ("Fencing-Resource", "Fencing-Token"):
                    response.request.headers.pop(name, None)
            return response
        check_response(response.status_code, response.content, response.headers.get("content-type", ""))
        return response


def _origin(url: str) -> tuple:
    parts = urllib.parse.urlsplit(str(url))
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def _httpx_auth_base():
    try:
        import httpx
        return httpx.Auth
    except ImportError:  # httpx not installed: HttpxAuth is unusable, the rest works
        return object


class HttpxAuth(_httpx_auth_base()):
    """httpx's auth (sync and async clients): `client.put(url, auth=fence.HttpxAuth(lock))`."""

    requires_response_body = True

    def __init__(self, lock: Any):
        self.lock = lock

    def auth_flow(self, request):
        request.headers.update(headers(self.lock))
        response = yield request
        # httpx follows redirects (follow_redirects=True; off by default) without asking its
        # auth, keeping these headers: say so loudly if one crossed to another origin.
        hops = [r.request.url for r in response.history] + [response.request.url]
        if any(_origin(h) != _origin(hops[0]) for h in hops):
            raise FenceRefused("fence: httpx followed a redirect to another origin with the fencing headers; "
                               "keep follow_redirects off with HttpxAuth", "redirected", response.status_code)
        check_response(response.status_code, response.content, response.headers.get("content-type", ""))
