"""kvpool.vllm's KV connector inside vLLM's own code (KVPOOL_VLLM_SRC).

Each vLLM instance is a scheduler-side process and one process per
worker rank (vllm_roles), driven step by step as vLLM's engine core and
executor drive them. The KV caches are allocated and shaped by vLLM's
model runner code for each attention backend; one instance stores, a
second loads into other blocks, and every loaded token's K and V must be
byte-exact. A layout the connector refuses must cost hits, never a
request."""

import multiprocessing
import os

import pytest

import engine_env

if engine_env.source("vllm") is None:
    pytest.skip("KVPOOL_VLLM_SRC is not set", allow_module_level=True)

os.environ.setdefault("PYTHONHASHSEED", "0")
import vllm_roles  # noqa: E402

CTX = multiprocessing.get_context("spawn")
BLOCKS = 24


def base(**kw):
    s = {"backend": "flash_attn", "block": 16, "heads": 2, "head_size": 64, "layers": 3,
         "num_blocks": BLOCKS, "layout": "NHD"}
    s.update(kw)
    return s


class Proc:
    def __init__(self, target, *args):
        self.conn, child = CTX.Pipe()
        self.p = CTX.Process(target=target, args=(child,) + args, daemon=True)
        self.p.start()
        self.ready = self._recv(120)

    def _recv(self, timeout=60):
        assert self.conn.poll(timeout), "no answer from %s" % self.p
        kind, value = self.conn.recv()
        if kind == "error":
            raise AssertionError("vLLM-side process failed:\n" + value)
        return value

    def __call__(self, what, *args):
        self.conn.send((what, args))
        return self._recv()

    def stop(self):
        try:
            self("stop")
        finally:
            self.p.join(10)


class Instance:
    """A vLLM instance: the scheduler process and a process per worker rank."""

    def __init__(self, url, prefix, setup, role="kv_both", policy="recompute"):
        self.setup = setup
        self.scheduler = Proc(vllm_roles.scheduler_main, setup, url, prefix, role, policy)
        self.workers = [Proc(vllm_roles.worker_main, setup, url, prefix, r, role, policy)
                        for r in range(setup.get("tp", 1))]
        self.verdicts = [w.ready for w in self.workers]
        # one idle step: the workers' layout verdicts reach the scheduler
        so = self.scheduler("idle")
        outs = [w("step", so) for w in self.workers]
        self.scheduler("outputs", outs)

    def request(self, req_id, tokens, block_ids, seed, local=0):
        ext, so, hashes = self.scheduler("schedule", req_id, tokens, block_ids, local)
        first = local + ext
        outs = [w("step", so, (block_ids, first, len(tokens), seed))
                for w in self.workers]
        errors = self.scheduler("outputs", outs, req_id, block_ids)
        self.release(req_id)
        return ext, errors, hashes

    def release(self, req_id, timeout_s=30):
        """Steps with nothing scheduled (the first names the request as
        finished) until vLLM may free its blocks: every worker has reported
        it finished sending (its stores run in the background)."""
        import time
        end = time.monotonic() + timeout_s
        finished = [req_id]
        while self.scheduler("holding", req_id):
            assert time.monotonic() < end, "%s was never reported finished sending" % req_id
            so = self.scheduler("idle", finished)
            finished = []
            self.scheduler("outputs", [w("step", so) for w in self.workers])
            time.sleep(0.005)

    def read(self, rank, block_ids, n, groups=None):
        return self.workers[rank]("read", block_ids, n, groups)

    def close(self):
        for p in [self.scheduler] + self.workers:
            p.stop()


def tokens_for(n, seed):
    return [(seed * 977 + i) % 30000 for i in range(n)]


def ids(groups, first, n):
    return [list(range(first + 8 * g, first + 8 * g + n)) for g in range(groups)]


def test_report():
    """The snapshot's commit, the modules driven, the stubs (every vLLM
    module is loaded in the vLLM-side processes only)."""
    p = Proc(vllm_roles.report_main)
    print(p.ready)
    p.p.join(10)


