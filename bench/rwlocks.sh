#!/usr/bin/env bash
# Issue 19: one read-write lock shared by every client, 90 % of the acquires reads, each
# system's way, side by side: lockd's read-write lock (each reader a lease with its own token
# on its own slot, a writer the lock's name; one FIFO queue, so a waiting writer is not
# overtaken by later readers, and the readers behind it are handed the lock together) and
# Redis's, the recipe of Redisson's RReadWriteLock in its simplest form (a hash with the mode
# and a count per holder, one expiry; no writer preference; a refused caller asks again after
# 1 ms; appendfsync always). etcd has no read-write recipe outside its Go library. For scale,
# lockd with 0 % reads (every acquire the writer's: one exclusive lock shared by all). Closed
# loop: acquire, release, again; 8 and 64 clients. Needs redis-server. Prints a Markdown table;
# raw JSON in $OUT.
#
#   bench/rwlocks.sh                     # about two minutes after the build
#   SECONDS_PER_RUN=5 bench/rwlocks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-rwlocks.XXXXXX)}
mkdir -p "$OUT"
command -v redis-server >/dev/null || { echo "bench/rwlocks.sh: redis-server is missing (apt-get install redis-server)" >&2; exit 1; }

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

target/release/lockd --data-dir "$OUT/lockd" --listen 127.0.0.1:17493 --log warn 2>"$OUT/lockd.log" &
pids+=("$!")
start_redis 16392
wait_port 17493; wait_port 16392

LOCKD=(--target lockd --endpoint http://127.0.0.1:17493)
REDIS=(--target redis --endpoint redis://127.0.0.1:16392)
run() { sync; "$LB" --json "$@" | tee -a "$RESULTS" >/dev/null; }
for clients in 8 64; do
  for t in LOCKD REDIS; do
    declare -n args=$t
    echo "== $clients clients, 90 % reads, $t" >&2
    run closed "${args[@]}" --clients "$clients" --rw --read-percent 90 --duration "${RUN}s"
  done
  echo "== $clients clients, 0 % reads, LOCKD" >&2
  run closed "${LOCKD[@]}" --clients "$clients" --rw --read-percent 0 --duration "${RUN}s"
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["target"], r["clients"], r["read_percent"]): r for r in rows}
print("| system | clients | reads | acquires/s (acquire + release) | vs Redis | read p50 / p99 ms | write p50 / p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|")
ms = lambda s, q: f"{s[q]/1000:.2f}" if s["count"] else "-"
for clients in (8, 64):
    redis = by[("redis", clients, 90)]
    for t, reads in (("lockd", 90), ("redis", 90), ("lockd", 0)):
        r = by[(t, clients, reads)]
        rd, wr = r["acquire_read"], r["acquire_write"]
        vs = f"{r['pairs_per_s'] / redis['pairs_per_s']:.2f}x" if reads == 90 else "-"
        print(f"| {t} | {clients} | {reads} % | {r['pairs_per_s']:.0f} | {vs} | {ms(rd,'p50_us')} / {ms(rd,'p99_us')} | {ms(wr,'p50_us')} / {ms(wr,'p99_us')} | {r['errors']} |")
PY
