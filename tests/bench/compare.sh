#!/usr/bin/env bash
# kvpool against the wire limit, iperf3, redis-server and memcached, in one
# run on this machine, over loopback TCP, at the same connection count and
# pipelining depth.
#
#   tests/bench/compare.sh [--quick] [--connections C] [--depth P] [--sizes LIST]
#
# C: 1..256 (default 2); P: blocks in flight per connection, 1..1024 (the
# server's max_batch_blocks; default 4); LIST: comma-separated, from
# 64KiB,256KiB,1MiB,4MiB,16MiB. C x P x the largest size must be at most
# 1 GiB (the in-flight PUT bytes the kvpoold started here accepts). A bad
# option prints the usage and exits 2 before anything runs.
#
# Measures, per block size (64KiB 256KiB 1MiB 4MiB 16MiB; --quick: 1MiB):
#   wire     tests/bench/wire: no protocol, C connections, P messages in
#            flight each, sent from a 1 GiB buffer; run before and again
#            after kvpool, and the higher figure of the two is the limit
#            (loopback throughput drifts with what else the machine does)
#   kvpool   kvpool bench --connections C --batch P against a kvpoold started
#            here (2 worker threads, arena faulted in before measuring);
#            every GET block is checked byte by byte
#   redis    redis-server (Debian) with persistence off, driven by
#            redis-benchmark -t set,get -d SIZE -c C -P P --threads C over a
#            keyspace of about 256 MiB, after an untimed SET pass that warms
#            its allocator; STRLEN checks the value size. Its transparent huge
#            pages stay on (disable-thp no), as kvpoold's arena and the
#            benchmark buffers use them: on some virtual machines copies
#            through 4 KiB pages run several times slower.
# and once: iperf3 -P C (bits/s converted to bytes/s), memcached via
# memcaslap (Debian's libmemcached-tools: no pipelining and values of at
# most 1 MiB, so only a 1 MiB 50/50 set/get mix), MATCH of a 1,000-block
# chain, and kvpoold with 1 and 2 worker threads at 1 MiB.
#
# Prints a table of GB/s (10^9 bytes/s) with ratios kvpool/redis and
# kvpool/wire, and as its last line one compact JSON object with keys
# {get,put}_{64KiB,256KiB,1MiB,4MiB,16MiB}_{kvpool,redis}_gbps, wire_gbps
# (1 MiB), iperf3_gbps, and a few more (null: not measured).
#
# Stops by itself within 5 minutes (--quick: about a minute). Missing
# Debian packages (redis-server, redis-tools, memcached, libmemcached-tools,
# iperf3) are installed with apt-get when run as root; a tool that is still
# missing is skipped and its figures are null. Needs a built tree
# (make bench; BUILD=dir as for make). Other load on the machine skews
# every figure: run it on an idle machine.
set -uo pipefail

BUILD=${BUILD:-build}
QUICK=0
CONNS=2
DEPTH=4
SIZES=
ALL_SIZES="64KiB 256KiB 1MiB 4MiB 16MiB"
MAX_INFLIGHT_BYTES=$((1 << 30))   # kvpoold's --max-inflight-put-bytes below

usage() {
	echo "usage: compare.sh [--quick] [--connections C] [--depth P] [--sizes LIST] (--help for more)"
}
# A bad command line: say what is wrong, the usage, exit 2.
bad_usage() {
	echo "compare.sh: $*" >&2
	usage >&2
	exit 2
}
# The value of option $1, which must be there ($# counts it): else exit 2.
need_value() {
	[ "$2" -ge 2 ] || bad_usage "$1 needs a value"
}
# Check that $2 (the value of option $1) is an integer in $3..$4.
check_int() {
	[[ "$2" =~ ^[0-9]{1,7}$ ]] && [ $((10#$2)) -ge "$3" ] && [ $((10#$2)) -le "$4" ] ||
		bad_usage "$1 must be an integer in $3..$4, not '$2'"
}
# Check a --sizes list: comma-separated known sizes, each at most once.
check_sizes() {
	local s seen=" "
	[ -n "$1" ] || bad_usage "--sizes needs at least one of ${ALL_SIZES// /,}"
	for s in ${1//,/ }; do
		[[ " $ALL_SIZES " == *" $s "* ]] || bad_usage "unknown block size '$s' (known: ${ALL_SIZES// /,})"
		[[ "$seen" == *" $s "* ]] && bad_usage "block size $s given twice"
		seen+="$s "
	done
	[[ "$1" != *,,* && "$1" != ,* && "$1" != *, ]] || bad_usage "empty item in --sizes '$1'"
}

while [ $# -gt 0 ]; do
	case "$1" in
	--quick) QUICK=1 ;;
	--connections) need_value "$1" $#; check_int "$1" "$2" 1 256; CONNS=$((10#$2)); shift ;;
	--depth) need_value "$1" $#; check_int "$1" "$2" 1 1024; DEPTH=$((10#$2)); shift ;;
	--sizes) need_value "$1" $#; check_sizes "$2"; SIZES=${2//,/ }; shift ;;
	-h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) bad_usage "unknown argument '$1'" ;;
	esac
	shift
