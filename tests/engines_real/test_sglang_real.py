"""kvpool.sglang inside SGLang's own code (KVPOOL_SGLANG_SRC).

Loaded from the snapshot: SGLang's storage interface module
(mem_cache/hicache_storage.py: HiCacheStorage, HiCacheStorageConfig,
HiCacheStorageExtraInfo, PoolTransfer, PoolHitPolicy, PoolName,
PoolTransferResult, and its own file backend HiCacheFile) and its
storage backend factory. The backend is built by
StorageBackendFactory.create_backend("dynamic", ...) from the shipped
config/engines/sglang-hicache.json.

SGLang's cache controllers and host pools do not load on this machine
(they import the whole server, Triton and torch 2 APIs), so the host
pool is the contract tests' FakeHostPool and the controller's call order
is the contract tests' stand-in. For the hybrid (v2) interface SGLang's
own HiCacheFile is the oracle: for the same pages present in each pool,
kvpool's batch_exists_v2 must answer what SGLang's does."""

import json
import os
import sys

import pytest

import engine_env

COMMIT = engine_env.load_sglang()
if COMMIT is None:
    pytest.skip("KVPOOL_SGLANG_SRC is not set", allow_module_level=True)

import torch  # noqa: E402

from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import kvpool  # noqa: E402
import kvpool.sglang as ks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python", "engines"))
from sglang_fake_pool import FakeHostPool  # noqa: E402
import sglang_standin_controller as ctl  # noqa: E402

PAGE = 4


def test_report():
    engine_env.report("sglang", COMMIT)
    assert not getattr(hs, "STANDIN", False), "the snapshot's module, not the stand-in"


def config(url, prefix, tp_rank=0, tp_size=1, mla=False, layout="page_first", **extra):
    with open(os.path.join(ROOT, "config", "engines", "sglang-hicache.json")) as f:
        ec = json.load(f)
    ec.pop("prefetch_threshold", None)          # SGLang's controller pops it
    ec.update(url=url, namespace_prefix=prefix, timeout_s=1.0)
    ec.update(extra)
    return hs.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=layout == "page_first", model_name="real/model-7b",
        extra_config=ec)


def backend(url, prefix, pool, **kw):
    """As HiCacheController.attach_storage_backend: create_backend, then
    register_mem_pool_host."""
    b = StorageBackendFactory.create_backend("dynamic", config(url, prefix, layout=pool.layout,
                                                               mla=pool.mla, **kw), pool)
    assert isinstance(b, hs.HiCacheStorage) and isinstance(b, ks.KVPoolHiCacheStorage)
    b.register_mem_pool_host(pool)
    return b


def chain(n, seed=1):
    tokens = [(seed * 7919 + i) % 50000 for i in range(n * PAGE)]
    return [k.hex() for k in kvpool.block_hashes(tokens, PAGE)]


@pytest.mark.parametrize("layout,mla", [("page_first", False), ("layer_first", False),
                                        ("page_first", True), ("layer_first", True)])
def test_factory_backup_prefetch_zero_copy(server, prefix, layout, mla):
    src = FakeHostPool(layout, mla, PAGE, pages=300)
    src.fill_random(3)
    keys = chain(260)
    a = backend(server.url, prefix, src)
    assert a.mem_pool_host is src
    assert ctl.backup(a, keys, src.indices(0, 260), PAGE) == 260
    dst = FakeHostPool(layout, mla, PAGE, pages=300)
    b = backend(server.url, prefix, dst)
    hit, loaded = ctl.prefetch([b], keys, [dst.indices(20, 260)], PAGE)
    assert hit == 260 and loaded == [260]
    assert dst.page_view(dst.indices(20, 260)) == src.page_view(src.indices(0, 260))
    a.close()
    b.close()


def test_fp8_formats_get_namespaces_of_their_own(server, prefix):
    """SGLang's host pool takes the device pool's store_dtype, uint8 for
    every fp8 format (memory_pool.py: index_put has no float8): an
    fp8_e4m3 and an fp8_e5m2 instance, built through SGLang's factory with
    the shipped configuration, must not share pages. (This torch has no
    float8 dtypes: the device pool's dtype is given by name, as str() of
    SGLang's torch dtype reads.)"""
    import types
    pools, names = [], []
    for fmt in ("torch.float8_e4m3fn", "torch.float8_e5m2"):
        pool = FakeHostPool("page_first", False, PAGE, pages=20, dtype=torch.uint8)
        pool.device_pool = types.SimpleNamespace(dtype=fmt, store_dtype=torch.uint8)
        pool.fill_random(len(pools) + 3)
        pools.append(pool)
        names.append(backend(server.url, prefix, pool))
    a, b = names
    assert a.namespace != b.namespace and ":float8_e5m2:" in b.namespace
    keys = chain(8, seed=41)
    assert ctl.backup(a, keys, pools[0].indices(0, 8), PAGE) == 8
    hit, loaded = ctl.prefetch([b], keys, [pools[1].indices(0, 8)], PAGE)
    assert hit == 0 and loaded == [0]
    a.close()
    b.close()


