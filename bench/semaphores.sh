#!/usr/bin/env bash
# Issue 19: a semaphore of 8 permits shared by every client, each system's way, side by side:
# lockd's permits (each a lease with its own token; a waiter waits in lockd's FIFO queue and
# is handed the permit that frees), and Redis's semaphore with leases (a sorted set of the
# permits held scored by expiry, the recipe of Redisson's RPermitExpirableSemaphore; a refused
# caller asks again after 1 ms; appendfsync always). etcd has no semaphore recipe. Closed
# loop: acquire a permit, release it, again. 8 clients (never more than 8 want one: the cost of
# a permit) and 64 (56 always waiting). Needs redis-server. Prints a Markdown table; raw JSON
# in $OUT.
#
#   bench/semaphores.sh                  # about a minute after the build
#   SECONDS_PER_RUN=5 bench/semaphores.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-semaphores.XXXXXX)}
mkdir -p "$OUT"
command -v redis-server >/dev/null || { echo "bench/semaphores.sh: redis-server is missing (apt-get install redis-server)" >&2; exit 1; }

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

target/release/lockd --data-dir "$OUT/lockd" --listen 127.0.0.1:17491 --log warn 2>"$OUT/lockd.log" &
pids+=("$!")
start_redis 16390
wait_port 17491; wait_port 16390

LOCKD=(--target lockd --endpoint http://127.0.0.1:17491)
REDIS=(--target redis --endpoint redis://127.0.0.1:16390)
run() { sync; "$LB" --json "$@" | tee -a "$RESULTS" >/dev/null; }
for clients in 8 64; do
  for t in LOCKD REDIS; do
    declare -n args=$t
    echo "== $clients clients, 8 permits, $t" >&2
    run closed "${args[@]}" --clients "$clients" --permits 8 --duration "${RUN}s"
  done
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["target"], r["clients"]): r for r in rows}
print("| system | clients | permits/s (acquire + release) | vs Redis | acquire p50 ms | acquire p99 ms | errors |")
print("|---|---|---|---|---|---|---|")
for clients in (8, 64):
    redis = by[("redis", clients)]
    for t in ("lockd", "redis"):
        r = by[(t, clients)]
        a = r["acquire"]
        print(f"| {t} | {clients} | {r['pairs_per_s']:.0f} | {r['pairs_per_s'] / redis['pairs_per_s']:.2f}x | {a['p50_us']/1000:.2f} | {a['p99_us']/1000:.2f} | {r['errors']} |")
PY
