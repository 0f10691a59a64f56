#!/usr/bin/env bash
# make demo-pd: the prefill -> decode hand-off through kvpool
# (examples/pd/pd_demo.py: a router, a prefill node and a decode node, the
# reference decoder of examples/ttft; the demo starts and restarts its own
# kvpoold). The JSON report and the PNG go to $OUT_DIR (default $BUILD/pd).
# Arguments are passed to pd_demo.py (--help lists them).
#
# torch's CPU matmuls go through the libblas.so.3 the dynamic loader finds:
# OpenBLAS (pthread) is put first when installed, as in examples/ttft/run.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
OUT_DIR=${OUT_DIR:-$BUILD/pd}
PY=${KVPOOL_PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}

openblas=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)/openblas-pthread
if [ -e "$openblas/libblas.so.3" ]; then
	export LD_LIBRARY_PATH="$openblas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
# Two node processes share the cores: threads that spin while they wait for
# work (OpenMP's default) steal them from the other node; here a one-token
# forward pass went from ~25 ms to ~200-300 ms on a busy 2-core machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export KVPOOL_LIB="${KVPOOL_LIB:-$root/$BUILD/libkvpool.so}"
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
mkdir -p "$OUT_DIR"
log="$OUT_DIR/kvpoold.log"
: > "$log"
rc=0
"$PY" examples/pd/pd_demo.py --kvpoold "$BUILD/kvpoold" --kvpool-cli "$BUILD/kvpool" \
	--threads "$THREADS" --json "$OUT_DIR/pd.json" --png "$OUT_DIR/pd.png" \
	--server-log "$log" "$@" || rc=$?
if [ -s "$log" ]; then echo "== kvpoold log (warnings and errors)"; cat "$log"; fi
exit $rc