def test_lease_bound_is_not_zero_hits(fresh_server, prefix, caplog):
    """A leading run whose lease would pass kvpoold's max_conn_leased_bytes
    was answered 0 by batch_exists although every page was there; now the
    leased run, then the unleased one, and the bound is named once."""
    src = FakeHostPool("page_first", False, 16, layers=8, heads=8, head_dim=32, pages=12)
    page = src.page_bytes()
    fresh_server.extra += ["--max-conn-leased-bytes", str(8 * page)]
    fresh_server.start()
    src.fill_random(1)
    a = backend(fresh_server.url, prefix, src)
    keys = [k.hex() for k in kvpool.block_hashes(list(range(12 * 16)), 16)]
    assert sum(a.batch_set_v1(keys, src.indices(0, 12))) == 12
    with caplog.at_level("WARNING"):
        assert a.batch_exists(keys[:8]) == 8
        assert a.batch_exists(keys) == 12
    assert sum("max_conn_leased_bytes" in r.getMessage() for r in caplog.records) == 1
    a.close()


def test_page_count_refused(server, prefix):
    pool = FakeHostPool(pages=8)
    b = backend(server.url, prefix, pool)
    keys = chain(2, seed=5)
    assert b.batch_set_v1(keys[:1], pool.indices(0, 2)) == [False]
    assert b.batch_exists(keys) == 0
    b.close()


@pytest.mark.parametrize("present", [
    {"kv": 8, "mamba": [7], "indexer": range(8)},
    {"kv": 8, "mamba": [5], "indexer": range(8)},
    {"kv": 6, "mamba": [5, 7], "indexer": range(3)},
    {"kv": 8, "mamba": [], "indexer": range(8)},
    {"kv": 0, "mamba": [0], "indexer": range(8)},
], ids=["all", "trailing-short", "kv-short", "no-state", "no-kv"])
def test_v2_hit_policies_agree_with_sglangs_file_backend(server, prefix, tmp_path, present):
    """Row 12: batch_exists_v2 answers, pool by pool and hit policy by hit
    policy, what SGLang's own HiCacheFile answers for the same pages."""
    keys = chain(8, seed=hash(repr(present)) % 1000)
    kv_pool = FakeHostPool(pages=16)
    kv_pool.fill_random(1)
    mamba = FakeHostPool(mla=True, pages=16, layers=2, head_dim=8)
    idx = FakeHostPool(mla=True, pages=16, layers=1, head_dim=4)
    ours = backend(server.url, prefix, kv_pool)
    # SGLang's file backend, its hit-policy logic (batch_exists_v2 over the
    # files present) as the oracle; its __init__ (an LRU evictor that imports
    # the server's utilities) is skipped: the pages are written as its files
    theirs = object.__new__(hs.HiCacheFile)
    theirs.file_path, theirs.config_suffix, theirs.metadata_cache = str(tmp_path), "_m", None

    def their_set(key, name=None):
        open(os.path.join(theirs.file_path, "%s.bin" % theirs._get_component_key(key, name)),
             "wb").close()
    for b in (ours, theirs):
        b.register_mem_host_pool_v2(kv_pool, hs.PoolName.KV)
        b.register_mem_host_pool_v2(mamba, hs.PoolName.MAMBA)
        b.register_mem_host_pool_v2(idx, hs.PoolName.INDEXER)
    n = present["kv"]
    if n:
        assert all(ours.batch_set_v1(keys[:n], kv_pool.indices(0, n)))
    for i in range(n):
        their_set(keys[i])
    for name, pool, pages in ((hs.PoolName.MAMBA, mamba, present["mamba"]),
                              (hs.PoolName.INDEXER, idx, present["indexer"])):
        pages = list(pages)
        if not pages:
            continue
        got = ours.batch_set_v2([hs.PoolTransfer(
            name=name, host_indices=torch.cat([pool.indices(p, 1) for p in pages]),
            keys=[keys[p] for p in pages])])
        assert got == {str(name): [True] * len(pages)}
        for p in pages:
            their_set(keys[p], name)
    trailing = hs.PoolHitPolicy.TRAILING_PAGES
    for transfers in ([hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys[-1:],
                                       hit_policy=trailing)],
                      [hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys[-2:],
                                       hit_policy=trailing)],
                      [hs.PoolTransfer(name=hs.PoolName.INDEXER, keys=keys)],
                      [hs.PoolTransfer(name=hs.PoolName.INDEXER, keys=keys),
                       hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys[-1:],
                                       hit_policy=trailing)]):
        a = ours.batch_exists_v2(keys, transfers)
        b = theirs.batch_exists_v2(keys, transfers)
        assert isinstance(a, hs.PoolTransferResult)
        assert a.kv_hit_pages == b.kv_hit_pages, (transfers, a, b)
        assert {str(k): v for k, v in a.extra_pool_hit_pages.items()} == \
            {str(k): v for k, v in b.extra_pool_hit_pages.items()}, (a, b)
    ours.close()


