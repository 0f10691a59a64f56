#!/usr/bin/env bash
# Run the Python binding's pytest suite (tests/python) with Debian's
# /usr/bin/python3, against $BUILD's libkvpool.so and kvpoold (sanitizer
# builds included), and print its totals the way cmocka does so that
# tests/run.sh adds them to the C tests' counts. Exit 77 (skipped) when
# pytest is not installed, except under CI=true, where that is a failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PY=${KVPOOL_PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
case "$BUILD" in /*) build_dir=$BUILD ;; *) build_dir=$root/$BUILD ;; esac
export KVPOOL_LIB="${KVPOOL_LIB:-$build_dir/libkvpool.so}"
export KVPOOLD="${KVPOOLD:-$build_dir/kvpoold}"
export KVPOOL_CLI="${KVPOOL_CLI:-$build_dir/kvpool}"
export KVPOOL_TEST_DATA="${KVPOOL_TEST_DATA:-$root/tests/data}"
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
# A sanitizer build's libkvpool.so (make test-san) needs the ASan and UBSan
# runtimes loaded before anything else; python3 itself is not instrumented,
# and its deliberate leaks at exit are not ours, so leak checking is off.
if nm -D "$KVPOOL_LIB" 2>/dev/null | grep -q ' __asan_init$'; then
	san_libs="$(${CC:-cc} -print-file-name=libasan.so) $(${CC:-cc} -print-file-name=libubsan.so)"
	export LD_PRELOAD="$san_libs${LD_PRELOAD:+ $LD_PRELOAD}"
	export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
	export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
	echo "sanitizer build: python3 runs with LD_PRELOAD=$LD_PRELOAD"
fi

if ! "$PY" -c 'import pytest' 2>/dev/null; then
	echo "$PY has no pytest module (apt-get install python3-pytest python3-numpy, or make deps)"
	if [ "${CI:-}" = true ]; then
		echo "[  FAILED  ] 1 test(s), listed below:"
		echo "[  FAILED  ] pytest is missing under CI=true"
		exit 1
	fi
	echo "skipped: the Python binding's tests"
	exit 77
fi

xml=$(mktemp)
trap 'rm -f "$xml"' EXIT
"$PY" -m pytest -p no:cacheprovider -q -rs --junitxml="$xml" "$here"
rc=$?
# Totals from the JUnit report: passed = tests - failures - errors - skipped.
read -r passed failed < <("$PY" - "$xml" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 1)
    sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(t["tests"] - t["failures"] - t["errors"] - t["skipped"], t["failures"] + t["errors"])
PYEOF
)
echo "[  PASSED  ] $passed test(s)."
if [ "$failed" -gt 0 ]; then
	echo "[  FAILED  ] $failed test(s), listed above."
fi
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
