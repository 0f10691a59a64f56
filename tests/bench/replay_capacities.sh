#!/usr/bin/env bash
# Replay the bundled trace at several DRAM capacities (fractions of the
# trace's 43,924 distinct blocks) and print hit ratio and GB/s per capacity,
# with iperf3's single-stream loopback figure measured in the same run.
#   tests/bench/replay_capacities.sh [BLOCK_BYTES (default 65536)]
# Needs a built tree (make). iperf3 is optional.
set -euo pipefail
BUILD=${BUILD:-build}
TRACE=${TRACE:-tests/data/synthetic_trace.jsonl}
block=${1:-65536}
distinct=43924
page=4096
slot=$(( (block + page - 1) / page * page ))

run_one() { # $1 = capacity in blocks
	local blocks=$1 cap port pid json
	cap=$((blocks * slot))
	[ "$cap" -lt 1048576 ] && cap=1048576
	port=$((20000 + RANDOM % 40000))
	"$BUILD/kvpoold" --port "$port" --admin-port 0 --dram-capacity "$cap" --max-inflight-put-bytes "$cap" \
		--log-level error &
	pid=$!
	for _ in $(seq 1 50); do "$BUILD/kvpool" ping --server "tcp://127.0.0.1:$port" >/dev/null 2>&1 && break; sleep 0.1; done
	json=$("$BUILD/kvpool" replay --json --server "tcp://127.0.0.1:$port" --block-bytes "$block" "$TRACE" || true)
	kill -TERM "$pid"; wait "$pid" || true
	printf '%-10s %-12s %s\n' "$blocks" "$cap" "$json"
}

echo "block_bytes=$block distinct_blocks=$distinct"
printf '%-10s %-12s %s\n' "blocks" "dram_bytes" "replay report"
for frac in 0.10 0.40 1.00; do
	run_one "$(awk -v d="$distinct" -v f="$frac" 'BEGIN { printf "%d", d * f + 0.5 }')"
done
if command -v iperf3 >/dev/null; then
	p=$((20000 + RANDOM % 40000))
	iperf3 -s -1 -p "$p" >/dev/null 2>&1 &
	sleep 0.5
	bps=$(iperf3 -c 127.0.0.1 -p "$p" -t 5 -f k | awk '/receiver/ {print $(NF-2), $(NF-1)}')
	echo "iperf3 single stream loopback: $bps"
fi
