"""kvpool as LMCache's non-MP remote storage plugin (KVPoolConnectorAdapter,
which makes KVPoolRemoteConnector), in the LMCache configuration:

    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.lmcache
      remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter
      remote_storage_plugin.kvpool.url: tcp://pool:7470
      save_chunk_meta: false

Keys: the SHA-256 of CacheEngineKey.to_string(). The plugin subclasses
LMCache's ConnectorAdapter/RemoteConnector when LMCache is importable.
See docs/engines.md.

Retention and loads (issue 29): a request's kv_transfer_params
{"lmcache.kvpool.retain_ms": MS} reaches each chunk's key
(CacheEngineKey.request_configs) and the chunk is stored with that
retention (request_retain, default true). With
remote_storage_plugin.kvpool.prefill_tokens_per_s set, batched_contains
offers a hit only when loading it is expected to beat recomputing it.
"""

import asyncio
import concurrent.futures
import errno as _errno
import logging
import time

from .._adapters import config as _cfg
from .._adapters import link as _link
from .._adapters import policy as _policy
from .._adapters.keys import make_namespace, string_key
from .._adapters.link import Link, RateLimitedLog

log = logging.getLogger("kvpool.lmcache")

INTERFACE_REMOTE = "LMCache RemoteConnector (base_connector.py @01712fbd)"
DEFAULT_LEASE_MS = 5000     # kvpoold's default max_lease_ms


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
_Irrecoverable = _lmcache_base("lmcache.v1.exceptions", "IrrecoverableException")
# the plugin's own settings (remote_storage_plugin.<plugin>.<key>) and LMCache's
_REMOTE_KEYS = ("url", "token", "token_file", "timeout_s", "lease_ms", "namespace",
                "namespace_prefix", "request_retain", "prefill_tokens_per_s",
                "retain_first_blocks")
_LMCACHE_PLUGIN_KEYS = ("module_path", "class_name")


