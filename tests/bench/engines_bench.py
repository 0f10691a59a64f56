#!/usr/bin/env python3
"""Engine adapter throughput against the raw binding, on one kvpoold.

For each engine adapter (kvpool.sglang, kvpool.vllm tier, kvpool.lmcache
MP plugin) this moves 1 MiB pages through the adapter and the same pages,
from and into the same buffers, through the raw binding, alternating the
two, and prints the best round of each in GiB/s and their ratio:
  set         the engine's store call        vs put_chain
  get         the engine's load call         vs get_into_many
  exists+get  its exists/lookup, then load   vs match (with a lease), then
                                                get_into_many The engines are not needed: the adapters run over
the contract tests' stand-in base classes.

  tests/bench/engines_bench.py [--url tcp://host:port] [--pages 64] [--rounds 5]
                               [--engines sglang,vllm,lmcache]

Without --url it starts build/kvpoold on a free loopback port.
"""

import argparse
import os
import select
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENG = os.path.join(ROOT, "tests", "python", "engines")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
for r in ("sglang_root", "vllm_root", "lmcache_root"):
    sys.path.append(os.path.join(ENG, "standins", r))
sys.path.insert(0, ENG)

import numpy as np  # noqa: E402
import kvpool  # noqa: E402

MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Keys:
    """Fresh keys per round, so every set really sends its payload."""

    def __init__(self, tag):
        self.tag, self.n = tag, 0

    def __call__(self, pages):
        self.n += 1
        return kvpool.block_hashes(list(range(pages)), 1,
                                   extra=("%s-%d" % (self.tag, self.n)).encode())


def state_keys(r_get):
    """The raw keys of the last round (kept in the closure's state dict)."""
    for cell in r_get.__closure__ or ():
        v = cell.cell_contents
        if isinstance(v, dict) and "r" in v:
            return v["r"]
    raise LookupError("no raw keys")


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_sglang(url, pages):
    import torch
    import kvpool.sglang as ks
    from sglang.srt.mem_cache import hicache_storage as hs
    from sglang_fake_pool import FakeHostPool
    pool = FakeHostPool(pages=2 * pages, page_size=32, layers=8, heads=8, head_dim=128,
                        dtype=torch.bfloat16)
    assert pool.page_bytes() == MIB
    cfg = hs.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "bench",
                                  extra_config={"url": url, "namespace_prefix": "bench-a"})
    b = ks.KVPoolHiCacheStorage(cfg, {})
    b.register_mem_pool_host(pool)
    raw = kvpool.Client(url, "bench-raw-sglang")
    src_idx, dst_idx = pool.indices(0, pages), pool.indices(pages, pages)
    src, _ = b._page_buffers(src_idx, pages)        # the same K/V pieces the adapter uses
    dst, _ = b._page_buffers(dst_idx, pages)
    keys_a, keys_r = Keys("sa"), Keys("sr")
    state = {}

    def a_set():
        state["a"] = [k.hex() for k in keys_a(pages)]
        assert all(b.batch_set_v1(state["a"], src_idx))

    def a_exists():
        assert b.batch_exists(state["a"]) == pages

    def a_get():
        assert all(b.batch_get_v1(state["a"], dst_idx))

    def r_set():
        state["r"] = keys_r(pages)
        assert not any(raw.put_chain(state["r"], src))

    def r_get():
        assert all(n == MIB for n in raw.get_into_many(state["r"], dst))
    return a_set, a_exists, a_get, r_set, r_get, raw, lambda: (b.close(), raw.close())


def bench_vllm(url, pages):
    import kvpool.vllm as kv
    from vllm.v1.kv_offload.tiering.base import JobMetadata, ReqContext
    rows = np.zeros((2 * pages, MIB), dtype=np.uint8)
    rows[:pages] = 1
    t = kv.KVPoolSecondaryTier(None, memoryview(rows), "kvpool", url=url,
                               namespace_prefix="bench-a")
    raw = kvpool.Client(url, "bench-raw-vllm")
    src = [memoryview(rows[i]) for i in range(pages)]
    dst = [memoryview(rows[pages + i]) for i in range(pages)]
    keys_a, keys_r = Keys("va"), Keys("vr")
    state = {"job": 0}

    def run_job(submit, keys, ids):
        state["job"] += 1
        submit(JobMetadata(state["job"], keys, np.array(ids), False, ReqContext("b")))
        while True:
            done = t.get_finished()
            if done:
                assert done[0].job_id == state["job"] and done[0].success
                return
            time.sleep(0.0002)

    def a_set():
        state["a"] = [k + bytes(4) for k in keys_a(pages)]
        run_job(t.submit_store, state["a"], list(range(pages)))

    def a_exists():
        for k in state["a"]:
            t.lookup(k, ReqContext("b"))
        while any(t.lookup(k, ReqContext("b")) is not True for k in state["a"]):
            time.sleep(0.0002)

    def a_get():
        run_job(t.submit_load, state["a"], list(range(pages, 2 * pages)))

    def r_set():
        state["r"] = keys_r(pages)
        assert not any(raw.put_chain(state["r"], src))

    def r_get():
        assert all(n == MIB for n in raw.get_into_many(state["r"], dst))
    return a_set, a_exists, a_get, r_set, r_get, raw, lambda: (t.shutdown(), raw.close())


