#!/usr/bin/env bash
# NVMe tier throughput next to fio, on the same filesystem, in one run.
#
#   tests/bench/nvme_tier.sh [PARENT_DIR]
#
# Makes a scratch directory under PARENT_DIR (default ${TMPDIR:-/tmp}) and,
# in it:
#   1. nvme_bench: puts GIB GiB of 1 MiB blocks through a DRAM_MIB arena so
#      they are demoted to the tier, then gets them all back in random order
#      (promotions), byte-checked;
#   2. nvme_bench again with REBUILD_BLOCKS 16 KiB blocks and a 64 MiB
#      arena, puts only, for the warm-restart rebuild rate (blocks/s);
#   3. fio, 1 MiB blocks, --direct=1, psync (queue depth 1 per job):
#      sequential write of GIB GiB, then random reads of that file with one
#      job and with IO_THREADS jobs (the tier reads with IO_THREADS threads);
#      and both again with libaio at queue depth 16, the device's ceiling
#      (the tier batches adjacent blocks into one large pwritev);
# then prints a table with the ratios tier / fio, and removes the directory.
# Every step has a time limit, so the script always ends by itself.
#
# Environment: BUILD (build), GIB (6), DRAM_MIB (256), IO_THREADS (2),
# WINDOW (8 asynchronous gets in flight), FIO_READ_S (15 s per read run),
# REBUILD_BLOCKS (110000; 0 skips step 2).
# Builds $BUILD/tests/nvme_bench with `make nvme-bench` when missing.
set -euo pipefail
BUILD=${BUILD:-build}
GIB=${GIB:-6}
DRAM_MIB=${DRAM_MIB:-256}
IO_THREADS=${IO_THREADS:-2}
WINDOW=${WINDOW:-8}
FIO_READ_S=${FIO_READ_S:-15}
REBUILD_BLOCKS=${REBUILD_BLOCKS:-110000}
parent=${1:-${TMPDIR:-/tmp}}
bench=$BUILD/tests/nvme_bench

command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
[ -x "$bench" ] || make --no-print-directory BUILD="$BUILD" nvme-bench >/dev/null
[ -d "$parent" ] || { echo "$parent is not a directory" >&2; exit 1; }

# Room for the tier's data (plus four spare segments) and fio's file,
# which never exist at the same time, plus 1 GiB of slack.
need_kib=$(( (GIB + 2) * 1024 * 1024 ))
avail_kib=$(df -Pk "$parent" | awk 'NR == 2 { print $4 }')
if [ "$avail_kib" -lt "$need_kib" ]; then
	echo "$parent has $((avail_kib / 1024)) MiB free; this run needs $((need_kib / 1024)) MiB" >&2
	exit 1
fi

work=$(mktemp -d "$parent/kvpool-nvme-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
fs=$(df -PT "$work" | awk 'NR == 2 { print $2 " on " $1 }')
echo "directory $work ($fs), $GIB GiB, 1 MiB blocks, dram ${DRAM_MIB} MiB, io threads $IO_THREADS"

# Run nvme_bench in a fresh $work/tier with the given options; prints its
# report and leaves its RESULT line in $result.
run_bench() {
	local out
	rm -rf "$work/tier"
	mkdir "$work/tier"
	out=$(timeout --kill-after=10 1200 "$bench" --dir "$work/tier" "$@") || {
		echo "$out"
		echo "nvme_bench failed or timed out" >&2
		exit 1
	}
	echo "$out" | grep -v '^RESULT'
	result=$(echo "$out" | grep '^RESULT')
	rm -rf "$work/tier"
}
field() { echo "$result" | tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }

# 1. the tier, 1 MiB blocks
run_bench --blocks $((GIB * 1024)) --dram-mib "$DRAM_MIB" --io-threads "$IO_THREADS" \
	--window "$WINDOW"
tier_w=$(field demote_gbps)
tier_r=$(field promote_gbps)
direct=$(field direct_io)

# 2. the rebuild rate with many small blocks
rb_blocks=- rb_ms=- rb_rate=-
if [ "$REBUILD_BLOCKS" -gt 0 ]; then
	echo
	run_bench --blocks "$REBUILD_BLOCKS" --block-kib 16 --dram-mib 64 --no-get \
		--io-threads "$IO_THREADS"
	rb_blocks=$(field rebuild_blocks)
	rb_ms=$(field rebuild_ms)
	rb_rate=$(field rebuild_blocks_per_s)
fi

# 3. fio. Terse output: field 7 = read KiB/s, field 48 = write KiB/s.
fio_common=(--filename="$work/fio.dat" --bs=1M --direct=1 --ioengine=psync
	--group_reporting --output-format=terse --terse-version=3)
gbps() { awk -F';' -v f="$1" '{ printf "%.3f", $f * 1024 / 1e9 }'; }
fio_w=$(timeout --kill-after=10 300 fio --name=seqwrite --rw=write --size="${GIB}G" \
	--runtime=240 "${fio_common[@]}" | gbps 48)
fio_r1=$(timeout --kill-after=10 $((FIO_READ_S + 60)) fio --name=randread --rw=randread \
	--size="${GIB}G" --time_based --runtime="$FIO_READ_S" --numjobs=1 "${fio_common[@]}" | gbps 7)
fio_rn=$(timeout --kill-after=10 $((FIO_READ_S + 60)) fio --name=randread --rw=randread \
	--size="${GIB}G" --time_based --runtime="$FIO_READ_S" --numjobs="$IO_THREADS" \
	"${fio_common[@]}" | gbps 7)

fio_aio=(--filename="$work/fio.dat" --bs=1M --direct=1 --ioengine=libaio --iodepth=16
	--output-format=terse --terse-version=3)
rm -f "$work/fio.dat" # a fresh file, as for the psync write
fio_wq=$(timeout --kill-after=10 300 fio --name=seqwrite --rw=write --size="${GIB}G" \
	--runtime=240 "${fio_aio[@]}" | gbps 48)
fio_rq=$(timeout --kill-after=10 $((FIO_READ_S + 60)) fio --name=randread --rw=randread \
	--size="${GIB}G" --time_based --runtime="$FIO_READ_S" "${fio_aio[@]}" | gbps 7)

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "-" }'; }
echo
printf '%-44s %10s %10s\n' "path (1 MiB blocks)" "write GB/s" "read GB/s"
printf '%-44s %10s %10s\n' "kvpool nvme tier: demotion / promotion" "$tier_w" "$tier_r"
printf '%-44s %10s %10s\n' "fio seq write / rand read, 1 job" "$fio_w" "$fio_r1"
printf '%-44s %10s %10s\n' "fio rand read, $IO_THREADS jobs" "" "$fio_rn"
printf '%-44s %10s %10s\n' "fio seq write / rand read, libaio qd 16" "$fio_wq" "$fio_rq"
printf '%-44s %10s %10s\n' "tier / fio (1 job)" "$(ratio "$tier_w" "$fio_w")" "$(ratio "$tier_r" "$fio_r1")"
printf '%-44s %10s %10s\n' "tier / fio ($IO_THREADS jobs)" "" "$(ratio "$tier_r" "$fio_rn")"
printf '%-44s %10s %10s\n' "tier / fio (qd 16)" "$(ratio "$tier_w" "$fio_wq")" "$(ratio "$tier_r" "$fio_rq")"
echo "warm restart: rebuilt $rb_blocks blocks in $rb_ms ms ($rb_rate blocks/s)"
[ "$direct" = 1 ] || echo "note: the tier fell back to buffered i/o on this filesystem; fio used --direct=1"
echo "goal: the tier reaches at least 70% of the O_DIRECT figures"
