#!/usr/bin/env bash
# Issue 19: a set of locks taken all or none, each system's way, side by side: lockd's
# AcquireAll (and ReleaseMany), etcd's one transaction of N puts under one lease (released by
# revoking it), and a Redis script that sets every key or none (appendfsync always). Closed
# loop, each client its own set, at 64 and 1 clients, sets of 4 and, for reference, single
# locks. Needs etcd-server and redis-server. Prints a Markdown table; raw JSON in $OUT.
#
#   bench/sets.sh                  # about 3 minutes after the build
#   SECONDS_PER_RUN=5 bench/sets.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-sets.XXXXXX)}
mkdir -p "$OUT"
for b in etcd redis-server; do
  command -v "$b" >/dev/null || { echo "bench/sets.sh: $b is missing (apt-get install etcd-server redis-server)" >&2; exit 1; }
done

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

target/release/lockd --data-dir "$OUT/lockd" --listen 127.0.0.1:17490 --log warn 2>"$OUT/lockd.log" &
pids+=("$!")
start_etcd 12389 12390
start_redis 16389
wait_port 17490; wait_port 12389; wait_port 16389

LOCKD=(--target lockd --endpoint http://127.0.0.1:17490)
ETCD=(--target etcd --endpoint http://127.0.0.1:12389)
REDIS=(--target redis --endpoint redis://127.0.0.1:16389)
run() { sync; "$LB" --json "$@" | tee -a "$RESULTS" >/dev/null; }
for clients in 64 1; do
  for set in 4 1; do
    for t in LOCKD ETCD REDIS; do
      declare -n args=$t
      echo "== $clients clients, sets of $set, $t" >&2
      run closed "${args[@]}" --clients "$clients" --set "$set" --duration "${RUN}s"
    done
  done
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["target"], r["clients"], r["set"]): r for r in rows}
print("| system | clients | locks per call | sets/s (acquire + release) | vs etcd | acquire p50 ms | acquire p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|")
for clients in (64, 1):
    for n in (4, 1):
        etcd = by[("etcd", clients, n)]
        for t in ("lockd", "etcd", "redis"):
            r = by[(t, clients, n)]
            a = r["acquire"]
            print(f"| {t} | {clients} | {n} | {r['pairs_per_s']:.0f} | {r['pairs_per_s'] / etcd['pairs_per_s']:.2f}x | {a['p50_us']/1000:.2f} | {a['p99_us']/1000:.2f} | {r['errors']} |")
PY
