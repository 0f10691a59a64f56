"""Contract tests of kvpool.lmcache: the multiprocess-mode native L2 plugin
(driven as LMCache's NativeConnectorL2Adapter drives it) and the non-MP
remote storage plugin (driven as RemoteBackend calls a connector), against
a real kvpoold. See docs/engines.md and the engine notes (§4, §5)."""

import asyncio
import os
import select
import threading
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import kvpool.lmcache as kl  # noqa: E402
from lmcache.v1.storage_backend.connector import ConnectorContext  # noqa: E402
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector  # noqa: E402

from lmcache_standin_wrapper import WrapperStandIn  # noqa: E402

OBJ = 4096


def spec(url, prefix, **params):
    return {"type": "native_plugin", "module_path": "kvpool.lmcache",
            "class_name": "KVPoolL2Plugin", "max_capacity_gb": 0,
            "adapter_params": dict({"url": url, "model": "test-model", "kv_dtype": "bf16",
                                    "chunk_tokens": 256, "namespace_prefix": prefix,
                                    "timeout_s": 1.0}, **params)}


def mp_key(chunk, rank=0, world=2, group=0, salt=""):
    kv_rank = world << 24 | rank << 16 | world << 8 | rank
    k = "test-model@%08x@%x@%064x" % (kv_rank, group, chunk)
    return k + "@" + salt if salt else k


def views(n, seed=None):
    out = []
    for i in range(n):
        b = bytearray(os.urandom(OBJ) if seed is not None else bytes(OBJ))
        out.append(memoryview(b))
    return out


def readable(fd, timeout=0.0):
    return bool(select.select([fd], [], [], timeout)[0])


def test_construct_callables_close(server, prefix):
    w = WrapperStandIn(spec(server.url, prefix))
    assert callable(w.obj.submit_batch_delete)
    w.close()
    w.obj.close()


def test_set_exists_get_roundtrip(server, prefix):
    w = WrapperStandIn(spec(server.url, prefix))
    keys = [mp_key(c) for c in range(6)]
    src = views(6, seed=1)
    ok, err, bools = w.wait(w.submit("submit_batch_set", keys, src))
    assert ok and bools == [True] * 6
    ok, err, bools = w.wait(w.submit("submit_batch_set", keys, src))     # again: ok
    assert ok and bools == [True] * 6
    ok, _, bools = w.wait(w.submit("submit_batch_exists", keys + [mp_key(99)]))
    assert bools == [True] * 6 + [False]
    dst = views(6)
    ok, _, bools = w.wait(w.submit("submit_batch_get", keys, dst))
    assert ok and bools == [True] * 6
    assert [bytes(d) for d in dst] == [bytes(s) for s in src]
    assert w.unknown == []
    w.close()


def test_exists_interleaved_ranks_per_row_runs(server, prefix):
    w = WrapperStandIn(spec(server.url, prefix))
    r0 = [mp_key(c, rank=0) for c in range(4)]
    r1 = [mp_key(c, rank=1) for c in range(4)]
    w.wait(w.submit("submit_batch_set", r0, views(4, 1)))
    w.wait(w.submit("submit_batch_set", r1[:2], views(2, 2)))
    w.wait(w.submit("submit_batch_set", r1[3:], views(1, 3)))       # a hole at chunk 2
    interleaved = [k for pair in zip(r0, r1) for k in pair]
    ok, _, bools = w.wait(w.submit("submit_batch_exists", interleaved))
    assert bools == [True, True, True, True, True, False, True, True], "per key (row 11)"
    w.close()


def test_get_missing_middle_and_wrong_size(server, prefix):
    w = WrapperStandIn(spec(server.url, prefix))
    keys = [mp_key(c, group=1) for c in range(4)]
    src = views(4, seed=4)
    w.wait(w.submit("submit_batch_set", [keys[0], keys[1], keys[3]], [src[0], src[1], src[3]]))
    dst = views(4)
    ok, err, bools = w.wait(w.submit("submit_batch_get", keys, dst))
    assert not ok and bools == [True, True, False, True] and err
    small = [memoryview(bytearray(OBJ - 1)), memoryview(bytearray(OBJ + 1))]
    ok, err, bools = w.wait(w.submit("submit_batch_get", keys[:2], small))
    assert not ok and bools == [False, False]
    assert bytes(small[0]) == bytes(OBJ - 1), "a too-small view is not written"
    w.close()


