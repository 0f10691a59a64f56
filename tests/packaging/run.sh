#!/usr/bin/env bash
# make test-packaging: kvpool installed the ways docs/building.md lists, each
# checked from the outside as a user would meet it.
#
#   deps       what each make deps-* target installs, through a stand-in
#              apt-get that records its arguments: only what the target
#              needs (deps-build: DEB_BUILD_PACKAGES, deps-wheel: and the
#              Python tools, deps-deb: debian/control's Build-Depends),
#              always with --no-install-recommends; make wheel and make
#              deb reach only those; DEB_BUILD_PACKAGES agrees with the
#              Build-Depends
#   wheel      make wheel; the wheel's files against client/python/kvpool;
#              a fresh virtualenv, pip install --no-index, import, a block
#              put and got back from a kvpoold with the library inside the
#              wheel, the vllm.general_plugins entry point in the installed
#              metadata, KVPOOL_LIB beside the library inside (not used,
#              and a warning says so), the library stripped, pip uninstall
#              leaving the virtualenv as it was, make wheel up to date once
#              built; pip install --no-build-isolation of client/python
#              (and in a bare virtualenv, the message that wheel is
#              missing) and python3 -m build --no-isolation (sdist, then a
#              wheel from it), leaving the source tree clean
#   pkgconfig  make install DESTDIR=... PREFIX=/usr, then the README's C
#              example built with pkg-config (PKG_CONFIG_SYSROOT_DIR and
#              PKG_CONFIG_PATH on the staged tree), shared and static, run
#              against a kvpoold; make install leaves the built wheel as it
#              is; make uninstall leaves only the configuration
#   deb        make deb, from a copy of the tracked files only (an
#              untracked file does not travel); the five packages' files,
#              dependencies and scripts (dpkg-deb); kvpoold --version and
#              the Python package from the unpacked packages; lintian with
#              no error (its warnings are printed); then apt-get install
#              into a Debian 12 root (the container test's cached
#              debootstrap root, made if missing): the user, the data
#              directory, the enabled unit and the commands it runs, the
#              conffile, kvpoold run from that root as its user; apt-get
#              purge removing what the packages made (and keeping a file
#              the operator added to /etc/kvpool); kvpool-tools alone, with
#              no server
#   k8s        kubectl kustomize of deploy/kubernetes, deploy/kubernetes/setup
#              and deploy/kubernetes/etcd, checked against kvpoold's own
#              settings by k8s_check.py, which also starts kvpoold (and
#              Debian's etcd) the way the pods would, reloads its tokens
#              the documented way, and checks docs/operating.md's engine pod
#
#   tests/packaging/run.sh [SECTION...]     (default: all five)
#
# Environment: BUILD (default build), PYTHON (default /usr/bin/python3),
# KVPOOL_DEB_ROOT (a Debian 12 root tarball for the install test; default
# the container test's /var/tmp/kvpool-container/debian12-minbase.tar),
# DEBIAN_MIRROR. The Debian-root install needs root and the network to the
# Debian mirror; without them it is skipped, except under CI=true, where
# a skip is a failure. Prints "packaging: N passed, M failed" at the end.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root" || exit 2
BUILD=${BUILD:-build}
case "$BUILD" in /*) build_dir=$BUILD ;; *) build_dir=$root/$BUILD ;; esac
PY=${PYTHON:-/usr/bin/python3}
VERSION=$(sed -n 's/^#define SRV_VERSION "\(.*\)"/\1/p' server/srv_server.h)
CACHE=${KVPOOL_CONTAINER_CACHE:-/var/tmp/kvpool-container}
DEB_ROOT=${KVPOOL_DEB_ROOT:-$CACHE/debian12-minbase.tar}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)

work=$(mktemp -d /tmp/kvpool-packaging.XXXXXX)
pids=()
mounts=()
probes=()
cleanup() {
	local p m
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null; done
	for p in "${probes[@]}"; do rm -f "$p"; done
	rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
failures=()
# Each check: a description and a command; failures are listed at the end.
ok() { printf '  ok    %s\n' "$1"; }
check() {
	local what=$1
	shift
	if "$@" >"$work/check.out" 2>&1; then
		ok "$what"
		return 0
	fi
	printf '  FAIL  %s\n' "$what"
	sed 's/^/        /' "$work/check.out" | tail -30
	section_ok=0
	return 1
}
section_begin() {
	section=$1
	section_ok=1
	section_start=$(date +%s)
	printf '== %s\n' "$section"
}
section_end() {
	local s=$(($(date +%s) - section_start))
	if [ "$section_ok" = 1 ]; then
		passed=$((passed + 1))
		printf '== %s: passed (%d s)\n' "$section" "$s"
	else
		failed=$((failed + 1))
		failures+=("$section")
		printf '== %s: FAILED (%d s)\n' "$section" "$s"
	fi
}
skip_or_fail() {
	if [ "${CI:-}" = true ]; then
		printf '  FAIL  %s (a skip is a failure under CI=true)\n' "$1"
		section_ok=0
	else
		printf '  SKIP  %s\n' "$1"
	fi
}

free_ports() {
	"$PY" - "$1" <<'EOF'
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
EOF
}

# A scratch kvpoold on free loopback ports: sets kv_port, kv_pid.
start_kvpoold() {
	local admin
	read -r kv_port admin < <(free_ports 2)
	"$build_dir/kvpoold" --listen 127.0.0.1 --port "$kv_port" --admin-port "$admin" \
		--rdma-port 0 --dram-capacity 64MiB --threads 1 >"$work/kvpoold.log" 2>&1 &
	kv_pid=$!
	pids+=("$kv_pid")
	for _ in $(seq 100); do
		"$build_dir/kvpool" ping --server "tcp://127.0.0.1:$kv_port" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	cat "$work/kvpoold.log"
	return 1
}
stop_kvpoold() {
	kill -TERM "$kv_pid" 2>/dev/null
	wait "$kv_pid" 2>/dev/null
}

# The environment a user's shell would have: no source tree on the path.
clean_env() {
	env -u PYTHONPATH -u KVPOOL_LIB -u LD_LIBRARY_PATH -u LD_PRELOAD PYTHONDONTWRITEBYTECODE=1 "$@"
}

# ---- deps -------------------------------------------------------------------------

# A Makefile variable's value.
make_var() {
	printf 'print-%%: ; @echo $(%s)\n' '$*' | make --no-print-directory -s -f Makefile -f - "print-$1"
}

# Packages no build or packaging target needs: daemons, the demos' stack,
# the test tools.
HEAVY="etcd-server prometheus prometheus-node-exporter python3-torch python3-matplotlib rdma-core libcmocka-dev python3-pytest"

# A stand-in apt-get: records each call's arguments (one a line, then
# "--") in $work/apt.log and succeeds.
fake_apt() {
	printf '#!/bin/sh\nfor a in "$@"; do printf "%%s\\n" "$a"; done >>"%s"\necho -- >>"%s"\n' \
		"$work/apt.log" "$work/apt.log" >"$work/apt-get"
	chmod +x "$work/apt-get"
	: >"$work/apt.log"
}

# make TARGET... with the stand-in apt-get, as if every package were missing.
deps_run() {
	fake_apt
	make --no-print-directory -s DEPS_FORCE=1 APT_GET="$work/apt-get" SUDO= BUILD="$BUILD" \
		PYTHON="$PY" "$@" >"$work/deps.out" 2>&1 || { cat "$work/deps.out"; return 1; }
}

# The packages of the recorded install calls, one a line, sorted; and the
# dependency string of a satisfy call, one package name a line.
apt_installed() {
	awk '/^--$/ { if (inst) for (i = 1; i <= n; i++) print a[i]; inst = 0; n = 0; next }
	     $0 == "install" { inst = 1; next } !/^-/ { a[++n] = $0 }' "$work/apt.log" | sort -u
}
apt_satisfied() {
	awk '/^--$/ { s = 0; next } s && !/^-/ { print } $0 == "satisfy" { s = 1 }' "$work/apt.log" |
		dep_names
}
# "a, b (>= 1), c:any" -> a b c, one a line, sorted.
dep_names() {
	tr ',' '\n' | sed 's/([^)]*)//; s/:any//; s/[[:space:]]//g' | grep . | sort -u
}
# debian/control's Build-Depends, one package name a line.
build_depends() {
	awk '/^Build-Depends:/ { f = 1; sub(/^Build-Depends:/, ""); print; next }
	     f && /^[ \t]/ { print; next } { f = 0 }' debian/control | dep_names
}

installs_exactly() { # target package...
	local target=$1 got want
	shift
	deps_run "$target" || return 1
	got=$(apt_installed | tr '\n' ' ')
	want=$(printf '%s\n' "$@" | sort -u | tr '\n' ' ')
	[ "$got" = "$want" ] || { printf 'installed: %s\nwanted:    %s\n' "$got" "$want"; return 1; }
}
satisfies_build_depends() {
	deps_run deps-deb || return 1
	diff <(apt_satisfied) <( (echo build-essential; build_depends) | sort -u)
}
no_heavy() {
	local h
	for h in $HEAVY; do
		if apt_installed | grep -qx "$h" || apt_satisfied | grep -qx "$h"; then
			echo "installs $h"
			return 1
		fi
	done
}
every_call_without_recommends() {
	grep -qE '^(install|satisfy)$' "$work/apt.log" || { echo "no install call"; return 1; }
	awk '/^--$/ { if (call && !nr) bad = 1; call = 0; nr = 0; next }
	     $0 == "install" || $0 == "satisfy" { call = 1 } $0 == "--no-install-recommends" { nr = 1 }
	     END { exit bad }' "$work/apt.log" || { cat "$work/apt.log"; return 1; }
}
# make -n TARGET (nothing is built) reaches the install of $2 and none of $3.
reaches() {
	local out
	out=$(make -n --no-print-directory DEPS_FORCE=1 APT_GET=apt-get SUDO= BUILD="$BUILD" "$1" 2>&1)
	echo "$out" | grep -q -- "$2" || { echo "make -n $1 does not run: $2"; return 1; }
	! echo "$out" | grep -E "$3"
}
sublist() { # list-a list-b: every word of a is in b
	local p
	for p in $1; do case " $2 " in *" $p "*) ;; *) echo "missing $p"; return 1 ;; esac; done
}
dev_packages_agree() {
	diff <(printf '%s\n' $1 | grep -- '-dev$' | sort -u) <(build_depends | grep -- '-dev$')
}

test_deps() {
	section_begin deps
	local build wheel all
	build=$(make_var DEB_BUILD_PACKAGES)
	wheel=$(make_var DEB_WHEEL_PACKAGES)
	all=$(make_var DEB_PACKAGES)
	# shellcheck disable=SC2086
	check "make deps-build installs DEB_BUILD_PACKAGES only" installs_exactly deps-build $build
	check "  with --no-install-recommends" every_call_without_recommends
	check "  nothing heavy ($HEAVY)" no_heavy
	# shellcheck disable=SC2086
	check "make deps-wheel installs those and DEB_WHEEL_PACKAGES only" installs_exactly deps-wheel $build $wheel
	check "  with --no-install-recommends" every_call_without_recommends
	check "  nothing heavy" no_heavy
	check "make deps-deb satisfies build-essential and debian/control's Build-Depends" satisfies_build_depends
	check "  with --no-install-recommends" every_call_without_recommends
	check "  nothing heavy" no_heavy
	check "make deps-packaging (make test-packaging) runs" deps_run deps-packaging
	check "  with --no-install-recommends" every_call_without_recommends
	check "  nothing of the demos" bash -c "! grep -qxE 'python3-torch|python3-matplotlib|prometheus' '$work/apt.log'"
	# shellcheck disable=SC2086
	check "make deps (make test, the demos) installs DEB_PACKAGES" installs_exactly deps $all
	check "  with --no-install-recommends" every_call_without_recommends
	check "make wheel reaches deps-wheel only" \
		reaches wheel 'install -y -qq --no-install-recommends python3-build' 'etcd-server|python3-torch|satisfy'
	check "make deb reaches deps-deb only" \
		reaches deb 'satisfy -y -qq --no-install-recommends' 'etcd-server|python3-torch|python3-pytest'
	check "DEB_BUILD_PACKAGES' -dev packages are debian/control's Build-Depends' -dev packages" \
		dev_packages_agree "$build"
	check "DEB_PACKAGES holds DEB_BUILD_PACKAGES and DEB_WHEEL_PACKAGES" sublist "$build $wheel" "$all"
	section_end
}

# ---- wheel ------------------------------------------------------------------------

ROUND_TRIP=$(cat <<'EOF'
import os, sys, kvpool
url, version, where = sys.argv[1], sys.argv[2], sys.argv[3]
assert kvpool.__version__ == version, (kvpool.__version__, version)
assert kvpool.__file__.startswith(where), (kvpool.__file__, where)
lib = kvpool.library_path
print("library:", lib)
if os.sep in lib:
    assert lib.startswith(where), (lib, where)
keys = kvpool.block_hashes(list(range(64)), block_size=16)
blocks = [os.urandom(4096) for _ in keys]
with kvpool.Client(url, "packaging-test") as c:
    assert c.put_chain(keys, blocks) == [0] * len(keys)
    assert c.match(keys) == len(keys)
    assert [c.get(k) for k in keys] == blocks
print("round trip ok")
EOF
)

ENTRY_POINT=$(cat <<'EOF'
from importlib.metadata import entry_points
eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvpool_tier"]
assert len(eps) == 1, eps
assert eps[0].value == "kvpool.vllm:register", eps[0].value
import kvpool.vllm
assert eps[0].load() is kvpool.vllm.register
print(eps[0].name, "=", eps[0].value)
EOF
)

wheel_files_match() {
	local whl=$1
	"$PY" - "$whl" "$VERSION" <<'EOF'
import os, sys, zipfile
whl, version = sys.argv[1], sys.argv[2]
names = set(zipfile.ZipFile(whl).namelist())
src = "client/python/kvpool"
want = set()
for d, _, files in os.walk(src):
    if "__pycache__" in d:
        continue
    for f in files:
        if f.endswith(".py"):
            want.add(os.path.relpath(os.path.join(d, f), "client/python"))
missing = sorted(want - names)
assert not missing, "modules of client/python/kvpool missing from the wheel: %s" % missing
extra = sorted(n for n in names if not n.startswith(("kvpool/", "kvpool-%s.dist-info/" % version)))
assert not extra, "files outside the package in the wheel: %s" % extra
assert "kvpool/libkvpool.so" in names, "no kvpool/libkvpool.so in the wheel"
stale = sorted(n for n in names if n.startswith("kvpool/") and n.endswith(".py") and n not in want)
assert not stale, "modules in the wheel that client/python/kvpool no longer has: %s" % stale
ep = zipfile.ZipFile(whl).read("kvpool-%s.dist-info/entry_points.txt" % version).decode()
assert "[vllm.general_plugins]" in ep and "kvpool_tier = kvpool.vllm:register" in ep, ep
meta = zipfile.ZipFile(whl).read("kvpool-%s.dist-info/METADATA" % version).decode()
assert "\nVersion: %s\n" % version in meta
reqs = [l for l in meta.splitlines() if l.startswith("Requires-Dist:") and "extra ==" not in l]
assert not reqs, "required dependencies (numpy and torch must stay optional): %s" % reqs
print("%d files, %d modules" % (len(names), len(want)))
EOF
}

wheel_lib_stripped() {
	mkdir -p "$work/whl" && (cd "$work/whl" && "$PY" -m zipfile -e "$1" .) || return 1
	local lib=$work/whl/kvpool/libkvpool.so
	readelf -S "$lib" | grep -E '\.symtab|\.debug_' && { echo "not stripped"; return 1; }
	readelf --dyn-syms "$lib" | grep -q ' kvpool_connect$' || { echo "no kvpool_connect"; return 1; }
	printf '%s bytes inside, %s in %s\n' "$(stat -c %s "$lib")" "$(stat -c %s "$build_dir/libkvpool.so")" \
		"$BUILD/libkvpool.so"
}

site_listing() {
	find "$1" -path '*/__pycache__' -prune -o -print | sort
}

