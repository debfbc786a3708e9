"""The zombie demo, in Python: a holder whose process is paused for real (SIGSTOP) past its
lease wakes up and writes; fence-proxy refuses the write because a newer holder has written.

    python3 clients/python/examples/zombie.py        # or: ./x sdk-demo python

It starts the servers itself (clients/testbed: lockd signing tokens, PostgreSQL behind
fence-proxy), so build them first: cargo build --workspace --bins.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import psycopg

import lockd_client
from lockd_client import fence

RESOURCE = "inventory/sku-1"
KEY = "sku-1"
UPSERT = "INSERT INTO conformance VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v"


def write(dsn, lock, value):
    with psycopg.connect(dsn) as conn:
        with fence.transaction(conn, lock) as tx:
            tx.execute(UPSERT, (KEY, value))


def zombie(endpoint, dsn):
    client = lockd_client.Client(endpoint, holder="zombie")
    lock = client.acquire(RESOURCE, ttl=2)
    print(f"zombie: holds {RESOURCE} with token {lock.token}; writes, then is paused (SIGSTOP)", flush=True)
    write(dsn, lock, f"zombie (token {lock.token})")
    os.kill(os.getpid(), signal.SIGSTOP)      # a GC pause, swap, a debugger: the process stops
    print(f"zombie: woke up; lost={lock.lost.is_set()}; writes anyway with token {lock.token}", flush=True)
    try:
        write(dsn, lock, f"zombie, late (token {lock.token})")
    except lockd_client.StaleToken as e:
        print(f"zombie: refused: {e}", flush=True)
        return 0
    print("zombie: THE STALE WRITE WAS ACCEPTED", flush=True)
    return 1


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--zombie":
        return zombie(sys.argv[2], sys.argv[3])
    repo = pathlib.Path(__file__).resolve().parents[3]
    testbed = os.environ.get("LOCKD_TESTBED") or str(repo / "target" / "debug" / "testbed")
    if not os.path.exists(testbed):
        print(f"{testbed} is missing: build it with cargo build --workspace --bins", file=sys.stderr)
        return 2
    bed = subprocess.Popen([testbed], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        servers = json.loads(bed.stdout.readline())
        endpoint, dsn = servers["lockd"]["endpoint"], servers["pg"]["dsn"]
        child = subprocess.Popen([sys.executable, __file__, "--zombie", endpoint, dsn])
        _, status = os.waitpid(child.pid, os.WUNTRACED)     # until the zombie is stopped
        if not os.WIFSTOPPED(status):
            print("the zombie exited before it was paused", file=sys.stderr)
            return 1
        client = lockd_client.Client(endpoint, holder="newer")
        with client.acquire(RESOURCE, ttl=30, wait=30) as lock:
            print(f"newer:  granted {RESOURCE} with token {lock.token} once the zombie's lease ran out; writes")
            write(dsn, lock, f"newer (token {lock.token})")
            os.kill(child.pid, signal.SIGCONT)
            _, status = os.waitpid(child.pid, 0)
        with psycopg.connect(dsn) as conn:
            value = conn.execute("SELECT v FROM conformance WHERE k = %s", (KEY,)).fetchone()[0]
        print(f"the row holds: {value!r}")
        ok = os.WEXITSTATUS(status) == 0 and value.startswith("newer")
        print("fencing held: the zombie's write was refused" if ok else "FENCING FAILED")
        return 0 if ok else 1
    finally:
        bed.stdin.close()
        bed.wait()


if __name__ == "__main__":
    sys.exit(main())
