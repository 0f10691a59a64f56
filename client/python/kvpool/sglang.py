"""kvpool as SGLang's HiCache L3 storage backend (HiCacheStorage).

Loaded by SGLang's own configuration, with no patch of SGLang:

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
        "module_path": "kvpool.sglang", "class_name": "KVPoolHiCacheStorage",
        "interface_v1": 1, "hicache_storage_pass_prefix_keys": true,
        "url": "tcp://pool:7470"}'

The backend keys it reads from the extra config (every one optional):
    url               the kvpool server (default tcp://127.0.0.1:7470)
    token             an auth token, or token_file: a file holding it
    timeout_s         seconds per kvpool call (default 2.0)
    lease_ms          how long batch_exists pins what it matched for the
                      batch_get_v1 that follows (default 5000; the server
                      caps it at its max_lease_ms)
    namespace_prefix  the first part of the namespace (default "sglang"):
                      separates deployments that must not share blocks
    model             the model name when SGLang gives none
    clear_drops_namespace  clear() drops the namespaces this backend
                      writes (default false: clear() refuses, raising, since
                      a namespace may be shared with other instances)
    retain_first_blocks, retain_ms  store the first retain_first_blocks
                      pages of every chain (the shared system prompt) with
                      a retention of retain_ms (both, or neither; the
                      server caps and budgets it: docs/engines.md)
    request_retain    honour a retention that the cache controller passes
                      in HiCacheStorageExtraInfo.extra_info["retain_ms"]
                      (default true; this SGLang commit passes none)
    prefill_tokens_per_s  the engine's prefill speed: batch_exists then
                      offers a hit only when loading it is expected to beat
                      recomputing it (from the load speed its own GETs see);
                      unset: every hit is offered
A misspelt key is refused; other unknown keys are logged (SGLang's own
keys in the same dictionary pass).

Namespace: <prefix>:<model>[:w<weights>]:<kv dtype>:<layout>:p<page size>
:tp<r>of<n>:pp<r>of<n>:cp<r>of<n> (and :lcm<n> when SGLang splits heads);
w<weights> digests the model path and revision from SGLang's server
arguments where they can be read. An MLA model has no tp part: tp rank 0
writes one copy and every rank reads it. Keys: SGLang's 64-hex page
hashes as their 32 bytes; "<hex>.draft" keys as the same bytes in the
namespace <ns>:draft; other strings as their SHA-256. A page's parent is
the previous key of its chain.

Every entry point answers a miss or a failure rather than raising: SGLang's
storage threads die for good on an exception. Two exceptions, both where
SGLang expects them: register_mem_pool_host (and
register_mem_host_pool_v2) raise ConfigError for a configuration the pool
refuses, which fails SGLang's attach_storage_backend; clear() raises when
it does not clear, which SGLang's clear_storage_backend catches and logs.

Written against the HiCacheStorage interface of SGLang at commit
8905cbd4 (2026-07-20); see docs/engines.md for what is not supported.
"""

import hashlib
import logging
import threading
import time

from ._adapters import config as _cfg
from ._adapters import link as _link
from ._adapters import policy as _policy
from ._adapters.buffers import raw_buffer, tensor_address
from ._adapters.config import ConfigError
from ._adapters.keys import make_namespace, string_key
from ._adapters.link import Link, RateLimitedLog

log = logging.getLogger("kvpool.sglang")

INTERFACE = "sglang HiCacheStorage v1 (sgl-project/sglang 8905cbd4, 2026-07-20)"
DEFAULT_URL = "tcp://127.0.0.1:7470"
DEFAULT_LEASE_MS = 5000     # kvpoold's default max_lease_ms
# the backend's own keys in --hicache-storage-backend-extra-config
_OWN_KEYS = ("url", "token", "token_file", "timeout_s", "lease_ms", "namespace_prefix", "model",
             "clear_drops_namespace", "retain_first_blocks", "retain_ms", "request_retain",
             "prefill_tokens_per_s")
# keys SGLang itself reads from the same dictionary (sgl-project/sglang 8905cbd4:
# the dynamic loader, cache controllers and storage backends)
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1",
                "hicache_storage_pass_prefix_keys", "prefetch_threshold", "prefetch_timeout_base",
                "prefetch_timeout_per_ki_token", "prefetch_timeout_max", "tp_lcm_size",
                "enable_metadata_cache", "metadata_ttl")


