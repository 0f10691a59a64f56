#!/usr/bin/env bash
# make container-test: build the kvpool image from docker/Dockerfile without
# a Docker engine, start kvpoold from it, and check it from the host.
#
#   1. a Debian 12 minbase root made by debootstrap (cached), imported with
#      "podman import" under the Dockerfile's BASE_IMAGE name, so nothing
#      is pulled;
#   2. buildah bud --isolation chroot --format docker (the OCI format would
#      drop the HEALTHCHECK silently; the test checks it is there);
#   3. buildah from + buildah run --isolation chroot: the entrypoint starts
#      kvpoold on the host network with an NVMe tier on the image's volume
#      directory, its ports given as flags after the image name and its
#      address as KVPOOL_LISTEN=127.0.0.2 (so that a health check guessing
#      from KVPOOL_PORT or 127.0.0.1 fails); "podman run" is not used (it
#      fails here on setrlimit);
#   4. from the host: kvpool health (or ping), a put and a get of a block;
#      inside the container: the HEALTHCHECK command; then SIGTERM, and
#      kvpoold must exit 0.
#
# Needs root, buildah, podman and debootstrap (apt-get install podman
# buildah debootstrap). Without them it skips with a message; under
# CI=true a skip is a failure. Takes ~10 minutes the first time (the base
# root and the build stage's packages), less with the caches.
#
# Environment: BUILD (host build dir, default build), KVPOOL_IMAGE (tag,
# default localhost/kvpool:test), KVPOOL_CONTAINER_CACHE (default
# /var/tmp/kvpool-container), DEBIAN_MIRROR, KVPOOL_CONTAINER_CONTEXT (the
# build context, default the repository root).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
IMAGE=${KVPOOL_IMAGE:-localhost/kvpool:test}
CACHE=${KVPOOL_CONTAINER_CACHE:-/var/tmp/kvpool-container}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CONTEXT=${KVPOOL_CONTAINER_CONTEXT:-$ROOT}
KVPOOL=$ROOT/$BUILD/kvpool
BASE=$(sed -n 's/^ARG BASE_IMAGE=//p' docker/Dockerfile)
HOST=127.0.0.2 # kvpoold's KVPOOL_LISTEN: loopback, but not the health check's old guess

log() { printf '== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
skip() {
	if [ "${CI:-}" = true ]; then
		fail "container test cannot run under CI=true: $*"
	fi
	printf 'SKIP: container test: %s\n' "$*"
	exit 0
}

[ -n "$BASE" ] || fail "docker/Dockerfile has no ARG BASE_IMAGE=..."
[ "$(id -u)" = 0 ] || skip "needs root (buildah --isolation chroot, debootstrap)"
for tool in buildah podman debootstrap; do
	command -v "$tool" >/dev/null ||
		skip "$tool is not installed (apt-get install podman buildah debootstrap)"
done
[ -x "$KVPOOL" ] || fail "$KVPOOL is missing: make BUILD=$BUILD all first"

start_s=$(date +%s)
elapsed() { echo "$(($(date +%s) - start_s)) s"; }

# ---- 1. the base image ---------------------------------------------------------
base_image() {
	local tarball=$CACHE/debian12-minbase.tar root
	if podman image exists "$BASE"; then
		log "base image $BASE present"
		return
	fi
	mkdir -p "$CACHE"
	if [ ! -s "$tarball" ]; then
		root=$(mktemp -d "$CACHE/root.XXXXXX")
		log "debootstrap --variant=minbase bookworm from $MIRROR (a few minutes)"
		debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
			{ tail -20 "$CACHE/debootstrap.log"; fail "debootstrap failed"; }
		rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
		tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
		rm -rf "$root"
	fi
	log "podman import as $BASE"
	podman import "$tarball" "$BASE" >/dev/null
}

# ---- 2. the image ----------------------------------------------------------------
build_image() {
	local t0
	t0=$(date +%s)
	log "buildah bud --isolation chroot --format docker -t $IMAGE (context $CONTEXT)"
	buildah bud --isolation chroot --format docker --pull=never --layers \
		-f "$ROOT/docker/Dockerfile" -t "$IMAGE" "$CONTEXT"
	log "image built in $(($(date +%s) - t0)) s"
	local hc
	hc=$(buildah inspect --type image --format '{{.Docker.Config.Healthcheck}}' "$IMAGE")
	case "$hc" in
	*kvpool-entrypoint*health*) log "HEALTHCHECK kept: $hc" ;;
	*) fail "image has no HEALTHCHECK (built as OCI?): '$hc'" ;;
	esac
	[ "$(buildah inspect --type image --format '{{.Docker.Config.User}}' "$IMAGE")" = kvpool ] ||
		fail "image does not run as the kvpool user"
}

