#!/usr/bin/env python3
"""Engine adapter throughput against the raw binding, on one kvpoold.

For each adapter path (kvpool.sglang, the kvpool.vllm tier and connector,
the kvpool.lmcache MP plugin and remote connector) this moves 1 MiB pages
through the adapter's own entry point and the same pages, from and into
the same buffers, through the raw binding:
  set   the engine's store call     vs put_chain (the same pieces)
  get   the engine's load call      vs get_into_many (the same pieces)
Adapter and raw runs alternate in pairs (which goes first alternates too);
each pair gives a ratio adapter GiB/s / raw GiB/s, and the table prints
the median GiB/s of each side and the median of the pair ratios (the
target is >= 0.9). The engines are not needed: the adapters run over the
contract tests' stand-in base classes.

  tests/bench/engines_bench.py [--url tcp://host:port] [--pages 64] [--rounds 9]
                               [--engines sglang,vllm-tier,vllm-connector,lmcache-mp,lmcache-remote]

Without --url it starts build/kvpoold on a free loopback port.
"""

import argparse
import asyncio
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

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


class _FlashAttention:
    """What the tier asks of vLLM's --attention-backend (a stand-in of
    FlashAttention's answers: any multiple of 16 tokens, no required
    layout)."""

    @staticmethod
    def get_name():
        return "FLASH_ATTN"

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [16, 32, 64, 128, 256]

    @classmethod
    def get_required_kv_cache_layout(cls):
        return None


def tier_config():
    """The vllm_config fields the tier reads: vLLM run with
    --attention-backend and 16-token blocks."""
    from types import SimpleNamespace as NS
    return NS(attention_config=NS(backend=_FlashAttention),
              cache_config=NS(block_size=16, cache_dtype="auto",
                              prefix_caching_hash_algo="sha256"))


