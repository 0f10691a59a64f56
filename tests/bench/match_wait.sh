#!/usr/bin/env bash
# Wake-up latency of a MATCH that waits for blocks (tests/bench/match_wait.c):
# 1,000 waiting MATCHes kept parked on loopback; each round times a PUT that
# nobody waits for (the baseline) and a PUT that completes the oldest
# parked MATCH, up to that MATCH's reply; the server's own figure (commit
# of the block -> reply queued) comes from STATS. ROUNDS runs, each against
# a fresh kvpoold.
#   tests/bench/match_wait.sh [BUILD]   (env: ROUNDS=3 PARKED=1000 WAKES=2000 CONNS=10
#                                        BLOCK=4096 THREADS=2)
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
PARKED=${PARKED:-1000}
WAKES=${WAKES:-2000}
CONNS=${CONNS:-10}
BLOCK=${BLOCK:-4096}
THREADS=${THREADS:-2}
PY=${PYTHON:-/usr/bin/python3}
port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SRV_PID=
cleanup() { [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null || true; }
trap cleanup EXIT

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
	p=$(port)
	"$BUILD/kvpoold" --port "$p" --admin-port 0 --rdma-port 0 --dram-capacity 512MiB \
		--threads "$THREADS" --log-level warn --max-conn-match-waits "$PARKED" 2>/dev/null &
	SRV_PID=$!
	for _ in $(seq 100); do "$BUILD/kvpool" ping --server "tcp://127.0.0.1:$p" >/dev/null 2>&1 && break; sleep 0.1; done
	echo "== run $r"
	"$BUILD/tests/match_wait" --port "$p" --parked "$PARKED" --rounds "$WAKES" --conns "$CONNS" \
		--block-bytes "$BLOCK"
	kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=
done
