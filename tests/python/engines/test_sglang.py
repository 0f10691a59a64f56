"""Contract tests of kvpool.sglang (SGLang HiCache L3 backend), driven the
way SGLang's cache controller drives a backend, against a real kvpoold.
See ../../../docs/engines.md and the engine notes (§2, §5)."""

import signal
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import kvpool  # noqa: E402
import kvpool.sglang as ks  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import sglang_standin_controller as ctl  # noqa: E402
from sglang_fake_pool import FakeHostPool  # noqa: E402

PAGE = 4


def config(url, prefix, tp_rank=0, tp_size=1, mla=False, layout="page_first", **extra):
    ec = {"backend_name": "kvpool", "module_path": "kvpool.sglang",
          "class_name": "KVPoolHiCacheStorage", "interface_v1": 1,
          "hicache_storage_pass_prefix_keys": True, "url": url,
          "namespace_prefix": prefix, "timeout_s": 1.0}
    ec.update(extra)
    return hs.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=layout == "page_first", model_name="test/model-7b",
        extra_config=ec)


def backend(url, prefix, pool, **kw):
    b = StorageBackendFactory.create_backend("dynamic", config(url, prefix, layout=pool.layout,
                                                               mla=pool.mla, **kw), pool)
    assert isinstance(b, hs.HiCacheStorage) and isinstance(b, ks.KVPoolHiCacheStorage)
    return b


def chain(n, seed=1):
    tokens = [(seed * 7919 + i) % 50000 for i in range(n * PAGE)]
    return [k.hex() for k in kvpool.block_hashes(tokens, PAGE)]


LAYOUTS = [("page_first", False), ("layer_first", False), ("page_first", True),
           ("layer_first", True)]


def test_base_class_is_the_engines():
    assert ks.HiCacheStorage is hs.HiCacheStorage
    assert ks.USING_REAL_BASE   # the engine module (real, or the stand-in) was found


@pytest.mark.parametrize("layout,mla", LAYOUTS)
def test_backup_then_prefetch_zero_copy(server, prefix, layout, mla):
    """300 pages (batches of 128, 128, 44) written by one instance are read
    by a second one into other host slots: exact bytes, nothing around
    them touched."""
    src = FakeHostPool(layout, mla, PAGE, pages=320)
    src.fill_random(3)
    keys = chain(300)
    a = backend(server.url, prefix, src)
    assert a.mem_pool_host is src
    assert ctl.backup(a, keys, src.indices(0, 300), PAGE) == 300
    dst = FakeHostPool(layout, mla, PAGE, pages=320)
    dst.kv_buffer.fill_(7)
    before = dst.raw_bytes()
    b = backend(server.url, prefix, dst)
    assert b.namespace == a.namespace
    hit, loaded = ctl.prefetch([b], keys, [dst.indices(10, 300)], PAGE)
    assert hit == 300 and loaded == [300]
    assert dst.page_view(dst.indices(10, 300)) == src.page_view(src.indices(0, 300))
    # the bytes outside the 300 pages are as they were
    total = dst.page_view(dst.indices(-1, 322))
    ref = FakeHostPool(layout, mla, PAGE, pages=320)
    ref.kv_buffer.fill_(7)
    untouched = ref.page_view(ref.indices(-1, 322))
    for i in list(range(0, 11)) + list(range(311, 322)):
        assert total[i] == untouched[i], "page %d was written" % i
    assert len(before) == len(dst.raw_bytes())
    a.close()
    b.close()


def test_keys_are_kvpool_block_hashes(server, prefix, raw):
    pool = FakeHostPool(pages=8)
    pool.fill_random(1)
    tokens = list(range(8 * PAGE))
    keys = [k.hex() for k in kvpool.block_hashes(tokens, PAGE)]
    b = backend(server.url, prefix, pool)
    assert all(b.batch_set_v1(keys, pool.indices(0, 8)))
    c = raw(b.namespace)
    assert c.match(kvpool.block_hashes(tokens, PAGE)) == 8
    b.close()


def test_missing_middle_page(server, prefix, raw):
    pool = FakeHostPool(pages=320)
    pool.fill_random(5)
    keys = chain(300, seed=2)
    b = backend(server.url, prefix, pool)
    assert ctl.backup(b, keys, pool.indices(0, 300), PAGE) == 300
    raw(b.namespace).delete(bytes.fromhex(keys[150]))      # (and its descendants)
    kvpool_keys = [bytes.fromhex(k) for k in keys]
    raw(b.namespace).put_chain(kvpool_keys[151:], [bytes(pool.page_bytes())] * 149,
                               parent=None)   # put the tail back: only the middle is gone
    assert ctl.exists_run(b, keys) == 150
    dst = FakeHostPool(pages=320)
    got = b.batch_get_v1(keys[128:256], dst.indices(0, 128))
    assert got == [True] * 22 + [False] + [True] * 105
    b.close()


def test_block_of_the_wrong_size_is_false(server, prefix, raw):
    pool = FakeHostPool(pages=8)
    keys = chain(3, seed=9)
    b = backend(server.url, prefix, pool)
    c = raw(b.namespace)
    pb = pool.page_bytes()
    c.put(bytes.fromhex(keys[0]), b"\1" * pb)
    c.put(bytes.fromhex(keys[1]), b"\2" * (pb + 64), parent=bytes.fromhex(keys[0]))  # too big
    c.put(bytes.fromhex(keys[2]), b"\3" * (pb - 64), parent=bytes.fromhex(keys[1]))  # short
    pool.kv_buffer.fill_(0)
    got = b.batch_get_v1(keys, pool.indices(0, 3))
    assert got == [True, False, False]
    pages = pool.page_view(pool.indices(0, 3))
    assert pages[0] == b"\1" * pb
    assert pages[1] == bytes(pb), "a too-small buffer must not be written"
    b.close()


