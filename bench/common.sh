# Shared by the bench scripts: the servers they start, stopped on exit, and waiting for a port.
# (Sourced, not run.)

pids=()

# SIGTERM first: nginx's master stops its workers only when it is not killed outright.
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Waits (up to 10 s) until something listens on 127.0.0.1:PORT.
wait_port() {
  for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "$(basename "$0"): nothing listens on port $1" >&2
  exit 1
}

# A throwaway PostgreSQL in $OUT/data on 127.0.0.1:$PG (PGBIN, OUT and PG set by the caller),
# stopped on exit; returns once it listens.
start_postgres() {
  runuser -u postgres -- "$PGBIN/initdb" -D "$OUT/data" -A trust -U postgres --no-sync >/dev/null
  runuser -u postgres -- "$PGBIN/postgres" -D "$OUT/data" -p "$PG" -k "$OUT" \
    -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=256MB "$@" 2>"$OUT/postgres.log" &
  pids+=("$!")
  wait_port "$PG"
}

# PgBouncer in session mode on 127.0.0.1:$BOUNCER in front of it (trust), with the extra lines
# of its [pgbouncer] section on stdin; started in the background, stopped on exit.
start_pgbouncer() {
  { cat <<INI
[databases]
postgres = host=127.0.0.1 port=$PG dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCER
auth_type = trust
auth_file = $OUT/users.txt
pool_mode = session
max_client_conn = 200
default_pool_size = 100
unix_socket_dir =
logfile = $OUT/pgbouncer.log
INI
    cat; } >"$OUT/pgbouncer.ini"
  echo '"postgres" ""' >"$OUT/users.txt"
  chown postgres "$OUT/pgbouncer.ini" "$OUT/users.txt"
  runuser -u postgres -- pgbouncer -q "$OUT/pgbouncer.ini" & pids+=("$!")
}

# A P-256 CA for this run: $OUT/ca.pem and $OUT/ca-key.pem (OUT set by the caller).
make_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=bench CA" -keyout "$OUT/ca-key.pem" -out "$OUT/ca.pem" 2>/dev/null
}

# A certificate of that CA, common name NAME and subjectAltName SAN (e.g. IP:127.0.0.1):
# $OUT/NAME.pem and $OUT/NAME-key.pem.
issue_cert() { # NAME SAN
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
    -keyout "$OUT/$1-key.pem" -out "$OUT/$1.csr" 2>/dev/null
  openssl x509 -req -in "$OUT/$1.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca-key.pem" -days 1 \
    -extfile <(printf 'subjectAltName=%s' "$2") -out "$OUT/$1.pem" 2>/dev/null
}

# A single-node etcd in $OUT/etcd, clients on 127.0.0.1:$1 and its peer port on $2 (OUT set by
# the caller); stopped on exit.
start_etcd() { # CLIENT_PORT PEER_PORT
  etcd --name bench --data-dir "$OUT/etcd" \
    --listen-client-urls "http://127.0.0.1:$1" --advertise-client-urls "http://127.0.0.1:$1" \
    --listen-peer-urls "http://127.0.0.1:$2" --initial-advertise-peer-urls "http://127.0.0.1:$2" \
    --initial-cluster "bench=http://127.0.0.1:$2" --log-level error >"$OUT/etcd.log" 2>&1 &
  pids+=("$!")
}

# Redis on 127.0.0.1:$1 with its data in $OUT/redis, durable (appendfsync always); stopped on
# exit.
start_redis() { # PORT
  mkdir -p "$OUT/redis"
  redis-server --port "$1" --dir "$OUT/redis" --appendonly yes --appendfsync always --save '' \
    --daemonize no >"$OUT/redis.log" 2>&1 &
  pids+=("$!")
}
free_ports() { # SCRIPT PORT...: refuses to run where something already listens
  local script=$1 port; shift
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$script: something already listens on port $port; stop it first" >&2; exit 1
    fi
  done
}
loopback_cert() { # one certificate for 127.0.0.1 as $OUT/cert.pem and $OUT/key.pem (P-256)
  make_ca
  issue_cert proxy IP:127.0.0.1
  mv "$OUT/proxy.pem" "$OUT/cert.pem"; mv "$OUT/proxy-key.pem" "$OUT/key.pem"
  chown postgres "$OUT/key.pem" "$OUT/cert.pem"; chmod 600 "$OUT/key.pem"
}
start_postgres_with_hook_and_pgbouncer_tls() { # fence_hook built and loaded; PgBouncer taking TLS
  make -s -C proxy/pg-hook >/dev/null
  cp proxy/pg-hook/fence_hook.so "$OUT/"; chown postgres "$OUT/fence_hook.so"
  start_postgres -c shared_preload_libraries="$OUT/fence_hook.so"
  start_pgbouncer <<INI
client_tls_sslmode = allow
client_tls_cert_file = $OUT/cert.pem
client_tls_key_file = $OUT/key.pem
INI
}
# What the PostgreSQL benchmarks need (SCRIPT names the caller in errors): pgbouncer,
# PostgreSQL 15 in $PGBIN and PGXS; then fence-proxy (release) and the commit hook are built.
pg_bench_prepare() { # SCRIPT
  command -v pgbouncer >/dev/null || { echo "$1: pgbouncer is missing (apt-get install pgbouncer)" >&2; exit 1; }
  [ -x "$PGBIN/postgres" ] || { echo "$1: no PostgreSQL in $PGBIN (apt-get install postgresql-15)" >&2; exit 1; }
  [ -f "$(pg_config --pgxs 2>/dev/null)" ] || { echo "$1: no PGXS to build the hook (apt-get install postgresql-server-dev-15)" >&2; exit 1; }
  cargo build --release -q -p fence-proxy
  make -s -C proxy/pg-hook >/dev/null
}
