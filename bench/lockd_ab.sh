#!/usr/bin/env bash
# lockd against an earlier build of itself: lockbench's closed loop at 64 and 1 clients, the
# two binaries in alternating rounds (the order swapped every other round), each on a fresh
# data directory, with lockd's CPU time per acquire+release pair read from /proc. Prints one
# Markdown row per run. One run, one machine; about a minute per round.
#
#   BASE_LOCKD=/path/to/old/lockd bench/lockd_ab.sh
#   BASE_LOCKD=... ROUNDS=3 SECONDS_PER_RUN=4 bench/lockd_ab.sh
#
# The base binary: `git worktree add /tmp/base REV && (cd /tmp/base && cargo build --release
# -p lockd-server)`, then BASE_LOCKD=/tmp/base/target/release/lockd.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-4}
ROUNDS=${ROUNDS:-2}
BASE=${BASE_LOCKD:?set BASE_LOCKD to the lockd binary to compare with}
[ -x "$BASE" ] || { echo "bench/lockd_ab.sh: $BASE is not an executable" >&2; exit 1; }
OUT=${OUT:-$(mktemp -d /tmp/lockdab.XXXXXX)}
PORT=17421
cargo build --release -q -p lockd-server -p lockbench
. bench/common.sh
free_ports bench/lockd_ab.sh "$PORT"

one() { # NAME BINARY CLIENTS: prints a table row
  local name=$1 bin=$2 clients=$3
  rm -rf "$OUT/data"
  "$bin" --data-dir "$OUT/data" --listen "127.0.0.1:$PORT" --log warn </dev/null >/dev/null 2>"$OUT/lockd.log" &
  local pid=$!
  pids+=("$pid")
  wait_port "$PORT"
  sync
  local before after
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  target/release/lockbench --json closed --target lockd --endpoint "http://127.0.0.1:$PORT" \
    --clients "$clients" --duration "${RUN}s" 2>/dev/null >"$OUT/run.json"
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  # Reaped, so its port is closed for the next run.
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$OUT/run.json" "$((after - before))" "$name" "$clients" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ticks, name, clients = int(sys.argv[2]), sys.argv[3], sys.argv[4]
n = d["acquire"]["count"]
hz = 100
print(f"| {name} | {clients} | {n / d['duration_s']:.0f} | {ticks * 1e6 / hz / n:.0f} | "
      f"{d['acquire']['p50_us']} | {d['acquire']['p99_us']} | {d['release']['p50_us']} | {d['errors']} |")
PY
}

echo "| lockd | clients | pairs/s | lockd CPU us per pair | acquire p50 us | acquire p99 us | release p50 us | errors |"
echo "|---|---|---|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
  for clients in 64 1; do
    if [ $((round % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
    for side in $order; do
      case $side in
        base) one base "$BASE" "$clients" ;;
        new) one new target/release/lockd "$clients" ;;
      esac
    done
  done
done