LAYOUTS = {
    "flash_attn-nhd": (base(), base()),
    "flash_attn-hnd": (base(layout="HND"), base(layout="HND")),
    "flash_attn-kernel16-block32": (base(block=32, kernel=16), base(block=32, kernel=16)),
    "flashinfer-nhd": (base(backend="flashinfer"), base(backend="flashinfer")),
    "flashinfer-hnd": (base(backend="flashinfer", layout="HND"),
                       base(backend="flashinfer", layout="HND")),
    "flashinfer-hnd-kernel16-block32": (base(backend="flashinfer", layout="HND", block=32,
                                             kernel=16),
                                        base(backend="flashinfer", layout="HND", block=32,
                                             kernel=16)),
    "triton": (base(backend="triton"), base(backend="triton")),
    "cpu": (base(backend="cpu"), base(backend="cpu")),
    "mla": (base(backend="mla", mla=True, head_size=96), base(backend="mla", mla=True,
                                                              head_size=96)),
    "tp2": (base(tp=2), base(tp=2)),
    "nhd-stores-hnd-loads": (base(), base(backend="flashinfer", layout="HND")),
    "cpu-stores-flashinfer-loads": (base(backend="cpu"), base(backend="flashinfer")),
    "kernel16-stores-kernel32-loads": (base(block=32, kernel=16),
                                       base(backend="flashinfer", layout="HND", block=32)),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_round_trip(server, prefix, name):
    a_setup, b_setup = LAYOUTS[name]
    a = Instance(server.url, prefix, a_setup)
    b = None
    try:
        assert all(v[0] for v in a.verdicts), a.verdicts
        block = a_setup["block"]
        toks = tokens_for(100, 1)
        n = (len(toks) + block - 1) // block
        a_ids = ids(1, 3, n)
        ext, errors, _ = a.request("r1", toks, a_ids, seed=1)
        assert ext == 0 and errors == []
        b = Instance(server.url, prefix, b_setup)
        assert all(v[0] for v in b.verdicts), b.verdicts
        b_ids = [list(range(BLOCKS - 1, BLOCKS - 1 - n, -1))]
        ext, errors, _ = b.request("r2", toks, b_ids, seed=2)
        want = (99 // block) * block
        assert ext == want and errors == []
        for r in range(a_setup.get("tp", 1)):
            assert b.read(r, b_ids, ext) == a.read(r, a_ids, ext), "rank %d differs" % r
        assert b.read(0, b_ids, ext + 1)[0][ext] != a.read(0, a_ids, ext + 1)[0][ext]
    finally:
        a.close()
        if b is not None:
            b.close()


def test_per_layer_kv_heads_hit(server, prefix):
    """Layers of one type with different KV head counts (vLLM's
    UniformTypeKVCacheSpecs): vLLM hands the scheduler a config collapsed
    to one layer's spec (generate_scheduler_kv_cache_config), so the
    scheduler's layout tag differed from the workers' and no request ever
    hit. The scheduler MATCHes the namespace the workers say they write;
    the loaded KV is byte-exact."""
    s = base(uniform_heads=[2, 4], layers=4)
    a = Instance(server.url, prefix, s)
    b = None
    try:
        assert all(v[0] for v in a.verdicts), a.verdicts
        toks = tokens_for(100, 31)
        a_ids = ids(1, 3, 7)
        ext, errors, _ = a.request("r1", toks, a_ids, seed=1)
        assert ext == 0 and errors == []
        b = Instance(server.url, prefix, s)
        b_ids = [list(range(BLOCKS - 1, BLOCKS - 8, -1))]
        ext, errors, _ = b.request("r2", toks, b_ids, seed=2)
        assert ext == 96 and errors == []
        assert b.read(0, b_ids, ext) == a.read(0, a_ids, ext)
    finally:
        a.close()
        if b is not None:
            b.close()


def test_namespaces_tell_apart_what_changes_the_bytes(server, prefix):
    """Through vLLM's own KVConnectorFactory and KV-cache specs: an MLA
    model's fp8_e4m3 and fp8_e5m2 caches (both stored as uint8) get
    different namespaces; an fp8 GQA cache is refused in words naming
    --kv-cache-dtype; model paths that differ only in non-ASCII characters
    or space vs '_', and YaRN through hf_overrides or --quantization fp8,
    get namespaces of their own; a plain model keeps its plain name."""
    mla = base(mla=True, heads=1, head_size=576, layers=2, backend="mla")
    gqa = base()
    cases = [("e4m3", mla, {}, "fp8_e4m3", "mla"), ("e5m2", mla, {}, "fp8_e5m2", "mla"),
             ("mla-auto", mla, {}, "auto", "mla"), ("gqa-fp8", gqa, {}, "fp8", "fp8-full"),
             ("plain", gqa, {}, "auto", "full"),
             ("cjk1", gqa, {"model": "/data/模型/Qwen2-7B"}, "auto", "full"),
             ("cjk2", gqa, {"model": "/data/权重/Qwen2-7B"}, "auto", "full"),
             ("space", gqa, {"model": "/models/Qwen2 7B"}, "auto", "full"),
             ("under", gqa, {"model": "/models/Qwen2_7B"}, "auto", "full"),
             ("yarn", gqa, {"hf_overrides": {"rope_scaling": {"rope_type": "yarn",
                                                              "factor": 4.0}}}, "auto", "full"),
             ("quant", gqa, {"quantization": "fp8"}, "auto", "full")]
    p = Proc(vllm_roles.namespaces_main, server.url, prefix, cases)
    try:
        ns = p.ready
    finally:
        p.p.join(10)
    assert ns["e4m3"][0] is None and ns["e5m2"][0] is None
    assert ns["e4m3"][1] != ns["e5m2"][1] != ns["mla-auto"][1]
    assert ":fp8_e5m2:" in ns["e5m2"][1]
    assert "--kv-cache-dtype fp8" in ns["gqa-fp8"][0]
    assert ns["plain"][1] == ("%s:real/llama:float16:sha256:c16:tp1pp1:r0:kv1-l3h2d64-b1536"
                              % prefix)
    assert ns["cjk1"][1] != ns["cjk2"][1] and ns["space"][1] != ns["under"][1]
    assert len({ns[k][1] for k in ("plain", "yarn", "quant")}) == 3


def test_kv_dtype_never_replaces_what_vllm_runs(server, prefix):
    """Through vLLM's own KVConnectorFactory and MLAAttentionSpec: an MLA
    instance started with --kv-cache-dtype fp8_e4m3 and a copied
    configuration's "kv_dtype": "float16" used to share a float16
    instance's namespace (its blocks made the other's requests fail under
    the "fail" policy). Now the factory raises at start, in words naming
    both; a kv_dtype that agrees (vLLM's "fp8" is fp8_e4m3) changes
    nothing; the layout tag ends with one token's bytes."""
    mla = base(mla=True, heads=1, head_size=96, layers=3, backend="mla")
    cases = [("wrong", mla, {}, "fp8_e4m3", "mla", {"kv_dtype": "float16"}),
             ("e4m3", mla, {}, "fp8_e4m3", "mla"),
             ("agrees", mla, {}, "fp8_e4m3", "mla", {"kv_dtype": "fp8"}),
             ("f16", mla, {}, "auto", "mla"),
             ("f16-wrong", mla, {}, "auto", "mla", {"kv_dtype": "fp8_e4m3"})]
    p = Proc(vllm_roles.namespaces_main, server.url, prefix, cases)
    try:
        ns = p.ready
    finally:
        p.p.join(10)
    for label, runs in (("wrong", "fp8_e4m3"), ("f16-wrong", "float16")):
        why, name = ns[label]
        assert name is None and why.startswith("error: ConfigError:"), ns[label]
        assert "kv_dtype" in why and "(%s, from " % runs in why, why
    assert ns["agrees"] == ns["e4m3"] and ns["e4m3"][0] is None
    assert ns["e4m3"][1].endswith(":fp8_e4m3:sha256:c16:tp1pp1:mla-pp0:kv1-mla-l3d96-b288")
    assert ns["f16"][1].endswith(":float16:sha256:c16:tp1pp1:mla-pp0:kv1-mla-l3d96-b576")


def test_scheduler_lease_bound_is_not_zero_hits(fresh_server, prefix):
    """The scheduler's MATCH leases on its own connection and the workers'
    GETs cannot end those leases: past max_conn_leased_bytes every MATCH was
    refused and the instance got no hit until the 5 s leases lapsed. With
    the recompute policy every request now hits (a short lease, the leased
    run, then an unleased one), byte-exact."""
    s = base()
    chunk = 2 * s["layers"] * s["heads"] * s["head_size"] * s["block"] * 2
    fresh_server.extra += ["--max-conn-leased-bytes", str(10 * chunk)]
    fresh_server.start()
    a = Instance(fresh_server.url, prefix, s)
    b = None
    try:
        prompts = [tokens_for(65, 100 + i) for i in range(6)]
        for i, p in enumerate(prompts):
            a.request("a%d" % i, p, ids(1, 1, 5), seed=i)
        b = Instance(fresh_server.url, prefix, s)
        hits = []
        for i, p in enumerate(prompts):
            ext, errors, _ = b.request("b%d" % i, p, ids(1, 6, 5), seed=50 + i)
            assert errors == []
            hits.append(ext)
        assert hits == [64] * 6, hits
        # both instances' blocks now hold the last prompt
        assert b.read(0, ids(1, 6, 5), 64) == a.read(0, ids(1, 1, 5), 64)
    finally:
        a.close()
        if b is not None:
            b.close()


def test_hybrid_groups_with_sliding_window(server, prefix):
    """SupportsHMA: a full-attention and a sliding-window group; the second
    instance's sliding-window blocks out of the window are vLLM's null block."""
    setup = base(sliding=32)
    a = Instance(server.url, prefix, setup)
    b = None
    try:
        toks = tokens_for(100, 3)
        a_ids = [list(range(3, 10)), list(range(12, 19))]    # one block pool, shared
        ext, errors, _ = a.request("r1", toks, a_ids, seed=1)
        assert ext == 0 and errors == []
        b = Instance(server.url, prefix, setup)
        b_ids = [list(range(10, 17)), [0, 0, 0, 0, 20, 21, 22]]
        ext, errors, _ = b.request("r2", toks, b_ids, seed=2)
        assert ext == 96 and errors == []
        assert b.read(0, b_ids, 96, [0]) == a.read(0, a_ids, 96, [0])
        got, want = b.read(0, b_ids, 96, [1]), a.read(0, a_ids, 96, [1])
        assert [row[64:] for row in got] == [row[64:] for row in want]
    finally:
        a.close()
        if b is not None:
            b.close()


def test_store_in_flight_of_freed_sliding_window_blocks(fresh_server, prefix):
    """vLLM's SlidingWindowManager frees a running request's blocks that
    left the window at its next allocation, and another request's forward
    may write them in the next step. With KV caches in host memory
    (FlashAttention's layout here: read in place) a store still in flight
    sent that request's bytes under this one's keys (a fresh-clone test).
    The pool is stopped while the step's store waits; the sliding-window
    blocks are written by another forward meanwhile; a second instance
    must load the bytes the first request computed."""
    import signal
    import time
    fresh_server.start()
    setup = base(sliding=32, num_blocks=40)
    a = Instance(fresh_server.url, prefix, setup)
    b = None
    try:
        toks = tokens_for(97, 7)
        a_ids = [list(range(1, 8)), list(range(10, 17))]
        ext, so, _ = a.scheduler("schedule", "r1", toks, a_ids, 0)
        assert ext == 0
        fresh_server.proc.send_signal(signal.SIGSTOP)      # a slow pool: the store waits
        try:
            outs = [w("step", so, (a_ids, 0, len(toks), 1)) for w in a.workers]
            want = a.read(0, a_ids, 96, [1])
            # the next step: the window's old blocks went to another request
            a.workers[0]("forward", [list(range(30, 37)), a_ids[1]], 0, 96, 4242)
            assert a.read(0, a_ids, 96, [1]) != want
            time.sleep(0.2)
        finally:
            fresh_server.proc.send_signal(signal.SIGCONT)
        a.scheduler("outputs", outs, "r1", a_ids)
        a.release("r1")
        b = Instance(fresh_server.url, prefix, setup)
        b_ids = [list(range(20, 27)), list(range(30, 37))]
        ext, errors, _ = b.request("r2", toks, b_ids, seed=9)
        assert ext == 96 and errors == []
        assert b.read(0, b_ids, 96, [1]) == want, "the request's own sliding-window KV"
    finally:
        a.close()
        if b is not None:
            b.close()


def test_roles_and_unserved_groups(server, prefix):
    """A consumer never stores, a producer never loads; a model with a
    Mamba group offers no hits and stores nothing."""
    toks = tokens_for(64, 5)
    c = Instance(server.url, prefix, base(), role="kv_consumer")
    p = m = None
    try:
        ext, errors, _ = c.request("c1", toks, ids(1, 3, 4), seed=1)
        assert ext == 0
        p = Instance(server.url, prefix, base(), role="kv_producer")
        ext, _, _ = p.request("p1", toks, ids(1, 3, 4), seed=2)
        assert ext == 0
        ext, _, _ = p.request("p2", toks, ids(1, 8, 4), seed=3)
        assert ext == 0, "a producer never loads"
        ext, errors, _ = c.request("c2", toks, ids(1, 9, 4), seed=4)
        assert ext == 48 and errors == []
        assert c.read(0, ids(1, 9, 4), 48) == p.read(0, ids(1, 3, 4), 48)
        m = Instance(server.url, prefix, base(mamba=True))
        ext, errors, _ = m.request("m1", toks, [[3, 4, 5, 6], [8, 9, 10, 11]], seed=5)
        assert ext == 0 and errors == []
    finally:
        for i in (c, p, m):
            if i is not None:
                i.close()


# ---- issue 24, fresh-clone findings (items 1 and 2) -----------------------------------------

def test_rank_in_the_extra_config_is_refused(server, prefix):
    """Finding 2: vLLM hands every worker the same
    kv_connector_extra_config, so "rank": 0 landed on both TP workers,
    both wrote r0 and another instance loaded TP rank 1's shard into rank
    0. The rank is vLLM's: worker 0 (where 0 is right) starts, worker 1
    refuses to."""
    setup = base(tp=2, extra_rank=0)
    w0 = Proc(vllm_roles.worker_main, setup, server.url, prefix, 0, "kv_both", "recompute")
    try:
        assert w0.ready[0], w0.ready
        with pytest.raises(AssertionError) as e:
            Proc(vllm_roles.worker_main, setup, server.url, prefix, 1, "kv_both", "recompute")
        assert "ConfigError" in str(e.value) and "rank 0" in str(e.value), str(e.value)[-600:]
    finally:
        w0.stop()


def test_tier_rows_name_their_byte_layout(server, prefix):
    """Finding 1: vLLM's offloading worker copies raw KV pages into the
    primary rows, so tiers of one model, TP and row size hold different
    bytes under FlashAttention and FlashInfer, NHD and HND, and different
    kernel blocks. Built through vLLM's SecondaryTierFactory with vLLM's
    own backend classes, each gets a namespace of its own (a row one
    stores is a miss for the others), and a tier whose backend vLLM picks
    in the workers refuses to start."""
    p = Proc(vllm_roles.tier_main, server.url, prefix)
    out = p.ready
    p.p.join(10)
    assert out["store"] == [(1, True)]
    assert out["same"] == (True, True)
    tags = {n: ns.split(":")[-2] for n, ns in out["namespaces"].items()}
    assert tags == {"flash_attn": "FLASH_ATTN-NHD-k16", "flashinfer": "FLASHINFER-NHD-k16",
                    "flash_attn_block128": "FLASH_ATTN-NHD-k128",
                    "flashinfer_block128": "FLASHINFER-NHD-k64",
                    "flash_attn_hnd": "FLASH_ATTN-HND-k16"}, tags
    assert out["others"] == {n: False for n in out["others"]}, out["others"]
    assert "ConfigError" in out["auto"] and "--attention-backend" in out["auto"], out["auto"]
