#!/usr/bin/env bash
# What fence-proxy's metrics cost, in both modes: four fence-proxy processes of one build, two
# without an admin listener (nothing recorded: "off", "off2") and two with one, each scraped
# every second as Prometheus would ("on", "on2"), so that a pair of identical processes shows
# the machine's noise on each side; each has a PostgreSQL and an HTTP listener. Rounds rotate
# the order:
# - PostgreSQL: pgbench simple-update (-N), 16 clients, every transaction fenced with a steady
#   token (PGOPTIONS sets fencing.resource and fencing.token), in front of one throwaway
#   PostgreSQL 15;
# - HTTP: wrk, 64 connections, a fenced POST with a steady token, to an nginx upstream.
# Needs nginx, wrk, curl and PostgreSQL 15 (apt-get install nginx wrk curl); run as root.
# About 8 minutes. Prints a Markdown table (throughput, and the proxy's CPU time per write
# from /proc, which the machine's noise moves less); raw output in $OUT.
#
#   bench/proxy_metrics.sh
#   ROUNDS=2 SECONDS_PER_RUN=3 bench/proxy_metrics.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-5}
ROUNDS=${ROUNDS:-10}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/proxy-metrics.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
for b in nginx wrk curl; do
  command -v "$b" >/dev/null || { echo "bench/proxy_metrics.sh: $b is missing (apt-get install nginx wrk curl)" >&2; exit 1; }
done
[ -x "$PGBIN/postgres" ] || { echo "bench/proxy_metrics.sh: no PostgreSQL in $PGBIN (apt-get install postgresql-15)" >&2; exit 1; }
cargo build --release -q -p fence-proxy
. bench/common.sh

PG=16532; UP=16580
declare -A PID
declare -A PGPORT=([off]=16533 [off2]=16534 [on]=16535 [on2]=16536)
declare -A HTTPPORT=([off]=16543 [off2]=16544 [on]=16545 [on2]=16546)
declare -A ADMIN=([on]=16590 [on2]=16591)
for port in $PG $UP "${ADMIN[@]}" "${PGPORT[@]}" "${HTTPPORT[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "bench/proxy_metrics.sh: something already listens on port $port; stop it first" >&2; exit 1
  fi
done

start_postgres
cat >"$OUT/upstream.conf" <<CONF
worker_processes 1; daemon off; pid $OUT/upstream.pid; error_log $OUT/upstream.err warn;
events { worker_connections 8192; }
http { access_log off;
  server { listen 127.0.0.1:$UP; keepalive_requests 10000000; location / { return 200 "ok\n"; } } }
CONF
nginx -c "$OUT/upstream.conf" -p "$OUT" & pids+=("$!")
for who in off off2 on on2; do
  {
    echo 'log = "warn"'
    [ -n "${ADMIN[$who]:-}" ] && echo "admin_listen = \"127.0.0.1:${ADMIN[$who]}\""
    cat <<TOML
data_dir = "$OUT/marks-$who"
[[pg]]
listen = "127.0.0.1:${PGPORT[$who]}"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
[[http]]
listen = "127.0.0.1:${HTTPPORT[$who]}"
upstream = "http://127.0.0.1:$UP"
TOML
  } >"$OUT/$who.toml"
  target/release/fence-proxy --config "$OUT/$who.toml" 2>"$OUT/fence-proxy-$who.log" & pids+=("$!"); PID[$who]=$!
  wait_port "${PGPORT[$who]}"; wait_port "${HTTPPORT[$who]}"
done
wait_port $UP
for who in on on2; do
  wait_port "${ADMIN[$who]}"
  ( while true; do curl -s -o /dev/null "http://127.0.0.1:${ADMIN[$who]}/metrics" || true; sleep 1; done ) &
  pids+=("$!")
done

