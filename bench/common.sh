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
