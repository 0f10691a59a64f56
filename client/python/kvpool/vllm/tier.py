"""kvpool as a secondary tier of vLLM's offloading tiering manager
(KVPoolSecondaryTier), for vLLM with v1/kv_offload/tiering:

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
          "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8e9,
          "block_size": 64, "eviction_policy": "lru",
          "secondary_tiers": [{"type": "kvpool", "url": "tcp://pool:7470"}]}}'

"type": "kvpool" is registered by kvpool.vllm.register() (a
vllm.general_plugins entry point of the installed package); releases
that take {"type": "KVPoolSecondaryTier", "module_path": "kvpool.vllm"}
need no registration. vLLM must be started with --attention-backend: the
rows are raw KV pages whose bytes depend on the backend, and the tier
refuses to start when vLLM picks it in each worker (tier_layout()).

Keys: vLLM's block hashes, 32 bytes (sha256, sha256_cbor) as they are,
16 bytes (xxhash, xxhash_cbor) zero-padded to 32; the parent of a chunk
is the previous chunk of the same request. No entry point raises into
vLLM when the pool is down, slow or full: lookups answer False and jobs
fail (JobResult(success=False)).

Retention (docs/engines.md): a request's kv_transfer_params
{"kvpool_retain_ms": MS}, which vLLM hands the tier in each job's and
lookup's ReqContext, stores that request's blocks with a retention of MS
(every block of its store jobs, those the pool holds already included, so
that their retention is extended) and refreshes it on the run its lookups
hit (request_retain, default true). retain_first_blocks is refused: a
tier's jobs do not say where their blocks sit in the prompt.

Loads (docs/engines.md): with prefill_tokens_per_s set, a lookup's hit is
answered True only when loading it is expected to beat recomputing it
(the load speed from the tier's own loads; kvpool._adapters.policy).
"""

import collections
import logging
import os
import threading
import time

from .._adapters import config as _cfg
from .._adapters import link as _link
from .._adapters import policy as _policy
from .._adapters.async_link import make_async_link
from .._adapters.buffers import raw_buffer
from .._adapters.keys import extend_namespace, make_namespace
from .._adapters.link import Link, RateLimitedLog
from ._keys import (DEFAULT_LEASE_MS, _hash_algo, _import, _model_dtype,
                    _parallel, block_key, kv_options_part)

log = logging.getLogger("kvpool.vllm")

INTERFACE_TIER = ("vLLM SecondaryTierManager (vllm-project/vllm 9aaf83ef, 2026-05-19; "
                  "also the later (offloading_spec, view, tier_type) constructor)")
TIER_TYPE = "kvpool"
_MAX_STATE = 200000       # cached lookup answers before expired ones are pruned
_MAX_REQUESTS = 100000    # requests whose last stored key is remembered


class _FallbackJobResult:
    """vLLM's JobResult(job_id, success) when vLLM is not installed."""

    __slots__ = ("job_id", "success")

    def __init__(self, job_id, success):
        self.job_id = job_id
        self.success = success

    def __repr__(self):
        return "JobResult(job_id=%r, success=%r)" % (self.job_id, self.success)


# ---- route A: a secondary tier of the tiering offloading manager ---------------------------

_tier_base = _import("vllm.v1.kv_offload.tiering.base", "SecondaryTierManager")
JobResult = _import("vllm.v1.kv_offload.tiering.base", "JobResult") or _FallbackJobResult
_LookupResult = (_import("vllm.v1.kv_offload.tiering.base", "LookupResult") or
                 _import("vllm.v1.kv_offload.base", "LookupResult"))
_RequestOffloadingContext = _import("vllm.v1.kv_offload.base", "RequestOffloadingContext")


class _FallbackSecondaryTierManager:
    """The base vLLM's tiering manager expects, used only when vLLM is not
    installed. Written from the contract, not from vLLM's code."""

    def touch(self, keys, req_context):
        return None

    def shutdown(self):
        return None


SecondaryTierManager = _tier_base or _FallbackSecondaryTierManager
USING_REAL_TIER_BASE = _tier_base is not None


