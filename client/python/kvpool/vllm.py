"""kvpool for vLLM: a secondary tier of the offloading tiering manager
(KVPoolSecondaryTier) and, for releases without tiering, a KV connector
(KVPoolConnector, a KVConnectorBase_V1).

Tier (vLLM with v1/kv_offload/tiering):

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
          "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8e9,
          "block_size": 64, "eviction_policy": "lru",
          "secondary_tiers": [{"type": "kvpool", "url": "tcp://pool:7470"}]}}'

  "type": "kvpool" is registered by kvpool.vllm.register() (a
  vllm.general_plugins entry point of the installed package); releases
  that take {"type": "KVPoolSecondaryTier", "module_path": "kvpool.vllm"}
  need no registration.

Connector:

    --kv-transfer-config '{"kv_connector": "KVPoolConnector",
        "kv_connector_module_path": "kvpool.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": "tcp://pool:7470"}}'

Keys: vLLM's block hashes, 32 bytes (sha256, sha256_cbor) as they are,
16 bytes (xxhash, xxhash_cbor) zero-padded to 32; the parent of a block
is the previous block's hash. Instances that share a pool need the same
hash algorithm and seed (PYTHONHASHSEED). Namespaces: see
namespace_for(); docs/engines.md has the full mapping.

No entry point raises into vLLM when the pool is down, slow or full:
lookups answer False, jobs fail (JobResult(success=False)), the connector
answers (0, False) and reports load errors for recompute.
"""

import collections
import hashlib
import logging
import os
import threading
import time

from . import _engine
from ._engine import Link, RateLimitedLog, make_namespace, pad_key, raw_buffer
from ._engine_async import make_async_link

log = logging.getLogger("kvpool.vllm")

INTERFACE_TIER = ("vLLM SecondaryTierManager (vllm-project/vllm 9aaf83ef, 2026-05-19; "
                  "also the later (offloading_spec, view, tier_type) constructor)")
INTERFACE_CONNECTOR = "vLLM KVConnectorBase_V1 (vllm-project/vllm 9aaf83ef, 2026-05-19)"
DEFAULT_URL = "tcp://127.0.0.1:7470"
DEFAULT_LEASE_MS = 30000
TIER_TYPE = "kvpool"
_MAX_STATE = 200000       # cached lookup answers before expired ones are pruned
_MAX_REQUESTS = 100000    # requests whose last stored key is remembered


def _import(module, name):
    try:
        mod = __import__(module, fromlist=[name])
        return getattr(mod, name)
    except Exception as e:
        log.debug("kvpool.vllm: %s.%s not importable (%s)", module, name, e)
        return None


# ---- keys and namespaces --------------------------------------------------------------

def block_key(h, group=None):
    """A vLLM block hash (or an OffloadKey: hash + 4-byte big-endian group
    index) as a 32-byte kvpool key. Group 0 (or none) keys are the hash,
    zero-padded when 16 bytes; another group's key is the SHA-256 of the
    group index and the hash, so groups never share keys."""
    b = bytes(h)
    if group is None and len(b) in (20, 36):
        b, group = b[:-4], int.from_bytes(b[-4:], "big")
    if group:
        return hashlib.sha256(b"vllm-group" + int(group).to_bytes(4, "big") + b).digest()
    return pad_key(b)


def _hash_algo(vllm_config, params):
    return (params.get("hash_algo") or
            getattr(getattr(vllm_config, "cache_config", None), "prefix_caching_hash_algo", None)
            or "sha256")


def _model_dtype(vllm_config, params):
    mc = getattr(vllm_config, "model_config", None)
    cc = getattr(vllm_config, "cache_config", None)
    model = params.get("model") or getattr(mc, "served_model_name", None) or \
        getattr(mc, "model", None) or "unknown-model"
    if isinstance(model, (list, tuple)):
        model = model[0]
    dtype = params.get("kv_dtype") or getattr(cc, "cache_dtype", None) or "auto"
    if dtype == "auto":
        dtype = str(getattr(mc, "dtype", "auto"))
    return str(model), str(dtype).replace("torch.", "")


