"""kvpool.lmcache inside LMCache's own code (KVPOOL_LMCACHE_SRC).

Multiprocess mode: LMCache's --l2-adapter argument parser and L2 adapter
factory build NativeConnectorL2Adapter over KVPoolL2Plugin from the
shipped config/engines/lmcache-mp-l2.json; stores, lookups (its Bitmap),
loads and deletes go through that wrapper, and its usage accounting
(get_usage) must equal what the pool holds after every delete.

Non-MP mode: LMCache's LMCacheEngineConfig reads the shipped
config/engines/lmcache-remote.yaml, its ConnectorManager loads the
plugin, and a real LocalCPUBackend and RemoteBackend store and fetch
chunks (get_blocking, batched_get_blocking, batched_get_non_blocking, a
short last chunk, contains)."""

import argparse
import asyncio
import json
import os
import select
import threading
import time

import pytest

import engine_env

COMMIT = engine_env.load_lmcache()
if COMMIT is None:
    pytest.skip("KVPOOL_LMCACHE_SRC is not set", allow_module_level=True)

import torch  # noqa: E402

from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    add_l2_adapters_args, parse_args_to_l2_adapters_config)
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (  # noqa: E402
    NativeConnectorL2Adapter, _object_key_to_string)
from lmcache.v1.memory_management import MemoryFormat, TensorMemoryAllocator  # noqa: E402

import kvpool  # noqa: E402
import kvpool.lmcache as kl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = os.path.join(ROOT, "config", "engines")
SHAPE = torch.Size((2, 4, 16, 64))          # (K/V, layers, tokens, hidden): 16 KiB fp16


def test_report():
    engine_env.report("lmcache", COMMIT)


# ---- multiprocess mode ---------------------------------------------------------------------

def mp_adapter(url, prefix):
    with open(os.path.join(CFG, "lmcache-mp-l2.json")) as f:
        spec = json.load(f)
    spec["adapter_params"].update(url=url, namespace_prefix=prefix, timeout_s=1.0)
    parser = argparse.ArgumentParser()
    add_l2_adapters_args(parser)
    args = parser.parse_args(["--l2-adapter", json.dumps(spec)])
    cfg = parse_args_to_l2_adapters_config(args)
    adapter = create_l2_adapter(cfg.adapters[0] if hasattr(cfg, "adapters") else cfg[0])
    assert isinstance(adapter, NativeConnectorL2Adapter)
    assert isinstance(adapter._client, kl.KVPoolL2Plugin)
    return adapter


class Objects:
    def __init__(self, n):
        self.alloc = TensorMemoryAllocator(torch.empty(n * 2 * SHAPE.numel() * 2 + (1 << 20),
                                                       dtype=torch.uint8))

    def make(self, value):
        obj = self.alloc.allocate(SHAPE, torch.float16, MemoryFormat.KV_2LTD)
        assert obj is not None
        obj.tensor.fill_(value)
        return obj


def wait_fd(fd, timeout=10.0):
    assert select.select([fd], [], [], timeout)[0], "no completion"
    try:
        os.eventfd_read(fd)
    except (BlockingIOError, OSError):
        pass


_STORED = {}                 # store results popped, by task id (any thread's)
_STORED_LOCK = threading.Lock()


def store(adapter, keys, objs):
    """Submit a store task and wait for its result, as LMCache's store
    controller does (pop_completed_store_tasks pops every finished task)."""
    tid = adapter.submit_store_task(keys, objs)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with _STORED_LOCK:
            _STORED.update({(id(adapter), t): r for t, r in
                            adapter.pop_completed_store_tasks().items()})
            got = _STORED.pop((id(adapter), tid), None)
        if got is not None:
            return got
        select.select([adapter.get_store_event_fd()], [], [], 0.05)
    raise AssertionError("store task %s never completed" % tid)


def query(submit, fd, get, timeout=10.0):
    tid = submit()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = get(tid)
        if got is not None:
            return got
        select.select([fd], [], [], 0.2)
    raise AssertionError("task %s never completed" % tid)


