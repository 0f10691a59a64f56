"""Contract tests of kvpool.vllm.KVPoolConnector (a vLLM KV connector),
driven as vLLM's scheduler and model runner drive a connector, against a
real kvpoold, with the KV caches each attention backend allocates (built
as the model runner builds them: vllm_standin_layouts). One instance
stores, another loads into other block ids, and the KV of every loaded
token must be byte-exact. See docs/engines.md and the engine notes
(§0b, §3.2, §5)."""

import inspect
import logging
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import kvpool  # noqa: E402
import kvpool.vllm as kv  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import base as vbase  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,  # noqa: E402
                                                               KVConnectorRole)

import vllm_standin_layouts as vl  # noqa: E402
from vllm_standin_scheduler import Blocks, Request, aggregate, step, worker_step  # noqa: E402

BS = 16          # tokens per vLLM (manager) block
LAYERS = 3
HEADS = 2
DIM = 16
BLOCKS = 32


class Setup:
    """How one instance lays out its KV caches."""

    def __init__(self, backend=vl.FlashAttentionBackend, block=BS, kernel=None, heads=HEADS,
                 dim=DIM, layers=LAYERS, dtype=torch.float16, mla=False, sliding=None,
                 mamba=False, cache_dtype="auto"):
        self.backend, self.block, self.kernel = backend, block, kernel or block
        self.cache_dtype = cache_dtype
        self.heads, self.dim, self.layers, self.dtype = heads, dim, layers, dtype
        self.mla, self.sliding, self.mamba = mla, sliding, mamba

    def groups(self):
        names = ["model.layers.%d.self_attn.attn" % i for i in range(self.layers)]
        if self.mla:
            spec = vl.MLAAttentionSpec(self.block, 1, self.dim, self.dtype)
        else:
            spec = vl.FullAttentionSpec(self.block, self.heads, self.dim, self.dtype)
        if self.sliding:       # every other layer in a sliding-window group (HMA)
            swa = vl.SlidingWindowSpec(self.block, self.heads, self.dim, self.dtype,
                                       self.sliding)
            return [(names[0::2], spec), (names[1::2], swa)]
        if self.mamba:
            return [(names[:-1], spec), (names[-1:], vl.MambaSpec(self.block, [(4,)],
                                                                  [self.dtype]))]
        return [(names, spec)]

    def __repr__(self):
        return "%s-b%d-k%d%s" % (self.backend.__name__, self.block, self.kernel,
                                 "-swa" if self.sliding else "")


FA = vl.FlashAttentionBackend


def vllm_config(url, prefix, setup, tp=1, rank=0, role="kv_both", policy="recompute",
                **extra):
    """What a connector reads of VllmConfig; the worker's rank is vLLM's
    (parallel_config.rank), not a setting."""
    ec = dict({"url": url, "namespace_prefix": prefix, "timeout_s": 1.0}, **extra)
    backends = {n: setup.backend for names, _ in setup.groups() for n in names}
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="KVPoolConnector",
                                           kv_connector_module_path="kvpool.vllm",
                                           kv_role=role, kv_connector_extra_config=ec,
                                           kv_load_failure_policy=policy),
        model_config=SimpleNamespace(model="test/llama-8b", dtype="float16", use_mla=setup.mla),
        cache_config=SimpleNamespace(block_size=setup.block, cache_dtype=setup.cache_dtype,
                                     prefix_caching_hash_algo="sha256"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                        rank=rank),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=len(setup.groups()) == 1),
        compilation_config=SimpleNamespace(static_forward_context=vl.forward_context(backends)))


