#!/usr/bin/env bash
# Where a transaction's CPU goes (BENCHMARKS.md, "Where a fenced transaction's CPU goes"): for
# each path (direct, PgBouncer in session mode, fence-proxy) the transactions per second and the
# CPU per transaction of the machine, split into the relay (its user and system time), pgbench,
# and the rest (PostgreSQL's backends, and the kernel's network work they cause), from /proc.
# Against a throwaway PostgreSQL 15 without the commit hook and one that loads it; then, without
# the hook, what the check a session without a token gets costs PostgreSQL by itself. Alternating
# rounds. About 6 minutes at the defaults; needs pgbouncer and postgresql-server-dev-15 (the hook
# is built here). Run as root.
#
#   bench/pg_cpu.sh
#   SECONDS_PER_RUN=5 ROUNDS=3 bench/pg_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-5}
ROUNDS=${ROUNDS:-2}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/pgcpu.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
. bench/common.sh
pg_bench_prepare bench/pg_cpu.sh
free_ports bench/pg_cpu.sh 15460 15461 15462 15463 15464 15465
TOP=$OUT
HZ=$(getconf CLK_TCK)
TOKEN="-c fencing.resource=bench:accounts -c fencing.token=42"

start_servers() { # postgres' own arguments
  start_postgres "$@"
  start_pgbouncer </dev/null
  cat >"$OUT/proxy.toml" <<TOML
log = "warn"
[[pg]]
listen = "127.0.0.1:$PROXY"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
TOML
  target/release/fence-proxy --config "$OUT/proxy.toml" 2>"$OUT/fence-proxy.log" &
  pids+=("$!"); PROXY_PID=$!
  wait_port $BOUNCER; wait_port $PROXY
  BOUNCER_PID=$(pgrep -f "^pgbouncer -q $OUT/pgbouncer.ini")
  "$PGBIN/pgbench" -h 127.0.0.1 -p $PG -U postgres -i -s 10 -q postgres >/dev/null 2>&1
  printf '%s\n' '\set aid random(1, 100000 * :scale)' \
    'UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;' >"$OUT/update.sql"
}
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
# One run: LABEL PORT CLIENTS PGOPTIONS pgbench-args...; prints a row of the table.
run() {
  local label=$1 port=$2 clients=$3 opts=$4; shift 4
  local pid= u0=0 s0=0 u1=0 s1=0 b0 b1 out
  case $port in $BOUNCER) pid=$BOUNCER_PID ;; $PROXY) pid=$PROXY_PID ;; esac
  [ -n "$pid" ] && read -r u0 s0 < <(awk '{ print $14, $15 }' "/proc/$pid/stat")
  b0=$(busy)
  # `times` in the subshell: the CPU its children (pgbench) used, user and system.
  out=$( (PGOPTIONS="$opts" "$PGBIN/pgbench" -h 127.0.0.1 -p "$port" -U postgres -n -T "$RUN" \
    -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" "$@" postgres 2>&1; times) )
  b1=$(busy)
  [ -n "$pid" ] && read -r u1 s1 < <(awk '{ print $14, $15 }' "/proc/$pid/stat")
  awk -v label="$label" -v c="$clients" -v hz="$HZ" -v b=$((b1 - b0)) \
      -v ru=$((u1 - u0)) -v rs=$((s1 - s0)) -v relay="$pid" '
    /actually processed/ { n = $NF }
    /^tps = / { tps = $3 }
    # the last line of `times`: the children, "XmY.YYYs XmY.YYYs"
    /^[0-9]+m[0-9.]+s [0-9]+m[0-9.]+s$/ { split($0, t, /[ms ]+/); bench = t[1] * 60 + t[2] + t[3] * 60 + t[4] }
    END {
      if (!n) { printf "%s\t%s\tfailed\n", label, c; exit }
      us = 1e6 / n; total = b / hz * us; r = (ru + rs) / hz * us; pb = bench * us
      printf "%s\t%s\t%.0f\t%.0f\t%s\t%.0f\t%.0f\n", label, c, tps, total,
        (relay == "" ? "-" : sprintf("%.1f (%.1f + %.1f)", r, ru / hz * us, rs / hz * us)), pb, total - r - pb
    }' <<<"$out" | tee -a "$OUT/rows.tsv"
}
header() {
  printf '\n%s\npath\tclients\ttps\tmachine us/txn\trelay us/txn (user + system)\tpgbench us/txn\trest (PostgreSQL) us/txn\n' "$1"
}

# The token-update rounds at 1 and 16 clients; with the hook (any argument), direct without a
# token too (without it, direct with a token is judged by nothing: the same work).
token_update_rounds() {
  for r in $(seq 1 "$ROUNDS"); do
    for c in 1 16; do
      run "direct (token) #$r" $PG $c "$TOKEN" -f "$OUT/update.sql"
      [ -n "${1:-}" ] && run "direct (no token) #$r" $PG $c "" -f "$OUT/update.sql"
      run "pgbouncer (no token) #$r" $BOUNCER $c "" -f "$OUT/update.sql"
      run "fence-proxy (token) #$r" $PROXY $c "$TOKEN" -f "$OUT/update.sql"
    done
  done
}

PG=15460; BOUNCER=15461; PROXY=15462
start_servers
header "without the commit hook: select-only, no token"
for r in $(seq 1 "$ROUNDS"); do
  for c in 1 16; do
    run "direct #$r" $PG $c "" -S
    run "pgbouncer #$r" $BOUNCER $c "" -S
    run "fence-proxy #$r" $PROXY $c "" -S
  done
done
header "without the commit hook: token-update, a token through fence-proxy and direct (where nothing judges it), none through PgBouncer"
token_update_rounds
# The checks by themselves: each transaction is the check as fence-proxy prepares it (`fence-proxy
# pg print-checks`; "at a commit point" and "the transaction ends here" true), or `SELECT 1`, so
# the difference is the check's own cost: `any`, what a session without a token gets at each
# commit point; `fast`, the lock and the read of the mark in one pipeline, what a session whose
# token is current gets. PostgreSQL's CPU is its backend's, read from the postmaster's
# children's times once the backend has exited.
target/release/fence-proxy pg print-checks >"$OUT/checks.tsv"
check_text() { # NAME: its text with pgbench's variables for the parameters
  local subst='s/\$1/:w/g; s/\$2/:b::int::bool/g; s/\$3/:b::int::bool/g'
  [ "$1" = __fence_proxy_lock ] && subst='s/\$1/:b::int::bool/g'
  awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$OUT/checks.tsv" | sed "$subst"
}
printf '%s\n' '\set w 1000' '\set b 1' "$(check_text __fence_proxy_any);" >"$OUT/any.sql"
printf '%s\n' '\set w 1000' '\set b 1' '\startpipeline' "$(check_text __fence_proxy_lock);" \
  "$(check_text __fence_proxy_fast);" '\endpipeline' >"$OUT/fast.sql"
printf '%s\n' '\set w 1000' '\set b 1' 'SELECT :w::int, :b::int::bool;' >"$OUT/one.sql"
postmaster_children() { awk '{ print $16 + $17 }' "/proc/$(head -1 "$OUT/data/postmaster.pid")/stat"; }
# One backend's CPU per transaction: LABEL PGOPTIONS pgbench-args (1 client, 20000
# transactions); a row of "label, µs".
backend_cpu() {
  local label=$1 opts=$2 before; shift 2
  before=$(postmaster_children)
  PGOPTIONS=$opts "$PGBIN/pgbench" -h 127.0.0.1 -p $PG -U postgres -n -t 20000 "$@" postgres \
    >"$OUT/backend.out" 2>&1 || { cat "$OUT/backend.out" >&2; exit 1; }
  # The backend is reaped once pgbench has closed: wait for its times to arrive.
  for _ in $(seq 1 50); do [ "$(postmaster_children)" != "$before" ] && break; sleep 0.02; done
  [ "$(postmaster_children)" != "$before" ] || { echo "bench/pg_cpu.sh: $label: the backend's CPU time never arrived" >&2; exit 1; }
  awk -v d=$(( $(postmaster_children) - before )) -v hz="$HZ" -v s="$label" \
    'BEGIN { printf "%s\t%.0f\n", s, d * 1e6 / hz / 20000 }' | tee -a "$TOP/rows.tsv"
}
printf '\nthe check by itself (1 client, -M prepared, 20000 transactions)\nstatement\tPostgreSQL us/txn\n'
for r in $(seq 1 "$ROUNDS"); do
  backend_cpu "one #$r" "" -M prepared -f "$OUT/one.sql"
  backend_cpu "any #$r" "" -M prepared -f "$OUT/any.sql"
  backend_cpu "fast #$r" "$TOKEN" -M prepared -f "$OUT/fast.sql"
done

OUT=$TOP/hook; mkdir -p "$OUT"; chown postgres "$OUT"
cp proxy/pg-hook/fence_hook.so "$OUT/"; chown postgres "$OUT/fence_hook.so"
PG=15463; BOUNCER=15464; PROXY=15465
start_servers -c shared_preload_libraries="$OUT/fence_hook.so"
header "with the commit hook: token-update, a token through fence-proxy and direct, none through PgBouncer"
token_update_rounds "with the hook"
# What the hook's checks cost a transaction with a token (the first write and the commit),
# from the backend's own CPU.
printf '\nwith the commit hook: token-update direct, one backend (1 client, 20000 transactions)\npath\tPostgreSQL us/txn\n'
for r in $(seq 1 "$ROUNDS"); do
  backend_cpu "direct (token) #$r" "$TOKEN" -f "$OUT/update.sql"
  backend_cpu "direct (no token) #$r" "" -f "$OUT/update.sql"
done
header "with the commit hook: select-only, no token"
for r in $(seq 1 "$ROUNDS"); do
  run "pgbouncer #$r" $BOUNCER 16 "" -S
  run "fence-proxy #$r" $PROXY 16 "" -S
done
echo "rows in $TOP/rows.tsv" >&2