def test_parent_absent_still_stores(server, prefix, raw):
    """prefix_keys name a parent the pool never got: the pages are stored
    (re-rooted) and match."""
    pool = FakeHostPool(pages=8)
    pool.fill_random(2)
    keys = chain(6, seed=4)
    b = backend(server.url, prefix, pool)
    info = hs.HiCacheStorageExtraInfo(prefix_keys=[chain(1, seed=99)[0]])
    assert b.batch_set_v1(keys, pool.indices(0, 6), info) == [True] * 6
    assert b.batch_exists(keys, info) == 6
    b.close()


def test_two_ranks_take_the_min(server, prefix):
    keys = chain(200, seed=6)
    pools = [FakeHostPool(pages=210), FakeHostPool(pages=210)]
    bs = [backend(server.url, prefix, p, tp_rank=r, tp_size=2) for r, p in enumerate(pools)]
    assert bs[0].namespace != bs[1].namespace
    for p in pools:
        p.fill_random(8)
    assert ctl.backup(bs[0], keys, pools[0].indices(0, 200), PAGE) == 200
    assert ctl.backup(bs[1], keys[:100], pools[1].indices(0, 100), PAGE) == 100
    hit, loaded = ctl.prefetch(bs, keys, [p.indices(0, 200) for p in pools], PAGE)
    assert hit == 100 and loaded == [100, 100]
    for b in bs:
        b.close()


def test_mla_rank0_writes_every_rank_reads(server, prefix, raw):
    keys = chain(40, seed=11)
    p0, p1 = FakeHostPool(mla=True, pages=48), FakeHostPool(mla=True, pages=48)
    b0 = backend(server.url, prefix, p0, tp_rank=0, tp_size=2)
    b1 = backend(server.url, prefix, p1, tp_rank=1, tp_size=2)
    assert b0.namespace == b1.namespace and ":tp" not in b0.namespace
    p1.fill_random(12)
    assert b1.batch_set_v1(keys, p1.indices(0, 40)) == [True] * 40   # skipped, acknowledged
    assert b1.batch_exists(keys) == 0, "rank 1 must not write on an MLA model"
    p0.fill_random(13)
    assert ctl.backup(b0, keys, p0.indices(0, 40), PAGE) == 40
    hit, loaded = ctl.prefetch([b0, b1], keys, [p0.indices(0, 40), p1.indices(0, 40)], PAGE)
    assert hit == 40 and loaded == [40, 40]
    assert p1.page_view(p1.indices(0, 40)) == p0.page_view(p0.indices(0, 40))
    b0.close()
    b1.close()


def test_layouts_and_dtypes_do_not_share(server, prefix):
    keys = chain(4, seed=21)
    a_pool = FakeHostPool("page_first", pages=8)
    a = backend(server.url, prefix, a_pool)
    assert all(a.batch_set_v1(keys, a_pool.indices(0, 4)))
    others = [FakeHostPool("layer_first", pages=8),
              FakeHostPool("page_first", pages=8, dtype=torch.float16),
              FakeHostPool("page_first", pages=8, page_size=2 * PAGE),
              ]
    for p in others:
        b = backend(server.url, prefix, p)
        assert b.namespace != a.namespace
        assert b.batch_exists(keys) == 0
        b.close()
    a.close()


