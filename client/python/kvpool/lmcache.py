"""kvpool for LMCache: the multiprocess-mode native L2 plugin
(KVPoolL2Plugin) and the non-MP remote storage plugin
(KVPoolConnectorAdapter / KVPoolRemoteConnector).

Multiprocess mode, on the LMCache server daemon's command line:

    --l2-adapter '{"type": "native_plugin", "module_path": "kvpool.lmcache",
        "class_name": "KVPoolL2Plugin", "max_capacity_gb": 0,
        "adapter_params": {"url": "tcp://pool:7470", "model": "llama3-8b",
                           "kv_dtype": "bf16", "chunk_tokens": 256}}'

Non-MP mode, in the LMCache configuration:

    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.lmcache
      remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter
      remote_storage_plugin.kvpool.url: tcp://pool:7470
      save_chunk_meta: false

Keys: LMCache's key strings map to 32 bytes by SHA-256 of their UTF-8, so
ranks, object groups and salts stay apart in one namespace. Neither
plugin imports LMCache at import time; the remote plugin subclasses
LMCache's ConnectorAdapter/RemoteConnector when LMCache is importable.
See docs/engines.md for versions and settings.
"""

import asyncio
import collections
import concurrent.futures
import errno as _errno
import logging
import os
import threading

from . import _engine
from ._engine import Link, RateLimitedLog, make_namespace, string_key
from ._engine_async import Completion, make_async_link

log = logging.getLogger("kvpool.lmcache")

INTERFACE_MP = "LMCache native_plugin L2 adapter (native_plugin_l2_adapter.py @68c638a6)"
INTERFACE_REMOTE = "LMCache RemoteConnector (base_connector.py @01712fbd)"
DEFAULT_URL = "tcp://127.0.0.1:7470"
DEFAULT_LEASE_MS = 30000


def _row_of(key):
    """The (kv_rank, object group, salt) row of an MP key string
    "<model>@<kv_rank:08x>@<group:x>@<chunk hash>[@<salt>]", or the key
    itself when it does not parse (a row of its own)."""
    parts = key.split("@")
    if len(parts) >= 4:
        return (parts[0], parts[1], parts[2], "@".join(parts[4:]))
    return (key,)


# ---- multiprocess mode: the native L2 plugin -----------------------------------------