# ---- 3. kvpoold from the image -------------------------------------------------
ctr='' run_pid='' port='' server_log=''
cleanup() {
	if [ -n "$run_pid" ] && kill -0 "$run_pid" 2>/dev/null; then
		stop_server >/dev/null 2>&1 || kill -KILL "$run_pid" 2>/dev/null || true
	fi
	if [ -n "$ctr" ]; then buildah rm "$ctr" >/dev/null 2>&1 || true; fi
	[ -n "$server_log" ] && rm -f "$server_log"
}
trap cleanup EXIT

# A free TCP port pair on the host (data port and the admin port after it).
free_port() {
	local p
	for _ in $(seq 1 50); do
		p=$((20000 + RANDOM % 30000))
		if ! ss -Hltn "( sport = :$p or sport = :$((p + 1)) )" 2>/dev/null | grep -q .; then
			echo "$p"
			return
		fi
	done
	fail "no free port"
}

start_server() {
	ctr=$(buildah from --pull=never "$IMAGE")
	port=$(free_port)
	server_log=$(mktemp /tmp/kvpool-container.XXXXXX.log)
	log "buildah run $ctr: kvpoold on $HOST:$port, admin $((port + 1)) (flags after the image name), NVMe tier on the volume"
	buildah run --isolation chroot --network host \
		--env KVPOOL_LISTEN="$HOST" --env KVPOOL_DRAM_CAPACITY=64MiB \
		--env KVPOOL_NVME_CAPACITY=256MiB --env KVPOOL_THREADS=2 \
		"$ctr" -- /usr/local/bin/kvpool-entrypoint kvpoold --port "$port" \
		--admin-port "$((port + 1))" >"$server_log" 2>&1 &
	run_pid=$!
	for _ in $(seq 1 300); do
		if "$KVPOOL" ping --server "tcp://$HOST:$port" >/dev/null 2>&1; then
			return
		fi
		kill -0 "$run_pid" 2>/dev/null || { cat "$server_log"; fail "kvpoold in the container exited"; }
		sleep 0.2
	done
	cat "$server_log"
	fail "kvpoold in the container did not answer within 60 s"
}

# SIGTERM to kvpoold (its pid from STATS: chroot isolation shares the host's
# pid namespace), then wait for buildah run to return kvpoold's status.
stop_server() {
	local pid rc=0
	pid=$("$KVPOOL" stats --json --server "tcp://$HOST:$port" |
		sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' | head -1)
	[ -n "$pid" ] || return 1
	kill -TERM "$pid"
	wait "$run_pid" || rc=$?
	run_pid=
	return "$rc"
}

# ---- 4. checks from the host and inside the container ---------------------------
check_server() {
	local url="tcp://$HOST:$port" data got
	if "$KVPOOL" health --help >/dev/null 2>&1; then
		"$KVPOOL" health --server "$url" || fail "kvpool health failed"
		log "kvpool health: ok"
	else
		"$KVPOOL" ping --server "$url" >/dev/null || fail "kvpool ping failed"
		log "kvpool ping: ok (this CLI has no health command)"
	fi
	# the server's environment, as the HEALTHCHECK has it: not the flags
	# after the image name, which the entrypoint recorded from kvpoold
	buildah run --isolation chroot --network host --env KVPOOL_LISTEN="$HOST" \
		"$ctr" -- /usr/local/bin/kvpool-entrypoint health ||
		fail "the image's HEALTHCHECK command failed (ports from flags, KVPOOL_LISTEN=$HOST)"
	log "HEALTHCHECK command in the container (admin /healthz on $HOST): ok"
	data=$(mktemp) got=$(mktemp)
	head -c 1048576 /dev/urandom >"$data"
	"$KVPOOL" put text:container-test "$data" --server "$url" --namespace container ||
		fail "kvpool put failed"
	"$KVPOOL" get text:container-test -o "$got" --server "$url" --namespace container ||
		fail "kvpool get failed"
	cmp -s "$data" "$got" || fail "the block came back different"
	rm -f "$data" "$got"
	log "put and get of a 1 MiB block from the host: ok"
}

base_image
build_image
start_server
check_server
stop_server || { cat "$server_log"; fail "kvpoold did not exit 0 on SIGTERM"; }
log "kvpoold in the container exited 0 on SIGTERM"
if grep -qiE 'error|fatal' "$server_log"; then
	cat "$server_log"
	fail "kvpoold logged errors"
fi
log "container test passed in $(elapsed)"
