/** The helpers' types with node-postgres's own: a Pool's callback gets a PoolClient. */
import assert from "node:assert/strict";
import { test } from "node:test";
import type pg from "pg";
import { fenced, type Lock } from "../src/index";

// Type-checked by the build, never called: a wrong type fails `tsc`.
export async function typesOnly(pool: pg.Pool, client: pg.Client, lock: Lock): Promise<number> {
  const a: number = await fenced(pool, lock, async (c) => {
    const pooled: pg.PoolClient = c; // inferred as pg.PoolClient
    return (await pooled.query("SELECT 1 AS n")).rows[0].n;
  });
  const b: string = await fenced(client, lock, async (c) => {
    const r: pg.QueryResult = await c.query("SELECT 1");
    return String(r.rowCount);
  });
  return a + b.length;
}

test("the type checks compile", () => {
  assert.equal(typeof typesOnly, "function");
});