class KVPoolL2Plugin:
    """LMCache's native_plugin L2 adapter over a kvpool server.

    KVPoolL2Plugin(**adapter_params); params (all optional):
        url, token, timeout_s (2.0), lease_ms (30000),
        namespace, or model / kv_dtype / chunk_tokens / namespace_prefix
        ("lmcache-mp") from which the namespace
        <prefix>:<model>:<kv_dtype>:c<chunk_tokens> is made.

    submit_batch_{get,set,exists,delete} return a future id at once (also
    when the pool is down) and never raise; drain_completions() returns
    [(future_id, ok, error_str, result_bools)] and empties event_fd().
    Exists gives, per (kv_rank, group, salt) row of the keys, the leading
    run held by the pool (pinned by a MATCH lease until the get); get is
    True per key whose view was filled exactly (the block's size is the
    view's size). Threads: submit_* may be called from several threads
    while another drains.
    """

    def __init__(self, **params):
        self.params = dict(params)
        self.url = str(params.get("url") or DEFAULT_URL)
        self.lease_ms = int(params.get("lease_ms", DEFAULT_LEASE_MS))
        ns = params.get("namespace")
        if not ns:
            ns = make_namespace(params.get("namespace_prefix") or "lmcache-mp",
                                params.get("model") or "unknown-model",
                                params.get("kv_dtype") or "unknown-dtype",
                                "c%s" % params.get("chunk_tokens", 256))
        self.namespace = ns
        self.warn = RateLimitedLog(log)
        timeout = float(params.get("timeout_s", 2.0))
        token = params.get("token")
        self._lock = threading.Lock()
        self._ids = 0
        self._ready = collections.deque()
        self._parts = {}          # future id -> [op, parts left, result bools, ok, err]
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._closed = False
        self._read_link = Link(self.url, ns, token=token, timeout_s=timeout,
                               name="lmcache-mp read " + ns, warn=self.warn)
        self._write_link = Link(self.url, ns, token=token, timeout_s=timeout,
                                name="lmcache-mp write " + ns, warn=self.warn)
        self._read = make_async_link(self._read_link, on_complete=self._on_part)
        self._write = make_async_link(self._write_link, on_complete=self._on_part)

    # ---- completions -----------------------------------------------------------------

    def event_fd(self):
        """An fd readable while completions wait for drain_completions()."""
        return self._efd

    def _new_future(self, op, n, parts):
        with self._lock:
            self._ids += 1
            fid = self._ids
            self._parts[fid] = [op, parts, [False] * n, True, ""]
        return fid

    def _finish(self, fid):
        """Move future fid to the ready list; the caller holds _lock."""
        op, _, bools, ok, err = self._parts.pop(fid)
        self._ready.append((fid, ok, err, bools))
        os.eventfd_write(self._efd, 1)

    def _fail_now(self, op, n, err):
        fid = self._new_future(op, n, 1)
        with self._lock:
            st = self._parts[fid]
            st[3], st[4] = False, err
            self._finish(fid)
        return fid

    def _on_part(self, c):
        """An AsyncLink completion: c.tag = (future id, positions, what)."""
        fid, positions, what = c.tag[:3]
        with self._lock:
            st = self._parts.get(fid)
            if st is None:
                return
            try:
                self._merge(st, c, positions, what)
            except Exception as e:        # never leave a future without completion
                st[3], st[4] = False, repr(e)
            st[1] -= 1
            if st[1] == 0:
                self._finish(fid)

    @staticmethod
    def _merge(st, c, positions, what):
        """Fold one part's completion into future state st; caller holds _lock."""
        bools = st[2]
        if what == "exists":
            for j, pos in enumerate(positions):
                bools[pos] = j < c.matched
            if c.status:
                st[3], st[4] = False, _engine.strerror_of(c.status)
        elif what == "get":
            sizes = c.tag[3]
            for j, pos in enumerate(positions):
                bools[pos] = (c.statuses[j] == 0 and j < len(c.lengths)
                              and c.lengths[j] == sizes[j])
            if not all(bools[p] for p in positions):
                st[3] = False
                st[4] = st[4] or _engine.strerror_of(
                    next((s for s in c.statuses if s), -_errno.EMSGSIZE))
        else:   # set, delete
            for j, pos in enumerate(positions):
                bools[pos] = c.statuses[j] == 0 or (what == "delete" and
                                                    c.statuses[j] == _engine.MISS)
            if not all(bools[p] for p in positions):
                st[3] = False
                st[4] = st[4] or _engine.strerror_of(next(s for s in c.statuses if s))

    def drain_completions(self):
        """Every finished future: [(future_id, ok, error_str, result_bools)]."""
        with self._lock:
            out = list(self._ready)
            self._ready.clear()
            try:
                os.eventfd_read(self._efd)
            except (BlockingIOError, OSError):
                pass
        return out

    # ---- submissions -------------------------------------------------------------------

    def _keys(self, keys):
        return [string_key(k) for k in keys]

    def submit_batch_exists(self, keys):
        """Future id; its bools: per row of the keys, the leading run present."""
        keys = list(keys)
        try:
            if self._closed:
                return self._fail_now("exists", len(keys), "closed")
            rows = collections.OrderedDict()
            for i, k in enumerate(keys):
                rows.setdefault(_row_of(k), []).append(i)
            ks = self._keys(keys)
            fid = self._new_future("exists", len(keys), len(rows) or 1)
            if not rows:
                with self._lock:
                    self._finish(fid)
                return fid
            for positions in rows.values():
                self._submit(self._read, "submit_match", fid, positions, "exists",
                             [ks[i] for i in positions], self.lease_ms)
            return fid
        except Exception as e:
            self.warn.warning("exists", "kvpool.lmcache: submit_batch_exists: %r", e)
            return self._fail_now("exists", len(keys), repr(e))

    def _submit(self, alink, method, fid, positions, what, *args, sizes=None):
        """One part of future fid; a refused submission fails that part."""
        tag = (fid, positions, what) if sizes is None else (fid, positions, what, sizes)
        try:
            getattr(alink, method)(*args, tag=tag)
        except Exception as e:
            n = len(positions)
            self._on_part(Completion(0, tag, what, -_errno.EAGAIN, [-_errno.EAGAIN] * n,
                                     [0] * n, 0))
            self.warn.warning("submit", "kvpool.lmcache: %s refused: %r", what, e)

    def submit_batch_get(self, keys, views):
        """Future id; its bools: True where views[i] was filled exactly."""
        keys = list(keys)
        try:
            views = list(views)
            if self._closed or len(views) != len(keys):
                return self._fail_now("get", len(keys), "closed" if self._closed else
                                      "%d keys but %d views" % (len(keys), len(views)))
            if not keys:
                return self._empty("get")
            sizes = [memoryview(v).nbytes for v in views]
            fid = self._new_future("get", len(keys), 1)
            self._submit(self._read, "submit_get_into_many", fid, list(range(len(keys))), "get",
                         self._keys(keys), views, sizes=sizes)
            return fid
        except Exception as e:
            self.warn.warning("get", "kvpool.lmcache: submit_batch_get: %r", e)
            return self._fail_now("get", len(keys), repr(e))

    def _empty(self, op):
        fid = self._new_future(op, 0, 1)
        with self._lock:
            self._finish(fid)
        return fid

    def submit_batch_set(self, keys, views):
        """Future id; its bools: True where the object is stored (or
        already was). The parent of a key is the previous key of its row
        in the batch."""
        keys = list(keys)
        try:
            views = list(views)
            if self._closed or len(views) != len(keys):
                return self._fail_now("set", len(keys), "closed" if self._closed else
                                      "%d keys but %d views" % (len(keys), len(views)))
            if not keys:
                return self._empty("set")
            ks = self._keys(keys)
            last = {}
            parents = []
            for i, k in enumerate(keys):
                row = _row_of(k)
                parents.append(last.get(row))
                last[row] = ks[i]
            fid = self._new_future("set", len(keys), 1)
            self._submit(self._write, "submit_put_many", fid, list(range(len(keys))), "set",
                         ks, views, parents)
            return fid
        except Exception as e:
            self.warn.warning("set", "kvpool.lmcache: submit_batch_set: %r", e)
            return self._fail_now("set", len(keys), repr(e))

    def submit_batch_delete(self, keys):
        """Future id; deleting a key the pool does not hold is a success."""
        keys = list(keys)
        try:
            if self._closed:
                return self._fail_now("delete", len(keys), "closed")
            if not keys:
                return self._empty("delete")
            fid = self._new_future("delete", len(keys), 1)
            self._submit(self._write, "submit_delete_many", fid, list(range(len(keys))),
                         "delete", self._keys(keys))
            return fid
        except Exception as e:
            self.warn.warning("delete", "kvpool.lmcache: submit_batch_delete: %r", e)
            return self._fail_now("delete", len(keys), repr(e))

    def close(self):
        """Finish what is queued, close the connections and the event fd.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        for a in (self._read, self._write):
            a.close()
        for link in (self._read_link, self._write_link):
            link.close()
        try:
            os.close(self._efd)
        except OSError:
            pass


# ---- non-MP mode: the remote storage plugin --------------------------------------------

def _lmcache_base(module, name):
    try:
        mod = __import__(module, fromlist=[name])
        return getattr(mod, name)
    except Exception as e:
        log.debug("kvpool.lmcache: %s.%s not importable (%s): using the fallback", module,
                  name, e)
        return None


_RealRemoteConnector = _lmcache_base("lmcache.v1.storage_backend.connector.base_connector",
                                     "RemoteConnector")
_RealConnectorAdapter = _lmcache_base("lmcache.v1.storage_backend.connector",
                                      "ConnectorAdapter")
USING_REAL_BASE = _RealRemoteConnector is not None and _RealConnectorAdapter is not None


class _FallbackConnectorAdapter:
    """LMCache's ConnectorAdapter as the adapter relies on it; used only
    when LMCache is not installed. Written from the contract."""

    def __init__(self, schema):
        self.schema = schema

    def can_parse(self, url):
        return url.startswith(self.schema)


RemoteConnector = _RealRemoteConnector or object
ConnectorAdapter = _RealConnectorAdapter or _FallbackConnectorAdapter


def _cfg_get(config, plugin_name, key, default=None):
    """remote_storage_plugin.<plugin>.<key> or kvpool.<key> from the LMCache
    config's extra_config."""
    extra = getattr(config, "extra_config", None) or {}
    for k in ("remote_storage_plugin.%s.%s" % (plugin_name, key),
              "remote_storage_plugin.kvpool.%s" % key, "kvpool.%s" % key):
        if k in extra:
            return extra[k]
    return default


