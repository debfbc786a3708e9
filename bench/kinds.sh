#!/usr/bin/env bash
# Issue 19: exclusive locks keep their figures. bench/run.sh's lockd rows (durable acquire and
# release in a closed loop at 64 and 1 clients; the memory of held leases) for lockd as it was
# before the issue ($BASE, built in a worktree) and as it is now, in alternating rounds, the
# order swapped every other round. Prints a Markdown table and the per-round ratios; raw JSON
# in $OUT.
#
#   bench/kinds.sh                          # 5 rounds of 10 s (about 12 minutes with the builds)
#   BASE=6ed3f09 ROUNDS=3 SECONDS_PER_RUN=5 bench/kinds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-5}
BASE=${BASE:-6ed3f09}
FILL=${FILL_LEASES:-200000}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-kinds.XXXXXX)}
mkdir -p "$OUT"

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
git worktree add -q --detach "$OUT/base-src" "$BASE"
trap 'git worktree remove --force "$OUT/base-src"' EXIT
CARGO_TARGET_DIR="$OUT/base-target" cargo build --release -q -p lockd-server \
  --manifest-path "$OUT/base-src/Cargo.toml"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh
trap 'cleanup; git worktree remove --force "$OUT/base-src"' EXIT

"$OUT/base-target/release/lockd" --data-dir "$OUT/before" --listen 127.0.0.1:17480 --log warn \
  2>"$OUT/before.log" &
BEFORE_PID=$!; pids+=("$BEFORE_PID")
target/release/lockd --data-dir "$OUT/now" --listen 127.0.0.1:17481 --log warn 2>"$OUT/now.log" &
NOW_PID=$!; pids+=("$NOW_PID")
wait_port 17480; wait_port 17481

run() { # NAME CLIENTS PORT
  sync
  "$LB" --json closed --target lockd --endpoint "http://127.0.0.1:$3" --clients "$2" \
    --duration "${RUN}s" | python3 -c "import json,sys; r=json.load(sys.stdin); r['side']='$1'; print(json.dumps(r))" \
    >>"$RESULTS"
}
for round in $(seq 1 "$ROUNDS"); do
  for clients in 64 1; do
    echo "== round $round, $clients clients" >&2
    if (( round % 2 )); then
      run before "$clients" 17480; run now "$clients" 17481
    else
      run now "$clients" 17481; run before "$clients" 17480
    fi
  done
done
for side in before now; do
  if [ "$side" = before ]; then port=17480 pid=$BEFORE_PID; else port=17481 pid=$NOW_PID; fi
  echo "== $FILL held leases, $side" >&2
  "$LB" --json fill --target lockd --endpoint "http://127.0.0.1:$port" --count "$FILL" --ttl 1h \
    --pid "$pid" | python3 -c "import json,sys; r=json.load(sys.stdin); r['side']='$side'; print(json.dumps(r))" \
    >>"$RESULTS"
done

python3 - "$RESULTS" "$BASE" "$(git rev-parse --short HEAD)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base, head = sys.argv[2], sys.argv[3]
print(f"| lockd, closed loop | clients | before ({base}) pairs/s | now ({head}) pairs/s | each round, before / now | now / before (median of per-round ratios) | acquire p99 ms, before / now |")
print("|---|---|---|---|---|---|---|")
for clients in (64, 1):
    b = [r for r in rows if r["mode"] == "closed" and r["clients"] == clients and r["side"] == "before"]
    n = [r for r in rows if r["mode"] == "closed" and r["clients"] == clients and r["side"] == "now"]
    med = lambda rs, f: statistics.median(f(x) for x in rs)
    ratio = statistics.median(y["pairs_per_s"] / x["pairs_per_s"] for x, y in zip(b, n))
    rounds = ", ".join(f"{x['pairs_per_s']:.0f} / {y['pairs_per_s']:.0f}" for x, y in zip(b, n))
    p99 = f"{med(b, lambda x: x['acquire']['p99_us'])/1000:.2f} / {med(n, lambda x: x['acquire']['p99_us'])/1000:.2f}"
    print(f"| durable acquire + release | {clients} | {med(b, lambda x: x['pairs_per_s']):.0f} | {med(n, lambda x: x['pairs_per_s']):.0f} | {rounds} | **{ratio:.2f}x** | {p99} |")
fills = {r["side"]: r for r in rows if r["mode"] == "fill"}
print()
print("| held leases | before: RSS growth | now: RSS growth | now / before |")
print("|---|---|---|---|")
g = {s: fills[s]["rss_after_mib"] - fills[s]["rss_before_mib"] for s in fills}
per = {s: g[s] * 1024 * 1024 / fills[s]["held"] for s in fills}
print(f"| {fills['now']['held']} | {g['before']:.0f} MiB ({per['before']:.0f} B/lease) | {g['now']:.0f} MiB ({per['now']:.0f} B/lease) | {g['now'] / g['before']:.2f}x |")
PY