done
# Every block in flight at once must fit kvpoold's in-flight PUT bound.
largest=0
for s in ${SIZES:-$ALL_SIZES}; do
	case "$s" in *KiB) b=$((${s%KiB} << 10)) ;; *) b=$((${s%MiB} << 20)) ;; esac
	[ "$b" -gt "$largest" ] && largest=$b
done
[ $((CONNS * DEPTH * largest)) -le "$MAX_INFLIGHT_BYTES" ] ||
	bad_usage "--connections $CONNS x --depth $DEPTH blocks of $((largest >> 10)) KiB exceed the 1 GiB in flight kvpoold accepts here"

if [ "$QUICK" = 1 ]; then
	SIZES=${SIZES:-1MiB}
	DUR=1.5          # seconds per kvpool phase and per wire size
	ARENA=1GiB
	LIMIT_S=100
else
	SIZES=${SIZES:-$ALL_SIZES}
	DUR=2
	ARENA=2GiB
	LIMIT_S=285
fi
START_S=$SECONDS
TMP=$(mktemp -d /tmp/kvpool-compare.XXXXXX)
PIDS=()

cleanup() {
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "compare.sh: $*" >&2; }
elapsed() { echo $((SECONDS - START_S)); }
# Seconds left before the overall limit (never below 1).
left() { local l=$((LIMIT_S - $(elapsed))); [ "$l" -lt 1 ] && l=1; echo "$l"; }
# Is there still `need` seconds of budget?
have_time() { [ $((LIMIT_S - $(elapsed))) -ge "$1" ]; }
bytes_of() { # 64KiB -> 65536
	local n=${1%[KMG]iB} u=${1#"${1%[KMG]iB}"}
	case "$u" in KiB) echo $((n << 10)) ;; MiB) echo $((n << 20)) ;; GiB) echo $((n << 30)) ;; *) echo "$n" ;; esac
}
port() { echo $((20000 + RANDOM % 40000)); }
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.3f", b / s / 1e9; else print "null" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "null" && b != "null" && b > 0) printf "%.2f", a / b; else print "-" }'; }

# ---- tools ------------------------------------------------------------------

