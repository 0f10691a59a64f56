#!/usr/bin/env bash
# libkvpool's request engine, two builds side by side (not in make test):
# the same kvpoold servers, the `kvpool bench` of build A and of build B
# run in alternating rounds, medians printed with B/A ratios.
#
#   tests/bench/engine.sh A_BUILD_DIR B_BUILD_DIR [ROUNDS]
#
# A_BUILD_DIR and B_BUILD_DIR hold kvpool and kvpoold (make all); the
# servers are B's. ROUNDS (default 5) alternates A and B. Measures:
#   get4k_p50_us       4 KiB GET latency, 1 connection (p50 of each run)
#   get1m_gbps/put1m   1 MiB GET and PUT, 1 connection, 1 block per call
#   sync2_gbps         1 MiB GET+PUT, 2 connections (threads), one node
#   async8_gbps        1 MiB GET+PUT, 1 connection, 8 requests in flight
#   cl_sync3_gbps      1 MiB GET+PUT on three nodes, 3 connections on the
#                      cluster URL (three threads, blocking calls)
#   cl_async_gbps      1 MiB GET+PUT on three nodes, 1 connection driven
#                      asynchronously, 3 x 8 requests in flight
# (GB/s: 10^9 payload bytes per second, PUT and GET phases summed over
# their seconds). A figure a build cannot produce (e.g. async calls on a
# cluster handle before they existed) is "-". Other load on the machine
# skews every figure: compare the medians of interleaved rounds only.
set -euo pipefail
A=$1
B=$2
ROUNDS=${3:-5}
DUR=${DUR:-2}
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # $1 port
	"$B/kvpoold" --listen 127.0.0.1 --port "$1" --admin-port 0 --rdma-port 0 --threads 2 \
		--max-block-bytes 4MiB --dram-capacity 1GiB --log-level error &
	pids+=($!)
}
p1=$(port); start "$p1"
nodes=()
for i in 1 2 3; do p=$(port); start "$p"; nodes+=("127.0.0.1:$p"); done
one=tcp://127.0.0.1:$p1
list="tcp://$(IFS=,; echo "${nodes[*]}")"
sleep 2
echo "one node: $one   three: $list   (nproc $(nproc), load $(cut -d' ' -f1 /proc/loadavg))"

# bench BUILD URL ARGS...: one JSON line (empty when the run failed)
bench() {
	local b=$1 url=$2
	shift 2
	"$b/kvpool" bench --json --server "$url" --duration "$DUR" "$@" 2>/dev/null | tail -1 || true
}
# pick JSON OP FIELD
pick() {
	python3 -c 'import json,sys
try:
    d=json.loads(sys.argv[1]); print([r for r in d["results"] if r["op"]==sys.argv[2]][0][sys.argv[3]])
except Exception:
    print("-")' "$1" "$2" "$3"
}
# gbps of PUT and GET together: payload bytes over seconds
both() {
	python3 -c 'import json,sys
try:
    d=json.loads(sys.argv[1]); r=[x for x in d["results"] if x["op"] in ("put","get") and not x["errors"]]
    assert len(r)==2; print("%.3f" % (sum(x["blocks"]*x["block_bytes"] for x in r)/sum(x["seconds"] for x in r)/1e9))
except Exception:
    print("-")' "$1"
}

declare -A val
for r in $(seq "$ROUNDS"); do
	for w in A B; do
		b=$A; [ "$w" = B ] && b=$B
		j=$(bench "$b" "$one" --sizes 4KiB --ops put,get)
		val[$w,get4k_p50_us]+=" $(pick "$j" get p50_us)"
		j=$(bench "$b" "$one" --sizes 1MiB --ops put,get)
		val[$w,get1m_gbps]+=" $(pick "$j" get gbps)"
		val[$w,put1m_gbps]+=" $(pick "$j" put gbps)"
		val[$w,sync2_gbps]+=" $(both "$(bench "$b" "$one" --sizes 1MiB --ops put,get --connections 2)")"
		val[$w,async8_gbps]+=" $(both "$(bench "$b" "$one" --sizes 1MiB --ops put,get --async --inflight 8)")"
		val[$w,cl_sync3_gbps]+=" $(both "$(bench "$b" "$list" --sizes 1MiB --ops put,get --connections 3)")"
		val[$w,cl_async_gbps]+=" $(both "$(bench "$b" "$list" --sizes 1MiB --ops put,get --async --inflight 24)")"
		echo "round $r $w: get4k p50 ${val[$w,get4k_p50_us]##* } us, get1m ${val[$w,get1m_gbps]##* }," \
		     "put1m ${val[$w,put1m_gbps]##* }, sync2 ${val[$w,sync2_gbps]##* }," \
		     "async8 ${val[$w,async8_gbps]##* }, cl_sync3 ${val[$w,cl_sync3_gbps]##* }," \
		     "cl_async ${val[$w,cl_async_gbps]##* }"
	done
done
median() {
	python3 -c 'import statistics,sys
v=[float(x) for x in sys.argv[1:] if x!="-"]
print("%.3f" % statistics.median(v) if v else "-")' $1
}
printf '%-16s %10s %10s %8s\n' figure A B B/A
for k in get4k_p50_us get1m_gbps put1m_gbps sync2_gbps async8_gbps cl_sync3_gbps cl_async_gbps; do
	ma=$(median "${val[A,$k]}")
	mb=$(median "${val[B,$k]}")
	ratio=$(python3 -c 'import sys
try: print("%.2f" % (float(sys.argv[2])/float(sys.argv[1])))
except Exception: print("-")' "$ma" "$mb")
	printf '%-16s %10s %10s %8s\n' "$k" "$ma" "$mb" "$ratio"
done
for w in A B; do
	python3 -c 'import sys
try:
    a=float(sys.argv[2]); s=float(sys.argv[1]); print("%s: async8 / sync2 = %.2f" % (sys.argv[3], a/s))
except Exception: pass
try:
    a=float(sys.argv[5]); s=float(sys.argv[4]); print("%s: cl_async / cl_sync3 = %.2f" % (sys.argv[3], a/s))
except Exception: pass' "$(median "${val[$w,sync2_gbps]}")" "$(median "${val[$w,async8_gbps]}")" "$w" \
		"$(median "${val[$w,cl_sync3_gbps]}")" "$(median "${val[$w,cl_async_gbps]}")"
done