def test_draft_pages_and_copy_path(server, prefix):
    pool = FakeHostPool(pages=8)
    b = backend(server.url, prefix, pool)
    keys = chain(3, seed=31)
    pages = [torch.full((pool.page_bytes() // 2,), float(i), dtype=torch.bfloat16)
             for i in range(3)]
    draft = [k + ".draft" for k in keys]
    assert b.batch_set(draft, pages) is True
    assert b.batch_exists(keys) == 0, "draft pages live in a namespace of their own"
    assert b.exists(draft[1]) and not b.exists(keys[1])
    targets = [torch.zeros_like(p) for p in pages]
    got = b.batch_get(draft, targets)
    assert all(g is t for g, t in zip(got, targets))
    assert all(torch.equal(t, p) for t, p in zip(targets, pages))
    assert b.get(keys[0] + ".draft") is not None
    assert b.get(chain(1, seed=32)[0]) is None
    assert b.set("some-non-hex-key", pages[0]) is True
    assert torch.equal(b.get("some-non-hex-key"), pages[0])
    assert b.set("x", None) is False
    b.close()


def test_types_v2_stats_clear_close(server, prefix, raw):
    pool = FakeHostPool(pages=8)
    pool.fill_random(4)
    b = backend(server.url, prefix, pool)
    keys = chain(4, seed=41)
    assert b.batch_exists([]) == 0 and b.batch_get_v1([], pool.indices(0, 0)) == []
    assert all(b.batch_set_v1(keys, pool.indices(0, 4)))
    t = hs.PoolTransfer(name="mamba", host_indices=pool.indices(0, 4), keys=keys)
    r = b.batch_exists_v2(keys, [t])
    assert r.kv_hit_pages == 0
    assert b.batch_get_v2([t]) == {"mamba": [False] * 4}
    assert b.batch_set_v2([t]) == {"mamba": [False] * 4}
    assert b.get_stats() is None
    assert b.stats()["set_pages"] == 4
    with pytest.raises(RuntimeError):
        b.clear()
    assert b.batch_exists(keys) == 4, "clear() leaves a shared namespace alone by default"
    c = backend(server.url, prefix, pool, clear_drops_namespace=True)
    assert c.clear() is True
    assert b.batch_exists(keys) == 0
    c.close()
    b.close()
    b.close()
    assert b.batch_exists(keys) == 0 and b.batch_get_v1(keys, pool.indices(0, 4)) == [False] * 4


def test_threads_call_at_once(server, prefix):
    pool = FakeHostPool(pages=200)
    pool.fill_random(6)
    b = backend(server.url, prefix, pool)
    errors = []

    def run(fn):
        try:
            for _ in range(5):
                fn()
        except Exception as e:       # what SGLang's thread would die of
            errors.append(e)
    k1, k2 = chain(64, seed=51), chain(64, seed=52)
    assert all(b.batch_set_v1(k1, pool.indices(0, 64)))
    threads = [threading.Thread(target=run, args=(f,)) for f in (
        lambda: ctl.exists_run(b, k1),
        lambda: ctl.load(b, k1, pool.indices(100, 64), PAGE),
        lambda: ctl.backup(b, k2, pool.indices(0, 64), PAGE))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert ctl.exists_run(b, k2) == 64
    b.close()


def test_lease_holds_under_eviction_pressure(fresh_server, prefix):
    """Pages batch_exists matched stay loadable by batch_get_v1 while the
    pool evicts everything else."""
    fresh_server.start()
    pool = FakeHostPool(pages=70, layers=8, heads=4, head_dim=64)   # 32 KiB pages
    pool.fill_random(7)
    b = backend(fresh_server.url, prefix, pool)
    keys = chain(32, seed=61)
    assert all(b.batch_set_v1(keys, pool.indices(0, 32)))
    assert b.batch_exists(keys) == 32
    with kvpool.Client(fresh_server.url, "pressure") as c:     # 96 MiB through 64 MiB
        blob = bytes(1 << 20)
        for i in range(96):
            c.put(kvpool.block_hashes([i], 1, extra=b"pressure")[0], blob)
    assert b.batch_get_v1(keys, pool.indices(34, 32)) == [True] * 32
    assert pool.page_view(pool.indices(34, 32)) == pool.page_view(pool.indices(0, 32))
    b.close()


def test_pool_down_then_back(fresh_server, prefix):
    """kvpoold killed mid-run: misses and failed stores, quickly, never an
    exception; restarted on the same port: hits again, no restart of ours."""
    fresh_server.start()
    port = fresh_server.port
    pool = FakeHostPool(pages=40)
    pool.fill_random(9)
    b = backend(fresh_server.url, prefix, pool)
    keys = chain(20, seed=71)
    assert ctl.backup(b, keys, pool.indices(0, 20), PAGE) == 20
    fresh_server.kill()
    t0 = time.monotonic()
    for _ in range(3):
        assert ctl.exists_run(b, keys) == 0
        assert b.batch_get_v1(keys, pool.indices(20, 20)) == [False] * 20
        assert b.batch_set_v1(keys, pool.indices(0, 20)) == [False] * 20
        assert b.batch_get(keys[:2]) == [None, None]
        assert b.exists(keys[0]) is False
    assert time.monotonic() - t0 < 10
    fresh_server.start(port=port)
    deadline = time.monotonic() + 20
    # the read and write connections reconnect on their own back-offs
    while time.monotonic() < deadline:
        if all(b.batch_set_v1(keys, pool.indices(0, 20))) and ctl.exists_run(b, keys) == 20:
            break
        time.sleep(0.2)
    assert ctl.exists_run(b, keys) == 20
    assert ctl.load(b, keys, pool.indices(20, 20), PAGE) == 20
    b.close()


def test_pool_down_at_start(prefix):
    """The backend builds (SGLang would not start otherwise) and answers
    misses when no kvpoold listens."""
    from conftest import free_port
    pool = FakeHostPool(pages=8)
    b = backend("tcp://127.0.0.1:%d" % free_port(), prefix, pool)
    keys = chain(4)
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, pool.indices(0, 4)) == [False] * 4
    b.close()


# ---- hybrid models (the v2 interface), and pages that do not fit ---------------------------

def test_v2_hybrid_pools_round_trip(server, prefix, raw):
    """Row 12: SGLang's hybrid cache controller stores and loads the extra
    pools (Mamba states, sliding-window KV, indexers) through the v2 calls;
    they hit, byte-exact, on a second instance."""
    kv_pool = FakeHostPool(pages=16)
    kv_pool.fill_random(1)
    mamba = FakeHostPool(mla=True, pages=16, layers=2, head_dim=8)   # a state pool stand-in
    mamba.fill_random(2)
    idx = FakeHostPool(mla=True, pages=16, layers=1, head_dim=4)     # an indexer pool
    idx.fill_random(3)
    a = backend(server.url, prefix, kv_pool)
    for name, p in ((hs.PoolName.KV, kv_pool), (hs.PoolName.MAMBA, mamba),
                    (hs.PoolName.INDEXER, idx)):
        a.register_mem_host_pool_v2(p, name)
    keys = chain(8, seed=81)
    assert all(a.batch_set_v1(keys, kv_pool.indices(0, 8)))
    trailing = hs.PoolHitPolicy.TRAILING_PAGES
    got = a.batch_set_v2([
        hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=mamba.indices(7, 1),
                        keys=keys[-1:], hit_policy=trailing),
        hs.PoolTransfer(name=hs.PoolName.INDEXER, host_indices=idx.indices(0, 4),
                        keys=keys[:4])])
    assert got == {"mamba": [True], "indexer": [True] * 4}
    r = a.batch_exists_v2(keys, [hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=keys[-1:],
                                                 hit_policy=trailing)])
    assert r.kv_hit_pages == 8 and r.extra_pool_hit_pages["mamba"] == 8
    # an all-pages pool holding only the first 4 pages limits the prefix to 4
    r = a.batch_exists_v2(keys, [hs.PoolTransfer(name=hs.PoolName.INDEXER, keys=keys)])
    assert r.kv_hit_pages == 4
    # the trailing page of a longer prefix is absent: the prefix stops at 8
    more = keys + chain(2, seed=82)
    r = a.batch_exists_v2(more, [hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=more[-1:],
                                                 hit_policy=trailing)])
    assert r.kv_hit_pages == 8
    kv2 = FakeHostPool(pages=16)
    m2 = FakeHostPool(mla=True, pages=16, layers=2, head_dim=8)
    b = backend(server.url, prefix, kv2)
    b.register_mem_host_pool_v2(kv2, hs.PoolName.KV)
    b.register_mem_host_pool_v2(m2, hs.PoolName.MAMBA)
    assert b.batch_get_v1(keys, kv2.indices(4, 8)) == [True] * 8
    got = b.batch_get_v2([hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=m2.indices(3, 1),
                                          keys=keys[-1:], hit_policy=trailing)])
    assert got == {"mamba": [True]}
    assert m2.page_view(m2.indices(3, 1)) == mamba.page_view(mamba.indices(7, 1))
    assert b.batch_get_v2([hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=m2.indices(
        4, 1), keys=chain(1, seed=83))]) == {"mamba": [False]}
    # an unregistered pool, or indices that do not fit, answer False, never raise
    assert b.batch_get_v2([hs.PoolTransfer(name="swa", host_indices=m2.indices(0, 1),
                                           keys=keys[:1])]) == {"swa": [False]}
    assert b.batch_set_v2([hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=m2.indices(
        0, 2), keys=keys[:1])]) == {"mamba": [False]}
    a.close()
    b.close()