test_wheel() {
	section_begin wheel
	local whl venv site
	check "make wheel" make --no-print-directory -s BUILD="$BUILD" PYTHON="$PY" wheel || { section_end; return; }
	whl=$(ls "$build_dir/dist/kvpool-$VERSION-"*.whl)
	case "$whl" in *-py3-none-linux_*.whl) ok "$(basename "$whl"): py3-none-linux tag" ;;
	*) check "wheel tag py3-none-linux_*: $(basename "$whl")" false ;; esac
	check "the wheel holds every module of client/python/kvpool, libkvpool.so, the entry point" \
		wheel_files_match "$whl"
	echo "  wheel contents:"
	"$PY" -c 'import sys, zipfile
for i in zipfile.ZipFile(sys.argv[1]).infolist(): print("    %9d  %s" % (i.file_size, i.filename))' "$whl"
	check "the library inside is stripped (no .symtab, no .debug_*) and keeps its dynamic symbols" \
		wheel_lib_stripped "$whl"
	check "make wheel is up to date once built (make -q)" \
		make -q --no-print-directory BUILD="$BUILD" PYTHON="$PY" "$whl"

	# A bare virtualenv: no system packages, so numpy is absent and
	# --no-index proves the wheel needs nothing else.
	venv=$work/venv
	check "python3 -m venv" "$PY" -m venv "$venv" || { section_end; return; }
	site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	site_listing "$site" >"$work/site.before"
	check "pip install --no-index the wheel into a fresh virtualenv" \
		clean_env "$venv/bin/pip" install --disable-pip-version-check --no-index "$whl"
	check "numpy is not installed there (optional)" \
		bash -c "! '$venv/bin/python' -c 'import numpy' 2>/dev/null"
	if start_kvpoold; then
		check "import, version, library inside the package, put/match/get round trip" \
			clean_env "$venv/bin/python" -c "$ROUND_TRIP" "tcp://127.0.0.1:$kv_port" "$VERSION" "$site"
		stop_kvpoold
	else
		check "kvpoold starts" false
	fi
	check "KVPOOL_LIB naming another file: the library inside still loads, and a warning says so" \
		bash -c "out=\$(env -u PYTHONPATH KVPOOL_LIB=/nonexistent/libkvpool.so '$venv/bin/python' -c \
			'import kvpool; print(kvpool.library_path)' 2>&1) && echo \"\$out\" &&
			echo \"\$out\" | grep -qx '$site/kvpool/libkvpool.so' &&
			echo \"\$out\" | grep -q 'KVPOOL_LIB=/nonexistent/libkvpool.so is not used: this package carries its own'"
	check "vllm.general_plugins entry point in the installed metadata" \
		clean_env "$venv/bin/python" -c "$ENTRY_POINT"
	check "pip show lists the files, the library among them" \
		bash -c "'$venv/bin/pip' show -f kvpool | grep -q 'kvpool/libkvpool.so'"
	check "pip uninstall -y kvpool" clean_env "$venv/bin/pip" uninstall -y kvpool
	site_listing "$site" >"$work/site.after"
	check "nothing of kvpool left in site-packages" diff -u "$work/site.before" "$work/site.after"

	# From the source, offline: pip with the system's setuptools and wheel,
	# and python3 -m build's sdist-then-wheel (the version from PKG-INFO).
	check "python3 -m venv --system-site-packages" "$PY" -m venv --system-site-packages "$work/venv2"
	check "pip install --no-build-isolation --no-index client/python (a pure package)" \
		clean_env "$work/venv2/bin/pip" install -q \
		--disable-pip-version-check --no-build-isolation --no-index ./client/python
	check "that package loads \$KVPOOL_LIB and lists the entry point" \
		clean_env KVPOOL_LIB="$build_dir/libkvpool.so" "$work/venv2/bin/python" -c \
		"import kvpool; assert kvpool.library_path == '$build_dir/libkvpool.so'; assert kvpool.__version__ == '$VERSION'
