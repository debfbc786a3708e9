#!/usr/bin/env bash
# A new connection per transaction (pgbench -C, select-only) through fence-proxy's server
# connection pool (pool_size), side by side with PgBouncer's session pool, in alternating
# rounds on one machine; plaintext and TLS towards clients (sslmode=require; PostgreSQL over
# plaintext loopback), 1 and 16 clients. PostgreSQL 15 loads fence_hook (built here), as the
# recommended install does; PgBouncer's sessions go through it too. For reference, the same
# through a fence-proxy listener without a pool (one PostgreSQL connection per client
# connection). Needs pgbouncer, openssl and PostgreSQL 15 with its server headers (apt-get
# install pgbouncer openssl postgresql-server-dev-15); about 5 minutes at the defaults. Run as
# root. Prints a Markdown table (medians of the per-round ratios); raw output in $OUT.
#
#   bench/pg_pool.sh
#   ROUNDS=2 SECONDS_PER_RUN=5 bench/pg_pool.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-8}
ROUNDS=${ROUNDS:-3}
PGBIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
OUT=${OUT:-$(mktemp -d /tmp/pg-pool.XXXXXX)}
mkdir -p "$OUT"; chown postgres "$OUT"
for b in pgbouncer openssl pg_config; do
  command -v "$b" >/dev/null || { echo "bench/pg_pool.sh: $b is missing (apt-get install pgbouncer openssl postgresql-server-dev-15)" >&2; exit 1; }
done
[ -f "$(pg_config --pgxs)" ] || { echo "bench/pg_pool.sh: no PGXS (apt-get install postgresql-server-dev-15)" >&2; exit 1; }
[ -x "$PGBIN/postgres" ] || { echo "bench/pg_pool.sh: no PostgreSQL in $PGBIN (apt-get install postgresql-15)" >&2; exit 1; }
cargo build --release -q -p fence-proxy
. bench/common.sh

PG=17432; BOUNCER=17433; POOLED=17434; UNPOOLED=17435
free_ports bench/pg_pool.sh $PG $BOUNCER $POOLED $UNPOOLED
loopback_cert

start_postgres_with_hook_and_pgbouncer_tls
# Both pools as large as the clients: PgBouncer's default_pool_size is 100 (common.sh).
cat >"$OUT/proxy.toml" <<TOML
log = "warn"
[[pg]]
listen = "127.0.0.1:$POOLED"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
tls_cert = "$OUT/cert.pem"
tls_key = "$OUT/key.pem"
tls_required = false
pool_size = 100
pool_auth = "trust"
[[pg]]
listen = "127.0.0.1:$UNPOOLED"
upstream = "127.0.0.1:$PG"
schema_urls = ["postgres://postgres@127.0.0.1:$PG/postgres"]
tls_cert = "$OUT/cert.pem"
tls_key = "$OUT/key.pem"
tls_required = false
TOML
target/release/fence-proxy --config "$OUT/proxy.toml" 2>"$OUT/fence-proxy.log" & pids+=("$!")
wait_port $BOUNCER; wait_port $POOLED; wait_port $UNPOOLED

pgb() { PGSSLMODE=$SSLMODE "$PGBIN/pgbench" -h 127.0.0.1 -U postgres "$@" postgres; }
SSLMODE=disable pgb -p $PG -i -s 10 -q >/dev/null 2>&1
RESULTS="$OUT/results.txt"; : >"$RESULTS"
run() { # name port clients
  local name=$1 port=$2 c=$3 out tps
  out=$(pgb -p "$port" -S -C -n -c "$c" -j "$(( c < 2 ? 1 : 2 ))" -T "$RUN" 2>&1) \
    || { echo "bench/pg_pool.sh: $name failed: $(tail -2 <<<"$out")" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
  printf '%s\t%s\t%s\n' "$name" "$r" "$tps" | tee -a "$RESULTS" >&2
}
for r in $(seq "$ROUNDS"); do
  for c in 1 16; do
    for SSLMODE in disable require; do
      name="$c clients, sslmode=$SSLMODE"
      # The order swaps every other round, so that drift falls on both sides.
      if (( r % 2 )); then
        run "$name|pgbouncer" $BOUNCER "$c"; run "$name|fence-proxy pool" $POOLED "$c"
      else
        run "$name|fence-proxy pool" $POOLED "$c"; run "$name|pgbouncer" $BOUNCER "$c"
      fi
      (( r == 1 )) && run "$name|fence-proxy, no pool" $UNPOOLED "$c"
    done
  done
done
python3 - "$RESULTS" <<'PY'
import collections, statistics, sys
tps = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    name, r, t = line.rstrip("\n").split("\t")
    case, side = name.split("|")
    tps[(case, side)][r] = float(t)
print("| pgbench -S -C | PgBouncer tps | fence-proxy pool tps | pool / PgBouncer (median of rounds) | fence-proxy without a pool tps |")
print("|---|---|---|---|---|")
for case in dict.fromkeys(c for c, _ in tps):
    b, p = tps[(case, "pgbouncer")], tps[(case, "fence-proxy pool")]
    ratios = [p[r] / b[r] for r in b if r in p and b[r] > 0]
    unpooled = tps.get((case, "fence-proxy, no pool"), {}).get("1", float("nan"))
    print(f"| {case} | {statistics.median(b.values()):.0f} | {statistics.median(p.values()):.0f} | "
          f"**{statistics.median(ratios):.2f}x** | {unpooled:.0f} |")
PY