def register():
    """Register tier type "kvpool" with vLLM's SecondaryTierFactory (the
    vllm.general_plugins entry point). Does nothing without vLLM."""
    factory = _import("vllm.v1.kv_offload.tiering.factory", "SecondaryTierFactory")
    if factory is None:
        return False
    try:
        factory.register_tier(TIER_TYPE, "kvpool.vllm", "KVPoolSecondaryTier")
        return True
    except Exception as e:       # already registered (a second call) or refused
        log.debug("kvpool.vllm: register_tier: %r", e)
        return False


_TIER_KEYS = ("url", "token", "token_file", "timeout_s", "lease_ms", "namespace",
              "namespace_prefix", "model", "kv_dtype", "hash_algo", "block_size", "miss_ttl_s",
              "failed_ttl_s", "group", "request_retain", "retain_first_blocks", "retain_ms",
              "prefill_tokens_per_s")


def _backend_of(vllm_config):
    """(name, class) of the attention backend vLLM was told to use
    (attention_config.backend, --attention-backend), or None when vLLM
    chooses it in each worker ("auto")."""
    ac = getattr(vllm_config, "attention_config", None)
    backend = getattr(ac, "backend", None)
    if backend is None or (isinstance(backend, str) and backend.strip().lower() in ("", "auto")):
        return None
    if isinstance(backend, type):                 # a backend class itself
        name = backend.get_name() if hasattr(backend, "get_name") else backend.__name__
        return str(name), backend
    if isinstance(backend, str):
        enum = _import("vllm.v1.attention.backends.registry", "AttentionBackendEnum")
        if enum is None:
            raise _cfg.ConfigError("kvpool.vllm tier: attention backend %r: vLLM's backend "
                                   "registry is not importable" % backend)
        try:
            backend = enum[backend.strip().upper()]
        except (KeyError, ValueError) as e:
            raise _cfg.ConfigError("kvpool.vllm tier: %s" % e) from None
    name = getattr(backend, "name", None) or str(backend)
    try:
        cls = backend.get_class()
    except Exception as e:
        raise _cfg.ConfigError("kvpool.vllm tier: cannot load attention backend %s: %r"
                               % (name, e)) from None
    return str(name), cls


def _kernel_block(cls, block, vllm_config):
    """The attention kernel's block size vLLM's model runner picks for KV
    manager blocks of `block` tokens and this backend: `block` itself if
    the backend supports it, else the largest size it lists that divides
    `block` (see vLLM's v1/worker/utils.py select_common_block_size)."""
    fn = getattr(cls, "get_supported_kernel_block_sizes", None)
    if fn is None:
        return block
    ctx = _import("vllm.config", "set_current_vllm_config")
    try:
        if callable(ctx) and vllm_config is not None:
            try:
                with ctx(vllm_config):
                    sizes = list(fn())
            except (TypeError, AttributeError):
                sizes = list(fn())
        else:
            sizes = list(fn())
    except Exception as e:
        raise _cfg.ConfigError("kvpool.vllm tier: %s.get_supported_kernel_block_sizes(): %r"
                               % (getattr(cls, "__name__", cls), e)) from None

    def fits(n):
        for s in sizes:
            if isinstance(s, int) and not isinstance(s, bool):
                if s == n:
                    return True
            elif isinstance(getattr(s, "base", None), int) and s.base > 0 and n % s.base == 0:
                return True
        return False
    if fits(block):
        return block
    for s in sorted((s for s in sizes if isinstance(s, int) and not isinstance(s, bool)),
                    reverse=True):
        if s > 0 and block % s == 0 and fits(s):
            return s
    raise _cfg.ConfigError("kvpool.vllm tier: attention backend %s has no kernel block size "
                           "for KV blocks of %d tokens (it supports %r)"
                           % (getattr(cls, "__name__", cls), block, sizes))


