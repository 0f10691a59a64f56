#!/usr/bin/env bash
# make demo-nvme: replay the bundled Mooncake synthetic trace three times on
# the same small DRAM tier, each on a fresh kvpoold on a free loopback port:
#   1. DRAM only;
#   2. DRAM plus an NVMe tier well above it (nvme_admission = all);
#   3. the same with nvme_admission = reused.
# Prints each run's hit ratio and the NVMe bytes written, and the full
# `kvpool stats` of run 2. Fails (exit 1) unless the two-tier hit ratio
# beats DRAM alone. The NVMe directories are temporary and removed.
#
# Environment: BUILD (build), TRACE, BLOCK_BYTES (64KiB), DRAM (256MiB),
# NVME (4GiB), NVME_BASE (where the tier directories go: $TMPDIR or /tmp;
# point it at an SSD to see real disk figures).
set -euo pipefail
BUILD=${BUILD:-build}
TRACE=${TRACE:-tests/data/synthetic_trace.jsonl}
BLOCK_BYTES=${BLOCK_BYTES:-64KiB}
# The trace has 43,924 distinct blocks (2.68 GiB at 64 KiB): 256 MiB of DRAM
# holds under a tenth of them, 4 GiB of NVMe all of them.
DRAM=${DRAM:-256MiB}
NVME=${NVME:-4GiB}
NVME_BASE=${NVME_BASE:-${TMPDIR:-/tmp}}

url= pid= dir=
log=$(mktemp /tmp/kvpoold-demo-nvme.XXXXXX.log)
stop_server() {
	if [ -n "$pid" ]; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	pid=
}
cleanup() {
	stop_server
	[ -n "$dir" ] && rm -rf "$dir"
	dir=
}
trap 'cleanup; rm -f "$log"' EXIT

# start_server FLAGS...: kvpoold on a random free port, waiting for a PING
# (an NVMe tier rebuilds its index before the port opens).
start_server() {
	url=
	for _ in 1 2 3 4 5 6 7 8; do
		port=$((20000 + RANDOM % 40000))
		"$BUILD/kvpoold" --listen 127.0.0.1 --port "$port" --admin-port 0 --dram-capacity "$DRAM" \
			--log-level warn "$@" 2>>"$log" &
		pid=$!
		for _ in $(seq 1 300); do
			if "$BUILD/kvpool" ping --server "tcp://127.0.0.1:$port" >/dev/null 2>&1; then
				url="tcp://127.0.0.1:$port"
				return 0
			fi
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		stop_server
	done
	echo "kvpoold failed to start:"
	cat "$log"
	exit 2
}

# json_num KEY TEXT: the first number after "KEY": in TEXT (our own JSON:
# compact, and every key used here is unique in its document).
json_num() {
	grep -o "\"$1\":[0-9.]*" <<<"$2" | head -n 1 | cut -d: -f2
}

# json_errnos KEY TEXT: the {"ENOSPC":3,...} object under KEY as
# "ENOSPC 3, ..." or "none".
json_errnos() {
	local o
	o=$(grep -o "\"$1\":{[^}]*}" <<<"$2" | head -n 1 | sed -e 's/^[^{]*{//' -e 's/}$//' \
		-e 's/"//g' -e 's/:/ /g' -e 's/,/, /g')
	echo "${o:-none}"
}

# stats_busy: STATS ops.put.errors and ops.errors.busy of the last run
# ($stats), as "put errors N, busy N".
stats_busy() {
	local put
	put=$(grep -o '"put":{"requests":[^}]*}' <<<"$stats" | head -n 1)
	echo "put errors $(json_num errors "$put"), busy $(json_num busy "$stats")"
}

# outcome: what happened to the last run's puts and gets. A block the
# server answers BUSY (in-flight bytes at the limit, DRAM waiting for NVMe
# writes) is sent again by the replay; STATS counts every such answer in
# ops.put.errors and ops.errors.busy even when the retry succeeds, so the
# retries are shown next to those counts, then what still failed.
outcome() {
	echo "puts retried after BUSY $(json_num put_retries "$report") blocks" \
		"(server STATS: $(stats_busy)), put failures $(json_errnos put_errors "$report");" \
		"gets retried after BUSY $(json_num get_retries "$report") blocks," \
		"get failures $(json_errnos get_errors "$report")"
}

