#!/usr/bin/env bash
# What the commit hook's judging of writes that leave through another connection (issue 38:
# a function hook for dblink's functions, a ProcessUtility hook for TRUNCATE of a foreign
# table) costs sessions that use none of them: pgbench directly against two throwaway
# PostgreSQL 15 servers, one loading the hook as it was before (BASE_REV, default the parent
# of the commit that added them) and one loading it as it is now, in alternating rounds:
# select-only without a token, and a token-update script (a token declared at start-up,
# one UPDATE per transaction, judged by the hook at every commit), at 1 and 16 clients.
# One run, one machine; about 2 minutes. Run as root.
#
#   bench/hook_cost.sh
#   SECONDS_PER_RUN=5 ROUNDS=2 BASE_REV=33166a7 bench/hook_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-3}
BASE_REV=${BASE_REV:-33166a7}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/hookcost.XXXXXX)}
mkdir -p "$OUT/old" "$OUT/new"; chown -R postgres "$OUT"
cargo build --release -q -p fence-proxy
. bench/common.sh

git show "$BASE_REV:proxy/pg-hook/fence_hook.c" >"$OUT/old/fence_hook.c"
cp proxy/pg-hook/fence_hook.c "$OUT/new/"
for v in old new; do
  cp proxy/pg-hook/Makefile "$OUT/$v/"
  make -s -C "$OUT/$v" >/dev/null
  chmod 755 "$OUT/$v" "$OUT/$v/fence_hook.so"
done

declare -A port=([old]=15442 [new]=15443)
for v in old new; do
  runuser -u postgres -- "$PGBIN/initdb" -D "$OUT/$v/data" -A trust -U postgres --no-sync >/dev/null
  runuser -u postgres -- "$PGBIN/postgres" -D "$OUT/$v/data" -p "${port[$v]}" -k "$OUT/$v" \
    -c listen_addresses=127.0.0.1 -c max_connections=100 -c shared_buffers=256MB \
    -c shared_preload_libraries="$OUT/$v/fence_hook.so" 2>"$OUT/$v/postgres.log" &
  pids+=("$!")
done
for v in old new; do
  wait_port "${port[$v]}"
  target/release/fence-proxy pg print-schema | "$PGBIN/psql" -q -h 127.0.0.1 -p "${port[$v]}" -U postgres -d postgres >/dev/null
  "$PGBIN/pgbench" -q -i -s 10 -h 127.0.0.1 -p "${port[$v]}" -U postgres postgres 2>/dev/null
done
cat >"$OUT/token-update.sql" <<'SQL'
\set aid random(1, 100000 * :scale)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
SQL

tps() { # VERSION CLIENTS ARGS...
  local v=$1 c=$2; shift 2
  "$PGBIN/pgbench" -h 127.0.0.1 -p "${port[$v]}" -U postgres -n -T "$RUN" -c "$c" -j "$c" "$@" postgres 2>/dev/null \
    | awk '/^tps/ { printf "%.0f", $3 }'
}

printf '%-34s %8s %8s %7s\n' workload old new new/old
for c in 1 16; do
  for w in select-only token-update; do
    declare -A sum=([old]=0 [new]=0)
    for r in $(seq 1 "$ROUNDS"); do
      for v in old new; do
        case $w in
          select-only) t=$(tps "$v" "$c" -S) ;;
          token-update) t=$(PGOPTIONS='-c fencing.resource=bench -c fencing.token=1' tps "$v" "$c" -f "$OUT/token-update.sql") ;;
        esac
        sum[$v]=$((sum[$v] + t))
      done
    done
    old=$((sum[old] / ROUNDS)); new=$((sum[new] / ROUNDS))
    printf '%-34s %8d %8d %7s\n' "$w, $c client(s)" "$old" "$new" "$(awk -v a="$new" -v b="$old" 'BEGIN { printf "%.2fx", a / b }')"
  done
done