def _kv_layout(cls, vllm_config):
    """NHD or HND, in vLLM's order of precedence (v1/attention/backends/
    utils.py get_kv_cache_layout): a layout the backend requires, then
    VLLM_KV_CACHE_LAYOUT, then a layout the configured KV connector
    requires, else NHD."""
    fn = getattr(cls, "get_required_kv_cache_layout", None)
    required = None
    if fn is not None:
        try:
            required = fn()
        except Exception as e:
            raise _cfg.ConfigError("kvpool.vllm tier: %s.get_required_kv_cache_layout(): %r"
                                   % (getattr(cls, "__name__", cls), e)) from None
    if required in ("NHD", "HND"):
        return required
    env = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    if env:
        if env not in ("NHD", "HND"):
            raise _cfg.ConfigError("kvpool.vllm tier: VLLM_KV_CACHE_LAYOUT=%r is neither NHD "
                                   "nor HND" % env)
        return env
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    factory = _import("vllm.distributed.kv_transfer.kv_connector.factory", "KVConnectorFactory")
    if ktc is not None and factory is not None:
        try:
            got = factory.get_connector_class(ktc).get_required_kvcache_layout(vllm_config)
        except Exception as e:
            log.debug("kvpool.vllm tier: the connector's required layout: %r", e)
            got = None
        if got in ("NHD", "HND"):
            return got
    return "NHD"


def tier_layout(vllm_config, block=None):
    """The name of the byte layout of the primary tier's rows, for the
    namespace: <attention backend>-<NHD|HND>-k<kernel block>.

    vLLM's offloading worker copies each worker's KV-cache pages into the
    primary rows as raw bytes, so two instances whose rows have the same
    size can still hold different bytes: FlashAttention keeps K and V
    apart, FlashInfer and Triton interleave them per kernel block, HND
    orders heads before tokens, and a kernel block smaller than the KV
    manager's block splits each row into kernel blocks. The tier runs in
    the scheduler process, which does not see the workers' KV caches; it
    can name their layout only when vLLM was told which attention backend
    to use. Raises ConfigError otherwise (and for a backend that cannot
    be loaded), so a tier that could serve wrong bytes never starts."""
    got = _backend_of(vllm_config)
    if got is None:
        raise _cfg.ConfigError(
            "kvpool.vllm tier: vLLM chooses the attention backend in each worker, so the tier "
            "cannot name the byte layout of the KV pages it stores (FlashAttention, FlashInfer, "
            "NHD/HND and the kernel block size all give rows of the same size and different "
            "bytes): start vLLM with --attention-backend (attention_config.backend), e.g. "
            "FLASH_ATTN or FLASHINFER")
    name, cls = got
    cc = getattr(vllm_config, "cache_config", None)
    if block is None:
        block = getattr(cc, "block_size", None)
    try:
        block = int(block)
    except (TypeError, ValueError):
        raise _cfg.ConfigError("kvpool.vllm tier: vLLM's cache_config.block_size %r is not "
                               "known" % (block,)) from None
    kernel = _kernel_block(cls, block, vllm_config)
    return "%s-%s-k%d" % (name, _kv_layout(cls, vllm_config), kernel)


