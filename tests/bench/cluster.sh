#!/usr/bin/env bash
# Several nodes against one, in the same run (docs/cluster.md; not in make
# test): one kvpoold of 3*CAP and three of CAP each on loopback, then, in
# ROUNDS alternating rounds, `kvpool bench` against each:
#   - MATCH of a CHAIN-block chain (default 1000; placed per block): p50/p99 per match
#   - PUT and GET of 64 KiB blocks, BATCH per call: GB/s
# and the ratios cluster / single. Prints one summary line per figure.
#   BUILD=build tests/bench/cluster.sh
set -euo pipefail
BUILD=${BUILD:-build}
CAP=${CAP:-64MiB}
CAP3=${CAP3:-192MiB}
CHAIN=${CHAIN:-1000}
BATCH=${BATCH:-16}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-2}
kvpoold=$BUILD/kvpoold
kvpool=$BUILD/kvpool
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # $1 port, $2 capacity
	"$kvpoold" --listen 127.0.0.1 --port "$1" --admin-port 0 --rdma-port 0 --threads 1 \
		--max-block-bytes 1MiB --dram-capacity "$2" --log-level warn &
	pids+=($!)
}
p0=$(port); start "$p0" "$CAP3"
nodes=()
for i in 1 2 3; do p=$(port); start "$p" "$CAP"; nodes+=("127.0.0.1:$p"); done
list="tcp://$(IFS=,; echo "${nodes[*]}")"
sleep 1
single=tcp://127.0.0.1:$p0
echo "single: $single   cluster: $list   (nproc $(nproc), load $(cut -d' ' -f1 /proc/loadavg))"
bench() { # $1 url, $2 ops
	"$kvpool" bench --json --server "$1" --ops "$2" --sizes 64KiB --batch "$BATCH" \
		--duration "$DUR" --chain "$CHAIN"
}
pick() { # $1 json, $2 op, $3 field
	python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print([r for r in d["results"] if r["op"]==sys.argv[2]][0][sys.argv[3]])' "$1" "$2" "$3"
}
for r in $(seq "$ROUNDS"); do
	for which in single cluster; do
		url=$single; [ "$which" = cluster ] && url=$list
		j=$(bench "$url" put,get,match)
		echo "round $r $which: match p50 $(pick "$j" match p50_us) us p99 $(pick "$j" match p99_us) us;" \
		     "put $(pick "$j" put gbps) GB/s; get $(pick "$j" get gbps) GB/s"
	done
done
