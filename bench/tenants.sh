#!/usr/bin/env bash
# The cost of a policy in lockd: the same closed loop (acquire and release, 64 clients, 4
# connections) against lockd without a policy and with one, in alternating rounds on lockd
# processes of one build. Two pairs: plaintext without a policy against a bearer token (one
# SHA-256 a call), and mutual TLS without a policy against the same with identities known by
# their certificates (the client certificate's names read on every call). Needs openssl.
# Prints a Markdown table; raw JSON in $OUT.
#
#   bench/tenants.sh                 # 3 rounds of 10 s each per pair (about 2.5 minutes)
#   ROUNDS=5 SECONDS_PER_RUN=5 bench/tenants.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$(mktemp -d /tmp/lockbench-tenants.XXXXXX)}
mkdir -p "$OUT"
command -v openssl >/dev/null || { echo "bench/tenants.sh: openssl is missing (apt-get install openssl)" >&2; exit 1; }

cargo build --release -q -p lockd-server -p lockbench
LB=target/release/lockbench
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
. bench/common.sh

# A CA, lockd's certificate (for 127.0.0.1) and lockbench's (DNS:bench.internal).
make_ca
issue_cert lockd IP:127.0.0.1
issue_cert bench DNS:bench.internal
openssl rand -hex 32 > "$OUT/token"
chmod 600 "$OUT/token"
HASH=$(target/release/lockd --hash-token < "$OUT/token")
# Plaintext lockd takes no certificate identities: the token alone there, both over TLS.
cat > "$OUT/policy-token.toml" <<TOML
[[tenant]]
name = "bench"
prefixes = ["bench-", "open-", "fill-"]
[[identity]]
name = "by-token"
tenant = "bench"
$HASH
TOML
{ cat "$OUT/policy-token.toml"; printf '[[identity]]\nname = "by-cert"\ntenant = "bench"\ncert = "DNS:bench.internal"\n'; } > "$OUT/policy.toml"

TLS=(--tls-cert "$OUT/lockd.pem" --tls-key "$OUT/lockd-key.pem" --tls-client-ca "$OUT/ca.pem")
start() { # NAME PORT ARGS...
  local name=$1 port=$2; shift 2
  target/release/lockd --data-dir "$OUT/data-$name" --listen "127.0.0.1:$port" --log warn "$@" 2>"$OUT/$name.log" &
  pids+=("$!")
  wait_port "$port"
}
start plain 17440
start token 17441 --policy "$OUT/policy-token.toml"
start mtls 17442 "${TLS[@]}"
start cert 17443 "${TLS[@]}" --policy "$OUT/policy.toml"

CLIENT=(--ca "$OUT/ca.pem" --cert "$OUT/bench.pem" --key "$OUT/bench-key.pem")
run() { sync; "$LB" --json closed --target lockd "$@" --clients 64 --duration "${RUN}s" | tee -a "$RESULTS" >/dev/null; }
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round" >&2
  if (( round % 2 )); then
    run --endpoint http://127.0.0.1:17440
    run --endpoint http://127.0.0.1:17441 --token-file "$OUT/token"
    run --endpoint https://127.0.0.1:17442 "${CLIENT[@]}"
    run --endpoint https://127.0.0.1:17443 "${CLIENT[@]}"
  else
    run --endpoint http://127.0.0.1:17441 --token-file "$OUT/token"
    run --endpoint http://127.0.0.1:17440
    run --endpoint https://127.0.0.1:17443 "${CLIENT[@]}"
    run --endpoint https://127.0.0.1:17442 "${CLIENT[@]}"
  fi
done

python3 - "$RESULTS" "$ROUNDS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds = int(sys.argv[2])
names = ["plaintext, no policy", "plaintext, bearer token", "mutual TLS, no policy", "mutual TLS, certificate identity"]
by = {n: [] for n in names}
for r in range(rounds):
    four = rows[4 * r: 4 * r + 4]
    order = [0, 1, 2, 3] if r % 2 == 0 else [1, 0, 3, 2]
    for i, o in enumerate(order):
        by[names[o]].append(four[i])
def med(rs, f): return statistics.median(f(x) for x in rs)
print("| lockd, 64 clients | pairs/s (median of rounds) | each round | acquire p50 ms | acquire p99 ms | errors |")
print("|---|---|---|---|---|---|")
for n in names:
    rs = by[n]
    v = med(rs, lambda x: x["pairs_per_s"])
    each = ", ".join(f"{x['pairs_per_s']:.0f}" for x in rs)
    print(f"| {n} | {v:.0f} | {each} | {med(rs, lambda x: x['acquire']['p50_us'])/1000:.2f} | {med(rs, lambda x: x['acquire']['p99_us'])/1000:.2f} | {sum(x['errors'] for x in rs)} |")
def ratio(a, b):
    return statistics.median(x["pairs_per_s"] / y["pairs_per_s"] for x, y in zip(by[a], by[b]))
print(f"\nbearer token / no policy: **{ratio(names[1], names[0]):.2f}x**; certificate identity / no policy (mutual TLS): **{ratio(names[3], names[2]):.2f}x** (per-round ratios, median)")
PY
