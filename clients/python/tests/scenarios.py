"""The conformance suite's interpreter (clients/conformance/README.md defines the steps), for
the threaded client."""

import json
import secrets
import threading
import time

import lockd_client
from lockd_client import fence

SCENARIOS = json.loads((__import__("pathlib").Path(__file__).resolve().parents[2]
                        / "conformance" / "scenarios.json").read_text())["scenarios"]

OUTCOMES = {
    lockd_client.Busy: "busy",
    lockd_client.WaitTimedOut: "timeout",
    lockd_client.Cancelled: "cancelled",
    lockd_client.Unauthenticated: "unauthenticated",
    lockd_client.PermissionDenied: "permission_denied",
    lockd_client.InvalidArgument: "invalid",
    lockd_client.Unavailable: "unavailable",
}


def outcome_of(error: BaseException) -> str:
    for cls, name in OUTCOMES.items():
        if isinstance(error, cls):
            return name
    raise error


class Run:
    def __init__(self, testbed, scenario):
        self.bed = testbed
        self.servers = testbed.servers
        self.scenario = scenario
        self.run_id = secrets.token_hex(4)
        self.clients = {}
        self.leases = {}   # name -> Lock or LockSet
        self.pending = {}  # name -> (thread, cancel event, result holder)
        self.paused_at = {}

    def s(self, value):
        if isinstance(value, str):
            return value.replace("{run}", self.run_id)
        if isinstance(value, list):
            return [self.s(v) for v in value]
        return value

    def client(self, step):
        names = step.get("servers") or [step["server"]]
        endpoints = [self.servers[n]["endpoint"] for n in names]
        kwargs = {}
        if names[0] == "secure":
            secure = self.servers["secure"]
            kwargs["ca"] = secure["ca"]
            tenant = secure["tenants"].get(step.get("tenant") or "", {})
            if "token_file" in tenant:
                kwargs["token_file"] = tenant["token_file"]
            if "cert" in tenant:
                kwargs["cert"], kwargs["key"] = tenant["cert"], tenant["key"]
        self.clients[step["name"]] = lockd_client.Client(endpoints, **kwargs)

    def acquire_kwargs(self, step):
        kwargs = {"ttl": step["ttl_ms"] / 1000 if "ttl_ms" in step else None,
                  "wait": step.get("wait_ms", 0) / 1000}
        if "request_id" in step:
            kwargs["request_id"] = self.s(step["request_id"])
        if "owner" in step:
            kwargs["owner"] = self.s(step["owner"])
        if "permits" in step:
            kwargs["permits"] = step["permits"]
        if "mode" in step:
            kwargs["mode"] = {"read": lockd_client.Mode.READ, "write": lockd_client.Mode.WRITE}[step["mode"]]
        return kwargs

    def check_grant(self, step, result):
        name = step["as"]
        expect = step["expect"]
        got = "granted" if not isinstance(result, BaseException) else outcome_of(result)
        assert got == expect, f"{name}: expected {expect}, got {got}: {result!r}"
        if got != "granted":
            return
        self.leases[name] = result
        locks = list(result) if isinstance(result, lockd_client.LockSet) else [result]
        if "token_above" in step:
            other = self.leases[step["token_above"]]
            assert result.token > other.token, f"{name}: token {result.token} not above {other.token}"
        if "same_token_as" in step:
            other = self.leases[step["same_token_as"]]
            assert result.token == other.token, f"{name}: token {result.token}, expected {other.token}"
        if "holds" in step:
            assert result.holds == step["holds"], f"{name}: holds {result.holds}"
        if "resource_starts" in step:
            assert result.resource.startswith(self.s(step["resource_starts"])), result.resource
        if "resources_held" in step:
            assert [l.resource for l in locks] == self.s(step["resources_held"])
        if step.get("signed"):
            assert result.signed_token and result.fence_token == result.signed_token, \
                f"{name}: no signed token from a lockd that signs"
            assert result.signed_token.startswith(f"{result.token}.")

    def acquire(self, step):
        client = self.clients[step["client"]]
        try:
            return client.acquire(self.s(step["resource"]), **self.acquire_kwargs(step))
        except lockd_client.LockdError as e:
            return e

    def step(self, step):
        op = step["op"]
        if op == "client":
            self.client(step)
        elif op == "acquire":
            self.check_grant(step, self.acquire(step))
        elif op == "start_acquire":
            cancel = threading.Event()
            holder = {}
            kwargs = self.acquire_kwargs(step)
            client = self.clients[step["client"]]
            resource = self.s(step["resource"])

            def go():
                try:
                    holder["result"] = client.acquire(resource, cancel=cancel, **kwargs)
                except lockd_client.LockdError as e:
                    holder["result"] = e
            t = threading.Thread(target=go, daemon=True)
            t.start()
            self.pending[step["as"]] = (t, cancel, holder)
        elif op == "await":
            t, _, holder = self.pending[step["of"]]
            t.join(timeout=120)
            assert not t.is_alive(), f"{step['of']} did not finish"
            self.check_grant({**step, "as": step["of"]}, holder["result"])
        elif op == "cancel":
            self.pending[step["of"]][1].set()
        elif op == "wait_waiters":
            client, resource = self.clients[step["client"]], self.s(step["resource"])
            deadline = time.monotonic() + 60
            while client.describe(resource).waiters != step["waiters"]:
                assert time.monotonic() < deadline, f"{resource}: never {step['waiters']} waiters"
                time.sleep(0.02)
        elif op == "cut_renewals":
            self.bed.command("cut-renewals on" if step["on"] else "cut-renewals off")
        elif op == "hold_next_call":
            self.bed.command(f"hold-next-call {step.get('after', 0)}")
        elif op in ("wait_held", "wait_held_answered"):
            self.bed.command(op.replace("_", "-"))
        elif op == "wait_cuts":
            self.bed.command(f"wait-cuts {step['at_least']}")
        elif op == "wait_free":
            client, resource = self.clients[step["client"]], self.s(step["resource"])
            deadline = time.monotonic() + 10
            while (d := client.describe(resource)).held or d.permits_held or d.readers:
                assert time.monotonic() < deadline, f"{resource} stayed held: {d}"
                time.sleep(0.02)
        elif op == "release":
            got = self.leases[step["lease"]].release()
            assert got == step["expect"], f"release of {step['lease']}: {got}"
        elif op == "end_behind":
            lock = self.leases[step["lease"]]
            assert self.clients_of_lock(lock).release(lock.resource, lock.lease.lease_id)
        elif op == "release_by_id":
            lock = self.leases[step["lease"]]
            got = self.clients[step["client"]].release(lock.resource, lock.lease.lease_id)
            assert got == step["expect"], f"release_by_id of {step['lease']}: {got}"
        elif op == "describe":
            d = self.clients[step["client"]].describe(self.s(step["resource"]))
            if "held" in step:
                assert d.held == step["held"], d
            if "held_by" in step:
                assert d.held and d.token == self.leases[step["held_by"]].token, d
            if "waiters" in step:
                assert d.waiters == step["waiters"], d
        elif op == "pause":
            self.paused_at[step["server"]] = time.monotonic()
            self.bed.command(f"pause {step['server']}")
        elif op == "resume":
            self.bed.command(f"resume {step['server']}")
        elif op == "drop_next_answer":
            self.bed.command(f"drop-next-answer {step.get('after', 0)}")
        elif op == "await_lost":
            lock = self.leases[step["lease"]]
            assert lock.lost.wait(60), f"{step['lease']}: no loss signalled"
            lost_at = time.monotonic()
            if step.get("within_ttl_of_pause"):
                paused = max(self.paused_at.values())
                assert lost_at < paused + lock.lease.ttl, \
                    f"the loss came {lost_at - paused:.3f}s after the pause, not within the TTL {lock.lease.ttl}s"
                assert lock.lost_reason is lockd_client.LostReason.DEADLINE_PASSED
            if step.get("reason") == "not_current":
                assert lock.lost_reason is lockd_client.LostReason.NOT_CURRENT, lock.lost_reason
        elif op == "acquire_all" or op == "acquire_ordered":
            client = self.clients[step["client"]]
            kwargs = {"ttl": step.get("ttl_ms", 30000) / 1000, "wait": step.get("wait_ms", 0) / 1000}
            if "request_id" in step:
                kwargs["request_id"] = self.s(step["request_id"])
            try:
                result = getattr(client, op)(self.s(step["resources"]), **kwargs)
            except lockd_client.LockdError as e:
                result = e
            self.check_grant(step, result)
        elif op in ("pg_write", "pg_read", "pg_pool_check", "http_write"):
            self.fenced(step)
        else:
            raise AssertionError(f"unknown step {op!r}")

    def clients_of_lock(self, lock):
        return lock._client

    def fenced(self, step):
        import psycopg
        pg = self.servers["pg"]
        op = step["op"]
        if op == "pg_write":
            lock = self.leases[step["lease"]]
            with psycopg.connect(pg["dsn"]) as conn:
                try:
                    with fence.transaction(conn, lock) as tx:
                        tx.execute("INSERT INTO conformance VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                                   (self.s(step["key"]), self.s(step["value"])))
                    got = "ok"
                except lockd_client.StaleToken:
                    got = "stale"
            assert got == step["expect"], f"pg_write with {step['lease']}: {got}"
        elif op == "pg_read":
            with psycopg.connect(pg["dsn"]) as conn:
                row = conn.execute("SELECT v FROM conformance WHERE k = %s", (self.s(step["key"]),)).fetchone()
            assert row and row[0] == self.s(step["value"]), row
        elif op == "http_write":
            import requests
            lock = self.leases[step["lease"]]
            url = self.servers["http"]["url"] + self.s(step["path"])
            try:
                r = requests.put(url, data=b"{}", auth=fence.Auth(lock), timeout=30)
                r.raise_for_status()
                got = "ok"
            except lockd_client.StaleToken:
                got = "stale"
            assert got == step["expect"], f"http_write with {step['lease']}: {got}"
        elif op == "pg_pool_check":
            from pool_checks import check_pools
            check_pools(pg, self.leases[step["lease"]], self.s(step["key"]))

    def run(self):
        try:
            for i, step in enumerate(self.scenario["steps"]):
                try:
                    self.step(step)
                except AssertionError as e:
                    raise AssertionError(f"{self.scenario['name']}, step {i} {step}: {e}") from None
        finally:
            # A failed step must not leave a lockd paused for the scenarios after it.
            for server in self.paused_at:
                self.bed.command(f"resume {server}")
            for t, cancel, _ in self.pending.values():
                cancel.set()
            for lock in self.leases.values():
                try:
                    lock.release()
                except lockd_client.LockdError:
                    pass
            for c in self.clients.values():
                c.close()
