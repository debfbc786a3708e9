/**
 * The conformance suite's interpreter (clients/conformance/README.md defines the steps), for
 * this SDK.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import pg from "pg";
import {
  Busy,
  Cancelled,
  Client,
  InvalidArgument,
  Lock,
  LockdError,
  LockLost,
  LockSet,
  PermissionDenied,
  StaleToken,
  Unauthenticated,
  Unavailable,
  WaitTimedOut,
  fenced,
  fencedFetch,
  type AcquireOptions,
} from "../src/index";
import { PACKAGE_ROOT, type Testbed } from "./testbed";

export const SCENARIOS_FILE = path.resolve(PACKAGE_ROOT, "..", "conformance", "scenarios.json");
export const SCENARIOS: any[] = JSON.parse(readFileSync(SCENARIOS_FILE, "utf8")).scenarios;

const OUTCOMES: [Function, string][] = [
  [Busy, "busy"],
  [WaitTimedOut, "timeout"],
  [Cancelled, "cancelled"],
  [Unauthenticated, "unauthenticated"],
  [PermissionDenied, "permission_denied"],
  [InvalidArgument, "invalid"],
  [Unavailable, "unavailable"],
];

function outcomeOf(error: unknown): string {
  for (const [cls, name] of OUTCOMES) if (error instanceof cls) return name;
  throw error;
}

const now = () => performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `promise`, or a failure after `ms`. */
async function within<T>(ms: number, promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new assert.AssertionError({ message: `${what}: not within ${ms} ms` })), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

type Held = Lock | LockSet;
type Result = Held | LockdError;

const UPSERT = "INSERT INTO conformance VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v";
const SETTINGS =
  "SELECT coalesce(current_setting('fencing.resource', true), '') AS r, " +
  "coalesce(current_setting('fencing.token', true), '') AS t, pg_backend_pid() AS pid";

class Boom extends Error {}

export class Run {
  private readonly runId = randomBytes(4).toString("hex");
  private readonly clients = new Map<string, Client>();
  private readonly leases = new Map<string, Held>();
  private readonly leaseClient = new Map<string, Client>();
  private readonly lostAt = new Map<Lock, number>();
  private readonly pending = new Map<string, { promise: Promise<Result>; abort: AbortController; client: Client }>();
  private readonly pausedAt = new Map<string, number>();

  constructor(private readonly bed: Testbed, private readonly scenario: any) {}

  private s<T>(value: T): T {
    if (typeof value === "string") return value.replaceAll("{run}", this.runId) as T;
    if (Array.isArray(value)) return value.map((v) => this.s(v)) as T;
    return value;
  }

  private get servers(): any {
    return this.bed.servers;
  }

  private client(step: any): void {
    const names: string[] = step.servers ?? [step.server];
    const endpoints = names.map((n) => this.servers[n].endpoint as string);
    const opts: Record<string, string> = {};
    if (names[0] === "secure") {
      const secure = this.servers.secure;
      opts.ca = secure.ca;
      const tenant = secure.tenants[step.tenant ?? ""] ?? {};
      if (tenant.token_file) opts.tokenFile = tenant.token_file;
      if (tenant.cert) {
        opts.cert = tenant.cert;
        opts.key = tenant.key;
      }
    }
    this.clients.set(step.name, new Client(endpoints, opts));
  }

  private acquireOptions(step: any): AcquireOptions {
    const o: AcquireOptions = { waitMs: step.wait_ms ?? 0 };
    if (step.ttl_ms !== undefined) o.ttlMs = step.ttl_ms;
    if (step.request_id !== undefined) o.requestId = this.s(step.request_id);
    if (step.owner !== undefined) o.owner = this.s(step.owner);
    if (step.permits !== undefined) o.permits = step.permits;
    if (step.mode !== undefined) o.mode = step.mode;
    return o;
  }

  private async acquire(client: Client, resource: string, o: AcquireOptions): Promise<Result> {
    try {
      return await client.acquire(resource, o);
    } catch (e) {
      if (e instanceof LockdError) return e;
      throw e;
    }
  }

