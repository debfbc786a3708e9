#!/usr/bin/env bash
# The SDKs side by side (BENCHMARKS.md, "SDKs"), in one run on one machine: each SDK's
# acquire+release pairs/s against the same lockd at 1 and 64 concurrent holders (each holder
# its own resource, a try-lock and a release in a loop), next to the Rust SDK and to the lock a
# team in that language would otherwise pick, against one Redis with `appendfsync always`
# (redis-py's Lock, redislock, redlock, Redisson's RFencedLock); then what the one-line fencing
# of the Python SDK costs a transaction through fence-proxy. The rounds alternate the order of
# the systems. Needs redis-server and PostgreSQL 15 (apt-get install redis-server
# postgresql-15), the SDKs' tools (Go, Node.js, Maven, python3 with the SDK's requirements-dev
# and redis==8.1.0), about 10 minutes. Run as root; prints a Markdown table, raw JSON in $OUT.
#
#   bench/sdk.sh
#   SECONDS_PER_RUN=5 ROUNDS=1 bench/sdk.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-2}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/sdkbench.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
command -v redis-server >/dev/null || { echo "bench/sdk.sh: redis-server is missing (apt-get install redis-server)" >&2; exit 1; }
python3 -c 'import redis' 2>/dev/null || { echo "bench/sdk.sh: redis-py is missing (python3 -m pip install redis==8.1.0)" >&2; exit 1; }

cargo build --release -q -p lockd-server -p lockbench -p fence-proxy
npm run build --prefix clients/typescript --silent
(cd clients/typescript/bench && npm ci --no-audit --no-fund --loglevel=error)
(cd clients/go/bench && go build -o "$OUT/gobench" .)
mvn -q -B -ntp -f clients/java/pom.xml install -DskipTests
mvn -q -B -ntp -f clients/java/bench/pom.xml compile
mvn -q -B -ntp -f clients/java/bench/pom.xml dependency:build-classpath -Dmdep.outputFile="$OUT/java.cp"
JAVA_CP="clients/java/bench/target/classes:$(cat "$OUT/java.cp")"
. bench/common.sh

LOCKD=17420; REDIS=16379; PG=15432; PROXY=15434
target/release/lockd --data-dir "$OUT/lockd" --listen 127.0.0.1:$LOCKD --log warn 2>"$OUT/lockd.log" &
pids+=("$!")
start_redis $REDIS
start_postgres
target/release/fence-proxy pg --listen 127.0.0.1:$PROXY --upstream 127.0.0.1:$PG \
  --schema-url "postgres://postgres@127.0.0.1:$PG/postgres" --log warn 2>"$OUT/fence-proxy.log" &
pids+=("$!")
wait_port $LOCKD; wait_port $REDIS; wait_port $PROXY

L=http://127.0.0.1:$LOCKD
RESULTS="$OUT/results.jsonl"; : > "$RESULTS"
# One measurement: the command prints one JSON object (the last line of its output).
measure() { sync; "$@" 2>>"$OUT/stderr.log" | tail -1 >>"$RESULTS"; }
rust_sdk() {
  target/release/lockbench --json closed --target lockd-sdk --endpoint $L --clients "$1" --duration "${RUN}s" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps({"sdk": "rust sdk", "clients": d["clients"], "pairs_per_s": d["pairs_per_s"], "errors": d["errors"]}))'
}
systems=(rust python pyaio redispy go redislock ts redlock java redisson)
one() { # SYSTEM CLIENTS
  case $1 in
    rust) rust_sdk "$2" ;;
    python) python3 clients/python/bench.py lockd --endpoint $L --clients "$2" --seconds "$RUN" ;;
    pyaio) python3 clients/python/bench.py aio --endpoint $L --clients "$2" --seconds "$RUN" ;;
    redispy) python3 clients/python/bench.py redis --endpoint redis://127.0.0.1:$REDIS --clients "$2" --seconds "$RUN" ;;
    go) "$OUT/gobench" -target lockd -endpoint $L -clients "$2" -seconds "$RUN" ;;
    redislock) "$OUT/gobench" -target redislock -endpoint 127.0.0.1:$REDIS -clients "$2" -seconds "$RUN" ;;
    ts) node clients/typescript/bench/bench.js lockd $L "$2" "$RUN" ;;
    redlock) node clients/typescript/bench/bench.js redlock redis://127.0.0.1:$REDIS "$2" "$RUN" ;;
    java) java -cp "$JAVA_CP" dev.lockd.bench.Bench lockd $L "$2" "$RUN" ;;
    redisson) java -cp "$JAVA_CP" dev.lockd.bench.Bench redisson redis://127.0.0.1:$REDIS "$2" "$RUN" ;;
  esac
}
for round in $(seq 1 "$ROUNDS"); do
  order=("${systems[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    mapfile -t order < <(printf '%s\n' "${systems[@]}" | tac)
  fi
  for clients in 1 64; do
    for s in "${order[@]}"; do
      echo "== round $round, $clients holders, $s" >&2
      measure one "$s" "$clients"
    done
  done
done
echo "== what fence.transaction costs a transaction (Python, psycopg 3, through fence-proxy)" >&2
measure python3 clients/python/bench.py fence --endpoint $L --dsn "postgresql://postgres@127.0.0.1:$PROXY/postgres" --seconds "$((RUN * 2))"

python3 - "$RESULTS" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pairs = collections.defaultdict(list)
fence = None
for r in rows:
    if "ratio" in r:
        fence = r
    else:
        pairs[(r["sdk"], r["clients"])].append(r["pairs_per_s"])
mean = {k: sum(v) / len(v) for k, v in pairs.items()}
peers = {"python sdk (threads)": "redis-py Lock", "python sdk (asyncio)": "redis-py Lock",
         "go sdk": "redislock (go-redis)", "typescript sdk": "redlock (ioredis)", "java sdk": "redisson RFencedLock"}
print("| SDK | holders | pairs/s | / Rust SDK | the usual lock (Redis, appendfsync always) | its pairs/s | SDK / it |")
print("|---|---|---|---|---|---|---|")
for clients in (1, 64):
    rust = mean.get(("rust sdk", clients))
    print(f"| Rust | {clients} | {rust:,.0f} | 1.00x | | | |")
    for sdk, peer in peers.items():
        v, p = mean.get((sdk, clients)), mean.get((peer, clients))
        if v is None:
            continue
        print(f"| {sdk} | {clients} | {v:,.0f} | {v / rust:.2f}x | {peer} | {p:,.0f} | {v / p:.2f}x |")
if fence:
    print(f"\nfence.transaction (psycopg 3, one UPDATE per transaction through fence-proxy): "
          f"{fence['fenced_tps']:,.0f} tps fenced, {fence['plain_tps']:,.0f} without a token: {fence['ratio']:.2f}x")
PY
echo "raw results: $RESULTS" >&2