$ENTRY_POINT"
	check "in a bare virtualenv it says that wheel is missing" bash -c "
		'$PY' -m venv '$work/venv3' &&
		! env -u KVPOOL_LIB -u PYTHONPATH '$work/venv3/bin/pip' install --disable-pip-version-check \
			--no-build-isolation --no-index ./client/python >'$work/venv3.log' 2>&1 &&
		grep -q 'setup.py: building a wheel needs the wheel package' '$work/venv3.log' ||
		{ cat '$work/venv3.log'; exit 1; }"
	check "python3 -m build --no-isolation client/python (sdist, then a wheel from it)" \
		clean_env "$PY" -m build --no-isolation --outdir "$work/sdist" client/python
	check "the sdist's wheel has version $VERSION" ls "$work/sdist/kvpool-$VERSION-py3-none-any.whl" \
		"$work/sdist/kvpool-$VERSION.tar.gz"
	check "the source tree stays clean (nothing untracked or ignored in client/python)" \
		bash -c "! git status --short --ignored client/python | grep -v '^ M\|^M\|^A'"
	section_end
}

# ---- pkg-config -------------------------------------------------------------------

# README.md's C example: the first ```c block after "## C example".
readme_c_example() {
	awk '/^## C example/ { s = 1 } s && /^```c$/ { p = 1; next } p && /^```$/ { exit } p' README.md
}

