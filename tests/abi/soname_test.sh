#!/usr/bin/env bash
# soname_test.sh - the library's ABI version guards programs built against
# an older layout, run by make test. struct kvpool_options grew (its TLS
# fields), as did kvpool_put_block and kvpool_limits: a program built
# against the library before that passes the old, smaller structs, and a
# library that read the new fields from them would read whatever follows
# in the program's memory (a crash, or a CA or key file the program never
# named). So the SONAME went up: such a program must be refused by the
# dynamic loader, never run against this library.
#
# The "old" program is built here against a stand-in for the old library:
# a stub with the old SONAME (libkvpool.so.0) and the old struct layout
# {token, timeout_ms}, written from the old kvpool.h. It is then run with
# only this build's library on the search path, installed under its own
# SONAME, as a package or `make install` would.
# Prints cmocka-style summary lines, which tests/run.sh counts.
set -u

BUILD=${BUILD:-build}
lib=$(cd "$(dirname "$0")/../.." && pwd)/$BUILD/libkvpool.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
CC=${CC:-cc}

ok() {
	echo "[       OK ] $1"
	passed=$((passed + 1))
}

fail() {
	echo "[  FAILED  ] $1: $2"
	failed=$((failed + 1))
}

[ -f "$lib" ] || { fail "library" "$lib is not built"; exit 1; }
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" { print $2 }')
if [ "$soname" = libkvpool.so.1 ]; then
	ok "the library's SONAME is libkvpool.so.1"
else
	fail "SONAME" "libkvpool.so.1 expected, got '$soname'"
fi

# the old library's interface, as a program built against it saw it
mkdir -p "$tmp/old" "$tmp/new"
cat > "$tmp/stub.c" <<'C'
#include <stdint.h>
struct kvpool_client;
struct old_opts { const char *token; uint32_t timeout_ms; };
int kvpool_connect(const char *url, const char *ns, const struct old_opts *o,
		   struct kvpool_client **c)
{
	(void)url; (void)ns; (void)o; (void)c;
	return -1;
}
C
cat > "$tmp/old.c" <<'C'
#include <stdint.h>
#include <stdio.h>
#include <string.h>
struct kvpool_client;
struct old_opts { const char *token; uint32_t timeout_ms; };
int kvpool_connect(const char *url, const char *ns, const struct old_opts *o,
		   struct kvpool_client **c);
/* the old 16-byte struct, then bytes that are not the new fields */
struct frame { struct old_opts o; char junk[64]; };
int main(void)
{
	struct frame f;
	struct kvpool_client *c = NULL;
	int e;

	memset(&f, 0, sizeof(f));
	memset(f.junk, 0x41, sizeof(f.junk));
	e = kvpool_connect("tcp://127.0.0.1:1", "x", &f.o, &c);
	printf("connect -> %d\n", e);
	return 0;
}
C
if ! $CC -shared -fPIC -Wl,-soname,libkvpool.so.0 -o "$tmp/old/libkvpool.so" "$tmp/stub.c" ||
   ! $CC -o "$tmp/oldprog" "$tmp/old.c" -L"$tmp/old" -lkvpool; then
	fail "build" "the old program did not build"
	exit 1
fi
# this build's library, under its SONAME, alone on the search path
cp "$lib" "$tmp/new/$soname"
LD_LIBRARY_PATH="$tmp/new" "$tmp/oldprog" > "$tmp/out" 2>&1
rc=$?
if [ "$rc" = 127 ] && grep -q "libkvpool.so.0: cannot open shared object file" "$tmp/out"; then
	ok "a program built against libkvpool.so.0 is refused by the loader"
else
	fail "old program" "rc $rc (it ran with the old struct; 139: and crashed): $(head -c 300 "$tmp/out")"
fi

# a program built against this header and library runs
cat > "$tmp/new.c" <<'C'
#include <errno.h>
#include <stdio.h>
#include "kvpool.h"
int main(void)
{
	struct kvpool_options o = { .token = NULL, .timeout_ms = 500 };
	struct kvpool_client *c = NULL;
	int e = kvpool_connect("tcp://127.0.0.1:1", "x", &o, &c);

	printf("connect -> %d\n", e);
	return e < 0 ? 0 : 1; /* nothing listens there: an error, not a crash */
}
C
inc=$(cd "$(dirname "$0")/../../client" && pwd)
# a sanitizer build of the library (make test-san, test-tsan) needs its
# runtime first in the program too
san=
case "$(objdump -p "$lib" | awk '$1 == "NEEDED" { print $2 }')" in
*libasan*) san="-fsanitize=address,undefined" ;;
*libtsan*) san="-fsanitize=thread" ;;
esac
if $CC $san -I"$inc" -o "$tmp/newprog" "$tmp/new.c" -L"$tmp/new" -l:"$soname" &&
   LD_LIBRARY_PATH="$tmp/new" "$tmp/newprog" > "$tmp/out2" 2>&1; then
	ok "a program built against this kvpool.h and $soname runs"
else
	fail "new program" "$(head -c 300 "$tmp/out2" 2>/dev/null)"
fi

echo "[==========] $((passed + failed)) test(s) run."
[ "$passed" -gt 0 ] && echo "[  PASSED  ] $passed test(s)."
[ "$failed" -gt 0 ] && echo "[  FAILED  ] $failed test(s)."
[ "$failed" -eq 0 ]
