#!/usr/bin/env bash
# What lockd's metrics cost: the closed loop (durable acquire and release, 64 clients, 4
# connections) against lockd without an admin listener (nothing recorded) and with one that is
# scraped every second, as Prometheus would, in alternating rounds on two lockd processes of one
# build. Prints a Markdown table; raw JSON in $OUT.
#
#   bench/metrics.sh                 # 3 rounds of 10 s each (about 1.5 minutes)
#   ROUNDS=5 SECONDS_PER_RUN=5 bench/metrics.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-metrics.XXXXXX)}
mkdir -p "$OUT"

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

target/release/lockd --data-dir "$OUT/off" --listen 127.0.0.1:17470 --log warn 2>"$OUT/off.log" &
pids+=("$!")
target/release/lockd --data-dir "$OUT/on" --listen 127.0.0.1:17471 --log warn \
  --admin-listen 127.0.0.1:17472 2>"$OUT/on.log" &
pids+=("$!")
wait_port 17470; wait_port 17471; wait_port 17472
# The scraper: one /metrics a second, for the whole run.
( while true; do curl -s -o /dev/null http://127.0.0.1:17472/metrics || true; sleep 1; done ) &
pids+=("$!")

run() { sync; "$LB" --json closed --target lockd "$@" --clients 64 --duration "${RUN}s" | tee -a "$RESULTS" >/dev/null; }
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round" >&2
  if (( round % 2 )); then
    run --endpoint http://127.0.0.1:17470; run --endpoint http://127.0.0.1:17471
  else
    run --endpoint http://127.0.0.1:17471; run --endpoint http://127.0.0.1:17470
  fi
done
curl -s http://127.0.0.1:17472/metrics > "$OUT/metrics.txt"

python3 - "$RESULTS" "$ROUNDS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
off, on = [], []
for r in range(int(sys.argv[2])):
    a, b = rows[2 * r], rows[2 * r + 1]
    (off if r % 2 == 0 else on).append(a)
    (on if r % 2 == 0 else off).append(b)
def med(rs, f): return statistics.median(f(x) for x in rs)
print("| lockd, 64 clients | pairs/s (median of rounds) | each round | acquire p50 ms | acquire p99 ms | errors |")
print("|---|---|---|---|---|---|")
for name, rs in (("metrics off (no admin listener)", off), ("metrics on, scraped every second", on)):
    print(f"| {name} | {med(rs, lambda x: x['pairs_per_s']):.0f} | {', '.join(str(round(x['pairs_per_s'])) for x in rs)} | {med(rs, lambda x: x['acquire']['p50_us'])/1000:.2f} | {med(rs, lambda x: x['acquire']['p99_us'])/1000:.2f} | {sum(x['errors'] for x in rs)} |")
ratio = statistics.median(b["pairs_per_s"] / a["pairs_per_s"] for a, b in zip(off, on))
print(f"\non / off: **{ratio:.2f}x** (median of the per-round ratios)")
PY
