#!/usr/bin/env bash
# The engines' real-code tier (make test-engines-real): the adapters driven
# inside vLLM's, SGLang's and LMCache's own code, loaded from source
# snapshots named by KVPOOL_VLLM_SRC, KVPOOL_SGLANG_SRC and
# KVPOOL_LMCACHE_SRC (see tests/engines_real/engine_env.py). Not part of
# make test: CI has no snapshots. Prints each snapshot's commit, the
# import-only stubs and torch gaps, then pytest's results and one closing
# line. With no variable set it says so in one line and succeeds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PY=${KVPOOL_PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
case "$BUILD" in /*) build_dir=$BUILD ;; *) build_dir=$root/$BUILD ;; esac

if [ -z "${KVPOOL_VLLM_SRC:-}${KVPOOL_SGLANG_SRC:-}${KVPOOL_LMCACHE_SRC:-}" ]; then
	echo "engine real-code tier skipped: set KVPOOL_VLLM_SRC, KVPOOL_SGLANG_SRC and/or" \
	     "KVPOOL_LMCACHE_SRC to engine source snapshots (tests/engines_real/engine_env.py)"
	exit 0
fi

# Debian packages the engines' modules import (what is not packaged is stubbed)
pkgs="python3-pytest python3-numpy python3-torch python3-psutil python3-sortedcontainers
      python3-yaml python3-tqdm python3-requests python3-aiohttp python3-zmq python3-xxhash
      python3-cbor2 pybind11-dev g++"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
	if [ "$(id -u)" = 0 ]; then
		echo "installing:$missing"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null || exit 1
	else
		echo "missing Debian packages:$missing (apt-get install them as root)"
		exit 1
	fi
fi

export KVPOOL_LIB="${KVPOOL_LIB:-$build_dir/libkvpool.so}"
export KVPOOLD="${KVPOOLD:-$build_dir/kvpoold}"
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export PYTHONHASHSEED=${PYTHONHASHSEED:-0}
cd "$here" || exit 1

passed=0
failed=0
for engine in lmcache sglang vllm; do
	var=KVPOOL_$(echo "$engine" | tr a-z A-Z)_SRC
	if [ -z "${!var:-}" ]; then
		echo "== $engine: skipped ($var is not set)"
		continue
	fi
	echo "== $engine"
	"$PY" - "$engine" <<'PYEOF' 2>/dev/null | grep -v "^\[\|^\x1b\|INFO\|WARNING"
import sys
import engine_env
engine = sys.argv[1]
commit = getattr(engine_env, "load_" + engine)()
if engine == "vllm":
    import importlib
    from vllm_env import REAL
    for m in sorted(REAL):
        importlib.import_module(m)
engine_env.report(engine, commit)
PYEOF
	xml=$(mktemp)
	"$PY" -m pytest -p no:cacheprovider -q -rfs --junitxml="$xml" test_${engine}_real.py $(ls test_${engine}_*_real.py 2>/dev/null) \
		2>&1 | grep -v "^\[\|LMCache \(INFO\|WARNING\|DEBUG\)\|generated xml file" | tail -25
	read -r p f < <("$PY" - "$xml" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 1)
    sys.exit()
s = [r] if r.tag == "testsuite" else r.findall("testsuite")
t = {k: sum(int(x.get(k, 0)) for x in s) for k in ("tests", "failures", "errors", "skipped")}
print(t["tests"] - t["failures"] - t["errors"] - t["skipped"], t["failures"] + t["errors"])
PYEOF
)
	rm -f "$xml"
	passed=$((passed + p))
	failed=$((failed + f))
done
echo "engines-real: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
