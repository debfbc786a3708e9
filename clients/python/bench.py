"""Closed-loop lock benchmark for bench/sdk.sh: N holders, each acquiring and releasing its own
resource as fast as answers come, for D seconds; one JSON line of acquire+release pairs/s.

    python3 clients/python/bench.py lockd  --endpoint http://127.0.0.1:17420 --clients 64 --seconds 10
    python3 clients/python/bench.py aio    --endpoint ... (the asyncio client, one task per holder)
    python3 clients/python/bench.py redis  --endpoint redis://127.0.0.1:16379 (redis-py's Lock)
    python3 clients/python/bench.py fence  --endpoint ... --dsn postgresql://... (what fence.transaction costs)
"""

import argparse
import asyncio
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))


def closed_threads(n, seconds, take, give):
    """n threads, each looping take(i) -> handle; give(handle) until the time is up."""
    counts = [0] * n
    errors = [0] * n
    stop = time.monotonic() + seconds
    start = threading.Barrier(n + 1)

    def worker(i):
        start.wait()
        while time.monotonic() < stop:
            try:
                held = take(i)
                if held is None:
                    errors[i] += 1
                    continue
                give(held)
                counts[i] += 1
            except Exception:
                errors[i] += 1
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    began = time.monotonic()
    for t in threads:
        t.join()
    return sum(counts), sum(errors), time.monotonic() - began


def main():
    p = argparse.ArgumentParser()
    p.add_argument("target", choices=["lockd", "aio", "redis", "fence"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--dsn")
    a = p.parse_args()
    run = f"{os.getpid()}-{int(time.time())}"
    if a.target == "lockd":
        import lockd_client
        client = lockd_client.Client(a.endpoint)
        pairs, errors, took = closed_threads(
            a.clients, a.seconds,
            lambda i: client.acquire(f"pybench-{run}-{i}", ttl=30), lambda lock: lock.release())
        name = "python sdk (threads)"
    elif a.target == "aio":
        import lockd_client.aio

        async def go():
            client = lockd_client.aio.Client(a.endpoint)
            counts, stop = [0] * a.clients, time.monotonic() + a.seconds

            async def worker(i):
                while time.monotonic() < stop:
                    lock = await client.acquire(f"pyaio-{run}-{i}", ttl=30)
                    await lock.release()
                    counts[i] += 1
            began = time.monotonic()
            await asyncio.gather(*(worker(i) for i in range(a.clients)))
            took = time.monotonic() - began
            await client.close()
            return sum(counts), 0, took
        pairs, errors, took = asyncio.run(go())
        name = "python sdk (asyncio)"
    elif a.target == "redis":
        import redis
        r = redis.Redis.from_url(a.endpoint)
        pairs, errors, took = closed_threads(
            a.clients, a.seconds,
            lambda i: (lambda lk: lk if lk.acquire(blocking=False) else None)(r.lock(f"pybench-{run}-{i}", timeout=30)),
            lambda lk: lk.release())
        name = "redis-py Lock"
    else:
        # One connection through fence-proxy, one UPDATE per transaction, alternating rounds:
        # with fence.transaction (the declaration in the transaction) and without.
        import psycopg
        import lockd_client
        from lockd_client import fence
        client = lockd_client.Client(a.endpoint)
        lock = client.acquire(f"pybench-fence-{run}", ttl=60)
        conn = psycopg.connect(a.dsn)
        conn.execute("CREATE TABLE IF NOT EXISTS bench_fence (k int PRIMARY KEY, n bigint)")
        conn.execute("INSERT INTO bench_fence VALUES (1, 0) ON CONFLICT DO NOTHING")
        conn.commit()
        upd = "UPDATE bench_fence SET n = n + 1 WHERE k = 1"
        totals = {"fenced": [0, 0.0], "plain": [0, 0.0]}
        rounds = 6
        for r in range(rounds):
            for kind in (("fenced", "plain") if r % 2 == 0 else ("plain", "fenced")):
                stop = time.monotonic() + a.seconds / rounds / 2
                began, n = time.monotonic(), 0
                while time.monotonic() < stop:
                    if kind == "fenced":
                        with fence.transaction(conn, lock) as tx:
                            tx.execute(upd)
                    else:
                        with conn.transaction():
                            conn.execute(upd)
                    n += 1
                totals[kind][0] += n
                totals[kind][1] += time.monotonic() - began
        lock.release()
        out = {k: v[0] / v[1] for k, v in totals.items()}
        print(json.dumps({"sdk": "python fence.transaction", "fenced_tps": out["fenced"], "plain_tps": out["plain"],
                          "ratio": out["fenced"] / out["plain"]}))
        return
    print(json.dumps({"sdk": name, "clients": a.clients, "pairs": pairs, "errors": errors,
                      "seconds": took, "pairs_per_s": pairs / took}))


if __name__ == "__main__":
    main()