def okey(chunk, rank=0, salt=""):
    return ObjectKey(chunk_hash=chunk.to_bytes(32, "big"), model_name="real-model",
                     kv_rank=(2 << 24) | (rank << 16) | (2 << 8) | rank, object_group_id=0,
                     cache_salt=salt)


def bits(bitmap, n):
    return [bool(bitmap.test(i)) for i in range(n)]


def test_mp_store_lookup_load_delete_accounting(server, prefix):
    a = mp_adapter(server.url, prefix)
    objs = Objects(16)
    keys = [okey(c) for c in range(4)] + [okey(c, rank=1) for c in range(4)]
    src = [objs.make(float(i + 1)) for i in range(8)]
    res = store(a, keys, src)
    assert res.ok if hasattr(res, "ok") else res
    size = src[0].get_size()
    assert a.get_usage().total_bytes_used == 8 * size
    layout = MemoryLayoutDesc([SHAPE], [torch.float16])
    missing = okey(99)
    bm = query(lambda: a.submit_lookup_and_lock_task(keys + [missing], layout),
               a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result)
    assert bits(bm, 9) == [True] * 8 + [False]
    a.submit_unlock(keys)
    dst = [objs.make(0.0) for _ in range(8)]
    bm = query(lambda: a.submit_load_task(keys, dst), a.get_load_event_fd(),
               a.query_load_result)
    assert bits(bm, 8) == [True] * 8
    assert all(torch.equal(d.tensor, s.tensor) for d, s in zip(dst, src))
    # delete the first chunk of each row: exactly those go, and LMCache's
    # usage says so (chained rows would have lost their descendants too)
    a.delete([keys[0], keys[4]])
    assert a.get_usage().total_bytes_used == 6 * size
    raw = kvpool.Client(server.url, a._client.namespace)
    held = raw.exists_many([kl.l2_plugin.string_key(_object_key_to_string(k)) for k in keys])
    raw.close()
    assert held == [False, True, True, True, False, True, True, True]
    # a gap is seen per key (gap-keeping trim policies)
    bm = query(lambda: a.submit_lookup_and_lock_task(keys, layout),
               a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result)
    assert bits(bm, 8) == held
    # storing a deleted key again counts its bytes again
    store(a, keys[:1], src[:1])
    assert a.get_usage().total_bytes_used == 7 * size
    a.close()


def test_mp_plugin_after_close_and_bad_calls(server, prefix):
    a = mp_adapter(server.url, prefix)
    plugin = a._client
    a.close()                                    # the wrapper closes the plugin
    old = plugin._efd
    assert old is None
    reuse = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        assert isinstance(plugin.submit_batch_exists(["real-model@0@0@00"]), int)
        assert isinstance(plugin.submit_batch_get(None, None), int)
        assert not select.select([reuse], [], [], 0.05)[0]
    finally:
        os.close(reuse)


def test_mp_threads_and_pool_down(fresh_server, prefix):
    fresh_server.start()
    a = mp_adapter(fresh_server.url, prefix)
    objs = Objects(64)
    errors = []

    def worker(rank):
        try:
            for i in range(8):
                store(a, [okey(1000 * rank + i, rank=rank)], [objs.make(float(i))])
        except Exception as e:
            errors.append(e)
    ts = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    fresh_server.kill()
    layout = MemoryLayoutDesc([SHAPE], [torch.float16])
    t0 = time.monotonic()
    bm = query(lambda: a.submit_lookup_and_lock_task([okey(1000)], layout),
               a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result)
    assert bits(bm, 1) == [False] and time.monotonic() - t0 < 5
    a.close()


# ---- non-MP mode -----------------------------------------------------------------------------