def bench_lmcache(url, pages):
    import kvpool.lmcache as kl
    p = kl.KVPoolL2Plugin(url=url, namespace_prefix="bench-a")
    raw = kvpool.Client(url, "bench-raw-lmcache")
    buf = np.ones((2 * pages, MIB), dtype=np.uint8)
    src = [memoryview(buf[i]) for i in range(pages)]
    dst = [memoryview(buf[pages + i]) for i in range(pages)]
    keys_a, keys_r = Keys("la"), Keys("lr")
    state = {}

    def wait(fid):
        while True:
            select.select([p.event_fd()], [], [], 5)
            got = p.drain_completions()
            if got:
                assert got[0][0] == fid and got[0][1], got
                return

    def a_set():
        state["a"] = ["bench@00000000@0@%s" % k.hex() for k in keys_a(pages)]
        wait(p.submit_batch_set(state["a"], src))

    def a_exists():
        wait(p.submit_batch_exists(state["a"]))

    def a_get():
        wait(p.submit_batch_get(state["a"], dst))

    def r_set():
        state["r"] = keys_r(pages)
        assert not any(raw.put_chain(state["r"], src))

    def r_get():
        assert all(n == MIB for n in raw.get_into_many(state["r"], dst))
    return a_set, a_exists, a_get, r_set, r_get, raw, lambda: (p.close(), raw.close())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--pages", type=int, default=64, help="1 MiB pages per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engines", default="sglang,vllm,lmcache",
                    help="comma-separated subset of sglang,vllm,lmcache")
    args = ap.parse_args()
    proc = None
    url = args.url
    if not url:
        port = free_port()
        proc = subprocess.Popen([os.environ.get("KVPOOLD") or os.path.join(ROOT, "build",
                                                                           "kvpoold"),
                                 "--listen", "127.0.0.1", "--port", str(port), "--admin-port",
                                 "0", "--dram-capacity", "2GiB", "--threads", "2"],
                                stderr=subprocess.DEVNULL)
        url = "tcp://127.0.0.1:%d" % port
        deadline = time.monotonic() + 10
        while True:
            try:
                kvpool.Client(url, "ready").close()
                break
            except kvpool.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    gib = args.pages * MIB / (1 << 30)
    print("1 MiB pages, %d per round, best of %d rounds, GiB/s (kvpoold at %s)"
          % (args.pages, args.rounds, url))
    print("%-8s %-10s %10s %10s %7s" % ("engine", "op", "adapter", "raw", "ratio"))
    try:
        wanted = args.engines.split(",")
        for name, make in (("sglang", bench_sglang), ("vllm", bench_vllm),
                           ("lmcache", bench_lmcache)):
            if name not in wanted:
                continue
            a_set, a_exists, a_get, r_set, r_get, raw, close = make(url, args.pages)

            def r_exists():
                assert raw.match(state_keys(r_get), 30000) == args.pages
            a_set(), a_exists(), a_get(), r_set(), r_get()          # warm up
            t = {k: float("inf") for k in ("as", "ae", "ag", "rs", "re", "rg")}
            for i in range(args.rounds):
                # alternate which side goes first, so neither gets the warmer pool
                sides = [("a", a_set, a_exists, a_get), ("r", r_set, r_exists, r_get)]
                for side, put, exists, get in (sides if i % 2 == 0 else sides[::-1]):
                    t[side + "s"] = min(t[side + "s"], timed(put))
                    t[side + "e"] = min(t[side + "e"], timed(exists))
                    t[side + "g"] = min(t[side + "g"], timed(get))
            for op, a, r in (("set", t["as"], t["rs"]), ("get", t["ag"], t["rg"]),
                             ("exists+get", t["ae"] + t["ag"], t["re"] + t["rg"])):
                print("%-8s %-10s %10.2f %10.2f %7.2f" % (name, op, gib / a, gib / r, r / a))
            close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
