#!/usr/bin/env bash
# Reproduces the fence-proxy (PostgreSQL) part of BENCHMARKS.md, every row of issue 40's table,
# in one run: twice, against a throwaway PostgreSQL 15 without the commit hook and against one
# that loads it (rows of the second are marked "[hook]"): pgbench directly, through PgBouncer
# (session mode) and through fence-proxy without a token (select-only and simple-update, 1 and
# 16 clients); a script that sets a token once per connection and updates a row per
# transaction, directly, through fence-proxy, and (without the token, which PgBouncer refuses
# as a start-up option) through PgBouncer; a new connection per transaction (-C) through
# PgBouncer and through fence-proxy's pool; then, without the hook, what the check costs
# PostgreSQL, to show it adds no round trip. Then, unless PG_ONLY=1, the rest of the table:
# bench/pg_pool.sh (-C with TLS too) and bench/run.sh (lockd's rows). One machine.
# Needs pgbouncer, openssl, etcd-server, redis-server and PostgreSQL 15 with its server
# headers (apt-get install pgbouncer etcd-server redis-server postgresql-server-dev-15: the
# hook is built here); about 35 minutes at the defaults, 22 at SECONDS_PER_RUN=5 ROUNDS=2.
# Run as root.
#
#   bench/pg.sh
#   SECONDS_PER_RUN=5 ROUNDS=1 PG_ONLY=1 bench/pg.sh
#   BASELINE=/path/to/an/older/fence-proxy bench/pg.sh   # that build too, in the same rounds
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-4}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/pgbench.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
. bench/common.sh
pg_bench_prepare bench/pg.sh

BASELINE=${BASELINE:-}
RESULTS="$OUT/results.txt"; : >"$RESULTS"
free_ports bench/pg.sh 15432 15433 15434 15435 15436 15437 15438 15439 15440 15441 15442
TOP=$OUT
# One PostgreSQL with its PgBouncer, fence-proxy and fence-proxy pool; $1: the label of its rows
# ("" or "[hook] "), then postgres' own arguments.
start_servers() {
  LABEL=$1; shift
  start_postgres "$@"
  start_pgbouncer </dev/null
  cat >"$OUT/proxy.toml" <<TOML
log = "warn"
[[pg]]
listen = "127.0.0.1:$PROXY"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
[[pg]]
listen = "127.0.0.1:$POOL"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
pool_size = 100
pool_auth = "trust"
TOML
  target/release/fence-proxy --config "$OUT/proxy.toml" 2>"$OUT/fence-proxy.log" &
  pids+=("$!"); PROXY_PID=$!
  wait_port $BOUNCER; wait_port $PROXY; wait_port $POOL
  BOUNCER_PID=$(pgrep -f "^pgbouncer -q $OUT/pgbouncer.ini")
}
PG=15432; BOUNCER=15433; PROXY=15434; BASE=15435; POOL=15436
start_servers ""
BASE_PID=
if [ -n "$BASELINE" ]; then
  # An older build, on a database where the current build installed the check (the older
  # check's functions are replaced by the newer ones, which it calls the same way).
  "$BASELINE" pg --listen 127.0.0.1:$BASE --upstream 127.0.0.1:$PG --log warn 2>"$OUT/baseline.log" &
  pids+=("$!"); BASE_PID=$!
  wait_port $BASE
fi