def test_v2_get_round_trip(server, prefix):
    kv_pool = FakeHostPool(pages=16)
    mamba = FakeHostPool(mla=True, pages=16, layers=2, head_dim=8)
    mamba.fill_random(4)
    a = backend(server.url, prefix, kv_pool)
    a.register_mem_host_pool_v2(mamba, hs.PoolName.MAMBA)
    keys = chain(3, seed=9)
    t = hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=mamba.indices(2, 1),
                        keys=keys[-1:], hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)
    assert a.batch_set_v2([t]) == {"mamba": [True]}
    m2 = FakeHostPool(mla=True, pages=16, layers=2, head_dim=8)
    b = backend(server.url, prefix, FakeHostPool(pages=16))
    b.register_mem_host_pool_v2(m2, hs.PoolName.MAMBA)
    got = b.batch_get_v2([hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=m2.indices(9, 1),
                                          keys=keys[-1:])])
    assert got == {"mamba": [True]}
    assert m2.page_view(m2.indices(9, 1)) == mamba.page_view(mamba.indices(2, 1))
    a.close()
    b.close()


# ---- issue 24, fresh-clone findings (items 4 and 5) -----------------------------------------

def test_refused_configuration_fails_the_attach(fresh_server, prefix, tmp_path):
    """Finding 4: a token the server denies (and any configuration
    kvpool_connect refuses, or pages over max_block_bytes) raises from
    register_mem_pool_host, which SGLang's attach_storage_backend calls
    right after its factory: the attach fails and SGLang does not start
    (it used to start with the cache off, a new connection per call)."""
    good = "c0ffee00c0ffee00c0ffee00c0ffee00"
    tokens = tmp_path / "tokens"
    tokens.write_text("[tokens]\n%s rw %s:\n" % (good, prefix))
    tokens.chmod(0o600)
    fresh_server.extra += ["--tokens-file", str(tokens), "--max-block-bytes", "4KiB"]
    fresh_server.start()
    pool = FakeHostPool(pages=4)
    bad = config(fresh_server.url, prefix)
    bad.extra_config["token"] = "5d6e7f8091a2b3c4d5e6f708192a3b4c"
    b = StorageBackendFactory.create_backend("dynamic", bad, pool)
    with pytest.raises(ValueError) as e:
        b.register_mem_pool_host(pool)
    assert "token" in str(e.value) or "denied" in str(e.value).lower()
    b.close()
    big = FakeHostPool(pages=4, layers=8, heads=4, head_dim=16)          # 8 KiB pages
    ok = config(fresh_server.url, prefix)
    ok.extra_config["token"] = good
    b = StorageBackendFactory.create_backend("dynamic", ok, big)
    with pytest.raises(ValueError) as e:
        b.register_mem_pool_host(big)
    assert "max_block_bytes" in str(e.value)
    b.close()
    b = StorageBackendFactory.create_backend("dynamic", ok, pool)
    b.register_mem_pool_host(pool)
    assert b.batch_set_v1(chain(1, seed=161), pool.indices(0, 1)) == [True]
    b.close()


