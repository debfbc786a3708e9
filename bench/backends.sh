#!/usr/bin/env bash
# lockd over its high-availability backends, and each backend's own lock recipe, in one run
# (issue 42): lockd over ZooKeeper, over Redis with Sentinel and over etcd; Curator's lock
# recipe straight on ZooKeeper (lockbench --target zookeeper), and SET NX PX with a token
# counter in one script straight on the Redis master (lockbench --target redis-fenced); closed
# loop at 64 and 1 clients; then the open loop at the specification's load (2,000 acquires,
# renewals and releases per second over 20,000 held locks) on lockd over each backend. One
# ZooKeeper server (Debian's zookeeper, its defaults: tickTime 2000, every transaction
# fsynced), one etcd member, and a Redis master with one replica (both appendonly yes,
# appendfsync always) and one Sentinel; one lockd over each (over Redis: every batch waits for
# the replica, redis_wait_replicas = 1). Prints a Markdown table; the raw JSON stays in $OUT.
#
#   bench/backends.sh                     # about 6 minutes
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
for b in redis-server redis-sentinel; do
  command -v $b >/dev/null || { echo "bench/backends.sh: $b is missing (apt-get install redis-server redis-sentinel)" >&2; exit 1; }
done

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh
free_ports bench/backends.sh 12181 12379 12380 16390 16391 26390 17421 17422 17423

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
for r in m r; do
  mkdir -p "$OUT/redis-$r"
  port=$([ $r = m ] && echo 16390 || echo 16391)
  replica=$([ $r = r ] && echo "--replicaof 127.0.0.1 16390" || true)
  # shellcheck disable=SC2086
  redis-server --port $port --bind 127.0.0.1 --dir "$OUT/redis-$r" --appendonly yes --appendfsync always \
    --save '' --repl-diskless-sync-delay 0 $replica --daemonize no >"$OUT/redis-$r.log" 2>&1 &
  pids+=("$!")
done
mkdir -p "$OUT/sentinel"
printf 'port 26390\nbind 127.0.0.1\ndir %s\nsentinel monitor lockd 127.0.0.1 16390 1\n' "$OUT/sentinel" >"$OUT/sentinel/sentinel.conf"
wait_port 16390; wait_port 16391
redis-sentinel "$OUT/sentinel/sentinel.conf" >"$OUT/sentinel.log" 2>&1 &
pids+=("$!")
wait_port 12181; wait_port 12379; wait_port 26390
target/release/lockd --data-dir "$OUT/lockd-zk" --listen 127.0.0.1:17421 --log warn,lockd_server::ha=info \
  --backend zookeeper --zk-endpoints 127.0.0.1:12181 </dev/null >/dev/null 2>"$OUT/lockd-zk.log" &
pids+=("$!")
target/release/lockd --data-dir "$OUT/lockd-etcd" --listen 127.0.0.1:17422 --log warn,lockd_server::ha=info \
  --backend etcd --etcd-endpoints http://127.0.0.1:12379 </dev/null >/dev/null 2>"$OUT/lockd-etcd.log" &
pids+=("$!")
target/release/lockd --data-dir "$OUT/lockd-redis" --listen 127.0.0.1:17423 --log warn,lockd_server::ha=info \
  --backend redis --redis-endpoints 127.0.0.1:26390 </dev/null >/dev/null 2>"$OUT/lockd-redis.log" &
pids+=("$!")
wait_port 17421; wait_port 17422; wait_port 17423

LOCKD_ZK=(--target lockd --endpoint http://127.0.0.1:17421)
LOCKD_ETCD=(--target lockd --endpoint http://127.0.0.1:17422)
LOCKD_REDIS=(--target lockd --endpoint http://127.0.0.1:17423)
ZK_RECIPE=(--target zookeeper --endpoint 127.0.0.1:12181)
REDIS_RECIPE=(--target redis-fenced --endpoint redis://127.0.0.1:16390)
# One JSON line per run, with the label of what ran.
run() { local label=$1; shift; sync; "$LB" --json "$@" | sed "s/^{/{\"label\":\"$label\",/" | tee -a "$RESULTS" >/dev/null; }

# Returns once the lockd that logs to LOG leads (each is the only instance over its backend):
# its log line, read as it is written.
wait_leading() { # LOG
  local follow found=1
  exec 4< <(exec tail -n +1 -F "$1" 2>/dev/null)
  follow=$!
  timeout 60 grep -q -m1 "leading: " <&4 && found=0
  exec 4<&-
  kill "$follow" 2>/dev/null || true
  [ "$found" = 0 ] || { echo "bench/backends.sh: the lockd logging to $1 did not lead within 60 s" >&2; exit 1; }
}
for l in zk etcd redis; do wait_leading "$OUT/lockd-$l.log"; done

for clients in 64 1; do
  for t in LOCKD_ZK ZK_RECIPE LOCKD_REDIS REDIS_RECIPE LOCKD_ETCD; do
    declare -n args=$t
    echo "== closed loop, $clients clients, $t" >&2
    run "$t" closed "${args[@]}" --clients "$clients" --duration "${RUN}s"
  done
done
for t in LOCKD_ZK LOCKD_REDIS LOCKD_ETCD; do
  declare -n args=$t
  echo "== open loop at the specification's load, $t" >&2
  run "$t" open "${args[@]}" --duration "$((RUN * 2))s"
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = {"LOCKD_ZK": "lockd over ZooKeeper", "LOCKD_ETCD": "lockd over etcd", "ZK_RECIPE": "Curator's recipe on ZooKeeper",
         "LOCKD_REDIS": "lockd over Redis (Sentinel, WAIT 1)", "REDIS_RECIPE": "SET NX PX + INCR token on Redis"}
recipe_of = {"LOCKD_ZK": "ZK_RECIPE", "ZK_RECIPE": "ZK_RECIPE", "LOCKD_REDIS": "REDIS_RECIPE", "REDIS_RECIPE": "REDIS_RECIPE"}
ms = lambda us: f"{us / 1000:.2f}"
print("| system | clients | pairs/s | vs its backend's recipe | acquire p50 ms | acquire p99 ms | release p50 ms | errors |")
print("|---|---|---|---|---|---|---|---|")
closed = {(r["label"], r["clients"]): r for r in rows if r["mode"] == "closed"}
for clients in (64, 1):
    for label in ("LOCKD_ZK", "ZK_RECIPE", "LOCKD_REDIS", "REDIS_RECIPE", "LOCKD_ETCD"):
        r = closed.get((label, clients))
        if not r:
            continue
        recipe = closed.get((recipe_of.get(label), clients))
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