def test_lease_bound_never_turns_a_hit_into_zero(fresh_server, prefix, caplog):
    """kvpoold bounds the bytes one connection holds leased
    (max_conn_leased_bytes): a batch_exists whose lease would pass it was
    answered 0 although every page was there (a fresh-clone test). Now it
    answers the longest run that can be leased (or, past that, an unleased
    run: a prefetch that then misses loads fewer pages), and says once which
    setting bounds it."""
    pool = FakeHostPool(pages=12, layers=4, heads=4, head_dim=64)   # 16 KiB pages
    page = pool.page_bytes()
    fresh_server.extra += ["--max-conn-leased-bytes", str(5 * page)]
    fresh_server.start()
    pool.fill_random(3)
    b = backend(fresh_server.url, prefix, pool)
    keys = chain(12, seed=97)
    assert b.batch_set_v1(keys, pool.indices(0, 12)) == [True] * 12
    with caplog.at_level("WARNING"):
        assert b.batch_exists(keys[:4]) == 4        # leased: 4 pages of the 5 allowed
        assert b.batch_exists(keys) == 12           # was 0: 4 leased, the rest unleased
        assert b.batch_exists(keys[4:]) == 8        # nothing more can be leased: unleased
    assert sum("max_conn_leased_bytes" in r.getMessage() for r in caplog.records) == 1
    # what it answers is really there
    dst = FakeHostPool(pages=12, layers=4, heads=4, head_dim=64)
    b2 = backend(fresh_server.url, prefix, dst)
    assert b2.batch_get_v1(keys, dst.indices(0, 12)) == [True] * 12
    assert dst.page_view(dst.indices(0, 12)) == pool.page_view(pool.indices(0, 12))
    b.close()
    b2.close()


def test_page_count_must_fit(server, prefix, raw):
    """Row 14: host_indices must hold exactly len(keys) pages of integer
    slots; anything else is refused before a byte is sent (a 4-page block
    under one key would poison it for every later writer and reader)."""
    pool = FakeHostPool(pages=8)
    pool.fill_random(5)
    b = backend(server.url, prefix, pool)
    keys = chain(4, seed=91)
    assert b.batch_set_v1(keys[:1], pool.indices(0, 4)) == [False]
    assert b.batch_set_v1(keys[:2], pool.indices(0, 2).float()) == [False, False]
    assert b.batch_set_v1(keys[:2], pool.indices(0, 2)[:-1]) == [False, False]
    assert raw(b.namespace).exists_many([bytes.fromhex(k) for k in keys]) == [False] * 4
    assert b.batch_get_v1(keys[:1], pool.indices(0, 4)) == [False]
    assert all(b.batch_set_v1(keys, pool.indices(0, 4)))
    b.close()


# ---- issue 24, fresh-clone findings (items 3, 4, 5, 11, 13, 14) -----------------------------