class Instance:
    """One vLLM instance: a scheduler-side connector and tp workers, each
    worker with the KV caches `setup` allocates."""

    def __init__(self, url, prefix, setup=None, tp=1, role="kv_both", policy="recompute",
                 warm=True, sched_setup=None, **extra):
        self.setup = setup or Setup()
        s = self.setup
        self.kcc = vl.kv_cache_config(BLOCKS, s.groups())
        self.backends = {n: s.backend for names, _ in s.groups() for n in names}
        # sched_setup: the scheduler gets another config than its workers
        # (vLLM hands it one worker's, UniformTypeKVCacheSpecs collapsed)
        self.scheduler = KVConnectorFactory.create_connector(
            vllm_config(url, prefix, s, tp, 0, role, policy, **extra),
            KVConnectorRole.SCHEDULER,
            vl.kv_cache_config(BLOCKS, sched_setup.groups()) if sched_setup else self.kcc)
        assert isinstance(self.scheduler, KVConnectorBase_V1)
        self.workers, self.caches = [], []
        for r in range(tp):
            w = KVConnectorFactory.create_connector(
                vllm_config(url, prefix, s, tp, r, role, policy, **extra),
                KVConnectorRole.WORKER, self.kcc)
            caches = vl.reshape(self.kcc, self.backends,
                                [s.kernel] * len(self.kcc.kv_cache_groups))
            w.register_kv_caches(caches)
            w.layer_names = list(caches)
            self.workers.append(w)
            self.caches.append(caches)
        if warm:
            self.idle_step()

    def idle_step(self):
        """A step with no request: the workers' metadata reaches the scheduler."""
        meta = self.scheduler.build_connector_meta(SimpleNamespace(
            scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={},
            finished_req_ids=set()))
        metas = [worker_step(w, meta)[1] for w in self.workers]
        self.scheduler.update_connector_output(SimpleNamespace(
            kv_connector_worker_meta=aggregate(metas), invalid_block_ids=set()))

    # the KV of a layer in logical (kv, kernel block, token, head, dim) order
    def _logical(self, t):
        b = self.setup.backend
        if self.setup.mla:
            return t.unsqueeze(0).unsqueeze(3)
        if issubclass(b, vl.FlashInferBackend) or b is vl.ScaledTritonBackend:
            return t.permute(1, 0, 2, 3, 4)
        if b is vl.CPUAttentionBackend:
            return t.permute(0, 1, 3, 2, 4)
        return t

    def _layers(self, rank):
        """[(group index, layer name, logical tensor)] in group order."""
        out = []
        for g, group in enumerate(self.kcc.kv_cache_groups):
            for name in group.layer_names:
                out.append((g, name, self._logical(self.caches[rank][name])))
        return out

    def _slot(self, ids, pos):
        s = self.setup
        m = ids[pos // s.block]
        r = s.block // s.kernel
        return m * r + (pos % s.block) // s.kernel, pos % s.kernel

    def read(self, rank, block_ids, n):
        """KV of tokens [0, n) as (layer, kv, token, head, dim) values."""
        ids = block_ids if isinstance(block_ids[0], (list, tuple)) else [block_ids]
        rows = []
        for g, _, t in self._layers(rank):
            rows.append(torch.stack([t[:, kb, tk, :, :self.setup.dim] for kb, tk in
                                     (self._slot(ids[g], p) for p in range(n))], 1))
        return torch.stack(rows)

    def forward(self, seed):
        """A stand-in forward pass: writes KV values derived from (seed,
        rank, layer, kv, token, head, dim) into the blocks computed in
        this step, through the backend's own layout."""
        def run(rank, first_block):
            ids = self.block_ids if isinstance(self.block_ids[0], (list, tuple)) \
                else [self.block_ids]
            h = torch.arange(self.setup.heads if not self.setup.mla else 1).view(-1, 1)
            d = torch.arange(self.setup.dim).view(1, -1)
            for li, (g, _, t) in enumerate(self._layers(rank)):
                for p in range(first_block * self.setup.block, self.n_tokens):
                    kb, tk = self._slot(ids[g], p)
                    if ids[g][p // self.setup.block] == 0:
                        continue                    # a sliding window's null block
                    for k in range(t.shape[0]):
                        base = seed * 131 + rank * 17 + li * 29 + k * 7 + p * 3
                        t[k, kb, tk, :, :self.setup.dim] = ((base + h * 37 + d) % 1021).to(t.dtype)
        return run

    def close(self):
        for c in [self.scheduler] + self.workers:
            c.shutdown()
            c.shutdown()


def prompt(n, seed=1):
    tokens = [(seed * 977 + i) % 30000 for i in range(n)]
    return tokens, kvpool.block_hashes(tokens, BS)


def run_request(inst, req_id, tokens, hashes, seed, local=0, ids=None):
    n = (len(tokens) + inst.setup.block - 1) // inst.setup.block
    groups = len(inst.kcc.kv_cache_groups)
    if ids is None:
        ids = list(range(3, 3 + n))
    inst.block_ids = ids if groups == 1 or isinstance(ids[0], (list, tuple)) else \
        [[b + 40 * g for b in ids] for g in range(groups)]
    inst.n_tokens = len(tokens)
    return step(inst.scheduler, inst.workers, Request(req_id, tokens, hashes),
                inst.block_ids, local, inst.forward(seed))


def hashes_for(tokens, block):
    return kvpool.block_hashes(tokens, block)


LAYOUTS = [
    # (storing instance, loading instance): every layout vLLM's backends allocate
    (Setup(FA), Setup(FA)),
    (Setup(vl.FlashAttentionHND), Setup(vl.FlashAttentionHND)),
    (Setup(vl.FlashInferBackend), Setup(vl.FlashInferBackend)),
    (Setup(vl.FlashInferHND), Setup(vl.FlashInferHND)),
    # kernel block smaller than the manager block (FlashInfer: --block-size 128 runs 64)
    (Setup(vl.FlashInferBackend, block=32, kernel=16), Setup(vl.FlashInferBackend, block=32,
                                                             kernel=16)),
    (Setup(FA, block=32, kernel=16), Setup(FA, block=32, kernel=16)),
    (Setup(vl.FlashInferHND, block=32, kernel=16), Setup(vl.FlashInferHND, block=32,
                                                         kernel=16)),
    (Setup(vl.CPUAttentionBackend), Setup(vl.CPUAttentionBackend)),
    (Setup(vl.MLABackend, mla=True, dim=24), Setup(vl.MLABackend, mla=True, dim=24)),
    # one canonical byte layout: NHD and HND instances share blocks, and so
    # do instances whose kernel blocks differ
    (Setup(FA), Setup(vl.FlashInferHND)),
    (Setup(vl.CPUAttentionBackend), Setup(FA)),
    (Setup(FA, block=32, kernel=16), Setup(vl.FlashInferHND, block=32, kernel=32)),
]


@pytest.mark.parametrize("a_setup,b_setup", LAYOUTS, ids=lambda s: repr(s))
def test_layouts_round_trip_byte_exact(server, prefix, a_setup, b_setup):
    """Rows 1, 2 and 4: what one instance stores, another loads into other
    block ids, byte-exact, for every layout; hits are whole chunks."""
    tokens = [(977 + i) % 30000 for i in range(100)]
    hashes = hashes_for(tokens, a_setup.block)
    a = Instance(server.url, prefix, a_setup)
    assert all(w._layers is not None for w in a.workers), "the layout must be served"
    ext, errors = run_request(a, "r1", tokens, hashes, seed=1)
    assert ext == 0 and errors == [set()]
    b = Instance(server.url, prefix, b_setup)
    assert b.scheduler.namespace_for_rank(0) == a.scheduler.namespace_for_rank(0)
    ids = list(range(BLOCKS - 1, BLOCKS - 1 - 7, -1))       # other blocks, reversed
    ext, errors = run_request(b, "r2", tokens, hashes, seed=2, ids=ids)
    want = (99 // a_setup.block) * a_setup.block
    assert ext == want, "aligned len(prompt) - 1 tokens"
    assert errors == [set()]
    assert torch.equal(b.read(0, b.block_ids, ext), a.read(0, a.block_ids, ext))
    # the token after the loaded ones was computed by b, not loaded
    assert not torch.equal(b.read(0, b.block_ids, ext + 1)[:, :, ext],
                           a.read(0, a.block_ids, ext + 1)[:, :, ext])
    a.close()
    b.close()


def test_stage_through_host_stores_the_same_bytes(server, prefix):
    """The host staging buffer (for KV caches in GPU memory; forced here on
    CPU tensors) stores and loads the same bytes as the zero-copy path."""
    tokens, hashes = prompt(100)
    a = Instance(server.url, prefix, stage_through_host=True)
    run_request(a, "r1", tokens, hashes, seed=1)
    b = Instance(server.url, prefix)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=2, ids=list(range(10, 17)))
    assert ext == 96 and errors == [set()]
    assert torch.equal(b.read(0, b.block_ids, 96), a.read(0, a.block_ids, 96))
    c = Instance(server.url, prefix, stage_through_host=True)
    ext, errors = run_request(c, "r3", tokens, hashes, seed=3, ids=list(range(20, 27)))
    assert ext == 96 and torch.equal(c.read(0, c.block_ids, 96), a.read(0, a.block_ids, 96))
    for i in (a, b, c):
        i.close()


def test_refused_layout_offers_no_hits(server, prefix, raw):
    """A layout the adapter cannot serve is refused at register_kv_caches,
    and the scheduler then offers no hits (reuse is lost, no request fails)."""
    tokens, hashes = prompt(100, seed=4)
    a = Instance(server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=4)
    ns = a.scheduler.namespace_for_rank(0)
    b = Instance(server.url, prefix, Setup(vl.ScaledTritonBackend))
    assert b.workers[0]._layers is None, "a last dimension of head_size + 2 is refused"
    assert b.scheduler.namespace_for_rank(0) == ns
    for i in range(2):
        ext, errors = run_request(b, "r2-%d" % i, tokens, hashes, seed=5)
        assert ext == 0 and errors == [set()]
    # it stored nothing either
    t2, h2 = prompt(64, seed=44)
    run_request(b, "r3", t2, h2, seed=6)
    assert raw(ns).match([kv.block_key(h) for h in h2]) == 0
    a.close()
    b.close()


def test_unserved_kv_cache_groups_offer_no_hits(server, prefix, raw):
    """A model with a Mamba group: the scheduler knows from kv_cache_config
    that the workers cannot serve it, from the start."""
    tokens, hashes = prompt(64, seed=7)
    m = Instance(server.url, prefix, Setup(mamba=True), warm=False)
    assert m.scheduler.get_num_new_matched_tokens(Request("x", tokens, hashes), 0) == (0, False)
    m.close()


def test_first_step_waits_for_the_workers_verdict(server, prefix):
    """Before any worker has said its layout is served, no hits are offered."""
    tokens, hashes = prompt(64, seed=8)
    a = Instance(server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=8)
    b = Instance(server.url, prefix, warm=False)
    assert b.scheduler.get_num_new_matched_tokens(Request("y", tokens, hashes), 0) == (0, False)
    b.idle_step()
    assert b.scheduler.get_num_new_matched_tokens(Request("z", tokens, hashes), 0) == (48, False)
    a.close()
    b.close()


@pytest.mark.parametrize("setup", [Setup(), Setup(heads=4), Setup(dim=32),
                                   Setup(dtype=torch.bfloat16), Setup(layers=2),
                                   Setup(vl.MLABackend, mla=True, dim=16)],
                         ids=["same", "heads", "head_size", "dtype", "layers", "mla"])
def test_namespaces_name_the_byte_layout(server, prefix, setup):
    """Row 4: instances share blocks only when their bytes agree."""
    tokens, hashes = prompt(64, seed=9)
    a = Instance(server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=9)
    b = Instance(server.url, prefix, setup)
    same = b.scheduler.namespace_for_rank(0) == a.scheduler.namespace_for_rank(0)
    assert same == (repr(setup) == repr(Setup()) and setup.heads == HEADS and
                    setup.dim == DIM and setup.dtype == torch.float16 and
                    setup.layers == LAYERS and not setup.mla)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=10, ids=list(range(10, 14)))
    assert ext == (48 if same else 0) and errors == [set()]
    a.close()
    b.close()


def test_namespace_names_the_kv_format_not_its_storage_dtype(server, prefix):
    """vLLM stores every fp8 format as uint8 and builds MLA's spec without a
    kv_quant_mode: an fp8_e4m3 and an fp8_e5m2 instance of one MLA model
    must not share blocks (a fresh-clone test loaded one's latent bytes
    into the other, a full hit). "auto" keeps the storage dtype's name."""
    def ns(cache_dtype, dtype=torch.uint8, **cc):
        s = Setup(vl.MLABackend, mla=True, dim=16, dtype=dtype, cache_dtype=cache_dtype)
        vc = vllm_config(server.url, prefix, s)
        for k, v in cc.items():
            setattr(vc.cache_config, k, v)
        c = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER,
                                                vl.kv_cache_config(BLOCKS, s.groups()))
        out = (c.refused, c.namespace_for_rank(0))
        c.shutdown()
        return out
    e4, e5, auto = ns("fp8_e4m3"), ns("fp8_e5m2"), ns("auto", torch.float16)
    assert e4[0] is None and e5[0] is None
    assert e4[1] != e5[1] and ":fp8_e4m3:" in e4[1] and ":fp8_e5m2:" in e5[1]
    assert ":float16:" in auto[1]
    # a scale each instance computes for itself: its bytes are its own
    why = ns("fp8_e4m3", calculate_kv_scales=True)[0]
    assert why and "--calculate-kv-scales" in why