install_missing() {
	local want=() bin pkg
	for pair in redis-server:redis-server redis-benchmark:redis-tools memcached:memcached \
		memcaslap:libmemcached-tools iperf3:iperf3; do
		bin=${pair%%:*} pkg=${pair#*:}
		command -v "$bin" >/dev/null || want+=("$pkg")
	done
	[ ${#want[@]} -eq 0 ] && return
	if [ "$(id -u)" = 0 ]; then
		log "installing ${want[*]}"
		DEBIAN_FRONTEND=noninteractive timeout 120 apt-get install -y -qq "${want[@]}" \
			>"$TMP/apt.log" 2>&1 || log "apt-get install failed (see above); going on without"
	else
		log "missing ${want[*]} (not root: not installing)"
	fi
}

if [ ! -x "$BUILD/kvpoold" ] || [ ! -x "$BUILD/kvpool" ] || [ ! -x "$BUILD/tests/wire" ]; then
	log "building ($BUILD)"
	make -s BUILD="$BUILD" bench >"$TMP/make.log" 2>&1 || { cat "$TMP/make.log" >&2; exit 2; }
fi
install_missing

declare -A R  # results: R[op_size_tool] = GB/s or null

# ---- wire and iperf3 ----------------------------------------------------------

run_wire() {
	local list
	list=$(echo "$SIZES" | tr ' ' ',')
	log "wire: $list, $CONNS connections, depth $DEPTH"
	timeout "$(left)" "$BUILD/tests/wire" --sizes "$list" --connections "$CONNS" --depth "$DEPTH" \
		--duration "$DUR" --json >"$TMP/wire.json" 2>"$TMP/wire.err" || log "wire failed: $(cat "$TMP/wire.err")"
	for s in $SIZES; do
		local v
		v=$(grep "\"size_bytes\":$(bytes_of "$s")," "$TMP/wire.json" |
			sed -n 's/.*"gbps":\([0-9.]*\).*/\1/p')
		# keep the higher of this run and an earlier one
		if [ -n "$v" ] && { [ "${R[wire_$s]:-null}" = null ] ||
			awk -v a="$v" -v b="${R[wire_$s]}" 'BEGIN { exit !(a > b) }'; }; then
			R[wire_$s]=$v
		fi
		R[wire_$s]=${R[wire_$s]:-null}
	done
}

run_iperf3() {
	local p
	R[iperf3]=null
	command -v iperf3 >/dev/null || return
	p=$(port)
	iperf3 -s -1 -p "$p" >/dev/null 2>&1 &
	PIDS+=($!)
	sleep 0.5
	R[iperf3]=$(timeout 20 iperf3 -c 127.0.0.1 -p "$p" -P "$CONNS" -t 3 -f g 2>/dev/null |
		awk '/receiver/ { v = $(NF-2) } END { if (v != "") printf "%.3f", v / 8; else print "null" }')
	log "iperf3 -P $CONNS: ${R[iperf3]} GB/s"
}

# ---- kvpoold and kvpool bench ------------------------------------------------

# Start kvpoold with $1 worker threads; wait until it answers and its arena
# is faulted in (its resident size reaches the arena). Sets KV_PID, KV_URL.
start_kvpoold() {
	local threads=$1 p arena_kb rss
	arena_kb=$(( $(bytes_of "$ARENA") / 1024 ))
	for _ in 1 2 3; do
		p=$(port)
		"$BUILD/kvpoold" --port "$p" --admin-port 0 --threads "$threads" --dram-capacity "$ARENA" \
			--max-inflight-put-bytes "$MAX_INFLIGHT_BYTES" --log-level warn 2>>"$TMP/kvpoold.err" &
		KV_PID=$!
		PIDS+=("$KV_PID") # killed by the trap even if interrupted while starting
		KV_URL="tcp://127.0.0.1:$p"
		for _ in $(seq 1 50); do
			"$BUILD/kvpool" ping --server "$KV_URL" >/dev/null 2>&1 && break
			kill -0 "$KV_PID" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$KV_PID" 2>/dev/null; then
			break
		fi
	done
	while kill -0 "$KV_PID" 2>/dev/null && have_time 30; do
		rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$KV_PID/status" 2>/dev/null)
		[ "${rss:-0}" -ge $((arena_kb * 95 / 100)) ] && return 0
		sleep 0.25
	done
	kill -0 "$KV_PID" 2>/dev/null
}

stop_kvpoold() {
	kill -TERM "$KV_PID" 2>/dev/null
	wait "$KV_PID" 2>/dev/null
}

# kvpool bench on KV_URL: sizes $1 (comma list), ops $2, out file $3.
run_bench() {
	timeout "$(left)" "$BUILD/kvpool" bench --server "$KV_URL" --sizes "$1" --ops "$2" \
		--connections "$CONNS" --batch "$DEPTH" --duration "$DUR" --json >"$3" 2>"$3.err" ||
		log "kvpool bench failed: $(tail -3 "$3.err")"
}

# The gbps of op $2 at block_bytes $3 in bench JSON $1 ("null" if absent).
bench_gbps() {
	local v
	v=$(grep -o "\"op\":\"$2\",\"block_bytes\":$3,[^}]*" "$1" 2>/dev/null |
		sed -n 's/.*"gbps":\([0-9.]*\).*/\1/p' | head -1)
	echo "${v:-null}"
}

run_kvpool() {
	local list b
	list=$(echo "$SIZES" | tr ' ' ',')
	log "kvpoold: 2 threads, arena $ARENA (waiting until it is faulted in)"
	if ! start_kvpoold 2; then
		log "kvpoold did not start: $(tail -3 "$TMP/kvpoold.err")"
		return
	fi
	log "kvpool bench: $list, $CONNS connections, batch $DEPTH"
	run_bench "$list" put,get "$TMP/kv2.json"
	for s in $SIZES; do
		b=$(bytes_of "$s")
		R[put_${s}_kvpool]=$(bench_gbps "$TMP/kv2.json" put "$b")
		R[get_${s}_kvpool]=$(bench_gbps "$TMP/kv2.json" get "$b")
	done
	R[get_1MiB_kvpool_2threads]=${R[get_1MiB_kvpool]:-null}
	R[put_1MiB_kvpool_2threads]=${R[put_1MiB_kvpool]:-null}
	if have_time 20; then
		timeout "$(left)" "$BUILD/kvpool" bench --server "$KV_URL" --ops match --chain 1000 \
			--connections "$CONNS" --duration 1 --json >"$TMP/match.json" 2>/dev/null
		R[match_per_s]=$(sed -n 's/.*"matches_per_s":\([0-9.]*\).*/\1/p' "$TMP/match.json")
		R[match_server_p50_us]=$(sed -n 's/.*"server_p50_us":\([0-9]*\).*/\1/p' "$TMP/match.json")
	fi
	stop_kvpoold
	if [[ " $SIZES " == *" 1MiB "* ]] && have_time 40; then
		log "kvpoold: 1 thread, 1 MiB"
		if start_kvpoold 1; then
			run_bench 1MiB put,get "$TMP/kv1.json"
			R[put_1MiB_kvpool_1thread]=$(bench_gbps "$TMP/kv1.json" put 1048576)
			R[get_1MiB_kvpool_1thread]=$(bench_gbps "$TMP/kv1.json" get 1048576)
			stop_kvpoold
		fi
	fi
}

# ---- redis ----------------------------------------------------------------------

# The requests/s of test $2 ("SET" or "GET") in redis-benchmark CSV $1.
redis_rps() {
	grep "^\"$2\"" "$1" 2>/dev/null | head -1 | cut -d, -f2 | tr -d '"'
}

run_redis() {
	local p pid b keys n rps key len
	command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null || {
		log "redis-server or redis-benchmark missing: redis skipped"
		return
	}
	p=$(port)
	redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no \
		--proto-max-bulk-len 1gb --client-query-buffer-limit 1gb --protected-mode no \
		--disable-thp no \
		--daemonize no --logfile "$TMP/redis.log" &
	pid=$!
	PIDS+=("$pid")
	for _ in $(seq 1 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
	for s in $SIZES; do
		have_time 15 || { log "out of time: redis $s skipped"; break; }
		b=$(bytes_of "$s")
		# Keys: ~256 MiB of values (at least C*P); requests: 5x the keys,
		# so that the random GETs find their keys set (misses would count).
		keys=$(( (256 << 20) / b )); [ "$keys" -lt $((CONNS * DEPTH)) ] && keys=$((CONNS * DEPTH))
		n=$((keys * 5))
		redis-cli -p "$p" flushall >/dev/null
		timeout "$(left)" redis-benchmark -p "$p" -t set -d "$b" -c "$CONNS" -P "$DEPTH" \
			--threads "$CONNS" -r "$keys" -n "$keys" -q >/dev/null 2>&1
		log "redis: $s, $keys keys, $n requests per test"
		timeout "$(left)" redis-benchmark -p "$p" -t set,get -d "$b" -c "$CONNS" -P "$DEPTH" \
			--threads "$CONNS" -r "$keys" -n "$n" --csv >"$TMP/redis_$s.csv" 2>/dev/null
		rps=$(redis_rps "$TMP/redis_$s.csv" SET)
		R[put_${s}_redis]=$([ -n "$rps" ] && gbps "$(awk -v r="$rps" -v b="$b" 'BEGIN { printf "%.0f", r * b }')" 1 || echo null)
		rps=$(redis_rps "$TMP/redis_$s.csv" GET)
		R[get_${s}_redis]=$([ -n "$rps" ] && gbps "$(awk -v r="$rps" -v b="$b" 'BEGIN { printf "%.0f", r * b }')" 1 || echo null)
		key=$(redis-cli -p "$p" randomkey)
		len=$(redis-cli -p "$p" strlen "$key")
		if [ "$len" != "$b" ]; then
			log "redis: STRLEN $key is $len, not $b: its figures for $s are void"
			R[put_${s}_redis]=null
			R[get_${s}_redis]=null
		fi
		log "redis: $s: $(redis-cli -p "$p" dbsize) keys held, STRLEN $len"
	done
	kill -TERM "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
}

# ---- memcached ---------------------------------------------------------------------

run_memcached() {
	local p pid out w r t
	R[memcached_mix_1MiB]=null
	command -v memcached >/dev/null && command -v memcaslap >/dev/null || {
		log "memcached or memcaslap missing: memcached skipped"
		return
	}
	have_time 15 || return
	p=$(port)
	memcached -u nobody -l 127.0.0.1 -p "$p" -U 0 -t 2 -I 32m -m 1024 &
	pid=$!
	PIDS+=("$pid")
	sleep 0.5
	printf 'key\n64 64 1\nvalue\n1048576 1048576 1\ncmd\n0 0.5\n1 0.5\n' >"$TMP/mc.cfg"
	out=$(timeout 20 memcaslap -s "127.0.0.1:$p" -T "$CONNS" -c "$CONNS" -w 1k -t 3s \
		-F "$TMP/mc.cfg" 2>&1)
	w=$(echo "$out" | sed -n 's/^written_bytes: \([0-9]*\)/\1/p')
	r=$(echo "$out" | sed -n 's/^read_bytes: \([0-9]*\)/\1/p')
	t=$(echo "$out" | sed -n 's/^Run time: \([0-9.]*\)s.*/\1/p')
	[ -n "$w" ] && [ -n "$r" ] && [ -n "$t" ] && R[memcached_mix_1MiB]=$(gbps $((w + r)) "$t")
	log "memcached 1 MiB 50/50 set/get mix (no pipelining): ${R[memcached_mix_1MiB]} GB/s"
	kill -TERM "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
}

# ---- run -----------------------------------------------------------------------

run_wire
run_iperf3
run_kvpool
have_time 60 && run_wire
run_redis
run_memcached

val() { echo "${R[$1]:-null}"; }

echo
echo "kvpool vs wire vs redis: loopback TCP, $CONNS connections, $DEPTH blocks in flight per connection, GB/s = 10^9 B/s"
printf '%-7s %-4s %10s %10s %10s %13s %12s\n' size op kvpool redis wire kvpool/redis kvpool/wire
for s in $SIZES; do
	for op in get put; do
		k=$(val "${op}_${s}_kvpool") r=$(val "${op}_${s}_redis") w=$(val "wire_$s")
		printf '%-7s %-4s %10s %10s %10s %13s %12s\n' "$s" "$op" "$k" "$r" "$w" \
			"$(ratio "$k" "$r")" "$(ratio "$k" "$w")"
	done
done
echo "kvpoold worker threads at 1MiB: 1 thread get $(val get_1MiB_kvpool_1thread) put $(val put_1MiB_kvpool_1thread);" \
	"2 threads get $(val get_1MiB_kvpool_2threads) put $(val put_1MiB_kvpool_2threads)"
echo "MATCH of a 1000-block chain: $(val match_per_s) matches/s ($CONNS connections), server p50 $(val match_server_p50_us) us"
echo "iperf3 -P $CONNS: $(val iperf3) GB/s; memcached 1MiB set/get mix via memcaslap (no pipelining): $(val memcached_mix_1MiB) GB/s"
echo "took $(elapsed) s"

json="{"
for op in get put; do
	for s in 64KiB 256KiB 1MiB 4MiB 16MiB; do
		for t in kvpool redis; do
			json+="\"${op}_${s}_${t}_gbps\":$(val "${op}_${s}_${t}"),"
		done
	done
done
json+="\"wire_gbps\":$(val wire_1MiB),\"iperf3_gbps\":$(val iperf3),"
json+="\"get_1MiB_kvpool_1thread_gbps\":$(val get_1MiB_kvpool_1thread),\"put_1MiB_kvpool_1thread_gbps\":$(val put_1MiB_kvpool_1thread),"
json+="\"match_1000_per_s\":$(val match_per_s),\"memcached_mix_1MiB_gbps\":$(val memcached_mix_1MiB),"
json+="\"connections\":$CONNS,\"depth\":$DEPTH}"
echo "$json"
