"""The two sides of a vLLM instance for the real-code tier, each run in a
process of its own as vLLM runs them: the scheduler (engine core) side
and one worker per rank. They talk over pipes with pickled objects, as
vLLM's executor ships SchedulerOutput (with the connector's metadata) to
its workers and their KVConnectorOutput back.

Everything vLLM-specific is vLLM's own code from the snapshot (see
vllm_env.REAL): the connector factory, Request with vLLM's block hasher,
KVCacheBlocks, SchedulerOutput / NewRequestData / CachedRequestData,
KVConnectorOutput, KVCacheConfig and the KV-cache specs, the attention
backends and the model runner's reshape. The vLLM configuration is a
namespace with the attributes a connector reads (vLLM's VllmConfig is a
pydantic 2 class that does not load here), and the model's attention
layers in the static forward context are test doubles whose
get_attn_backend() names the layer's real backend class.
"""

import os
import sys
import traceback
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

BACKENDS = {
    "flash_attn": ("vllm.v1.attention.backends.flash_attn", "FlashAttentionBackend"),
    "flashinfer": ("vllm.v1.attention.backends.flashinfer", "FlashInferBackend"),
    "triton": ("vllm.v1.attention.backends.triton_attn", "TritonAttentionBackend"),
    "cpu": ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackend"),
    "mla": ("vllm.model_executor.layers.attention.mla_attention", "MLACommonBackend"),
}


def load():
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import engine_env
    engine_env.load_vllm()
    return engine_env


def backend_class(name):
    import importlib
    mod, cls = BACKENDS[name]
    return getattr(importlib.import_module(mod), cls)


def layer_names(n):
    return ["model.layers.%d.self_attn.attn" % i for i in range(n)]