test_pkgconfig() {
	section_begin pkgconfig
	local stage=$work/stage pc cflags libs whl before
	# make install after make wheel: the wheel is used as it is (sudo make
	# install would otherwise leave root's files in the user's build/)
	check "make wheel" make --no-print-directory -s BUILD="$BUILD" PYTHON="$PY" wheel
	whl=$(ls "$build_dir/dist/kvpool-$VERSION-"*.whl)
	before=$(stat -c '%i %Y' "$whl" "$build_dir/python")
	check "make install DESTDIR=$stage PREFIX=/usr" make --no-print-directory -s BUILD="$BUILD" \
		PYTHON="$PY" DESTDIR="$stage" PREFIX=/usr install || { section_end; return; }
	check "make install used the built wheel as it was (not rebuilt)" \
		test "$before" = "$(stat -c '%i %Y' "$whl" "$build_dir/python")"
	pc=$stage/usr/lib/pkgconfig/kvpool.pc
	check "kvpool.pc installed" test -f "$pc"
	check "README.md builds its C example with pkg-config" \
		grep -q 'cc -o example example.c $(pkg-config --cflags --libs kvpool)' README.md
	readme_c_example | sed "s/7470/PORT_PLACEHOLDER/" >"$work/example.c.in"
	check "README.md has a C example" test -s "$work/example.c.in"
	export PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$stage/usr/lib/pkgconfig
	check "pkg-config --modversion kvpool = $VERSION" \
		bash -c "[ \"\$(pkg-config --modversion kvpool)\" = '$VERSION' ]"
	cflags=$(pkg-config --cflags kvpool)
	libs=$(pkg-config --libs kvpool)
	echo "  pkg-config --cflags --libs kvpool: $cflags $libs"
	echo "  pkg-config --static --libs kvpool: $(pkg-config --static --libs kvpool)"
	if start_kvpoold; then
		sed "s/PORT_PLACEHOLDER/$kv_port/" "$work/example.c.in" >"$work/example.c"
		# shellcheck disable=SC2086
		check "cc -o example example.c \$(pkg-config --cflags --libs kvpool)" \
			cc -o "$work/example" "$work/example.c" $cflags $libs
		check "the example runs against the staged libkvpool.so.1 and a kvpoold" \
			env LD_LIBRARY_PATH="$stage/usr/lib" "$work/example"
		check "it linked libkvpool.so.1 from the staged tree" \
			bash -c "LD_LIBRARY_PATH='$stage/usr/lib' ldd '$work/example' | grep -q '$stage/usr/lib/libkvpool.so.1'"
		# shellcheck disable=SC2046
		check "static: cc example.c \$(pkg-config --static --cflags --libs kvpool), libkvpool.a" \
			cc -o "$work/example_static" "$work/example.c" $cflags \
			$(pkg-config --static --libs kvpool | sed 's/-lkvpool\b/-l:libkvpool.a/')
		check "the static example runs without libkvpool.so" \
			bash -c "! ldd '$work/example_static' | grep -q libkvpool && '$work/example_static'"
		stop_kvpoold
	else
		check "kvpoold starts" false
	fi
	unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
	echo "edited" >>"$stage/etc/kvpool/kvpool.conf"
	check "make uninstall DESTDIR=$stage PREFIX=/usr" make --no-print-directory -s BUILD="$BUILD" \
		PYTHON="$PY" DESTDIR="$stage" PREFIX=/usr uninstall
	check "it left only the configuration, as edited" bash -c "
		[ \"\$(cd '$stage' && find . ! -type d | sort)\" = ./etc/kvpool/kvpool.conf ] &&
		tail -1 '$stage/etc/kvpool/kvpool.conf' | grep -qx edited ||
		{ cd '$stage' && find . ! -type d; exit 1; }"
	check "and no empty directory it made for kvpool.pc, the unit or the sysusers entry" bash -c "
		for d in '$stage/usr/lib/pkgconfig' '$stage/usr/lib/systemd' '$stage/usr/lib/sysusers.d'; do
			[ ! -e \"\$d\" ] || { echo \"\$d is left\"; exit 1; }
		done"
	section_end
}

# ---- Debian packages --------------------------------------------------------------

deb_has() { # package file...
	local pkg=$1 f
	shift
	dpkg-deb --contents "$pkg" | awk '{print $6}' | sed 's|^\./|/|' >"$work/contents"
	for f in "$@"; do
		grep -qx "$f" "$work/contents" || { echo "$(basename "$pkg") lacks $f"; return 1; }
	done
}
deb_lacks() { # package pattern
	! dpkg-deb --contents "$1" | awk '{print $6}' | grep -E "$2"
}
deb_control_has() { # package control-file pattern
	dpkg-deb --ctrl-tarfile "$1" | tar -xO "./$2" | grep -qE "$3" ||
		{ echo "$(basename "$1"): $2 has no line matching $3"; return 1; }
}

kvpool_postinst_ok() {
	deb_control_has "$1" postinst 'systemd-sysusers.* kvpool.conf' &&
		deb_control_has "$1" postinst "deb-systemd-helper enable 'kvpoold.service'" &&
		deb_control_has "$1" postinst "deb-systemd-invoke .* 'kvpoold.service'" &&
		deb_control_has "$1" postinst 'systemd-tmpfiles .*--create kvpool.conf'
}

# Every Exec*= command of the installed kvpoold.service exists in root $1
# and is executable there (systemd-analyze verify's "is not executable").
unit_commands_exist() {
	local unit=$1/lib/systemd/system/kvpoold.service cmd n=0
	[ -f "$unit" ] || { echo "no $unit"; return 1; }
	while read -r cmd; do
		n=$((n + 1))
		[ -x "$1$cmd" ] || { echo "$cmd (from $unit) is not executable in the root"; return 1; }
		echo "$cmd"
	done < <(sed -n 's/^Exec[A-Za-z]*=[-@+!:]*\([^ ]*\).*/\1/p' "$unit")
	[ "$n" -ge 2 ] || { echo "found $n Exec lines"; return 1; }
}

# The packages installed and purged in a Debian 12 root with apt-get.
deb_root_install() {
	local r=$work/root debs=$build_dir/deb
	if [ "$(id -u)" != 0 ]; then
		skip_or_fail "Debian-root install: needs root (chroot)"
		return
	fi
	if [ ! -s "$DEB_ROOT" ]; then
		if command -v debootstrap >/dev/null; then
			echo "  making the Debian 12 root $DEB_ROOT (debootstrap minbase, the container test's cache)"
			mkdir -p "$(dirname "$DEB_ROOT")"
			local tmp
			tmp=$(mktemp -d "$(dirname "$DEB_ROOT")/root.XXXXXX")
			if debootstrap --variant=minbase bookworm "$tmp" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
				rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*
				tar -C "$tmp" -cf "$DEB_ROOT.tmp" . && mv "$DEB_ROOT.tmp" "$DEB_ROOT"
			else
				tail -5 "$work/debootstrap.log"
			fi
			rm -rf "$tmp"
		fi
		if [ ! -s "$DEB_ROOT" ]; then
			skip_or_fail "Debian-root install: no Debian 12 root ($DEB_ROOT) and debootstrap failed or is missing"
			return
		fi
	fi
	mkdir -p "$r"
	check "unpack the Debian 12 root" tar -C "$r" -xf "$DEB_ROOT" || return
	chmod 755 "$r" # the root tarball may carry its mktemp directory's 0700
	cp /etc/resolv.conf "$r/etc/resolv.conf"
	mkdir -p "$r/tmp/debs"
	cp "$debs"/kvpool_*.deb "$debs"/kvpool-tools_*.deb "$debs"/libkvpool1_*.deb \
		"$debs"/libkvpool-dev_*.deb "$debs"/python3-kvpool_*.deb "$r/tmp/debs/"
	mount -t proc proc "$r/proc" 2>/dev/null && mounts+=("$r/proc")
	local in="chroot $r env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C"
	check "apt-get update in the root" $in apt-get update -qq || return
	local f inroot=()
	for f in "$r"/tmp/debs/*.deb; do inroot+=("/tmp/debs/$(basename "$f")"); done
	# An earlier build (0.1.0, before the CLI moved to kvpool-tools) whose
	# kvpool still had /usr/bin/kvpool: kvpool-tools takes the file over
	# (Replaces) and deconfigures it (Breaks) instead of failing with
	# "trying to overwrite '/usr/bin/kvpool'".
	local old=$work/old-kvpool
	mkdir -p "$old/DEBIAN" "$old/usr/bin"
	printf '#!/bin/sh\necho old kvpool\n' >"$old/usr/bin/kvpool" && chmod 755 "$old/usr/bin/kvpool"
	printf 'Package: kvpool\nVersion: 0.1.0\nArchitecture: %s\nMaintainer: test <test@kvpool.invalid>\nDescription: earlier kvpool with the CLI\n' \
		"$(dpkg --print-architecture)" >"$old/DEBIAN/control"
	check "an earlier kvpool 0.1.0 with /usr/bin/kvpool installs in the root" bash -c "
		dpkg-deb -b --root-owner-group '$old' '$r/tmp/old-kvpool.deb' >/dev/null &&
		$in dpkg -i /tmp/old-kvpool.deb >/dev/null"
	check "kvpool-tools unpacks over it and takes /usr/bin/kvpool (Breaks/Replaces kvpool << 0.1.1~)" bash -c "
		$in dpkg --unpack --auto-deconfigure /tmp/debs/$(basename "$(ls "$r"/tmp/debs/kvpool-tools_*.deb)") &&
		$in dpkg-query -S /usr/bin/kvpool | grep -qx 'kvpool-tools: /usr/bin/kvpool'"
	rm -f "$r/tmp/old-kvpool.deb"
	# -f: kvpool-tools is unpacked, its dependencies not yet installed
	check "apt-get install -f the five packages (and what they depend on) over it" \
		$in apt-get install -f -y -qq --no-install-recommends "${inroot[@]}" || return
	check "  the earlier kvpool is upgraded and kvpool-tools keeps /usr/bin/kvpool" bash -c "
		[ \"\$($in dpkg-query -W -f '\${Version} \${db:Status-Abbrev}' kvpool)\" = '$VERSION ii ' ] &&
		$in dpkg-query -S /usr/bin/kvpool | grep -qx 'kvpool-tools: /usr/bin/kvpool'"
	check "every command the unit runs is there and executable (ExecReload's /bin/kill: procps)" \
		unit_commands_exist "$r"
	check "kvpoold --version runs from the root" \
		bash -c "$in /usr/bin/kvpoold --version | grep -q '^kvpoold $VERSION (protocol '"
	check "kvpool --version runs from the root" bash -c "$in /usr/bin/kvpool --version | grep -q '^kvpool $VERSION '"
	check "sysusers made the system user kvpool" bash -c "$in getent passwd kvpool | grep -q ':/var/lib/kvpool:'"
	check "tmpfiles made /var/lib/kvpool, kvpool's, mode 700" \
		bash -c "[ \"\$($in stat -c %U:%a /var/lib/kvpool)\" = kvpool:700 ]"
	check "kvpoold.service enabled (multi-user.target.wants)" \
		test -L "$r/etc/systemd/system/multi-user.target.wants/kvpoold.service"
	check "/etc/kvpool/kvpool.conf is a conffile" \
		bash -c "$in dpkg-query -W -f '\${Conffiles}' kvpool | grep -q '/etc/kvpool/kvpool.conf '"
	check "python3 -c 'import kvpool' loads libkvpool1's library" \
		bash -c "$in python3 -c 'import kvpool, sys; print(kvpool.library_path, kvpool.__version__); assert kvpool.library_path == \"libkvpool.so.1\" and kvpool.__version__ == \"$VERSION\"'"
	check "the entry point is in python3-kvpool's metadata" $in python3 -c "$ENTRY_POINT"
	check "pkg-config file of libkvpool-dev names the multiarch libdir" \
		grep -qx "libdir=\${prefix}/lib/$MULTIARCH" "$r/usr/lib/$MULTIARCH/pkgconfig/kvpool.pc"

	# kvpoold from the root, as the unit starts it: its user, its conffile
	# (ports moved to free ones by flags, which win over the file).
	local port admin
	read -r port admin < <(free_ports 2)
	chroot --userspec=kvpool:kvpool "$r" /usr/bin/kvpoold --config /etc/kvpool/kvpool.conf \
		--port "$port" --admin-port "$admin" --rdma-port 0 --dram-capacity 64MiB \
		>"$work/root-kvpoold.log" 2>&1 &
	local rpid=$!
	pids+=("$rpid")
	check "the installed kvpoold serves as user kvpool with /etc/kvpool/kvpool.conf" bash -c "
		for i in \$(seq 100); do
			'$build_dir/kvpool' ping --server tcp://127.0.0.1:$port >/dev/null 2>&1 && exit 0
			sleep 0.1
		done
		cat '$work/root-kvpoold.log'; exit 1"
	kill -TERM "$rpid" 2>/dev/null
	check "and stops cleanly on SIGTERM" wait "$rpid"
	mkdir -p "$r/var/lib/kvpool/nvme" && touch "$r/var/lib/kvpool/nvme/segment-test"
	# a tokens file the operator added, where the docs put it
	printf '[tokens]\n' >"$r/etc/kvpool/tokens"

	# a first purge with a disk mounted in the state directory (a tmpfs
	# for the NVMe drive an operator mounts at /var/lib/kvpool/nvme): the
	# purge succeeds and leaves that file system alone
	local disk=$r/var/lib/kvpool/nvme
	if mount -t tmpfs -o size=1m tmpfs "$disk" 2>/dev/null; then
		mounts+=("$disk")
		touch "$disk/segment-on-disk" "$r/var/lib/kvpool/index-test"
		check "apt-get purge kvpool with a file system mounted at /var/lib/kvpool/nvme" \
			$in apt-get purge -y -qq kvpool
		check "  it emptied /var/lib/kvpool but not the mounted file system" bash -c "
			[ -e '$disk/segment-on-disk' ] && [ ! -e '$r/var/lib/kvpool/index-test' ]"
		check "  dpkg has kvpool purged (not half-purged)" bash -c "
			s=\$($in dpkg-query -W -f '\${db:Status-Abbrev}' kvpool 2>/dev/null)
			case \"\$s\" in ''|?n*) ;; *) echo \"kvpool: \$s\"; exit 1 ;; esac"
		umount "$disk"
		check "apt-get install kvpool again" $in apt-get install -y -qq --no-install-recommends \
			"/tmp/debs/$(basename "$(ls "$r"/tmp/debs/kvpool_*.deb)")"
		mkdir -p "$disk" && touch "$disk/segment-test"
		printf '[tokens]\n' >"$r/etc/kvpool/tokens"
	else
		skip_or_fail "purge with a mounted NVMe disk: mount -t tmpfs failed"
	fi

	check "apt-get purge the five packages" \
		$in apt-get purge -y -qq kvpool kvpool-tools libkvpool1 libkvpool-dev python3-kvpool
	check "purge removed /var/lib/kvpool (the NVMe tier's data)" test ! -e "$r/var/lib/kvpool"
	check "purge removed /etc/kvpool/kvpool.conf" test ! -e "$r/etc/kvpool/kvpool.conf"
	check "and kept the operator's /etc/kvpool/tokens, alone there (docs/operating.md)" \
		test "$(ls -A "$r/etc/kvpool" 2>&1)" = tokens
	rm -rf "$r/etc/kvpool"
	check "purge removed the unit's enable link" \
		test ! -e "$r/etc/systemd/system/multi-user.target.wants/kvpoold.service"
	check "no kvpool file left in /usr" bash -c "! find '$r/usr' -name '*kvpool*' | grep ."
	check "dpkg knows none of the packages any more" \
		bash -c "! $in dpkg-query -W -f '\${db:Status-Abbrev} \${Package}\n' 2>/dev/null | grep -E '^.i.* (kvpool|kvpool-tools|libkvpool1|libkvpool-dev|python3-kvpool)$'"

	# the CLI alone, for a machine that only watches a pool
	check "apt-get install kvpool-tools alone" \
		$in apt-get install -y -qq --no-install-recommends "/tmp/debs/$(basename "$(ls "$r"/tmp/debs/kvpool-tools_*.deb)")"
	check "  kvpool --version runs; no kvpoold, no unit, no configuration" bash -c "
		$in /usr/bin/kvpool --version | grep -q '^kvpool $VERSION ' &&
		[ ! -e '$r/usr/bin/kvpoold' ] && [ ! -e '$r/lib/systemd/system/kvpoold.service' ] &&
		[ ! -e '$r/etc/kvpool' ] &&
		! $in dpkg-query -W -f '\${db:Status-Abbrev} \${Package}\n' | grep -qE '^.i.* kvpool$'"
	check "  apt-get purge kvpool-tools" $in apt-get purge -y -qq kvpool-tools
	if [ -e "$r/proc/self" ]; then umount -l "$r/proc"; fi
}

test_deb() {
	section_begin deb
	local debs=$build_dir/deb k t l d p probe
	# an untracked file (a virtualenv, real tokens) must not reach the
	# copy make deb builds; every tracked file must
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		probe=untracked-packaging-probe-$$.txt
		echo "not for packages" >"$probe" && probes+=("$root/$probe")
		check "make deb-src (the copy make deb builds) holds the tracked files, not the untracked $probe" \
			bash -c "make --no-print-directory -s BUILD='$BUILD' deb-src >/dev/null &&
			diff <(cd '$debs/src' && find . ! -type d | sed 's|^\./||' | sort) \
			     <(git ls-files --cached | while read -r f; do [ -e \"\$f\" ] || [ -L \"\$f\" ] && echo \"\$f\"; done | sort)"
		rm -f "$probe"
	fi
	check "make deb (dpkg-buildpackage -b -us -uc)" bash -c \
		"make --no-print-directory BUILD='$BUILD' deb >'$work/deb.log' 2>&1 || { tail -40 '$work/deb.log'; exit 1; }" ||
		{ section_end; return; }
	k=$(ls "$debs"/kvpool_"$VERSION"_*.deb)
	t=$(ls "$debs"/kvpool-tools_"$VERSION"_*.deb)
	l=$(ls "$debs"/libkvpool1_"$VERSION"_*.deb)
	d=$(ls "$debs"/libkvpool-dev_"$VERSION"_*.deb)
	p=$(ls "$debs"/python3-kvpool_"$VERSION"_all.deb)
	check "five packages at version $VERSION in $BUILD/deb" \
		test -f "$k" -a -f "$t" -a -f "$l" -a -f "$d" -a -f "$p" || { section_end; return; }
	check "kvpool: kvpoold, the unit, sysusers, tmpfiles, /etc/kvpool/kvpool.conf, kvpoold(8)" \
		deb_has "$k" /usr/bin/kvpoold /lib/systemd/system/kvpoold.service \
		/usr/lib/sysusers.d/kvpool.conf /usr/lib/tmpfiles.d/kvpool.conf /etc/kvpool/kvpool.conf \
		/usr/share/man/man8/kvpoold.8.gz
	check "kvpool: not the CLI (kvpool-tools has it)" deb_lacks "$k" '^\./usr/bin/kvpool$|man1/kvpool\.1'
	check "kvpool depends on procps (ExecReload=/bin/kill) and recommends kvpool-tools" bash -c "
		dpkg-deb -f '$k' Depends | grep -qE '(^|, )procps(,|$)' &&
		dpkg-deb -f '$k' Recommends | grep -qx 'kvpool-tools'"
	check "kvpool-tools: kvpool and kvpool(1), no server, no unit" bash -c "
		$(declare -f deb_has deb_lacks); work='$work'
		deb_has '$t' /usr/bin/kvpool /usr/share/man/man1/kvpool.1.gz &&
		deb_lacks '$t' 'kvpoold|systemd|sysusers|tmpfiles|/etc/' &&
		! dpkg-deb --ctrl-tarfile '$t' | tar -t | grep -qE 'postinst|conffiles' &&
		! dpkg-deb -f '$t' Depends | grep -qE '(^|, )kvpool( |,|$)'"
	check "kvpool: the conffile" deb_control_has "$k" conffiles '^/etc/kvpool/kvpool.conf$'
	check "kvpool: postinst creates the user, enables and starts the unit" kvpool_postinst_ok "$k"
	check "kvpool: postrm purge removes /var/lib/kvpool, on its own file system only" \
		deb_control_has "$k" postrm 'rm -rf --one-file-system .*'
	check "kvpool-tools: Breaks and Replaces kvpool (<< 0.1.1~), the kvpool that had /usr/bin/kvpool" bash -c "
		dpkg-deb -f '$t' Breaks | grep -qx 'kvpool (<< 0.1.1~)' &&
		dpkg-deb -f '$t' Replaces | grep -qx 'kvpool (<< 0.1.1~)'"
	check "kvpool: the unit runs /usr/bin/kvpoold with /etc/kvpool/kvpool.conf" bash -c \
		"dpkg-deb --fsys-tarfile '$k' | tar -xO ./lib/systemd/system/kvpoold.service |
		 grep -qx 'ExecStart=/usr/bin/kvpoold --config /etc/kvpool/kvpool.conf'"
	check "libkvpool1: libkvpool.so.1 (SONAME libkvpool.so.1)" \
		deb_has "$l" "/usr/lib/$MULTIARCH/libkvpool.so.1"
	check "libkvpool-dev: kvpool.h, libkvpool.a, libkvpool.so, kvpool.pc" deb_has "$d" \
		/usr/include/kvpool.h "/usr/lib/$MULTIARCH/libkvpool.a" "/usr/lib/$MULTIARCH/libkvpool.so" \
		"/usr/lib/$MULTIARCH/pkgconfig/kvpool.pc"
	check "python3-kvpool: the package and its dist-info with the entry point" deb_has "$p" \
		/usr/lib/python3/dist-packages/kvpool/__init__.py \
		"/usr/lib/python3/dist-packages/kvpool-$VERSION.dist-info/entry_points.txt"
	check "python3-kvpool: no library of its own (it uses libkvpool1)" deb_lacks "$p" 'libkvpool\.so'
	check "python3-kvpool: no INSTALLER or direct_url.json in its dist-info, nor in RECORD (dpkg's)" bash -c "
		$(declare -f deb_lacks)
		deb_lacks '$p' 'dist-info/(INSTALLER|direct_url\.json)\$' &&
		dpkg-deb --fsys-tarfile '$p' | tar -xO --wildcards './usr/lib/python3/dist-packages/kvpool-*.dist-info/RECORD' |
		{ ! grep -E 'INSTALLER|direct_url'; }"
	check "python3-kvpool depends on libkvpool1" bash -c \
		"dpkg-deb -f '$p' Depends | grep -q 'libkvpool1 (>= $VERSION)'"

	# The packages' files, unpacked without their scripts.
	local x=$work/unpacked
	for f in "$k" "$t" "$l" "$d" "$p"; do dpkg-deb -x "$f" "$x"; done
	check "kvpoold --version from the unpacked package" bash -c \
		"'$x/usr/bin/kvpoold' --version | grep -q '^kvpoold $VERSION (protocol '"
	check "the SONAME of libkvpool1's library is libkvpool.so.1" bash -c \
		"objdump -p '$x/usr/lib/$MULTIARCH/libkvpool.so.1' | grep -q 'SONAME *libkvpool.so.1'"

	if command -v lintian >/dev/null; then
		lintian --fail-on error --display-info "$debs"/kvpool_"$VERSION"_*.changes >"$work/lintian.out" 2>&1
		local rc=$?
		grep -v '^running with root privileges' "$work/lintian.out" | sed 's/^/  lintian: /'
		check "lintian: no error" test "$rc" = 0
		printf '  lintian: %s errors, %s warnings\n' "$(grep -c '^E: ' "$work/lintian.out")" \
			"$(grep -c '^W: ' "$work/lintian.out")"
	else
		check "lintian is installed (make deps-packaging)" false
	fi
	deb_root_install
	section_end
}

# ---- Kubernetes -------------------------------------------------------------------

test_k8s() {
	section_begin k8s
	if ! command -v kubectl >/dev/null; then
		check "kubectl is installed (make deps-packaging: kubectl or kubernetes-client)" false
		section_end
		return
	fi
	echo "  $(kubectl version --client 2>/dev/null | head -1)"
	check "kubectl kustomize deploy/kubernetes" kubectl kustomize deploy/kubernetes
	check "kubectl kustomize deploy/kubernetes/etcd" kubectl kustomize deploy/kubernetes/etcd
	if "$PY" "$here/k8s_check.py" --kvpoold "$build_dir/kvpoold" --kvpool "$build_dir/kvpool" \
		>"$work/k8s.out" 2>&1; then
		sed 's/^/  /' "$work/k8s.out"
	else
		sed 's/^/  /' "$work/k8s.out"
		check "k8s_check.py" false
	fi
	section_end
}

start_s=$(date +%s)
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(deps wheel pkgconfig deb k8s)
for s in "${sections[@]}"; do
	case "$s" in
	deps) test_deps ;;
	wheel) test_wheel ;;
	pkgconfig) test_pkgconfig ;;
	deb) test_deb ;;
	k8s) test_k8s ;;
	*) echo "unknown section $s (deps, wheel, pkgconfig, deb, k8s)"; exit 2 ;;
	esac
done
printf 'test-packaging took %d s\n' "$(($(date +%s) - start_s))"
for f in "${failures[@]}"; do printf 'failed: %s\n' "$f"; done
printf 'packaging: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" = 0 ]