suite() {
pgb() { "$PGBIN/pgbench" -h 127.0.0.1 -U postgres "$@" postgres; }
pgb -p $PG -i -s 10 -q >/dev/null 2>&1

cat >"$OUT/update.sql" <<'SQL'
\set aid random(1, 100000 * :scale)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
SQL
echo 'SELECT * FROM fencing.check(1000);' >"$OUT/check.sql"
echo 'SELECT * FROM fencing.check(1000, true);' >"$OUT/check-current.sql"
echo 'SELECT 1;' >"$OUT/select1.sql"
{ echo '\set aid random(1, 100000 * :scale)'
  echo 'SELECT 1 \; UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;'
} >"$OUT/update-select1.sql"
# The checks as fence-proxy prepares and sends them (`fence-proxy pg print-checks`, `$1` = 1000):
# the fast path (lock and read) in one pipeline like the proxy's batch, and the form a session
# without a token gets.
target/release/fence-proxy pg print-checks >"$OUT/checks.tsv"
# The statement named $1 as run at a transaction's end: the lock statement's $1 is "the
# transaction ends here"; the others take the fence wait, "at a commit point" and "ends".
check_text() {
  local subst='s/\$1/1000/g; s/\$2/true/g; s/\$3/true/g'
  [ "$1" = __fence_proxy_lock ] && subst='s/\$1/true/g'
  awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$OUT/checks.tsv" | sed "$subst"
}
{ echo '\startpipeline'; echo "$(check_text __fence_proxy_lock);"; echo "$(check_text __fence_proxy_fast);"; echo '\endpipeline'; } >"$OUT/fast.sql"
echo "$(check_text __fence_proxy_any);" >"$OUT/any.sql"
TOKEN="-c fencing.resource=bench:accounts -c fencing.token=42"

# CPU time (user + system, clock ticks) the proxy behind PORT has used so far; 0 for direct.
ticks() {
  local pid=
  case $1 in $BOUNCER) pid=$BOUNCER_PID ;; $PROXY|$POOL) pid=$PROXY_PID ;; $BASE) pid=$BASE_PID ;; esac
  if [ -n "$pid" ]; then awk '{print $14 + $15}' "/proc/$pid/stat"; else echo 0; fi
}
run() { # name port clients [PGOPTIONS] -- pgbench args
  local name=$1 port=$2 clients=$3 opts=$4; shift 5
  local out before after
  before=$(ticks "$port")
  out=$(PGOPTIONS="$opts" pgb -p "$port" -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T "$RUN" "$@" 2>&1) \
    || { printf '%s\t%s\tfailed: %s\n' "$LABEL$name" "$clients" "$(tail -1 <<<"$out")" | tee -a "$RESULTS"; return; }
  after=$(ticks "$port")
  local tps lat txns cpu
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
  lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$out")
  txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  # The proxy's CPU per transaction, in microseconds (empty for direct runs).
  cpu=$(awk -v t=$((after - before)) -v n="$txns" -v hz="$(getconf CLK_TCK)" -v port="$port" -v pg=$PG \
    'BEGIN { if (port != pg && n > 0) printf "%.1f", t * 1e6 / hz / n }')
  printf '%s\t%s\t%s\t%s\t%s\n' "$LABEL$name" "$clients" "$tps" "$lat" "$cpu" | tee -a "$RESULTS"
}
# The comparisons the targets are about run in ROUNDS pairs (PgBouncer and fence-proxy; direct
# and fence-proxy with a token), the order swapped every other round (the tables grow with
# every run, so whatever runs second is slightly handicapped), so that drift on the machine
# (autovacuum, checkpoints, the page cache) falls on both sides; the summary gives the median
# of the per-round ratios.
pair() { # round nameA portA optsA nameB portB optsB clients pgbench-args...
  local r=$1 na=$2 pa=$3 oa=$4 nb=$5 pb=$6 ob=$7 c=$8; shift 8
  if (( r % 2 )); then
    run "$na" "$pa" "$c" "$oa" -- "$@"; run "$nb" "$pb" "$c" "$ob" -- "$@"
  else
    run "$nb" "$pb" "$c" "$ob" -- "$@"; run "$na" "$pa" "$c" "$oa" -- "$@"
  fi
}
for c in 1 16; do
  for w in select-only simple-update; do
    flag=$([ $w = select-only ] && echo -S || echo -N)
    run "$w direct" $PG $c "" -- $flag
    for r in $(seq "$ROUNDS"); do
      pair "$r" "$w pgbouncer #$r" $BOUNCER "" "$w fence-proxy #$r" $PROXY "" $c $flag
      [ -n "$BASELINE" ] && run "$w baseline #$r" $BASE $c "" -- $flag
    done
  done
  for r in $(seq "$ROUNDS"); do
    pair "$r" "token-update direct #$r" $PG "$TOKEN" "token-update fence-proxy (token) #$r" $PROXY "$TOKEN" \
      $c -f "$OUT/update.sql"
    [ -n "$BASELINE" ] && run "token-update baseline (token) #$r" $BASE $c "$TOKEN" -- -f "$OUT/update.sql"
  done
  # PgBouncer refuses the options start-up parameter, so it relays the script without a token:
  # what fencing costs against a pooler's hop.
  for r in $(seq "$ROUNDS"); do
    pair "$r" "token-update pgbouncer (no token) #$r" $BOUNCER "" "token-update fence-proxy (token) vs pgbouncer #$r" $PROXY "$TOKEN" \
      $c -f "$OUT/update.sql"
  done
  run "token-update fence-proxy (no token)" $PROXY $c "" -- -f "$OUT/update.sql"
  # A new connection per transaction: PgBouncer's session pool and fence-proxy's.
  for r in $(seq "$ROUNDS"); do
    pair "$r" "connect per transaction pgbouncer #$r" $BOUNCER "" "connect per transaction fence-proxy pool #$r" $POOL "" \
      $c -S -C
  done
  # The least any check inside the transaction can cost: one more statement that does nothing
  # (`SELECT 1`, in the same Query message), sent directly and through PgBouncer.
  run "token-update + SELECT 1 direct" $PG $c "" -- -f "$OUT/update-select1.sql"
  run "token-update + SELECT 1 pgbouncer" $BOUNCER $c "" -- -f "$OUT/update-select1.sql"
  run "token-update prepared direct" $PG $c "$TOKEN" -- -M prepared -f "$OUT/update.sql"
  run "token-update prepared fence-proxy (token)" $PROXY $c "$TOKEN" -- -M prepared -f "$OUT/update.sql"
