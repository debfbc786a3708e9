#!/usr/bin/env bash
# lockd over its high-availability backends, and each backend's own lock recipe, in one run
# (issue 42): lockd over ZooKeeper, lockd over etcd, and Curator's lock recipe straight on
# ZooKeeper (lockbench --target zookeeper), closed loop at 64 and 1 clients; then the open
# loop at the specification's load (2,000 acquires, renewals and releases per second over
# 20,000 held locks) on lockd over each backend. One ZooKeeper server (Debian's zookeeper,
# its defaults: tickTime 2000, every transaction fsynced) and one etcd member, one lockd
# over each. Prints a Markdown table; the raw JSON stays in $OUT.
#
#   bench/backends.sh                     # about 4 minutes
#   SECONDS_PER_RUN=5 bench/backends.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-backends.XXXXXX)}
mkdir -p "$OUT"
ZK_JAR=${ZOOKEEPER_JAR:-/usr/share/java/zookeeper.jar}
for f in "$ZK_JAR" /usr/share/java/slf4j-simple.jar; do
  [ -e "$f" ] || { echo "bench/backends.sh: $f is missing (apt-get install zookeeper)" >&2; exit 1; }
done
command -v etcd >/dev/null || { echo "bench/backends.sh: etcd is missing (apt-get install etcd-server)" >&2; exit 1; }

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh
free_ports bench/backends.sh 12181 12379 12380 17421 17422

mkdir -p "$OUT/zk"
cat >"$OUT/zk/zoo.cfg" <<CFG
tickTime=2000
dataDir=$OUT/zk
clientPort=12181
clientPortAddress=127.0.0.1
admin.enableServer=false
maxClientCnxns=0
CFG
java -Xmx1g -cp "$ZK_JAR:/usr/share/java/slf4j-simple.jar" org.apache.zookeeper.server.quorum.QuorumPeerMain \
  "$OUT/zk/zoo.cfg" </dev/null >"$OUT/zk.log" 2>&1 &
pids+=("$!")
start_etcd 12379 12380
wait_port 12181; wait_port 12379
target/release/lockd --data-dir "$OUT/lockd-zk" --listen 127.0.0.1:17421 --log warn \
  --backend zookeeper --zk-endpoints 127.0.0.1:12181 </dev/null >/dev/null 2>"$OUT/lockd-zk.log" &
pids+=("$!")
target/release/lockd --data-dir "$OUT/lockd-etcd" --listen 127.0.0.1:17422 --log warn \
  --backend etcd --etcd-endpoints http://127.0.0.1:12379 </dev/null >/dev/null 2>"$OUT/lockd-etcd.log" &
pids+=("$!")
wait_port 17421; wait_port 17422

LOCKD_ZK=(--target lockd --endpoint http://127.0.0.1:17421)
LOCKD_ETCD=(--target lockd --endpoint http://127.0.0.1:17422)
ZK_RECIPE=(--target zookeeper --endpoint 127.0.0.1:12181)
# One JSON line per run, with the label of what ran.
run() { local label=$1; shift; sync; "$LB" --json "$@" | sed "s/^{/{\"label\":\"$label\",/" | tee -a "$RESULTS" >/dev/null; }

# Each lockd waits for its first leader; a first call that finds none is retried.
for t in LOCKD_ZK LOCKD_ETCD; do
  declare -n args=$t
  for _ in $(seq 1 50); do "$LB" closed "${args[@]}" --clients 1 --duration 1s >/dev/null 2>&1 && break; sleep 0.2; done
done

for clients in 64 1; do
  for t in LOCKD_ZK LOCKD_ETCD ZK_RECIPE; do
    declare -n args=$t
    echo "== closed loop, $clients clients, $t" >&2
    run "$t" closed "${args[@]}" --clients "$clients" --duration "${RUN}s"
  done
done
for t in LOCKD_ZK LOCKD_ETCD; do
  declare -n args=$t
  echo "== open loop at the specification's load, $t" >&2
  run "$t" open "${args[@]}" --duration "$((RUN * 2))s"
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = {"LOCKD_ZK": "lockd over ZooKeeper", "LOCKD_ETCD": "lockd over etcd", "ZK_RECIPE": "Curator's recipe on ZooKeeper"}
ms = lambda us: f"{us / 1000:.2f}"
print("| system | clients | pairs/s | vs the recipe | acquire p50 ms | acquire p99 ms | release p50 ms | errors |")
print("|---|---|---|---|---|---|---|---|")
closed = {(r["label"], r["clients"]): r for r in rows if r["mode"] == "closed"}
for clients in (64, 1):
    recipe = closed.get(("ZK_RECIPE", clients))
    for label in ("LOCKD_ZK", "LOCKD_ETCD", "ZK_RECIPE"):
        r = closed.get((label, clients))
        if not r:
            continue
        ratio = f"{r['pairs_per_s'] / recipe['pairs_per_s']:.2f}x" if recipe else "-"
        print(f"| {names[label]} | {clients} | {r['pairs_per_s']:.0f} | {ratio} | {ms(r['acquire']['p50_us'])} | {ms(r['acquire']['p99_us'])} | {ms(r['release']['p50_us'])} | {r['errors']} |")
print()
print("| system, open loop | operation | rate/s | p50 ms | p99 ms | p99.9 ms | max ms | failed |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["mode"] != "open":
        continue
    for op in ("acquire", "renew", "release"):
        o = r[op]
        print(f"| {names[r['label']]} | {op} | {o['rate_per_s']} | {ms(o['p50_us'])} | {ms(o['p99_us'])} | {ms(o['p999_us'])} | {ms(o['max_us'])} | {o['errors']} |")
PY
echo "raw results: $RESULTS" >&2
