// The TypeScript half of bench/sdk.sh: N holders, each acquiring and releasing its own resource
// as fast as answers come for a while, through the SDK (its built dist/) or through redlock
// (the lock a Node.js team would otherwise pick) against one Redis; one JSON line.
//
//   node bench.js lockd http://127.0.0.1:17420 64 10
//   node bench.js redlock redis://127.0.0.1:16379 64 10
"use strict";
const [target, endpoint, clientsArg, secondsArg] = process.argv.slice(2);
const clients = Number(clientsArg ?? 64);
const seconds = Number(secondsArg ?? 10);
const run = `${process.pid}-${Date.now()}`;

async function main() {
  let pair, name, close;
  if (target === "lockd") {
    const { Client } = require("../dist/src/index.js");
    const c = new Client(endpoint);
    name = "typescript sdk";
    pair = async (i) => {
      const lock = await c.acquire(`tsbench-${run}-${i}`, { ttlMs: 30_000 });
      await lock.release();
    };
    close = () => c.close();
  } else if (target === "redlock") {
    const Redis = require("ioredis");
    const Redlock = require("redlock");
    const redis = new Redis(endpoint);
    const redlock = new Redlock([redis], { retryCount: 0 });
    name = "redlock (ioredis)";
    pair = async (i) => {
      const lock = await redlock.lock(`tsbench-${run}-${i}`, 30_000);
      await lock.unlock();
    };
    close = () => redis.disconnect();
  } else {
    throw new Error(`unknown target ${target}`);
  }
  let pairs = 0, errors = 0;
  const stop = performance.now() + seconds * 1000;
  const began = performance.now();
  await Promise.all(Array.from({ length: clients }, async (_, i) => {
    while (performance.now() < stop) {
      try {
        await pair(i);
        pairs++;
      } catch {
        errors++;
      }
    }
  }));
  const took = (performance.now() - began) / 1000;
  close();
  console.log(JSON.stringify({ sdk: name, clients, pairs, errors, seconds: took, pairs_per_s: pairs / took }));
}
main().catch((e) => { console.error(e); process.exit(1); });