def _parallel(vllm_config):
    pc = getattr(vllm_config, "parallel_config", None)
    get = lambda n: int(getattr(pc, n, 1) or 1)  # noqa: E731
    return (get("tensor_parallel_size"), get("pipeline_parallel_size"),
            get("prefill_context_parallel_size"), get("decode_context_parallel_size"))


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
        factory.register_tier(TIER_TYPE, __name__, "KVPoolSecondaryTier")
        return True
    except Exception as e:       # already registered (a second call) or refused
        log.debug("kvpool.vllm: register_tier: %r", e)
        return False


class KVPoolSecondaryTier(SecondaryTierManager):
    """vLLM secondary tier over kvpool.

    Constructed by vLLM as cls(vllm_config=, primary_kv_view=, tier_type=,
    **params) or cls(offloading_spec, primary_kv_view, tier_type, **params);
    params are the tier's config entry minus "type":
        url, token, timeout_s (2.0), lease_ms (30000), namespace or
        namespace_prefix ("vllm"), model, kv_dtype, hash_algo,
        block_size (tokens per offloaded chunk), miss_ttl_s (1.0),
        failed_ttl_s (30.0), group (0)
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
        self._last_key = collections.OrderedDict()   # req_id -> its last stored key
        self._drained = threading.Condition(self._lock)
        self._closed = False
        try:
            super().__init__(config, view, self.tier_type)
        except Exception:
            pass
        self._offloading_spec = config
        self._primary_kv_view = view
        self.url = str(params.get("url") or DEFAULT_URL)
        self.lease_ms = int(params.get("lease_ms", DEFAULT_LEASE_MS))
        self.miss_ttl_s = float(params.get("miss_ttl_s", 1.0))
        self.failed_ttl_s = float(params.get("failed_ttl_s", 30.0))
        self.group = int(params.get("group", 0))
        self._rows = None
        try:
            self._rows = _Rows(view)
        except Exception as e:
            self.warn.warning("view", "kvpool.vllm: primary_kv_view unusable: %r", e)
        self.namespace = params.get("namespace") or self.namespace_for(config, params,
                                                                       self._rows)
        if not os.environ.get("PYTHONHASHSEED"):
            log.info("kvpool.vllm: PYTHONHASHSEED is not set: unless this vLLM hashes "
                     "deterministically, other instances cannot hit this one's blocks")
        token = params.get("token")
        timeout = float(params.get("timeout_s", 2.0))
        self._read_link = Link(self.url, self.namespace, token=token, timeout_s=timeout,
                               name="vllm tier read " + self.namespace, warn=self.warn)
        self._write_link = Link(self.url, self.namespace, token=token, timeout_s=timeout,
                                name="vllm tier write " + self.namespace, warn=self.warn)
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
    def namespace_for(config, params, rows=None):
        """vllm:<model>:<kv dtype>:<hash algo>:c<tokens per chunk>:g<group>
        :tp<n>pp<n>pcp<n>dcp<n>:r<row bytes> (the primary row holds every
        TP worker's shard, so the row size pins the layout)."""
        vc = getattr(config, "vllm_config", None) or config
        model, dtype = _model_dtype(vc, params)
        tp, pp, pcp, dcp = _parallel(vc)
        chunk = params.get("block_size") or getattr(
            getattr(vc, "cache_config", None), "block_size", 0)
        parts = [params.get("namespace_prefix") or "vllm", model, dtype,
                 _hash_algo(vc, params), "c%s" % chunk, "g%d" % int(params.get("group", 0)),
                 "tp%dpp%dpcp%ddcp%d" % (tp, pp, pcp, dcp)]
        if rows is not None:
            parts.append("r%d" % rows.row_bytes)
        return make_namespace(*parts)

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
            m = c.matched if c.status == 0 else 0
            with self._lock:
                for i, k in enumerate(keys):
                    self._pending.pop(k, None)
                    if i < m:
                        self._state[k] = (True, now + self.lease_ms / 1000.0 * 0.8)
                    elif i == m:
                        self._state[k] = (False, now + self.miss_ttl_s)
                    # keys past the first miss stay unknown: the prefix ends there
            if c.status and c.status != _engine.DOWN:
                self.warn.warning("lookup", "kvpool.vllm: lookup failed: %s",
                                  _engine.strerror_of(c.status))
        elif kind == "load":
            job_id, keys, row_bytes = c.tag[1], c.tag[2], c.tag[3]
            ok = c.status == 0 and all(n == row_bytes for n in c.lengths) and \
                len(c.lengths) == len(keys)
            with self._lock:
                for k in keys:
                    if ok:
                        self._state.pop(k, None)
                    else:
                        self._state[k] = (False, now + self.failed_ttl_s)
            if not ok:
                self.warn.warning("load", "kvpool.vllm: load of %d chunks failed (%s): they "
                                  "answer False for %.0f s", len(keys),
                                  _engine.strerror_of(c.status or -5), self.failed_ttl_s)
            self._report(job_id, ok)
        elif kind == "exists":       # store, step 1: which keys the pool lacks
            job_id, keys, bufs, parents = c.tag[1:5]
            if c.status == _engine.DOWN:
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
                                  _engine.strerror_of(c.status or next(
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
            with self._lock:
                self._pending[k] = req
                self._batch.setdefault(req, []).append(k)
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
                if len(self._state) > _MAX_STATE:
                    now = time.monotonic()
                    for k in [k for k, (_, exp) in self._state.items() if exp <= now]:
                        del self._state[k]
            for req, keys in batches:
                try:
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
        try:
            ks = [block_key(k, None) for k in keys]
            m = self._read_link.call("batch_lookup", lambda c: c.match(ks, self.lease_ms), 0)
            return [i < m for i in range(len(ks))]
        except Exception as e:
            self.warn.warning("lookup", "kvpool.vllm: batch_lookup: %r", e)
            return [False] * len(keys)

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
            self._write.submit_exists_many(keys, tag=("exists", job_id, keys, bufs, parents))
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
                                                             self._rows.row_bytes))
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


# ---- route B: a KV connector ------------------------------------------------------------

_conn_base = _import("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1")
_conn_role = _import("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorRole")
_conn_meta = _import("vllm.distributed.kv_transfer.kv_connector.v1.base",
                     "KVConnectorMetadata")


class _FallbackConnectorBase:
    """KVConnectorBase_V1 as the connector relies on it, used only when vLLM
    is not installed. Written from the contract."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._vllm_config = vllm_config
        self._role = role
        self._connector_metadata = None

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        return self._connector_metadata


KVConnectorBase_V1 = _conn_base or _FallbackConnectorBase
USING_REAL_CONNECTOR_BASE = _conn_base is not None


class KVPoolConnectorMetadata(_conn_meta or object):
    """What the scheduler tells the workers each step: loads and stores,
    each (req_id, [chunk key], [[block id] per chunk])."""

    def __init__(self):
        self.loads = []
        self.stores = []


def _is_scheduler(role):
    name = getattr(role, "name", None) or str(role)
    return "SCHEDULER" in name.upper() or role == 0


class _ReqState:
    __slots__ = ("request", "asked", "computed", "answer", "block_ids", "stored", "load_from",
                 "loads")

    def __init__(self, request):
        self.request = request
        self.asked = None        # num_computed_tokens of the last question
        self.computed = 0        # tokens computed (or loaded) before this step
        self.answer = (0, False)
        self.block_ids = []
        self.stored = 0          # chunks stored or loaded (need no store)
        self.load_from = 0
        self.loads = 0


class KVPoolConnector(KVConnectorBase_V1):
    """vLLM KV connector over kvpool (route B). One instance in the
    scheduler process (role SCHEDULER), one in each GPU worker.

    extra config (kv_connector_extra_config): url, token, timeout_s (2.0),
    lease_ms (30000), chunk_blocks (1: one kvpool block per vLLM block),
    namespace_prefix ("vllm-conn"), model, kv_dtype, hash_algo,
    stage_through_host (false; always on for KV caches in GPU memory),
    scheduler_timeout_s (0.5: the scheduler's MATCHes block its thread).

    A kvpool block is the chunk of chunk_blocks vLLM blocks of one worker
    (every layer's K and V), keyed by the hash of the chunk's last block,
    in that worker's namespace (...:r<rank>). The scheduler MATCHes every
    rank's namespace and takes the MIN; an MLA model stores one copy
    (rank 0) that every rank reads. Loads run in start_load_kv, saves in
    wait_for_save; failed loads are reported by
    get_block_ids_with_load_errors (set kv_load_failure_policy: recompute).
    """

    def __init__(self, vllm_config, role, kv_cache_config=None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:
            super().__init__(vllm_config, role)
        except Exception as e:
            log.warning("kvpool.vllm: connector base init: %r", e)
        self._vllm_config = vllm_config
        self._role = role
        self._kv_cache_config = kv_cache_config
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.extra = extra
        self.warn = RateLimitedLog(log)
        self.url = str(extra.get("url") or DEFAULT_URL)
        self.token = extra.get("token")
        self.timeout_s = float(extra.get("timeout_s", 2.0))
        self.lease_ms = int(extra.get("lease_ms", DEFAULT_LEASE_MS))
        self.scheduler_timeout_s = float(extra.get("scheduler_timeout_s", 0.5))
        self.chunk_blocks = max(1, int(extra.get("chunk_blocks", 1)))
        cc = getattr(vllm_config, "cache_config", None)
        self.block_size = int(getattr(cc, "block_size", 16) or 16)
        self.chunk_tokens = self.block_size * self.chunk_blocks
        self.tp, self.pp, self.pcp, self.dcp = _parallel(vllm_config)
        mc = getattr(vllm_config, "model_config", None)
        self.is_mla = bool(extra.get("use_mla", getattr(mc, "use_mla", False)))
        pc = getattr(vllm_config, "parallel_config", None)
        self.rank = int(extra.get("rank", getattr(pc, "rank", 0) or 0))
        self.scheduler = _is_scheduler(role)
        self._links = {}
        self._links_lock = threading.Lock()
        self._reqs = {}
        self._load_errors = set()
        self._layers = None
        self.force_stage = bool(extra.get("stage_through_host", False))
        self.stage = self.force_stage
        self._staging = None
        self._closed = False

    # ---- namespaces and links -----------------------------------------------------------

    def namespace_for_rank(self, rank):
        """vllm:<model>:<kv dtype>:<hash algo>:c<chunk tokens>:g0
        :tp<n>pp<n>pcp<n>dcp<n>:r<rank> (MLA: :mla instead of :r<rank>,
        so every TP rank shares rank 0's copy; the PP stage stays)."""
        model, dtype = _model_dtype(self._vllm_config, self.extra)
        parts = [self.extra.get("namespace_prefix") or "vllm-conn", model, dtype,
                 _hash_algo(self._vllm_config, self.extra), "c%d" % self.chunk_tokens, "g0",
                 "tp%dpp%dpcp%ddcp%d" % (self.tp, self.pp, self.pcp, self.dcp)]
        if self.is_mla:
            parts.append("mla-pp%d" % (rank // max(self.tp, 1)))
        else:
            parts.append("r%d" % rank)
        return make_namespace(*parts)

    def _link(self, rank):
        link = self._links.get(rank)
        if link is None:
            with self._links_lock:
                link = self._links.get(rank)
                if link is None and not self._closed:
                    ns = self.namespace_for_rank(rank)
                    # the scheduler thread waits for its MATCHes: a shorter budget
                    timeout = min(self.timeout_s, self.scheduler_timeout_s) \
                        if self.scheduler else self.timeout_s
                    link = Link(self.url, ns, token=self.token, timeout_s=timeout,
                                name="vllm connector " + ns, warn=self.warn)
                    self._links[rank] = link
        return link

    def _ranks(self):
        world = self.tp * self.pp
        if self.is_mla:
            return [pp * self.tp for pp in range(self.pp)]
        return list(range(world))

    def _chunk_keys(self, request):
        hashes = list(getattr(request, "block_hashes", None) or [])
        n = self.chunk_blocks
        return [block_key(hashes[i + n - 1]) for i in range(0, len(hashes) - n + 1, n)]

    # ---- scheduler side ---------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens loadable beyond num_computed_tokens, False): whole chunks
        every rank holds, at most the chunk-aligned len(prompt) - 1. The
        same answer when asked again for the same request and tokens."""
        try:
            req_id = request.request_id
            st = self._reqs.get(req_id)
            if st is None:
                st = self._reqs[req_id] = _ReqState(request)
            if st.asked == num_computed_tokens:
                return st.answer
            st.asked = num_computed_tokens
            st.answer = (0, False)
            if num_computed_tokens % self.chunk_tokens:
                return st.answer
            prompt = len(getattr(request, "prompt_token_ids", None) or []) or \
                int(getattr(request, "num_prompt_tokens", 0))
            total = int(getattr(request, "num_tokens", prompt) or prompt)
            limit = min(max(prompt - 1, 0), total) // self.chunk_tokens
            start = num_computed_tokens // self.chunk_tokens
            keys = self._chunk_keys(request)[start:limit]
            if not keys:
                return st.answer
            hit = len(keys)
            for rank in self._ranks():
                link = self._link(rank)
                m = link.call("match", lambda c: c.match(keys[:hit], self.lease_ms), 0)
                hit = min(hit, m if isinstance(m, int) else 0)
                if hit == 0:
                    break
            tokens = hit * self.chunk_tokens
            tokens = min(tokens, total - num_computed_tokens)
            tokens -= tokens % self.chunk_tokens
            st.answer = (tokens, False)
            st.load_from = start
            st.loads = tokens // self.chunk_tokens
            return st.answer
        except Exception as e:
            self.warn.warning("match", "kvpool.vllm: get_num_new_matched_tokens: %r", e)
            return (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Remember the request's blocks; the loads follow in the next
        build_connector_meta."""
        try:
            st = self._reqs.get(request.request_id)
            if st is None:
                st = self._reqs[request.request_id] = _ReqState(request)
            ids = blocks.get_block_ids() if blocks is not None else None
            if ids:
                ids = ids[0] if ids and isinstance(ids[0], (list, tuple)) else ids
                st.block_ids = list(ids)
            st.loads = (num_external_tokens or 0) // self.chunk_tokens
            st.computed = (st.asked or 0) + (num_external_tokens or 0)
        except Exception as e:
            self.warn.warning("alloc", "kvpool.vllm: update_state_after_alloc: %r", e)

    def build_connector_meta(self, scheduler_output):
        """This step's loads (requests given external tokens) and stores
        (prompt chunks complete after this step, not loaded, not stored)."""
        meta = KVPoolConnectorMetadata()
        try:
            n = self.chunk_blocks
            sched = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
            for new in getattr(scheduler_output, "scheduled_new_reqs", None) or []:
                st = self._reqs.get(new.req_id)
                if st is None:
                    continue
                ids = new.block_ids[0] if new.block_ids and isinstance(
                    new.block_ids[0], (list, tuple)) else list(new.block_ids or [])
                if ids:
                    st.block_ids = list(ids)
                if getattr(new, "num_computed_tokens", None) is not None:
                    st.computed = int(new.num_computed_tokens)
            cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
            for i, req_id in enumerate(getattr(cached, "req_ids", None) or []):
                st = self._reqs.get(req_id)
                new_ids = (getattr(cached, "new_block_ids", None) or [None] * (i + 1))[i]
                if st is None:
                    continue
                if new_ids:
                    new_ids = new_ids[0] if isinstance(new_ids[0], (list, tuple)) else new_ids
                    st.block_ids.extend(new_ids)
                done = getattr(cached, "num_computed_tokens", None)
                if done is not None and i < len(done):
                    st.computed = int(done[i])
            for req_id, st in self._reqs.items():
                keys = self._chunk_keys(st.request)
                if st.loads:
                    lo = st.load_from
                    chunks = range(lo, lo + st.loads)
                    meta.loads.append((req_id, [keys[c] for c in chunks],
                                       [st.block_ids[c * n:(c + 1) * n] for c in chunks]))
                    st.stored = max(st.stored, lo + st.loads)
                    st.loads = 0
                if req_id not in sched:
                    continue
                done_tokens = st.computed + int(sched[req_id])
                prompt = len(getattr(st.request, "prompt_token_ids", None) or [])
                upto = min(done_tokens, prompt) // self.chunk_tokens
                upto = min(upto, len(keys), len(st.block_ids) // n)
                first = max(st.stored, st.computed // self.chunk_tokens)
                if upto > first:
                    chunks = range(first, upto)
                    meta.stores.append((req_id, [keys[c] for c in chunks],
                                        [st.block_ids[c * n:(c + 1) * n] for c in chunks],
                                        keys[first - 1] if first > 0 else None))
                    st.stored = upto
                st.computed = done_tokens
        except Exception as e:
            self.warn.warning("meta", "kvpool.vllm: build_connector_meta: %r", e)
        return meta

    def request_finished(self, request, block_ids=None):
        """(False, None): stores are done in wait_for_save, so no block is held."""
        self._reqs.pop(getattr(request, "request_id", None), None)
        return False, None

    def update_connector_output(self, connector_output):
        return None

    def take_events(self):
        return ()

    def get_required_kvcache_layout(self, vllm_config=None):
        return None

    # ---- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        """Read each layer's KV tensor shape: (2, blocks, ...) gives a K and a
        V piece per block, (blocks, ...) one piece (MLA, or K/V packed)."""
        try:
            num_blocks = int(getattr(self._kv_cache_config, "num_blocks", 0) or getattr(
                getattr(self._vllm_config, "cache_config", None), "num_gpu_blocks", 0) or 0)
            layers = []
            for name, t in kv_caches.items():
                layers.append(_LayerPieces(name, t, num_blocks))
            self._layers = layers
            self.stage = self.force_stage or any(x.device_type != "cpu" for x in layers)
            if layers and not self.stage:
                link = self._link(self.rank)
                for layer in layers:
                    link.register(layer.tensor)
        except Exception as e:
            self._layers = None
            self.warn.warning("register", "kvpool.vllm: register_kv_caches: %r "
                              "(every load will fail, every save is skipped)", e)

    def _chunk_pieces(self, block_ids):
        return [p for b in block_ids for layer in self._layers for p in layer.pieces(b)]

    def _chunk_bytes(self, block_ids):
        return sum(v.numel() * v.element_size() for b in block_ids for layer in self._layers
                   for v in layer.views(b))

    def _buffers(self, chunks):
        """Per chunk (a list of block ids): what to put from / get into, and
        its size. Host KV caches: the blocks' own memory, piece by piece.
        Device KV caches (or stage_through_host): one row of a host staging
        buffer per chunk (pinned when CUDA is there), reused across calls."""
        if not self.stage:
            bufs = [self._chunk_pieces(bl) for bl in chunks]
            return bufs, [sum(memoryview(p).nbytes for p in buf) for buf in bufs]
        import torch
        size = self._chunk_bytes(chunks[0]) if chunks else 0
        st = self._staging
        if st is None or st.shape[0] < len(chunks) or st.shape[1] != size:
            pin = torch.cuda.is_available() if hasattr(torch, "cuda") else False
            st = self._staging = torch.empty((max(len(chunks), 1), size), dtype=torch.uint8,
                                             pin_memory=pin)
        return [st[i] for i in range(len(chunks))], [size] * len(chunks)

    def _stage(self, row, block_ids):
        """Copy a chunk's blocks (device) into its staging row (host)."""
        off = 0
        for b in block_ids:
            for layer in self._layers:
                for v in layer.views(b):
                    n = v.numel() * v.element_size()
                    row[off:off + n].copy_(v.reshape(-1).view(row.dtype))
                    off += n

    def _unstage(self, row, block_ids):
        """Copy a chunk's staging row (host) into its blocks (device)."""
        off = 0
        for b in block_ids:
            for layer in self._layers:
                for v in layer.views(b):
                    n = v.numel() * v.element_size()
                    v.copy_(row[off:off + n].view(v.dtype).view(v.shape))
                    off += n

    def start_load_kv(self, forward_context=None, **kwargs):
        """Load this step's chunks into their GPU blocks (before the forward
        pass). A chunk that does not arrive whole is a load error."""
        try:
            meta = self._get_connector_metadata()
            if not meta or not getattr(meta, "loads", None):
                return
            link = self._link(self.rank)
            for req_id, keys, blocks in meta.loads:
                if self._layers is None:
                    self._load_errors.update(b for bl in blocks for b in bl)
                    continue
                bufs, sizes = self._buffers(blocks)
                st = _engine.statuses_or(link.call("load", lambda c: c.get_into_many(keys, bufs),
                                                   None), len(keys))
                for i, bl in enumerate(blocks):
                    if st[i] != sizes[i]:
                        self._load_errors.update(bl)
                    elif self.stage:
                        self._unstage(bufs[i], bl)
        except Exception as e:
            self.warn.warning("load", "kvpool.vllm: start_load_kv: %r", e)

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None, **kwargs):
        return None

    def wait_for_save(self):
        """Store this step's complete chunks (after the forward pass); the
        keys the pool already holds are skipped. MLA: only rank 0 writes."""
        try:
            meta = self._get_connector_metadata()
            if not meta or not getattr(meta, "stores", None) or self._layers is None:
                return
            if self.is_mla and self.rank % max(self.tp, 1) != 0:
                return
            link = self._link(self.rank)
            for req_id, keys, blocks, parent in meta.stores:
                have = link.call("exists", lambda c: c.exists_many(keys), None)
                if have is None:
                    continue
                need = [i for i, h in enumerate(have) if not h]
                if not need:
                    continue
                ks = [keys[i] for i in need]
                bufs, _ = self._buffers([blocks[i] for i in need])
                if self.stage:
                    for buf, i in zip(bufs, need):
                        self._stage(buf, blocks[i])
                parents = [keys[i - 1] if i > 0 else parent for i in need]
                st = link.call("save", lambda c: _engine.put_rerooting(c, ks, bufs, parents),
                               None)
                if st is not None and any(st):
                    self.warn.warning("save", "kvpool.vllm: %d of %d chunks not stored "
                                      "(first status %d)", sum(1 for s in st if s), len(st),
                                      next(s for s in st if s))
        except Exception as e:
            self.warn.warning("save", "kvpool.vllm: wait_for_save: %r", e)

    def get_finished(self, finished_req_ids=None):
        return None, None

    def get_block_ids_with_load_errors(self):
        """The GPU blocks whose load failed since the last call (then cleared)."""
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self):
        """Close every connection. Idempotent."""
        with self._links_lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()


class _LayerPieces:
    """One layer's KV tensor: the memory of block b as one piece (MLA or
    (blocks, 2, ...) layouts) or a K and a V piece ((2, blocks, ...))."""

    def __init__(self, name, t, num_blocks):
        self.name = name
        self.tensor = t
        device = getattr(t, "device", None)
        self.device_type = getattr(device, "type", "cpu")
        shape = tuple(t.shape)
        strides = tuple(t.stride())
        es = t.element_size()
        if len(shape) >= 2 and shape[0] == 2 and (not num_blocks or shape[1] == num_blocks) \
                and shape[1] != 2:
            self.split = True
            self.block_stride = strides[1] * es
            self.kv_stride = strides[0] * es
            inner = shape[2:]
            inner_strides = strides[2:]
        else:
            self.split = False
            self.block_stride = strides[0] * es
            inner = shape[1:]
            inner_strides = strides[1:]
        expect = 1
        for dim, stride in zip(reversed(inner), reversed(inner_strides)):
            if dim > 1 and stride != expect:
                raise ValueError("layer %s: a block is not contiguous (shape %s strides %s)"
                                 % (name, shape, strides))
            expect *= dim
        self.piece_bytes = expect * es
        self.base = t.data_ptr()
        self.blocks = shape[1] if self.split else shape[0]

    def views(self, b):
        """The tensors of block b (device memory: staged through the host)."""
        if not 0 <= b < self.blocks:
            raise IndexError("block %d of %d" % (b, self.blocks))
        if self.split:
            return [self.tensor[0, b], self.tensor[1, b]]
        return [self.tensor[b]]

    def pieces(self, b):
        if not 0 <= b < self.blocks:
            raise IndexError("block %d of %d" % (b, self.blocks))
        a = self.base + b * self.block_stride
        if self.split:
            return [raw_buffer(a, self.piece_bytes),
                    raw_buffer(a + self.kv_stride, self.piece_bytes)]
        return [raw_buffer(a, self.piece_bytes)]


__all__ = ["KVPoolSecondaryTier", "KVPoolConnector", "KVPoolConnectorMetadata", "register",
           "block_key", "USING_REAL_TIER_BASE", "USING_REAL_CONNECTOR_BASE"]