def _served_model():
    """(model path, revision) of the SGLang server this process runs, from
    SGLang's server arguments (runtime context, or the legacy global), or
    None where they cannot be read (not inside SGLang's scheduler)."""
    args = None
    for module, name in (("sglang.srt.runtime_context", "get_context"),
                         ("sglang.srt.server_args", "get_global_server_args")):
        try:
            mod = __import__(module, fromlist=[name])
            got = getattr(mod, name)()
            args = getattr(got, "server_args", None) if name == "get_context" else got
        except Exception:
            args = None
        if args is not None:
            break
    path = getattr(args, "model_path", None)
    if not isinstance(path, str) or not path:
        return None
    revision = getattr(args, "revision", None)
    return path, revision if isinstance(revision, str) else None


def _engine_module():
    """SGLang's hicache_storage module, or None when SGLang is not
    importable (the adapter then subclasses the fallback below)."""
    try:
        from sglang.srt.mem_cache import hicache_storage
        return hicache_storage
    except Exception as e:   # not installed, or fails to import: same for us
        log.debug("kvpool.sglang: SGLang not importable (%s): using the fallback base", e)
        return None


_hs = _engine_module()


class _FallbackHiCacheStorage:
    """The part of SGLang's HiCacheStorage the adapter relies on, used only
    when SGLang is not installed (so that the module imports and can be
    tested). Written from the contract, not from SGLang's code."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def clear(self):
        return None

    def get_stats(self):
        return None


HiCacheStorage = _hs.HiCacheStorage if _hs is not None else _FallbackHiCacheStorage
USING_REAL_BASE = _hs is not None


class _Result:
    """Stand-in for PoolTransferResult when SGLang is not installed."""

    def __init__(self, kv_hit_pages, extra_pool_hit_pages):
        self.kv_hit_pages = kv_hit_pages
        self.extra_pool_hit_pages = extra_pool_hit_pages


def _pool_result(kv, extra):
    cls = getattr(_hs, "PoolTransferResult", None) if _hs is not None else None
    return (cls or _Result)(kv, extra)


def _as_list(keys):
    """SGLang's keys as a list (None: none). TypeError (caught by the entry
    points) for something that is not a collection of keys."""
    if keys is None:
        return []
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list of strings, not one %s" % type(keys).__name__)
    return list(keys)


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _element_size(dtype):
    """Bytes per element of a torch dtype (torch 1.13 has no dtype.itemsize)."""
    size = getattr(dtype, "itemsize", None)
    if size:
        return int(size)
    import torch
    return torch.empty((), dtype=dtype).element_size()


class KVPoolHiCacheStorage(HiCacheStorage):
    """SGLang HiCache L3 backend over a kvpool server.

    KVPoolHiCacheStorage(storage_config, kwargs=None): what SGLang's
    "dynamic" factory calls; `kwargs` is a dict (ignored) or, for older
    factories, the host memory pool. Nothing is sent before
    register_mem_pool_host(): the namespace needs the pool's dtype, layout
    and page size. Never raises when the pool is down: it answers misses
    and reconnects in the background.

    Threads: SGLang's prefetch, prefetch-I/O and backup threads may call
    at once. batch_exists and batch_get_v1 share one connection (so the
    get ends the MATCH lease); batch_set_v1 has its own.
    """

    def __init__(self, storage_config=None, kwargs=None, **extra):
        self.storage_config = storage_config
        cfg = dict(getattr(storage_config, "extra_config", None) or {})
        who = "kvpool.sglang"
        _cfg.check_keys(dict(cfg, **extra), _OWN_KEYS, who, ignored=_SGLANG_KEYS)
        if isinstance(kwargs, dict):
            cfg.update({k: v for k, v in kwargs.items() if k not in cfg})
        cfg.update(extra)
        self.extra_config = cfg
        self.url = _cfg.url(cfg.get("url"), who)
        self.token = _cfg.token(cfg.get("token"), who, token_file=cfg.get("token_file"))
        self.timeout_s = _cfg.seconds(cfg.get("timeout_s"), who, "timeout_s", 2.0)
        self.lease_ms = _cfg.milliseconds(cfg.get("lease_ms"), who, "lease_ms",
                                          DEFAULT_LEASE_MS)
        self.prefix = _cfg.text(cfg.get("namespace_prefix"), who, "namespace_prefix", "sglang")
        self.clear_drops = _cfg.flag(cfg.get("clear_drops_namespace"), who,
                                     "clear_drops_namespace", False)
        # issue 29: retention hints for what is stored, and a load
        # estimator for what is offered (kvpool._adapters.policy)
        self.retain = _policy.RetainHints(cfg, who)
        self.estimator = _policy.LoadEstimator.from_config(cfg, who)
        self._page_bytes = None  # one page's bytes, from the first page buffers seen
        _cfg.text(cfg.get("model"), who, "model")
        sc = storage_config
        self.tp_rank = int(getattr(sc, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(sc, "tp_size", 1) or 1)
        self.pp_rank = int(getattr(sc, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(sc, "pp_size", 1) or 1)
        self.cp_rank = int(getattr(sc, "attn_cp_rank", 0) or 0)
        self.cp_size = int(getattr(sc, "attn_cp_size", 1) or 1)
        self.is_mla = bool(getattr(sc, "is_mla_model", False))
        self.model = getattr(sc, "model_name", None) or cfg.get("model") or "unknown-model"
        # SGLang passes the served name only; two deployments may serve different
        # weights under one name, so the model path and revision, where SGLang's
        # server arguments can be read, name the weights too
        served = _served_model()
        self.model_id = None
        if served is not None:
            self.model_id = hashlib.sha256(("%s@%s" % (served[0], served[1] or "")).encode(
                "utf-8", "replace")).hexdigest()[:12]
        self.split_heads = bool(getattr(sc, "should_split_heads", False))
        self.tp_lcm = getattr(sc, "tp_lcm_size", None)
        self.warn = RateLimitedLog(log)
        self.namespace = None
        self.page_bytes = None
        self.mem_pool_host = None
        self._links = {}         # (pool, "read"|"write") -> Link; pool False: KV, True: draft
        self._pools = {}         # v2: pool name -> host pool
        self._refused = {}       # (pool, role) -> why its namespace was refused
        self._links_lock = threading.Lock()
        self._closed = False
        self._counts = {k: 0 for k in ("exists_calls", "exists_hit_pages", "get_pages",
                                       "get_failed_pages", "set_pages", "set_failed_pages",
                                       "set_skipped_pages", "declined_hit_pages",
                                       "retained_pages")}
        mem_pool = kwargs if hasattr(kwargs, "get_page_buffer_meta") else None
        if mem_pool is not None:
            self.register_mem_pool_host(mem_pool)

    # ---- set-up -------------------------------------------------------------------

    def namespace_for(self, pool):
        """The namespace of this rank for host pool `pool` (see the module doc)."""
        layout = getattr(pool, "layout", None) or (
            "page_first" if getattr(self.storage_config, "is_page_first_layout", False)
            else "layer_first")
        parts = [self.prefix, self.model]
        if self.model_id:
            parts.append("w" + self.model_id)
        parts += [_dtype_name(getattr(pool, "dtype", "unknown")), layout,
                  "p%d" % int(getattr(pool, "page_size", 0))]
        if self.is_mla:
            parts.append("mla")
        else:
            parts.append("tp%dof%d" % (self.tp_rank, self.tp_size))
        parts.append("pp%dof%d" % (self.pp_rank, self.pp_size))
        parts.append("cp%dof%d" % (self.cp_rank, self.cp_size))
        if self.split_heads and self.tp_lcm:
            parts.append("lcm%d" % int(self.tp_lcm))
        return make_namespace(*parts)

    def register_mem_pool_host(self, mem_pool_host):
        """Keep the host pool, derive the namespace and register the pool's
        KV buffers with both connections (once; again after a reconnect).

        A configuration the pool refuses (a token it denies, a URL or
        namespace libkvpool refuses, pages larger than the server's
        max_block_bytes) raises ConfigError here: SGLang's
        attach_storage_backend, which calls this, then fails (at start,
        SGLang does not start) and rolls the attach back. Only a pool that
        cannot be reached is not an error."""
        try:
            super().register_mem_pool_host(mem_pool_host)
        except Exception:      # a base that refuses: keep it ourselves
            pass
        self.mem_pool_host = mem_pool_host
        try:
            self.namespace = self.namespace_for(mem_pool_host)
            self.page_size = int(getattr(mem_pool_host, "page_size", 1))
            self.dtype = getattr(mem_pool_host, "dtype", None)
            self.page_bytes = self._pool_page_bytes(mem_pool_host)
            arenas = getattr(mem_pool_host, "kv_buffer", None)
            arenas = list(arenas) if isinstance(arenas, (list, tuple)) else [arenas]
            self._arenas = [a for a in arenas if a is not None]
            for role in ("read", "write"):
                link = self._link(False, role, at_start=True)
                for a in self._arenas:
                    link.register(a)
        except ConfigError as e:
            log.error("kvpool.sglang: %s", e)
            raise
        except Exception as e:
            self.warn.warning("register", "kvpool.sglang: register_mem_pool_host: %s", e)

    def _pool_page_bytes(self, pool):
        """Bytes of one page of host pool `pool`, or None if it cannot say."""
        try:
            if hasattr(pool, "get_size_per_token"):
                per = pool.get_size_per_token()
            else:
                per = pool.get_ksize_per_token() * (1 if self.is_mla else 2)
            return int(per) * int(getattr(pool, "page_size", 1) or 1)
        except Exception:
            return None

    def _ns_of(self, draft):
        """The namespace of pool `draft` (see _link), at most 255 bytes."""
        if draft is True:
            return make_namespace(self.namespace, "draft")
        if draft:
            return make_namespace(self.namespace, str(draft))
        return self.namespace

    def _link(self, draft, role, at_start=False):
        """The Link for (pool, read/write), made on first use: pool False is
        the KV namespace, True the draft namespace (<ns>:draft), a string
        the v2 pool of that name (<ns>:<name>). None before the namespace
        is known, after close(), or when the pool refused this namespace's
        configuration: then ConfigError at start (at_start), else logged
        once and remembered, so later calls answer misses without
        connecting again."""
        link = self._links.get((draft, role))
        if link is not None or self.namespace is None:
            return link
        with self._links_lock:
            link = self._links.get((draft, role))
            if link is None and not self._closed and (draft, role) not in self._refused:
                ns = self._ns_of(draft)
                try:
                    link = Link(self.url, ns, token=self.token, timeout_s=self.timeout_s,
                                name="sglang %s %s" % (role, ns), warn=self.warn,
                                lease_ms=self.lease_ms if role == "read" else None,
                                block_bytes=self.page_bytes if role == "write" and not draft
                                else None)
                except ConfigError as e:
                    if at_start:
                        raise
                    self._refused[(draft, role)] = str(e)
                    log.error("kvpool.sglang: %s (this namespace answers misses)", e)
                    return None
                self._links[(draft, role)] = link
        return link

    # ---- keys ---------------------------------------------------------------------

    @staticmethod
    def key_bytes(key):
        """(draft?, 32-byte kvpool key) of an SGLang key string."""
        k = str(key)
        draft = k.endswith(".draft")
        if draft:
            k = k[:-len(".draft")]
        if len(k) == 64:
            try:
                return draft, bytes.fromhex(k)
            except ValueError:
                pass
        return draft, string_key(k)

    def _chain(self, keys, extra_info):
        """(draft?, keys as bytes, parents): parent of keys[i] is keys[i-1];
        of keys[0], the last prefix key SGLang passed, else None."""
        mapped = [self.key_bytes(k) for k in keys]
        draft = bool(mapped) and mapped[0][0]
        ks = [m[1] for m in mapped]
        first = None
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        if prefix:
            first = self.key_bytes(prefix[-1])[1]
        return draft, ks, [first] + ks[:-1]

    def _retain_for(self, n, extra_info):
        """retain_ms for the n pages of a batch_set: the request's own
        (HiCacheStorageExtraInfo.extra_info["retain_ms"], when a cache
        controller passes it), else retain_ms for the chain's first
        retain_first_blocks pages (the pages before this batch are
        extra_info.prefix_keys)."""
        if not self.retain.active or extra_info is None and not self.retain.first_blocks:
            return [0] * n
        extra = getattr(extra_info, "extra_info", None) if extra_info is not None else None
        req = self.retain.request_ms(extra.get(_policy.SGLANG_EXTRA_INFO_FIELD)) \
            if isinstance(extra, dict) else None
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        return self.retain.for_blocks(len(prefix or ()), n, req)

    # ---- zero-copy interface (interface_v1) ---------------------------------------

    @staticmethod
    def _check_slots(host_indices, n, page, size):
        """ValueError unless host_indices are n whole pages of integer slots
        of the host pool: n * page of them, each page page_size consecutive
        slots from a multiple of page_size, all in 0 .. size-1 (size None:
        the pool does not say its size; the range is then left to the
        buffer check in _page_buffers)."""
        count = host_indices.numel() if hasattr(host_indices, "numel") else \
            len(host_indices) if host_indices is not None else 0
        if count != n * page:
            raise ValueError("%d keys need %d host slots (%d pages of %d), got %d"
                             % (n, n * page, n, page, count))
        dtype = getattr(host_indices, "dtype", None)
        if dtype is not None and (getattr(dtype, "is_floating_point", False) or
                                  getattr(dtype, "is_complex", False) or
                                  str(dtype) in ("torch.bool", "bool")):
            raise ValueError("host indices of dtype %s: slots are integers" % dtype)
        if hasattr(host_indices, "reshape") and hasattr(host_indices, "numel"):
            import torch
            t = host_indices.reshape(n, page)
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.to(torch.int64)
            lo, hi = int(t.min()), int(t.max())
            starts = t[:, 0]
            aligned = bool((starts % page == 0).all())
            runs = bool((t - starts.unsqueeze(1) == torch.arange(page).unsqueeze(0)).all())
        else:
            slots = list(host_indices)
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in slots):
                raise ValueError("host indices must be integers")
            lo, hi = min(slots), max(slots)
            aligned = all(slots[i * page] % page == 0 for i in range(n))
            runs = all(slots[i * page + j] == slots[i * page] + j
                       for i in range(n) for j in range(page))
        if lo < 0 or (size is not None and hi >= size):
            raise ValueError("host slots %d..%d are outside the host pool's 0..%s"
                             % (lo, hi, size - 1 if size is not None else "?"))
        if not aligned or not runs:
            raise ValueError("host slots are not whole pages (%d consecutive slots from a "
                             "multiple of %d)" % (page, page))

    @staticmethod
    def _arena_ranges(pool):
        """[(start, end)] of the host pool's buffers, or None if unknown."""
        bufs = getattr(pool, "kv_buffer", None)
        bufs = list(bufs) if isinstance(bufs, (list, tuple)) else [bufs]
        out = []
        for b in bufs:
            if not (hasattr(b, "data_ptr") and hasattr(b, "element_size")):
                return None
            try:
                start = int(b.data_ptr())
                out.append((start, start + b.numel() * b.element_size()))
            except Exception:
                return None
        return out or None

    def _page_buffers(self, host_indices, n, pool=None):
        """Per page: its pieces in the host pool (a buffer, or a list of
        them: MHA pages are a K and a V piece, layer_first pages one pair
        per layer) and its size in bytes. ValueError, before any I/O,
        unless host_indices are n whole pages of the pool (_check_slots)
        and every piece lies inside the pool's buffers."""
        pool = pool if pool is not None else self.mem_pool_host
        page = int(getattr(pool, "page_size", 1) or 1)
        size = getattr(pool, "size", None)
        size = size if isinstance(size, int) and not isinstance(size, bool) else None
        self._check_slots(host_indices, n, page, size)
        meta = pool.get_page_buffer_meta(host_indices)
        if meta is None:
            raise ValueError("the host pool has no page buffers (a logical pool)")
        ptrs, sizes = meta
        if n == 0 or len(ptrs) != len(sizes) or len(ptrs) % n:
            raise ValueError("get_page_buffer_meta gave %d pointers and %d sizes for %d pages"
                             % (len(ptrs), len(sizes), n))
        arenas = self._arena_ranges(pool)
        if arenas is not None:
            for p, z in zip(ptrs, sizes):
                p, z = int(p), int(z)
                if z < 0 or not any(a <= p and p + z <= b for a, b in arenas):
                    raise ValueError("a page piece (%#x, %d bytes) lies outside the host "
                                     "pool's buffers" % (p, z))
        per = len(ptrs) // n
        bufs, page_bytes = [], []
        for i in range(n):
            lo = i * per
            pieces = [raw_buffer(int(ptrs[j]), int(sizes[j])) for j in range(lo, lo + per)]
            bufs.append(pieces[0] if per == 1 else pieces)
            page_bytes.append(sum(int(s) for s in sizes[lo:lo + per]))
        return bufs, page_bytes

    def batch_exists(self, keys, extra_info=None):
        """How many leading keys of `keys` (one chain) the pool holds, as an
        int in 0..len(keys). They stay pinned (a MATCH lease) for the
        batch_get_v1 that follows, so what is present is loadable."""
        try:
            keys = _as_list(keys)
            n = len(keys)
            if n == 0:
                return 0
            draft, ks, _ = self._chain(keys, None)
            link = self._link(draft, "read")
            if link is None:
                return 0
            self._counts["exists_calls"] += 1
            hit = link.call("batch_exists", lambda c: c.match(ks, self.lease_ms), 0)
            hit = hit if isinstance(hit, int) and 0 <= hit <= n else 0
            if hit and self._page_bytes and self.estimator.enabled:
                # a hit is offered only when loading it beats recomputing it
                offered = self.estimator.offer(hit, self._page_bytes, self.page_size)
                self._counts["declined_hit_pages"] += hit - offered
                hit = offered
            self._counts["exists_hit_pages"] += hit
            return hit
        except Exception as e:
            self.warn.warning("exists", "kvpool.sglang: batch_exists: %r", e)
            return 0

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Load pages straight into the host pool at host_indices. A list of
        bools, one per key: True where the page arrived whole (its size is
        the page's size); False for a miss, a block of another size, or a
        pool that is down."""
        n = 0
        try:
            keys = _as_list(keys)
            n = len(keys)
            if n == 0 or self.mem_pool_host is None:
                return [False] * n
            draft, ks, _ = self._chain(keys, None)
            link = self._link(draft, "read")
            if link is None:
                return [False] * n
            try:
                bufs, page_bytes = self._page_buffers(host_indices, n)
            except ValueError as e:
                self.warn.warning("pages", "kvpool.sglang: batch_get_v1: %s", e)
                return [False] * n
            self._page_bytes = self._page_bytes or (page_bytes[0] if page_bytes else None)
            t0 = time.perf_counter()
            st = _link.statuses_or(link.call("batch_get_v1",
                                               lambda c: c.get_into_many(ks, bufs), None), n)
            ok = [st[i] == page_bytes[i] for i in range(n)]
            good = sum(ok)
            if good == n:
                self.estimator.record_load(sum(page_bytes), time.perf_counter() - t0)
            self._counts["get_pages"] += good
            self._counts["get_failed_pages"] += n - good
            bad = [s for s in st if s <= 0 and s not in (_link.MISS, _link.DOWN)]
            if bad:
                self.warn.warning("get", "kvpool.sglang: batch_get_v1: %d of %d pages failed "
                                  "(first status %d)", len(bad), n, bad[0])
            return ok
        except Exception as e:
            self.warn.warning("get", "kvpool.sglang: batch_get_v1: %r", e)
            return [False] * n

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store pages straight from the host pool at host_indices. A list
        of bools, one per key: True where the page is stored (or already
        was). On an MLA model only tp rank 0 writes; other ranks answer
        True without sending (rank 0 stores the one shared copy)."""
        n = 0
        try:
            keys = _as_list(keys)
            n = len(keys)
            if n == 0:
                return []
            if self.is_mla and self.tp_rank != 0:
                self._counts["set_skipped_pages"] += n
                return [True] * n
            if self.mem_pool_host is None:
                return [False] * n
            draft, ks, parents = self._chain(keys, extra_info)
            link = self._link(draft, "write")
            if link is None:
                self._counts["set_failed_pages"] += n
                return [False] * n
            try:
                bufs, page_bytes = self._page_buffers(host_indices, n)
            except ValueError as e:
                self.warn.warning("pages", "kvpool.sglang: batch_set_v1: %s (nothing stored)",
                                  e)
                self._counts["set_failed_pages"] += n
                return [False] * n
            self._page_bytes = self._page_bytes or (page_bytes[0] if page_bytes else None)
            retain = self._retain_for(n, extra_info)
            self._counts["retained_pages"] += sum(1 for r in retain if r)
            st = _link.statuses_or(link.call(
                "batch_set_v1", lambda c: _link.put_rerooting(c, ks, bufs, parents, retain),
                None), n)
            ok = [s == 0 for s in st]
            good = sum(ok)
            self._counts["set_pages"] += good
            self._counts["set_failed_pages"] += n - good
            if good < n:
                first = next(s for s in st if s != 0)
                self.warn.warning("set", "kvpool.sglang: batch_set_v1: %d of %d pages not stored "
                                  "(first status %d)", n - good, n, first)
            return ok
        except Exception as e:
            self.warn.warning("set", "kvpool.sglang: batch_set_v1: %r", e)
            return [False] * n

    # ---- hybrid models (v2): the extra pools of SGLang's hybrid cache controller -------

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Keep a host pool of the hybrid controller (KV, Mamba, SWA,
        indexer ...). The KV pool is the one register_mem_pool_host got;
        every other pool's pages go to <namespace>:<pool name>. A
        configuration the pool refuses for that namespace raises
        ConfigError, as register_mem_pool_host does."""
        try:
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
        except Exception:
            pass
        name = str(getattr(host_pool_name, "value", host_pool_name))
        self._pools[name] = host_pool
        if name != "kv" and self.namespace is not None:
            for role in ("read", "write"):
                try:
                    link = self._link(name, role, at_start=True)
                except ConfigError as e:
                    log.error("kvpool.sglang: %s", e)
                    raise
                arena = getattr(host_pool, "kv_buffer", None)
                if link is not None and hasattr(arena, "data_ptr"):
                    link.register(arena)

    @staticmethod
    def _pool_name(t):
        name = getattr(t, "name", "?")
        return str(getattr(name, "value", name))

    def _pool_pages_present(self, name, keys):
        """Per key: whether pool `name` holds its page (no lease)."""
        if name == "kv":
            link, ks = self._link(False, "read"), [self.key_bytes(k)[1] for k in keys]
        else:
            link, ks = self._link(name, "read"), [self.key_bytes(k)[1] for k in keys]
        if link is None or not ks:
            return [False] * len(keys)
        got = link.call("exists_v2", lambda c: c.exists_many(ks), None)
        return list(got) if isinstance(got, list) and len(got) == len(ks) else [False] * len(ks)

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix over the KV pool and every extra pool of
        pool_transfers (ALL_PAGES: each page of the prefix; TRAILING_PAGES:
        its last len(transfer.keys) pages), as PoolTransferResult
        (kv_hit_pages, {pool: pages}). The pages a prefix needs are pinned
        by a MATCH lease. Never raises."""
        try:
            keys = _as_list(keys)
            n = len(keys)
            anchor = self.mem_pool_host
            if anchor is not None and getattr(anchor, "kv_buffer", True) is None:
                kv = n                  # a logical anchor: no KV pages of its own
            else:
                kv = self.batch_exists(keys, extra_info) if n else 0
            hits = {"kv": kv} if kv else {}
            final = kv
            for t in pool_transfers or []:
                if final == 0:
                    break
                name = self._pool_name(t)
                present = self._pool_pages_present(name, keys[:kv])
                policy = str(getattr(getattr(t, "hit_policy", "all_pages"), "value",
                                     getattr(t, "hit_policy", "all_pages")))
                if policy == "trailing_pages":
                    need = max(1, len(getattr(t, "keys", None) or []) or 1)
                    boundary = next((p for p in range(kv, 0, -1)
                                     if all(present[max(0, p - need):p])), 0)
                    lease = keys[max(0, boundary - need):boundary]
                else:
                    boundary = next((i for i, h in enumerate(present) if not h), kv)
                    lease = keys[:boundary]
                if boundary:
                    hits[name] = boundary
                    link = self._link(name, "read")
                    ks = [self.key_bytes(k)[1] for k in lease]
                    if link is not None and ks:
                        link.call("lease_v2", lambda c: c.match(ks, self.lease_ms), 0)
                final = min(final, boundary)
            return _pool_result(final, hits)
        except Exception as e:
            self.warn.warning("exists_v2", "kvpool.sglang: batch_exists_v2: %r", e)
            return _pool_result(0, {})

    def _batch_io_v2(self, transfers, write):
        out = {}
        for t in transfers or []:
            name = self._pool_name(t)
            keys = list(getattr(t, "keys", None) or [])
            n = len(keys)
            try:
                pool = self._pools.get(name) if name != "kv" else \
                    (self._pools.get("kv") or self.mem_pool_host)
                if pool is None or n == 0:
                    if n:
                        self.warn.warning("pool", "kvpool.sglang: no host pool %r registered "
                                          "(register_mem_host_pool_v2)", name)
                    out[name] = [False] * n
                    continue
                if write and self.is_mla and self.tp_rank != 0:
                    out[name] = [True] * n
                    continue
                bufs, page_bytes = self._page_buffers(t.host_indices, n, pool)
                link = self._link(name if name != "kv" else False, "write" if write else "read")
                if link is None:
                    out[name] = [False] * n
                    continue
                ks = [self.key_bytes(k)[1] for k in keys]
                if write:
                    st = _link.statuses_or(link.call(
                        "batch_set_v2", lambda c: _link.put_rerooting(c, ks, bufs, None),
                        None), n)
                    out[name] = [s == 0 for s in st]
                else:
                    st = _link.statuses_or(link.call(
                        "batch_get_v2", lambda c: c.get_into_many(ks, bufs), None), n)
                    out[name] = [st[i] == page_bytes[i] for i in range(n)]
            except Exception as e:
                self.warn.warning("v2", "kvpool.sglang: batch_%s_v2 %s: %s",
                                  "set" if write else "get", name, e)
                out[name] = [False] * n
        return out

    def batch_get_v2(self, transfers, extra_info=None):
        """Load each transfer's pages (keys, host_indices) into its pool;
        {pool name: [bool per key]}: True where the page arrived whole."""
        try:
            return self._batch_io_v2(transfers, False)
        except Exception as e:
            self.warn.warning("v2", "kvpool.sglang: batch_get_v2: %r", e)
            return {}

    def batch_set_v2(self, transfers, extra_info=None):
        """Store each transfer's pages from its pool; {pool name: [bool per
        key]}: True where stored (or already there)."""
        try:
            return self._batch_io_v2(transfers, True)
        except Exception as e:
            self.warn.warning("v2", "kvpool.sglang: batch_set_v2: %r", e)
            return {}

    # ---- the copy-based interface (draft pages; SGLang without interface_v1) -------

    def _flat_page(self):
        import torch
        pool = self.mem_pool_host
        if hasattr(pool, "get_size_per_token"):
            per_token = pool.get_size_per_token()
        else:
            per_token = pool.get_ksize_per_token() * (1 if self.is_mla else 2)
        page_bytes = int(per_token) * self.page_size
        return torch.empty(page_bytes // _element_size(self.dtype), dtype=self.dtype)

    def get(self, key, target_location=None, target_sizes=None):
        """One page into target_location (a contiguous CPU tensor; None:
        a new flat page). The tensor, or None for a miss or a page of
        another size."""
        got = self.batch_get([key], None if target_location is None else [target_location])
        return got[0] if got else None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Pages into target_locations[i] (flat page tensors; None: new
        ones). A list with the tensor or None per key."""
        n = 0
        try:
            keys = _as_list(keys)
            n = len(keys)
            if n == 0:
                return []
            if target_locations is None:
                if self.mem_pool_host is None:
                    return [None] * n
                target_locations = [self._flat_page() for _ in range(n)]
            draft, ks, _ = self._chain(keys, None)
            link = self._link(draft, "read")
            if link is None:
                return [None] * n
            targets = list(target_locations)
            sizes = [tensor_address(t)[1] for t in targets]
            st = _link.statuses_or(link.call("batch_get",
                                               lambda c: c.get_into_many(ks, targets), None), n)
            return [targets[i] if st[i] == sizes[i] else None for i in range(n)]
        except Exception as e:
            self.warn.warning("get", "kvpool.sglang: batch_get: %r", e)
            return [None] * n

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Store one page (a contiguous CPU tensor). True if stored."""
        if value is None:
            return False
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Store pages values[i] (tensors) as one chain. True if every page
        is stored (False when none given)."""
        try:
            keys = _as_list(keys)
            n = len(keys)
            if n == 0 or values is None or len(values) != n:
                return False
            if self.is_mla and self.tp_rank != 0:
                return True
            draft, ks, parents = self._chain(keys, None)
            link = self._link(draft, "write")
            if link is None:
                return False
            vals = [v.contiguous() if hasattr(v, "contiguous") else v for v in values]
            st = _link.statuses_or(link.call(
                "batch_set", lambda c: _link.put_rerooting(c, ks, vals, parents), None), n)
            return all(s == 0 for s in st)
        except Exception as e:
            self.warn.warning("set", "kvpool.sglang: batch_set: %r", e)
            return False

    def exists(self, key):
        """True if the pool holds the page (no lease)."""
        try:
            draft, k = self.key_bytes(key)
            link = self._link(draft, "read")
            if link is None:
                return False
            got = link.call("exists", lambda c: c.exists_many([k]), [False])
            return bool(got and got[0])
        except Exception as e:
            self.warn.warning("exists", "kvpool.sglang: exists: %r", e)
            return False

    # ---- administration ----------------------------------------------------------------

    def namespaces(self):
        """Every namespace this backend writes: the KV pool's, the draft
        pages' (<ns>:draft) and each v2 pool's (<ns>:<pool name>)."""
        if self.namespace is None:
            return []
        return [self._ns_of(d) for d in [False, True] + sorted(n for n in self._pools
                                                               if n != "kv")]

    def clear(self):
        """SGLang's "clear HiCache storage": with clear_drops_namespace,
        drops every namespace this backend writes (namespaces()) and
        returns True. Otherwise, or when a drop fails, raises RuntimeError
        with the reason: SGLang's clear_storage_backend learns of a failed
        clear only through an exception (it catches it and logs "Failed to
        clear hierarchical cache storage backend"), and ignores the return
        value. A namespace is left alone unless clear_drops_namespace says
        it may be dropped: other instances may be using it."""
        if not self.clear_drops:
            raise RuntimeError(
                "kvpool.sglang: clear() refused: namespace %s may be shared with other "
                "instances; set \"clear_drops_namespace\": true in the backend's extra config "
                "to let clear() drop it" % self.namespace)
        if self.namespace is None:
            raise RuntimeError("kvpool.sglang: clear() before register_mem_pool_host: "
                               "there is no namespace yet")
        link = self._link(False, "write")
        failed, dropped = [], 0
        for ns in self.namespaces():
            got = link.call("clear", lambda c, ns=ns: c.drop_namespace(ns), None) \
                if link is not None else None
            if got is None:
                failed.append(ns)
            else:
                dropped += int(got)
        if failed:
            raise RuntimeError("kvpool.sglang: clear() could not drop %s (the pool is down or "
                               "refused it); %d blocks of the others were dropped"
                               % (", ".join(failed), dropped))
        log.info("kvpool.sglang: clear() dropped %s (%d blocks)",
                 ", ".join(self.namespaces()), dropped)
        return True

    def stats(self):
        """This backend's counters (a dict) and whether its links are up."""
        out = dict(self._counts)
        out["namespace"] = self.namespace
        out["load_estimate"] = self.estimator.state()
        out["up"] = {"%s%s" % (role, ":draft" if d else ""): link.up
                     for (d, role), link in list(self._links.items())}
        return out

    def get_stats(self):
        """None: kvpool's figures are in its own metrics (and stats())."""
        return None

    def close(self):
        """Close every connection. Idempotent."""
        with self._links_lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
        for link in links:
            try:
                link.close()
            except Exception:
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


__all__ = ["KVPoolHiCacheStorage", "HiCacheStorage", "USING_REAL_BASE", "INTERFACE"]