def test_salted_keys_do_not_collide(server, prefix):
    w = WrapperStandIn(spec(server.url, prefix))
    plain, salted = mp_key(7), mp_key(7, salt="tenant-a")
    w.wait(w.submit("submit_batch_set", [plain], views(1, 5)))
    _, _, bools = w.wait(w.submit("submit_batch_exists", [plain, salted]))
    assert bools == [True, False]
    w.close()


def test_event_fd_and_drain(server, prefix):
    """Without the demux thread: the fd is readable exactly while
    completions wait, drain clears it, each id comes back once."""
    p = kl.KVPoolL2Plugin(**spec(server.url, prefix)["adapter_params"])
    fd = p.event_fd()
    assert not readable(fd)
    ids = [p.submit_batch_exists([mp_key(c)]) for c in range(5)]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == 5
    deadline = time.monotonic() + 10
    seen = []
    while len(seen) < 5 and time.monotonic() < deadline:
        if readable(fd, 0.5):
            seen += [c[0] for c in p.drain_completions()]
    assert sorted(seen) == sorted(ids)
    assert not readable(fd)
    assert p.drain_completions() == []
    p.close()
    p.close()


def test_delete(server, prefix):
    w = WrapperStandIn(spec(server.url, prefix))
    keys = [mp_key(c, rank=1) for c in range(3)]
    w.wait(w.submit("submit_batch_set", keys, views(3, 6)))
    ok, _, _ = w.wait(w.submit("submit_batch_delete", keys[1:] + [mp_key(50)]))
    assert ok
    _, _, bools = w.wait(w.submit("submit_batch_exists", keys))
    assert bools == [True, False, False]
    w.close()


def test_threads_submit_while_draining(server, prefix):
    w = WrapperStandIn(spec(server.url, prefix))
    ids, errors = [], []

    def store(t):
        try:
            for i in range(20):
                ks = [mp_key(1000 * t + i * 2 + j, rank=t) for j in range(2)]
                ids.append(w.submit("submit_batch_set", ks, views(2, i)))
                ids.append(w.submit("submit_batch_exists", ks))
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=store, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for fid in ids:
        w.wait(fid)
    assert w.unknown == [] and len(set(ids)) == len(ids) == 80
    w.close()