def test_kv_dtype_never_replaces_what_vllm_runs(server, prefix, raw):
    """A kv_dtype setting replaced the KV format vLLM runs in the namespace,
    and the layout tag named neither dtype nor bytes: an fp8 MLA instance
    started with a copied configuration saying "float16" shared a float16
    instance's namespace, and every block it stored made the other's
    requests fail under vLLM's "fail" policy (a fresh-clone test). Now the
    namespace takes the format from vLLM, a kv_dtype that contradicts it
    fails at start naming both, a kv_dtype that agrees (another spelling)
    changes nothing, and the tag carries the bytes of one token."""
    fp8 = Setup(vl.MLABackend, mla=True, dim=16, dtype=torch.uint8, cache_dtype="fp8_e4m3")
    f16 = Setup(vl.MLABackend, mla=True, dim=16)
    for setup, wrong, runs in ((fp8, "float16", "fp8_e4m3"), (f16, "fp8_e4m3", "float16"),
                               (Setup(), "bf16", "float16"), (fp8, "fp8_e5m2", "fp8_e4m3")):
        with pytest.raises(ValueError) as e:
            Instance(server.url, prefix, setup, kv_dtype=wrong)
        msg = str(e.value)
        assert isinstance(e.value, kv.connector._cfg.ConfigError), msg
        assert "kv_dtype %r" % wrong in msg and "(%s, from " % runs in msg, msg
    a = Instance(server.url, prefix, fp8, kv_dtype="fp8")       # vLLM: fp8 = fp8_e4m3
    same = Instance(server.url, prefix, fp8)
    b = Instance(server.url, prefix, f16, kv_dtype="fp16", policy="fail")
    ns_a, ns_b = a.scheduler.namespace_for_rank(0), b.scheduler.namespace_for_rank(0)
    assert ns_a == same.scheduler.namespace_for_rank(0)
    assert ":fp8_e4m3:" in ns_a and ":float16:" in ns_b
    # the tag: the layout's shape, then one token's bytes (3 layers x 16 elements)
    assert ns_a.endswith(":kv1-mla-l3d16-b48") and ns_b.endswith(":kv1-mla-l3d16-b96")
    assert a.workers[0]._verdict == (True, "kv1-mla-l3d16-b48")
    tokens, hashes = prompt(64, seed=61)
    ext, errors = run_request(a, "r1", tokens, hashes, seed=61)
    assert ext == 0 and errors == [set()]
    assert raw(ns_a).match([kv.block_key(h) for h in hashes[:3]]) == 3
    ext, errors = run_request(b, "r2", tokens, hashes, seed=62, ids=list(range(10, 15)))
    assert ext == 0 and errors == [set()], "no hit on another format's blocks, no failed load"
    ext, errors = run_request(same, "r3", tokens, hashes, seed=63, ids=list(range(10, 15)))
    assert ext == 48 and errors == [set()]
    for i in (a, same, b):
        i.close()


