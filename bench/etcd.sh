#!/usr/bin/env bash
# Reproduces BENCHMARKS.md's etcd-cluster table: on one three-member etcd cluster (loopback),
# lockd over etcd (`--backend etcd`, every member as an endpoint) against the raw etcd lock
# recipe (lease grant + "create if absent" transaction, release by lease revoke), both driven
# by lockbench, in one run. Needs etcd-server (apt-get install etcd-server); prints a Markdown
# table and leaves the raw JSON in $OUT (default: a new temporary directory).
#
#   bench/etcd.sh
#   SECONDS_PER_RUN=5 bench/etcd.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-etcd.XXXXXX)}
mkdir -p "$OUT"
command -v etcd >/dev/null || { echo "bench/etcd.sh: etcd is missing (apt-get install etcd-server)" >&2; exit 1; }

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

CLUSTER=m1=http://127.0.0.1:21380,m2=http://127.0.0.1:22380,m3=http://127.0.0.1:23380
for i in 1 2 3; do
  etcd --name "m$i" --data-dir "$OUT/etcd-m$i" \
    --listen-client-urls "http://127.0.0.1:2${i}379" --advertise-client-urls "http://127.0.0.1:2${i}379" \
    --listen-peer-urls "http://127.0.0.1:2${i}380" --initial-advertise-peer-urls "http://127.0.0.1:2${i}380" \
    --initial-cluster "$CLUSTER" --initial-cluster-state new --log-level error >"$OUT/etcd-m$i.log" 2>&1 &
  pids+=("$!")
done
wait_port 21379; wait_port 22379; wait_port 23379
ENDPOINTS=http://127.0.0.1:21379,http://127.0.0.1:22379,http://127.0.0.1:23379
target/release/lockd --backend etcd --etcd-endpoints "$ENDPOINTS" --data-dir "$OUT/lockd" \
  --listen 127.0.0.1:17421 --log warn 2>"$OUT/lockd.log" &
pids+=("$!")
wait_port 17421

LOCKD=(--target lockd --endpoint http://127.0.0.1:17421)
ETCD=(--target etcd --endpoint "$ENDPOINTS")
run() { sync; "$LB" --json "$@" | tee -a "$RESULTS" >/dev/null; }

for clients in 64 1; do
  for t in LOCKD ETCD; do
    declare -n args=$t
    echo "== closed loop, $clients clients, $t" >&2
    run closed "${args[@]}" --clients "$clients" --duration "${RUN}s"
  done
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = {(r["target"], r["clients"]): r for r in map(json.loads, open(sys.argv[1])) if r.get("mode") == "closed"}
ms = lambda us: f"{us / 1000:.2f}"
print("| clients | system | pairs/s | vs etcd recipe | acquire p50 ms | pair p50 ms | pair p50 vs etcd | pair p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for clients in (64, 1):
    e = rows[("etcd", clients)]
    for t in ("lockd", "etcd"):
        r = rows[(t, clients)]
        print(f"| {clients} | {'lockd over etcd' if t == 'lockd' else 'etcd recipe'} | {r['pairs_per_s']:.0f} | "
              f"{r['pairs_per_s'] / e['pairs_per_s']:.2f}x | {ms(r['acquire']['p50_us'])} | {ms(r['pair']['p50_us'])} | "
              f"{r['pair']['p50_us'] / e['pair']['p50_us']:.2f}x | {ms(r['pair']['p99_us'])} | {r['errors']} |")
PY
echo "raw results: $RESULTS" >&2