class RemoteConfigError(_cfg.ConfigError, *((_Irrecoverable,) if _Irrecoverable else ())):
    """A setting of the remote storage plugin that cannot work. Also
    LMCache's IrrecoverableException (when LMCache is there), which its
    RemoteBackend does not swallow: with the legacy remote_url the engine
    then fails to start; with remote_storage_plugins LMCache (9f5cee0c)
    logs it and runs without this backend (see docs/engines.md)."""


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
        try:
            self._init(url, loop, local_cpu_backend, config, metadata, plugin_name)
        except _cfg.ConfigError as e:
            # LMCache's RemoteBackend swallows any other exception (it then
            # runs with no connection, retrying every 10 s for ever): say it
            # loudly, once, and raise what it lets through
            log.error("kvpool.lmcache: CONFIGURATION ERROR, the kvpool remote backend is off: "
                      "%s", e)
            raise RemoteConfigError(str(e)) from None

    def _init(self, url, loop, local_cpu_backend, config, metadata, plugin_name):
        # LMCache's RemoteConnector.__init__(config, metadata) sets the chunk
        # metadata (meta_shapes, meta_dtypes, meta_fmt, full_chunk_size_bytes,
        # single_token_size) that reshape_partial_chunk uses; older ones
        # define none.
        self.meta_shapes = None
        self.full_chunk_size_bytes = None
        base_init = getattr(RemoteConnector, "__init__", object.__init__)
        if RemoteConnector is not object and base_init is not object.__init__:
            try:
                base_init(self, config, metadata)
            except Exception as e:
                log.warning("kvpool.lmcache: RemoteConnector.__init__: %r (chunk sizes "
                            "come from the metadata's kv_shape instead)", e)
                self.meta_shapes = None
                self.full_chunk_size_bytes = None
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.metadata = metadata
        self.plugin_name = plugin_name
        self.warn = RateLimitedLog(log)
        pool_url = _cfg_get(config, plugin_name, "url")
        if not pool_url and url and str(url).startswith("kvpool://"):
            pool_url = "tcp://" + str(url)[len("kvpool://"):]
        who = "kvpool.lmcache remote plugin (remote_storage_plugin.%s.*)" % plugin_name
        extra = getattr(config, "extra_config", None) or {}
        head = "remote_storage_plugin.%s." % plugin_name
        if isinstance(extra, dict):
            _cfg.check_keys({k[len(head):]: v for k, v in extra.items()
                             if isinstance(k, str) and k.startswith(head)},
                            _REMOTE_KEYS, who, ignored=_LMCACHE_PLUGIN_KEYS, prefix=head)
        self.url = _cfg.url(pool_url, who)
        self.timeout_s = _cfg.seconds(_cfg_get(config, plugin_name, "timeout_s"), who,
                                      "timeout_s", 2.0)
        self.lease_ms = _cfg.milliseconds(_cfg_get(config, plugin_name, "lease_ms"), who,
                                          "lease_ms", DEFAULT_LEASE_MS)
        token = _cfg.token(_cfg_get(config, plugin_name, "token"), who,
                           token_file=_cfg_get(config, plugin_name, "token_file"))
        use_mla = bool(getattr(metadata, "use_mla", False))
        self.worker_id = int(getattr(metadata, "worker_id", 0) or 0)
        self.world_size = int(getattr(metadata, "world_size", 1) or 1)
        # LMCache's RemoteBackend reads every worker's chunks under worker 0's
        # keys (and only worker 0 writes) exactly when this holds; the flag is
        # taken as LMCache takes it (its truth value, use_mla when unset), so
        # the namespaces follow the keys LMCache asks for
        flag = extra.get("remote_enable_mla_worker_id_as0", use_mla) \
            if isinstance(extra, dict) else use_mla
        if isinstance(flag, str):
            log.warning("kvpool.lmcache: remote_enable_mla_worker_id_as0 is the string %r, "
                        "which LMCache reads as %s: write a YAML boolean", flag, bool(flag))
        self.mla = bool(flag) and use_mla and self.world_size > 1
        self.use_mla = use_mla
        self.kv_shape = tuple(getattr(metadata, "kv_shape", ()) or ())
        self.dtype = getattr(metadata, "kv_dtype", None)
        chunk = int(getattr(config, "chunk_size", 0) or (self.kv_shape[2] if len(self.kv_shape)
                                                         > 2 else 256))
        self.chunk_tokens = chunk
        ns = _cfg.text(_cfg_get(config, plugin_name, "namespace"), who, "namespace")
        ns = ns or make_namespace(
            _cfg.text(_cfg_get(config, plugin_name, "namespace_prefix"), who, "namespace_prefix",
                      "lmcache"),
            getattr(metadata, "model_name", None) or "unknown-model",
            str(self.dtype).replace("torch.", ""), "ws%d" % self.world_size,
            "w%d" % (0 if self.mla else self.worker_id), "c%d" % chunk)
        self.namespace = ns
        self._link = Link(self.url, ns, token=token, timeout_s=self.timeout_s,
                          name="lmcache " + ns, warn=self.warn, lease_ms=self.lease_ms,
                          block_bytes=self._full_bytes() or None)
        pol = {k: _cfg_get(config, plugin_name, k) for k in ("request_retain",
                                                              "prefill_tokens_per_s")}
        if _cfg_get(config, plugin_name, "retain_first_blocks") is not None:
            raise _cfg.ConfigError("%s: retain_first_blocks: LMCache's keys carry no position "
                                   "in the prompt; retain per request instead "
                                   "(kv_transfer_params {\"%s\": MS})"
                                   % (who, _policy.LMCACHE_REQUEST_FIELD))
        self.retain = _policy.RetainHints({k: v for k, v in pol.items() if v is not None}, who)
        self.estimator = _policy.LoadEstimator.from_config(pol, who)
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
        """A memory object for nbytes from LMCache's local CPU backend: the
        full chunk with LMCache's own shapes (RemoteConnector's meta_shapes)
        when known, else the shape from kv_shape (a short last chunk by its
        byte count). Shapes go as torch.Size: LocalCPUBackend.allocate reads
        a plain tuple as a list of shapes."""
        fmt = _memory_format(self.use_mla)
        if self.meta_shapes and nbytes == self.full_chunk_size_bytes:
            shapes, dtypes = self.meta_shapes, self.meta_dtypes
            fmt = getattr(self, "meta_fmt", None) or fmt
        else:
            got = self._shape_for(nbytes)
            if got is None:
                return None
            shapes, dtypes = _size(got[0]), self.dtype
        try:
            return self.local_cpu_backend.allocate(shapes, dtypes, fmt)
        except Exception as e:
            self.warn.warning("alloc", "kvpool.lmcache: allocate %s: %r", shapes, e)
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
        """The object of `key`: received into a full-chunk object; a short
        last chunk (recognised by its byte count) is cut down with
        RemoteConnector.reshape_partial_chunk when LMCache has it, else
        received again into an object of its size."""
        k = self.key_bytes(key)
        full = self._full_bytes()
        obj = self._allocate(full) if full else None
        if obj is None:
            return None
        t0 = time.perf_counter()
        got = self._link.call("get", lambda c: c.get_into_many([k], [obj.byte_array]),
                              [_link.DOWN])[0]
        if got == full:
            self.estimator.record_load(full, time.perf_counter() - t0)
            return obj
        token = self._token_bytes()
        if 0 < got < full and token and got % token == 0:
            if self.full_chunk_size_bytes and hasattr(self, "reshape_partial_chunk"):
                try:
                    return self.reshape_partial_chunk(obj, got)
                except Exception as e:
                    self.warn.warning("partial", "kvpool.lmcache: reshape_partial_chunk: %r", e)
            else:
                self._release(obj)
                obj = self._allocate(got)
                if obj is None:
                    return None
                again = self._link.call("get", lambda c: c.get_into_many(
                    [k], [obj.byte_array]), [_link.DOWN])[0]
                if again == got:
                    return obj
        self._release(obj)
        return None

    def _full_bytes(self):
        if self.full_chunk_size_bytes:
            return int(self.full_chunk_size_bytes)
        return self._shape_for_full()

    def _token_bytes(self):
        if getattr(self, "single_token_size", None):
            return int(self.single_token_size)
        if len(self.kv_shape) != 5:
            return 0
        layers, kv, _, heads, dim = self.kv_shape
        return layers * kv * heads * dim * _itemsize(self.dtype)

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

    def _retain_of(self, key):
        """The retention a chunk's request asks for (0: none)."""
        cfgs = getattr(key, "request_configs", None)
        if not isinstance(cfgs, dict) or _policy.LMCACHE_REQUEST_FIELD not in cfgs:
            return 0
        return self.retain.request_ms(cfgs[_policy.LMCACHE_REQUEST_FIELD]) or 0

    async def put(self, key, memory_obj):
        if not self._writes():
            return None
        k = self.key_bytes(key)
        ms = self._retain_of(key)
        await self._run(lambda: self._link.call(
            "put", lambda c: c.put_many([k], [memory_obj.byte_array], retain_ms=ms), None), None)
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
        # every key a root: a chained batch would make remove_sync(keys[0])
        # remove the whole batch while LMCache believes the rest stored
        ks = [self.key_bytes(k) for k in keys]
        bufs = [m.byte_array for m in memory_objs]
        retain = [self._retain_of(k) for k in keys]
        await self._run(lambda: self._link.call("batched_put", lambda c: _link._put_many(
            c, ks, bufs, None, retain), None), None)
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
            n = n if isinstance(n, int) and 0 <= n <= len(ks) else 0
            if n and self.estimator.enabled and self._full_bytes():
                n = self.estimator.offer(n, self._full_bytes(), self.chunk_tokens)
            return n
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


def _size(shape):
    """shape as a torch.Size (what LMCache's allocators take for one shape)."""
    try:
        import torch
        return torch.Size(shape)
    except Exception:
        return tuple(shape)


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


__all__ = ["KVPoolConnectorAdapter", "KVPoolRemoteConnector", "USING_REAL_BASE",
           "INTERFACE_REMOTE"]