def remote_backend(url, prefix, loop, chunk=16, mla=False, worker=0, world=1):
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend
    config = LMCacheEngineConfig.from_file(os.path.join(CFG, "lmcache-remote.yaml"))
    extra = dict(config.extra_config or {})
    extra.update({"remote_storage_plugin.kvpool.url": url,
                  "remote_storage_plugin.kvpool.namespace_prefix": prefix,
                  "remote_storage_plugin.kvpool.timeout_s": 1.0,
                  "remote_enable_mla_worker_id_as0": mla})
    config.extra_config = extra
    config.chunk_size = chunk
    config.max_local_cpu_size = 0.05
    config.blocking_timeout_secs = 5
    meta = LMCacheMetadata(model_name="real-model", world_size=world, local_world_size=world,
                           worker_id=worker, local_worker_id=worker, kv_dtype=torch.float16,
                           kv_shape=(4, 1 if mla else 2, chunk, 2, 32), use_mla=mla)
    cpu = LocalCPUBackend(config, meta)
    rb = RemoteBackend(config, meta, loop, cpu, "cpu", plugin_name="kvpool")
    assert rb.connection is not None, "the plugin did not load"
    return rb, cpu, meta


def cache_key(meta, i, worker=None):
    from lmcache.utils import CacheEngineKey
    return CacheEngineKey(model_name=meta.model_name, world_size=meta.world_size,
                          worker_id=meta.worker_id if worker is None else worker,
                          chunk_hash=0x1234500 + i, dtype=meta.kv_dtype)


def chunk_obj(cpu, meta, tokens, value):
    layers, kv, _, heads, dim = meta.kv_shape
    obj = cpu.allocate(torch.Size((kv, layers, tokens, heads * dim)), meta.kv_dtype,
                       MemoryFormat.KV_MLA_FMT if meta.use_mla else MemoryFormat.KV_2LTD)
    assert obj is not None
    obj.tensor.fill_(value)
    return obj


def run_loop():
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    return loop, t


def test_nonmp_remote_backend_round_trip(server, prefix):
    loop, thread = run_loop()
    rb, cpu, meta = remote_backend(server.url, prefix, loop)
    keys = [cache_key(meta, i) for i in range(4)]
    objs = [chunk_obj(cpu, meta, 16, float(i + 1)) for i in range(3)]
    objs.append(chunk_obj(cpu, meta, 5, 9.0))                  # a short last chunk
    want = [o.tensor.clone() for o in objs]
    rb.batched_submit_put_task(keys, objs)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(rb.contains(k) for k in keys):
        time.sleep(0.05)
    assert all(rb.contains(k) for k in keys)
    assert rb.batched_contains(keys) == 4
    got = rb.get_blocking(keys[1])
    assert got is not None and torch.equal(got.tensor, want[1])
    many = rb.batched_get_blocking(keys)
    assert all(m is not None for m in many)
    assert [tuple(m.get_shape()) for m in many][3][2] == 5, "the short chunk keeps 5 tokens"
    assert all(torch.equal(m.tensor, w) for m, w in zip(many, want))
    fut = asyncio.run_coroutine_threadsafe(rb.batched_get_non_blocking("lookup-1", keys), loop)
    nb = fut.result(10)
    assert len(nb) == 4 and all(torch.equal(m.tensor, w) for m, w in zip(nb, want))
    assert rb.get_blocking(cache_key(meta, 99)) is None
    rb.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_nonmp_mla_worker0_writes(server, prefix):
    loop, thread = run_loop()
    w0, cpu0, m0 = remote_backend(server.url, prefix, loop, mla=True, worker=0, world=2)
    w1, cpu1, m1 = remote_backend(server.url, prefix, loop, mla=True, worker=1, world=2)
    k1 = cache_key(m1, 7)
    w1.submit_put_task(k1, chunk_obj(cpu1, m1, 16, 3.0))
    time.sleep(0.3)
    assert not w1.contains(k1), "only worker 0 writes on MLA"
    w0.submit_put_task(cache_key(m0, 7), chunk_obj(cpu0, m0, 16, 4.0))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not w1.contains(k1):
        time.sleep(0.05)
    got = w1.get_blocking(k1)
    assert got is not None and float(got.tensor.flatten()[0]) == 4.0
    for b in (w0, w1):
        b.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


# ---- issue 24, fresh-clone findings (items 6, 8, 10, 17) ------------------------------------

