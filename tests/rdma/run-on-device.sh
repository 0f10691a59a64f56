#!/usr/bin/env bash
# Run the RDMA tests on a machine with an RDMA device (a NIC, or SoftRoCE
# set up as in rdma/README.md): the unit and integration suite, then a
# throughput run over rdma://. Without a device: "skipped: no RDMA device",
# exit 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}

has_device() {
	if command -v ibv_devices >/dev/null 2>&1; then
		ibv_devices 2>/dev/null | awk 'NR > 2 && NF { found = 1 } END { exit !found }'
		return
	fi
	[ -d /sys/class/infiniband ] && [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]
}

if ! has_device; then
	echo "skipped: no RDMA device"
	exit 0
fi

make BUILD="$BUILD" RDMA=1 all "$BUILD/tests/unit_rdma"
"$BUILD/tests/unit_rdma"
make BUILD="$BUILD" RDMA=1 test

# Not KVPOOL_* names: kvpoold reads KVPOOL_<SETTING> from its environment,
# and make test above would hand them to every server it starts.
addr=${RDMA_TEST_ADDR:?set RDMA_TEST_ADDR to the address of the RDMA netdev}
port=${RDMA_TEST_PORT:-17470}
rport=${RDMA_TEST_RDMA_PORT:-17472}
# Not loopback and no tokens file: a test server on a lab network opts out
# of protected mode; no admin HTTP (its default port may be taken).
"$BUILD/kvpoold" --listen "$addr" --port "$port" --rdma-port "$rport" --dram-capacity 2GiB \
	--admin-port 0 --allow-unauthenticated true &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
sleep 2
"$BUILD/kvpool" stats --server "tcp://$addr:$port" | grep '^rdma:'
if "$BUILD/kvpool" stats --server "tcp://$addr:$port" | grep -q '^rdma: available'; then
	"$BUILD/kvpool" bench --server "rdma://$addr:$rport"
else
	echo "rdma not served by kvpoold (see the line above); no rdma:// throughput run"
fi
