#!/usr/bin/env bash
# 1 MiB GET and PUT over TLS against plaintext, in one run, against one
# kvpoold serving both on its data port (tls_only false).
#
#   tests/bench/tls.sh [--rounds R] [--blocks N] [--batch B]
#
# Makes a throw-away CA and server certificate with the openssl command
# line, starts $BUILD/kvpoold (2 workers, 1 GiB arena) on a free loopback
# port, runs $BUILD/tests/tls_bench twice - the client asking for kernel
# TLS, then in user space only - and prints kvpoold's STATS "tls" object,
# whose kernel_tls counts say whether the server's side ran in the kernel
# (the Linux tls module and OpenSSL's kernel TLS) or in user space. Then
# libkvpool itself: kvpool bench over tcp:// and over tls://.
# Needs make bench first.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) b=$BUILD ;; *) b=$root/$BUILD ;; esac
args=("$@")
dir=$(mktemp -d /tmp/kvpool-tls-bench-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
	-out ca.pem -days 2 -subj "/CN=kvpool bench CA" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout srv.key \
	-out srv.csr -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >ext.cnf
openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 \
	-extfile ext.cnf 2>/dev/null
chmod 600 srv.key
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
admin=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$b/kvpoold" --port "$port" --admin-port "$admin" --threads 2 --dram-capacity 1GiB \
	--max-block-bytes 4MiB --tls-cert-file srv.pem --tls-key-file srv.key --tls-only false \
	--log-level warn &
pid=$!
for _ in $(seq 100); do
	curl -sf "http://127.0.0.1:$admin/healthz" >/dev/null 2>&1 && break
	sleep 0.1
done
if [ -r /proc/net/tls_stat ]; then
	echo "kernel: tls module loaded (/proc/net/tls_stat present)"
else
	echo "kernel: no tls module (/proc/net/tls_stat absent; modprobe tls may load it): user-space TLS"
fi
echo "== client asks for kernel TLS"
"$b/tests/tls_bench" --port "$port" --ca ca.pem "${args[@]}"
echo "== client in user space (--no-ktls)"
"$b/tests/tls_bench" --port "$port" --ca ca.pem --no-ktls "${args[@]}"
echo "== libkvpool (kvpool bench, 1 MiB, batch 4): tcp:// then tls:// on the same port"
lib_bench() {
	KVPOOL_TLS_CA=ca.pem "$b/kvpool" bench --server "$1" --sizes 1MiB --ops put,get --batch 4 \
		--duration 2 --source-bytes 64MiB --json
}
plain=$(lib_bench "tcp://127.0.0.1:$port")
tls=$(lib_bench "tls://127.0.0.1:$port")
python3 - "$plain" "$tls" <<'PYEOF'
import json, sys
plain, tls = (json.loads(a) for a in sys.argv[1:3])
rate = lambda doc, op: [r["gbps"] for r in doc["results"] if r["op"] == op][0]
for op in ("put", "get"):
    p, t = rate(plain, op), rate(tls, op)
    print("%s  plaintext %.3f GB/s  tls %.3f GB/s  ratio %.2f" % (op, p, t, t / p))
PYEOF
echo "== kvpoold STATS tls"
curl -sf "http://127.0.0.1:$admin/stats" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["tls"]))'