class KVPoolRemoteConnector(RemoteConnector):
    """LMCache RemoteConnector over kvpool (see the module doc).

    Every coroutine runs its kvpool call on a thread of its own pool
    (never on LMCache's event loop) and gives up after timeout_s * 2 + 1
    s: exists answers False, get None, put nothing. With MLA
    (remote_enable_mla_worker_id_as0) only worker 0 writes and every
    worker reads worker 0's namespace.
    """

    def __init__(self, url, loop, local_cpu_backend, config, metadata, plugin_name="kvpool"):
        # RemoteConnector defines no __init__ to call.
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.metadata = metadata
        self.plugin_name = plugin_name
        self.warn = RateLimitedLog(log)
        pool_url = _cfg_get(config, plugin_name, "url")
        if not pool_url and url and str(url).startswith("kvpool://"):
            pool_url = "tcp://" + str(url)[len("kvpool://"):]
        self.url = str(pool_url or DEFAULT_URL)
        self.timeout_s = float(_cfg_get(config, plugin_name, "timeout_s", 2.0))
        self.lease_ms = int(_cfg_get(config, plugin_name, "lease_ms", DEFAULT_LEASE_MS))
        extra = getattr(config, "extra_config", None) or {}
        self.mla = bool(extra.get("remote_enable_mla_worker_id_as0", False)) or bool(
            getattr(metadata, "use_mla", False))
        self.worker_id = int(getattr(metadata, "worker_id", 0) or 0)
        self.world_size = int(getattr(metadata, "world_size", 1) or 1)
        self.kv_shape = tuple(getattr(metadata, "kv_shape", ()) or ())
        self.dtype = getattr(metadata, "kv_dtype", None)
        chunk = int(getattr(config, "chunk_size", 0) or (self.kv_shape[2] if len(self.kv_shape)
                                                         > 2 else 256))
        self.chunk_tokens = chunk
        ns = _cfg_get(config, plugin_name, "namespace") or make_namespace(
            _cfg_get(config, plugin_name, "namespace_prefix", "lmcache"),
            getattr(metadata, "model_name", None) or "unknown-model",
            str(self.dtype).replace("torch.", ""), "ws%d" % self.world_size,
            "w%d" % (0 if self.mla else self.worker_id), "c%d" % chunk)
        self.namespace = ns
        self._link = Link(self.url, ns, token=_cfg_get(config, plugin_name, "token"),
                          timeout_s=self.timeout_s, name="lmcache " + ns, warn=self.warn)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                           thread_name_prefix="kvpool-lmc")
        self._closed = False

    # ---- helpers ----------------------------------------------------------------------

    @staticmethod
    def key_bytes(key):
        """SHA-256 of the key's to_string() (or of str(key))."""
        s = key.to_string() if hasattr(key, "to_string") else str(key)
        return string_key(s)

    async def _run(self, fn, default):
        """fn() on our thread pool, within the time budget; default if it
        fails or takes too long."""
        try:
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(self._pool, fn)
            return await asyncio.wait_for(fut, self.timeout_s * 2 + 1)
        except Exception as e:
            self.warn.warning("run", "kvpool.lmcache: remote call failed: %r", e)
            return default

    def _shape_for(self, nbytes):
        """(shape, tokens) of a memory object of nbytes: the full chunk, or
        a short last chunk recognised by its byte count; None if nbytes
        is not a whole number of tokens."""
        if len(self.kv_shape) != 5:
            return None
        layers, kv, tokens, heads, dim = self.kv_shape
        per_token = layers * kv * heads * dim * _itemsize(self.dtype)
        if per_token <= 0 or nbytes % per_token:
            return None
        t = nbytes // per_token
        if t < 1 or t > tokens:
            return None
        return (kv, layers, t, heads * dim), t

    def _allocate(self, nbytes):
        got = self._shape_for(nbytes)
        if got is None:
            return None
        shape, _ = got
        fmt = _memory_format(self.mla)
        try:
            return self.local_cpu_backend.allocate(shape, self.dtype, fmt)
        except Exception as e:
            self.warn.warning("alloc", "kvpool.lmcache: allocate %s: %r", shape, e)
            return None

    @staticmethod
    def _release(obj):
        for m in ("ref_count_down", "unpin"):
            fn = getattr(obj, m, None)
            if fn is not None:
                try:
                    fn()
                except Exception:
                    pass
                return

    def _get_sync(self, key):
        k = self.key_bytes(key)
        full = self._shape_for_full()
        obj = self._allocate(full) if full else None
        if obj is None:
            return None
        got = self._link.call("get", lambda c: c.get_into_many([k], [obj.byte_array]),
                              [_engine.DOWN])[0]
        if got == full:
            return obj
        if 0 < got < full and self._shape_for(got) is not None:
            # a short last chunk: receive it again into an object of its size
            self._release(obj)
            obj = self._allocate(got)
            if obj is None:
                return None
            again = self._link.call("get", lambda c: c.get_into_many([k], [obj.byte_array]),
                                    [_engine.DOWN])[0]
            if again == got:
                return obj
        self._release(obj)
        return None

    def _shape_for_full(self):
        if len(self.kv_shape) != 5:
            return 0
        layers, kv, tokens, heads, dim = self.kv_shape
        return layers * kv * tokens * heads * dim * _itemsize(self.dtype)

    def _writes(self):
        return not (self.mla and self.worker_id != 0)

    # ---- RemoteConnector ------------------------------------------------------------------

    async def exists(self, key):
        return await self._run(lambda: self.exists_sync(key), False)

    def exists_sync(self, key):
        try:
            k = self.key_bytes(key)
            return bool(self._link.call("exists", lambda c: c.exists_many([k]), [False])[0])
        except Exception as e:
            self.warn.warning("exists", "kvpool.lmcache: exists: %r", e)
            return False

    async def get(self, key):
        return await self._run(lambda: self._get_sync(key), None)

    async def put(self, key, memory_obj):
        if not self._writes():
            return None
        k = self.key_bytes(key)
        await self._run(lambda: self._link.call(
            "put", lambda c: c.put_many([k], [memory_obj.byte_array]), None), None)
        return None

    async def list(self):
        return []           # kvpool does not list keys

    async def close(self):
        self.close_sync()

    def close_sync(self):
        if self._closed:
            return
        self._closed = True
        self._link.close()
        self._pool.shutdown(wait=False)

    def support_ping(self):
        return True

    async def ping(self):
        got = await self._run(lambda: self._link.call("ping", lambda c: c.ping(), None), None)
        return 0 if got is not None else -_errno.ENOTCONN

    def support_batched_put(self):
        return True

    async def batched_put(self, keys, memory_objs):
        if not self._writes():
            return None
        ks = [self.key_bytes(k) for k in keys]
        bufs = [m.byte_array for m in memory_objs]
        await self._run(lambda: self._link.call("batched_put", lambda c: _engine.put_rerooting(
            c, ks, bufs, [None] + ks[:-1]), None), None)
        return None

    def support_batched_get(self):
        return True

    async def batched_get(self, keys):
        return [await self.get(k) for k in keys]

    def support_batched_contains(self):
        return True

    def batched_contains(self, keys):
        """The leading count of keys held (an int), pinned by a lease."""
        try:
            ks = [self.key_bytes(k) for k in keys]
            if not ks:
                return 0
            n = self._link.call("batched_contains", lambda c: c.match(ks, self.lease_ms), 0)
            return n if isinstance(n, int) and 0 <= n <= len(ks) else 0
        except Exception as e:
            self.warn.warning("contains", "kvpool.lmcache: batched_contains: %r", e)
            return 0

    def support_batched_async_contains(self):
        return True

    async def batched_async_contains(self, lookup_id, keys, pin=False):
        return await self._run(lambda: self.batched_contains(keys), 0)

    def remove_sync(self, key):
        try:
            k = self.key_bytes(key)
            return bool(self._link.call("remove", lambda c: c.delete_many([k]), [False])[0])
        except Exception as e:
            self.warn.warning("remove", "kvpool.lmcache: remove_sync: %r", e)
            return False

    def post_init(self):
        return None


