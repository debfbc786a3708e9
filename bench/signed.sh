#!/usr/bin/env bash
# What checking a signed token costs: the same fenced writes with a plain token and with a
# signed one, in alternating rounds, through one fence-proxy of each mode whose [signing]
# requires signatures under `signed:` only. HTTP: wrk POSTs (fence-proxy's CPU per request);
# PostgreSQL: pgbench updates with the token set at start-up (transactions per second and
# latency), and the check alone inside PostgreSQL. Needs nginx, wrk and PostgreSQL 15; run as
# root (PostgreSQL runs as postgres). About 4 minutes.
#
#   bench/signed.sh
#   SECONDS_PER_RUN=5 ROUNDS=2 bench/signed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-3}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/signedbench.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
for b in nginx wrk python3; do
  command -v "$b" >/dev/null || { echo "bench/signed.sh: $b is missing (apt-get install nginx wrk python3)" >&2; exit 1; }
done
[ -x "$PGBIN/postgres" ] || { echo "bench/signed.sh: no PostgreSQL in $PGBIN" >&2; exit 1; }
cargo build --release -q -p fence-proxy
. bench/common.sh

SECRET=$(openssl rand -hex 32)
printf '[[keys]]\nid = "bench"\nstate = "active"\nsecret = "%s"\n' "$SECRET" >"$OUT/keys.toml"
chmod 600 "$OUT/keys.toml"
# The signed form of (resource, token), as lockd makes it (docs/security.md).
sign() { python3 -c 'import hmac,hashlib,sys; k=bytes.fromhex(sys.argv[1]); m=("fence-v1\n%s\n%s" % (sys.argv[2], sys.argv[3])).encode(); print("%s.bench.%s" % (sys.argv[3], hmac.new(k, m, hashlib.sha256).hexdigest()))' "$SECRET" "$1" "$2"; }

# --- HTTP ------------------------------------------------------------------------------------
cat >"$OUT/upstream.conf" <<CONF
worker_processes auto; daemon off; pid $OUT/upstream.pid; error_log $OUT/upstream.err warn;
events { worker_connections 8192; }
http { access_log off;
  server { listen 127.0.0.1:19080; keepalive_requests 10000000; location / { return 200 "ok\n"; } } }