  private checkGrant(step: any, name: string, result: Result, client: Client): void {
    const expect = step.expect;
    const got = result instanceof LockdError ? outcomeOf(result) : "granted";
    assert.equal(got, expect, `${name}: expected ${expect}, got ${got}: ${result instanceof Error ? result.message : ""}`);
    if (result instanceof LockdError) return;
    this.leases.set(name, result);
    this.leaseClient.set(name, client);
    const locks = result instanceof LockSet ? result.locks : [result];
    for (const l of locks) {
      if (l.lost) this.lostAt.set(l, now());
      else l.once("lost", () => this.lostAt.set(l, now()));
    }
    const lock = locks[0];
    const single = (n: string) => {
      const other = this.leases.get(n);
      assert.ok(other instanceof Lock, `${n}: no such lock`);
      return other;
    };
    if (step.token_above !== undefined) {
      const other = single(step.token_above);
      assert.ok(lock.token > other.token, `${name}: token ${lock.token} not above ${other.token}`);
    }
    if (step.same_token_as !== undefined) {
      const other = single(step.same_token_as);
      assert.equal(lock.token, other.token, `${name}: token ${lock.token}, expected ${other.token}`);
    }
    if (step.holds !== undefined) assert.equal(lock.holds, step.holds, `${name}: holds`);
    if (step.resource_starts !== undefined) {
      assert.ok(lock.resource.startsWith(this.s(step.resource_starts)), `${name}: resource ${lock.resource}`);
    }
    if (step.resources_held !== undefined) {
      assert.deepEqual(locks.map((l) => l.resource), this.s(step.resources_held), `${name}: resources held`);
    }
    if (step.signed) {
      assert.ok(lock.signedToken, `${name}: no signed token from a lockd that signs`);
      assert.equal(lock.fenceToken, lock.signedToken);
      assert.ok(lock.signedToken.startsWith(`${lock.token}.`), `${name}: signed token ${lock.signedToken}`);
      assert.equal(typeof lock.token, "bigint");
    }
  }

  private lock(name: string): Lock {
    const l = this.leases.get(name);
    assert.ok(l instanceof Lock, `${name}: no such lock`);
    return l;
  }