def test_fp8_with_per_tensor_scales_is_refused_in_words(server, prefix, caplog):
    """The refusal tells the operator which --kv-cache-dtype is not served
    (not vLLM's internal kv_quant_mode number)."""
    s = Setup()
    groups = [(names, vl.FullAttentionSpec(BS, HEADS, DIM, torch.uint8))
              for names, _ in s.groups()]
    for _, spec in groups:
        spec.kv_quant_mode = 1             # vLLM's KVQuantMode.FP8_PER_TENSOR
    c = KVConnectorFactory.create_connector(vllm_config(server.url, prefix, s),
                                            KVConnectorRole.SCHEDULER,
                                            vl.kv_cache_config(BLOCKS, groups))
    assert "fp8 KV cache with per-tensor scales (--kv-cache-dtype fp8" in c.refused
    assert "kv_quant_mode" not in c.refused
    c.shutdown()


def test_namespace_names_options_that_change_kv(server, prefix):
    """One checkpoint run with another K/V computation (YaRN through
    --hf-overrides, --quantization fp8 on a bf16 checkpoint, another
    --model-impl) gets its own namespace; a plain run keeps the name it
    had, and the part is the same in every process (no object address)."""
    def ns(**mc):
        s = Setup()
        vc = vllm_config(server.url, prefix, s)
        for k, v in mc.items():
            setattr(vc.model_config, k, v)
        c = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER,
                                                vl.kv_cache_config(BLOCKS, s.groups()))
        out = c.namespace_for_rank(0)
        c.shutdown()
        return out
    plain = ns()
    assert ":kvo" not in plain and plain == ns(quantization=None, hf_overrides={},
                                                model_impl="auto")
    yarn = ns(hf_overrides={"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    yarn2 = ns(hf_overrides={"rope_scaling": {"factor": 4.0, "rope_type": "yarn"}})
    fp8 = ns(quantization="fp8")
    impl = ns(model_impl="transformers")
    assert len({plain, yarn, fp8, impl}) == 4 and yarn == yarn2
    # a function as hf_overrides: named by its qualified name, not its address
    assert ns(hf_overrides=prompt) == ns(hf_overrides=prompt) != plain


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_scheduler_lease_bound_is_not_zero_hits(fresh_server, prefix, policy, caplog):
    """The scheduler's MATCH leases every hit on its own connection and the
    workers' GETs (other connections) cannot end those leases: past
    kvpoold's max_conn_leased_bytes every MATCH was refused QUOTA and the
    instance got no hit at all (a fresh-clone test). Now the lease is short
    (scheduler_lease_ms, 1000) and a hit the bound refuses is the run that
    can be leased, or with the recompute policy an unleased one; the bound
    is named once in the log."""
    chunk = 2 * LAYERS * HEADS * DIM * BS * 2
    fresh_server.extra += ["--max-conn-leased-bytes", str(7 * chunk)]
    fresh_server.start()
    a = Instance(fresh_server.url, prefix, policy=policy)
    prompts = [prompt(64, seed=300 + i) for i in range(6)]
    for i, (tokens, hashes) in enumerate(prompts):
        run_request(a, "a%d" % i, tokens, hashes, seed=i)
    b = Instance(fresh_server.url, prefix, policy=policy)
    assert b.scheduler.scheduler_lease_ms == 1000
    hits = []
    with caplog.at_level("WARNING"):
        for i, (tokens, hashes) in enumerate(prompts):
            ext, errors = run_request(b, "b%d" % i, tokens, hashes, seed=50 + i,
                                      ids=list(range(10, 14)))
            assert errors == [set()]
            hits.append(ext)
    # 3 chunks of each prompt hit: two prompts' leases fit, the third's only in part
    assert hits[:2] == [48, 48]
    if policy == "recompute":
        assert hits == [48] * 6
    else:
        assert hits[2] >= 16 and sum(hits) > 96
    assert sum("max_conn_leased_bytes" in r.getMessage() for r in caplog.records) == 1
    a.close()
    b.close()


def test_scheduler_matches_the_namespace_its_workers_write(server, prefix):
    """vLLM gives the scheduler one worker's kv_cache_config with every
    UniformTypeKVCacheSpecs collapsed to one layer's spec, and with uneven
    pipeline stages stage 0's layers: its own layout tag then differs from
    the workers' and no request ever hit (a fresh-clone test). The scheduler
    MATCHes the namespace each worker says it writes."""
    tokens, hashes = prompt(64, seed=61)
    a = Instance(server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=61)
    b = Instance(server.url, prefix, sched_setup=Setup(heads=4, layers=2))
    assert b.scheduler.layout.tag != b.workers[0].layout.tag
    assert b.scheduler.namespace_for_rank(0) == b.workers[0].namespace_for_rank(0)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=62, ids=list(range(10, 14)))
    assert ext == 48 and errors == [set()]
    assert torch.equal(b.read(0, b.block_ids, 48), a.read(0, a.block_ids, 48))
    a.close()
    b.close()


def test_two_ranks_take_the_min(server, prefix, raw):
    tokens, hashes = prompt(100, seed=5)
    a = Instance(server.url, prefix, tp=2)
    run_request(a, "r1", tokens, hashes, seed=5)
    ns1 = a.workers[1].namespace_for_rank(1)
    assert ns1 != a.workers[0].namespace_for_rank(0)
    raw(ns1).delete(kv.block_key(hashes[3]))
    b = Instance(server.url, prefix, tp=2)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=6, ids=list(range(20, 27)))
    assert ext == 48 and errors == [set(), set()]
    for r in (0, 1):
        assert torch.equal(b.read(r, b.block_ids, 48), a.read(r, a.block_ids, 48))
    assert not torch.equal(a.read(0, a.block_ids, 48), a.read(1, a.block_ids, 48))
    a.close()
    b.close()


