#!/usr/bin/env bash
# Reproduces the fence-proxy (PostgreSQL) part of BENCHMARKS.md: pgbench directly against a
# throwaway PostgreSQL 15, through PgBouncer (session mode) and through fence-proxy without a
# token (select-only and simple-update, 1 and 16 clients); then a script that sets a token once
# per connection and updates a row per transaction, sent directly and through fence-proxy; then
# what the check costs PostgreSQL, to show it adds no round trip. One run, one machine. Needs
# pgbouncer (apt-get install pgbouncer) and PostgreSQL 15; about 15 minutes. Run as root.
#
#   bench/pg.sh
#   SECONDS_PER_RUN=5 ROUNDS=1 bench/pg.sh
#   BASELINE=/path/to/an/older/fence-proxy bench/pg.sh   # that build too, in the same rounds
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-4}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/pgbench.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
command -v pgbouncer >/dev/null || { echo "bench/pg.sh: pgbouncer is missing (apt-get install pgbouncer)" >&2; exit 1; }
[ -x "$PGBIN/postgres" ] || { echo "bench/pg.sh: no PostgreSQL in $PGBIN (apt-get install postgresql-15)" >&2; exit 1; }
cargo build --release -q -p fence-proxy
. bench/common.sh

PG=15432; BOUNCER=15433; PROXY=15434; BASE=15435
BASELINE=${BASELINE:-}
for port in $PG $BOUNCER $PROXY $BASE; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "bench/pg.sh: something already listens on port $port; stop it first" >&2; exit 1
  fi
done
start_postgres
start_pgbouncer </dev/null
target/release/fence-proxy pg --listen 127.0.0.1:$PROXY --upstream 127.0.0.1:$PG \
  --schema-url "postgres://postgres@127.0.0.1:$PG/postgres" --log warn 2>"$OUT/fence-proxy.log" &
pids+=("$!"); PROXY_PID=$!
wait_port $BOUNCER; wait_port $PROXY
BOUNCER_PID=$(pgrep -f "^pgbouncer -q $OUT/pgbouncer.ini")
BASE_PID=
if [ -n "$BASELINE" ]; then
  # An older build, on a database where the current build installed the check (the older
  # check's functions are replaced by the newer ones, which it calls the same way).
  "$BASELINE" pg --listen 127.0.0.1:$BASE --upstream 127.0.0.1:$PG --log warn 2>"$OUT/baseline.log" &
  pids+=("$!"); BASE_PID=$!
  wait_port $BASE
fi

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

RESULTS="$OUT/results.txt"; : >"$RESULTS"
# CPU time (user + system, clock ticks) the proxy behind PORT has used so far; 0 for direct.
ticks() {
  local pid=
  case $1 in $BOUNCER) pid=$BOUNCER_PID ;; $PROXY) pid=$PROXY_PID ;; $BASE) pid=$BASE_PID ;; esac
  if [ -n "$pid" ]; then awk '{print $14 + $15}' "/proc/$pid/stat"; else echo 0; fi
}
run() { # name port clients [PGOPTIONS] -- pgbench args
  local name=$1 port=$2 clients=$3 opts=$4; shift 5
  local out before after
  before=$(ticks "$port")
  out=$(PGOPTIONS="$opts" pgb -p "$port" -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T "$RUN" "$@" 2>&1) \
    || { printf '%s\t%s\tfailed: %s\n' "$name" "$clients" "$(tail -1 <<<"$out")" | tee -a "$RESULTS"; return; }
  after=$(ticks "$port")
  local tps lat txns cpu
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
  lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$out")
  txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  # The proxy's CPU per transaction, in microseconds (empty for direct runs).
  cpu=$(awk -v t=$((after - before)) -v n="$txns" -v hz="$(getconf CLK_TCK)" -v port="$port" -v pg=$PG \
    'BEGIN { if (port != pg && n > 0) printf "%.1f", t * 1e6 / hz / n }')
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$clients" "$tps" "$lat" "$cpu" | tee -a "$RESULTS"
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
  # PgBouncer refuses the options start-up parameter, so it relays the script without a token.
  run "token-update pgbouncer (no token)" $BOUNCER $c "" -- -f "$OUT/update.sql"
  run "token-update fence-proxy (no token)" $PROXY $c "" -- -f "$OUT/update.sql"
  # The least any check inside the transaction can cost: one more statement that does nothing
  # (`SELECT 1`, in the same Query message), sent directly and through PgBouncer.
  run "token-update + SELECT 1 direct" $PG $c "" -- -f "$OUT/update-select1.sql"
  run "token-update + SELECT 1 pgbouncer" $BOUNCER $c "" -- -f "$OUT/update-select1.sql"
  run "token-update prepared direct" $PG $c "$TOKEN" -- -M prepared -f "$OUT/update.sql"
  run "token-update prepared fence-proxy (token)" $PROXY $c "$TOKEN" -- -M prepared -f "$OUT/update.sql"
done
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
print("median of per-round ratios:")
for clients in ("1", "16"):
    for w in ("select-only", "simple-update"):
        rs = ratios(w + " fence-proxy", w + " pgbouncer", clients)
        if rs:
            print(f"  {w} fence-proxy vs PgBouncer, {clients} client(s): {statistics.median(rs):.2f}x"
                  f" (rounds: {', '.join(f'{x:.2f}' for x in rs)})")
        rs = ratios(w + " baseline", w + " pgbouncer", clients)
        if rs:
            print(f"  {w} baseline vs PgBouncer, {clients} client(s): {statistics.median(rs):.2f}x"
                  f" (rounds: {', '.join(f'{x:.2f}' for x in rs)})")
        for who in ("pgbouncer", "fence-proxy", "baseline"):
            us = [v for v in cpu.get((f"{w} {who}", clients), {}).values()]
            if us:
                print(f"    {who} CPU per transaction: median {statistics.median(us):.1f} us"
                      f" (rounds: {', '.join(f'{x:.1f}' for x in us)})")
    rs = ratios("token-update baseline (token)", "token-update direct", clients)
    if rs:
        print(f"  token-update baseline with a token vs direct, {clients} client(s): {statistics.median(rs):.2f}x"
              f" (rounds: {', '.join(f'{x:.2f}' for x in rs)})")
    rs = ratios("token-update fence-proxy (token)", "token-update direct", clients)
    if rs:
        print(f"  token-update fence-proxy with a token vs direct, {clients} client(s): {statistics.median(rs):.2f}x"
              f" (rounds: {', '.join(f'{x:.2f}' for x in rs)})")
PY2
echo "results in $RESULTS" >&2