def _itemsize(dtype):
    size = getattr(dtype, "itemsize", None)
    if size:
        return int(size)
    try:
        import torch
        return torch.empty((), dtype=dtype).element_size()
    except Exception:
        return 0


def _memory_format(mla):
    """LMCache's MemoryFormat (KV_MLA_FMT or KV_2LTD) when importable, else
    its name."""
    name = "KV_MLA_FMT" if mla else "KV_2LTD"
    fmt = _lmcache_base("lmcache.v1.memory_management", "MemoryFormat")
    return getattr(fmt, name, name) if fmt is not None else name


class KVPoolConnectorAdapter(ConnectorAdapter):
    """The class named by remote_storage_plugin.kvpool.class_name: accepts
    plugin://kvpool[.<instance>] and kvpool://host:port URLs."""

    def __init__(self):
        super().__init__("kvpool://")

    def can_parse(self, url):
        u = str(url)
        if u.startswith("kvpool://"):
            return True
        if u.startswith("plugin://"):
            name = u[len("plugin://"):].split("/", 1)[0]
            return name == "kvpool" or name.startswith("kvpool.")
        return False

    def create_connector(self, context):
        plugin = getattr(context, "plugin_name", None) or "kvpool"
        return KVPoolRemoteConnector(getattr(context, "url", None), getattr(context, "loop", None),
                                     getattr(context, "local_cpu_backend", None),
                                     getattr(context, "config", None),
                                     getattr(context, "metadata", None), plugin)


__all__ = ["KVPoolL2Plugin", "KVPoolConnectorAdapter", "KVPoolRemoteConnector",
           "USING_REAL_BASE"]
