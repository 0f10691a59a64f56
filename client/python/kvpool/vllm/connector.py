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

from .._adapters import link as _link
from .._adapters.buffers import raw_buffer
from .._adapters.keys import make_namespace
from .._adapters.link import Link, RateLimitedLog
from ._keys import (DEFAULT_LEASE_MS, DEFAULT_URL, _hash_algo, _import, _model_dtype,
                    _parallel, block_key)

log = logging.getLogger("kvpool.vllm")

INTERFACE_CONNECTOR = "vLLM KVConnectorBase_V1 (vllm-project/vllm 9aaf83ef, 2026-05-19)"


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
                st = _link.statuses_or(link.call("load", lambda c: c.get_into_many(keys, bufs),
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
                st = link.call("save", lambda c: _link.put_rerooting(c, ks, bufs, parents),
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


__all__ = ["KVPoolConnector", "KVPoolConnectorMetadata", "USING_REAL_CONNECTOR_BASE"]
