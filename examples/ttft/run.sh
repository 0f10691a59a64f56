#!/usr/bin/env bash
# make demo-ttft: start kvpoold on a free loopback port, run the TTFT demo
# (examples/ttft/demo.py: the correctness checks, the 1k/2k/4k/8k sweep, the
# break-even point, the bandwidth comparison with `kvpool bench`, the
# Mooncake trace mode), print the report, and stop the server. The JSON
# report and the PNG go to $OUT_DIR (default $BUILD/ttft).
#
# The throttled panel (a pool slowed on purpose) needs root, ip and tc:
# a second kvpoold runs in a network namespace of its own whose loopback
# demo.py shapes with tc; without them (or with THROTTLE=0) it is skipped.
#
# torch's CPU matmuls go through the libblas.so.3 that the dynamic loader
# finds. Debian's alternatives may point it at the reference BLAS (netlib,
# ~8x slower than OpenBLAS on this machine); when OpenBLAS (pthread) is
# installed, the demo puts its directory first on LD_LIBRARY_PATH so that
# it is used whatever the system default is. demo.py prints which one ran.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
OUT_DIR=${OUT_DIR:-$BUILD/ttft}
PY=${KVPOOL_PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
DRAM=${DRAM:-1GiB}

openblas=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)/openblas-pthread
if [ -e "$openblas/libblas.so.3" ]; then
	export LD_LIBRARY_PATH="$openblas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# One pool of THREADS threads: torch's (set by the nodes) and OpenBLAS's own.
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
export KVPOOL_LIB="${KVPOOL_LIB:-$root/$BUILD/libkvpool.so}"
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
mkdir -p "$OUT_DIR"

url= pid= slow_ns= slow_pid= slow_url=
log=$(mktemp /tmp/kvpoold-ttft.XXXXXX.log)
slow_log=$(mktemp /tmp/kvpoold-ttft-slow.XXXXXX.log)
cleanup() { [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; pid=; }
cleanup_slow() {
	[ -n "$slow_pid" ] && { kill -TERM "$slow_pid" 2>/dev/null || true; wait "$slow_pid" 2>/dev/null || true; }
	slow_pid=
	[ -n "$slow_ns" ] && ip netns del "$slow_ns" 2>/dev/null
	slow_ns=
}
trap 'cleanup; cleanup_slow; rm -f "$log" "$slow_log"' EXIT
for _ in 1 2 3 4 5 6 7 8; do
	port=$((20000 + RANDOM % 40000))
	"$BUILD/kvpoold" --listen 127.0.0.1 --port "$port" --admin-port 0 --dram-capacity "$DRAM" \
		--threads 2 --log-level warn 2>"$log" &
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

echo "== kvpoold on $url, dram_capacity $DRAM"

# The slowed pool: its own network namespace (only a loopback in it), a
# kvpoold there; demo.py shapes that loopback with tc.
if [ "${THROTTLE:-1}" = 1 ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null; then
	slow_ns=kvpool-ttft-$$
	if ip netns add "$slow_ns" 2>/dev/null && ip netns exec "$slow_ns" ip link set lo up; then
		ip netns exec "$slow_ns" "$BUILD/kvpoold" --listen 127.0.0.1 --port 7470 --admin-port 0 \
			--rdma-port 0 --dram-capacity 256MiB --threads 2 --log-level warn 2>"$slow_log" &
		slow_pid=$!
		for _ in $(seq 1 100); do
			if ip netns exec "$slow_ns" "$BUILD/kvpool" ping --server tcp://127.0.0.1:7470 >/dev/null 2>&1; then
				slow_url=tcp://127.0.0.1:7470; break
			fi
			kill -0 "$slow_pid" 2>/dev/null || break
			sleep 0.1
		done
	fi
	[ -n "$slow_url" ] || { echo "(the throttled panel is skipped: no kvpoold in a network namespace)"; cat "$slow_log"; cleanup_slow; }
else
	echo "(the throttled panel is skipped: it needs root, ip and tc; THROTTLE=${THROTTLE:-1})"
fi
rc=0
"$PY" examples/ttft/demo.py --url "$url" --threads "$THREADS" --kvpool-cli "$BUILD/kvpool" \
	--slow-url "$slow_url" --slow-netns "$slow_ns" \
	--json "$OUT_DIR/ttft.json" --png "$OUT_DIR/ttft.png" "$@" || rc=$?
cleanup
cleanup_slow
if [ -s "$log" ]; then echo "== kvpoold log (warnings and errors)"; cat "$log"; fi
exit $rc