PGSSLMODE=disable "$PGBIN/pgbench" -h 127.0.0.1 -U postgres -p $PG -i -s 10 -q postgres >/dev/null 2>&1
cat >"$OUT/fenced.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "count=7"
wrk.headers["Fencing-Resource"] = "inventory:sku-1"
wrk.headers["Fencing-Token"] = "42"
LUA
RESULTS="$OUT/results.txt"; : >"$RESULTS"
# The CPU time (user + system, in clock ticks) the proxy WHO has used so far.
ticks() { awk '{ print $14 + $15 }' "/proc/${PID[$1]}/stat"; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))
run() { # who
  local who=$1 out v n t0
  t0=$(ticks "$who")
  out=$(PGSSLMODE=disable PGOPTIONS="-c fencing.resource=bench:accounts -c fencing.token=42" \
    "$PGBIN/pgbench" -h 127.0.0.1 -U postgres -p "${PGPORT[$who]}" -N -c 16 -j 2 -T "$RUN" postgres 2>&1) \
    || { echo "bench/proxy_metrics.sh: pgbench through $who failed: $(tail -2 <<<"$out")" >&2; exit 1; }
  v=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
  n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  printf 'pg\t%s\t%s\t%s\n' "$who" "$v" "$(( ($(ticks "$who") - t0) * TICK_US * 1000 / n ))" | tee -a "$RESULTS" >&2
  t0=$(ticks "$who")
  out=$(wrk -t2 -c64 -d"${RUN}s" -s "$OUT/fenced.lua" "http://127.0.0.1:${HTTPPORT[$who]}/inventory/sku-1")
  grep -q "Non-2xx" <<<"$out" && { echo "bench/proxy_metrics.sh: wrk through $who got errors: $out" >&2; exit 1; }
  v=$(sed -n 's/^Requests\/sec: *\([0-9.]*\)/\1/p' <<<"$out")
  n=$(sed -n 's/^ *\([0-9]*\) requests in .*/\1/p' <<<"$out")
  printf 'http\t%s\t%s\t%s\n' "$who" "$v" "$(( ($(ticks "$who") - t0) * TICK_US * 1000 / n ))" | tee -a "$RESULTS" >&2
}
orders=("off on off2 on2" "on off2 on2 off" "off2 on2 off on" "on2 off on off2")
for r in $(seq 0 $((ROUNDS - 1))); do
  echo "== round $((r + 1))" >&2
  for who in ${orders[$((r % 4))]}; do run "$who"; done
done
curl -s "http://127.0.0.1:${ADMIN[on]}/metrics" > "$OUT/metrics.txt"
grep -q 'fence_proxy_checks_total{mode="pg",outcome="passed"} [1-9]' "$OUT/metrics.txt" \
  || { echo "bench/proxy_metrics.sh: the 'on' proxy counted no passed PostgreSQL check" >&2; exit 1; }

python3 - "$RESULTS" <<'PY'
import statistics, sys
runs, cpu = {}, {}
for line in open(sys.argv[1]):
    mode, who, v, ns = line.split("\t")
    runs.setdefault(mode, {}).setdefault(who, []).append(float(v))
    cpu.setdefault(mode, {}).setdefault(who, []).append(float(ns) / 1000)
med = statistics.median
print("| fenced writes | off | off2 | on | on2 | on / off: both of each, median of per-round ratios | off2 / off (A/A) | on2 / on (A/A) |")
print("|---|---|---|---|---|---|---|---|")
for mode, title in (("pg", "PostgreSQL, pgbench -N, 16 clients: tps"), ("http", "HTTP, fenced POST, 64 connections: req/s")):
    for label, d, fmt in ((title, runs[mode], "{:.0f}"), ("the proxy's CPU per write, µs", cpu[mode], "{:.1f}")):
        ratio = med((a + b) / (c + e) for a, b, c, e in zip(d["on"], d["on2"], d["off"], d["off2"]))
        aa_off = med(a / b for a, b in zip(d["off2"], d["off"]))
        aa_on = med(a / b for a, b in zip(d["on2"], d["on"]))
        cells = " | ".join(fmt.format(med(d[w])) for w in ("off", "off2", "on", "on2"))
        print(f"| {label} | {cells} | **{ratio:.2f}x** | {aa_off:.2f}x | {aa_on:.2f}x |")
PY