CONF
nginx -c "$OUT/upstream.conf" -p "$OUT" & pids+=("$!")
cat >"$OUT/http.toml" <<TOML
data_dir = "$OUT/marks"
log = "warn"
[signing]
keys = "$OUT/keys.toml"
required_prefixes = ["signed:"]
[[http]]
listen = "127.0.0.1:19420"
upstream = "http://127.0.0.1:19080"
TOML
target/release/fence-proxy --config "$OUT/http.toml" 2>"$OUT/http-proxy.log" & HTTP_PID=$!; pids+=("$HTTP_PID")
wait_port 19080; wait_port 19420
lua() { printf 'wrk.method = "POST"\nwrk.body = "n=1"\nwrk.headers["Fencing-Resource"] = "%s"\nwrk.headers["Fencing-Token"] = "%s"\n' "$1" "$2" >"$3"; }
lua plain:sku-1 42 "$OUT/plain.lua"
lua signed:sku-1 "$(sign signed:sku-1 42)" "$OUT/signed.lua"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
RESULTS="$OUT/results.tsv"; : >"$RESULTS"
http_run() { # name script
  local before after out rps reqs
  before=$(ticks $HTTP_PID)
  out=$(wrk -t2 -c64 -d"${RUN}s" --latency -s "$2" http://127.0.0.1:19420/stock)
  after=$(ticks $HTTP_PID)
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  cpu=$(awk -v t=$((after - before)) -v n="$reqs" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t * 1e6 / hz / n }')
  printf 'http\t%s\t%s\t%s\t%s\t%s\n' "$1" "$rps" "$p50" "$cpu" "${non2xx:-0}" | tee -a "$RESULTS" >&2
}
for r in $(seq "$ROUNDS"); do
  http_run plain "$OUT/plain.lua"; http_run signed "$OUT/signed.lua"
done

# --- PostgreSQL ------------------------------------------------------------------------------
PG=19432; PROXY=19434
runuser -u postgres -- "$PGBIN/initdb" -D "$OUT/data" -A trust -U postgres --no-sync >/dev/null
runuser -u postgres -- "$PGBIN/postgres" -D "$OUT/data" -p $PG -k "$OUT" \
  -c listen_addresses=127.0.0.1 -c max_connections=100 -c shared_buffers=256MB 2>"$OUT/postgres.log" &
pids+=("$!")
wait_port $PG
cat >"$OUT/pg.toml" <<TOML
log = "warn"
[signing]
keys = "$OUT/keys.toml"
required_prefixes = ["signed:"]
[[pg]]
listen = "127.0.0.1:$PROXY"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
TOML
target/release/fence-proxy --config "$OUT/pg.toml" 2>"$OUT/pg-proxy.log" & pids+=("$!")
wait_port $PROXY
pgb() { "$PGBIN/pgbench" -h 127.0.0.1 -U postgres "$@" postgres; }
pgb -p $PG -i -s 10 -q >/dev/null 2>&1
printf '\\set aid random(1, 100000 * :scale)\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n' >"$OUT/update.sql"
echo 'SELECT * FROM fencing.check(1000);' >"$OUT/check.sql"
PLAIN="-c fencing.resource=plain:accounts -c fencing.token=42"
SIGNED="-c fencing.resource=signed:accounts -c fencing.token=$(sign signed:accounts 42)"
pg_run() { # name port clients opts script
  local out tps lat
  out=$(PGOPTIONS="$4" pgb -p "$2" -c "$3" -j "$(( $3 < 2 ? 1 : 2 ))" -T "$RUN" -f "$5" 2>&1) \
    || { echo "bench/signed.sh: pgbench failed: $(tail -2 <<<"$out")" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
  lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$out")
  printf 'pg\t%s\t%s\t%s\t%s\n' "$1" "$3" "$tps" "$lat" | tee -a "$RESULTS" >&2
}
for c in 1 16; do
  for r in $(seq "$ROUNDS"); do
    pg_run "update plain" $PROXY $c "$PLAIN" "$OUT/update.sql"
    pg_run "update signed" $PROXY $c "$SIGNED" "$OUT/update.sql"
  done
done
for r in $(seq "$ROUNDS"); do
  pg_run "check alone plain" $PG 1 "$PLAIN" "$OUT/check.sql"
  pg_run "check alone signed" $PG 1 "$SIGNED" "$OUT/check.sql"
done

python3 - "$RESULTS" <<'PY'
import collections, statistics, sys
http = collections.defaultdict(list); pg = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "http":
        http[f[1]].append((float(f[2]), f[3], float(f[4]), int(f[5])))
    else:
        pg[(f[1], f[2])].append((float(f[3]), float(f[4])))
med = statistics.median
print("### HTTP mode, wrk POST, 64 connections\n")
print("| token | requests/s (median) | each round | p50 | fence-proxy CPU per request | non-2xx |")
print("|---|---|---|---|---|---|")
for k in ("plain", "signed"):
    rs = http[k]
    print(f"| {k} | {med(r[0] for r in rs):.0f} | {', '.join(f'{r[0]:.0f}' for r in rs)} | {rs[len(rs)//2][1]} | {med(r[2] for r in rs):.2f} us | {sum(r[3] for r in rs)} |")
p, s = med(r[0] for r in http["plain"]), med(r[0] for r in http["signed"])
cp, cs = med(r[2] for r in http["plain"]), med(r[2] for r in http["signed"])
print(f"\nsigned / plain: {s / p:.2f}x; the signature costs {cs - cp:.2f} us of fence-proxy CPU per request\n")
print("### PostgreSQL mode, pgbench update per transaction, token set at start-up\n")
print("| run | clients | tps (median) | each round | latency ms (median) |")
print("|---|---|---|---|---|")
for (name, c), rs in sorted(pg.items(), key=lambda kv: (kv[0][0].split()[0], kv[0][1], kv[0][0])):
    print(f"| {name} | {c} | {med(r[0] for r in rs):.0f} | {', '.join(f'{r[0]:.0f}' for r in rs)} | {med(r[1] for r in rs):.3f} |")
for c in ("1", "16"):
    a, b = pg.get(("update plain", c)), pg.get(("update signed", c))
    if a and b:
        print(f"\n{c} client(s): signed / plain {med(r[0] for r in b) / med(r[0] for r in a):.2f}x, "
              f"{(med(r[1] for r in b) - med(r[1] for r in a)) * 1000:.0f} us more per transaction")
a, b = pg[("check alone plain", "1")], pg[("check alone signed", "1")]
print(f"\nthe check alone inside PostgreSQL: {med(r[1] for r in a) * 1000:.0f} us plain, {med(r[1] for r in b) * 1000:.0f} us signed")
PY
echo "raw results: $RESULTS" >&2
