#!/usr/bin/env bash
# make demo: start kvpoold on a free loopback port with a DRAM tier smaller
# than the bundled trace's working set (so eviction happens), replay the
# Mooncake FAST'25 synthetic trace, print the replay report and the server's
# stats, and stop the server.
set -euo pipefail
BUILD=${BUILD:-build}
TRACE=${TRACE:-tests/data/synthetic_trace.jsonl}
BLOCK_BYTES=${BLOCK_BYTES:-64KiB}
# The trace has 43,924 distinct blocks (2.68 GiB at 64 KiB): 512 MiB holds ~19%.
DRAM=${DRAM:-512MiB}

# Pick a random free port: kvpoold exits at once when the bind fails.
url= pid=
log=$(mktemp /tmp/kvpoold-demo.XXXXXX.log)
cleanup() { [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; pid=; }
trap cleanup EXIT
for _ in 1 2 3 4 5 6 7 8; do
	port=$((20000 + RANDOM % 40000))
	"$BUILD/kvpoold" --listen 127.0.0.1 --port "$port" --admin-port 0 --dram-capacity "$DRAM" --log-level warn 2>"$log" &
	pid=$!
	for _ in $(seq 1 100); do
		if "$BUILD/kvpool" ping --server "tcp://127.0.0.1:$port" >/dev/null 2>&1; then
			url="tcp://127.0.0.1:$port"; break 2
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	cleanup
done
[ -n "$url" ] || { echo "kvpoold failed to start:"; cat "$log"; exit 2; }

echo "== kvpoold on $url, dram_capacity $DRAM; replaying $TRACE with $BLOCK_BYTES blocks"
"$BUILD/kvpool" replay --server "$url" --block-bytes "$BLOCK_BYTES" "$TRACE"
echo
echo "== kvpool stats"
"$BUILD/kvpool" stats --server "$url"
cleanup
trap - EXIT
if [ -s "$log" ]; then echo "== kvpoold log (warnings and errors)"; cat "$log"; fi
rm -f "$log"
