#!/usr/bin/env bash
# readme_test.sh - run the code blocks of README.md the way a reader would,
# against a scratch kvpoold, so that every command on the front page still
# runs as written. Run by make test; prints cmocka-style summary lines,
# which tests/run.sh counts (one test case per block run).
#
# What runs, and how:
# - Every ```sh block, in the order of the file, in ONE bash shell with
#   errexit and pipefail (so a background kvpoold started in one block
#   serves the next ones). Its working directory is a scratch directory
#   with build/ (-> $BUILD), client/, config/ and tests/ linked to the
#   source tree, so relative paths mean what they mean in a checkout.
# - A ```c block is saved there as example.c and a ```python block as
#   example.py (the README says "Save as"), for the sh blocks that build
#   and run them.
# - Markers, an HTML comment on the line right before a fence:
#   <!-- readme-test: skip --> the block is not run (`make test` itself);
#   <!-- readme-test: last --> the block runs after all the others
#   (stopping the kvpoold the examples use).
# - Substitutions, in every block: the ports 7470, 7471 and 7472 become
#   three free loopback ports, and kvpoold gets them through KVPOOL_PORT,
#   KVPOOL_ADMIN_PORT and KVPOOL_RDMA_PORT; a `kvpool SUBCOMMAND` without
#   --server gets `--server tcp://127.0.0.1:PORT` after the subcommand;
#   /tmp/ becomes a scratch directory. For builds the README's command
#   lines do not fit: `-lrdmacm -libverbs` is dropped when libkvpool.a has
#   no RDMA, and in a sanitizer build (make test-san) cc gets
#   -fsanitize=address,undefined and python3 the sanitizer runtimes.
# A failing block stops the run; it and the blocks after it count as failed.
# One more test case: every relative link in README.md and docs/*.md names
# a file that exists, and a #fragment one of its headings (doc_links.py).
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) build_dir=$BUILD ;; *) build_dir=$root/$BUILD ;; esac
readme=${README:-$root/README.md}
PY=/usr/bin/python3

work=$(mktemp -d)
cleanup() {
	# Anything still running from the scratch directory is ours: stop it by pid.
	local p
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/cwd" 2>/dev/null)" = "$work" ] || continue
		kill -9 "${p#/proc/}" 2>/dev/null
	done
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/tmp"
ln -s "$build_dir" "$work/build"
for d in client config tests; do ln -s "$root/$d" "$work/$d"; done

read -r p0 p1 p2 < <("$PY" - <<'EOF'
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
EOF
)

san=0
nm "$build_dir/libkvpool.a" 2>/dev/null | grep -q ' __asan_init$\|__asan_report' && san=1
rdma=0
nm "$build_dir/libkvpool.a" 2>/dev/null | grep -q ' U rdma_create_id$' && rdma=1
san_preload=""
if [ "$san" = 1 ]; then
	san_preload="$(${CC:-cc} -print-file-name=libasan.so) $(${CC:-cc} -print-file-name=libubsan.so)"
fi

# Extract the blocks and write the driver script and the list of blocks.
P0=$p0 P1=$p1 P2=$p2 WORK=$work SAN=$san RDMA=$rdma SAN_PRELOAD=$san_preload \
"$PY" - "$readme" "$work/driver.sh" "$work/blocks.txt" <<'EOF' || exit 1
import os, re, sys
readme, driver, listing = sys.argv[1:4]
env = os.environ
ports = {"7470": env["P0"], "7471": env["P1"], "7472": env["P2"]}
lines = open(readme).read().split("\n")
blocks, i = [], 0
while i < len(lines):
    m = re.match(r"^```(\w+)\s*$", lines[i])
    if not m:
        i += 1
        continue
    lang, start = m.group(1), i + 1
    marker = lines[i - 1].strip() if i > 0 else ""
    j = i + 1
    while j < len(lines) and lines[j].strip() != "```":
        j += 1
    if j == len(lines):
        sys.exit("README.md:%d: a code block that does not end" % start)
    body = "\n".join(lines[i + 1:j])
    blocks.append((lang, start, marker, body))
    i = j + 1

def subst(text):
    text = re.sub(r"\b(7470|7471|7472)\b", lambda m: ports[m.group(1)], text)
    return text.replace("/tmp/", env["WORK"] + "/tmp/")

def subst_sh(text):
    text = subst(text)
    out = []
    for line in text.split("\n"):
        if "--server" not in line:
            line = re.sub(r"((?:^|(?<=[\s;&|(]))(?:build/)?kvpool [a-z][a-z-]*)",
                          r"\1 --server tcp://127.0.0.1:" + env["P0"], line)
        if env["RDMA"] != "1":
            line = line.replace(" -lrdmacm -libverbs", "")
        if env["SAN"] == "1":
            line = re.sub(r"^cc ", "cc -fsanitize=address,undefined ", line)
            line = line.replace("/usr/bin/python3 ",
                                "env LD_PRELOAD='%s' ASAN_OPTIONS=detect_leaks=0 /usr/bin/python3 "
                                % env["SAN_PRELOAD"])
        out.append(line)
    return "\n".join(out)

saved = {"c": "example.c", "python": "example.py"}
runs, later = [], []
for lang, start, marker, body in blocks:
    if "readme-test: skip" in marker:
        continue
    if lang in saved:
        with open(os.path.join(env["WORK"], saved[lang]), "w") as f:
            f.write(subst(body) + "\n")
        continue
    if lang != "sh":
        continue
    (later if "readme-test: last" in marker else runs).append((start, body))
runs += later
if not runs:
    sys.exit("no sh block found in " + readme)
with open(driver, "w") as d, open(listing, "w") as l:
    d.write("set -eo pipefail\n")
    d.write("trap 'exit 143' TERM\n")
    d.write("trap 'for j in $(jobs -p); do kill $j 2>/dev/null; done' EXIT\n")
    for start, body in runs:
        l.write("%d\n" % start)
        d.write("echo '[ RUN      ] README.md:%d'\n" % start)
        d.write(subst_sh(body) + "\n")
        d.write("echo %d >>%s/done.txt\n" % (start, env["WORK"]))
EOF

echo "== README.md blocks on ports $p0 (data), $p1 (admin), $p2 (RDMA), in $work"
(cd "$work" && KVPOOL_PORT=$p0 KVPOOL_ADMIN_PORT=$p1 KVPOOL_RDMA_PORT=$p2 \
	timeout --kill-after=10 400 bash "$work/driver.sh")
rc=$?

passed=0 failed=0
touch "$work/done.txt"
while read -r line; do
	if grep -qx "$line" "$work/done.txt"; then
		echo "[       OK ] README.md:$line"
		passed=$((passed + 1))
	else
		echo "[  FAILED  ] README.md:$line (the driver exited $rc)"
		failed=$((failed + 1))
	fi
done <"$work/blocks.txt"
# One more case: the relative links of the front page and of docs/.
if links=$("$PY" "$here/doc_links.py" "$readme" "$root"/docs/*.md 2>&1); then
	echo "[       OK ] links of README.md and docs/"
	passed=$((passed + 1))
else
	echo "[  FAILED  ] links of README.md and docs/: $links"
	failed=$((failed + 1))
fi

echo "[==========] $((passed + failed)) test(s) run."
[ "$passed" -gt 0 ] && echo "[  PASSED  ] $passed test(s)."
[ "$failed" -gt 0 ] && echo "[  FAILED  ] $failed test(s)."
[ "$failed" -eq 0 ] && [ "$rc" -eq 0 ]