def kv_cache_config(setup):
    """vLLM's KVCacheConfig for a setup dict: num_blocks, block (manager),
    heads, head_size, layers, mla, sliding (window: every other layer in a
    sliding-window group, as the hybrid manager groups them), mamba."""
    import torch
    from vllm.v1 import kv_cache_interface as ki
    dtype = torch.float16
    names = layer_names(setup["layers"])
    if setup.get("mla"):
        spec = ki.MLAAttentionSpec(block_size=setup["block"], num_kv_heads=1,
                                   head_size=setup["head_size"], dtype=dtype)
    else:
        spec = ki.FullAttentionSpec(block_size=setup["block"], num_kv_heads=setup["heads"],
                                    head_size=setup["head_size"], dtype=dtype)
    groups = [(names, spec)]
    if setup.get("uniform_heads"):
        # layers of one type with different KV head counts: one group whose
        # spec is vLLM's UniformTypeKVCacheSpecs, one tensor per layer
        heads = setup["uniform_heads"]
        specs = {n: ki.FullAttentionSpec(block_size=setup["block"],
                                         num_kv_heads=heads[i % len(heads)],
                                         head_size=setup["head_size"], dtype=dtype)
                 for i, n in enumerate(names)}
        assert ki.UniformTypeKVCacheSpecs.is_uniform_type(specs)
        u = ki.UniformTypeKVCacheSpecs(block_size=setup["block"], kv_cache_specs=specs)
        tensors = [ki.KVCacheTensor(size=specs[n].page_size_bytes * setup["num_blocks"],
                                    shared_by=[n]) for n in names]
        return ki.KVCacheConfig(num_blocks=setup["num_blocks"], kv_cache_tensors=tensors,
                                kv_cache_groups=[ki.KVCacheGroupSpec(layer_names=names,
                                                                     kv_cache_spec=u)])
    if setup.get("sliding"):
        swa = ki.SlidingWindowSpec(block_size=setup["block"], num_kv_heads=setup["heads"],
                                   head_size=setup["head_size"], dtype=dtype,
                                   sliding_window=setup["sliding"])
        groups = [(names[0::2], spec), (names[1::2], swa)]
    if setup.get("mamba"):
        mamba = ki.MambaSpec(block_size=setup["block"], shapes=((spec.page_size_bytes // 2,),),
                             dtypes=(dtype,))
        groups = [(names[:-1], spec), (names[-1:], mamba)]
    page = max(g[1].page_size_bytes for g in groups)
    per = max(len(g[0]) for g in groups)
    tensors = [ki.KVCacheTensor(size=page * setup["num_blocks"],
                                shared_by=[g[0][i] for g in groups if i < len(g[0])])
               for i in range(per)]
    return ki.KVCacheConfig(num_blocks=setup["num_blocks"], kv_cache_tensors=tensors,
                            kv_cache_groups=[ki.KVCacheGroupSpec(layer_names=list(n),
                                                                 kv_cache_spec=s)
                                             for n, s in groups])


class AttentionLayer:
    """Test double of a model's attention layer in vLLM's static forward
    context: only get_attn_backend(), which names the real backend."""

    def __init__(self, backend):
        self.backend = backend

    def get_attn_backend(self):
        return self.backend


def vllm_config(setup, url, prefix, rank, role, policy):
    """The attributes of VllmConfig a KV connector reads. The worker's rank
    is vLLM's (parallel_config.rank, set by its WorkerBase); the extra
    config is the one every worker of the instance gets (setup
    "extra_rank": a "rank" setting in it)."""
    backend = backend_class(setup["backend"])
    extra = {"url": url, "namespace_prefix": prefix, "timeout_s": 2.0, "lease_ms": 5000,
             "chunk_blocks": setup.get("chunk_blocks", 1)}
    if setup.get("extra_rank") is not None:
        extra["rank"] = setup["extra_rank"]
    ktc = SimpleNamespace(
        kv_connector="KVPoolConnector", kv_connector_module_path="kvpool.vllm",
        kv_role=role, kv_load_failure_policy=policy, engine_id="real-tier",
        kv_connector_extra_config=dict(extra, **setup.get("extra", {})),
        is_kv_producer=role in ("kv_producer", "kv_both"),
        is_kv_consumer=role in ("kv_consumer", "kv_both"))
    return SimpleNamespace(
        kv_transfer_config=ktc,
        model_config=SimpleNamespace(model="real/llama", served_model_name="real/llama",
                                     dtype="float16", use_mla=bool(setup.get("mla"))),
        cache_config=SimpleNamespace(block_size=setup["block"], cache_dtype="auto",
                                     prefix_caching_hash_algo="sha256", hash_block_size=None),
        parallel_config=SimpleNamespace(tensor_parallel_size=setup.get("tp", 1),
                                        pipeline_parallel_size=1, rank=rank,
                                        prefill_context_parallel_size=1,
                                        decode_context_parallel_size=1),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=not (setup.get("sliding") or setup.get("mamba"))),
        compilation_config=SimpleNamespace(static_forward_context={
            n: AttentionLayer(backend) for n in layer_names(setup["layers"])}))


# ---- the worker side -------------------------------------------------------------------------

def _dims(backend, mla):
    """Logical dims of the backend's KV cache, asked from the backend."""
    probe = {"nb": 1237, "tok": 48, "h": 1 if mla else 5, "d": 72}
    shape = backend.get_kv_cache_shape(probe["nb"], probe["tok"], probe["h"], probe["d"])
    by = {2: "kv", 1237: "nb", 48: "tok", 72: "d"}
    if not mla:
        by[5] = "h"
    return [by[n] for n in shape]


class Worker:
    def __init__(self, setup, url, prefix, rank, role, policy):
        import torch
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.attention.backends.utils import set_kv_cache_layout
        from vllm.v1.worker.gpu import attn_utils
        set_kv_cache_layout(setup.get("layout", "NHD"))
        self.setup, self.rank = setup, rank
        self.kcc = kv_cache_config(setup)
        backend = backend_class(setup["backend"])
        names = [n for g in self.kcc.kv_cache_groups for n in g.layer_names]
        attn_names = [n for g in self.kcc.kv_cache_groups for n in g.layer_names
                      if type(g.kv_cache_spec).__name__ != "MambaSpec"]
        raw = attn_utils._allocate_kv_cache(self.kcc, torch.device("cpu"))
        kernel = setup.get("kernel", setup["block"])
        self.caches = attn_utils._reshape_kv_cache(
            self.kcc, raw, {n: backend for n in names}, "auto",
            [kernel] * len(self.kcc.kv_cache_groups))
        self.attn_names = attn_names
        self.dims = _dims(backend, setup.get("mla"))
        self.connector = KVConnectorFactory.create_connector(
            vllm_config(setup, url, prefix, rank, role, policy), KVConnectorRole.WORKER,
            self.kcc)
        self.connector.register_kv_caches(self.caches)

    def logical(self, name):
        """A layer's cache as (kv, kernel block, token, head, dim)."""
        t = self.caches[name]
        order = [self.dims.index(d) for d in ("kv", "nb", "tok", "h", "d") if d in self.dims]
        t = t.permute(*order)
        if "kv" not in self.dims:
            t = t.unsqueeze(0)
        if "h" not in self.dims:
            t = t.unsqueeze(3)
        return t

    def _group_of(self, name):
        for g, group in enumerate(self.kcc.kv_cache_groups):
            if name in group.layer_names:
                return g
        raise KeyError(name)

    def _slot(self, ids, pos):
        """(manager block, kernel block, token in it) of token `pos`: the
        kernel blocks of a manager block from vLLM's own mapping
        (BlockTable.map_to_kernel_blocks)."""
        import numpy as np
        from vllm.v1.worker.block_table import BlockTable
        block = self.setup["block"]
        kernel = self.setup.get("kernel", block)
        r = block // kernel
        m = ids[pos // block]
        kernels = BlockTable.map_to_kernel_blocks(np.array([m]), r, np.arange(r))
        return m, int(kernels[(pos % block) // kernel]), pos % kernel

    def forward(self, block_ids, first, n, seed):
        """Write KV values derived from (seed, rank, layer, kv, token, head,
        dim) for tokens [first, n) into the blocks, through the layout."""
        import torch
        for li, name in enumerate(self.attn_names):
            t = self.logical(name)
            ids = block_ids[self._group_of(name)]
            h = torch.arange(t.shape[3]).view(-1, 1)
            d = torch.arange(t.shape[4]).view(1, -1)
            for p in range(first, n):
                m, kb, tk = self._slot(ids, p)
                if m == 0:
                    continue
                for k in range(t.shape[0]):
                    base = seed * 131 + self.rank * 17 + li * 29 + k * 7 + p * 3
                    t[k, kb, tk] = ((base + h * 37 + d) % 1021).to(t.dtype)

    def read(self, block_ids, n, groups=None):
        """Tokens [0, n) of every layer, as bytes per (layer, token)."""
        out = []
        for name in self.attn_names:
            g = self._group_of(name)
            if groups is not None and g not in groups:
                continue
            t = self.logical(name)
            ids = block_ids[g]
            row = []
            for p in range(n):
                m, kb, tk = self._slot(ids, p)
                row.append(t[:, kb, tk].contiguous().numpy().tobytes())
            out.append(row)
        return out

    def step(self, so_blob, forward=None):
        """One forward pass: the pickled SchedulerOutput in, the pickled
        KVConnectorOutput out (as vLLM's executor ships them). forward: one
        (block_ids, first, n, seed) or a list of them (one per request)."""
        import pickle
        so = pickle.loads(so_blob)
        meta = so.kv_connector_metadata
        c = self.connector
        c.handle_preemptions(meta)
        c.bind_connector_metadata(meta)
        c.start_load_kv(SimpleNamespace())
        for name in self.attn_names:
            c.wait_for_layer_load(name)
        for f in ([forward] if isinstance(forward, tuple) else forward or ()):
            self.forward(*f)
        for name in self.attn_names:
            c.save_kv_layer(name, self.caches[name], None)
        c.wait_for_save()
        from vllm.v1.outputs import KVConnectorOutput
        sending, recving = c.get_finished(so.finished_req_ids)
        out = KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                invalid_block_ids=c.get_block_ids_with_load_errors(),
                                kv_connector_worker_meta=c.build_connector_worker_meta())
        c.clear_connector_metadata()
        return pickle.dumps(out)


def namespaces_main(conn, url, prefix, cases):
    """Build a scheduler-side connector through vLLM's KVConnectorFactory for
    each case (label, setup, model_config changes, cache_dtype, spec kind:
    "full", "mla" (the spec MLAAttention.get_kv_cache_spec builds for the
    cache dtype: no kv_quant_mode, cache_dtype_str) or "fp8-full" (the
    FullAttentionSpec an fp8 GQA cache gets: kv_quant_mode from the cache
    dtype)[, extra config settings]); send back {label: (refused, namespace
    of rank 0)}, or {label: ("error: " + what the factory raised, None)}."""
    try:
        load()
        import torch
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
        from vllm.v1 import kv_cache_interface as ki
        out = {}
        for case in cases:
            label, setup, mc, cache_dtype, kind = case[:5]
            if len(case) > 5:
                setup = dict(setup, extra=dict(setup.get("extra", {}), **case[5]))
            dtype = torch.float16 if cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[
                cache_dtype]
            names = layer_names(setup["layers"])
            if kind == "mla":
                spec = ki.MLAAttentionSpec(block_size=setup["block"], num_kv_heads=1,
                                           head_size=setup["head_size"], dtype=dtype,
                                           cache_dtype_str=cache_dtype)
            else:
                spec = ki.FullAttentionSpec(
                    block_size=setup["block"], num_kv_heads=setup["heads"],
                    head_size=setup["head_size"], dtype=dtype,
                    kv_quant_mode=ki.get_kv_quant_mode(cache_dtype))
            kcc = ki.KVCacheConfig(num_blocks=setup["num_blocks"], kv_cache_tensors=[],
                                   kv_cache_groups=[ki.KVCacheGroupSpec(layer_names=names,
                                                                        kv_cache_spec=spec)])
            vc = vllm_config(setup, url, prefix, 0, "kv_both", "recompute")
            vc.cache_config.cache_dtype = cache_dtype
            for k, v in mc.items():
                setattr(vc.model_config, k, v)
            try:
                c = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kcc)
            except Exception as e:
                out[label] = ("error: %s: %s" % (type(e).__name__, e), None)
                continue
            out[label] = (c.refused, c.namespace_for_rank(0))
            c.shutdown()
        conn.send(("ok", out))
    except Exception:
        conn.send(("error", traceback.format_exc()))


def report_main(conn):
    """The snapshot, the stubs and the gaps, as a text (its own process)."""
    try:
        env = load()
        from vllm_env import REAL
        import io
        import contextlib
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            for mod in sorted(REAL):
                __import__(mod)
            env.report("vllm", env.commit_of(env.source("vllm")[1], "vllm"))
            print("  vLLM modules driven: %s" % ", ".join(sorted(REAL)))
        conn.send(("ok", buf.getvalue()))
    except Exception:
        conn.send(("error", traceback.format_exc()))


def worker_main(conn, setup, url, prefix, rank, role, policy):
    """A worker process: serve (method, args) calls from the scheduler side."""
    try:
        load()
        w = Worker(setup, url, prefix, rank, role, policy)
        conn.send(("ready", w.connector._verdict))
        while True:
            what, args = conn.recv()
            if what == "stop":
                w.connector.shutdown()
                conn.send(("ok", None))
                return
            conn.send(("ok", getattr(w, what)(*args)))
    except Exception:
        conn.send(("error", traceback.format_exc()))


# ---- the scheduler side ----------------------------------------------------------------------

class Scheduler:
    def __init__(self, setup, url, prefix, role, policy):
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
        self.setup = setup
        # what vLLM's engine core hands the scheduler: one worker's config,
        # UniformTypeKVCacheSpecs collapsed to one layer's spec
        self.kcc = generate_scheduler_kv_cache_config([kv_cache_config(setup)])
        init_none_hash(sha256)          # PYTHONHASHSEED is set by the tier: a shared seed
        self.hasher = get_request_block_hasher(setup["block"], sha256)
        self.connector = KVConnectorFactory.create_connector(
            vllm_config(setup, url, prefix, 0, role, policy), KVConnectorRole.SCHEDULER,
            self.kcc)
        self.requests = {}
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        self.aggregator = KVOutputAggregator(setup.get("tp", 1))
        self.held = set()            # finished requests whose blocks the connector holds

    def _output(self, new=(), num_scheduled=None, finished=()):
        from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
        groups = len(self.kcc.kv_cache_groups)
        return SchedulerOutput(
            scheduled_new_reqs=list(new), scheduled_cached_reqs=CachedRequestData.make_empty(),
            num_scheduled_tokens=dict(num_scheduled or {}),
            total_num_scheduled_tokens=sum((num_scheduled or {}).values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0] * groups, finished_req_ids=set(finished),
            free_encoder_mm_hashes=[])

    def idle(self, finished=()):
        """A step with nothing scheduled; `finished` names the requests that
        finished since the last step (finished_req_ids)."""
        import pickle
        so = self._output(finished=finished)
        so.kv_connector_metadata = self.connector.build_connector_meta(so)
        return pickle.dumps(so)

    def schedule(self, req_id, tokens, block_ids, local_tokens=0):
        """A new request as vLLM's scheduler admits it: asks the connector
        (twice: the answer must repeat), allocates, builds the step's
        SchedulerOutput with the connector's metadata (pickled)."""
        import pickle
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
        from vllm.v1.core.sched.output import NewRequestData
        from vllm.v1.request import Request
        # SamplingParams is a msgspec struct (msgspec is not packaged in Debian
        # 12): the fields Request reads stand for it
        params = SimpleNamespace(max_tokens=1, extra_args=None, skip_reading_prefix_cache=None,
                                 prompt_logprobs=None, structured_outputs=None)
        req = Request(req_id, list(tokens), params, None, block_hasher=self.hasher)
        self.requests[req_id] = req
        ext, is_async = self.connector.get_num_new_matched_tokens(req, local_tokens)
        assert (ext, is_async) == self.connector.get_num_new_matched_tokens(req, local_tokens)
        assert is_async is False and ext is not None
        assert local_tokens + ext <= req.num_tokens
        blocks = KVCacheBlocks(tuple([KVCacheBlock(b) for b in g] for g in block_ids))
        self.connector.update_state_after_alloc(req, blocks, ext)
        computed = local_tokens + ext
        new = NewRequestData.from_request(req, blocks.get_block_ids())
        new.num_computed_tokens = computed
        so = self._output([new], {req_id: req.num_tokens - computed})
        so.kv_connector_metadata = self.connector.build_connector_meta(so)
        return ext, pickle.dumps(so), [bytes(h) for h in req.block_hashes]

    def outputs(self, worker_outputs, req_id=None, block_ids=None):
        """The workers' KVConnectorOutputs, aggregated by vLLM's
        KVOutputAggregator as its executor does, to update_connector_output;
        then the request finishes. A request whose blocks the connector
        holds (stores in flight) stays in `held` until every worker has
        reported it finished sending."""
        import pickle
        from vllm.v1.outputs import ModelRunnerOutput
        outs = [ModelRunnerOutput(req_ids=[], req_id_to_index={},
                                  kv_connector_output=pickle.loads(b)) for b in worker_outputs]
        agg = self.aggregator.aggregate(outs).kv_connector_output
        self.connector.update_connector_output(agg)
        self.held -= set(agg.finished_sending or ())
        if req_id is not None:
            hold, _ = self.connector.request_finished_all_groups(
                self.requests.pop(req_id), tuple(block_ids))
            if hold:
                self.held.add(req_id)
        return sorted(agg.invalid_block_ids)

    def holding(self, req_id):
        return req_id in self.held

    def namespace(self, rank):
        return self.connector.namespace_for_rank(rank)


def scheduler_main(conn, setup, url, prefix, role, policy):
    try:
        load()
        s = Scheduler(setup, url, prefix, role, policy)
        conn.send(("ready", None))
        while True:
            what, args = conn.recv()
            if what == "stop":
                s.connector.shutdown()
                conn.send(("ok", None))
                return
            conn.send(("ok", getattr(s, what)(*args)))
    except Exception:
        conn.send(("error", traceback.format_exc()))


# ---- the offloading tier (route A) -----------------------------------------------------------

def tier_main(conn, url, prefix):
    """Build kvpool tiers through vLLM's SecondaryTierFactory for several
    attention backends and KV-cache layouts, store a row with one and look
    it up with the others; send back what each saw."""
    try:
        load()
        import time
        import numpy as np
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key
        from vllm.v1.kv_offload.tiering.base import JobMetadata
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
        import kvpool.vllm as kv
        kv.register()
        rows_shape = (8, 4096)

        def config(backend, block=16):
            return SimpleNamespace(
                model_config=SimpleNamespace(model="real/llama", served_model_name="real/llama",
                                             dtype="bfloat16"),
                cache_config=SimpleNamespace(block_size=block, cache_dtype="auto",
                                             prefix_caching_hash_algo="sha256"),
                parallel_config=SimpleNamespace(tensor_parallel_size=1,
                                                pipeline_parallel_size=1,
                                                prefill_context_parallel_size=1,
                                                decode_context_parallel_size=1),
                attention_config=SimpleNamespace(backend=backend),
                kv_transfer_config=SimpleNamespace(kv_connector="OffloadingConnector",
                                                   kv_connector_extra_config={}))

        def tier(backend, block=16, rows=None):
            rows = rows if rows is not None else np.zeros(rows_shape, dtype=np.int8)
            t = SecondaryTierFactory.create_secondary_tier(
                {"type": "kvpool", "url": url, "namespace_prefix": prefix, "timeout_s": 1.0,
                 "block_size": 64}, memoryview(rows), config(backend, block))
            return t, rows

        def settle(t, key):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                r = t.lookup(key, ReqContext(req_id="q"))
                if r is not None:
                    return r
                time.sleep(0.002)
            return None
        out = {}
        fa = AttentionBackendEnum.FLASH_ATTN
        fi = AttentionBackendEnum.FLASHINFER
        a, rows_a = tier(fa)
        rows_a[2] = np.arange(rows_shape[1], dtype=np.int64).astype(np.int8)
        key = make_offload_key(bytes(range(32)), 0)
        a.submit_store(JobMetadata(job_id=1, keys=[key], block_ids=np.array([2]),
                                   is_promotion=False, req_context=ReqContext(req_id="r")))
        a.drain_jobs(timeout=10)
        out["store"] = [(r.job_id, r.success) for r in a.get_finished()]
        same, _ = tier(fa)
        out["same"] = (same.namespace == a.namespace, settle(same, key))
        others = {"flashinfer": tier(fi)[0], "flash_attn_block128": tier(fa, 128)[0],
                  "flashinfer_block128": tier(fi, 128)[0]}
        os.environ["VLLM_KV_CACHE_LAYOUT"] = "HND"
        others["flash_attn_hnd"] = tier(fa)[0]
        del os.environ["VLLM_KV_CACHE_LAYOUT"]
        out["namespaces"] = {"flash_attn": a.namespace}
        out["namespaces"].update({n: t.namespace for n, t in others.items()})
        out["others"] = {n: settle(t, key) for n, t in others.items()}
        for t in [a, same] + list(others.values()):
            t.shutdown()
        try:
            tier(None)
            out["auto"] = "accepted"
        except Exception as e:
            out["auto"] = "%s: %s" % (type(e).__name__, e)
        conn.send(("ok", out))
    except Exception:
        conn.send(("error", traceback.format_exc()))
