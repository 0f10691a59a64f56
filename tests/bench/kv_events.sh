#!/usr/bin/env bash
# PUT throughput of 64 KiB blocks with KV events off, and on with a
# subscriber attached that decodes every batch (docs/events.md), in the
# same run: ROUNDS rounds, alternating (odd rounds off first, even rounds
# on first), each against a fresh kvpoold.
#   tests/bench/kv_events.sh [BUILD]    (env: ROUNDS=3 DURATION=3 BATCH=16 CONNS=2)
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
BATCH=${BATCH:-16}
CONNS=${CONNS:-2}
PY=${PYTHON:-/usr/bin/python3}
port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SUB_PID= ; SRV_PID=
cleanup() {
	[ -n "$SUB_PID" ] && kill "$SUB_PID" 2>/dev/null || true
	[ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null || true
}
trap cleanup EXIT

one() { # $1 = off | on
	local p pub out
	p=$(port)
	pub=$(port)
	local extra=()
	[ "$1" = on ] && extra=(--kv-events-endpoint "tcp://127.0.0.1:$pub")
	"$BUILD/kvpoold" --port "$p" --admin-port 0 --rdma-port 0 --dram-capacity 1GiB \
		--threads 2 "${extra[@]}" 2>/dev/null &
	SRV_PID=$!
	for _ in $(seq 100); do "$BUILD/kvpool" ping --server "tcp://127.0.0.1:$p" >/dev/null 2>&1 && break; sleep 0.1; done
	if [ "$1" = on ]; then
		$PY - "tcp://127.0.0.1:$pub" <<'PYEOF' &
import sys, zmq, msgpack
s = zmq.Context().socket(zmq.SUB)
s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect(sys.argv[1])
n = 0
while True:
    topic, seq, payload = s.recv_multipart()
    n += len(msgpack.unpackb(payload)[1])
PYEOF
		SUB_PID=$!
	fi
	# the same wait for both: the subscriber joins, and kvpoold's arena
	# fault-in at start-up (a background thread) gets as far in either case
	sleep "${SETTLE:-2}"
	out=$("$BUILD/kvpool" bench --server "tcp://127.0.0.1:$p" --sizes 64KiB --ops put \
		--duration "$DURATION" --batch "$BATCH" --connections "$CONNS" --source-bytes 64MiB --json)
	if [ "$1" = on ]; then
		"$BUILD/kvpool" stats --json --server "tcp://127.0.0.1:$p" 2>/dev/null |
			$PY -c 'import json,sys; e=json.load(sys.stdin)["kv_events"]; print("  events: produced %d published %d dropped %d batches %d" % (e["produced"], e["published"], e["dropped"], e["batches"]), file=sys.stderr)' || true
		kill "$SUB_PID"; wait "$SUB_PID" 2>/dev/null || true; SUB_PID=
	fi
	kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=
	echo "$out" | $PY -c 'import json,sys; r=[x for x in json.load(sys.stdin)["results"] if x["op"]=="put"][0]; print("%.0f %.3f" % (r["blocks_per_s"], r["gbps"]))'
}

# alternating which goes first, so neither always follows the other
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then
		off=$(one off)
		on=$(one on)
	else
		on=$(one on)
		off=$(one off)
	fi
	echo "round $r: events off ${off% *} blocks/s (${off#* } GB/s), on+subscriber ${on% *} blocks/s (${on#* } GB/s), ratio $($PY -c "print('%.3f' % (${on% *}/${off% *}))")"
done