# replay_run LABEL FLAGS...: start, replay, remember the figures, stop.
# Leaves the report in $report and the stats in $stats.
replay_run() {
	local label=$1
	shift
	start_server "$@"
	echo "== $label: replaying $TRACE with $BLOCK_BYTES blocks on $url"
	report=$("$BUILD/kvpool" replay --json --server "$url" --block-bytes "$BLOCK_BYTES" "$TRACE")
	stats=$("$BUILD/kvpool" stats --json --server "$url")
	if [ "$(json_num wrong_blocks "$report")" != 0 ]; then
		echo "replay returned wrong blocks: $report"
		exit 1
	fi
}

fresh_dir() {
	cleanup
	dir=$(mktemp -d "$NVME_BASE/kvpool-demo-nvme.XXXXXX")
}

replay_run "DRAM only (dram_capacity $DRAM)"
dram_ratio=$(json_num hit_ratio "$report")
ideal_ratio=$(json_num ideal_hit_ratio "$report")
dram_errors=$(outcome)
stop_server

fresh_dir
replay_run "DRAM $DRAM + NVMe $NVME (nvme_admission all)" \
	--nvme-dir "$dir" --nvme-capacity "$NVME" --nvme-admission all
all_ratio=$(json_num hit_ratio "$report")
all_written=$(json_num bytes_written "$stats")
all_demotions=$(json_num demotions "$stats")
all_rewritten=$(json_num rewritten_bytes "$stats")
all_errors=$(outcome)
echo
echo "== kvpool stats after the two-tier replay (nvme_admission all)"
"$BUILD/kvpool" stats --server "$url"
stop_server

fresh_dir
replay_run "DRAM $DRAM + NVMe $NVME (nvme_admission reused)" \
	--nvme-dir "$dir" --nvme-capacity "$NVME" --nvme-admission reused
reused_ratio=$(json_num hit_ratio "$report")
reused_written=$(json_num bytes_written "$stats")
reused_demotions=$(json_num demotions "$stats")
reused_rejections=$(json_num admission_rejections "$stats")
reused_rewritten=$(json_num rewritten_bytes "$stats")
reused_errors=$(outcome)
cleanup

gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }
echo
echo "== hit ratio on $TRACE ($BLOCK_BYTES blocks, dram_capacity $DRAM, nvme_capacity $NVME)"
row="  %-31s %9s %13s %10s %13s\n"
printf "$row" "pool" "hit ratio" "nvme written" "demotions" "reclaim wrote"
printf "$row" "DRAM only" "$dram_ratio" "-" "-" "-"
printf "$row" "DRAM + NVMe, admission all" "$all_ratio" "$(gib "$all_written")" \
	"$all_demotions" "$(gib "$all_rewritten")"
printf "$row" "DRAM + NVMe, admission reused" "$reused_ratio" "$(gib "$reused_written")" \
	"$reused_demotions" "$(gib "$reused_rewritten")"
printf "$row" "ideal (infinite cache)" "$ideal_ratio" "" "" ""
echo "  admission reused turned away $reused_rejections blocks (evicted instead of written)"
echo "  DRAM only: $dram_errors"
echo "  admission all: $all_errors"
echo "  admission reused: $reused_errors"
if [ -s "$log" ]; then echo "== kvpoold log (warnings and errors)"; cat "$log"; fi
if awk -v a="$all_ratio" -v d="$dram_ratio" 'BEGIN { exit !(a > d) }'; then
	echo "two-tier hit ratio $all_ratio > DRAM-only $dram_ratio: ok"
else
	echo "FAIL: two-tier hit ratio $all_ratio is not above DRAM-only $dram_ratio"
	exit 1
fi
