#!/usr/bin/env python3
"""GET throughput of the Python binding for 1 MiB blocks, next to what
libkvpool does without the binding layer and what the C tools measure.

    bench_get.py [--server URL] [--blocks N] [--seconds S] [--batch B] [--rounds R]

Puts N blocks, then runs each row below for S seconds, R rounds with the
rows interleaved, and prints each row's best GB/s and its median client CPU
time per block (this process's user + system time):
  get_into       one block per call into a preallocated numpy array [N, block]
  get_into_many  B blocks per call (pipelined) into the same array
  get            one block per call, returned as new bytes
  bare ctypes    kvpool_get_bytes called straight through ctypes into the
                 same array: libkvpool with no binding code around it
and then the C side: `kvpool bench` GET of the same block size at 1 and B
blocks per call when the CLI has it (its own output, printed as is), else
`kvpool get` of the same blocks, one process per block (which includes
process start, connect and HELLO: a floor, not a peer). The CLI is
$KVPOOL_CLI, else the source tree's build/kvpool, else kvpool on PATH.
GB/s means 10**9 bytes per second. The figures are as noisy as the machine.
"""
import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import kvpool
from kvpool import _lib


def timed(fn, seconds, bytes_per_call):
    """Call fn(i) for `seconds`; returns (GB/s, calls, CPU seconds this
    process used). CPU time per block is what the binding adds to; unlike
    wall time it hardly moves when other processes take the cores."""
    fn(0)                                       # warm-up: connection, page faults
    calls, t0, cpu0 = 0, time.perf_counter(), time.process_time()
    while True:
        fn(calls)
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            cpu = time.process_time() - cpu0
            return calls * bytes_per_call / elapsed / 1e9, calls, cpu


def cli_path():
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.normpath(os.path.join(here, "..", "..", "..", "build", "kvpool"))
    for path in (os.environ.get("KVPOOL_CLI"), built, shutil.which("kvpool")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def c_side(args, keys, block_bytes, batch):
    """The C figures: `kvpool bench` GET at 1 block/call and `batch` blocks/call
    (its own output, as is), or, in a build without it, `kvpool get`."""
    cli = cli_path()
    if not cli:
        print("  C: no kvpool CLI found (set KVPOOL_CLI)")
        return 0
    if subprocess.run([cli, "bench", "--help"], capture_output=True).returncode == 0:
        runs = args.c_bench_args or [
            "--sizes %d --ops put,get --batch %d --duration %g" % (block_bytes, b, args.seconds)
            for b in sorted({1, batch})]
        failed = 0
        for extra in runs:
            cmd = [cli, "bench"] + extra.split() + ["--server", args.server]
            print("  C: " + " ".join(cmd), flush=True)
            failed += subprocess.run(cmd).returncode != 0
        return failed
    n, t0 = min(len(keys), 64), time.perf_counter()
    for k in keys[:n]:
        subprocess.run([cli, "get", k.hex(), "-o", os.devnull, "--server", args.server,
                        "--namespace", args.namespace], check=True)
    gbps = n * block_bytes / (time.perf_counter() - t0) / 1e9
    print("  C: this build has no `kvpool bench`; `kvpool get` of %d blocks, one process "
          "each: %.2f GB/s (process start + connect per block: a floor, not a peer)" % (n, gbps))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default=kvpool.DEFAULT_URL)
    p.add_argument("--namespace", default="bench-get-py")
    p.add_argument("--block-bytes", type=int, default=1 << 20)
    p.add_argument("--blocks", type=int, default=128)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-c", action="store_true", help="print the Python rows only")
    p.add_argument("--c-bench-args", action="append",
                   help="arguments of one `kvpool bench` run, when the CLI has it (may be "
                        "repeated; default: GET of the same block size at 1 and --batch "
                        "blocks per call)")
    args = p.parse_args()
    block_bytes = args.block_bytes

    with kvpool.Client(args.server, args.namespace, timeout=30) as c:
        c.drop_namespace()
        src = np.random.default_rng(1).integers(0, 256, (args.blocks, block_bytes), np.uint8)
        keys = [kvpool.block_hashes([i], 1, extra=b"bench")[0] for i in range(args.blocks)]
        assert c.put_many(keys, list(src)) == [0] * args.blocks
        dst = np.zeros_like(src)
        n, b = args.blocks, min(args.batch, args.blocks)
        h, length = c._handle, ctypes.c_uint64()
        rows = [
            ("get_into (numpy, 1 block/call)", 1, lambda i: c.get_into(keys[i % n], dst[i % n])),
            ("get_into_many (%d blocks/call)" % b, b,
             lambda i: c.get_into_many([keys[(i * b + j) % n] for j in range(b)],
                                       [dst[(i * b + j) % n] for j in range(b)])),
            ("get (new bytes, 1 block/call)", 1, lambda i: c.get(keys[i % n])),
            ("bare ctypes kvpool_get_bytes", 1,
             lambda i: _lib.lib.kvpool_get_bytes(h, keys[i % n], dst[i % n].ctypes.data,
                                                 block_bytes, ctypes.byref(length))),
        ]
        print("kvpool GET, %d-byte blocks, %d blocks in the pool, %s; best of %d rounds "
              "of %.1f s per row, rows interleaved" % (block_bytes, n, args.server, args.rounds,
                                                      args.seconds))
        best, cpu_us = {}, {}
        for _ in range(args.rounds):
            for name, per_call, fn in rows:
                dst[:] = 0
                gbps, calls, cpu = timed(fn, args.seconds, per_call * block_bytes)
                best[name] = max(best.get(name, 0), gbps)
                cpu_us.setdefault(name, []).append(cpu * 1e6 / (calls * per_call))
                if name.startswith("get ("):      # get() returns bytes: check one
                    dst[0] = np.frombuffer(c.get(keys[0]), np.uint8)
                    filled = 1
                else:                             # the blocks the loop wrote
                    filled = min(n, calls * per_call)
                if not np.array_equal(dst[:filled], src[:filled]):
                    print("  verification FAILED in %s" % name)
                    return 1
        print("  %-34s %9s  %s" % ("", "wall", "client CPU per block (median)"))
        for name, _, _ in rows:
            us = sorted(cpu_us[name])[len(cpu_us[name]) // 2]
            print("  %-34s %6.2f GB/s  %6.0f us" % (name, best[name], us))
        print("  every block written into the array was verified")
        failed = 0 if args.no_c else c_side(args, keys, block_bytes, b)
        c.drop_namespace()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
