"""kvpool as a vLLM KV connector (KVPoolConnector, a KVConnectorBase_V1),
for vLLM releases without the tiering layer, or to hand KV from one
instance to another:

    --kv-transfer-config '{"kv_connector": "KVPoolConnector",
        "kv_connector_module_path": "kvpool.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": "tcp://pool:7470"}}'

Keys: vLLM's block hashes (see kvpool.vllm._keys); a kvpool block is a
chunk of vLLM blocks of one worker, keyed by its last block's hash. No
entry point raises into vLLM when the pool is down, slow or full: the
scheduler answers (0, False) and failed loads are reported for recompute.
"""

import logging
import threading

from .._adapters import config as _cfg
from .._adapters import link as _link
from .._adapters.keys import make_namespace
from .._adapters.link import Link, RateLimitedLog
from . import _layout
from ._keys import DEFAULT_LEASE_MS, _hash_algo, _import, _model_dtype, _parallel, block_key

log = logging.getLogger("kvpool.vllm")

INTERFACE_CONNECTOR = "vLLM KVConnectorBase_V1 (vllm-project/vllm 9aaf83ef, 2026-05-19)"


# ---- route B: a KV connector ------------------------------------------------------------

_conn_base = _import("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1")
_conn_role = _import("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorRole")
_conn_meta = _import("vllm.distributed.kv_transfer.kv_connector.v1.base",
                     "KVConnectorMetadata")
_worker_meta = _import("vllm.distributed.kv_transfer.kv_connector.v1.base",
                       "KVConnectorWorkerMetadata")
_supports_hma = _import("vllm.distributed.kv_transfer.kv_connector.v1.base", "SupportsHMA")


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

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None


KVConnectorBase_V1 = _conn_base or _FallbackConnectorBase
USING_REAL_CONNECTOR_BASE = _conn_base is not None
# vLLM keeps its hybrid KV-cache manager on only for a SupportsHMA connector
_BASES = (KVConnectorBase_V1,) + ((_supports_hma,) if _supports_hma is not None else ())
_POLICY_WARNED = []        # warn once per process about kv_load_failure_policy "fail"


class KVPoolConnectorMetadata(_conn_meta or object):
    """What the scheduler tells the workers each step.

    loads:  [(req_id, [chunk key], [chunk])]: fill these blocks
    stores: [(req_id, [chunk key], [chunk], parent key or None)]: store them
    acked:  ranks whose layout verdict the scheduler has (they stop sending it)
    A chunk is a tuple with one list of chunk_blocks KV-manager block ids
    per KV-cache group (block 0 is vLLM's null block: nothing there).
    """

    def __init__(self):
        self.loads = []
        self.stores = []
        self.acked = frozenset()


class KVPoolWorkerMetadata(_worker_meta or object):
    """What workers tell the scheduler (build_connector_worker_meta):
    verdicts = {rank: (served, layout tag or the reason it is refused)},
    merged across workers by aggregate()."""

    def __init__(self, verdicts=None):
        self.verdicts = dict(verdicts or {})

    def aggregate(self, other):
        merged = dict(self.verdicts)
        merged.update(getattr(other, "verdicts", None) or {})
        return KVPoolWorkerMetadata(merged)

    def __repr__(self):
        return "KVPoolWorkerMetadata(%r)" % self.verdicts


def _is_scheduler(role):
    name = getattr(role, "name", None) or str(role)
    return "SCHEDULER" in name.upper() or role == 0


def _groups_of(ids):
    """Block ids as one list per KV-cache group (vLLM passes a tuple of
    lists with the hybrid manager, or a plain list)."""
    if not ids:
        return []
    if isinstance(ids[0], (list, tuple)):
        return [list(g) for g in ids]
    return [list(ids)]


class _ReqState:
    __slots__ = ("request", "asked", "computed", "answer", "block_ids", "stored", "load_from",
                 "loads")

    def __init__(self, request):
        self.request = request
        self.asked = None        # num_computed_tokens of the last question
        self.computed = 0        # tokens computed (or loaded) before this step
        self.answer = (0, False)
        self.block_ids = []      # one list per KV-cache group
        self.stored = 0          # chunks stored or loaded (need no store)
        self.load_from = 0
        self.loads = 0


