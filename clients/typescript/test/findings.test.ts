/**
 * Findings of an outside review: fenced() inside a transaction, a grant dropped by a cancelled
 * acquire, fencedFetch and redirects, 'lost' listeners that throw, null options.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import pg from "pg";
import { Cancelled, Client, InvalidArgument, LeaseNotCurrent, Lock, StaleToken, fenced, fencedFetch } from "../src/index";
import { Testbed } from "./testbed";

let bed: Testbed | undefined;
const run = randomBytes(4).toString("hex");
const UPSERT = "INSERT INTO conformance VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v";
const now = () => performance.now();
const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

before(async () => {
  bed = await Testbed.start();
});

after(async () => {
  await bed?.close();
});

function servers(): any {
  if (!bed) throw new Error("the testbed did not start");
  return bed.servers;
}

/** Polls `ok()` (bounded) until it is true. */
async function until(what: string, ms: number, ok: () => Promise<boolean>): Promise<void> {
  const deadline = now() + ms;
  while (!(await ok())) {
    assert.ok(now() < deadline, `${what}: not within ${ms} ms`);
    await tick(20); // polling a condition, bounded
  }
}

async function pgClient(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: servers().pg.dsn });
  await c.connect();
  return c;
}

async function valueOf(key: string): Promise<string | undefined> {
  const c = await pgClient();
  try {
    return (await c.query("SELECT v FROM conformance WHERE k = $1", [key])).rows[0]?.v;
  } finally {
    await c.end();
  }
}

test("fenced() nested in fenced() on the same client is refused, and a stale outer write does not land", async () => {
  const client = new Client(servers().lockd.endpoint);
  const c = await pgClient();
  const r = `nested/${run}`;
  const key = `nested-${run}`;
  try {
    // OLD is stale: a newer holder of r has written since.
    const old = await client.acquire(r, { ttlMs: 30_000 });
    await old.release();
    const current = await client.acquire(r, { ttlMs: 30_000 });
    await fenced(c, current, async (q) => void (await q.query(UPSERT, [key, "newer"])));
    await current.release();
    const other = await client.acquire(`nested-other/${run}`, { ttlMs: 30_000 });
    try {
      await assert.rejects(
        fenced(c, old, async (q) => {
          await fenced(q, other, async (q2) => void (await q2.query(UPSERT, [`${key}-other`, "inner"])));
          await q.query(UPSERT, [key, "stale outer write"]);
        }),
        (e) => e instanceof InvalidArgument && /cannot run inside one/.test(e.message),
      );
    } finally {
      await other.release();
    }
    assert.equal(await valueOf(key), "newer", "the stale outer write landed");
    assert.equal(await valueOf(`${key}-other`), undefined, "the inner write was committed");
    // The client is usable afterwards, and the stale lock is still refused as such.
    await assert.rejects(fenced(c, old, async (q) => void (await q.query(UPSERT, [key, "stale"]))), StaleToken);
  } finally {
    await c.end();
    client.close();
  }
});

test("fenced() on a client inside the caller's transaction is refused and commits nothing", async () => {
  const client = new Client(servers().lockd.endpoint);
  const c = await pgClient();
  const key = `caller-tx-${run}`;
  try {
    const lock = await client.acquire(`caller-tx/${run}`, { ttlMs: 30_000 });
    try {
      await c.query("BEGIN");
      await c.query(UPSERT, [key, "the caller's write"]);
      await assert.rejects(
        fenced(c, lock, async (q) => void (await q.query(UPSERT, [`${key}-fenced`, "fenced"]))),
        (e) => e instanceof InvalidArgument && /cannot run inside one/.test(e.message),
      );
      await c.query("ROLLBACK");
      assert.equal(await valueOf(key), undefined, "the caller's write was committed");
      assert.equal(await valueOf(`${key}-fenced`), undefined, "the fenced write was committed");
      // Outside the transaction, it works.
      await fenced(c, lock, async (q) => void (await q.query(UPSERT, [`${key}-fenced`, "fenced"])));
      assert.equal(await valueOf(`${key}-fenced`), "fenced");

      // A client that does not tell its transaction status (not a pg.Client): still refused
      // inside a running fenced() call on it.
      const other = { query: (text: string, values?: unknown[]) => c.query(text, values) };
      await assert.rejects(
        fenced(other, lock, async (q) => {
          await q.query(UPSERT, [`${key}-other`, "outer"]);
          await fenced(q, lock, async (q2) => void (await q2.query(UPSERT, [`${key}-inner`, "inner"])));
        }),
        (e) => e instanceof InvalidArgument && /inside a running fenced\(\) call/.test(e.message),
      );
      assert.equal(await valueOf(`${key}-other`), undefined, "the outer write was committed by the inner COMMIT");
      assert.equal(await valueOf(`${key}-inner`), undefined, "the inner write was committed");
      await fenced(other, lock, async (q) => void (await q.query(UPSERT, [`${key}-other`, "fenced"])));
      assert.equal(await valueOf(`${key}-other`), "fenced");
    } finally {
      await lock.release();
    }
  } finally {
    await c.end();
  }
  client.close();
});

