#!/usr/bin/env bash
# Run test binaries (cmocka), each with a time limit, and print one summary
# line "N passed, N failed" counted over every cmocka test case. A program
# that exits 77 without failures was skipped as a whole (the automake
# convention; tests/python/pytest.sh when pytest is missing outside CI).
set -u
BUILD=${BUILD:-build}
export KVPOOLD="${KVPOOLD:-$PWD/$BUILD/kvpoold}"
export KVPOOL_CLI="${KVPOOL_CLI:-$PWD/$BUILD/kvpool}"
export KVPOOL_TEST_DATA="${KVPOOL_TEST_DATA:-$PWD/tests/data}"
export KVPOOL_COPYCOUNT="${KVPOOL_COPYCOUNT:-$PWD/$BUILD/tests/libcopycount.so}"
export KVPOOL_ROFS="${KVPOOL_ROFS:-$PWD/$BUILD/tests/librofs.so}"
export KVPOOL_FUZZ_DIR="${KVPOOL_FUZZ_DIR:-$PWD/tests/fuzz}"
export KVPOOL_VALGRIND_SUPP="${KVPOOL_VALGRIND_SUPP:-$PWD/tests/valgrind.supp}"
passed=0 failed=0 bad_bins=() skipped_bins=()
for bin in "$@"; do
	name=$(basename "$bin")
	log=$(mktemp)
	echo "== $name"
	timeout --kill-after=10 600 "$bin" >"$log" 2>&1
	rc=$?
	cat "$log"
	p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
	f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
	passed=$((passed + p)); failed=$((failed + f))
	if [ "$rc" -eq 77 ] && [ "$f" -eq 0 ]; then
		skipped_bins+=("$name")
		rm -f "$log"
		continue
	fi
	if [ "$rc" -ne 0 ] || [ "$p" -eq 0 ]; then
		[ "$f" -eq 0 ] && failed=$((failed + 1))   # crash, timeout or no test ran
		bad_bins+=("$name (exit $rc)")
	fi
	rm -f "$log"
done
[ ${#skipped_bins[@]} -gt 0 ] && echo "skipped: ${skipped_bins[*]}"
[ ${#bad_bins[@]} -gt 0 ] && echo "failing binaries: ${bad_bins[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