class KVPoolSecondaryTier(SecondaryTierManager):
    """vLLM secondary tier over kvpool.

    Constructed by vLLM as cls(vllm_config=, primary_kv_view=, tier_type=,
    **params) or cls(offloading_spec, primary_kv_view, tier_type, **params);
    params are the tier's config entry minus "type":
        url, token, timeout_s (2.0), lease_ms (5000), namespace or
        namespace_prefix ("vllm"), model, kv_dtype, hash_algo,
        block_size (tokens per offloaded chunk), miss_ttl_s (1.0),
        failed_ttl_s (30.0), group (0), request_retain (true: a request's
        kv_transfer_params {"kvpool_retain_ms": MS} retains its blocks),
        prefill_tokens_per_s (unset: every hit is offered)
    Never raises, also when the pool is down.

    Every method runs on vLLM's scheduler thread and returns at once:
    lookups of unknown keys queue one MATCH per request (with a lease on
    the connection that then loads) and answer None until it completes;
    stores and loads run on worker threads and are reported by
    get_finished(), each job exactly once.
    """

    def __init__(self, *args, **params):
        config = params.pop("vllm_config", None) or params.pop("offloading_spec", None)
        view = params.pop("primary_kv_view", None)
        tier_type = params.pop("tier_type", None)
        if args:
            config = config if config is not None else args[0]
            if len(args) > 1 and view is None:
                view = args[1]
            if len(args) > 2 and tier_type is None:
                tier_type = args[2]
        self.tier_type = tier_type or TIER_TYPE
        self.params = params
        self.warn = RateLimitedLog(log)
        self._lock = threading.Lock()
        self._finished = collections.deque()
        self._outstanding = set()
        self._state = {}              # key -> (present, expiry monotonic)
        self._pending = {}            # key -> req_id, while a MATCH is in flight
        self._batch = collections.OrderedDict()  # req_id -> keys of this step
        self._batch_retain = {}       # req_id -> its retention (ms), for this step's MATCH
        self._last_key = collections.OrderedDict()   # req_id -> its last stored key
        self._drained = threading.Condition(self._lock)
        self._closed = False
        try:
            super().__init__(config, view, self.tier_type)
        except Exception:
            pass
        self._offloading_spec = config
        self._primary_kv_view = view
        who = "kvpool.vllm tier"
        _cfg.check_keys(params, _TIER_KEYS, who)
        self.url = _cfg.url(params.get("url"), who)
        self.lease_ms = _cfg.milliseconds(params.get("lease_ms"), who, "lease_ms",
                                          DEFAULT_LEASE_MS)
        self.miss_ttl_s = _cfg.seconds(params.get("miss_ttl_s"), who, "miss_ttl_s", 1.0,
                                       allow_zero=True)
        self.failed_ttl_s = _cfg.seconds(params.get("failed_ttl_s"), who, "failed_ttl_s", 30.0,
                                         allow_zero=True)
        self.group = _cfg.integer(params.get("group"), who, "group", 0)
        for key in ("retain_first_blocks", "retain_ms"):
            if params.get(key) is not None:
                raise _cfg.ConfigError(
                    "%s: %s: the tier's store jobs do not say where their blocks sit in "
                    "the prompt; retain per request instead (kv_transfer_params "
                    "{\"%s\": MS})" % (who, key, _policy.VLLM_REQUEST_FIELD))
        self.retain = _policy.RetainHints({"request_retain": params.get("request_retain")}, who)
        self.estimator = _policy.LoadEstimator.from_config(params, who)
        self.declined = 0             # lookups' hit blocks answered False by the estimator
        self.block_tokens = _cfg.integer(params.get("block_size"), who, "block_size", 0) or \
            int(getattr(getattr(getattr(config, "vllm_config", None) or config,
                                "cache_config", None), "block_size", 0) or 0)
        for key in ("namespace", "namespace_prefix", "model", "kv_dtype", "hash_algo"):
            _cfg.text(params.get(key), who, key)
        token = _cfg.token(params.get("token"), who, token_file=params.get("token_file"))
        timeout = _cfg.seconds(params.get("timeout_s"), who, "timeout_s", 2.0)
        self._rows = None
        try:
            self._rows = _Rows(view)
        except Exception as e:
            self.warn.warning("view", "kvpool.vllm: primary_kv_view unusable: %r", e)
        vc = getattr(config, "vllm_config", None) or config
        self.layout = tier_layout(vc)
        self.namespace = self.namespace_for(config, params, self._rows, self.layout)
        if not os.environ.get("PYTHONHASHSEED"):
            log.info("kvpool.vllm: PYTHONHASHSEED is not set: unless this vLLM hashes "
                     "deterministically, other instances cannot hit this one's blocks")
        self._read_link = Link(self.url, self.namespace, token=token, timeout_s=timeout,
                               name="vllm tier read " + self.namespace, warn=self.warn,
                               lease_ms=self.lease_ms)
        try:
            self._write_link = Link(self.url, self.namespace, token=token, timeout_s=timeout,
                                    name="vllm tier write " + self.namespace, warn=self.warn,
                                    block_bytes=self._rows.row_bytes if self._rows else None)
        except Exception:
            self._read_link.close()
            raise
        if self._rows is not None:
            for link in (self._read_link, self._write_link):
                link.register(self._rows.array)
        self._read = make_async_link(self._read_link, on_complete=self._done)
        self._write = make_async_link(self._write_link, on_complete=self._done)
        self._wake = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                         name="kvpool-vllm-lookup")
        self._flusher.start()

    @staticmethod
    def namespace_for(config, params, rows=None, layout=None):
        """<prefix>:<model>:<kv dtype>:<hash algo>:c<tokens per chunk>:g<group>
        :tp<n>pp<n>pcp<n>dcp<n>:<layout>:r<row bytes>, where <layout> is
        tier_layout() (attention backend, NHD/HND, kernel block): the rows
        are raw KV pages, so instances share blocks only when their page
        bytes agree. A configured `namespace` replaces the parts before
        <layout>; the layout and row size are always added."""
        vc = getattr(config, "vllm_config", None) or config
        base = None
        if params.get("namespace"):
            base, parts = str(params["namespace"]), []
        else:
            model, dtype = _model_dtype(vc, params, who="kvpool.vllm tier")
            tp, pp, pcp, dcp = _parallel(vc)
            chunk = params.get("block_size") or getattr(
                getattr(vc, "cache_config", None), "block_size", 0)
            parts = [params.get("namespace_prefix") or "vllm", model, dtype,
                     _hash_algo(vc, params), "c%s" % chunk, "g%d" % int(params.get("group", 0)),
                     "tp%dpp%dpcp%ddcp%d" % (tp, pp, pcp, dcp)]
            kvo = kv_options_part(vc)
            if kvo:
                parts.append(kvo)
        if layout:
            parts.append(layout)
        if rows is not None:
            parts.append("r%d" % rows.row_bytes)
        return extend_namespace(base, *parts) if base else make_namespace(*parts)

    # ---- results ------------------------------------------------------------------------

    def _result(self, kind, value):
        if _LookupResult is None:
            return value
        name = {True: "HIT", False: "MISS", None: "RETRY"}[value]
        return getattr(_LookupResult, name, value)

    def _report(self, job_id, success):
        with self._lock:
            if job_id not in self._outstanding:
                return
            self._outstanding.discard(job_id)
            self._finished.append(JobResult(job_id, bool(success)))
            self._drained.notify_all()

    def _done(self, c):
        """An AsyncLink completion (on a worker thread)."""
        kind = c.tag[0]
        now = time.monotonic()
        if kind == "lookup":
            keys = c.tag[2]
            m = self._offer(c.matched if c.status == 0 else 0)
            with self._lock:
                for i, k in enumerate(keys):
                    self._pending.pop(k, None)
                    if i < m:
                        self._state[k] = (True, now + self.lease_ms / 1000.0 * 0.8)
                    elif i == m:
                        self._state[k] = (False, now + self.miss_ttl_s)
                    # keys past the first miss stay unknown: the prefix ends there
            if c.status and c.status != _link.DOWN:
                self.warn.warning("lookup", "kvpool.vllm: lookup failed: %s",
                                  _link.strerror_of(c.status))
        elif kind == "load":
            job_id, keys, row_bytes, t0 = c.tag[1], c.tag[2], c.tag[3], c.tag[4]
            ok = c.status == 0 and all(n == row_bytes for n in c.lengths) and \
                len(c.lengths) == len(keys)
            if ok:
                self.estimator.record_load(row_bytes * len(keys), now - t0)
            with self._lock:
                for k in keys:
                    if ok:
                        self._state.pop(k, None)
                    else:
                        self._state[k] = (False, now + self.failed_ttl_s)
            if not ok:
                self.warn.warning("load", "kvpool.vllm: load of %d chunks failed (%s): they "
                                  "answer False for %.0f s", len(keys),
                                  _link.strerror_of(c.status or -5), self.failed_ttl_s)
            self._report(job_id, ok)
        elif kind == "exists":       # store, step 1: which keys the pool lacks
            job_id, keys, bufs, parents = c.tag[1:5]
            if c.status == _link.DOWN:
                self._report(job_id, False)
                return
            need = [i for i, s in enumerate(c.statuses) if s != 0] if c.status == 0 else \
                list(range(len(keys)))
            if not need:
                self._report(job_id, True)
                return
            try:
                self._write.submit_put_many([keys[i] for i in need], [bufs[i] for i in need],
                                            [parents[i] for i in need],
                                            tag=("store", job_id))
            except Exception as e:
                self.warn.warning("store", "kvpool.vllm: store refused: %r", e)
                self._report(job_id, False)
        elif kind == "store":
            ok = c.status == 0 and all(s == 0 for s in c.statuses)
            if not ok:
                self.warn.warning("store", "kvpool.vllm: store failed: %s",
                                  _link.strerror_of(c.status or next(
                                      (s for s in c.statuses if s), -5)))
            self._report(c.tag[1], ok)

    # ---- SecondaryTierManager ------------------------------------------------------------

    def lookup(self, key, req_context=None):
        """True: held (and pinned for the load); False: absent, failed to
        load lately, or the pool is down; None: asked, answer next step."""
        try:
            k = block_key(key, None)
            now = time.monotonic()
            with self._lock:
                st = self._state.get(k)
                if st is not None:
                    if st[1] > now:
                        return self._result("lookup", st[0])
                    del self._state[k]
                if k in self._pending:
                    return self._result("lookup", None)
            if not self._read_link.up:
                return self._result("lookup", False)
            req = getattr(req_context, "req_id", None)
            ms = self._retain_of(req_context)
            with self._lock:
                self._pending[k] = req
                self._batch.setdefault(req, []).append(k)
                if ms:
                    self._batch_retain[req] = ms
                self._wake.set()
            return self._result("lookup", None)
        except Exception as e:
            self.warn.warning("lookup", "kvpool.vllm: lookup: %r", e)
            return self._result("lookup", False)

    def _flush_loop(self):
        """Send the lookups gathered in a step as one MATCH per request.
        Lookups of a step come in one tight loop on the scheduler thread,
        so waiting half a millisecond after the first gathers them."""
        while True:
            self._wake.wait()
            if self._closed:
                return
            time.sleep(0.0005)
            with self._lock:
                self._wake.clear()
                batches, self._batch = list(self._batch.items()), collections.OrderedDict()
                retain, self._batch_retain = self._batch_retain, {}
                if len(self._state) > _MAX_STATE:
                    now = time.monotonic()
                    for k in [k for k, (_, exp) in self._state.items() if exp <= now]:
                        del self._state[k]
            for req, keys in batches:
                try:
                    ms = retain.get(req, 0)
                    if ms:      # the request's retention, refreshed on the run it hits
                        self._read.submit_match(keys, self.lease_ms, tag=("lookup", req, keys),
                                                retain_ms=ms)
                    else:
                        self._read.submit_match(keys, self.lease_ms, tag=("lookup", req, keys))
                except Exception as e:
                    self.warn.warning("lookup", "kvpool.vllm: lookup refused: %r", e)
                    with self._lock:
                        for k in keys:
                            self._pending.pop(k, None)
                            self._state[k] = (False, time.monotonic() + self.miss_ttl_s)

    def batch_lookup(self, keys, req_context=None):
        """Newer vLLM's AsyncLookupManager runs this on a thread of its own:
        a list of bools, the leading run held by the pool (pinned)."""
        n = 0
        try:
            keys = list(keys)
            n = len(keys)
            ks = [block_key(k, None) for k in keys]
            ms = self._retain_of(req_context)
            m = self._read_link.match("batch_lookup", ks, self.lease_ms, retain_ms=ms or 0)
            m = self._offer(m if isinstance(m, int) else 0)
            return [i < m for i in range(len(ks))]
        except Exception as e:
            self.warn.warning("lookup", "kvpool.vllm: batch_lookup: %r", e)
            return [False] * n

    def _offer(self, matched):
        """The leading blocks of a hit of `matched` to answer True: all of
        them, or none when the estimator expects recomputing them to be
        faster than loading (prefill_tokens_per_s)."""
        if not matched or not self.estimator.enabled or self._rows is None or \
                not self.block_tokens:
            return matched
        n = self.estimator.offer(matched, self._rows.row_bytes, self.block_tokens)
        self.declined += matched - n
        return n

    def _retain_of(self, req_context):
        """The retention (ms, 0: none) a request's kv_transfer_params ask
        for ({"kvpool_retain_ms": MS}); a value that is no retention is
        ignored (logged once)."""
        params = getattr(req_context, "kv_transfer_params", None)
        if not isinstance(params, dict):
            return 0
        return self.retain.request_ms(params.get(_policy.VLLM_REQUEST_FIELD)) or 0

    def _job(self, job):
        job_id = getattr(job, "job_id")
        keys = [block_key(k, None) for k in getattr(job, "keys")]
        ids = getattr(job, "block_ids", None)
        if ids is None:
            ids = getattr(job, "chunk_ids")
        ids = [int(b) for b in ids]
        with self._lock:
            self._outstanding.add(job_id)
        return job_id, keys, ids

    def submit_store(self, job):
        """Copy the rows at job.block_ids to the pool (asynchronously); the
        keys the pool already holds are skipped. Reported by get_finished()."""
        job_id = getattr(job, "job_id", None)
        try:
            job_id, keys, ids = self._job(job)
            if not keys:
                return self._report(job_id, True)
            if self._rows is None or len(ids) != len(keys):
                return self._report(job_id, False)
            bufs = [self._rows.row(b) for b in ids]
            req = getattr(getattr(job, "req_context", None), "req_id", None)
            with self._lock:
                first_parent = self._last_key.get(req) if req is not None else None
                if req is not None:
                    self._last_key[req] = keys[-1]
                    self._last_key.move_to_end(req)
                    while len(self._last_key) > _MAX_REQUESTS:   # finished ones never told
                        self._last_key.popitem(last=False)
            parents = [first_parent] + keys[:-1]
            ms = self._retain_of(getattr(job, "req_context", None))
            if ms:
                # every block, so that those already stored get the retention too
                self._write.submit_put_many(keys, bufs, parents, tag=("store", job_id),
                                            retain_ms=ms)
            else:
                self._write.submit_exists_many(keys, tag=("exists", job_id, keys, bufs,
                                                          parents))
        except Exception as e:
            self.warn.warning("store", "kvpool.vllm: submit_store: %r", e)
            if job_id is not None:
                with self._lock:
                    self._outstanding.add(job_id)
                self._report(job_id, False)

    def submit_load(self, job):
        """Fill the rows at job.block_ids from the pool (asynchronously).
        Success only if every row arrived whole; a failed load makes its
        keys answer False for failed_ttl_s."""
        job_id = getattr(job, "job_id", None)
        try:
            job_id, keys, ids = self._job(job)
            if not keys:
                return self._report(job_id, True)
            if self._rows is None or len(ids) != len(keys):
                return self._report(job_id, False)
            bufs = [self._rows.row(b) for b in ids]
            self._read.submit_get_into_many(keys, bufs, tag=("load", job_id, keys,
                                                             self._rows.row_bytes,
                                                             time.monotonic()))
        except Exception as e:
            self.warn.warning("load", "kvpool.vllm: submit_load: %r", e)
            if job_id is not None:
                with self._lock:
                    self._outstanding.add(job_id)
                self._report(job_id, False)

    def get_finished(self):
        """Jobs finished since the last call, each reported once."""
        with self._lock:
            out = list(self._finished)
            self._finished.clear()
        return out

    def get_finished_jobs(self):
        """Newer vLLM's name for get_finished()."""
        return self.get_finished()

    def drain_jobs(self, timeout=None):
        """Block until every submitted job has been reported by a
        get_finished() call's source (the results stay queued for it)."""
        with self._lock:
            self._drained.wait_for(lambda: not self._outstanding, timeout)

    def has_pending_work(self):
        with self._lock:
            return bool(self._outstanding or self._pending)

    def touch(self, keys, req_context=None):
        return None

    def on_new_request(self, req_context=None):
        return _RequestOffloadingContext() if _RequestOffloadingContext else None

    def get_request_offloading_context(self, req_context=None):
        return self.on_new_request(req_context)

    def request_finished(self, req_context=None):
        req = getattr(req_context, "req_id", None)
        with self._lock:
            self._last_key.pop(req, None)

    on_request_finished = request_finished

    def shutdown(self):
        """Stop the workers (after what is queued) and close the connections.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._flusher.join(timeout=5)
        for a in (self._read, self._write):
            a.close()
        for link in (self._read_link, self._write_link):
            link.close()


class _Rows:
    """Rows of vLLM's primary CPU region (a 2-D memoryview or array) as
    buffers at base + row * stride, without copying."""

    def __init__(self, view):
        import numpy
        arr = numpy.asarray(view)
        if arr.ndim != 2 or not arr.flags["C_CONTIGUOUS"]:
            raise ValueError("expected a C-contiguous 2-D region, got shape %s" % (arr.shape,))
        self.array = arr
        self.base = arr.ctypes.data
        self.rows = arr.shape[0]
        self.row_bytes = arr.strides[0]

    def row(self, i):
        if not 0 <= i < self.rows:
            raise IndexError("row %d of %d" % (i, self.rows))
        return raw_buffer(self.base + i * self.row_bytes, self.row_bytes)


__all__ = ["KVPoolSecondaryTier", "register", "JobResult", "USING_REAL_TIER_BASE", "TIER_TYPE"]