def test_mla_rank0_writes_every_rank_reads(server, prefix, raw):
    tokens, hashes = prompt(80, seed=7)
    mla = Setup(vl.MLABackend, mla=True, dim=24)
    a = Instance(server.url, prefix, mla, tp=2)
    ns = a.workers[0].namespace_for_rank(0)
    assert ns == a.workers[1].namespace_for_rank(1)
    run_request(a, "r1", tokens, hashes, seed=7)
    assert raw(ns).match([kv.block_key(h) for h in hashes]) == 5
    b = Instance(server.url, prefix, mla, tp=2)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=8, ids=list(range(20, 25)))
    assert ext == 64 and errors == [set(), set()]
    for r in (0, 1):
        assert torch.equal(b.read(r, b.block_ids, 64), a.read(0, a.block_ids, 64))
    a.close()
    b.close()


def test_roles(server, prefix, raw):
    """Row 3: kv_producer stores and never loads; kv_consumer loads and
    never stores; kv_both does both."""
    tokens, hashes = prompt(64, seed=11)
    keys = [kv.block_key(h) for h in hashes]
    c = Instance(server.url, prefix, role="kv_consumer")
    ns = c.scheduler.namespace_for_rank(0)
    ext, errors = run_request(c, "c1", tokens, hashes, seed=11)
    assert ext == 0 and raw(ns).match(keys) == 0, "a consumer never stores"
    p = Instance(server.url, prefix, role="kv_producer")
    run_request(p, "p1", tokens, hashes, seed=12)
    assert raw(ns).match(keys) == 4
    want = p.read(0, p.block_ids, 48)
    ext, _ = run_request(p, "p2", tokens, hashes, seed=13, ids=list(range(20, 24)))
    assert ext == 0, "a producer never loads"
    ext, errors = run_request(c, "c2", tokens, hashes, seed=14, ids=list(range(20, 24)))
    assert ext == 48 and errors == [set()]
    assert torch.equal(c.read(0, c.block_ids, 48), want)
    for i in (c, p):
        i.close()


@pytest.mark.parametrize("cap,words", [(0, "grants no retention"), (1000, "cut to")])
def test_pd_retain_ms_the_server_does_not_grant_is_logged(fresh_server, prefix, caplog, cap,
                                                          words):
    """pd_retain_ms asks kvpoold to keep handed-off blocks; a server that
    grants no retention (max_retain_ms 0) or less than asked made the
    operator believe the blocks were protected: logged once, when the
    store connection is made."""
    fresh_server.extra += ["--max-retain-ms", str(cap)]
    fresh_server.start()
    tokens, hashes = prompt(64, seed=71)
    with caplog.at_level("WARNING"):
        p = Instance(fresh_server.url, prefix, role="kv_producer", pd_retain_ms=60000)
        run_request(p, "p1", tokens, hashes, seed=71)
        run_request(p, "p2", tokens, hashes, seed=72, ids=list(range(20, 24)))
        p.close()
    hits = [r.getMessage() for r in caplog.records if "retain" in r.getMessage()]
    assert len(hits) == 1 and words in hits[0] and "60000" in hits[0], hits