def test_pool_down_then_back(fresh_server, prefix):
    fresh_server.start()
    port = fresh_server.port
    w = WrapperStandIn(spec(fresh_server.url, prefix))
    keys = [mp_key(c) for c in range(3)]
    assert w.wait(w.submit("submit_batch_set", keys, views(3, 7)))[0]
    fresh_server.kill()
    t0 = time.monotonic()
    for method, args in (("submit_batch_exists", (keys,)), ("submit_batch_get", (keys, views(3))),
                         ("submit_batch_set", (keys, views(3, 8))),
                         ("submit_batch_delete", (keys,))):
        fid = w.submit(method, *args)
        assert time.monotonic() - t0 < 1.0, "a submit must return at once"
        ok, err, bools = w.wait(fid)
        assert not ok and (bools is None or not any(bools))
    fresh_server.start(port=port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if w.wait(w.submit("submit_batch_set", keys, views(3, 9)))[0]:
            break
        time.sleep(0.2)
    assert w.wait(w.submit("submit_batch_exists", keys))[2] == [True] * 3
    w.close()


def test_construct_when_down(prefix):
    from conftest import free_port
    p = kl.KVPoolL2Plugin(url="tcp://127.0.0.1:%d" % free_port(), namespace_prefix=prefix)
    fid = p.submit_batch_exists([mp_key(1)])
    deadline = time.monotonic() + 5
    got = []
    while not got and time.monotonic() < deadline:
        if readable(p.event_fd(), 0.2):
            got = p.drain_completions()
    assert got and got[0][0] == fid and got[0][1] is False
    p.close()


# ---- the remote storage plugin (non-MP) -----------------------------------------------

class MemoryObj:
    """Duck-typed LMCache MemoryObj over a torch tensor."""

    def __init__(self, shape, dtype, fmt):
        self.tensor = torch.zeros(shape, dtype=dtype)
        self.byte_array = memoryview(self.tensor.numpy()).cast("B")
        self.shape, self.dtype, self.fmt = shape, dtype, fmt
        self.released = False

    def get_shape(self):
        return self.shape

    def get_dtype(self):
        return self.dtype

    def get_memory_format(self):
        return self.fmt

    def ref_count_down(self):
        self.released = True

    def cut_tokens(self, tokens):
        """What LMCache's reshape_partial_chunk does to a MemoryObj: its first
        bytes, read as the shape with the token dimension (2) cut."""
        shape = list(self.shape)
        shape[2] = tokens
        self.shape = torch.Size(shape)
        self.tensor = self.tensor.reshape(-1)[:self.shape.numel()].view(self.shape)
        n = self.tensor.numel() * self.tensor.element_size()
        self.byte_array = self.byte_array[:n]
        return self


class CpuBackend:
    def __init__(self, fail=False):
        self.fail = fail
        self.allocated = []

    def allocate(self, shape, dtype, fmt=None, eviction=True, busy_loop=True):
        """LocalCPUBackend.allocate(shapes: Size or list[Size], dtypes: dtype
        or list[dtype], fmt): one memory object (one group here)."""
        if self.fail:
            return None
        if isinstance(shape, list):
            shape = shape[0]
        if isinstance(dtype, list):
            dtype = dtype[0]
        m = MemoryObj(shape, dtype, fmt)
        self.allocated.append(m)
        return m


class Key:
    def __init__(self, s):
        self.s = s

    def to_string(self):
        return self.s


LAYERS, HEADS, DIM, CHUNK = 2, 2, 8, 16


def remote(url, prefix, worker=0, world=1, mla=False, fail_alloc=False, loop=None,
           flag=None, **extra):
    """The plugin as LMCache's RemoteBackend makes it; mla: an MLA model
    (LMCacheMetadata.use_mla); flag: remote_enable_mla_worker_id_as0 (None:
    unset, LMCache's default is use_mla)."""
    ec = {"remote_storage_plugin.kvpool.module_path": "kvpool.lmcache",
          "remote_storage_plugin.kvpool.class_name": "KVPoolConnectorAdapter",
          "remote_storage_plugin.kvpool.url": url,
          "remote_storage_plugin.kvpool.namespace_prefix": prefix,
          "remote_storage_plugin.kvpool.timeout_s": 1.0, "save_chunk_meta": False}
    if flag is not None:
        ec["remote_enable_mla_worker_id_as0"] = flag
    ec.update(extra)
    config = SimpleNamespace(chunk_size=CHUNK, extra_config=ec)
    meta = SimpleNamespace(model_name="test-model", world_size=world, worker_id=worker,
                           kv_dtype=torch.float16, use_mla=mla,
                           kv_shape=(LAYERS, 1 if mla else 2, CHUNK, HEADS, DIM))
    adapter = kl.KVPoolConnectorAdapter()
    assert adapter.can_parse("plugin://kvpool") and adapter.can_parse("plugin://kvpool.a")
    assert not adapter.can_parse("plugin://other")
    conn = adapter.create_connector(ConnectorContext("plugin://kvpool", loop, CpuBackend(
        fail_alloc), config, meta, "kvpool"))
    assert isinstance(conn, RemoteConnector)
    return conn


def chunk_obj(tokens, value, mla=False):
    m = MemoryObj(((1 if mla else 2), LAYERS, tokens, HEADS * DIM), torch.float16, "KV_2LTD")
    m.tensor.fill_(value)
    return m


def test_remote_roundtrip_short_chunk_and_contains(server, prefix):
    async def run():
        c = remote(server.url, prefix, loop=asyncio.get_running_loop())
        keys = [Key("test-model@1@0@%x@half" % i) for i in range(3)]
        assert await c.exists(keys[0]) is False
        await c.batched_put(keys[:2], [chunk_obj(CHUNK, 1.0), chunk_obj(CHUNK, 2.0)])
        await c.put(keys[2], chunk_obj(5, 3.0))                      # a short last chunk
        assert c.exists_sync(keys[1]) is True
        assert c.batched_contains(keys) == 3
        assert c.batched_contains([keys[0], Key("nope"), keys[2]]) == 1
        assert await c.batched_async_contains("lookup", keys, True) == 3
        got = await c.get(keys[1])
        assert got is not None and torch.equal(got.tensor, chunk_obj(CHUNK, 2.0).tensor)
        short = await c.get(keys[2])
        assert short is not None and short.get_shape()[2] == 5
        assert torch.equal(short.tensor, chunk_obj(5, 3.0).tensor)
        assert await c.get(Key("missing")) is None
        assert await c.ping() == 0
        assert await c.list() == []
        assert c.remove_sync(keys[2]) is True
        await c.close()
        await c.close()
    asyncio.run(run())


def test_remote_failed_allocation_and_mla(server, prefix):
    async def run():
        loop = asyncio.get_running_loop()
        w0 = remote(server.url, prefix, worker=0, world=2, mla=True, loop=loop)
        w1 = remote(server.url, prefix, worker=1, world=2, mla=True, loop=loop)
        assert w0.namespace == w1.namespace
        k = Key("test-model@2@0@abc@half")
        await w1.put(k, chunk_obj(CHUNK, 4.0, mla=True))
        assert w1.exists_sync(k) is False, "only worker 0 writes on MLA"
        await w0.put(k, chunk_obj(CHUNK, 4.0, mla=True))
        got = await w1.get(k)
        assert got is not None and float(got.tensor.flatten()[0]) == 4.0
        nomem = remote(server.url, prefix, worker=0, world=2, mla=True, fail_alloc=True,
                       loop=loop)
        assert await nomem.get(k) is None
        for c in (w0, w1, nomem):
            await c.close()
    asyncio.run(run())


def test_remote_pool_down_does_not_block_the_loop(prefix):
    from conftest import free_port

    async def run():
        c = remote("tcp://127.0.0.1:%d" % free_port(), prefix, loop=asyncio.get_running_loop())
        t0 = time.monotonic()
        k = Key("k")
        assert await c.exists(k) is False
        assert await c.get(k) is None
        await c.put(k, chunk_obj(CHUNK, 1.0))
        assert c.batched_contains([k]) == 0
        assert await c.ping() != 0
        assert time.monotonic() - t0 < 3 * 1.0 + 1
        await c.close()
    asyncio.run(run())


# ---- rows 8-11, 13, 16 ---------------------------------------------------------------------

class RealishCpuBackend(CpuBackend):
    """LocalCPUBackend.allocate(shapes: torch.Size or list[torch.Size], ...):
    a plain tuple is read as a list of shapes (as LMCache's does)."""

    def allocate(self, shapes, dtypes, fmt=None, eviction=True, busy_loop=True):
        if not isinstance(shapes, torch.Size):
            shapes = list(shapes)
            assert all(isinstance(s, torch.Size) for s in shapes), "a list of shapes"
            shapes = shapes[0]
        return super().allocate(shapes, dtypes, fmt)


def test_remote_get_with_lmcaches_allocate(server, prefix):
    """Row 8: non-MP get through LocalCPUBackend's allocate signature."""
    async def run():
        loop = asyncio.get_running_loop()
        c = remote(server.url, prefix, loop=loop)
        c.local_cpu_backend = RealishCpuBackend()
        k = Key("test-model@1@0@77@half")
        await c.put(k, chunk_obj(CHUNK, 5.0))
        got = await c.get(k)
        assert got is not None and torch.equal(got.tensor, chunk_obj(CHUNK, 5.0).tensor)
        await c.put(Key("short"), chunk_obj(3, 6.0))
        short = await c.get(Key("short"))
        assert short is not None and tuple(short.get_shape())[2] == 3
        await c.close()
    asyncio.run(run())


def test_remote_connector_base_init_runs(server, prefix):
    """Row 10: RemoteConnector.__init__(config, metadata) runs (chunk
    metadata for reshape_partial_chunk)."""
    async def run():
        c = remote(server.url, prefix, loop=asyncio.get_running_loop())
        if not hasattr(RemoteConnector.__init__, "__code__") or \
                RemoteConnector.__init__ is object.__init__:
            pytest.skip("this RemoteConnector has no __init__")
        assert c.full_chunk_size_bytes == LAYERS * 2 * CHUNK * HEADS * DIM * 2
        await c.close()
    asyncio.run(run())


def test_delete_keeps_lmcaches_accounting_exact(server, prefix, raw):
    """Row 9: a delete removes exactly the keys LMCache names, so what it
    believes stored equals what the pool holds."""
    w = WrapperStandIn(spec(server.url, prefix))
    keys = [mp_key(c, rank=0) for c in range(4)]
    assert w.wait(w.submit("submit_batch_set", keys, views(4, 9)))[0]
    ok, _, _ = w.wait(w.submit("submit_batch_delete", keys[:1]))
    assert ok
    ns = w.obj.namespace
    assert raw(ns).exists_many([kl.l2_plugin.string_key(k) for k in keys]) == \
        [False, True, True, True]
    _, _, bools = w.wait(w.submit("submit_batch_exists", keys))
    assert bools == [False, True, True, True]
    w.close()


def test_exists_per_key_keeps_gaps(server, prefix):
    """Row 11: per-key answers, so gap-keeping trim policies (SEGMENTED_PREFIX,
    SPARSE) see every stored key."""
    w = WrapperStandIn(spec(server.url, prefix))
    keys = [mp_key(c, rank=1) for c in range(5)]
    w.wait(w.submit("submit_batch_set", [keys[0], keys[1], keys[3]], views(3, 2)))
    _, _, bools = w.wait(w.submit("submit_batch_exists", keys))
    assert bools == [True, True, False, True, False]
    dst = views(5)
    ok, _, bools = w.wait(w.submit("submit_batch_get", keys, dst))
    assert bools == [True, True, False, True, False]
    w.close()


def test_submit_after_close_touches_no_fd(server, prefix):
    """Row 13: a submit after close() answers a future id and writes nothing
    to the old event fd number (which another file may reuse)."""
    p = kl.KVPoolL2Plugin(**spec(server.url, prefix)["adapter_params"])
    old = p.event_fd()
    p.close()
    reuse = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        for method, args in (("submit_batch_exists", ([mp_key(1)],)),
                             ("submit_batch_get", ([mp_key(1)], views(1))),
                             ("submit_batch_set", ([mp_key(1)], views(1))),
                             ("submit_batch_delete", ([mp_key(1)],))):
            assert isinstance(getattr(p, method)(*args), int)
        assert reuse != old or not readable(reuse), "the closed plugin wrote to a reused fd"
        assert not readable(reuse)
        assert p.drain_completions() == []
    finally:
        os.close(reuse)
    p.close()


def test_bad_arguments_never_raise(server, prefix):
    """Row 16: None or mismatched arguments complete with ok=False."""
    w = WrapperStandIn(spec(server.url, prefix))
    for method, args in (("submit_batch_get", (None, views(1))),
                         ("submit_batch_set", (None, None)),
                         ("submit_batch_exists", (None,)),
                         ("submit_batch_delete", (None,)),
                         ("submit_batch_get", ([mp_key(1)], None)),
                         ("submit_batch_set", ([mp_key(1), 5], views(2)))):
        ok, err, bools = w.wait(w.submit(method, *args))
        assert not ok and err
    w.close()


# ---- issue 24, fresh-clone findings (items 6, 8, 10, 12, 14, 16, 17) ------------------------

@pytest.mark.parametrize("mla,flag,shared", [
    (False, True, False),        # the flag on a model that is not MLA: LMCache ignores it
    (True, False, False),        # an MLA model with the flag off: per-worker keys
    (True, None, True),          # an MLA model, flag unset: LMCache's default is on
    (True, "false", True)])      # LMCache takes the string "false" as true
def test_remote_mla_mode_is_lmcaches(server, prefix, mla, flag, shared, caplog):
    """Finding 6: worker 0's namespace is shared exactly when LMCache's
    RemoteBackend rewrites keys to worker 0 (flag and use_mla and world
    size > 1, the flag read as LMCache reads it); otherwise each worker
    writes and reads its own. The adapter read bool(flag) or use_mla, so a
    non-MLA model with the flag made worker 1 read-only on worker 0's
    namespace (never a hit)."""
    import logging

    async def run():
        loop = asyncio.get_running_loop()
        with caplog.at_level(logging.WARNING, "kvpool.lmcache"):
            w0 = remote(server.url, prefix, worker=0, world=2, mla=mla, flag=flag, loop=loop)
            w1 = remote(server.url, prefix, worker=1, world=2, mla=mla, flag=flag, loop=loop)
        assert (w0.namespace == w1.namespace) == shared
        assert w1._writes() == (not shared)
        if isinstance(flag, str):
            assert any("LMCache reads" in r.getMessage() for r in caplog.records)
        k1 = Key("test-model@%d@1@abc@half" % (0 if shared else 1))
        await w1.put(k1, chunk_obj(CHUNK, 5.0, mla=mla))
        if not shared:
            got = await w1.get(k1)
            assert got is not None and float(got.tensor.flatten()[0]) == 5.0
        else:
            assert w1.exists_sync(k1) is False
        for c in (w0, w1):
            await c.close()
    asyncio.run(run())


@pytest.mark.parametrize("key,value,words", [
    ("namespace", ["a"], "namespace"), ("namespace", "", "empty"),
    ("namespace_prefix", {"a": 1}, "namespace_prefix"), ("timeout_s", "0", "timeout_s"),
    ("namespace_prefx", "x", "namespace_prefix"), ("token", 42, "quote")])
def test_remote_configuration_error_is_loud_and_irrecoverable(server, prefix, caplog, key,
                                                               value, words):
    """Findings 8 and 14: a setting that cannot work raises an error
    naming it (a list as namespace raised a bare TypeError; a misspelt key
    was ignored), logged once as an ERROR, of a class that is also LMCache's
    IrrecoverableException when LMCache is there (its RemoteBackend swallows
    any other exception and runs with no connection for ever)."""
    import logging
    with caplog.at_level(logging.ERROR, "kvpool.lmcache"):
        with pytest.raises(ValueError) as e:
            remote(server.url, prefix, **{"remote_storage_plugin.kvpool." + key: value})
    assert isinstance(e.value, kl.remote.RemoteConfigError) and words in str(e.value)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "CONFIGURATION ERROR" in errors[0].getMessage()
    if kl.remote._Irrecoverable is not None:
        assert isinstance(e.value, kl.remote._Irrecoverable)


def test_remote_batched_put_keys_are_roots(server, prefix):
    """Finding 10: batched_put chained its keys, so remove_sync(keys[0])
    removed the whole batch while LMCache believed the rest stored."""
    async def run():
        c = remote(server.url, prefix, loop=asyncio.get_running_loop())
        keys = [Key("test-model@1@0@%x@half" % (100 + i)) for i in range(4)]
        await c.batched_put(keys, [chunk_obj(CHUNK, float(i)) for i in range(4)])
        assert c.batched_contains(keys) == 4
        assert c.remove_sync(keys[0]) is True
        assert [c.exists_sync(k) for k in keys] == [False, True, True, True]
        await c.close()
    asyncio.run(run())


def test_remote_chunk_larger_than_max_block_bytes(fresh_server, prefix):
    """Finding 14: a chunk the server can never store is a configuration
    error at start (LMCache then runs without this backend, loudly)."""
    fresh_server.extra += ["--max-block-bytes", "1KiB"]
    fresh_server.start()
    with pytest.raises(ValueError) as e:
        remote(fresh_server.url, prefix)
    assert "max_block_bytes" in str(e.value)


def _fds_threads():
    import gc
    gc.collect()
    time.sleep(0.3)
    gc.collect()
    return len(os.listdir("/proc/self/fd")), threading.active_count()


def test_plugin_dropped_without_close_releases_everything(server, prefix):
    """Finding 12: a plugin LMCache drops without close() (its own
    error paths) leaked its connections, event fd and threads."""
    params = spec(server.url, prefix)["adapter_params"]
    warm = kl.KVPoolL2Plugin(**params)           # first-use allocations, not leaks
    warm.close()
    fds0, threads0 = _fds_threads()
    for i in range(20):
        p = kl.KVPoolL2Plugin(**params)
        fid = p.submit_batch_exists([mp_key(i)])
        deadline = time.monotonic() + 10
        while not p.drain_completions() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fid
        del p
    fds1, threads1 = _fds_threads()
    assert fds1 <= fds0 + 2 and threads1 <= threads0 + 1, (fds0, fds1, threads0, threads1)


def test_plugin_settings_checked(server, prefix):
    """Finding 14: a misspelt adapter_params key is refused, an unknown
    one logged; an empty namespace is refused."""
    for params, words in (({"namespace_prefx": "x"}, "namespace_prefix"),
                          ({"namespace": ""}, "empty"), ({"timeout_s": 1e-9}, "timeout_s")):
        with pytest.raises(ValueError) as e:
            kl.KVPoolL2Plugin(**dict(spec(server.url, prefix)["adapter_params"], **params))
        assert words in str(e.value)


def test_get_into_a_view_of_another_size_writes_nothing(server, prefix):
    """Finding 17: a view bigger than the block was partly overwritten
    before the get reported False. LMCache looks keys up before it loads
    them; the lookup learns each block's size (a GET with no room sends
    none of its bytes), and the get refuses a view of another size before
    anything is received."""
    w = WrapperStandIn(spec(server.url, prefix))
    keys = [mp_key(c, group=3) for c in range(3)]
    assert w.wait(w.submit("submit_batch_set", keys, views(3, 11)))[0]
    _, _, bools = w.wait(w.submit("submit_batch_exists", keys))
    assert bools == [True] * 3
    big = memoryview(bytearray(b"\xee" * (OBJ + 512)))
    small = memoryview(bytearray(b"\xee" * (OBJ - 512)))
    good = memoryview(bytearray(OBJ))
    ok, err, bools = w.wait(w.submit("submit_batch_get", keys, [big, good, small]))
    assert not ok and bools == [False, True, False]
    assert bytes(big) == b"\xee" * (OBJ + 512), "the bigger view was written"
    assert bytes(small) == b"\xee" * (OBJ - 512)
    w.close()


def test_pool_eviction_and_lmcaches_accounting(server, prefix, raw):
    """Finding 16: when kvpool evicts keys
    LMCache stored, its lookups miss them at once, and a delete LMCache
    sends for them later (its own L2 eviction) reports them deleted, so
    its usage total comes back to what the pool holds."""
    w = WrapperStandIn(spec(server.url, prefix))
    keys = [mp_key(c, group=4) for c in range(8)]
    assert w.wait(w.submit("submit_batch_set", keys, views(8, 12)))[0]
    # what kvpool's eviction does to them (as seen by the plugin)
    assert raw(w.obj.namespace).delete_many([kl.l2_plugin.string_key(k) for k in keys[:5]],
                                            statuses=True) == [0] * 5
    _, _, bools = w.wait(w.submit("submit_batch_exists", keys))
    assert bools == [False] * 5 + [True] * 3
    ok, _, bools = w.wait(w.submit("submit_batch_delete", keys[:5]))
    assert ok and bools == [True] * 5
    w.close()


# ---- issue 29: a request's retention, and settings checked at start -------------------

class ConfigKey(Key):
    """A key with LMCache's request_configs, as CacheEngineKey carries the
    request's "lmcache."-prefixed kv_transfer_params (STAND-IN written from
    LMCache's contract: CacheEngineKey.request_configs)."""

    def __init__(self, s, request_configs):
        super().__init__(s)
        self.request_configs = request_configs


def test_remote_request_retention(server, prefix, raw):
    """kv_transfer_params {"lmcache.kvpool.retain_ms": MS} reach the keys:
    those chunks are stored retained; a request without it, or with a
    value that is no retention, stores ordinary chunks."""
    async def run():
        c = remote(server.url, prefix, loop=asyncio.get_running_loop())
        kept = [ConfigKey("test-model@1@0@r%x@half" % i, {"lmcache.kvpool.retain_ms": 30000})
                for i in range(3)]
        plain = [Key("test-model@1@0@p%x@half" % i) for i in range(2)]
        bad = ConfigKey("test-model@1@0@bad@half", {"lmcache.kvpool.retain_ms": "long"})
        await c.batched_put(kept, [chunk_obj(CHUNK, 1.0)] * 3)
        await c.batched_put(plain, [chunk_obj(CHUNK, 2.0)] * 2)
        await c.put(bad, chunk_obj(CHUNK, 3.0))
        ns = raw(c.namespace).stats(c.namespace)["namespaces"][c.namespace]
        assert ns["blocks"] == 6 and ns["retained_blocks"] == 3
        await c.close()
    asyncio.run(run())


def test_remote_policy_settings_checked(server, prefix):
    from kvpool._adapters.config import ConfigError
    for extra, what in (({"remote_storage_plugin.kvpool.retain_first_blocks": 4},
                         "retain_first_blocks"),
                        ({"remote_storage_plugin.kvpool.prefill_tokens_per_s": -3},
                         "prefill_tokens_per_s")):
        config = SimpleNamespace(chunk_size=CHUNK, extra_config=dict({
            "remote_storage_plugin.kvpool.url": server.url,
            "remote_storage_plugin.kvpool.namespace_prefix": prefix}, **extra))
        meta = SimpleNamespace(model_name="test-model", world_size=1, worker_id=0,
                               kv_dtype=torch.float16, kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM))
        with pytest.raises(ConfigError, match=what):
            kl.KVPoolConnectorAdapter().create_connector(
                ConnectorContext("plugin://kvpool", None, CpuBackend(), config, meta, "kvpool"))
