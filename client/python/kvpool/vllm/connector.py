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

Prefill-to-decode hand-off (vLLM's disaggregated flow, driven by its
proxy's kv_transfer_params): a request with do_remote_decode is stored
in full by the prefill instance (kv_producer), whose blocks are freed
once the pool has acknowledged them; a request with do_remote_prefill is
loaded asynchronously by the decode instance (kv_consumer), whose
workers wait on the pool for its blocks (one MATCH that waits, at most
pd_wait_ms), then report it finished receiving, with the blocks that did
not arrive for kv_load_failure_policy to decide about.
"""

import logging
import threading
import time

from .._adapters import config as _cfg
from .._adapters import link as _link
from .._adapters import policy as _policy
from .._adapters.keys import make_namespace
from .._adapters.link import Link, RateLimitedLog
from . import _layout, _pd
from ._keys import (DEFAULT_LEASE_MS, _hash_algo, _import, _model_dtype, _parallel, block_key,
                    kv_options_part, worker_rank)

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
_CONNECTOR_KEYS = ("url", "token", "token_file", "timeout_s", "lease_ms", "chunk_blocks",
                   "namespace_prefix", "model", "kv_dtype", "hash_algo", "rank",
                   "stage_through_host", "scheduler_timeout_s", "scheduler_lease_ms", "pd_wait_ms", "pd_max_waits",
                   "pd_retain_ms", "staging_mb", "retain_first_blocks", "retain_ms",
                   "request_retain", "prefill_tokens_per_s")
MAX_CHUNK_BLOCKS = 1024    # KV-manager blocks per kvpool block


class KVPoolConnectorMetadata(_conn_meta or object):
    """What the scheduler tells the workers each step.

    loads:  [(req_id, [chunk key], [chunk])]: fill these blocks now
    recvs:  [(req_id, [chunk key], [chunk], wait_ms)]: fill these blocks
            in the background, waiting for the chunks up to wait_ms (a
            hand-off: pd_wait_ms, or less when the prefill instance's
            params say its PUTs end sooner); report the request finished
            receiving when done
    stores: [(req_id, [chunk key], [chunk], parent key or None[, retain_ms])]:
            store them (asynchronously); each entry is one store batch
    held:   requests whose blocks vLLM keeps for their store batches:
            report each finished sending once they are all done
    flush:  preempted requests: wait for their store batches before the
            step (their blocks are about to be reused)
    acked:  ranks whose layout verdict the scheduler has (they stop sending it)
    A chunk is a tuple with one list of chunk_blocks KV-manager block ids
    per KV-cache group (block 0 is vLLM's null block: nothing there).
    """

    def __init__(self):
        self.loads = []
        self.recvs = []
        self.stores = []
        self.held = frozenset()
        self.flush = frozenset()
        self.acked = frozenset()


class KVPoolWorkerMetadata(_worker_meta or object):
    """What workers tell the scheduler (build_connector_worker_meta):
    verdicts = {rank: (served, layout tag or the reason it is refused)};
    done = {rank: {req_id: store batches done so far}} (counts that
    changed); loads = [(bytes, seconds)] of the whole loads done since the
    last report (for the scheduler's load estimator). Merged across
    workers by aggregate()."""

    def __init__(self, verdicts=None, done=None, loads=None):
        self.verdicts = dict(verdicts or {})
        self.done = dict(done or {})
        self.loads = list(loads or [])

    def aggregate(self, other):
        merged = dict(self.verdicts)
        merged.update(getattr(other, "verdicts", None) or {})
        done = {r: dict(d) for r, d in self.done.items()}
        for r, d in (getattr(other, "done", None) or {}).items():
            mine = done.setdefault(r, {})
            for req, n in d.items():
                mine[req] = max(mine.get(req, 0), n)
        return KVPoolWorkerMetadata(merged, done, self.loads + list(getattr(other, "loads", None)
                                                                    or []))

    def __repr__(self):
        return "KVPoolWorkerMetadata(%r, done=%r, loads=%d)" % (self.verdicts, self.done,
                                                                len(self.loads))


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
                 "loads", "recv", "pd_used", "pd_first", "pd_wait_ms", "batches", "handoff",
                 "retain_ms", "matched_at")

    def __init__(self, request):
        self.request = request
        self.asked = None        # num_computed_tokens of the last question
        self.computed = 0        # tokens computed (or loaded) before this step
        self.answer = (0, False)
        self.block_ids = []      # one list per KV-cache group
        self.stored = 0          # chunks stored or loaded (need no store)
        self.load_from = 0
        self.loads = 0           # chunks to load now (the next step's meta)
        self.recv = 0            # chunks to load in the background (a hand-off)
        self.pd_used = False     # the hand-off load was given: never offered again
        self.pd_first = None     # when do_remote_prefill was first asked about
        self.pd_wait_ms = 0      # how long the hand-off load may wait for its chunks
        self.batches = 0         # store batches scheduled
        self.retain_ms = None    # the request's own retention (kv_transfer_params), or None
        self.matched_at = 0.0    # when the answer's MATCH leased its hit (monotonic s)
        params = getattr(request, "kv_transfer_params", None)
        # a prefill instance's hand-off: every prompt chunk goes to the pool
        self.handoff = bool(isinstance(params, dict) and params.get("do_remote_decode"))


def _cache_format(vllm_config):
    """cache_config.cache_dtype: "auto" or the KV format vLLM was started
    with (--kv-cache-dtype: fp8, fp8_e4m3, fp8_e5m2, ...)."""
    cc = getattr(vllm_config, "cache_config", None)
    return str(getattr(cc, "cache_dtype", None) or "auto").replace("torch.", "")


def _why_not_loaded(status, size):
    """Words for a chunk GET's status that is not the chunk's size."""
    if status >= 0:
        return "the pool's block has %d bytes, a chunk %d" % (status, size)
    return _link.strerror_of(status)


def _whole(x):
    """x is a whole number >= 0 (not a bool)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _params(request):
    p = getattr(request, "kv_transfer_params", None)
    return p if isinstance(p, dict) else {}


def _status_name(request):
    st = getattr(request, "status", None)
    return str(getattr(st, "name", st) or "")


class KVPoolConnector(*_BASES):
    """vLLM KV connector over kvpool. One instance in the scheduler process
    (role SCHEDULER), one in each worker (role WORKER).

    kv_connector_extra_config: url, token or token_file, timeout_s (2.0),
    lease_ms (5000), chunk_blocks (1: KV-manager blocks per kvpool block),
    namespace_prefix ("vllm-conn"), model, kv_dtype (only where vLLM says
    neither --kv-cache-dtype nor the KV-cache spec's dtype; one that
    contradicts what vLLM runs is a ConfigError), hash_algo,
    stage_through_host (false; always on for KV caches in GPU memory),
    scheduler_timeout_s (0.5: the scheduler's MATCHes block its thread),
    scheduler_lease_ms (1000, at most lease_ms: how long the scheduler's
    MATCH leases a hit; see get_num_new_matched_tokens),
    pd_wait_ms (30000: how long a decode instance's workers wait on the
    pool for a do_remote_prefill request's blocks), pd_max_waits (64:
    such waits at once per worker, one connection each), pd_retain_ms
    (0: the retention a prefill instance asks for the blocks it hands
    off; 0 = none), staging_mb (1024: host staging rows for stores and
    hand-off loads in flight, per worker), retain_first_blocks and
    retain_ms (store, and refresh on a hit, the first chunks of every
    prompt with a retention: the system prompt), request_retain (true: a
    request's kv_transfer_params {"kvpool_retain_ms": MS} retains its
    chunks), prefill_tokens_per_s (offer a hit only when loading it beats
    recomputing it; unset: every hit). The worker's rank is vLLM's
    (_keys.worker_rank): a "rank" setting that disagrees is refused.
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

    Save and load paths: the scheduler decides, in build_connector_meta,
    which chunks each worker loads (the hits it offered, into the blocks
    vLLM allocated) and stores (prompt chunks complete after this step).
    The worker loads hits synchronously in start_load_kv (_load). It
    stores in wait_for_save (_save) without waiting: the batch goes to
    a StorePipeline (kvpool.vllm._pd) on a connection of its own. The
    scheduler learns from the workers' metadata which store batches are
    done; request_finished holds a finished request's blocks (returns
    True) only while one of its batches is in flight, and the workers
    report it finished sending (get_finished) once they are. A failed
    load is reported by get_block_ids_with_load_errors, never raised.

    Hand-off (kv_transfer_params as vLLM's disaggregated proxy sets
    them): the prefill instance stores every prompt chunk of a request
    with do_remote_decode (local prefix hits too), and its
    request_finished answers {"do_remote_prefill": true,
    "do_remote_decode": false, "kvpool_tokens": N} for the decode
    instance. There, get_num_new_matched_tokens answers a request with
    do_remote_prefill with (its whole prompt chunks, True): an
    asynchronous load. Each worker's Receiver waits on the pool (one
    MATCH per request, up to pd_wait_ms, so the request may be sent to
    both instances at once), loads the chunks present, and reports the
    request finished receiving with the blocks that did not arrive.

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
        _cfg.check_keys(extra, _CONNECTOR_KEYS, who)
        self.warn = RateLimitedLog(log)
        self.url = _cfg.url(extra.get("url"), who)
        self.token = _cfg.token(extra.get("token"), who, token_file=extra.get("token_file"))
        self.timeout_s = _cfg.seconds(extra.get("timeout_s"), who, "timeout_s", 2.0)
        self.lease_ms = _cfg.milliseconds(extra.get("lease_ms"), who, "lease_ms",
                                          DEFAULT_LEASE_MS)
        self.scheduler_timeout_s = _cfg.seconds(extra.get("scheduler_timeout_s"), who,
                                                "scheduler_timeout_s", 0.5)
        self.scheduler_lease_ms = min(self.lease_ms, _cfg.milliseconds(
            extra.get("scheduler_lease_ms"), who, "scheduler_lease_ms", 1000))
        self.pd_wait_ms = _cfg.milliseconds(extra.get("pd_wait_ms"), who, "pd_wait_ms", 30000)
        self.pd_max_waits = _cfg.integer(extra.get("pd_max_waits"), who, "pd_max_waits", 64,
                                         1, 4096)
        self.pd_retain_ms = _cfg.milliseconds(extra.get("pd_retain_ms"), who, "pd_retain_ms",
                                              0)
        self.staging_mb = _cfg.integer(extra.get("staging_mb"), who, "staging_mb", 1024, 1)
        self.chunk_blocks = _cfg.integer(extra.get("chunk_blocks"), who, "chunk_blocks", 1, 1,
                                         MAX_CHUNK_BLOCKS)
        self.force_stage = _cfg.flag(extra.get("stage_through_host"), who,
                                     "stage_through_host", False)
        # issue 29: retention hints for what is stored, and a load
        # estimator (fed by the workers' load timings) for what is offered
        self.retain = _policy.RetainHints(extra, who)
        self.estimator = _policy.LoadEstimator.from_config(extra, who)
        self._load_samples = []                # worker: (bytes, seconds) not reported yet
        for key in ("namespace_prefix", "model", "kv_dtype", "hash_algo"):
            _cfg.text(extra.get(key), who, key)
        self.role_name = str(getattr(ktc, "kv_role", None) or "kv_both")
        if self.role_name not in ("kv_producer", "kv_consumer", "kv_both"):
            raise _cfg.ConfigError("%s: kv_role must be kv_producer, kv_consumer or kv_both, "
                                   "not %r" % (who, self.role_name))
        self.loads = self.role_name in ("kv_consumer", "kv_both")
        self.stores = self.role_name in ("kv_producer", "kv_both")
        self.failure_policy = _cfg.choice(getattr(ktc, "kv_load_failure_policy", None), who,
                                          "kv_load_failure_policy", "fail", ("fail", "recompute"))
        self.layout = _layout.ModelLayout(kv_cache_config)
        # the namespace's dtype part is what vLLM runs: a kv_dtype setting
        # that contradicts it fails here, at start
        self._model_dtype()
        cc = getattr(vllm_config, "cache_config", None)
        self.block_size = self.layout.block_size or int(getattr(cc, "block_size", 16) or 16)
        hb = getattr(cc, "hash_block_size", None) if self.layout.groups > 1 else None
        self.hash_block = int(hb) if hb else self.block_size
        self.chunk_tokens = self.block_size * self.chunk_blocks
        self.tp, self.pp, self.pcp, self.dcp = _parallel(vllm_config)
        self.rank = worker_rank(vllm_config, extra.get("rank"), who)
        self.is_mla = self.layout.served and self.layout.is_mla
        self.refused = None                    # why nothing is served, or None
        if not self.layout.served:
            self.refused = self.layout.why
        elif self.pcp * self.dcp > 1:
            self.refused = "context parallelism (pcp %d, dcp %d)" % (self.pcp, self.dcp)
        elif self.is_mla and _cache_format(vllm_config).startswith("fp8") and \
                getattr(getattr(vllm_config, "cache_config", None), "calculate_kv_scales",
                        False):
            self.refused = ("an fp8 MLA KV cache whose scale each instance computes "
                            "(--calculate-kv-scales): two instances' bytes need not mean "
                            "the same values")
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
        # scheduler: hand-offs and store batches
        self._done = {}                        # req_id -> {rank: store batches done}
        self._held = set()                     # finished requests whose blocks are held
        self._announce = set()                 # ... not told to the workers yet
        self._warned = set()
        # worker: the asynchronous paths (kvpool.vllm._pd)
        self._ledger = _pd.StoreLedger()
        self._pipeline = None
        self._receiver = None
        self._rows = None                      # staging rows of batches in flight
        self._holding = set()                  # requests the scheduler holds for us
        self._arenas = []                      # KV cache tensors registered per connection
        self._recv_failed = []                 # hand-offs this worker cannot load
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
        model, dtype = self._model_dtype()
        parts = [self.extra.get("namespace_prefix") or "vllm-conn", model, dtype,
                 _hash_algo(self._vllm_config, self.extra), "c%d" % self.chunk_tokens,
                 "tp%dpp%d" % (self.tp, self.pp)]
        kvo = kv_options_part(self._vllm_config)
        if kvo:
            parts.append(kvo)
        if self.is_mla:
            parts.append("mla-pp%d" % (rank // max(self.tp, 1)))
        else:
            parts.append("r%d" % rank)
        parts.append(self._tag_of(rank) or "unserved")
        return make_namespace(*parts)

    def _model_dtype(self):
        """(model, kv dtype) parts of the namespace. The kv dtype is the KV
        format vLLM runs, not only how it is stored (vLLM stores every fp8
        format as uint8, and MLA's fp8 caches of two formats hold the same
        number of bytes): --kv-cache-dtype, else the KV-cache spec's dtype;
        the kv_dtype setting only where vLLM says neither. ConfigError
        for a kv_dtype that contradicts it."""
        return _model_dtype(self._vllm_config, self.extra,
                            self.layout.dtype if self.layout.served else None,
                            "kvpool.vllm connector")

    def _tag_of(self, rank):
        """The layout tag of rank's namespace. A worker names its own KV
        caches; the scheduler takes the tag the worker reported once it has
        (vLLM hands the scheduler one worker's kv_cache_config, with each
        UniformTypeKVCacheSpecs group collapsed to one layer's spec, so with
        per-layer head counts, or pipeline stages of different layer counts,
        the scheduler's own tag names another worker's layers), else its own."""
        if self.scheduler:
            v = self._verdicts.get(rank)
            if v is not None and v[0] and v[1]:
                return v[1]
        return self.layout.tag

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
                                lease_ms=self.scheduler_lease_ms if self.scheduler else None,
                                block_bytes=self._chunk_bytes() if self.layout.served else None)
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

    def _once(self, topic, fmt, *args):
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning(fmt, *args)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens loadable beyond num_computed_tokens, asynchronously?).

        A request with kv_transfer_params do_remote_prefill (a hand-off
        from a prefill instance): (every whole prompt chunk beyond
        num_computed_tokens, True), at once and without asking the pool:
        the workers wait for the chunks (pd_wait_ms) and load them in the
        background; offered once per request. (None, False), "ask again",
        while the workers have not said their layout is served, for at
        most pd_wait_ms.

        Other requests: (whole chunks every rank holds, False), at most the
        chunk-aligned len(prompt) - 1. The same answer when asked again
        for the same request and tokens. (0, False) for a producer, for a
        layout not served, and until every worker has confirmed its
        layout."""
        try:
            req_id = request.request_id
            st = self._reqs.get(req_id)
            if st is None:
                st = self._reqs[req_id] = self._new_state(request)
            if _params(request).get("do_remote_prefill") and not st.pd_used:
                return self._remote_prefill(request, st, num_computed_tokens)
            if not self.loads or not self._serving():
                return (0, False)
            if st.asked == num_computed_tokens and not st.answer[1] and (
                    not st.answer[0] or
                    time.monotonic() - st.matched_at < self.scheduler_lease_ms / 2000.0):
                return st.answer           # (a hit asked again once its lease is half gone)
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
                # a request's own retention is refreshed on the run it hits
                # The lease protects the hit from eviction between this MATCH
                # and the workers' GETs at the start of the step that loads it
                # (one engine step). The workers GET on their own connections,
                # which cannot end this connection's lease: it runs its whole
                # term, so it is kept short (scheduler_lease_ms), and a hit
                # the server's lease bound cuts or refuses is the run that
                # could be leased, or (recompute policy: a load that misses
                # costs a recompute, not the request) an unleased hit.
                m = link.match("match", keys[:hit], self.scheduler_lease_ms,
                               retain_ms=st.retain_ms or 0,
                               unleased=self.failure_policy == "recompute")
                hit = min(hit, m if isinstance(m, int) else 0)
                if hit == 0:
                    break
            self._refresh_first(keys, start, hit, st)
            if hit and self.estimator.enabled:
                hit = self.estimator.offer(hit, self.layout.chunk_bytes(self.chunk_blocks),
                                           self.chunk_tokens)
            tokens = hit * self.chunk_tokens
            tokens = min(tokens, total - num_computed_tokens)
            tokens -= tokens % self.chunk_tokens
            st.answer = (tokens, False)
            st.load_from = start
            st.matched_at = time.monotonic()
            return st.answer
        except Exception as e:
            self.warn.warning("match", "kvpool.vllm: get_num_new_matched_tokens: %r", e)
            return (0, False)

    def _new_state(self, request):
        st = _ReqState(request)
        # the request's own retention (request_retain), for its stores and hits
        st.retain_ms = self.retain.request_ms(_params(request).get(_policy.VLLM_REQUEST_FIELD))
        return st

    def _refresh_first(self, keys, start, hit, st):
        """retain_first_blocks: a hit on the prompt's first chunks extends
        their retention (they are loaded, not stored again, so no PUT would)."""
        if st.retain_ms is not None or not hit or start or not self.retain.first_blocks:
            return      # a request's own retention was refreshed by its MATCH already
        k = min(self.retain.first_blocks, hit)
        for rank in self._ranks():
            self._link(rank).call("retain", lambda c: c.match(keys[:k], 0,
                                                              retain_ms=self.retain.retain_ms), 0)

    def _remote_prefill(self, request, st, num_computed_tokens):
        """The hand-off answer (see get_num_new_matched_tokens)."""
        st.asked = num_computed_tokens
        if not self.loads:
            self._once("pd-producer", "kvpool.vllm: a request with do_remote_prefill reached a "
                       "kv_producer instance: it is computed here (use kv_consumer or kv_both "
                       "for decode instances)")
            st.pd_used = True
            st.answer = (0, False)
            return st.answer
        if self.refused:
            st.pd_used = True
            st.answer = (0, False)
            return st.answer
        if self.layout.groups > 1:
            # vLLM's scheduler handles reported load errors for one KV-cache group
            # only (local-inference-lab/vllm 28be48fa raises ValueError in
            # _update_requests_with_invalid_blocks with more): a hand-off that
            # times out must be able to report its blocks, so none is offered
            self._once("pd-hma", "kvpool.vllm: hand-off loads (do_remote_prefill) are not "
                       "offered on models with %d KV-cache groups: vLLM cannot recover "
                       "from a failed asynchronous load with several groups; these "
                       "requests are computed here", self.layout.groups)
            st.pd_used = True
            st.answer = (0, False)
            return st.answer
        if not self._serving():
            now = time.monotonic()
            if st.pd_first is None:
                st.pd_first = now
            if now - st.pd_first < self.pd_wait_ms / 1000.0 and \
                    not any(not v[0] for v in self._verdicts.values()):
                return (None, False)       # ask again once the workers have answered
            st.pd_used = True
            st.answer = (0, False)
            return st.answer
        st.answer = (0, False)
        if num_computed_tokens % self.chunk_tokens:
            return st.answer
        prompt = len(getattr(request, "prompt_token_ids", None) or []) or \
            int(getattr(request, "num_prompt_tokens", 0))
        total = int(getattr(request, "num_tokens", prompt) or prompt)
        limit = min(prompt, total) // self.chunk_tokens
        params = _params(request)
        handed = params.get("kvpool_tokens")
        st.pd_wait_ms = self.pd_wait_ms
        if _whole(handed):
            limit = min(limit, handed // self.chunk_tokens)
            # the prefill instance has finished and submitted its PUTs: wait
            # only as long as they can still take (kvpool_put_ms: 0 when
            # every one had ended), so blocks that were stored and then
            # evicted cost that bound, not pd_wait_ms, before the recompute
            put_ms = params.get("kvpool_put_ms")
            st.pd_wait_ms = min(self.pd_wait_ms, put_ms if _whole(put_ms) else
                                self._put_bound_ms())
        start = num_computed_tokens // self.chunk_tokens
        n = len(self._chunk_keys(request)[start:limit])
        if n > 0:
            st.answer = (n * self.chunk_tokens, True)
            st.load_from = start
        return st.answer

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Remember the request's blocks; the loads follow in the next
        build_connector_meta (an asynchronous answer: a hand-off load)."""
        try:
            st = self._reqs.get(request.request_id)
            if st is None:
                st = self._reqs[request.request_id] = self._new_state(request)
            ids = blocks.get_block_ids() if blocks is not None else None
            if ids:
                st.block_ids = _groups_of(ids)
            n = (num_external_tokens or 0) // self.chunk_tokens
            if st.answer[1] and not st.pd_used:
                st.pd_used = True              # one hand-off load per request
                st.recv, st.loads = n, 0
            else:
                st.loads = n
            st.computed = (st.asked or 0) + (num_external_tokens or 0)
        except Exception as e:
            self.warn.warning("alloc", "kvpool.vllm: update_state_after_alloc: %r", e)

    def _chunk(self, st, c):
        n = self.chunk_blocks
        return tuple(g[c * n:(c + 1) * n] for g in st.block_ids)

    def _confirmed(self, req_id, batches):
        """Every rank has reported `batches` store batches of req_id done."""
        done = self._done.get(req_id) or {}
        return all(done.get(r, 0) >= batches for r in range(self.tp * self.pp))

    def build_connector_meta(self, scheduler_output):
        """This step's loads (requests given external tokens; hand-off loads
        go to recvs) and stores (prompt chunks complete after this step,
        not loaded, not stored; none for a consumer or a layout not
        served), the requests held for their stores (held) and the
        preempted requests whose stores must end first (flush)."""
        meta = KVPoolConnectorMetadata()
        try:
            meta.acked = frozenset(self._verdicts)
            meta.held, self._announce = frozenset(self._announce), set()
            n = self.chunk_blocks
            sched = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
            for req_id in getattr(scheduler_output, "finished_req_ids", None) or ():
                self._reqs.pop(req_id, None)
            flush = set()
            for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
                st = self._reqs.get(req_id)
                if st is not None and st.batches and not self._confirmed(req_id, st.batches):
                    flush.add(req_id)
            meta.flush = frozenset(flush)
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
                for what in ("loads", "recv"):
                    count = getattr(st, what)
                    if not count:
                        continue
                    lo = st.load_from
                    chunks = range(lo, lo + count)
                    have = min((len(g) for g in st.block_ids), default=0) // n
                    if lo + count <= have and lo + count <= len(keys):
                        if what == "loads":
                            meta.loads.append((req_id, [keys[c] for c in chunks],
                                               [self._chunk(st, c) for c in chunks]))
                        else:
                            meta.recvs.append((req_id, [keys[c] for c in chunks],
                                               [self._chunk(st, c) for c in chunks],
                                               st.pd_wait_ms))
                    else:
                        self.warn.warning("meta", "kvpool.vllm: request %s: %d chunks to "
                                          "load but blocks for %d", req_id, lo + count, have)
                        if what == "recv":
                            # vLLM waits for this request's load: the workers must
                            # report it, with its blocks failed (no keys)
                            meta.recvs.append((req_id, [], [self._chunk(st, c) for c in
                                                            range(lo, min(lo + count, have))],
                                               0))
                    st.stored = max(st.stored, lo + count)
                    setattr(st, what, 0)
                if req_id not in sched:
                    continue
                done_tokens = st.computed + int(sched[req_id])
                prompt = len(getattr(st.request, "prompt_token_ids", None) or [])
                upto = min(done_tokens, prompt) // self.chunk_tokens
                have = min((len(g) for g in st.block_ids), default=0) // n
                upto = min(upto, len(keys), have)
                # a hand-off stores the local prefix hits too: the decode side needs them all
                first = st.stored if st.handoff else max(st.stored, st.computed // self.chunk_tokens)
                if self.stores and upto > first:
                    # one store batch per run of chunks with the same retention
                    # (a request's own, else the hand-off's, else the first
                    # chunks' retain_first_blocks; 0: an ordinary block)
                    ms = self.retain.for_blocks(first, upto - first, st.retain_ms)
                    if st.handoff:
                        ms = [max(m, self.pd_retain_ms) for m in ms]
                    lo = first
                    while lo < upto:
                        hi = lo + 1
                        while hi < upto and ms[hi - first] == ms[lo - first]:
                            hi += 1
                        chunks = range(lo, hi)
                        meta.stores.append((req_id, [keys[c] for c in chunks],
                                            [self._chunk(st, c) for c in chunks],
                                            keys[lo - 1] if lo > 0 else None,
                                            ms[lo - first]))
                        st.batches += 1
                        lo = hi
                st.stored = max(st.stored, upto)
                st.computed = done_tokens
        except Exception as e:
            self.warn.warning("meta", "kvpool.vllm: build_connector_meta: %r", e)
        return meta

    def request_finished(self, request, block_ids=None):
        """(hold, kv_transfer_params). hold is True while a store batch of
        the request is in flight on some worker: vLLM then keeps its blocks
        until every worker reports it finished sending (get_finished);
        otherwise they are freed at once. A request with do_remote_decode
        that finished normally gets the params the decode instance needs
        ({"do_remote_prefill": true, "do_remote_decode": false,
        "kvpool_tokens": prompt tokens handed to the pool}). Never waits."""
        try:
            req_id = getattr(request, "request_id", None)
            st = self._reqs.pop(req_id, None)
            hold = bool(st is not None and st.batches and not self._confirmed(req_id,
                                                                            st.batches))
            if hold:
                self._held.add(req_id)
                self._announce.add(req_id)
            else:
                self._done.pop(req_id, None)
            params = None
            if _params(request).get("do_remote_decode"):
                status = _status_name(request)
                if not self.stores:
                    self._once("pd-consumer", "kvpool.vllm: a request with do_remote_decode "
                               "reached an instance that does not store (kv_role %s): the "
                               "decode instance will compute it", self.role_name)
                elif "ABORT" not in status and "ERROR" not in status:
                    # a worker that refused its layout stored nothing (the verdicts
                    # of an instance's first step may still be on their way)
                    refused = any(not v[0] for v in self._verdicts.values())
                    handed = st.stored * self.chunk_tokens \
                        if st is not None and not refused else 0
                    # kvpool_put_ms: how long the PUTs of these tokens can still
                    # take (0: every one has ended), so that the decode side does
                    # not wait pd_wait_ms for blocks stored and then evicted
                    params = {"do_remote_prefill": True, "do_remote_decode": False,
                              "kvpool_tokens": handed,
                              "kvpool_put_ms": self._put_bound_ms() if hold and handed
                              else 0}
            return hold, params
        except Exception as e:
            self.warn.warning("finished", "kvpool.vllm: request_finished: %r", e)
            return False, None

    def _put_bound_ms(self):
        """How long a store batch submitted now can take at most (ms): its
        MATCH, its PUT and a PUT again as a root, each bounded by timeout_s
        from its submit (libkvpool's asynchronous calls)."""
        return int(_pd.STORE_CALLS * self.timeout_s * 1000 + 0.999)

    def request_finished_all_groups(self, request, block_ids=None):
        """SupportsHMA: the same as request_finished, for every KV-cache group."""
        return self.request_finished(request, block_ids)

    def update_connector_output(self, connector_output):
        """Take the workers' layout verdicts, store-batch counts and load
        timings (KVPoolWorkerMetadata), and forget the held requests vLLM
        has freed (finished_sending)."""
        try:
            for req_id in getattr(connector_output, "finished_sending", None) or ():
                self._held.discard(req_id)
                self._done.pop(req_id, None)
            wm = getattr(connector_output, "kv_connector_worker_meta", None)
            for nbytes, secs in getattr(wm, "loads", None) or ():
                self.estimator.record_load(nbytes, secs)
            for rank, per in (getattr(wm, "done", None) or {}).items():
                for req_id, count in per.items():
                    if req_id in self._reqs or req_id in self._held:
                        d = self._done.setdefault(req_id, {})
                        d[rank] = max(d.get(rank, 0), count)
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
                    # this worker's layers are not those of the config vLLM
                    # gave the scheduler: MATCH the namespace the worker writes
                    log.info("kvpool.vllm: worker %s lays out %s (the scheduler's config: %s); "
                             "its namespace is matched", rank, what, self.layout.tag)
                    with self._links_lock:
                        old = self._links.pop(rank, None)
                    if old is not None:
                        old.close()
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
                seen = set()
                for layer in layers:
                    if layer.base not in seen:
                        seen.add(layer.base)
                        self._arenas.append(layer.tensor)
                link = self._link(self._own_rank())
                for t in self._arenas:
                    link.register(t)
            self._rows = _pd.StagingRows(self._chunk_bytes(), self.staging_mb << 20)
            if self.stores and not (self.is_mla and self.rank % max(self.tp, 1) != 0):
                self._pipeline = _pd.StorePipeline(self._pd_link("store"), self._ledger,
                                                   self.warn)
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
        """This worker's layout verdict, until the scheduler has it, its
        store batches done since the last call, and the timings of its
        whole loads since then (the scheduler's load estimator learns from
        them)."""
        verdicts = {} if self._verdict is None or self._acked else {self.rank: self._verdict}
        done = self._ledger.report()
        loads, self._load_samples = self._load_samples, []
        if not verdicts and not done and not loads:
            return None
        return KVPoolWorkerMetadata(verdicts, {self.rank: done} if done else None, loads)

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self.rank in (getattr(connector_metadata, "acked", None) or ()):
            self._acked = True
        self._holding.update(getattr(connector_metadata, "held", None) or ())

    def _pd_link(self, what="hand-off"):
        """A connection of its own to this worker's namespace (the store
        pipeline's, with the KV cache arenas registered, or one hand-off
        wait's: up to pd_max_waits of those, so they register nothing and
        an RDMA transfer into host KV caches goes through the connection's
        staging buffer). Answers misses while the pool is down; never
        raises."""
        ns = self.namespace_for_rank(self._own_rank())
        link = Link(self.url, ns, token=self.token, timeout_s=self.timeout_s,
                    name="vllm connector %s %s" % (what, ns), warn=self.warn,
                    lease_ms=self.lease_ms, strict=False,
                    retain_ms=self.pd_retain_ms if what == "store" and self.stores else None)
        if what == "store":
            for t in self._arenas:
                link.register(t)
        return link

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

    def _async_buffers(self, chunks, store=False):
        """_buffers for a batch that outlives the call (a store in flight,
        a hand-off load): staging rows of its own, from the worker's
        StagingRows. (bufs, staged flags, rows taken) or (None, None, None)
        when the staging limit (staging_mb) is reached. A store of a model
        whose blocks vLLM may free while the request runs (a sliding-window
        or chunked-local group) is always staged: the copy is made now, in
        the step that computed the blocks, so a PUT still in flight when
        another request's forward reuses a freed block sends this
        request's bytes, not that one's."""
        out, staged = [], []
        in_place = not self.stage and not (store and self.layout.freed_early)
        for chunk in chunks:
            segs = self._segments(chunk)
            if in_place and all(b is not None for _, _, b in segs):
                spans = [sp for layer, kv, b in segs for sp in layer.spans(b, kv)]
                out.append(_layout.pieces(spans))
                staged.append(False)
            else:
                out.append(None)
                staged.append(True)
        rows = []
        need = sum(staged)
        if need:
            rows = self._rows.take(need) if self._rows is not None else None
            if rows is None:
                self.warn.warning("staging", "kvpool.vllm: %d MiB of staging rows in use "
                                  "(staging_mb): %d chunks skipped", self.staging_mb, need)
                return None, None, None
            it = iter(rows)
            out = [next(it) if s else b for b, s in zip(out, staged)]
        return out, staged, rows

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

    def _blocks_of(self, chunks):
        """The block ids of chunks (null blocks left out), as a set."""
        return {b for chunk in chunks for b in self._block_ids(chunk)}

    def handle_preemptions(self, kv_connector_metadata=None):
        """Before the step: wait for the store batches of the requests just
        preempted (meta.flush), whose blocks this step may reuse; bounded
        by 2 x timeout_s."""
        try:
            flush = getattr(kv_connector_metadata, "flush", None)
            if flush and not self._ledger.wait(flush, 2 * self.timeout_s):
                self.warn.warning("flush", "kvpool.vllm: stores of preempted requests still "
                                  "in flight after %.1f s", 2 * self.timeout_s)
        except Exception as e:
            self.warn.warning("flush", "kvpool.vllm: handle_preemptions: %r", e)

    def start_load_kv(self, forward_context=None, **kwargs):
        """Load this step's hits into their blocks (before the forward
        pass; a chunk that does not arrive whole is a load error), and hand
        this step's hand-off loads (recvs) to the Receiver, which loads
        them in the background."""
        try:
            meta = self._get_connector_metadata()
        except Exception:
            return
        if not meta:
            return
        if getattr(meta, "flush", None):
            self.handle_preemptions(meta)      # vLLM releases without that hook
        try:
            for entry in getattr(meta, "recvs", None) or ():
                self._recv(*entry)
        except Exception as e:
            self.warn.warning("recv", "kvpool.vllm: start_load_kv (hand-off): %r", e)
        try:
            if not getattr(meta, "loads", None):
                return
            for req_id, keys, chunks in meta.loads:
                self._load(keys, chunks)
        except Exception as e:
            self.warn.warning("load", "kvpool.vllm: start_load_kv: %r", e)
            for _, _, chunks in getattr(meta, "loads", None) or ():
                for chunk in chunks:
                    self._load_errors.update(self._block_ids(chunk))

    def _recv(self, req_id, keys, chunks, wait_ms=None):
        """Start a hand-off load that waits up to wait_ms (None: pd_wait_ms)
        for its chunks; a worker that cannot load reports the request at
        once, every block failed."""
        if self._layers is None or not self.loads or self._closed or \
                not keys or len(keys) != len(chunks):
            with self._links_lock:
                self._recv_failed.append((req_id, self._blocks_of(chunks)))
            return
        if self._receiver is None:
            self._receiver = _pd.Receiver(self, self.pd_wait_ms, self.pd_max_waits)
        self._receiver.submit(req_id, keys, chunks, wait_ms)

    def _receive(self, link, keys, chunks):
        """GET chunks into their blocks on `link` (a hand-off's connection,
        whose MATCH leased them); the indices of the chunks loaded whole."""
        bufs, staged, rows = self._async_buffers(chunks)
        if bufs is None:
            return set()
        try:
            size = self._chunk_bytes()
            st = _link.statuses_or(link.call("hand-off load",
                                             lambda c: c.get_into_many(keys, bufs), None),
                                   len(keys))
            ok = {i for i in range(len(chunks)) if st[i] == size}
            if any(staged[i] for i in ok):
                with self._side_stream() as sync:
                    for i in sorted(ok):
                        if staged[i]:
                            self._unstage(bufs[i], chunks[i])
                    sync()
            return ok
        finally:
            self._rows.give(rows)

    def _side_stream(self):
        """A context for copies made off the engine's thread: on KV caches in
        GPU memory, a CUDA stream of the calling thread (yields its
        synchronize); elsewhere nothing (yields a no-op)."""
        import contextlib
        dev = self._layers[0].tensor.device if self._layers else None

        @contextlib.contextmanager
        def ctx():
            if dev is None or dev.type != "cuda":
                yield lambda: None
                return
            import torch
            local = self._thread_local()
            s = getattr(local, "stream", None)
            if s is None:
                s = local.stream = torch.cuda.Stream(device=dev)
            with torch.cuda.stream(s):
                yield s.synchronize
        return ctx()

    def _thread_local(self):
        tl = getattr(self, "_tls", None)
        if tl is None:
            tl = self._tls = threading.local()
        return tl

    def _load(self, keys, chunks):
        """The load path: get each chunk into its blocks; failures are
        recorded for get_block_ids_with_load_errors."""
        if self._layers is None or not self.loads:
            for chunk in chunks:
                self._load_errors.update(self._block_ids(chunk))
            return
        link = self._link(self._own_rank())
        bufs, staged, size = self._buffers(chunks)
        t0 = time.perf_counter()
        st = _link.statuses_or(link.call("load", lambda c: c.get_into_many(keys, bufs),
                                         None), len(keys))
        if self.estimator.enabled and st and all(s == size for s in st):
            self._load_samples = (self._load_samples +
                                  [(size * len(keys), time.perf_counter() - t0)])[-64:]
        failed = 0
        for i, chunk in enumerate(chunks):
            if st[i] != size:
                failed += 1
                self._load_errors.update(self._block_ids(chunk))
            elif staged[i]:
                self._unstage(bufs[i], chunk)
        if failed and self.failure_policy == "fail":
            self.warn.warning("loadfail", "kvpool.vllm: %d of %d chunks did not load (%s); "
                              "with kv_load_failure_policy \"fail\" their requests fail",
                              failed, len(chunks), _why_not_loaded(next(s for s in st
                                                                        if s != size), size))

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None, **kwargs):
        return None

    def wait_for_save(self):
        """Hand this step's complete chunks to the store pipeline (after the
        forward pass) and return: staged chunks are copied into staging
        rows here, the PUTs run on the pipeline's connection. Every store
        batch counts as done on this worker once acknowledged, failed, or
        skipped (MLA: only TP rank 0 writes; a consumer never writes; a
        layout not served writes nothing)."""
        try:
            meta = self._get_connector_metadata()
        except Exception:
            return
        for entry in (getattr(meta, "stores", None) or ()) if meta else ():
            req_id = entry[0]
            try:
                started = False
                if self._pipeline is not None and self._layers is not None and \
                        not self._closed:
                    started = self._save(req_id, entry[1], entry[2], entry[3],
                                         entry[4] if len(entry) > 4 else 0)
            except Exception as e:
                self.warn.warning("save", "kvpool.vllm: wait_for_save: %r", e)
            if not started:
                self._ledger.end(req_id, began=False)

    def _save(self, req_id, keys, chunks, parent, retain_ms=0):
        """The save path: stage the chunks (when they go through staging) and
        submit them to the pipeline, chained from `parent` (the request's
        previous chunk); True if submitted."""
        # a chunk with a null block (out of a sliding window) cannot be stored
        # whole, nor can any after it (they would never be matched)
        for i, chunk in enumerate(chunks):
            if any(not b for g in chunk for b in g):
                keys, chunks = keys[:i], chunks[:i]
                break
        if not keys:
            return False
        bufs, staged, rows = self._async_buffers(chunks, store=True)
        if bufs is None:
            return False
        try:
            for i, chunk in enumerate(chunks):
                if staged[i]:
                    self._stage(bufs[i], chunk)
        except Exception:
            self._rows.give(rows)
            raise
        self._pipeline.submit(req_id, keys, bufs, parent, rows, self._rows, retain_ms)
        return True

    def flush_stores(self, timeout_s=30.0):
        """Wait until every store batch handed to this worker's pipeline is
        done (acknowledged or failed); True if so within timeout_s. For
        tools and tests: vLLM never calls it (it learns from get_finished)."""
        return self._ledger.wait(None, timeout_s)

    def get_finished(self, finished_req_ids=None):
        """(finished sending, finished receiving): the held requests (meta.held)
        whose store batches are all done on this worker, and the hand-off
        loads done since the last call (their failed blocks go to
        get_block_ids_with_load_errors in the same pass). None for none."""
        try:
            sending = {r for r in self._holding if not self._ledger.busy(r)}
            self._holding -= sending
            for r in set(finished_req_ids or ()) | sending:
                if r not in self._holding:
                    self._ledger.forget(r)
            recving, failed = self._receiver.take() if self._receiver is not None \
                else ([], set())
            with self._links_lock:
                early, self._recv_failed = self._recv_failed, []
            for r, blocks in early:
                recving.append(r)
                failed |= blocks
            self._load_errors.update(failed)
            if failed and self.failure_policy == "fail":
                self.warn.warning("loadfail", "kvpool.vllm: a hand-off left %d blocks "
                                  "missing; with kv_load_failure_policy \"fail\" their "
                                  "requests fail", len(failed))
            return (sending or None), (set(recving) or None)
        except Exception as e:
            self.warn.warning("finished", "kvpool.vllm: get_finished: %r", e)
            return None, None

    def get_block_ids_with_load_errors(self):
        """The blocks whose load failed since the last call (then cleared)."""
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self):
        """Wait up to 2 x timeout_s for the stores in flight, stop the
        hand-off loads (a waiting one ends by its deadline), close every
        connection. Idempotent."""
        with self._links_lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
            pipeline, self._pipeline = self._pipeline, None
            receiver = self._receiver
        if receiver is not None:
            receiver.close()
        if pipeline is not None:
            pipeline.close(2 * self.timeout_s)
            pipeline.link.close()
        for link in links:
            link.close()


__all__ = ["KVPoolConnector", "KVPoolConnectorMetadata", "KVPoolWorkerMetadata",
           "USING_REAL_CONNECTOR_BASE"]
