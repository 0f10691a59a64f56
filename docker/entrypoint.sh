#!/bin/sh
# kvpool-entrypoint: how the kvpool image starts. Also runs outside a
# container (CI does): KVPOOLD and KVPOOL_CLI name the binaries (default:
# kvpoold and kvpool from PATH), NVME_ROOT the data directory (default
# /var/lib/kvpool).
#
#   kvpool-entrypoint [kvpoold] [FLAG...]  check the data directory and the
#                                          tokens file, then exec kvpoold
#   kvpool-entrypoint health               exit 0 when the local kvpoold is
#                                          healthy, else 1 (the HEALTHCHECK)
#   kvpool-entrypoint COMMAND [ARG...]     exec anything else (kvpool replay ...)
#
# Settings come from KVPOOL_<NAME> variables (kvpoold --help lists them) or
# flags. With KVPOOL_NVME_CAPACITY set and no KVPOOL_NVME_DIR, the NVMe
# tier lives in $NVME_ROOT/nvme.
set -eu

KVPOOLD=${KVPOOLD:-kvpoold}
KVPOOL_CLI=${KVPOOL_CLI:-kvpool}
NVME_ROOT=${NVME_ROOT:-/var/lib/kvpool}

die() {
	echo "kvpool-entrypoint: $*" >&2
	exit 1
}

# The NVMe directory must exist and be writable by this user, or kvpoold
# would stop with a less direct message after opening the pool.
check_nvme_dir() {
	if [ -n "${KVPOOL_NVME_CAPACITY:-}" ] && [ -z "${KVPOOL_NVME_DIR:-}" ]; then
		KVPOOL_NVME_DIR=$NVME_ROOT/nvme
		export KVPOOL_NVME_DIR
	fi
	[ -n "${KVPOOL_NVME_DIR:-}" ] || return 0
	mkdir -p "$KVPOOL_NVME_DIR" 2>/dev/null ||
		die "cannot create nvme_dir $KVPOOL_NVME_DIR as uid $(id -u): mount a volume it can write"
	[ -w "$KVPOOL_NVME_DIR" ] ||
		die "nvme_dir $KVPOOL_NVME_DIR is not writable by uid $(id -u) (chown it, or mount a volume)"
}

# A mounted tokens file must be readable by this user (kvpoold checks its mode).
check_tokens_file() {
	[ -n "${KVPOOL_TOKENS_FILE:-}" ] || return 0
	[ -r "$KVPOOL_TOKENS_FILE" ] ||
		die "tokens_file $KVPOOL_TOKENS_FILE is missing or not readable by uid $(id -u)"
}

# Where kvpoold really listens, from its own reading of every source
# (flags after the image name, KVPOOL_* variables, --config files): the
# health check must not guess from the environment alone.
HEALTH_FILE=${KVPOOL_HEALTH_FILE:-/tmp/kvpool-health.env}
record_endpoints() {
	settings=$("$KVPOOLD" --print-config "$@" 2>/dev/null) || return 0
	listen=$(printf '%s\n' "$settings" | sed -n 's/^listen //p')
	port=$(printf '%s\n' "$settings" | sed -n 's/^port //p')
	admin=$(printf '%s\n' "$settings" | sed -n 's/^admin_port //p')
	# a wildcard address is reached on loopback
	case "$listen" in
	0.0.0.0 | "") listen=127.0.0.1 ;;
	:: | "[::]") listen=::1 ;;
	esac
	case "$listen" in *:*) listen="[$listen]" ;; esac
	umask 077
	printf 'HEALTH_HOST=%s\nHEALTH_PORT=%s\nHEALTH_ADMIN_PORT=%s\n' "$listen" "$port" "$admin" \
		>"$HEALTH_FILE.tmp" 2>/dev/null && mv "$HEALTH_FILE.tmp" "$HEALTH_FILE" 2>/dev/null || true
}

# Health of the kvpoold next to us: its admin port's /healthz (503 while it
# starts or drains), or with the admin port off, an answer on the data
# port. A CLI without "kvpool health" falls back to a PING. The address
# and ports are the ones kvpoold was started with (record_endpoints), else
# those of the environment.
health() {
	HEALTH_HOST=127.0.0.1 HEALTH_PORT=${KVPOOL_PORT:-7470} HEALTH_ADMIN_PORT=${KVPOOL_ADMIN_PORT:-7471}
	if [ -r "$HEALTH_FILE" ]; then
		. "$HEALTH_FILE"
	fi
	url="tcp://$HEALTH_HOST:$HEALTH_PORT"
	admin_port=$HEALTH_ADMIN_PORT
	if ! "$KVPOOL_CLI" health --help >/dev/null 2>&1; then
		exec "$KVPOOL_CLI" ping --server "$url" "$@"
	fi
	if [ "$admin_port" != 0 ]; then
		exec "$KVPOOL_CLI" health --admin "$HEALTH_HOST:$admin_port" "$@"
	fi
	exec "$KVPOOL_CLI" health --server "$url" "$@"
}

cmd=${1:-kvpoold}
case "$cmd" in
kvpoold | -*)
	if [ "$cmd" = kvpoold ] && [ $# -gt 0 ]; then
		shift
	fi
	check_nvme_dir
	check_tokens_file
	# the CLI's variables are not settings: keep them from kvpoold's warnings
	record_endpoints "$@"
	exec env -u KVPOOL_CLI -u KVPOOL_TOKEN -u KVPOOL_URL -u KVPOOL_HEALTH_FILE "$KVPOOLD" "$@"
	;;
health)
	shift
	health "$@"
	;;
*)
	exec "$@"
	;;
esac
