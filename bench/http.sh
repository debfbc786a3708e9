#!/usr/bin/env bash
# Reproduces the fence-proxy (HTTP) part of BENCHMARKS.md: wrk against an upstream directly,
# through nginx as a reverse proxy with upstream keep-alive, and through fence-proxy on an
# unfenced and a fenced route; then fence-proxy's memory with a million marks. One run, one
# machine. Needs nginx and wrk (apt-get install nginx wrk); about 3 minutes.
#
#   bench/http.sh
#   SECONDS_PER_RUN=5 MARKS=100000 bench/http.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${SECONDS_PER_RUN:-10}
CONNS=${CONNECTIONS:-64}
MARKS=${MARKS:-1000000}
OUT=${OUT:-$(mktemp -d /tmp/httpbench.XXXXXX)}
mkdir -p "$OUT"
# A fresh marks store: marks left by an earlier run would be loaded at start and make the
# memory figure a measure of loading, not of filling.
rm -rf "$OUT/fence-proxy"
for b in nginx wrk; do
  command -v "$b" >/dev/null || { echo "bench/http.sh: $b is missing (apt-get install nginx wrk)" >&2; exit 1; }
done
cargo build --release -q -p fence-proxy -p http-relay --example fill_marks
. bench/common.sh

# The upstream: nginx answering 200 "ok" to everything.
cat >"$OUT/upstream.conf" <<CONF
worker_processes auto; daemon off; pid $OUT/upstream.pid; error_log $OUT/upstream.err warn;
events { worker_connections 8192; }
http { access_log off;
  server { listen 127.0.0.1:18080; keepalive_requests 10000000; location / { return 200 "ok\n"; } } }
CONF
# The alternative a user would pick: nginx as a reverse proxy, upstream keep-alive.
cat >"$OUT/proxy.conf" <<CONF
worker_processes auto; daemon off; pid $OUT/proxy.pid; error_log $OUT/proxy.err warn;
events { worker_connections 8192; }
http { access_log off;
  upstream app { server 127.0.0.1:18080; keepalive 256; }
  server { listen 127.0.0.1:18081; keepalive_requests 10000000;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; } } }
CONF
nginx -c "$OUT/upstream.conf" -p "$OUT" & pids+=("$!")
nginx -c "$OUT/proxy.conf" -p "$OUT" & pids+=("$!")
target/release/fence-proxy http --listen 127.0.0.1:18420 --upstream http://127.0.0.1:18080 \
  --data-dir "$OUT/fence-proxy" --log warn 2>"$OUT/fence-proxy.log" &
FP=$!; pids+=("$FP")
wait_port 18080; wait_port 18081; wait_port 18420

cat >"$OUT/fenced.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "count=7"
wrk.headers["Fencing-Resource"] = "inventory:sku-1"
wrk.headers["Fencing-Token"] = "42"
LUA
RESULTS="$OUT/results.txt"; : >"$RESULTS"
run() { # name url [script]
  local name=$1 url=$2 script=${3:-}
  sync
  echo "== $name" | tee -a "$RESULTS" >&2
  wrk -t2 -c"$CONNS" -d"${RUN}s" --latency ${script:+-s "$script"} "$url" | tee -a "$RESULTS" >&2
}
run "direct GET" http://127.0.0.1:18080/inventory/sku-1
run "nginx GET" http://127.0.0.1:18081/inventory/sku-1
run "fence-proxy GET (unfenced)" http://127.0.0.1:18420/inventory/sku-1
run "nginx POST" http://127.0.0.1:18081/inventory/sku-1 "$OUT/fenced.lua"
run "fence-proxy POST (fenced, steady token)" http://127.0.0.1:18420/inventory/sku-1 "$OUT/fenced.lua"

# Memory: MARKS distinct resources, each raised once (a durable write each).
rss() { awk '/^VmRSS/ {print $2}' "/proc/$FP/status"; }
before=$(rss)
echo "== fill: $MARKS marks" | tee -a "$RESULTS" >&2
target/release/examples/fill_marks http://127.0.0.1:18420 "$MARKS" 64 | tee -a "$RESULTS" >&2
after=$(rss)
echo "rss_before_kib=$before rss_after_kib=$after marks=$(du -k "$OUT/fence-proxy/marks.redb" | cut -f1)kib" | tee -a "$RESULTS" >&2
python3 bench/http_table.py "$RESULTS" "$MARKS"