def test_failure_policy_warns_once_at_start(server, prefix, caplog):
    """Row 7: kv_load_failure_policy is read; an instance that loads with
    "fail" is warned about once, at start."""
    from kvpool.vllm import connector
    connector._POLICY_WARNED.clear()         # once per process: other tests may have seen it
    with caplog.at_level(logging.WARNING, "kvpool.vllm"):
        a = Instance(server.url, prefix, role="kv_consumer", policy="fail")
        b = Instance(server.url, prefix, role="kv_consumer", policy="fail")
    warned = [r for r in caplog.records if "kv_load_failure_policy" in r.getMessage()]
    assert len(warned) == 1 and "recompute" in warned[0].getMessage()
    assert a.scheduler.failure_policy == "fail"
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kvpool.vllm"):
        c = Instance(server.url, prefix, role="kv_both", policy="recompute")
        d = Instance(server.url, prefix, role="kv_producer", policy="fail")
    assert not [r for r in caplog.records if "kv_load_failure_policy" in r.getMessage()]
    for i in (a, b, c, d):
        i.close()


def test_required_layout_is_a_classmethod():
    """Row 5: vLLM calls get_required_kvcache_layout on the class."""
    attr = inspect.getattr_static(kv.KVPoolConnector, "get_required_kvcache_layout")
    assert isinstance(attr, classmethod)
    assert kv.KVPoolConnector.get_required_kvcache_layout(SimpleNamespace()) is None


def test_supports_hma_and_hybrid_groups(server, prefix):
    """Row 6: the connector is SupportsHMA, so vLLM keeps the hybrid KV-cache
    manager on; a model with a full-attention and a sliding-window group
    round-trips, loading nothing into the sliding window's null blocks."""
    assert vbase.supports_hma(kv.KVPoolConnector)
    assert issubclass(kv.KVPoolConnector, vbase.SupportsHMA)
    tokens = [(31 * i) % 30000 for i in range(100)]
    hashes = hashes_for(tokens, BS)
    swa = Setup(sliding=32)
    a = Instance(server.url, prefix, swa)
    assert a.workers[0]._layers is not None
    ext, errors = run_request(a, "r1", tokens, hashes, seed=1,
                              ids=[list(range(3, 10)), list(range(12, 19))])
    assert ext == 0 and errors == [set()]
    b = Instance(server.url, prefix, swa)
    # the sliding-window group gets null blocks (0) for the tokens out of the window
    ids = [list(range(20, 27)), [0, 0, 0, 0, 28, 29, 30]]
    ext, errors = run_request(b, "r2", tokens, hashes, seed=2, ids=ids)
    assert ext == 96 and errors == [set()]
    full_a = a.read(0, a.block_ids, 96)
    full_b = b.read(0, b.block_ids, 96)
    for i, (g, _, t) in enumerate(b._layers(0)):
        if g == 0:
            assert torch.equal(full_b[i], full_a[i])
        else:                          # only the window's blocks were loaded
            assert torch.equal(full_b[i][:, 64:96], full_a[i][:, 64:96])
            assert not t[:, 0].any(), "nothing is written into the null block"
    a.close()
    b.close()


def test_store_in_flight_of_blocks_freed_mid_request_sends_the_request_bytes(fresh_server,
                                                                             prefix):
    """vLLM frees a running request's sliding-window blocks that left the
    window at its next allocation and may give them to another request,
    whose forward writes them in the next step. A zero-copy store (KV
    caches in host memory) still in flight then sent the other request's
    bytes under this request's keys, with a valid checksum (libkvpool
    computes it when it sends): a fresh-clone test. Here the pool is
    stopped while the step's store is in flight, and the sliding-window
    blocks are overwritten meanwhile; what another instance loads must be
    the bytes the request computed. Stores of such models are staged in
    the step (loads and full-attention-only models stay zero copy)."""
    import signal
    fresh_server.start()
    tokens = [(31 * i) % 30000 for i in range(100)]
    hashes = hashes_for(tokens, BS)
    swa = Setup(sliding=32)
    a = Instance(fresh_server.url, prefix, swa)
    w = a.workers[0]
    assert not w.stage, "KV caches in host memory: loads in place"
    want = {}
    save = w.wait_for_save

    def wait_for_save_then_reuse():
        meta = w._get_connector_metadata()
        if not meta or not meta.stores or want:
            return save()
        fresh_server.proc.send_signal(signal.SIGSTOP)    # a slow pool: the store waits
        try:
            save()
            want["kv"] = a.read(0, a.block_ids, 96)
            # the next step: the window's old blocks went to another request
            for g, _, t in a._layers(0):
                if g == 1:
                    t[:, 12:19] = 99
            time.sleep(0.2)
        finally:
            fresh_server.proc.send_signal(signal.SIGCONT)
    w.wait_for_save = wait_for_save_then_reuse
    ext, errors = run_request(a, "r1", tokens, hashes, seed=1,
                              ids=[list(range(3, 10)), list(range(12, 19))])
    assert ext == 0 and errors == [set()] and want
    assert w.flush_stores(10) and w._pipeline.chunks_put == 6
    b = Instance(fresh_server.url, prefix, swa)
    ids = [list(range(20, 27)), [0, 0, 0, 0, 28, 29, 30]]
    ext, errors = run_request(b, "r2", tokens, hashes, seed=2, ids=ids)
    assert ext == 96 and errors == [set()]
    got = b.read(0, b.block_ids, 96)
    for i, (g, _, _) in enumerate(b._layers(0)):
        if g == 0:
            assert torch.equal(got[i], want["kv"][i])
        else:
            assert torch.equal(got[i][:, 64:96], want["kv"][i][:, 64:96]), \
                "the sliding window's KV is the request's, not the block's next user's"
    a.close()
    b.close()