test("a waiting acquire cancelled just as it is granted leaves no lease behind", async () => {
  const a = new Client(servers().lockd.endpoint);
  const b = new Client(servers().lockd.endpoint);
  const resources: string[] = [];
  try {
    for (let i = 0; i < 30; i++) {
      const r = `cancel-race/${run}/${i}`;
      resources.push(r);
      const held = await a.acquire(r, { ttlMs: 30_000 });
      const abort = new AbortController();
      const waiting = b.acquire(r, { ttlMs: 30_000, waitMs: 60_000, signal: abort.signal });
      waiting.catch(() => undefined);
      await until(`${r}: one waiter`, 10_000, async () => (await a.describe(r)).waiters === 1);
      const released = held.release();
      abort.abort();
      await assert.rejects(waiting, Cancelled);
      await released;
    }
    // Without a clean-up, the grants the cancelled waiters dropped stay held for their TTL (30 s).
    for (const r of resources) {
      await until(`${r}: free again`, 10_000, async () => !(await a.describe(r)).held);
    }
  } finally {
    a.close();
    b.close();
  }
});

function listen(handler: Parameters<typeof createServer>[1]): Promise<Server> {
  const server = createServer(handler);
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

const origin = (s: Server) => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;

test("fencedFetch does not carry the fencing headers along a redirect to another origin", async () => {
  const seen: IncomingHttpHeaders[] = [];
  const other = await listen((req, res) => {
    seen.push(req.headers);
    res.end("ok");
  });
  const first = await listen((_req, res) => {
    res.writeHead(307, { location: `${origin(other)}/elsewhere` });
    res.end();
  });
  try {
    const lock = { resource: "redirect/r", fenceToken: "7.key.mac" };
    const r = await fencedFetch(lock)(`${origin(first)}/items/1`, { method: "PUT", body: "{}" });
    await r.arrayBuffer();
    assert.equal(r.status, 307, "the redirect is returned, not followed");
    assert.equal(r.headers.get("location"), `${origin(other)}/elsewhere`);
    assert.deepEqual(
      seen.map((h) => [h["fencing-resource"], h["fencing-token"]]),
      [],
      "the other origin was sent the request (with the fencing headers)",
    );
    // Asked to follow, it follows (and the headers go along, as documented).
    const followed = await fencedFetch(lock)(`${origin(first)}/items/1`, { method: "PUT", body: "{}", redirect: "follow" });
    assert.equal(await followed.text(), "ok");
    assert.equal(seen.length, 1);
  } finally {
    first.close();
    other.close();
    first.closeAllConnections();
    other.closeAllConnections();
  }
});

test("a downgrade that fails ends the Lock and signals the loss", async () => {
  const client = new Client(servers().lockd.endpoint);
  try {
    const r = `downgrade-fails/${run}`;
    const lock = await client.acquire(r, { ttlMs: 30_000 });
    let told = "";
    lock.on("lost", (reason) => {
      told = reason;
    });
    await assert.rejects(lock.downgrade());
    assert.equal(told, "not_current");
    assert.ok(lock.lost && lock.signal.aborted);
    assert.equal((await client.describe(r)).held, false);
    // A Lock downgraded once: its signal aborts, and it is not downgraded again nor lost.
    const writer = await client.acquire(`${r}-rw`, { ttlMs: 30_000, mode: "write" });
    const signal = writer.signal;
    const reader = await writer.downgrade();
    assert.ok(signal.aborted && !writer.lost);
    await assert.rejects(writer.downgrade(), LeaseNotCurrent);
    assert.ok(!writer.lost);
    assert.ok(await reader.release());
  } finally {
    client.close();
  }
});

test("a 'lost' listener that throws does not keep the loss from the others", async () => {
  const client = new Client(servers().lockd.endpoint);
  const warned: string[] = [];
  const onWarning = (w: Error) => warned.push(w.message);
  process.on("warning", onWarning);
  try {
    const lock = await client.acquire(`lost-listeners/${run}`, { ttlMs: 1_500 });
    const told: string[] = [];
    const second = new Promise<void>((resolve) => {
      lock.on("lost", () => {
        told.push("first");
        throw new Error("a listener's bug");
      });
      lock.on("lost", (reason) => {
        told.push(`second: ${reason}`);
        resolve();
      });
    });
    // Ended behind its back: its next renewal (within a third of the TTL) learns it.
    assert.ok(await client.release(lock.resource, lock.lease.leaseId));
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      second,
      new Promise<void>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`not every listener was told within 10 s: ${told}`)), 10_000);
      }),
    ]);
    clearTimeout(timer);
    assert.deepEqual(told, ["first", "second: not_current"]);
    assert.ok(lock.lost && lock.signal.aborted);
    await until("the warning", 5_000, async () => warned.some((m) => m.includes("a listener's bug")));
  } finally {
    process.off("warning", onWarning);
    client.close();
  }
});

test("null options are no options", async () => {
  const client = new Client(servers().lockd.endpoint);
  try {
    const lock: Lock = await client.acquire(`null-options/${run}`, null);
    assert.ok(await lock.release());
    const set = await client.acquireAll([`null-options/${run}/a`, `null-options/${run}/b`], null);
    assert.ok(await set.release());
    const ordered = await client.acquireOrdered([`null-options/${run}/c`], null);
    assert.ok(await ordered.release());
    await assert.rejects(client.acquire(`null-options/${run}`, 5 as any), InvalidArgument);
  } finally {
    client.close();
  }
});
