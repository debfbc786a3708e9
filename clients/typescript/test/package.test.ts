/** The package: its copy of lock.proto is lockd-proto's, and the fence helpers' mapping. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import {
  DECLARE,
  FenceRefused,
  Lease,
  PROTO_FILE,
  PROTO_ROOT,
  StaleToken,
  checkResponse,
  fenced,
  fencedFetch,
  fencingHeaders,
} from "../src/index";
import { PACKAGE_ROOT, REPO_ROOT } from "./testbed";

test("the shipped lock.proto is lockd-proto's (not a stale copy)", () => {
  const source = path.join(REPO_ROOT, "lockd", "lockd-proto", "proto", PROTO_FILE);
  const shipped = path.join(PROTO_ROOT, PROTO_FILE);
  assert.equal(PROTO_ROOT, path.join(PACKAGE_ROOT, "proto"));
  assert.ok(
    readFileSync(shipped, "utf8") === readFileSync(source, "utf8"),
    `${shipped} differs from ${source}: copy it again (cp ${source} ${shipped})`,
  );
});

test("the package ships the proto and the compiled code", () => {
  const pkg = JSON.parse(readFileSync(path.join(PACKAGE_ROOT, "package.json"), "utf8"));
  assert.ok(pkg.files.includes("proto/"));
  assert.ok(pkg.files.includes("dist/src/"));
  for (const section of ["dependencies", "devDependencies", "peerDependencies"]) {
    for (const [name, version] of Object.entries(pkg[section] ?? {})) {
      assert.match(String(version), /^\d+\.\d+\.\d+$/, `${name} is not pinned exactly`);
    }
  }
});

const lease = new Lease("inv/sku-1", "00ff", 9223372036854775807n, "9223372036854775807.k1.mac", 30000, 0, false, 1, null);

test("tokens are exact bigints, and the fence token is the signed one when present", () => {
  assert.equal(lease.token, 2n ** 63n - 1n);
  assert.equal(lease.fenceToken, "9223372036854775807.k1.mac");
  const unsigned = new Lease("r", "00", 42n, null, 1000, 0, false, 1, null);
  assert.equal(unsigned.fenceToken, "42");
  assert.deepEqual(fencingHeaders(unsigned), { "Fencing-Resource": "r", "Fencing-Token": "42" });
  assert.ok(!JSON.stringify(lease).includes("00ff"), "the lease id is not serialised");
});

function problem(status: number, type: string): Response {
  return new Response(JSON.stringify({ type, detail: "d", resource: "inv/sku-1", token: "3", highest: 4 }), {
    status,
    headers: { "content-type": "application/problem+json" },
  });
}

test("fence-proxy's HTTP refusals are typed", async () => {
  await assert.rejects(checkResponse(problem(409, "urn:fencing:problem:stale-token")), (e: unknown) => {
    assert.ok(e instanceof StaleToken);
    assert.equal(e.status, 409);
    assert.equal(e.code, "stale-token");
    assert.equal(e.highest, "4");
    return true;
  });
  await assert.rejects(checkResponse(problem(403, "urn:fencing:problem:forged-token")), (e: unknown) => {
    assert.ok(e instanceof FenceRefused && !(e instanceof StaleToken));
    return true;
  });
  const other = problem(409, "urn:example:conflict");
  assert.equal(await checkResponse(other), other);
  const ok = new Response("fine", { status: 200 });
  assert.equal(await checkResponse(ok), ok);
  let seen: Headers | undefined;
  const f = fencedFetch(lease, (async (_: unknown, init?: RequestInit) => {
    seen = new Headers(init?.headers);
    return new Response("ok");
  }) as typeof fetch);
  assert.equal(await (await f("http://x/", { headers: { "x-a": "b" } })).text(), "ok");
  assert.equal(seen?.get("fencing-resource"), "inv/sku-1");
  assert.equal(seen?.get("fencing-token"), lease.fenceToken);
  assert.equal(seen?.get("x-a"), "b");
});

/** A fake node-postgres client that records statements and fails where told. */
function fakeClient(fail: Record<string, Error> = {}) {
  const log: [string, unknown[] | undefined][] = [];
  return {
    log,
    async query(text: string, values?: unknown[]) {
      log.push([text, values]);
      for (const [k, e] of Object.entries(fail)) if (text.startsWith(k)) throw e;
      return { rows: [] };
    },
  };
}

function sqlError(code: string): Error {
  return Object.assign(new Error(`refused ${code}`), { code });
}

test("fenced: BEGIN, the declaration with bound parameters, the work, COMMIT", async () => {
  const c = fakeClient();
  assert.equal(await fenced(c, lease, async (tx) => (await tx.query("UPDATE t SET v = 1"), 7)), 7);
  assert.deepEqual(c.log, [
    ["BEGIN", undefined],
    [DECLARE, ["inv/sku-1", lease.fenceToken]],
    ["UPDATE t SET v = 1", undefined],
    ["COMMIT", undefined],
  ]);
});

test("fenced: FN001/FN003 are StaleToken, other FN00x FenceRefused, others pass; ROLLBACK each time", async () => {
  for (const [code, kind] of [["FN001", StaleToken], ["FN003", StaleToken], ["FN002", FenceRefused]] as const) {
    const c = fakeClient({ UPDATE: sqlError(code) });
    await assert.rejects(fenced(c, lease, (tx) => tx.query("UPDATE t")), (e: unknown) => {
      assert.ok(e instanceof kind, `${code}: ${e}`);
      assert.equal((e as FenceRefused).code, code);
      if (kind === FenceRefused) assert.ok(!(e instanceof StaleToken));
      return true;
    });
    assert.deepEqual(c.log.at(-1), ["ROLLBACK", undefined]);
  }
  const c = fakeClient({ COMMIT: sqlError("FN003") });
  await assert.rejects(fenced(c, lease, async () => undefined), StaleToken);
  const plain = fakeClient({ UPDATE: sqlError("23505") });
  await assert.rejects(fenced(plain, lease, (tx) => tx.query("UPDATE t")), /refused 23505/);
});

test("fenced: a pool's client is taken and given back (destroyed when ROLLBACK failed)", async () => {
  const released: unknown[] = [];
  const make = (fail: Record<string, Error>) => {
    const c = fakeClient(fail);
    return {
      totalCount: 1,
      async connect() {
        return Object.assign(c, { release: (err?: unknown) => released.push(err) });
      },
    };
  };
  await fenced(make({}), lease, async () => undefined);
  assert.deepEqual(released, [undefined]);
  await assert.rejects(fenced(make({ UPDATE: sqlError("FN001"), ROLLBACK: new Error("gone") }), lease, (tx) => tx.query("UPDATE")), StaleToken);
  assert.ok((released[1] as unknown) instanceof Error);
});
