#!/usr/bin/env bash
# Runs the fault runner over lockd's high-availability mode for a range of seeds and sums
# what happened: runs, verdicts, each fault kind's count, and why lockd terms ended.
# docs/faults.md ("The high-availability campaign") holds a run of it.
#
#   cargo build --bins && examples/faults/campaign.sh              # seeds 1..200
#   FROM=1 TO=20 FAULTS_PER_RUN=6 examples/faults/campaign.sh
#
# Needs what `faults --backend etcd` needs: etcd and etcdctl, libfaketime (./x installs
# them). Exit status: 0 when every run held, 1 when a run found a violation or failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
FROM=${FROM:-1}
TO=${TO:-200}
FAULTS_PER_RUN=${FAULTS_PER_RUN:-6}
MODE=${MODE:-http}
OUT=${OUT:-$(mktemp -d /tmp/faults-campaign.XXXXXX)}
mkdir -p "$OUT"
[ -x target/debug/faults ] || { echo "build first: cargo build --bins" >&2; exit 2; }

held=0 violated=0 failed=0
started=$(date +%s)
for seed in $(seq "$FROM" "$TO"); do
  log="$OUT/run-$seed.txt"
  target/debug/faults --backend etcd --mode "$MODE" --seed "$seed" \
    --fault-count "$FAULTS_PER_RUN" --out "$OUT/run-$seed" >"$log" 2>&1
  case $? in
    0) held=$((held + 1)); verdict=held ;;
    1) violated=$((violated + 1)); verdict=VIOLATION ;;
    *) failed=$((failed + 1)); verdict=FAILED ;;
  esac
  echo "seed $seed: $verdict ($((($(date +%s) - started) / 60)) min so far)"
done

# The per-run counts: the lines under "faults injected:" and "lockd terms ended".
sum_section() {
  awk -v head="$1" '
    index($0, head) == 1 { on = 1; next }
    on && /^  / { n = $NF; $NF = ""; sub(/^ +/, ""); sub(/ +$/, ""); total[$0] += n; next }
    on { on = 0 }
    END { for (k in total) printf "  %-36s %d\n", k, total[k] }
  ' "$OUT"/run-*.txt | sort
}
echo
echo "runs: $((held + violated + failed)) (seeds $FROM..$TO, $FAULTS_PER_RUN faults each, --mode $MODE): $held held, $violated violated, $failed failed"
echo "faults injected, in all:"
sum_section "faults injected:"
echo "lockd terms ended, in all (why: how many):"
sum_section "lockd terms ended"
echo "refused by the fence, in all: $(awk -F': ' '/^writes refused by the fence/ { s += $2 } END { print s + 0 }' "$OUT"/run-*.txt)"
echo "logs: $OUT"
[ "$violated" -eq 0 ] && [ "$failed" -eq 0 ]