def _remote_parts(url, prefix, extra_over, mla=False, worker=0, world=1, chunk=16):
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    config = LMCacheEngineConfig.from_file(os.path.join(CFG, "lmcache-remote.yaml"))
    extra = dict(config.extra_config or {})
    extra.update({"remote_storage_plugin.kvpool.url": url,
                  "remote_storage_plugin.kvpool.namespace_prefix": prefix,
                  "remote_storage_plugin.kvpool.timeout_s": 1.0})
    extra.update(extra_over)
    config.extra_config = extra
    config.chunk_size = chunk
    config.max_local_cpu_size = 0.05
    config.blocking_timeout_secs = 5
    meta = LMCacheMetadata(model_name="real-model", world_size=world, local_world_size=world,
                           worker_id=worker, local_worker_id=worker, kv_dtype=torch.float16,
                           kv_shape=(4, 1 if mla else 2, chunk, 2, 32), use_mla=mla)
    return config, meta


@pytest.mark.parametrize("key,value", [("namespace", ["a"]), ("namespace_prefx", "x"),
                                       ("timeout_s", "0"), ("token", 42)])
def test_nonmp_configuration_error_stops_the_backend(server, prefix, key, value, caplog):
    """Finding 8: LMCache's RemoteBackend swallowed the plugin's
    ConfigError and ran with no connection for ever. The error is now also
    LMCache's IrrecoverableException, which RemoteBackend lets through:
    building it fails (with the legacy remote_url that stops the engine);
    LMCache's CreateStorageBackends, for remote_storage_plugins, logs it
    and builds no kvpool backend. Either way the adapter logs it once as an
    ERROR naming the setting."""
    import logging
    from lmcache.v1.exceptions import IrrecoverableException
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend
    loop, thread = run_loop()
    config, meta = _remote_parts(server.url, prefix,
                                 {"remote_storage_plugin.kvpool." + key: value})
    cpu = LocalCPUBackend(config, meta)
    with caplog.at_level(logging.ERROR, "kvpool.lmcache"):
        with pytest.raises(IrrecoverableException) as e:
            RemoteBackend(config, meta, loop, cpu, "cpu", plugin_name="kvpool")
    assert key.replace("prefx", "prefix") in str(e.value)
    ours = [r for r in caplog.records if r.name == "kvpool.lmcache" and
            r.levelno >= logging.ERROR]
    assert len(ours) == 1 and "CONFIGURATION ERROR" in ours[0].getMessage()
    try:
        from lmcache.v1.storage_backend import CreateStorageBackends
        backends = CreateStorageBackends(config, meta, loop, "cpu")
    except Exception as err:        # more of LMCache than this machine loads
        print("CreateStorageBackends not driven here: %r" % (err,))
    else:
        assert not any("kvpool" in name for name in backends), list(backends)
        for b in backends.values():
            try:
                b.close()
            except Exception:
                pass
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.mark.parametrize("mla,flag", [(False, True), (True, False)])
def test_nonmp_mla_mode_as_lmcache_reads_it(server, prefix, mla, flag):
    """Finding 6: with the flag on a model that is not MLA (or an MLA
    model with it off), LMCache keeps per-worker keys and every worker
    writes: worker 1 must store and find its own chunk (the adapter made it
    read-only on worker 0's namespace: never a hit)."""
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend
    loop, thread = run_loop()
    config, meta = _remote_parts(server.url, prefix, {"remote_enable_mla_worker_id_as0": flag},
                                 mla=mla, worker=1, world=2)
    cpu = LocalCPUBackend(config, meta)
    w1 = RemoteBackend(config, meta, loop, cpu, "cpu", plugin_name="kvpool")
    assert w1._mla_worker_id_as0_mode is False
    k1 = cache_key(meta, 31)
    w1.submit_put_task(k1, chunk_obj(cpu, meta, 16, 6.0))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not w1.contains(k1):
        time.sleep(0.05)
    got = w1.get_blocking(k1)
    assert got is not None and float(got.tensor.flatten()[0]) == 6.0
    w1.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_nonmp_remove_takes_one_key(server, prefix):
    """Finding 10: batched_submit_put_task chained the batch, so
    RemoteBackend.remove(keys[0]) took all of it."""
    loop, thread = run_loop()
    rb, cpu, meta = remote_backend(server.url, prefix, loop)
    keys = [cache_key(meta, 40 + i) for i in range(4)]
    rb.batched_submit_put_task(keys, [chunk_obj(cpu, meta, 16, float(i)) for i in range(4)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and rb.batched_contains(keys) < 4:
        time.sleep(0.05)
    assert rb.remove(keys[0]) is True
    assert [rb.contains(k) for k in keys] == [False, True, True, True]
    rb.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_mp_load_into_a_bigger_object_writes_nothing(server, prefix):
    """Finding 17: loading a stored object into a bigger memory object
    (another layout under the same key) failed only after writing part of
    it; the lookup LMCache makes first now learns the size, and the load
    leaves the object untouched."""
    a = mp_adapter(server.url, prefix)
    objs = Objects(16)
    keys = [okey(500 + c) for c in range(2)]
    store(a, keys, [objs.make(1.0), objs.make(2.0)])
    layout = MemoryLayoutDesc([SHAPE], [torch.float16])
    bm = query(lambda: a.submit_lookup_and_lock_task(keys, layout),
               a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result)
    assert bits(bm, 2) == [True, True]
    big = objs.alloc.allocate(torch.Size((2, 4, 32, 64)), torch.float16, MemoryFormat.KV_2LTD)
    big.tensor.fill_(-1)
    good = objs.make(0.0)
    bm = query(lambda: a.submit_load_task(keys, [big, good]), a.get_load_event_fd(),
               a.query_load_result)
    assert bits(bm, 2) == [False, True]
    assert bool((big.tensor == -1).all()), "the bigger object was written"
    assert bool((good.tensor == 2.0).all())
    a.close()


def _retained(url, prefix):
    """Retained blocks in the namespace under `prefix` (one per test)."""
    c = kvpool.Client(url)
    try:
        nss = {k: v for k, v in c.stats()["namespaces"].items() if k.startswith(prefix)}
    finally:
        c.close()
    assert len(nss) == 1, nss
    return next(iter(nss.values()))["retained_blocks"]


def test_nonmp_request_retention_reaches_the_pool(server, prefix):
    """Issue 29: a request's retention in LMCache's non-MP mode. LMCache's
    vLLM integration (extract_request_configs, not importable without
    vLLM) copies a request's "lmcache."-prefixed kv_transfer_params into
    request_configs, which its token database puts in every CacheEngineKey
    of the request. Here LMCache's own CacheEngineKey carries
    {"lmcache.kvpool.retain_ms": MS}: its key string is the same as
    without it (the chunks stay shared), and the chunks LMCache's
    RemoteBackend stores through the plugin are retained in the pool,
    those of a key without it not."""
    from lmcache.utils import CacheEngineKey
    loop, thread = run_loop()
    rb, cpu, meta = remote_backend(server.url, prefix, loop)

    def key(i, cfgs):
        return CacheEngineKey(model_name=meta.model_name, world_size=meta.world_size,
                              worker_id=meta.worker_id, chunk_hash=0x7700 + i,
                              dtype=meta.kv_dtype, request_configs=cfgs)
    kept = [key(i, {"lmcache.kvpool.retain_ms": 60000}) for i in range(3)]
    plain = [key(i, None) for i in range(3, 5)]
    assert kept[0].to_string() == key(0, None).to_string()
    rb.batched_submit_put_task(kept, [chunk_obj(cpu, meta, 16, 1.0) for _ in kept])
    rb.batched_submit_put_task(plain, [chunk_obj(cpu, meta, 16, 2.0) for _ in plain])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and rb.batched_contains(kept + plain) < 5:
        time.sleep(0.05)
    assert rb.batched_contains(kept + plain) == 5
    assert _retained(server.url, prefix) == 3
    rb.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