def bench_vllm(url, pages):
    import kvpool.vllm as kv
    from vllm.v1.kv_offload.tiering.base import JobMetadata, ReqContext
    rows = np.zeros((2 * pages, MIB), dtype=np.uint8)
    rows[:pages] = 1
    t = kv.KVPoolSecondaryTier(tier_config(), memoryview(rows), "kvpool", url=url,
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


def bench_vllm_connector(url, pages):
    """Worker-side save (wait_for_save) and load (start_load_kv) of chunks of
    2 blocks x 8 layers x K,V x (16 tokens x 8 heads x 128) fp16 = 1 MiB."""
    import torch
    import vllm_standin_layouts as vl
    from test_vllm_connector import Setup, vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    setup = Setup(heads=8, dim=128, layers=8, dtype=torch.float16)
    kcc = vl.kv_cache_config(4 * pages + 2, setup.groups())
    backends = {n: setup.backend for names, _ in setup.groups() for n in names}
    caches = vl.reshape(kcc, backends, [setup.block])
    for t in caches.values():
        t.fill_(1)
    w = KVConnectorFactory.create_connector(vllm_config(url, "bench-a", setup, chunk_blocks=2),
                                            KVConnectorRole.WORKER, kcc)
    w.register_kv_caches(caches)
    raw = kvpool.Client(url, "bench-raw-vllm-conn")
    src = [([2 * i + 1, 2 * i + 2],) for i in range(pages)]
    dst = [([2 * pages + 2 * i + 1, 2 * pages + 2 * i + 2],) for i in range(pages)]
    assert w._chunk_bytes() == MIB
    src_bufs, _, _ = w._buffers(src)
    dst_bufs, _, _ = w._buffers(dst)
    keys_a, keys_r = Keys("vca"), Keys("vcr")
    state = {}

    def meta(loads=(), stores=()):
        from kvpool.vllm.connector import KVPoolConnectorMetadata
        m = KVPoolConnectorMetadata()
        m.loads, m.stores = list(loads), list(stores)
        return m

    def a_set():
        state["a"] = keys_a(pages)
        w.bind_connector_metadata(meta(stores=[("r", state["a"], src, None)]))
        w.wait_for_save()
        assert w.flush_stores()              # the store runs in the background: its end
        w.clear_connector_metadata()

    def a_get():
        w.bind_connector_metadata(meta(loads=[("r", state["a"], dst)]))
        w.start_load_kv(SimpleNamespace())
        w.clear_connector_metadata()
        assert not w.get_block_ids_with_load_errors()

    def r_set():
        state["r"] = keys_r(pages)
        assert not any(raw.put_chain(state["r"], src_bufs))

    def r_get():
        assert all(n == MIB for n in raw.get_into_many(state["r"], dst_bufs))
    return a_set, a_get, r_set, r_get, lambda: (w.shutdown(), raw.close())


def bench_lmcache_remote(url, pages):
    """The non-MP remote connector's batched_put and batched_get, driven
    on an asyncio loop as LMCache's RemoteBackend does, with memory objects
    from a pool (as LMCache's allocator reuses its buffers)."""
    import torch
    import kvpool.lmcache as kl
    from lmcache.v1.storage_backend.connector import ConnectorContext
    shape = (2, 8, 256, 128)                 # (K/V, layers, tokens, hidden) fp16 = 1 MiB

    class Obj:
        def __init__(self):
            self.tensor = torch.ones(shape, dtype=torch.float16)
            self.byte_array = memoryview(self.tensor.numpy()).cast("B")

        def get_shape(self):
            return torch.Size(shape)

        def get_dtype(self):
            return torch.float16

        def get_memory_format(self):
            return "KV_2LTD"

        def ref_count_down(self):
            pass

    class Backend:
        def __init__(self, n):
            self.free = [Obj() for _ in range(n)]
            self.i = 0

        def allocate(self, shapes, dtypes, fmt=None, eviction=True, busy_loop=True):
            o = self.free[self.i % len(self.free)]
            self.i += 1
            return o

    class Key:
        def __init__(self, s):
            self.s = s

        def to_string(self):
            return self.s

    loop = asyncio.new_event_loop()
    config = SimpleNamespace(chunk_size=256, extra_config={
        "remote_storage_plugin.kvpool.url": url,
        "remote_storage_plugin.kvpool.namespace_prefix": "bench-a", "save_chunk_meta": False})
    meta = SimpleNamespace(model_name="bench", world_size=1, worker_id=0,
                           kv_dtype=torch.float16, kv_shape=(8, 2, 256, 1, 128))
    backend = Backend(pages)
    conn = kl.KVPoolConnectorAdapter().create_connector(
        ConnectorContext("plugin://kvpool", loop, backend, config, meta, "kvpool"))
    raw = kvpool.Client(url, "bench-raw-lmc-remote")
    src = [Obj() for _ in range(pages)]
    src_bufs = [o.byte_array for o in src]
    dst_bufs = [o.byte_array for o in backend.free]
    keys_a, keys_r = Keys("lra"), Keys("lrr")
    state = {}

    def a_set():
        state["a"] = [Key("bench@1@0@%s@half" % k.hex()) for k in keys_a(pages)]
        loop.run_until_complete(conn.batched_put(state["a"], src))

    def a_get():
        got = loop.run_until_complete(conn.batched_get(state["a"]))
        assert all(g is not None for g in got)

    def r_set():
        state["r"] = keys_r(pages)
        assert not any(raw.put_chain(state["r"], src_bufs))

    def r_get():
        assert all(n == MIB for n in raw.get_into_many(state["r"], dst_bufs))

    def close():
        loop.run_until_complete(conn.close())
        loop.close()
        raw.close()
    return a_set, a_get, r_set, r_get, close


ADAPTERS = [("sglang", bench_sglang), ("vllm-tier", bench_vllm),
            ("vllm-connector", bench_vllm_connector), ("lmcache-mp", bench_lmcache),
            ("lmcache-remote", bench_lmcache_remote)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--pages", type=int, default=64, help="1 MiB pages per round")
    ap.add_argument("--rounds", type=int, default=9, help="adapter/raw pairs per op")
    ap.add_argument("--engines", default=",".join(n for n, _ in ADAPTERS),
                    help="comma-separated subset of " + ",".join(n for n, _ in ADAPTERS))
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
    print("1 MiB pages, %d per call, %d interleaved adapter/raw pairs per op; median GiB/s "
          "of each side and median of the pair ratios (kvpoold at %s)"
          % (args.pages, args.rounds, url))
    print("%-15s %-4s %9s %9s %13s %11s" % ("adapter", "op", "adapter", "raw",
                                           "median ratio", "min..max"))
    try:
        wanted = args.engines.split(",")
        for name, make in ADAPTERS:
            if name not in wanted:
                continue
            fns = make(url, args.pages)
            if len(fns) == 7:             # (set, exists, get, raw set, raw get, raw, close)
                a_set, _, a_get, r_set, r_get, _, close = fns
            else:
                a_set, a_get, r_set, r_get, close = fns
            a_set(), a_get(), r_set(), r_get()          # warm up
            res = {op: {"a": [], "r": [], "ratio": []} for op in ("set", "get")}
            for i in range(args.rounds):
                for op, a_fn, r_fn in (("set", a_set, r_set), ("get", a_get, r_get)):
                    # alternate which side goes first, so neither gets the warmer pool
                    if i % 2 == 0:
                        ta, tr = timed(a_fn), timed(r_fn)
                    else:
                        tr, ta = timed(r_fn), timed(a_fn)
                    res[op]["a"].append(gib / ta)
                    res[op]["r"].append(gib / tr)
                    res[op]["ratio"].append(tr / ta)
            for op in ("set", "get"):
                r = res[op]
                print("%-15s %-4s %9.2f %9.2f %13.2f %5.2f..%4.2f" % (
                    name, op, statistics.median(r["a"]), statistics.median(r["r"]),
                    statistics.median(r["ratio"]), min(r["ratio"]), max(r["ratio"])))
            sys.stdout.flush()
            close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
