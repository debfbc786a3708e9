#!/usr/bin/env bash
# What the hook's one-call check before an explicit transaction's statements (fencing.hook_check)
# gains over the two statements fence-proxy sends without it (its lock, then its fast read):
# pgbench through fence-proxy (release build) in front of a throwaway PostgreSQL 15 that loads
# the commit hook, a token at start-up, BEGIN; UPDATE; END per transaction, at 1 and 16
# clients, in alternating rounds: with the function (as a superuser's installation creates it)
# and with it dropped (new connections then fall back to the two statements); and the same
# straight to PostgreSQL. One run, one machine; about 2 minutes. Run as root.
#
#   bench/hook_explicit.sh
#   SECS=10 bench/hook_explicit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p fence-proxy
make -s -C proxy/pg-hook >/dev/null
PGB=${PG_BIN:-/usr/lib/postgresql/15/bin}
D=$(mktemp -d /tmp/hookexplicit.XXXXXX); cp proxy/pg-hook/fence_hook.so "$D/"; chown -R postgres "$D"; chmod 755 "$D"
runuser -u postgres -- $PGB/initdb -D $D/data -A trust -U postgres --no-sync --locale=C >/dev/null
runuser -u postgres -- $PGB/pg_ctl -D $D/data start -w -l $D/log -o "-p 17100 -k $D -c listen_addresses=127.0.0.1 -c max_connections=100 -c shared_buffers=256MB -c shared_preload_libraries=$D/fence_hook.so" >/dev/null
PX=
trap '[ -n "$PX" ] && kill $PX 2>/dev/null; runuser -u postgres -- $PGB/pg_ctl -D $D/data stop -m fast >/dev/null' EXIT
target/release/fence-proxy pg print-schema | psql -q -h 127.0.0.1 -p 17100 -U postgres postgres >/dev/null 2>&1
$PGB/pgbench -q -i -s 10 -h 127.0.0.1 -p 17100 -U postgres postgres 2>/dev/null
cat > $D/proxy.toml <<T
log = "warn"
[[pg]]
listen = "127.0.0.1:17101"
upstream = "127.0.0.1:17100"
schema_urls = ["postgres://postgres@127.0.0.1:17100/postgres"]
T
target/release/fence-proxy --config $D/proxy.toml 2>$D/proxy.log & PX=$!
for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/17101) 2>/dev/null && break; sleep 0.2; done
printf '\\set aid random(1, 1000000)\nBEGIN;\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\nEND;\n' > $D/x.sql
chmod 644 $D/x.sql
TOKEN="-c fencing.resource=bench:accounts -c fencing.token=42"
run() { PGOPTIONS="$TOKEN" $PGB/pgbench -n -h 127.0.0.1 -p $1 -U postgres -c $2 -j $(( $2 < 2 ? 1 : 2 )) -T ${SECS:-5} -f $D/x.sql postgres 2>/dev/null | awk '/^tps/ {printf "%.0f", $3}'; }
drop() { psql -q -h 127.0.0.1 -p 17100 -U postgres postgres -c "DROP FUNCTION fencing.hook_check(integer)"; }
make_fn() { target/release/fence-proxy pg print-schema | psql -q -h 127.0.0.1 -p 17100 -U postgres postgres >/dev/null 2>&1; }
run 17101 1 >/dev/null  # warm, raises the mark
for c in 1 16; do
  for r in 1 2; do
    if (( r % 2 )); then
      one=$(run 17101 $c); drop; two=$(run 17101 $c); make_fn
    else
      drop; two=$(run 17101 $c); make_fn; one=$(run 17101 $c)
    fi
    direct=$(run 17100 $c)
    echo "clients=$c round=$r one-call=$one two-statements=$two direct=$direct ratio=$(awk -v a=$one -v b=$two 'BEGIN{printf "%.2f", a/b}')"
  done
done