def test_clear_drops_every_namespace_written(server, prefix, raw):
    """Finding 3: clear() with clear_drops_namespace drops the KV, draft
    and every v2 pool namespace (the Mamba pool's was left), and returns
    True; without it clear() raises, which is how SGLang's
    clear_storage_backend learns of a failed clear (it ignores a return
    value, so answering None made it report success with every page
    still held)."""
    kv_pool = FakeHostPool(pages=8)
    kv_pool.fill_random(1)
    mamba = FakeHostPool(mla=True, pages=8, layers=2, head_dim=8)
    mamba.fill_random(2)
    keys = chain(4, seed=101)
    made = []
    for drop in (False, True):
        b = backend(server.url, prefix, kv_pool, clear_drops_namespace=drop)
        b.register_mem_host_pool_v2(mamba, hs.PoolName.MAMBA)
        assert all(b.batch_set_v1(keys, kv_pool.indices(0, 4)))
        assert b.batch_set_v2([hs.PoolTransfer(name=hs.PoolName.MAMBA,
                                               host_indices=mamba.indices(0, 1),
                                               keys=keys[-1:])]) == {"mamba": [True]}
        flat = [torch.zeros(kv_pool.page_bytes() // 2, dtype=torch.bfloat16)]
        assert b.batch_set([keys[0] + ".draft"], flat) is True
        made.append(b)
    keep, drop = made
    assert keep.namespaces() == drop.namespaces() and len(drop.namespaces()) == 3
    with pytest.raises(RuntimeError) as e:
        keep.clear()
    assert "clear_drops_namespace" in str(e.value)
    for ns in keep.namespaces():
        assert raw(ns).stats(ns)["blocks"] > 0, ns
    assert drop.clear() is True
    for ns in drop.namespaces():
        assert raw(ns).exists_many([bytes.fromhex(k) for k in keys]) == [False] * 4, ns
    assert keep.batch_exists(keys) == 0
    assert keep._pool_pages_present("mamba", keys[-1:]) == [False]
    for b in made:
        b.close()


def test_clear_with_the_pool_down_raises(fresh_server, prefix):
    fresh_server.start()
    b = backend(fresh_server.url, prefix, FakeHostPool(pages=4), clear_drops_namespace=True)
    fresh_server.kill()
    with pytest.raises(RuntimeError):
        b.clear()
    b.close()


def test_namespace_names_the_weights_where_sglang_says(server, prefix, monkeypatch):
    """Finding 3: SGLang hands the backend the served model name only;
    two deployments serving different weights under one name would share
    pages. Where SGLang's server arguments can be read, the model path and
    revision are part of the namespace."""
    import sys
    import types
    pool = FakeHostPool(pages=4)
    names = []
    for path, rev in (("/models/a", None), ("/models/b", None), ("/models/a", "v2"),
                      ("/models/a", None)):
        ctx = types.ModuleType("sglang.srt.runtime_context")
        args = types.SimpleNamespace(model_path=path, revision=rev)
        ctx.get_context = lambda args=args: types.SimpleNamespace(server_args=args)
        monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", ctx)
        b = backend(server.url, prefix, pool)
        names.append(b.namespace)
        b.close()
    assert len(set(names[:3])) == 3 and names[0] == names[3]
    monkeypatch.delitem(sys.modules, "sglang.srt.runtime_context")
    b = backend(server.url, prefix, pool)
    assert b.namespace not in names        # not readable: the served name only
    b.close()


@pytest.mark.parametrize("mla", [False, True])
def test_namespace_names_the_kv_format_not_its_storage_dtype(server, prefix, mla):
    """SGLang's host pool takes the device pool's store_dtype, uint8 for
    every fp8 format: an fp8_e4m3 and an fp8_e5m2 instance must not share
    pages (a fresh-clone test loaded one's bytes into the other). The
    format is the device pool's dtype (SGLang's memory_pool: dtype, and
    store_dtype uint8 for fp8). A pool whose two dtypes agree keeps its
    namespace."""
    import types
    names = {}
    for fmt in ("float8_e4m3fn", "float8_e5m2", None):
        pool = FakeHostPool(mla=mla, pages=4, dtype=torch.uint8 if fmt else torch.bfloat16)
        pool.device_pool = types.SimpleNamespace(
            dtype="torch." + fmt if fmt else torch.bfloat16,
            store_dtype=torch.uint8 if fmt else torch.bfloat16)
        b = backend(server.url, prefix, pool)
        names[fmt] = b.namespace
        b.close()
    assert names["float8_e4m3fn"] != names["float8_e5m2"]
    assert ":float8_e5m2:" in names["float8_e5m2"] and ":uint8:" not in names["float8_e5m2"]
    assert ":bfloat16:" in names[None]


def test_refused_configuration_fails_at_register(fresh_server, prefix, tmp_path):
    """Finding 4: a token the server denies (or any configuration
    kvpool_connect refuses) raises ConfigError from register_mem_pool_host,
    so SGLang's attach_storage_backend fails (SGLang does not start)
    instead of running with the cache off and a new connection per call."""
    tokens = tmp_path / "tokens"
    good = "c0ffee00c0ffee00c0ffee00c0ffee00"
    tokens.write_text("[tokens]\n%s rw %s:\n" % (good, prefix))
    tokens.chmod(0o600)
    fresh_server.extra += ["--tokens-file", str(tokens)]
    fresh_server.start()
    pool = FakeHostPool(pages=4)
    with pytest.raises(ValueError) as e:
        backend(fresh_server.url, prefix, pool, token="5d6e7f8091a2b3c4d5e6f708192a3b4c")
    assert "Denied" in type(e.value).__name__ or "denied" in str(e.value).lower() or \
        "refuse" in str(e.value).lower()
    b = backend(fresh_server.url, prefix, pool, token=good)
    assert all(b.batch_set_v1(chain(1, seed=111), pool.indices(0, 1)))
    b.close()


@pytest.mark.parametrize("extra,words", [
    ({"timeout_s": 1e-9}, "timeout_s"), ({"timeout_s": 1e12}, "timeout_s"),
    ({"namespace_prefix": ""}, "empty"), ({"namespace_prefx": "a"}, "namespace_prefix"),
    ({"url": "rdma://127.0.0.1:1"}, "rdma")])
def test_settings_refused_at_start(server, prefix, extra, words):
    """Findings 4 and 14: timeouts libkvpool would refuse, an empty
    prefix, a misspelt key (which would merge deployments) and rdma://
    without a device fail at start, naming the setting."""
    p = dict(extra)
    url = p.pop("url", server.url)
    with pytest.raises(ValueError) as e:
        b = backend(url, prefix, FakeHostPool(pages=4), **p)
        b.close()
    assert words in str(e.value), str(e.value)


def test_unknown_keys_are_logged_sglangs_own_pass(server, prefix, caplog):
    import logging
    with caplog.at_level(logging.WARNING, "kvpool.engines"):
        b = backend(server.url, prefix, FakeHostPool(pages=4), prefetch_timeout_base=1,
                    tp_lcm_size=2, something_else=3)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("something_else" in m for m in msgs)
    assert not any("prefetch_timeout_base" in m or "tp_lcm_size" in m for m in msgs)
    b.close()


def test_page_larger_than_max_block_bytes_fails_at_register(fresh_server, prefix):
    """Finding 14: pages the server can never store are found at start."""
    fresh_server.extra += ["--max-block-bytes", "4KiB"]
    fresh_server.start()
    pool = FakeHostPool(pages=4, layers=8, heads=4, head_dim=16)      # 8 KiB pages
    with pytest.raises(ValueError) as e:
        backend(fresh_server.url, prefix, pool)
    assert "max_block_bytes" in str(e.value)


def test_host_slots_outside_the_pool_are_refused(server, prefix, raw):
    """Finding 5: host_indices outside the host pool, negative or not
    page-aligned are refused before any I/O: nothing past the pool is
    overwritten by a get, nothing past it is stored by a set."""
    pool = FakeHostPool(pages=8, guard_pages=0)
    pool.fill_random(3)
    b = backend(server.url, prefix, pool)
    keys = chain(2, seed=121)
    assert all(b.batch_set_v1(keys, pool.indices(0, 2)))
    before = pool.raw_bytes()
    size = pool.size
    for bad in (torch.arange(size, size + PAGE), torch.arange(-PAGE, 0),
                torch.arange(1, 1 + PAGE), torch.tensor([0, 1, 3, 2])):
        assert b.batch_get_v1(keys[:1], bad) == [False], bad
        assert b.batch_set_v1(chain(1, seed=122), bad) == [False], bad
        assert b.batch_get_v1(keys[:1], bad.tolist()) == [False], bad
    assert pool.raw_bytes() == before
    assert raw(b.namespace).exists_many([bytes.fromhex(k) for k in chain(1, seed=122)]) == \
        [False]
    assert b.batch_get_v1(keys, pool.indices(2, 2)) == [True, True]
    b.close()


def test_pieces_outside_the_pool_buffers_are_refused(server, prefix):
    """Finding 5: a pool whose page meta points outside its buffers (a
    pool with no size, or an off-by-one in its meta) is refused too."""
    pool = FakeHostPool(pages=4, guard_pages=0)
    real = pool.get_page_buffer_meta

    def shifted(idx):
        ptrs, sizes = real(idx)
        return [p + sizes[0] for p in ptrs], sizes      # one page further
    b = backend(server.url, prefix, pool)
    keys = chain(1, seed=131)
    pool.get_page_buffer_meta = shifted
    assert b.batch_set_v1(keys, pool.indices(3, 1)) == [False]
    b.close()


def test_long_names_stay_valid_namespaces(server, prefix):
    """Finding 11: <ns>:draft and <ns>:<pool> are capped at 255 bytes
    like the namespace itself (a long model path made the draft namespace
    invalid, so draft pages never stored)."""
    from sglang.srt.mem_cache import hicache_storage as h
    pool = FakeHostPool(pages=8)
    pool.fill_random(2)
    model = "/mnt/checkpoints/" + "run-2026-07-01-grpo-math/" * 8 + "global_step_1200/hf"
    c = h.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, model,
                               extra_config={"url": server.url, "namespace_prefix": prefix,
                                             "timeout_s": 1.0})
    b = ks.KVPoolHiCacheStorage(c, pool)
    mamba = FakeHostPool(mla=True, pages=8, layers=2, head_dim=8)
    b.register_mem_host_pool_v2(mamba, "mamba")
    assert all(len(ns) <= 255 for ns in b.namespaces())
    keys = chain(2, seed=141)
    flat = [torch.rand(pool.page_bytes() // 2).to(torch.bfloat16) for _ in range(2)]
    assert b.batch_set([k + ".draft" for k in keys], flat) is True
    assert b.exists(keys[0] + ".draft")
    assert b.batch_set_v2([hs.PoolTransfer(name="mamba", host_indices=mamba.indices(0, 1),
                                           keys=keys[:1])]) == {"mamba": [True]}
    b.close()


def test_unsized_arguments_answer(server, prefix):
    """Finding 13: a generator, an int or None as keys answers, never
    raises (SGLang's storage threads die for good on an exception)."""
    pool = FakeHostPool(pages=8)
    b = backend(server.url, prefix, pool)
    keys = chain(2, seed=151)
    assert b.batch_set_v1(iter(keys), pool.indices(0, 2)) == [True, True]
    assert b.batch_get_v1((k for k in keys), pool.indices(2, 2)) == [True, True]
    for junk in (5, None, 3.5):
        assert b.batch_get_v1(junk, pool.indices(0, 1)) == []
        assert b.batch_set_v1(junk, pool.indices(0, 1)) == []
        assert b.batch_get(junk) == []
        assert b.batch_set(junk, []) is False
        assert b.batch_exists(junk) == 0
    b.close()


# ---- issue 29: retention hints and the load estimator ---------------------------------

def test_retention_hint_first_blocks(server, prefix, raw):
    """retain_first_blocks/retain_ms: the first 130 pages of the chain (one
    whole batch of 128 and two pages of the next, counted through the
    batches' prefix_keys) are stored retained, the rest ordinary."""
    pool = FakeHostPool(pages=320)
    pool.fill_random(11)
    keys = chain(300, seed=21)
    b = backend(server.url, prefix, pool, retain_first_blocks=130, retain_ms=60000)
    assert ctl.backup(b, keys, pool.indices(0, 300), PAGE) == 300
    ns = raw(b.namespace).stats(b.namespace)["namespaces"][b.namespace]
    assert ns["blocks"] == 300
    assert ns["retained_blocks"] == 130
    assert b.stats()["retained_pages"] == 130
    b.close()


def test_retention_per_request_through_extra_info(server, prefix, raw):
    """A controller that passes extra_info={"retain_ms": ...} retains that
    batch; a value that is no retention is ignored (stored all the same,
    no exception into SGLang)."""
    pool = FakeHostPool(pages=16)
    pool.fill_random(12)
    keys = chain(12, seed=22)
    b = backend(server.url, prefix, pool, request_retain=True)
    info = hs.HiCacheStorageExtraInfo(prefix_keys=None, extra_info={"retain_ms": 30000})
    assert b.batch_set_v1(keys[:6], pool.indices(0, 6), info) == [True] * 6
    bad = hs.HiCacheStorageExtraInfo(prefix_keys=keys[:6], extra_info={"retain_ms": "soon"})
    assert b.batch_set_v1(keys[6:], pool.indices(6, 6), bad) == [True] * 6
    ns = raw(b.namespace).stats(b.namespace)["namespaces"][b.namespace]
    assert ns["blocks"] == 12 and ns["retained_blocks"] == 6
    b.close()


def test_retention_and_estimator_settings_checked_at_start(server, prefix):
    pool = FakeHostPool(pages=4)
    from kvpool._adapters.config import ConfigError
    with pytest.raises(ConfigError, match="retain_first_blocks"):
        ks.KVPoolHiCacheStorage(config(server.url, prefix, retain_first_blocks=4), pool)
    with pytest.raises(ConfigError, match="retain_ms"):
        ks.KVPoolHiCacheStorage(config(server.url, prefix, retain_first_blocks=4,
                                       retain_ms=-1), pool)
    with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
        ks.KVPoolHiCacheStorage(config(server.url, prefix, prefill_tokens_per_s=0), pool)
    with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
        ks.KVPoolHiCacheStorage(config(server.url, prefix, prefill_tokens_per_s="fast"), pool)


@pytest.mark.parametrize("speed,offered", [(1e-3, True), (1e12, False)])
def test_estimator_offers_a_hit_only_when_loading_pays(server, prefix, speed, offered):
    """prefill_tokens_per_s: an engine that prefills a token in 1000 s
    always loads; one whose prefill is practically free declines every
    hit once it has measured a load (the first get teaches it), except one
    probe in PROBE_EVERY."""
    pool = FakeHostPool(pages=80)
    pool.fill_random(13)
    keys = chain(64, seed=23)
    b = backend(server.url, prefix, pool, prefill_tokens_per_s=speed)
    assert ctl.backup(b, keys, pool.indices(0, 64), PAGE) == 64
    assert ctl.exists_run(b, keys) == 64              # nothing measured yet: learning
    dst = FakeHostPool(pages=80)
    assert ctl.load(b, keys, dst.indices(0, 64), PAGE) == 64
    hits = [ctl.exists_run(b, keys) for _ in range(b.estimator.PROBE_EVERY)]
    if offered:
        assert hits == [64] * len(hits)
    else:
        assert sorted(hits) == [0] * (len(hits) - 1) + [64]     # one probe
        assert b.stats()["declined_hit_pages"] == 64 * (len(hits) - 1)
    b.close()


def test_prefetch_refreshes_first_pages_retention(server, prefix, raw):
    """retain_first_blocks: a prefetch refreshes the retention of the
    chain's first pages (SGLang never stores a page it prefetched again),
    also when this instance holds them itself (they are then in
    prefix_keys, before the batch it asks about); at most one refresh
    per retain_ms / 2 per chain."""
    pool = FakeHostPool(pages=12)
    pool.fill_random(14)
    keys = chain(10, seed=24)
    b = backend(server.url, prefix, pool, retain_first_blocks=2, retain_ms=2000)
    assert ctl.backup(b, keys, pool.indices(0, 10), PAGE) == 10
    t0 = time.monotonic()
    ns = raw(b.namespace).stats(b.namespace)["namespaces"][b.namespace]
    assert ns["retained_blocks"] == 2
    reader = backend(server.url, prefix, pool, retain_first_blocks=2, retain_ms=2000)
    time.sleep(max(0.0, 1.2 - (time.monotonic() - t0)))
    # the first 4 pages are in this instance's host memory: it asks for the rest
    assert ctl.exists_run(reader, keys[4:], prefix_keys=keys[:4]) == 6
    assert reader.stats()["retain_refreshes"] == 1
    assert ctl.exists_run(reader, keys[4:], prefix_keys=keys[:4]) == 6
    assert reader.stats()["retain_refreshes"] == 1        # not again so soon
    # 2.6 s after the backup its own retention has lapsed: only the
    # refresh at 1.2 s keeps the first two pages retained (until 3.2 s)
    time.sleep(max(0.0, 2.6 - (time.monotonic() - t0)))
    ns = raw(b.namespace).stats(b.namespace)["namespaces"][b.namespace]
    assert ns["retained_blocks"] == 2
    # a prefetch from the chain's start refreshes them too
    assert ctl.exists_run(reader, keys) == 10
    assert reader.stats()["retain_refreshes"] == 2
    b.close()
    reader.close()


def test_declined_hit_keeps_no_lease(fresh_server, prefix):
    """A hit the estimator declines is matched without a lease (it is
    never loaded, so it must not pin blocks for lease_ms); the probe it
    still offers one time in PROBE_EVERY is leased."""
    fresh_server.start()
    pool = FakeHostPool(pages=40)
    pool.fill_random(15)
    keys = chain(32, seed=25)
    b = backend(fresh_server.url, prefix, pool, prefill_tokens_per_s=1e12, lease_ms=60000)
    assert ctl.backup(b, keys, pool.indices(0, 32), PAGE) == 32
    assert ctl.exists_run(b, keys) == 32              # learning
    dst = FakeHostPool(pages=40)
    assert ctl.load(b, keys, dst.indices(0, 32), PAGE) == 32      # ends that lease
    with kvpool.Client(fresh_server.url, "stats") as c:
        assert c.stats()["leases_active"] == 0
        for _ in range(b.estimator.PROBE_EVERY - 1):
            assert ctl.exists_run(b, keys) == 0
            assert c.stats()["leases_active"] == 0
        assert ctl.exists_run(b, keys) == 32          # the probe
        assert c.stats()["leases_active"] == 32
    b.close()


def test_timed_out_load_teaches_the_estimator(fresh_server, prefix):
    """A load that times out counts as a load of at least timeout_s: on a
    pool that does not answer in time, later hits are declined (but for
    the probe) instead of each costing a whole timeout."""
    fresh_server.start()
    pool = FakeHostPool(pages=40)
    pool.fill_random(16)
    keys = chain(32, seed=26)
    b = backend(fresh_server.url, prefix, pool, prefill_tokens_per_s=1e6, timeout_s=0.5)
    assert ctl.backup(b, keys, pool.indices(0, 32), PAGE) == 32
    assert ctl.exists_run(b, keys) == 32              # learning
    dst = FakeHostPool(pages=40)
    fresh_server.proc.send_signal(signal.SIGSTOP)     # a pool that does not answer
    try:
        t0 = time.monotonic()
        assert ctl.load(b, keys, dst.indices(0, 32), PAGE) == 0
        assert time.monotonic() - t0 >= 0.45
    finally:
        fresh_server.proc.send_signal(signal.SIGCONT)
    assert b.estimator.s_per_byte >= 0.5 / (32 * b._page_bytes)
    deadline = time.monotonic() + 10
    while not b._link(False, "read").up and time.monotonic() < deadline:
        time.sleep(0.05)
    hits = [ctl.exists_run(b, keys) for _ in range(b.estimator.PROBE_EVERY)]
    assert sorted(hits) == [0] * (len(hits) - 1) + [32]
    b.close()


def test_prefill_speed_empty_string_refused(server, prefix):
    """prefill_tokens_per_s "" is refused like any other value that is no
    speed (it used to switch the estimator off silently)."""
    from kvpool._adapters.config import ConfigError
    pool = FakeHostPool(pages=4)
    with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
        ks.KVPoolHiCacheStorage(config(server.url, prefix, prefill_tokens_per_s=""), pool)


def test_learning_offer_is_counted_before_a_page_is_seen(server, prefix):
    """An instance that has not stored or loaded a page yet (it does not
    know a page's size) offers its first hit to measure it: that offer is
    counted (the estimator's counters under-reported it)."""
    pool = FakeHostPool(pages=12)
    pool.fill_random(17)
    keys = chain(8, seed=27)
    writer = backend(server.url, prefix, pool)
    assert ctl.backup(writer, keys, pool.indices(0, 8), PAGE) == 8
    reader = backend(server.url, prefix, FakeHostPool(pages=12), prefill_tokens_per_s=1e6)
    assert ctl.exists_run(reader, keys) == 8
    assert reader.estimator.state()["offered"] == 1
    writer.close()
    reader.close()