def _sglang_mha_meta():
    """SGLang's own MHATokenToKVPoolHost.get_page_buffer_meta, compiled from
    the snapshot's source alone (the class does not import here: it needs
    the whole server); it reads kv_buffer, size, layer_num, head_num,
    head_dim, dtype, page_size and layout."""
    import ast
    root = engine_env.source("sglang")[0]
    path = os.path.join(root, "sglang", "srt", "mem_cache", "pool_host", "mha.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and
               n.name == "MHATokenToKVPoolHost")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and
              n.name == "get_page_buffer_meta")
    ns = {}
    exec(compile(ast.Module([fn], []), path, "exec"), ns)
    return ns["get_page_buffer_meta"]


class SGLangMetaPool:
    """A page_first MHA host pool whose page meta is SGLang's own, with a
    canary region right after its KV buffer."""

    def __init__(self, pages=4):
        engine_env.torch_gaps()
        self.get_page_buffer_meta = _sglang_mha_meta().__get__(self)
        self.layout, self.page_size, self.layer_num, self.head_num = "page_first", PAGE, 2, 2
        self.head_dim, self.dtype, self.mla = 8, torch.bfloat16, False
        self.size = pages * PAGE
        n = 2 * self.size * self.layer_num * self.head_num * self.head_dim
        self.backing = torch.zeros(2 * n, dtype=self.dtype)
        self.kv_buffer = self.backing[:n].view(2, self.size, self.layer_num, self.head_num,
                                               self.head_dim)
        self.canary = self.backing[n:]

    def get_size_per_token(self):
        return 2 * self.layer_num * self.head_num * self.head_dim * 2


def test_slots_outside_sglangs_host_pool_are_refused(server, prefix):
    """Finding 5, with SGLang's own get_page_buffer_meta: host indices
    past the pool's end made batch_get_v1 overwrite the memory after the
    pool (and batch_set_v1 store it); negative and unaligned ones went
    through too. They are refused before any I/O."""
    a_pool = SGLangMetaPool()
    a_pool.kv_buffer.normal_()
    a = backend(server.url, prefix, a_pool)
    keys = chain(2, seed=171)
    assert a.batch_set_v1(keys[:1], torch.arange(0, PAGE)) == [True]
    b_pool = SGLangMetaPool()
    b = backend(server.url, prefix, b_pool)
    size = b_pool.size
    for bad in (torch.arange(size, size + PAGE), torch.arange(-PAGE, 0),
                torch.arange(2, 2 + PAGE)):
        assert b.batch_get_v1(keys[:1], bad) == [False]
        assert b.batch_set_v1(keys[1:2], bad) == [False]
    assert int((b_pool.canary != 0).sum()) == 0, "memory after the pool was written"
    assert b.batch_exists(keys[1:2]) == 0, "memory after the pool was stored"
    assert b.batch_get_v1(keys[:1], torch.arange(PAGE, 2 * PAGE)) == [True]
    assert torch.equal(b_pool.kv_buffer[:, PAGE:2 * PAGE], a_pool.kv_buffer[:, :PAGE])
    a.close()
    b.close()


def test_prefetch_refreshes_first_pages_retention(server, prefix):
    """Issue 29 (retain_first_blocks): SGLang never stores a page it
    prefetched again, so the backend refreshes the first pages' retention
    from batch_exists - also when the instance holds them itself and
    SGLang's HiCacheStorageExtraInfo names them in prefix_keys only. 2.6 s
    after the backup its own 2 s retention has lapsed; the refresh at
    1.2 s keeps the two pages retained."""
    import time
    pool = FakeHostPool(pages=12)
    pool.fill_random(31)
    keys = chain(10, seed=31)
    cfg = dict(retain_first_blocks=2, retain_ms=2000)
    writer = backend(server.url, prefix, pool, **cfg)
    assert ctl.backup(writer, keys, pool.indices(0, 10), PAGE) == 10
    t0 = time.monotonic()
    ns = writer.namespace

    def retained():
        with kvpool.Client(server.url, ns) as c:
            return c.stats(ns)["namespaces"][ns]["retained_blocks"]
    assert retained() == 2
    reader = backend(server.url, prefix, pool, **cfg)
    time.sleep(max(0.0, 1.2 - (time.monotonic() - t0)))
    info = hs.HiCacheStorageExtraInfo(prefix_keys=keys[:4])
    assert reader.batch_exists(keys[4:], info) == 6
    assert reader.stats()["retain_refreshes"] == 1
    time.sleep(max(0.0, 2.6 - (time.monotonic() - t0)))
    assert retained() == 2
    writer.close()
    reader.close()