  private async step(step: any): Promise<void> {
    switch (step.op) {
      case "client":
        return this.client(step);
      case "acquire": {
        const client = this.clients.get(step.client)!;
        const result = await this.acquire(client, this.s(step.resource), this.acquireOptions(step));
        return this.checkGrant(step, step.as, result, client);
      }
      case "start_acquire": {
        const client = this.clients.get(step.client)!;
        const abort = new AbortController();
        const promise = this.acquire(client, this.s(step.resource), { ...this.acquireOptions(step), signal: abort.signal });
        this.pending.set(step.as, { promise, abort, client });
        return;
      }
      case "await": {
        const p = this.pending.get(step.of)!;
        const result = await within(120_000, p.promise, `${step.of} did not finish`);
        return this.checkGrant(step, step.of, result, p.client);
      }
      case "cancel":
        this.pending.get(step.of)!.abort.abort();
        return;
      case "cut_renewals":
        await this.bed.command(step.on ? "cut-renewals on" : "cut-renewals off");
        return;
      case "hold_next_call":
        await this.bed.command(`hold-next-call ${step.after ?? 0}`);
        return;
      case "wait_held":
      case "wait_held_answered":
        await this.bed.command(step.op.replaceAll("_", "-"));
        return;
      case "wait_cuts":
        await this.bed.command(`wait-cuts ${step.at_least}`);
        return;
      case "wait_free": {
        const client = this.clients.get(step.client)!;
        const resource = this.s(step.resource);
        const deadline = now() + 10_000;
        for (;;) {
          const d = await client.describe(resource);
          if (!d.held && !d.permitsHeld && !d.readers) break;
          assert.ok(now() < deadline, `${resource} stayed held`);
          await sleep(20); // polling Describe, bounded
        }
        return;
      }
      case "wait_waiters": {
        const client = this.clients.get(step.client)!;
        const resource = this.s(step.resource);
        const deadline = now() + 60_000;
        while ((await client.describe(resource)).waiters !== step.waiters) {
          assert.ok(now() < deadline, `${resource}: never ${step.waiters} waiters`);
          await sleep(20); // polling Describe, bounded
        }
        return;
      }
      case "release": {
        const held = this.leases.get(step.lease)!;
        const signal = held.signal; // read before: made now, aborted by the release
        const got = await held.release();
        assert.equal(got, step.expect, `release of ${step.lease}: ${got}`);
        assert.ok(signal.aborted && held.signal.aborted, `release of ${step.lease}: its signal did not abort`);
        return;
      }
      case "end_behind": {
        const lock = this.lock(step.lease);
        assert.ok(await this.leaseClient.get(step.lease)!.release(lock.resource, lock.lease.leaseId), "end_behind: not current");
        return;
      }
      case "release_by_id": {
        const lock = this.lock(step.lease);
        const got = await this.clients.get(step.client)!.release(lock.resource, lock.lease.leaseId);
        assert.equal(got, step.expect, `release_by_id of ${step.lease}`);
        return;
      }
      case "describe": {
        const d = await this.clients.get(step.client)!.describe(this.s(step.resource));
        if (step.held !== undefined) assert.equal(d.held, step.held, `describe: ${JSON.stringify({ ...d, token: String(d.token) })}`);
        if (step.held_by !== undefined) {
          assert.ok(d.held, "describe: not held");
          assert.equal(d.token, this.lock(step.held_by).token, `describe: held by token ${d.token}`);
        }
        if (step.waiters !== undefined) assert.equal(d.waiters, step.waiters, "describe: waiters");
        return;
      }
      case "pause":
        this.pausedAt.set(step.server, now());
        await this.bed.command(`pause ${step.server}`);
        return;
      case "resume":
        await this.bed.command(`resume ${step.server}`);
        return;
      case "drop_next_answer":
        await this.bed.command(`drop-next-answer ${step.after ?? 0}`);
        return;
      case "await_lost": {
        const lock = this.lock(step.lease);
        if (!lock.lost) {
          await within(60_000, new Promise((r) => lock.once("lost", r)), `${step.lease}: no loss signalled`);
        }
        // Read after the loss: made then, already aborted, with the loss as its reason.
        assert.ok(lock.signal.aborted && lock.signal.reason instanceof LockLost, "the lock's signal is not aborted");
        const lostAt = this.lostAt.get(lock)!;
        if (step.within_ttl_of_pause) {
          const paused = Math.max(...this.pausedAt.values());
          assert.ok(
            lostAt < paused + lock.lease.ttlMs,
            `the loss came ${(lostAt - paused).toFixed(1)} ms after the pause, not within the TTL ${lock.lease.ttlMs} ms`,
          );
          assert.equal(lock.lostReason, "deadline_passed");
        }
        if (step.reason === "not_current") assert.equal(lock.lostReason, "not_current");
        return;
      }
      case "acquire_all":
      case "acquire_ordered": {
        const client = this.clients.get(step.client)!;
        const opts = { ttlMs: step.ttl_ms ?? 30_000, waitMs: step.wait_ms ?? 0 };
        const requestId = step.request_id === undefined ? {} : { requestId: this.s(step.request_id) };
        let result: Result;
        try {
          result =
            step.op === "acquire_all"
              ? await client.acquireAll(this.s(step.resources), { ...opts, ...requestId })
              : await client.acquireOrdered(this.s(step.resources), opts);
        } catch (e) {
          if (!(e instanceof LockdError)) throw e;
          result = e;
        }
        return this.checkGrant(step, step.as, result, client);
      }
      case "pg_write": {
        const lock = this.lock(step.lease);
        const conn = new pg.Client({ connectionString: this.servers.pg.dsn });
        await conn.connect();
        let got = "ok";
        try {
          await fenced(conn, lock, async (c) => {
            await c.query(UPSERT, [this.s(step.key), this.s(step.value)]);
          });
        } catch (e) {
          if (!(e instanceof StaleToken)) throw e;
          got = "stale";
        } finally {
          await conn.end();
        }
        assert.equal(got, step.expect, `pg_write with ${step.lease}`);
        return;
      }
      case "pg_read": {
        const conn = new pg.Client({ connectionString: this.servers.pg.dsn });
        await conn.connect();
        try {
          const r = await conn.query("SELECT v FROM conformance WHERE k = $1", [this.s(step.key)]);
          assert.equal(r.rows[0]?.v, this.s(step.value), "pg_read");
        } finally {
          await conn.end();
        }
        return;
      }
      case "http_write": {
        const lock = this.lock(step.lease);
        const url = this.servers.http.url + this.s(step.path);
        let got = "ok";
        try {
          const r = await fencedFetch(lock)(url, { method: "PUT", body: "{}", signal: AbortSignal.timeout(30_000) });
          await r.arrayBuffer();
          assert.ok(r.ok, `http_write: ${r.status}`);
        } catch (e) {
          if (!(e instanceof StaleToken)) throw e;
          got = "stale";
        }
        assert.equal(got, step.expect, `http_write with ${step.lease}`);
        return;
      }
      case "pg_pool_check":
        return this.poolCheck(this.lock(step.lease), this.s(step.key));
      default:
        throw new Error(`unknown step ${step.op}`);
    }
  }