def test_pool_down_and_failed_loads(fresh_server, prefix):
    fresh_server.start()
    port = fresh_server.port
    tokens, hashes = prompt(50, seed=9)
    a = Instance(fresh_server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=9)
    # the pool dies between the scheduler's answer and the workers' loads
    b = Instance(fresh_server.url, prefix)
    req = Request("r2", tokens, hashes)
    ext, _ = b.scheduler.get_num_new_matched_tokens(req, 0)
    assert ext == 48
    fresh_server.kill()
    b.block_ids = list(range(20, 24))
    b.n_tokens = len(tokens)
    b.scheduler._reqs.pop("r2")                  # forget the answer: ask again, pool down
    ext, errors = step(b.scheduler, b.workers, req, b.block_ids, 0, b.forward(10))
    assert ext == 0, "a pool that is down gives (0, False)"
    assert errors == [set()]
    fresh_server.start(port=port)
    c = Instance(fresh_server.url, prefix)
    run_request(c, "r3", tokens, hashes, seed=11)
    # the instance that saw the pool die hits again, with no restart of its own
    import time
    deadline = time.monotonic() + 20
    # the scheduler's and each worker's connections reconnect on their own back-offs
    while time.monotonic() < deadline:
        if b.scheduler.get_num_new_matched_tokens(Request("r2b%f" % time.monotonic(), tokens,
                                                          hashes), 0)[0] == 48 and \
                all(link.up for w in b.workers for link in list(w._links.values())):
            break
        time.sleep(0.2)
    ext, errors = step(b.scheduler, b.workers, Request("r2c", tokens, hashes),
                       list(range(20, 24)), 0, b.forward(10))
    assert ext == 48 and errors == [set()]
    d = Instance(fresh_server.url, prefix)
    scheduler, worker = d.scheduler, d.workers[0]
    req = Request("r4", tokens, hashes)
    assert scheduler.get_num_new_matched_tokens(req, 0) == (48, False)
    scheduler.update_state_after_alloc(req, Blocks([1, 2, 3, 4]), 48)
    meta = scheduler.build_connector_meta(SimpleNamespace(
        scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={},
        finished_req_ids=set()))
    fresh_server.kill()
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(SimpleNamespace())
    assert worker.get_block_ids_with_load_errors() == {1, 2, 3}
    assert worker.get_block_ids_with_load_errors() == set()
    for i in (a, b, c, d):
        i.close()


def test_other_seed_and_hash_algo_never_hit(server, prefix):
    tokens, hashes = prompt(40, seed=12)
    a = Instance(server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=12)
    other_seed = kvpool.block_hashes(tokens, BS, extra=b"another seed")
    b = Instance(server.url, prefix)
    ext, _ = run_request(b, "r2", tokens, other_seed, seed=13)
    assert ext == 0
    c = Instance(server.url, prefix, hash_algo="xxhash")
    ext, _ = run_request(c, "r3", tokens, hashes, seed=13)
    assert ext == 0
    for i in (a, b, c):
        i.close()


def test_local_hits_and_limits(server, prefix):
    tokens, hashes = prompt(64, seed=3)
    a = Instance(server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=3)
    b = Instance(server.url, prefix)
    ext, _ = run_request(b, "r2", tokens, hashes, seed=4, local=32)
    assert ext == 16, "64 tokens: at most 63 -> 3 blocks, 2 computed locally"
    c = Instance(server.url, prefix, chunk_blocks=2)
    ext, _ = run_request(c, "r3", tokens, hashes, seed=4, local=16)
    assert ext == 0, "16 local tokens are not a whole 2-block chunk"
    for i in (a, b, c):
        i.close()


def test_rank_comes_from_vllm_and_a_configured_rank_must_agree(server, prefix, raw):
    """Finding 2: vLLM gives every worker the same extra config, so a
    "rank" there named one rank for all workers (both TP workers wrote
    r0 and a later instance loaded TP rank 1's shard into rank 0). The
    rank is vLLM's; a configured rank that disagrees, or one outside
    0..tp*pp-1, is refused at start."""
    s = Setup()
    kcc = vl.kv_cache_config(BLOCKS, s.groups())

    def config(tp, vllm_rank, configured=None):
        vc = vllm_config(server.url, prefix, s, tp, vllm_rank)
        if configured is not None:
            vc.kv_transfer_config.kv_connector_extra_config["rank"] = configured
        return vc
    for tp, vllm_rank, configured in ((2, 1, 0), (1, 0, 7), (2, 0, 1)):
        with pytest.raises(ValueError) as e:
            kv.KVPoolConnector(config(tp, vllm_rank, configured), KVConnectorRole.WORKER, kcc)
        assert "rank" in str(e.value)
    ok = kv.KVPoolConnector(config(2, 1, 1), KVConnectorRole.WORKER, kcc)
    assert ok.rank == 1 and ok.namespace_for_rank(1).split(":")[-2] == "r1"
    ok.shutdown()
    with pytest.raises(ValueError):     # vLLM's own rank outside the instance
        kv.KVPoolConnector(config(2, 2), KVConnectorRole.WORKER, kcc)
    # with no setting, each TP worker writes its own shard under its own rank
    tokens, hashes = prompt(64, seed=61)
    a = Instance(server.url, prefix, tp=2)
    run_request(a, "r1", tokens, hashes, seed=61)
    keys = [kv.block_key(h) for h in hashes[:3]]
    for r in (0, 1):
        c = raw(a.workers[r].namespace_for_rank(r))
        assert c.match(keys) == 3
        got = [bytes(x) for x in c.get_many(keys[:1])]
        want = a.workers[r]._layers[0].view(a.block_ids[0], 0).contiguous().numpy().tobytes()
        assert got[0].startswith(want), "rank %d's namespace holds rank %d's shard" % (r, r)
    a.close()


@pytest.mark.parametrize("extra,words", [
    ({"chunk_blocks": 10 ** 9}, "chunk_blocks"), ({"namespace_prefx": "x"}, "namespace_prefix"),
    ({"namespace_prefix": ""}, "empty"), ({"timeout_s": 1e-9}, "timeout_s"),
    ({"timeout_s": 1e12}, "timeout_s")])
