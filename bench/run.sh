#!/usr/bin/env bash
# Reproduces BENCHMARKS.md: lockd, etcd (single node) and Redis (appendfsync always) on this
# machine, in one run, with the same load tool (lockbench). Needs etcd-server and redis-server
# (Debian: apt-get install etcd-server redis-server); prints the results table in Markdown and
# leaves the raw JSON in $OUT (default: a new temporary directory).
#
#   bench/run.sh                 # everything (about 5 minutes)
#   SECONDS_PER_RUN=5 bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
FILL=${FILL_LEASES:-1000000}
OUT=${OUT:-$(mktemp -d /tmp/lockbench.XXXXXX)}
mkdir -p "$OUT"
for b in etcd redis-server; do
  command -v "$b" >/dev/null || { echo "bench/run.sh: $b is missing (apt-get install etcd-server redis-server)" >&2; exit 1; }
done

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

target/release/lockd --data-dir "$OUT/lockd" --listen 127.0.0.1:17420 --log warn 2>"$OUT/lockd.log" &
LOCKD_PID=$!; pids+=("$LOCKD_PID")
start_etcd 12379 12380
start_redis 16379
wait_port 17420; wait_port 12379; wait_port 16379

LOCKD=(--target lockd --endpoint http://127.0.0.1:17420)
ETCD=(--target etcd --endpoint http://127.0.0.1:12379)
REDIS=(--target redis --endpoint redis://127.0.0.1:16379)
# Each run starts with the page cache's dirty data written back, so that one system's
# write-back does not slow the next one's fdatasync.
run() { sync; "$LB" --json "$@" | tee -a "$RESULTS" >/dev/null; }

echo "== baseline" >&2
run baseline --dir "$OUT/lockd"
for clients in 64 1; do
  for t in LOCKD ETCD REDIS; do
    declare -n args=$t
    echo "== closed loop, $clients clients, $t" >&2
    run closed "${args[@]}" --clients "$clients" --duration "${RUN}s"
  done
done
echo "== open loop at the specification's load, lockd" >&2
run open "${LOCKD[@]}" --duration "$((RUN * 2))s"
echo "== $FILL held leases, lockd" >&2
run fill "${LOCKD[@]}" --count "$FILL" --ttl 1h --pid "$LOCKD_PID"

python3 bench/table.py "$RESULTS"
echo "raw results: $RESULTS" >&2
