#!/usr/bin/env bash
# Reproduces BENCHMARKS.md's high-availability tables in one run on this machine: three etcd
# members on loopback, two lockd instances over them (`--backend etcd`: one leads, the other
# forwards), and the raw etcd lock recipe (lease grant + "create if absent" transaction,
# renewal by lease keep-alive, release by lease revoke), all driven by lockbench:
#
# 1. open loop at the specification's load (2,000 acquires, renewals and releases per second
#    over 20,000 held locks, 20 s): lockd through both instances, the recipe at the same rates
#    and at 1,000 and 500 per second (where it holds);
# 2. closed loop, 64 clients and 1 client: lockd through the leader, through the follower,
#    and the recipe;
# 3. failover: `kill -9` of the leading lockd, then the time until a grant through the other
#    instance (lockctl, whose SDK retries through the failover), three times.
#
# Needs etcd-server and etcd-client (apt-get install etcd-server etcd-client); prints Markdown
# tables and leaves the raw JSON in $OUT (default: a new temporary directory).
#
#   bench/etcd.sh
#   SECONDS_PER_RUN=5 bench/etcd.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
OPEN_RUN=${OPEN_SECONDS:-20}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-etcd.XXXXXX)}
mkdir -p "$OUT"
for b in etcd etcdctl; do
  command -v $b >/dev/null || { echo "bench/etcd.sh: $b is missing (apt-get install etcd-server etcd-client)" >&2; exit 1; }
done

cargo build --release -q -p lockd-server -p lockbench -p lockd-client
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

# lockd instance N (1 or 2) on port 1742N.
declare -A LOCKD_PID
start_lockd() {
  target/release/lockd --backend etcd --etcd-endpoints "$ENDPOINTS" --data-dir "$OUT/lockd-$1" \
    --listen "127.0.0.1:1742$1" --log info --log-format json 2>>"$OUT/lockd-$1.log" &
  LOCKD_PID[$1]=$!
  pids+=("$!")
  wait_port "1742$1"
}
# The instance (1 or 2) the leader key names, once one leads.
leader() {
  for _ in $(seq 1 200); do
    a=$(ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" get /lockd/leader --print-value-only 2>/dev/null \
      | python3 -c 'import json,sys; t=sys.stdin.read().strip(); print(json.loads(t)["address"][-1] if t else "")')
    [ -n "$a" ] && [ "$a" != "${1:-}" ] && { echo "$a"; return; }
    sleep 0.05
  done
  echo "bench/etcd.sh: no lockd instance leads" >&2; exit 1
}
start_lockd 1; start_lockd 2
L=$(leader); F=$((3 - L))
echo "lockd $L leads, lockd $F follows" >&2

BOTH=http://127.0.0.1:17421,http://127.0.0.1:17422
tag() { python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r.update(json.loads(sys.argv[1])); print(json.dumps(r))' "$1"; }
runs() { sync; "$LB" --json "${@:2}" | tag "$1" >> "$RESULTS"; }

echo "== open loop at the specification's load, lockd over both instances" >&2
runs '{"system":"lockd","via":"both"}' open --target lockd --endpoint "$BOTH" --connections 8 \
  --acquire-rate 2000 --renew-rate 2000 --release-rate 2000 --held 20000 --duration "${OPEN_RUN}s"
for rate in 2000 1000 500; do
  held=$((rate * 10))
  echo "== open loop, raw etcd recipe at $rate/s" >&2
  runs "{\"system\":\"etcd\",\"via\":\"recipe\"}" open --target etcd --endpoint "$ENDPOINTS" --connections 8 \
    --acquire-rate $rate --renew-rate $rate --release-rate $rate --held $held --duration "${OPEN_RUN}s"
done

for clients in 64 1; do
  echo "== closed loop, $clients clients" >&2
  runs '{"system":"lockd","via":"leader"}' closed --target lockd --endpoint "http://127.0.0.1:1742$L" --clients "$clients" --duration "${RUN}s"
  runs '{"system":"lockd","via":"follower"}' closed --target lockd --endpoint "http://127.0.0.1:1742$F" --clients "$clients" --duration "${RUN}s"
  runs '{"system":"etcd","via":"recipe"}' closed --target etcd --endpoint "$ENDPOINTS" --clients "$clients" --duration "${RUN}s"
done

echo "== failover" >&2
for n in 1 2 3; do
  L=$(leader); F=$((3 - L))
  before=$(date +%s%N)
  kill -9 "${LOCKD_PID[$L]}"
  target/release/lockctl --endpoint "http://127.0.0.1:1742$F" acquire "failover-$n" --ttl 30s >/dev/null
  after=$(date +%s%N)
  echo "{\"mode\":\"failover\",\"n\":$n,\"ms\":$(( (after - before) / 1000000 ))}" >> "$RESULTS"
  wait "${LOCKD_PID[$L]}" 2>/dev/null || true
  start_lockd "$L"
  leader >/dev/null
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = lambda us: f"{us / 1000:.1f}"
print("Open loop (per operation: rate, p50 / p99 ms, failed):\n")
print("| system | rate/s each | held | acquire p50 | acquire p99 | renew p99 | release p99 | failed acquire / renew / release |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["mode"] != "open":
        continue
    name = "lockd over etcd (2 instances)" if r["system"] == "lockd" else "etcd recipe"
    print(f"| {name} | {r['acquire']['rate_per_s']} | {r['held_before']} | {ms(r['acquire']['p50_us'])} | {ms(r['acquire']['p99_us'])} | "
          f"{ms(r['renew']['p99_us'])} | {ms(r['release']['p99_us'])} | {r['acquire']['errors']} / {r['renew']['errors']} / {r['release']['errors']} |")
closed = {(r["system"], r["via"], r["clients"]): r for r in rows if r["mode"] == "closed"}
print("\nClosed loop:\n")
print("| clients | system | pairs/s | vs etcd recipe | acquire p50 ms | pair p50 ms | pair p50 vs etcd | pair p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for clients in (64, 1):
    e = closed[("etcd", "recipe", clients)]
    for key, name in ((("lockd", "leader"), "lockd over etcd, via the leader"), (("lockd", "follower"), "lockd over etcd, via the follower"), (("etcd", "recipe"), "etcd recipe")):
        r = closed[key + (clients,)]
        print(f"| {clients} | {name} | {r['pairs_per_s']:.0f} | {r['pairs_per_s'] / e['pairs_per_s']:.2f}x | {ms(r['acquire']['p50_us'])} | "
              f"{ms(r['pair']['p50_us'])} | {r['pair']['p50_us'] / e['pair']['p50_us']:.2f}x | {ms(r['pair']['p99_us'])} | {r['errors']} |")
f = [r["ms"] for r in rows if r["mode"] == "failover"]
print(f"\nFailover (kill -9 of the leader → grant through the other instance), ms: {', '.join(map(str, f))}")
PY
grep -h '"leading' "$OUT"/lockd-*.log | python3 -c '
import json, sys
for l in sys.stdin:
    e = json.loads(l)
    print("  took over: leases %s, without a leader for %s ms, load %s ms" % (e.get("leases"), e.get("without_leader_ms"), e.get("load_ms")))' >&2
echo "raw results: $RESULTS" >&2
