#!/usr/bin/env bash
# Two builds of kvpool side by side on traffic that asks for no retention:
# does the retention work change the hit ratio or the speed?
#
#   tests/bench/retain_ab.sh BUILD_A BUILD_B [ROUNDS] [TRACE...]
#
# BUILD_A and BUILD_B are build directories (each with kvpoold and kvpool),
# e.g. a build of the base commit in a scratch directory and build/.
# ROUNDS (default 5) rounds run, the two builds interleaved (A B, then B A,
# ...) so that drift of this shared machine falls on both. Per round and
# build, on a fresh kvpoold (dram_capacity DRAM, default 512MiB, 2 worker
# threads, its arena faulted in first) each:
#  - kvpool replay of each TRACE (default tests/data/synthetic_trace.jsonl)
#    with 64 KiB blocks: hit ratio, wall seconds, PUT and MATCH p50/p99
#    (the client's per-call latency);
#  - kvpool bench --ops put,match --sizes 64KiB: PUT blocks/s and MATCH
#    matches/s of a 1,000-block chain.
# Prints the median of each figure for A and B, B/A, and the spread
# (min..max) so that "within noise" can be judged, then one JSON line.
set -euo pipefail
A=${1:?usage: retain_ab.sh BUILD_A BUILD_B [ROUNDS] [TRACE...]}
B=${2:?usage: retain_ab.sh BUILD_A BUILD_B [ROUNDS] [TRACE...]}
ROUNDS=${3:-5}
shift 3 2>/dev/null || shift $#
TRACES=("$@")
[ ${#TRACES[@]} -gt 0 ] || TRACES=(tests/data/synthetic_trace.jsonl)
DRAM=${DRAM:-512MiB}
for d in "$A" "$B"; do
	[ -x "$d/kvpoold" ] && [ -x "$d/kvpool" ] || { echo "retain_ab: $d has no kvpoold/kvpool" >&2; exit 2; }
done
out=$(mktemp -d /tmp/kvpool-ab.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; pid=; }
trap 'cleanup; rm -rf "$out"' EXIT

# Wait (20 s at most) until kvpoold's arena is faulted in (its resident
# size reaches 95% of it): page zeroing would otherwise land on the runs.
wait_faulted() {
	local kb rss
	kb=$(numfmt --from=iec "${DRAM%iB}" 2>/dev/null || echo 0)
	kb=$((kb / 1024))
	for _ in $(seq 1 80); do
		rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
		[ "${rss:-0}" -ge $((kb * 95 / 100)) ] && return 0
		sleep 0.25
	done
}

# Start kvpoold of build $1 on a free port; sets url and pid.
start() {
	url=
	for _ in 1 2 3 4 5 6 7 8; do
		port=$((20000 + RANDOM % 40000))
		"$1/kvpoold" --listen 127.0.0.1 --port "$port" --admin-port 0 --rdma-port 0 \
			--threads 2 --dram-capacity "$DRAM" --log-level error 2>>"$out/log" &
		pid=$!
		for _ in $(seq 1 100); do
			if "$1/kvpool" ping --server "tcp://127.0.0.1:$port" >/dev/null 2>&1; then
				url="tcp://127.0.0.1:$port"
				wait_faulted
				return 0
			fi
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		cleanup
	done
	echo "retain_ab: kvpoold of $1 did not start" >&2; cat "$out/log" >&2; exit 2
}

# One round of build $2 (label $1).
one() {
	local label=$1 dir=$2 t i=0
	for t in "${TRACES[@]}"; do
		start "$dir"
		"$dir/kvpool" replay --server "$url" --block-bytes 64KiB --json "$t" \
			>>"$out/$label.replay$i" 2>>"$out/log"
		cleanup
		i=$((i + 1))
	done
	start "$dir"
	"$dir/kvpool" bench --server "$url" --ops put,match --sizes 64KiB --duration 2 --json \
		>>"$out/$label.bench" 2>>"$out/log"
	cleanup
}

for r in $(seq 1 "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then one A "$A"; one B "$B"; else one B "$B"; one A "$A"; fi
	echo "retain_ab: round $r of $ROUNDS done" >&2
done

python3 - "$out" "${#TRACES[@]}" "${TRACES[@]}" <<'EOF'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
traces = sys.argv[3:3 + n]
rows = []

def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip().startswith('{')]

for i, t in enumerate(traces):
    name = t.rsplit('/', 1)[-1]
    a, b = lines(f"{out}/A.replay{i}"), lines(f"{out}/B.replay{i}")
    for key, get in (('hit_ratio', lambda d: d['hit_ratio']),
                     ('wall_s', lambda d: d['wall_s']),
                     ('put_p50_us', lambda d: d['latency_us']['put']['p50']),
                     ('put_p99_us', lambda d: d['latency_us']['put']['p99']),
                     ('match_p50_us', lambda d: d['latency_us']['match']['p50']),
                     ('match_p99_us', lambda d: d['latency_us']['match']['p99'])):
        rows.append((f"{name} {key}", [get(d) for d in a], [get(d) for d in b]))

def bench(label, op, field):
    v = []
    for d in lines(f"{out}/{label}.bench"):
        for r in d['results']:
            if r['op'] == op:
                v.append(r[field])
    return v

rows.append(('bench put blocks/s', bench('A', 'put', 'blocks_per_s'), bench('B', 'put', 'blocks_per_s')))
rows.append(('bench match/s', bench('A', 'match', 'blocks_per_s'), bench('B', 'match', 'blocks_per_s')))
print(f"{'figure':40s} {'A median':>12s} {'B median':>12s} {'B/A':>7s}   A min..max / B min..max")
summary = {}
for name, a, b in rows:
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = mb / ma if ma else float('nan')
    print(f"{name:40s} {ma:12.4f} {mb:12.4f} {ratio:7.3f}   {min(a):.4g}..{max(a):.4g} / {min(b):.4g}..{max(b):.4g}")
    summary[name.replace(' ', '_').replace('/', '_per_')] = {'a': ma, 'b': mb}
print(json.dumps(summary))
EOF
