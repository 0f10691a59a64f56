#!/usr/bin/env bash
# Run libFuzzer targets for a fixed time each and print libFuzzer's own
# summary of every run (executions, coverage, corpus, peak memory).
#
#   tests/fuzz/run.sh FUZZ_DIR SECONDS TARGET...
#
# FUZZ_DIR holds the built fuzz_<target> binaries. New inputs go to
# FUZZ_DIR/corpus-<target>/ (the stored seeds in tests/fuzz/corpus/ and
# tests/fuzz/regress/ are read, never written); a crash is saved as
# FUZZ_DIR/crash-<target>-<sha1>, its log as FUZZ_DIR/<target>.log, and
# makes the script exit 1 once every target has run.
set -u
dir=$1 secs=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
total_execs=0 failed=()
for t in "$@"; do
	bin="$dir/fuzz_$t" log="$dir/$t.log" work="$dir/corpus-$t"
	mkdir -p "$work"
	seeds=("$here/corpus/$t")
	[ -d "$here/regress/$t" ] && seeds+=("$here/regress/$t")
	echo "== fuzz_$t for ${secs}s"
	"$bin" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
		-artifact_prefix="$dir/crash-$t-" "$work" "${seeds[@]}" >"$log" 2>&1
	rc=$?
	# libFuzzer's own lines: start, end (cov/ft/corp/exec/s/rss), totals.
	grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^Done [0-9]+ runs|^stat::' "$log"
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	total_execs=$((total_execs + ${execs:-0}))
	if [ "$rc" -ne 0 ]; then
		echo "fuzz_$t FAILED (exit $rc); end of $log:"
		tail -n 60 "$log"
		failed+=("fuzz_$t")
	fi
done
echo "fuzz: $total_execs executions in all, ${#failed[@]} target(s) failed${failed:+: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