  /** With a Pool of one connection and with one Client: a fenced transaction, a failed one, and
   * the next user of the same server connection sees no resource or token. */
  private async poolCheck(lock: Lock, key: string): Promise<void> {
    const dsn = this.servers.pg.dsn;
    const clean = (row: any, pid: number, what: string) => {
      assert.equal(row.r, "", `${what}: the next user sees resource ${row.r}`);
      assert.equal(row.t, "", `${what}: the next user sees token ${row.t}`);
      assert.equal(row.pid, pid, `${what}: not the same connection`);
    };
    const failed = async (db: pg.Pool | pg.Client, what: string) => {
      await assert.rejects(
        fenced(db, lock, async (c) => {
          await c.query(UPSERT, [key, `${what}-failed`]);
          throw new Boom("boom");
        }),
        Boom,
      );
    };

    const pool = new pg.Pool({ connectionString: dsn, max: 1 });
    try {
      const pid = await fenced(pool, lock, async (c) => {
        await c.query(UPSERT, [key, "pg.Pool"]);
        return (await c.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
      });
      clean((await pool.query(SETTINGS)).rows[0], pid, "pg.Pool");
      await failed(pool, "pg.Pool");
      clean((await pool.query(SETTINGS)).rows[0], pid, "pg.Pool after a failed transaction");
      assert.equal(pool.totalCount, 1, "pg.Pool: one connection");
    } finally {
      await pool.end();
    }

    const conn = new pg.Client({ connectionString: dsn });
    await conn.connect();
    try {
      const pid = await fenced(conn, lock, async (c) => {
        await c.query(UPSERT, [key, "pg.Client"]);
        return (await c.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
      });
      clean((await conn.query(SETTINGS)).rows[0], pid, "pg.Client");
      await failed(conn, "pg.Client");
      clean((await conn.query(SETTINGS)).rows[0], pid, "pg.Client after a failed transaction");
    } finally {
      await conn.end();
    }
  }

  async run(): Promise<void> {
    try {
      for (const [i, step] of this.scenario.steps.entries()) {
        try {
          await this.step(step);
        } catch (e) {
          const err = e as Error;
          err.message = `${this.scenario.name}, step ${i} ${JSON.stringify(step)}: ${err.message}`;
          throw err;
        }
      }
    } finally {
      for (const p of this.pending.values()) p.abort.abort();
      await Promise.allSettled([...this.pending.values()].map((p) => p.promise));
      for (const held of this.leases.values()) {
        try {
          await held.release();
        } catch {
          // ends at its TTL
        }
      }
      for (const c of this.clients.values()) c.close();
    }
  }
}