done
}
micro() {
run "SELECT 1 direct" $PG 1 "" -- -f "$OUT/select1.sql"
run "SELECT 1 prepared direct" $PG 1 "" -- -M prepared -f "$OUT/select1.sql"
run "fast path prepared direct (a current token)" $PG 1 "$TOKEN" -- -M prepared -f "$OUT/fast.sql"
run "fencing.check(1000) direct (the full check)" $PG 1 "$TOKEN" -- -f "$OUT/check.sql"
run "fencing.check(1000, true) direct (a current token)" $PG 1 "$TOKEN" -- -f "$OUT/check-current.sql"
run "no-token check prepared direct (a session without a token)" $PG 1 "" -- -M prepared -f "$OUT/any.sql"
# A protected table: the statement trigger's cost per write, directly (no proxy), with a token.
run "token-update direct, unprotected" $PG 1 "$TOKEN" -- -f "$OUT/update.sql"
"$PGBIN/psql" -h 127.0.0.1 -p $PG -U postgres -qc "SELECT fencing.protect('pgbench_accounts', 'bench:')"
run "token-update direct, protected table" $PG 1 "$TOKEN" -- -f "$OUT/update.sql"
run "token-update fence-proxy (token), protected table" $PROXY 1 "$TOKEN" -- -f "$OUT/update.sql"
"$PGBIN/psql" -h 127.0.0.1 -p $PG -U postgres -qc "SELECT fencing.unprotect('pgbench_accounts')"
}
suite
micro
# The same with the hook loaded: a second PostgreSQL, PgBouncer and fence-proxy.
OUT=$TOP/hook; mkdir -p "$OUT"; chown postgres "$OUT"
cp proxy/pg-hook/fence_hook.so "$OUT/"; chown postgres "$OUT/fence_hook.so"
PG=15437; BOUNCER=15438; PROXY=15439; BASE=15440; POOL=15441
start_servers "[hook] " -c shared_preload_libraries="$OUT/fence_hook.so"
BASELINE=
suite
OUT=$TOP
# Medians of the per-round ratios.
python3 - "$RESULTS" <<'PY2'
import statistics, sys, collections
tps = collections.defaultdict(dict)
cpu = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if len(f) < 3 or "failed" in f[2]:
        continue
    name, clients, value = f[0], f[1], float(f[2])
    base, _, r = name.partition(" #")
    tps[(base, clients)][r or "-"] = value
    if len(f) > 4 and f[4]:
        cpu[(base, clients)][r or "-"] = float(f[4])
def ratios(num, den, clients):
    a, b = tps.get((num, clients), {}), tps.get((den, clients), {})
    return [a[r] / b[r] for r in sorted(a) if r in b and r != "-"]
def show(label, num, den, clients, what):
    rs = ratios(label + num, label + den, clients)
    if rs:
        print(f"  {what}, {clients} client(s): {statistics.median(rs):.2f}x"
              f" (rounds: {', '.join(f'{x:.2f}' for x in rs)})")
    return rs
print("median of per-round ratios:")
for label, title in (("", "without the commit hook"), ("[hook] ", "with the commit hook")):
    print(f"{title}:")
    for clients in ("1", "16"):
        for w in ("select-only", "simple-update"):
            show(label, w + " fence-proxy", w + " pgbouncer", clients, f"{w}, no token, fence-proxy / PgBouncer")
            show(label, w + " baseline", w + " pgbouncer", clients, f"{w}, no token, baseline / PgBouncer")
            for who in ("pgbouncer", "fence-proxy", "baseline"):
                us = [v for v in cpu.get((f"{label}{w} {who}", clients), {}).values()]
                if us:
                    print(f"    {who} CPU per transaction: median {statistics.median(us):.1f} us"
                          f" (rounds: {', '.join(f'{x:.1f}' for x in us)})")
        show(label, "token-update fence-proxy (token)", "token-update direct", clients,
             "token-update with a token, fence-proxy / direct")
        show(label, "token-update baseline (token)", "token-update direct", clients,
             "token-update with a token, baseline / direct")
        show(label, "token-update fence-proxy (token) vs pgbouncer", "token-update pgbouncer (no token)", clients,
             "token-update with a token through fence-proxy / without one through PgBouncer")
        show(label, "connect per transaction fence-proxy pool", "connect per transaction pgbouncer", clients,
             "pgbench -S -C, fence-proxy pool / PgBouncer")
PY2
echo "results in $RESULTS" >&2

# The rest of issue 40's table in the same run (PG_ONLY=1 skips it): a connection per
# transaction with TLS as well as in plaintext (bench/pg_pool.sh), and lockd's rows, against
# Redis and etcd and the machine's floor (bench/run.sh). This script's servers stop first.
if [ -z "${PG_ONLY:-}" ]; then
  cleanup; pids=()
  echo "== bench/pg_pool.sh: a connection per transaction, plaintext and TLS"
  mkdir -p "$TOP/pool"; chown postgres "$TOP/pool"
  OUT=$TOP/pool SECONDS_PER_RUN=$RUN ROUNDS=$ROUNDS bench/pg_pool.sh
  echo "== bench/run.sh: lockd against Redis and etcd, and the floor"
  OUT=$TOP/lockd SECONDS_PER_RUN=$RUN bench/run.sh
fi
