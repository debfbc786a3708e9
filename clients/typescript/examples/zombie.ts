/**
 * The zombie demo in TypeScript: a holder whose process is paused for real (SIGSTOP) past its
 * lease wakes up and writes; fence-proxy refuses the write because a newer holder has written.
 *
 *     npm run demo          (from clients/typescript; or: ./x sdk-demo typescript)
 *
 * It starts the servers itself (clients/testbed: lockd signing tokens, PostgreSQL behind
 * fence-proxy), so build them first: cargo build --workspace --bins.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import * as path from "node:path";
import { createInterface } from "node:readline";
import pg from "pg";
import { Client, fenced, StaleToken, type Lock } from "../src/index";

const RESOURCE = "inventory/sku-1";
const KEY = "sku-1";
const UPSERT = "INSERT INTO conformance VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v";

async function write(dsn: string, lock: Lock, value: string): Promise<void> {
  const c = new pg.Client({ connectionString: dsn });
  await c.connect();
  try {
    await fenced(c, lock, (tx) => tx.query(UPSERT, [KEY, value]));
  } finally {
    await c.end();
  }
}

/** The zombie's process: takes the lock, writes, says so, and is paused by the demo. */
async function zombie(endpoint: string, dsn: string): Promise<number> {
  const client = new Client(endpoint, { holder: "zombie" });
  const lock = await client.acquire(RESOURCE, { ttlMs: 2_000 });
  console.log(`zombie: holds ${RESOURCE} with token ${lock.token}; writes, then is paused (SIGSTOP)`);
  await write(dsn, lock, `zombie (token ${lock.token})`);
  console.log("PAUSE ME");
  // stdin closes when the demo has resumed this process: then it writes, late.
  await new Promise((resolve) => process.stdin.once("end", resolve).resume());
  console.log(`zombie: woke up; writes anyway with token ${lock.token}`);
  try {
    await write(dsn, lock, `zombie, late (token ${lock.token})`);
  } catch (e) {
    if (e instanceof StaleToken) {
      console.log(`zombie: refused: ${e.message}`);
      return 0;
    }
    throw e;
  } finally {
    client.close();
  }
  console.log("zombie: THE STALE WRITE WAS ACCEPTED");
  return 1;
}

function lines(stream: NodeJS.ReadableStream): AsyncIterator<string> {
  return createInterface({ input: stream })[Symbol.asyncIterator]();
}

export async function demo(): Promise<number> {
  const testbed = process.env.LOCKD_TESTBED ?? path.resolve(__dirname, "../../../../target/debug/testbed");
  if (!existsSync(testbed)) {
    console.error(`${testbed} is missing: build it with cargo build --workspace --bins`);
    return 2;
  }
  const bed = spawn(testbed, [], { stdio: ["pipe", "pipe", "inherit"] });
  try {
    const servers = JSON.parse((await lines(bed.stdout!).next()).value);
    const endpoint: string = servers.lockd.endpoint;
    const dsn: string = servers.pg.dsn;
    const child = spawn(process.execPath, [__filename, "--zombie", endpoint, dsn], { stdio: ["pipe", "pipe", "inherit"] });
    const said = lines(child.stdout!);
    const exited = new Promise<number | null>((resolve) => child.once("exit", resolve));
    for (;;) {
      const { value, done } = await said.next();
      if (done) {
        console.error("the zombie exited before it was paused");
        return 1;
      }
      if (value === "PAUSE ME") break;
      console.log(value);
    }
    child.kill("SIGSTOP"); // a GC pause, swap, a debugger: the process stops
    const client = new Client(endpoint, { holder: "newer" });
    const lock = await client.acquire(RESOURCE, { ttlMs: 30_000, waitMs: 30_000 });
    console.log(`newer:  granted ${RESOURCE} with token ${lock.token} once the zombie's lease ran out; writes`);
    await write(dsn, lock, `newer (token ${lock.token})`);
    child.kill("SIGCONT");
    child.stdin!.end();
    for (let r = await said.next(); !r.done; r = await said.next()) console.log(r.value);
    const code = await exited;
    await lock.release();
    client.close();
    const c = new pg.Client({ connectionString: dsn });
    await c.connect();
    const value: string = (await c.query("SELECT v FROM conformance WHERE k = $1", [KEY])).rows[0].v;
    await c.end();
    console.log(`the row holds: ${JSON.stringify(value)}`);
    const held = code === 0 && value.startsWith("newer");
    console.log(held ? "fencing held: the zombie's write was refused" : "FENCING FAILED");
    return held ? 0 : 1;
  } finally {
    bed.stdin!.end();
  }
}

if (require.main === module) {
  const [flag, endpoint, dsn] = process.argv.slice(2);
  (flag === "--zombie" ? zombie(endpoint, dsn) : demo()).then(
    (code) => process.exit(code),
    (e) => {
      console.error(e);
      process.exit(2);
    },
  );
}
