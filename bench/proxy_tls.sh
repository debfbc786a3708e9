#!/usr/bin/env bash
# TLS towards clients in both fence-proxy modes, side by side with what a user would pick
# instead, in alternating rounds on one machine:
# - PostgreSQL: pgbench through PgBouncer (session mode, client_tls_sslmode = allow) and
#   through fence-proxy (tls_cert, tls_required = false), both in front of one throwaway
#   PostgreSQL 15 over plaintext loopback that loads fence_hook (proxy/pg-hook, built here:
#   needs postgresql-server-dev-15), so that the proxy leaves commit points to PostgreSQL;
#   and, for reference, a second fence-proxy listener with trust_commit_hook = false, which
#   checks every commit point itself (select-only and simple-update, sslmode=require). With
#   sslmode=require and, for reference, with
#   sslmode=disable; select-only and simple-update (-N), 16 clients; and with a new
#   connection per transaction (-C), where the handshake and the connection to PostgreSQL
#   (which PgBouncer's pool keeps and fence-proxy opens per session) dominate.
# - HTTP: wrk over HTTPS through nginx terminating TLS (proxy_pass with upstream keep-alive)
#   and through fence-proxy (tls_cert), to an nginx upstream answering 200; GET unfenced, and
#   a fenced POST with a steady token; 64 connections.
# Needs pgbouncer, nginx, wrk, openssl and PostgreSQL 15 with its server headers (apt-get
# install pgbouncer nginx wrk openssl postgresql-server-dev-15); about 10 minutes. Run as root. Prints Markdown tables; raw output in $OUT.
#
#   bench/proxy_tls.sh
#   ROUNDS=1 SECONDS_PER_RUN=5 bench/proxy_tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-3}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/proxy-tls.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
for b in pgbouncer nginx wrk openssl pg_config; do
  command -v "$b" >/dev/null || { echo "bench/proxy_tls.sh: $b is missing (apt-get install pgbouncer nginx wrk openssl postgresql-server-dev-15)" >&2; exit 1; }
done
[ -f "$(pg_config --pgxs)" ] || { echo "bench/proxy_tls.sh: no PGXS (apt-get install postgresql-server-dev-15)" >&2; exit 1; }
[ -x "$PGBIN/postgres" ] || { echo "bench/proxy_tls.sh: no PostgreSQL in $PGBIN (apt-get install postgresql-15)" >&2; exit 1; }
cargo build --release -q -p fence-proxy
. bench/common.sh

PG=16432; BOUNCER=16433; PROXY=16434; PROXY2=16435; UP=16080; NGINX=16443; FPH=16444
free_ports bench/proxy_tls.sh $PG $BOUNCER $PROXY $PROXY2 $UP $NGINX $FPH

# One certificate (for 127.0.0.1) for every TLS listener, made for this run: P-256, as a
# deployment would pick.
loopback_cert

# --- PostgreSQL -----------------------------------------------------------------------------
# fence_hook in PostgreSQL, for both sides: the proxy then leaves commit points to it.
start_postgres_with_hook_and_pgbouncer_tls
cat >"$OUT/proxy.toml" <<TOML
log = "warn"
[[pg]]
listen = "127.0.0.1:$PROXY"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
tls_cert = "$OUT/cert.pem"
tls_key = "$OUT/key.pem"
tls_required = false
[[pg]]
listen = "127.0.0.1:$PROXY2"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
tls_cert = "$OUT/cert.pem"
tls_key = "$OUT/key.pem"
tls_required = false
trust_commit_hook = false
TOML
target/release/fence-proxy --config "$OUT/proxy.toml" 2>"$OUT/fence-proxy-pg.log" & pids+=("$!")
wait_port $BOUNCER; wait_port $PROXY; wait_port $PROXY2

