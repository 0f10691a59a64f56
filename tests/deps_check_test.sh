#!/usr/bin/env bash
# deps_check_test.sh - tests of tests/deps_check.sh (make deps-check), run
# by make test: the tree as it is passes, and each boundary DESIGN.md draws
# fails once a forbidden #include is put into a scratch copy of the tree.
# Prints cmocka-style summary lines, which tests/run.sh counts.
set -u

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0

# A scratch copy of the sources the rules cover, and the rules.
fresh_copy() {
	rm -rf "$tmp/tree"
	mkdir -p "$tmp/tree/tests"
	(cd "$src" && tar -cf - proto storage server client rdma etcd config \
		tests/deps_rules.txt tests/deps_check.sh) | tar -xf - -C "$tmp/tree"
}

ok() {
	echo "[       OK ] $1"
	passed=$((passed + 1))
}

fail() {
	echo "[  FAILED  ] $1: $2"
	failed=$((failed + 1))
}

# expect NAME RC PATTERN: the check of the scratch tree exits RC and its
# output matches PATTERN (grep -E).
expect() {
	local out rc
	out=$("$tmp/tree/tests/deps_check.sh" "$tmp/tree" 2>&1)
	rc=$?
	if [ "$rc" -ne "$2" ]; then
		fail "$1" "exit $rc, wanted $2; output: $out"
	elif ! grep -qE -- "$3" <<<"$out"; then
		fail "$1" "output does not match '$3': $out"
	else
		ok "$1"
	fi
}

# inject FILE LINE: append an #include line to FILE of the scratch tree.
inject() {
	printf '%s\n' "$2" >>"$tmp/tree/$1"
}

echo "[==========] Running deps_check tests."

fresh_copy
expect "the tree keeps to the rules" 0 "all within"

fresh_copy
inject proto/proto.c '#include "store.h"'
expect "proto includes storage" 1 "^proto/proto.c:[0-9]+: includes storage/store.h"

fresh_copy
inject client/lib/api/handle.c '#include "store.h"'
expect "client includes storage" 1 "^client/lib/api/handle.c:[0-9]+: includes storage/store.h"

fresh_copy
inject client/lib/engine/engine.c '#include "lib/cluster/cluster.h"'
expect "the engine includes the cluster above it" 1 \
	"^client/lib/engine/engine.c:[0-9]+: includes client/lib/cluster/cluster.h"

fresh_copy
inject client/lib/net/session.c '#include "lib/engine/engine.h"'
expect "the session includes the engine above it" 1 "includes client/lib/engine/engine.h"

fresh_copy
inject client/lib/engine/ops.c '#include "rdmx.h"'
expect "the engine names rdma/ (only the RDMA peer may)" 1 "includes rdma/rdmx.h"

fresh_copy
inject client/lib/cluster/cluster.c '#include "lib/engine/engine_impl.h"'
expect "the cluster includes the engine's insides" 1 "includes client/lib/engine/engine_impl.h"

fresh_copy
inject storage/get.c '#include "srv_server.h"'
expect "storage includes server" 1 "^storage/get.c:[0-9]+: includes server/srv_server.h"

fresh_copy
inject storage/get.c '#include "proto.h"'
expect "storage includes proto beyond its checksum helper" 1 "includes proto/proto.h"

fresh_copy
inject storage/get.c '#include "nvme/tier_impl.h"'
expect "storage core includes the NVMe wing's insides" 1 "includes storage/nvme/tier_impl.h"

fresh_copy
inject server/srv_put.c '#include "core.h"'
expect "server includes storage's internals" 1 "^server/srv_put.c:[0-9]+: includes storage/core.h"

fresh_copy
inject rdma/rdmx_desc.c '#include "srv_server.h"'
expect "rdma includes server" 1 "includes server/srv_server.h"

fresh_copy
inject storage/get.c '#include "no_such_header.h"'
expect "a quoted include that names no file" 2 "no such file"

fresh_copy
inject storage/get.c '#include <stdio.h>'
inject storage/get.c '#include "nvme/tier.h"'
expect "system headers and the wing's interface are allowed" 0 "all within"

echo "[==========] $((passed + failed)) test(s) run."
[ "$passed" -gt 0 ] && echo "[  PASSED  ] $passed test(s)."
[ "$failed" -gt 0 ] && echo "[  FAILED  ] $failed test(s)."
[ "$failed" -eq 0 ]
