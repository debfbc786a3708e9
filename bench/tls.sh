#!/usr/bin/env bash
# lockd over TLS against lockd in plaintext: the same closed loop (acquire and release, 64
# clients, 4 connections), in alternating rounds on two lockd processes of one build. Needs
# openssl (certificates made for the run). Prints a Markdown table; raw JSON in $OUT.
#
#   bench/tls.sh                     # 3 rounds of 10 s each (about 1.5 minutes)
#   ROUNDS=5 SECONDS_PER_RUN=5 bench/tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-tls.XXXXXX)}
mkdir -p "$OUT"
command -v openssl >/dev/null || { echo "bench/tls.sh: openssl is missing (apt-get install openssl)" >&2; exit 1; }

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

# A CA and lockd's certificate (for 127.0.0.1), made for this run.
make_ca
issue_cert lockd IP:127.0.0.1

target/release/lockd --data-dir "$OUT/plain" --listen 127.0.0.1:17430 --log warn 2>"$OUT/plain.log" &
pids+=("$!")
target/release/lockd --data-dir "$OUT/tls" --listen 127.0.0.1:17431 --log warn \
  --tls-cert "$OUT/lockd.pem" --tls-key "$OUT/lockd-key.pem" 2>"$OUT/tls.log" &
pids+=("$!")
wait_port 17430; wait_port 17431

run() { sync; "$LB" --json closed --target lockd "$@" --clients 64 --duration "${RUN}s" | tee -a "$RESULTS" >/dev/null; }
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round: plaintext" >&2
  run --endpoint http://127.0.0.1:17430
  echo "== round $round: TLS" >&2
  run --endpoint https://127.0.0.1:17431 --ca "$OUT/ca.pem"
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
plain, tls = rows[0::2], rows[1::2]
def med(rs, f): return statistics.median(f(r) for r in rs)
p, t = med(plain, lambda r: r["pairs_per_s"]), med(tls, lambda r: r["pairs_per_s"])
print("| lockd, 64 clients | pairs/s (median of rounds) | each round | acquire p50 ms | acquire p99 ms | errors |")
print("|---|---|---|---|---|---|")
for name, rs, v in (("plaintext", plain, p), ("TLS", tls, t)):
    rounds = ", ".join(f"{r['pairs_per_s']:.0f}" for r in rs)
    a50 = med(rs, lambda r: r["acquire"]["p50_us"]) / 1000
    a99 = med(rs, lambda r: r["acquire"]["p99_us"]) / 1000
    errs = sum(r["errors"] for r in rs)
    print(f"| {name} | {v:.0f} | {rounds} | {a50:.2f} | {a99:.2f} | {errs} |")
print(f"\nTLS / plaintext: **{t / p:.2f}x**")
PY
echo "raw results: $RESULTS" >&2