pgb() { PGSSLMODE=$SSLMODE "$PGBIN/pgbench" -h 127.0.0.1 -U postgres "$@" postgres; }
PGSSLMODE=disable "$PGBIN/pgbench" -h 127.0.0.1 -U postgres -p $PG -i -s 10 -q postgres >/dev/null 2>&1
RESULTS="$OUT/pg.txt"; : >"$RESULTS"
run_pg() { # name port args...
  local name=$1 port=$2; shift 2
  local out tps
  out=$(pgb -p "$port" -T "$RUN" "$@" 2>&1) || { echo "bench/proxy_tls.sh: $name failed: $(tail -2 <<<"$out")" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
  printf '%s\t%s\n' "$name" "$tps" | tee -a "$RESULTS" >&2
}
for r in $(seq "$ROUNDS"); do
  for w in "select-only:-S -c 16 -j 2" "simple-update:-N -c 16 -j 2" "connect per transaction:-S -C -c 16 -j 2"; do
   for SSLMODE in require disable; do
    name="${w%%:*}, sslmode=$SSLMODE"; args=${w#*:}
    # The order swaps every other round, so that drift falls on both sides.
    if (( r % 2 )); then
      run_pg "$name|pgbouncer" $BOUNCER $args; run_pg "$name|fence-proxy" $PROXY $args
    else
      run_pg "$name|fence-proxy" $PROXY $args; run_pg "$name|pgbouncer" $BOUNCER $args
    fi
   done
  done
  # For reference: the proxy checking every commit point itself (trust_commit_hook = false).
  for w in "select-only:-S -c 16 -j 2" "simple-update:-N -c 16 -j 2"; do
    SSLMODE=require; name="${w%%:*}, sslmode=require, trust_commit_hook = false"; args=${w#*:}
    if (( r % 2 )); then
      run_pg "$name|pgbouncer" $BOUNCER $args; run_pg "$name|fence-proxy" $PROXY2 $args
    else
      run_pg "$name|fence-proxy" $PROXY2 $args; run_pg "$name|pgbouncer" $BOUNCER $args
    fi
  done
done

# --- HTTP -----------------------------------------------------------------------------------
cat >"$OUT/upstream.conf" <<CONF
worker_processes auto; daemon off; pid $OUT/upstream.pid; error_log $OUT/upstream.err warn;
events { worker_connections 8192; }
http { access_log off;
  server { listen 127.0.0.1:$UP; keepalive_requests 10000000; location / { return 200 "ok\n"; } } }
CONF
cat >"$OUT/nginx.conf" <<CONF
worker_processes auto; daemon off; pid $OUT/nginx.pid; error_log $OUT/nginx.err warn;
events { worker_connections 8192; }
http { access_log off;
  upstream app { server 127.0.0.1:$UP; keepalive 256; }
  server { listen 127.0.0.1:$NGINX ssl; keepalive_requests 10000000;
    ssl_certificate $OUT/cert.pem; ssl_certificate_key $OUT/key.pem;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; } } }
CONF
nginx -c "$OUT/upstream.conf" -p "$OUT" & pids+=("$!")
nginx -c "$OUT/nginx.conf" -p "$OUT" & pids+=("$!")
target/release/fence-proxy http --listen 127.0.0.1:$FPH --upstream http://127.0.0.1:$UP \
  --data-dir "$OUT/marks" --tls-cert "$OUT/cert.pem" --tls-key "$OUT/key.pem" --log warn \
  2>"$OUT/fence-proxy-http.log" & pids+=("$!")
wait_port $UP; wait_port $NGINX; wait_port $FPH
cat >"$OUT/fenced.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "count=7"
wrk.headers["Fencing-Resource"] = "inventory:sku-1"
wrk.headers["Fencing-Token"] = "42"
LUA
HRESULTS="$OUT/http.txt"; : >"$HRESULTS"
run_http() { # name url [script]
  local name=$1 url=$2 script=${3:-} out rps
  out=$(wrk -t2 -c64 -d"${RUN}s" ${script:+-s "$script"} "$url")
  rps=$(sed -n 's/^Requests\/sec: *\([0-9.]*\)/\1/p' <<<"$out")
  grep -q "Non-2xx" <<<"$out" && { echo "bench/proxy_tls.sh: $name got errors: $out" >&2; exit 1; }
  printf '%s\t%s\n' "$name" "$rps" | tee -a "$HRESULTS" >&2
}
for r in $(seq "$ROUNDS"); do
  for w in "GET:" "POST (fenced, steady token):$OUT/fenced.lua"; do
    name=${w%%:*}; script=${w#*:}
    if (( r % 2 )); then
      run_http "$name|nginx" "https://127.0.0.1:$NGINX/inventory/sku-1" "$script"
      run_http "$name|fence-proxy" "https://127.0.0.1:$FPH/inventory/sku-1" "$script"
    else
      run_http "$name|fence-proxy" "https://127.0.0.1:$FPH/inventory/sku-1" "$script"
      run_http "$name|nginx" "https://127.0.0.1:$NGINX/inventory/sku-1" "$script"
    fi
  done
done

python3 - "$RESULTS" "$HRESULTS" <<'PY'
import statistics, sys
def table(path, other, unit, title):
    runs = {}
    for line in open(path):
        key, v = line.rstrip("\n").split("\t")
        w, who = key.split("|")
        runs.setdefault(w, {}).setdefault(who, []).append(float(v))
    print(f"\n| {title} | {other} {unit} | fence-proxy {unit} | fence-proxy / {other} (median of rounds) |")
    print("|---|---|---|---|")
    for w, r in runs.items():
        ratios = [f / o for f, o in zip(r["fence-proxy"], r[other])]
        print(f"| {w} | {statistics.median(r[other]):.0f} | {statistics.median(r['fence-proxy']):.0f} | **{statistics.median(ratios):.2f}x** |")
table(sys.argv[1], "pgbouncer", "tps", "PostgreSQL, 16 clients")
table(sys.argv[2], "nginx", "req/s", "HTTPS, 64 connections")
PY
