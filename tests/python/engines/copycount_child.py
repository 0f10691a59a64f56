"""Run under the copy counter (tests/bench/copycount.c, LD_PRELOAD): drive
one adapter with 1 MiB pages, snapshot the counts before and after the
measured phase. Used by test_zero_copy_engines.py; argv: engine url
prefix snapshot-signal out-before."""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
engine, url, prefix, sig, out_before = sys.argv[1], sys.argv[2], sys.argv[3], \
    int(sys.argv[4]), sys.argv[5]
for root in ("sglang_root", "vllm_root", "lmcache_root"):
    sys.path.append(os.path.join(HERE, "standins", root))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import kvpool  # noqa: E402

PAGES = 16
ROUNDS = 4
MIB = 1 << 20


def snapshot(rename_to=None):
    os.kill(os.getpid(), sig)
    path = os.environ["COPYCOUNT_OUT"]
    deadline = time.monotonic() + 5
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    if rename_to:
        os.rename(path, rename_to)


def keys(n, r):
    return kvpool.block_hashes(list(range(n * 4)), 4, extra=b"%s-%d" % (engine.encode(), r))


def run_sglang():
    import torch
    import kvpool.sglang as ks
    from sglang.srt.mem_cache import hicache_storage as hs
    from sglang_fake_pool import FakeHostPool
    pool = FakeHostPool(pages=2 * PAGES, page_size=32, layers=8, heads=8, head_dim=128,
                        dtype=torch.bfloat16)
    assert pool.page_bytes() == MIB
    cfg = hs.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m",
                                  extra_config={"url": url, "namespace_prefix": prefix})
    b = ks.KVPoolHiCacheStorage(cfg, {})
    b.register_mem_pool_host(pool)

    def rnd(r):
        ks_ = [k.hex() for k in keys(PAGES, r)]
        assert all(b.batch_set_v1(ks_, pool.indices(0, PAGES)))
        assert b.batch_exists(ks_) == PAGES
        assert all(b.batch_get_v1(ks_, pool.indices(PAGES, PAGES)))
    return rnd


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


def run_vllm():
    import kvpool.vllm as kv
    rows = np.zeros((2 * PAGES, MIB), dtype=np.uint8)
    t = kv.KVPoolSecondaryTier(tier_config(), memoryview(rows), "kvpool", url=url,
                               namespace_prefix=prefix)
    from vllm.v1.kv_offload.tiering.base import JobMetadata, ReqContext
    state = {"job": 0}

    def wait(job_id):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for r in t.get_finished():
                assert r.job_id == job_id and r.success, r
                return
            time.sleep(0.001)
        raise AssertionError("job %d not reported" % job_id)

    def rnd(r):
        ks_ = [k + bytes(4) for k in keys(PAGES, r)]
        for kind, ids in (("store", range(PAGES)), ("load", range(PAGES, 2 * PAGES))):
            state["job"] += 1
            job = JobMetadata(state["job"], ks_, np.array(list(ids)), kind == "load",
                              ReqContext("r%d" % r))
            (t.submit_store if kind == "store" else t.submit_load)(job)
            wait(state["job"])
    return rnd


def run_vllm_connector():
    """The connector's worker side (FlashAttention NHD KV caches in host
    memory: zero copy), chunks of 2 blocks x 8 layers x K,V = 1 MiB."""
    from types import SimpleNamespace
    import torch
    import vllm_standin_layouts as vl
    from kvpool.vllm.connector import KVPoolConnectorMetadata
    from test_vllm_connector import Setup, vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    setup = Setup(heads=8, dim=128, layers=8, dtype=torch.float16)
    kcc = vl.kv_cache_config(4 * PAGES + 2, setup.groups())
    caches = vl.reshape(kcc, {n: setup.backend for names, _ in setup.groups() for n in names},
                        [setup.block])
    w = KVConnectorFactory.create_connector(vllm_config(url, prefix, setup, chunk_blocks=2),
                                            KVConnectorRole.WORKER, kcc)
    w.register_kv_caches(caches)
    assert w._chunk_bytes() == MIB and not w.stage
    src = [([2 * i + 1, 2 * i + 2],) for i in range(PAGES)]
    dst = [([2 * PAGES + 2 * i + 1, 2 * PAGES + 2 * i + 2],) for i in range(PAGES)]

    def rnd(r):
        ks_ = keys(PAGES, r)
        for field, chunks in (("stores", src), ("loads", dst)):
            m = KVPoolConnectorMetadata()
            if field == "stores":
                m.stores = [("r", ks_, chunks, None)]
            else:
                m.loads = [("r", ks_, chunks)]
            w.bind_connector_metadata(m)
            w.start_load_kv(SimpleNamespace())
            w.wait_for_save()
            assert w.flush_stores()          # stores run in the background
            w.clear_connector_metadata()
        assert not w.get_block_ids_with_load_errors()
    return rnd


def run_lmcache():
    import select
    import kvpool.lmcache as kl
    p = kl.KVPoolL2Plugin(url=url, namespace_prefix=prefix)
    buf = np.zeros((2 * PAGES, MIB), dtype=np.uint8)
    src = [memoryview(buf[i]) for i in range(PAGES)]
    dst = [memoryview(buf[PAGES + i]) for i in range(PAGES)]

    def wait(fid):
        while True:
            select.select([p.event_fd()], [], [], 5)
            for c in p.drain_completions():
                assert c[0] == fid and c[1], c
                return

    def rnd(r):
        ks_ = ["m@00000000@0@%s" % k.hex() for k in keys(PAGES, r)]
        wait(p.submit_batch_set(ks_, src))
        wait(p.submit_batch_exists(ks_))
        wait(p.submit_batch_get(ks_, dst))
    return rnd


def run_control():
    """What the counter must see: a Python-side copy of every page."""
    buf = np.ones((PAGES, MIB), dtype=np.uint8)
    keep = []

    def rnd(r):
        keep[:] = [bytes(memoryview(buf[i])) for i in range(PAGES)] * 2
    return rnd


rnd = {"control": run_control, "sglang": run_sglang, "vllm": run_vllm, "lmcache": run_lmcache,
       "vllm-connector": run_vllm_connector}[engine]()
rnd(0)                               # warm up: connections, caches, ctypes types
snapshot(rename_to=out_before)
for r in range(1, ROUNDS + 1):
    rnd(r)
snapshot()
print("payload_bytes", ROUNDS * PAGES * MIB * 2)