def test_connector_settings_checked_at_start(server, prefix, extra, words):
    """Finding 14: settings that cannot work fail at start, naming the
    setting: a huge chunk_blocks, a misspelt key, an empty prefix, a
    timeout libkvpool would refuse."""
    s = Setup()
    vc = vllm_config(server.url, prefix, s, **extra)
    with pytest.raises(ValueError) as e:
        kv.KVPoolConnector(vc, KVConnectorRole.SCHEDULER, vl.kv_cache_config(BLOCKS, s.groups()))
    assert words in str(e.value)


def test_failure_policy_must_be_vllms(server, prefix):
    """Finding 14: kv_load_failure_policy "bogus" is refused."""
    s = Setup()
    vc = vllm_config(server.url, prefix, s, policy="bogus")
    with pytest.raises(ValueError) as e:
        kv.KVPoolConnector(vc, KVConnectorRole.SCHEDULER, vl.kv_cache_config(BLOCKS, s.groups()))
    assert "kv_load_failure_policy" in str(e.value)


def test_unknown_setting_is_logged(server, prefix, caplog):
    s = Setup()
    vc = vllm_config(server.url, prefix, s, some_other_tool_key=1)
    with caplog.at_level(logging.WARNING, "kvpool.engines"):
        c = kv.KVPoolConnector(vc, KVConnectorRole.SCHEDULER,
                               vl.kv_cache_config(BLOCKS, s.groups()))
    assert any("some_other_tool_key" in r.getMessage() for r in caplog.records)
    c.shutdown()


def test_chunk_larger_than_max_block_bytes_fails_at_start(fresh_server, prefix):
    """Finding 14: a chunk the server can never store is found at start."""
    fresh_server.extra += ["--max-block-bytes", "4KiB"]
    fresh_server.start()
    s = Setup()
    with pytest.raises(ValueError) as e:
        kv.KVPoolConnector(vllm_config(fresh_server.url, prefix, s, chunk_blocks=4),
                           KVConnectorRole.SCHEDULER, vl.kv_cache_config(BLOCKS, s.groups()))
    assert "max_block_bytes" in str(e.value)


# ---- issue 29: retention hints and the load estimator ---------------------------------

def test_retention_first_chunks_and_refresh(server, prefix, raw):
    """retain_first_blocks=2 / retain_ms: a prompt's first two chunks are
    stored retained, the rest ordinary; another instance's hit on them
    refreshes the retention (they are loaded, never put again)."""
    tokens, hashes = prompt(100, seed=31)             # 6 whole chunks of 16 tokens
    a = Instance(server.url, prefix, retain_first_blocks=2, retain_ms=60000)
    run_request(a, "r1", tokens, hashes, seed=31)
    ns = a.scheduler.namespace_for_rank(0)
    st = raw(ns).stats(ns)["namespaces"][ns]
    assert st["blocks"] == 6 and st["retained_blocks"] == 2
    b = Instance(server.url, prefix, retain_first_blocks=2, retain_ms=60000)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=32, ids=list(range(20, 27)))
    assert ext == 96 and errors == [set()]
    st2 = raw(ns).stats(ns)["namespaces"][ns]
    assert st2["retained_blocks"] == 2
    assert st2["match_requests"] > st["match_requests"]
    a.close()
    b.close()


def test_retention_per_request(server, prefix, raw):
    """kv_transfer_params {"kvpool_retain_ms": MS} retains every chunk of
    that request; a value that is no retention is ignored."""
    a = Instance(server.url, prefix)
    tokens, hashes = prompt(70, seed=33)
    req = Request("r1", tokens, hashes)
    req.kv_transfer_params = {"kvpool_retain_ms": 30000}
    a.block_ids, a.n_tokens = list(range(3, 8)), len(tokens)
    step(a.scheduler, a.workers, req, a.block_ids, 0, a.forward(33))
    ns = a.scheduler.namespace_for_rank(0)
    assert raw(ns).stats(ns)["namespaces"][ns]["retained_blocks"] == 4
    tokens2, hashes2 = prompt(70, seed=34)
    req2 = Request("r2", tokens2, hashes2)
    req2.kv_transfer_params = {"kvpool_retain_ms": -1}
    a.block_ids, a.n_tokens = list(range(10, 15)), len(tokens2)
    step(a.scheduler, a.workers, req2, a.block_ids, 0, a.forward(34))
    st = raw(ns).stats(ns)["namespaces"][ns]
    assert st["blocks"] == 8 and st["retained_blocks"] == 4
    a.close()


@pytest.mark.parametrize("speed,offered", [(1e-3, True), (1e12, False)])
def test_estimator_in_the_scheduler(server, prefix, speed, offered):
    """prefill_tokens_per_s: the scheduler learns the load speed from the
    workers' load timings (worker metadata) and then offers a hit only
    when loading it beats recomputing it (a prefill that is practically
    free: never, but for one probe in PROBE_EVERY)."""
    tokens, hashes = prompt(100, seed=35)
    a = Instance(server.url, prefix)
    run_request(a, "r1", tokens, hashes, seed=35)
    b = Instance(server.url, prefix, prefill_tokens_per_s=speed)
    ext, _ = run_request(b, "r2", tokens, hashes, seed=36, ids=list(range(20, 27)))
    assert ext == 96                                   # learning: the first load is measured
    assert b.scheduler.estimator.s_per_byte is not None
    exts = [b.scheduler.get_num_new_matched_tokens(Request("q%d" % i, tokens, hashes), 0)[0]
            for i in range(b.scheduler.estimator.PROBE_EVERY)]
    if offered:
        assert exts == [96] * len(exts)
    else:
        assert sorted(exts) == [0] * (len(exts) - 1) + [96]
    a.close()
    b.close()