class KVPoolConnector(*_BASES):
    """vLLM KV connector over kvpool. One instance in the scheduler process
    (role SCHEDULER), one in each worker (role WORKER).

    kv_connector_extra_config: url, token or token_file, timeout_s (2.0),
    lease_ms (5000), chunk_blocks (1: KV-manager blocks per kvpool block),
    namespace_prefix ("vllm-conn"), model, kv_dtype, hash_algo,
    stage_through_host (false; always on for KV caches in GPU memory),
    scheduler_timeout_s (0.5: the scheduler's MATCHes block its thread).
    A value that cannot work raises ConfigError here, at start.

    Roles (kv_transfer_config.kv_role): kv_producer stores and never
    loads, kv_consumer loads and never stores, kv_both does both.
    kv_transfer_config.kv_load_failure_policy is read: an instance that
    loads with "fail" (vLLM's default) is warned about once, at start.

    Blocks: a kvpool block is a chunk of chunk_blocks KV-manager blocks of
    one worker in the canonical layout of kvpool.vllm._layout (every
    layer's K and V, tokens in order), keyed by the hash of the chunk's last
    block, in that worker's namespace (...:r<rank>:<layout>). The
    scheduler MATCHes every rank's namespace and takes the MIN; an MLA
    model stores one copy (TP rank 0) that every rank reads.

    Save and load paths (kept apart for later uses such as a
    prefill-to-decode hand-off): the scheduler decides, in
    build_connector_meta, which chunks each worker loads (the hits it
    offered, into the blocks vLLM allocated) and stores (prompt chunks
    complete after this step); the worker loads them in start_load_kv
    (_load) and stores them in wait_for_save (_save), both synchronous.
    A failed load is reported by get_block_ids_with_load_errors, never
    raised.

    Layouts: every KV cache vLLM's attention backends allocate (FlashAttention,
    FlashInfer, Triton, FlexAttention, the CPU backend, MLA; NHD and HND;
    kernel blocks equal to or smaller than the manager block; the hybrid
    manager's full-attention and sliding-window groups) is read through its
    strides into one canonical byte layout. What cannot be served (Mamba or
    cross-attention groups, padded or packed caches, context parallelism)
    is refused: the workers store and load nothing and the scheduler
    offers no hit. The scheduler offers hits only once every worker has
    said (build_connector_worker_meta) that its KV caches are served.
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
        extra = getattr(ktc, "kv_connector_extra_config", None) or {}
        if not isinstance(extra, dict):
            raise _cfg.ConfigError("kvpool.vllm: kv_connector_extra_config must be a JSON "
                                   "object, not %r" % (extra,))
        extra = dict(extra)
        self.extra = extra
        who = "kvpool.vllm connector"
        self.warn = RateLimitedLog(log)
        self.url = _cfg.url(extra.get("url"), who)
        self.token = _cfg.token(extra.get("token"), who, token_file=extra.get("token_file"))
        self.timeout_s = _cfg.seconds(extra.get("timeout_s"), who, "timeout_s", 2.0)
        self.lease_ms = _cfg.milliseconds(extra.get("lease_ms"), who, "lease_ms",
                                          DEFAULT_LEASE_MS)
        self.scheduler_timeout_s = _cfg.seconds(extra.get("scheduler_timeout_s"), who,
                                                "scheduler_timeout_s", 0.5)
        self.chunk_blocks = _cfg.integer(extra.get("chunk_blocks"), who, "chunk_blocks", 1, 1)
        self.force_stage = _cfg.flag(extra.get("stage_through_host"), who,
                                     "stage_through_host", False)
        _cfg.text(extra.get("namespace_prefix"), who, "namespace_prefix")
        self.role_name = str(getattr(ktc, "kv_role", None) or "kv_both")
        if self.role_name not in ("kv_producer", "kv_consumer", "kv_both"):
            raise _cfg.ConfigError("%s: kv_role must be kv_producer, kv_consumer or kv_both, "
                                   "not %r" % (who, self.role_name))
        self.loads = self.role_name in ("kv_consumer", "kv_both")
        self.stores = self.role_name in ("kv_producer", "kv_both")
        self.failure_policy = str(getattr(ktc, "kv_load_failure_policy", None) or "fail")
        self.layout = _layout.ModelLayout(kv_cache_config)
        cc = getattr(vllm_config, "cache_config", None)
        self.block_size = self.layout.block_size or int(getattr(cc, "block_size", 16) or 16)
        hb = getattr(cc, "hash_block_size", None) if self.layout.groups > 1 else None
        self.hash_block = int(hb) if hb else self.block_size
        self.chunk_tokens = self.block_size * self.chunk_blocks
        self.tp, self.pp, self.pcp, self.dcp = _parallel(vllm_config)
        pc = getattr(vllm_config, "parallel_config", None)
        self.rank = _cfg.integer(extra.get("rank", getattr(pc, "rank", 0) or 0), who, "rank", 0)
        self.is_mla = self.layout.served and self.layout.is_mla
        self.refused = None                    # why nothing is served, or None
        if not self.layout.served:
            self.refused = self.layout.why
        elif self.pcp * self.dcp > 1:
            self.refused = "context parallelism (pcp %d, dcp %d)" % (self.pcp, self.dcp)
        elif self.block_size % self.hash_block:
            self.refused = "a hash block of %d tokens for KV blocks of %d" % (
                self.hash_block, self.block_size)
        self.scheduler = _is_scheduler(role)
        self._links = {}
        self._links_lock = threading.Lock()
        self._reqs = {}
        self._load_errors = set()
        self._layers = None
        self._verdict = None                   # this worker's (served, tag or reason)
        self._acked = False
        self._verdicts = {}                    # scheduler: rank -> verdict
        self._confirm = _worker_meta is not None or _conn_base is None
        self.stage = self.force_stage
        self._staging = None
        self._closed = False
        if self.refused:
            log.warning("kvpool.vllm: %s: not served (%s): this instance stores and loads "
                        "nothing through kvpool", "scheduler" if self.scheduler else
                        "worker %d" % self.rank, self.refused)
        if self.scheduler and self.loads and self.failure_policy == "fail" and \
                not _POLICY_WARNED:
            _POLICY_WARNED.append(True)
            log.warning("kvpool.vllm: kv_load_failure_policy is \"fail\" (vLLM's default): a "
                        "request whose blocks cannot be loaded from the pool (lost or evicted "
                        "after the scheduler's MATCH) fails; set \"kv_load_failure_policy\": "
                        "\"recompute\" in --kv-transfer-config to recompute them instead")
        # connect now: a configuration kvpool_connect refuses fails at start
        if not self.refused:
            for rank in (self._ranks() if self.scheduler else [self._own_rank()]):
                self._link(rank)

    # ---- namespaces and links -----------------------------------------------------------

    def namespace_for_rank(self, rank):
        """<prefix>:<model>:<kv dtype>:<hash algo>:c<chunk tokens>:tp<n>pp<n>
        :r<rank>:<layout> (MLA: mla-pp<stage> instead of r<rank>, so every
        TP rank shares rank 0's copy). <layout> names the canonical byte
        layout (kvpool.vllm._layout: layers, heads, head size; a digest
        for several groups or mixed layers)."""
        model, dtype = _model_dtype(self._vllm_config, self.extra)
        if self.layout.served and not self.extra.get("kv_dtype"):
            dtype = _layout._dtype_name(self.layout.dtype)
        parts = [self.extra.get("namespace_prefix") or "vllm-conn", model, dtype,
                 _hash_algo(self._vllm_config, self.extra), "c%d" % self.chunk_tokens,
                 "tp%dpp%d" % (self.tp, self.pp)]
        if self.is_mla:
            parts.append("mla-pp%d" % (rank // max(self.tp, 1)))
        else:
            parts.append("r%d" % rank)
        parts.append(self.layout.tag or "unserved")
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
                                name="vllm connector " + ns, warn=self.warn,
                                lease_ms=self.lease_ms if self.scheduler else None)
                    self._links[rank] = link
        return link

    def _own_rank(self):
        return (self.rank // max(self.tp, 1)) * self.tp if self.is_mla else self.rank

    def _ranks(self):
        """The ranks whose namespaces the scheduler MATCHes."""
        if self.is_mla:
            return [pp * self.tp for pp in range(self.pp)]
        return list(range(self.tp * self.pp))

    def _chunk_keys(self, request):
        hashes = list(getattr(request, "block_hashes", None) or [])
        per = self.chunk_tokens // self.hash_block     # hashes per chunk
        return [block_key(hashes[i + per - 1]) for i in range(0, len(hashes) - per + 1, per)]

    # ---- scheduler side ---------------------------------------------------------------------

    def _serving(self):
        """True when every worker has said its KV caches are served."""
        if self.refused:
            return False
        if not self._confirm:
            return True
        want = set(range(self.tp * self.pp))
        return want.issubset(r for r, v in self._verdicts.items() if v[0])

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens loadable beyond num_computed_tokens, False): whole chunks
        every rank holds, at most the chunk-aligned len(prompt) - 1. The
        same answer when asked again for the same request and tokens.
        (0, False) for a producer, for a layout not served, and until
        every worker has confirmed its layout."""
        try:
            if not self.loads or not self._serving():
                return (0, False)
            req_id = request.request_id
            st = self._reqs.get(req_id)
            if st is None:
                st = self._reqs[req_id] = _ReqState(request)
            if st.asked == num_computed_tokens:
                return st.answer
            st.asked = num_computed_tokens
            st.answer = (0, False)
            st.loads = 0
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
                st.block_ids = _groups_of(ids)
            st.loads = (num_external_tokens or 0) // self.chunk_tokens
            st.computed = (st.asked or 0) + (num_external_tokens or 0)
        except Exception as e:
            self.warn.warning("alloc", "kvpool.vllm: update_state_after_alloc: %r", e)

    def _chunk(self, st, c):
        n = self.chunk_blocks
        return tuple(g[c * n:(c + 1) * n] for g in st.block_ids)

    def build_connector_meta(self, scheduler_output):
        """This step's loads (requests given external tokens) and stores
        (prompt chunks complete after this step, not loaded, not stored;
        none for a consumer or a layout not served)."""
        meta = KVPoolConnectorMetadata()
        try:
            meta.acked = frozenset(self._verdicts)
            n = self.chunk_blocks
            sched = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
            for req_id in getattr(scheduler_output, "finished_req_ids", None) or ():
                self._reqs.pop(req_id, None)
            for new in getattr(scheduler_output, "scheduled_new_reqs", None) or []:
                st = self._reqs.get(new.req_id)
                if st is None:
                    continue
                ids = _groups_of(new.block_ids)
                if ids:
                    st.block_ids = ids
                if getattr(new, "num_computed_tokens", None) is not None:
                    st.computed = int(new.num_computed_tokens)
            cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
            for i, req_id in enumerate(getattr(cached, "req_ids", None) or []):
                st = self._reqs.get(req_id)
                new_ids = (getattr(cached, "new_block_ids", None) or [None] * (i + 1))[i]
                if st is None:
                    continue
                for g, more in enumerate(_groups_of(new_ids)):
                    if g < len(st.block_ids):
                        st.block_ids[g].extend(more)
                    else:
                        st.block_ids.append(list(more))
                done = getattr(cached, "num_computed_tokens", None)
                if done is not None and i < len(done):
                    st.computed = int(done[i])
            if self.refused:
                return meta
            for req_id, st in self._reqs.items():
                keys = self._chunk_keys(st.request)
                if st.loads:
                    lo = st.load_from
                    chunks = range(lo, lo + st.loads)
                    have = min((len(g) for g in st.block_ids), default=0) // n
                    if lo + st.loads <= have and lo + st.loads <= len(keys):
                        meta.loads.append((req_id, [keys[c] for c in chunks],
                                           [self._chunk(st, c) for c in chunks]))
                    else:
                        self.warn.warning("meta", "kvpool.vllm: request %s: %d chunks to "
                                          "load but blocks for %d", req_id, lo + st.loads, have)
                    st.stored = max(st.stored, lo + st.loads)
                    st.loads = 0
                if req_id not in sched:
                    continue
                done_tokens = st.computed + int(sched[req_id])
                prompt = len(getattr(st.request, "prompt_token_ids", None) or [])
                upto = min(done_tokens, prompt) // self.chunk_tokens
                have = min((len(g) for g in st.block_ids), default=0) // n
                upto = min(upto, len(keys), have)
                first = max(st.stored, st.computed // self.chunk_tokens)
                if self.stores and upto > first:
                    chunks = range(first, upto)
                    meta.stores.append((req_id, [keys[c] for c in chunks],
                                        [self._chunk(st, c) for c in chunks],
                                        keys[first - 1] if first > 0 else None))
                st.stored = max(st.stored, upto)
                st.computed = done_tokens
        except Exception as e:
            self.warn.warning("meta", "kvpool.vllm: build_connector_meta: %r", e)
        return meta

    def request_finished(self, request, block_ids=None):
        """(False, None): stores are done in wait_for_save, so no block is held."""
        self._reqs.pop(getattr(request, "request_id", None), None)
        return False, None

    def request_finished_all_groups(self, request, block_ids=None):
        """SupportsHMA: the same as request_finished, for every KV-cache group."""
        return self.request_finished(request, block_ids)

    def update_connector_output(self, connector_output):
        """Take the workers' layout verdicts (KVPoolWorkerMetadata)."""
        try:
            wm = getattr(connector_output, "kv_connector_worker_meta", None)
            verdicts = getattr(wm, "verdicts", None)
            if not verdicts:
                return None
            for rank, (served, what) in verdicts.items():
                if rank in self._verdicts:
                    continue
                self._verdicts[rank] = (bool(served), what)
                if not served:
                    log.warning("kvpool.vllm: worker %s refused its KV caches (%s): this "
                                "instance offers no kvpool hits", rank, what)
                elif what != self.layout.tag:
                    self._verdicts[rank] = (False, what)
                    log.warning("kvpool.vllm: worker %s lays out %s, the scheduler %s: no "
                                "kvpool hits", rank, what, self.layout.tag)
        except Exception as e:
            self.warn.warning("output", "kvpool.vllm: update_connector_output: %r", e)
        return None

    def take_events(self):
        return ()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config=None):
        """None: every layout is read through its strides."""
        return None

    # ---- worker side ---------------------------------------------------------------------------

    def _backends(self, names):
        """{layer name: attention backend} from the static forward context
        (what vLLM's get_layers_from_vllm_config reads), where known."""
        out = {}
        cc = getattr(self._vllm_config, "compilation_config", None)
        ctx = getattr(cc, "static_forward_context", None) or {}
        for name in names:
            layer = ctx.get(name) if hasattr(ctx, "get") else None
            fn = getattr(layer, "get_attn_backend", None)
            if fn is not None:
                try:
                    out[name] = fn()
                except Exception as e:
                    log.debug("kvpool.vllm: %s.get_attn_backend(): %r", name, e)
        return out

    def register_kv_caches(self, kv_caches):
        """Check each layer's KV cache against the layout the scheduler
        names (ModelLayout) and find its canonical bytes (LayerLayout). A
        layer that does not match refuses the whole instance: this worker
        then stores and loads nothing, and tells the scheduler so."""
        try:
            if self.refused:
                raise ValueError(self.refused)
            cache_dtype = str(getattr(getattr(self._vllm_config, "cache_config", None),
                                      "cache_dtype", "auto") or "auto")
            missing = [s.name for s in self.layout.layers if s.name not in kv_caches]
            if missing:
                raise ValueError("no KV cache for layer(s) %s" % ", ".join(missing[:4]))
            backends = self._backends([s.name for s in self.layout.layers])
            layers = []
            for spec in self.layout.layers:
                t = kv_caches[spec.name]
                if isinstance(t, (list, tuple)):
                    raise ValueError("layer %s: a list of state tensors" % spec.name)
                dims = None
                if spec.name in backends:
                    dims = _layout.backend_dims(backends[spec.name], spec.kind, cache_dtype)
                layers.append(_layout.LayerLayout(t, spec, self.block_size,
                                                  self.layout.num_blocks, dims))
            self._layers = layers
            self.stage = self.force_stage or any(x.device_type != "cpu" or not x.dense
                                                 for x in layers)
            if not self.stage:
                link = self._link(self._own_rank())
                seen = set()
                for layer in layers:
                    if layer.base not in seen:
                        seen.add(layer.base)
                        link.register(layer.tensor)
            self._verdict = (True, self.layout.tag)
            log.info("kvpool.vllm: worker %d serves %d layers as %s (%s)", self.rank,
                     len(layers), self.layout.tag, "staged" if self.stage else "zero copy")
        except Exception as e:
            self._layers = None
            self._verdict = (False, str(e))
            log.warning("kvpool.vllm: worker %d: KV caches not served: %s (this instance "
                        "stores and loads nothing through kvpool; reuse is lost, no request "
                        "fails)", self.rank, e)

    def build_connector_worker_meta(self):
        """This worker's layout verdict, until the scheduler has it."""
        if self._verdict is None or self._acked:
            return None
        return KVPoolWorkerMetadata({self.rank: self._verdict})

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self.rank in (getattr(connector_metadata, "acked", None) or ()):
            self._acked = True

    # the bytes of a chunk, in canonical order

    def _segments(self, chunk):
        """[(layer, kv, block)] of a chunk in canonical order; block None
        for vLLM's null block (a sliding window's block out of the window)."""
        out = []
        for layer in self._layers:
            ids = chunk[layer.spec.group] if layer.spec.group < len(chunk) else []
            if len(ids) != self.chunk_blocks:
                raise ValueError("a chunk of %d blocks for group %d" % (len(ids),
                                                                       layer.spec.group))
            for kv in range(layer.kvn):
                for b in ids:
                    out.append((layer, kv, b if b else None))
        return out

    def _chunk_bytes(self):
        return self.layout.chunk_bytes(self.chunk_blocks)

    def _buffers(self, chunks):
        """Per chunk: what to put from / get into, and whether it goes
        through a staging row. KV caches in host memory whose canonical
        bytes are dense are used in place (a list of pieces); others (GPU
        memory, HND, null blocks, stage_through_host) use one row of a
        host staging buffer per chunk (pinned when CUDA is there), reused
        across calls."""
        size = self._chunk_bytes()
        out, staged = [], []
        for chunk in chunks:
            segs = self._segments(chunk)
            if not self.stage and all(b is not None for _, _, b in segs):
                spans = [sp for layer, kv, b in segs for sp in layer.spans(b, kv)]
                out.append(_layout.pieces(spans))
                staged.append(False)
            else:
                out.append(None)
                staged.append(True)
        need = sum(staged)
        if need:
            import torch
            st = self._staging
            if st is None or st.shape[0] < need or st.shape[1] != size:
                pin = bool(getattr(torch, "cuda", None) and torch.cuda.is_available())
                st = self._staging = torch.empty((max(need, 1), size), dtype=torch.uint8,
                                                 pin_memory=pin)
            row = 0
            for i, s in enumerate(staged):
                if s:
                    out[i] = st[row]
                    row += 1
        return out, staged, size

    def _stage(self, row, chunk):
        """Copy a chunk's KV (any layout, any device) into its staging row."""
        off = 0
        for layer, kv, b in self._segments(chunk):
            n = layer.segment_bytes
            if b is not None:
                v = layer.view(b, kv)
                row[off:off + n].view(v.dtype).view(v.shape).copy_(v)
            off += n

    def _unstage(self, row, chunk):
        """Copy a chunk's staging row into its blocks (null blocks skipped)."""
        off = 0
        for layer, kv, b in self._segments(chunk):
            n = layer.segment_bytes
            if b is not None:
                v = layer.view(b, kv)
                v.copy_(row[off:off + n].view(v.dtype).view(v.shape))
            off += n

    @staticmethod
    def _block_ids(chunk):
        return [b for g in chunk for b in g if b]

    def start_load_kv(self, forward_context=None, **kwargs):
        """Load this step's chunks into their blocks (before the forward
        pass). A chunk that does not arrive whole is a load error."""
        try:
            meta = self._get_connector_metadata()
        except Exception:
            return
        try:
            if not meta or not getattr(meta, "loads", None):
                return
            for req_id, keys, chunks in meta.loads:
                self._load(keys, chunks)
        except Exception as e:
            self.warn.warning("load", "kvpool.vllm: start_load_kv: %r", e)
            for _, _, chunks in getattr(meta, "loads", None) or ():
                for chunk in chunks:
                    self._load_errors.update(self._block_ids(chunk))

    def _load(self, keys, chunks):
        """The load path: get each chunk into its blocks; failures are
        recorded for get_block_ids_with_load_errors."""
        if self._layers is None or not self.loads:
            for chunk in chunks:
                self._load_errors.update(self._block_ids(chunk))
            return
        link = self._link(self._own_rank())
        bufs, staged, size = self._buffers(chunks)
        st = _link.statuses_or(link.call("load", lambda c: c.get_into_many(keys, bufs),
                                         None), len(keys))
        failed = 0
        for i, chunk in enumerate(chunks):
            if st[i] != size:
                failed += 1
                self._load_errors.update(self._block_ids(chunk))
            elif staged[i]:
                self._unstage(bufs[i], chunk)
        if failed and self.failure_policy == "fail":
            self.warn.warning("loadfail", "kvpool.vllm: %d of %d chunks did not load (first "
                              "status %d); with kv_load_failure_policy \"fail\" their requests "
                              "fail", failed, len(chunks), next(s for s in st if s != size))

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None, **kwargs):
        return None

    def wait_for_save(self):
        """Store this step's complete chunks (after the forward pass); the
        keys the pool already holds are skipped. MLA: only TP rank 0 writes;
        a consumer never writes."""
        try:
            meta = self._get_connector_metadata()
        except Exception:
            return
        try:
            if not meta or not getattr(meta, "stores", None) or self._layers is None:
                return
            if not self.stores or (self.is_mla and self.rank % max(self.tp, 1) != 0):
                return
            for req_id, keys, chunks, parent in meta.stores:
                self._save(keys, chunks, parent)
        except Exception as e:
            self.warn.warning("save", "kvpool.vllm: wait_for_save: %r", e)

    def _save(self, keys, chunks, parent):
        """The save path: put the chunks the pool lacks, chained from
        `parent` (the request's previous chunk)."""
        # a chunk with a null block (out of a sliding window) cannot be stored
        # whole, nor can any after it (they would never be matched)
        for i, chunk in enumerate(chunks):
            if any(not b for g in chunk for b in g):
                keys, chunks = keys[:i], chunks[:i]
                break
        if not keys:
            return
        link = self._link(self._own_rank())
        have = link.call("exists", lambda c: c.exists_many(keys), None)
        if have is None:
            return
        need = [i for i, h in enumerate(have) if not h]
        if not need:
            return
        ks = [keys[i] for i in need]
        bufs, staged, _ = self._buffers([chunks[i] for i in need])
        for j, i in enumerate(need):
            if staged[j]:
                self._stage(bufs[j], chunks[i])
        parents = [keys[i - 1] if i > 0 else parent for i in need]
        st = link.call("save", lambda c: _link.put_rerooting(c, ks, bufs, parents), None)
        if st is not None and any(st):
            self.warn.warning("save", "kvpool.vllm: %d of %d chunks not stored (first status "
                              "%d)", sum(1 for s in st if s), len(st), next(s for s in st if s))

    def get_finished(self, finished_req_ids=None):
        return None, None

    def get_block_ids_with_load_errors(self):
        """The blocks whose load failed since the last call (then cleared)."""
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self):
        """Close every connection. Idempotent."""
        with self._links_lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()


__all__ = ["KVPoolConnector", "KVPoolConnectorMetadata", "KVPoolWorkerMetadata",
           "USING_REAL_CONNECTOR_BASE"]
