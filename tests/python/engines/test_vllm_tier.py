"""Contract tests of kvpool.vllm.KVPoolSecondaryTier (vLLM offloading tier),
driven as vLLM's tiering manager drives a tier, against a real kvpoold.
See ../../../docs/engines.md and the engine notes (§3.1, §3.3, §5)."""

import time

import pytest

np = pytest.importorskip("numpy")

import kvpool  # noqa: E402
import kvpool.vllm as kv  # noqa: E402
from vllm.v1.kv_offload.tiering import base as tb  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402

import vllm_standin_layouts as vl  # noqa: E402
from vllm_standin_manager import ManagerStandIn  # noqa: E402

ROW = 64 << 10
ROWS = 64


class Cfg:
    """The vllm_config fields the tier reads (duck-typed)."""

    class model_config:
        model = "test/llama-8b"
        dtype = "bfloat16"

    class cache_config:
        cache_dtype = "auto"
        prefix_caching_hash_algo = "sha256"
        block_size = 16

    class parallel_config:
        tensor_parallel_size = 1
        pipeline_parallel_size = 1

    class attention_config:                # --attention-backend
        backend = vl.FlashAttentionBackend


def offload_key(h, group=0):
    return bytes(h) + group.to_bytes(4, "big")


def hashes(n, seed=1, size=32):
    out = kvpool.block_hashes([(seed * 131 + i) % 40000 for i in range(n * 16)], 16)
    return [h[:size] for h in out]


def make(url, prefix, rows=None, cfg=Cfg, **params):
    rows = rows if rows is not None else np.zeros((ROWS, ROW), dtype=np.uint8)
    if not kv.register():     # a second call is refused by the factory: fine
        pass
    tier = SecondaryTierFactory.create(dict({"type": "kvpool", "url": url,
                                             "namespace_prefix": prefix, "timeout_s": 1.0,
                                             "block_size": 64}, **params),
                                       cfg, memoryview(rows))
    assert isinstance(tier, tb.SecondaryTierManager)
    return tier, rows


def steps_until(mgr, req, keys, want, limit=3000):
    """Scheduler steps (1 ms apart) until lookup gives `want` hits, not deferred."""
    for i in range(limit):
        hits, defer = mgr.lookup(req, keys)
        if not defer:
            return i + 1, hits
        time.sleep(0.002)
    raise AssertionError("still deferred after %d steps" % limit)


def settle(tier, key, timeout=10.0):
    """The tier's answer for key once it is not None (asked every ms)."""
    deadline = time.monotonic() + timeout
    while True:
        r = tier.lookup(key, tb.ReqContext("settle"))
        if r is not None or time.monotonic() > deadline:
            return r
        time.sleep(0.001)


def fill(rows, ids, seed):
    g = np.random.default_rng(seed)
    for b in ids:
        rows[b] = g.integers(0, 255, ROW, dtype=np.uint8)


def test_unknown_key_defers_then_hits(server, prefix):
    tier, rows = make(server.url, prefix)
    mgr = ManagerStandIn(tier, rows)
    keys = [offload_key(h) for h in hashes(6)]
    fill(rows, range(6), 1)
    want = rows[:6].copy()
    mgr.store("r1", keys, list(range(6)))
    assert mgr.wait_jobs()
    assert mgr.reported[-1][2] is True
    rows[:6] = 0                             # evicted from the primary
    mgr.free = list(range(ROWS))
    hits, defer = mgr.lookup("r2", keys)
    assert defer and hits == 6               # the first step asks: None
    n, hits = steps_until(mgr, "r2", keys, 6)
    assert hits == 6
    loads = [r for r in mgr.reported if r[1] == "load"]
    assert len(loads) == 1 and loads[0][2] is True, "one submit_load per request"
    got = np.stack([rows[mgr.primary[k]] for k in keys])
    assert np.array_equal(got, want)
    tier.shutdown()
    tier.shutdown()


def test_lookup_is_quick_and_bounded(server, prefix):
    tier, rows = make(server.url, prefix)
    keys = [offload_key(h) for h in hashes(200, seed=2)]
    t0 = time.perf_counter()
    for k in keys:
        assert tier.lookup(k, tb.ReqContext("r")) is None
    per = (time.perf_counter() - t0) / len(keys)
    assert per < 0.002, "lookup took %.3f ms" % (per * 1000)
    assert settle(tier, keys[0]) is False, "None for ever"
    tier.shutdown()


def test_missing_middle_block(server, prefix, raw):
    tier, rows = make(server.url, prefix)
    mgr = ManagerStandIn(tier, rows)
    keys = [offload_key(h) for h in hashes(8, seed=3)]
    fill(rows, range(8), 3)
    mgr.store("r1", keys, list(range(8)))
    assert mgr.wait_jobs()
    raw(tier.namespace).delete(kv.block_key(keys[4]))
    mgr.evict_primary()
    mgr.free = list(range(ROWS))
    n, hits = steps_until(mgr, "r2", keys, 4)
    assert hits == 4
    tier.shutdown()


def test_failed_loads_stop_deferring(server, prefix, raw):
    """True must mean loadable: when the loads fail anyway (the blocks were
    deleted after the lookup), the request stops being deferred within a
    bounded number of steps, and the failed keys answer False."""
    tier, rows = make(server.url, prefix)
    mgr = ManagerStandIn(tier, rows)
    keys = [offload_key(h) for h in hashes(4, seed=4)]
    fill(rows, range(4), 4)
    mgr.store("r1", keys, list(range(4)))
    assert mgr.wait_jobs()
    mgr.evict_primary()
    mgr.free = list(range(ROWS))
    # answer the lookups (True), then delete under the lease
    assert [settle(tier, k) for k in keys] == [True] * 4
    raw(tier.namespace).delete_many([kv.block_key(k) for k in keys])
    n, hits = steps_until(mgr, "r2", keys, 0)
    assert hits == 0
    assert all(not ok for _, kind, ok in mgr.reported if kind == "load")
    tier.shutdown()


def test_sixteen_byte_keys_groups_and_seeds(server, prefix, raw):
    tier, rows = make(server.url, prefix, hash_algo="xxhash")
    assert ":xxhash:" in tier.namespace
    mgr = ManagerStandIn(tier, rows)
    short = hashes(3, seed=5, size=16)
    keys = [offload_key(h) for h in short]
    fill(rows, range(3), 5)
    mgr.store("r1", keys, [0, 1, 2])
    assert mgr.wait_jobs()
    c = raw(tier.namespace)
    assert c.match([h + bytes(16) for h in short]) == 3          # zero-padded
    other_group = [offload_key(h, 1) for h in short]
    other_seed = [offload_key(h) for h in hashes(3, seed=6, size=16)]
    for ks in (other_group, other_seed):
        assert settle(tier, ks[0]) is False
    tier.shutdown()


def test_store_reads_whole_rows_load_writes_only_its_rows(server, prefix):
    tier, rows = make(server.url, prefix)
    mgr = ManagerStandIn(tier, rows)
    keys = [offload_key(h) for h in hashes(3, seed=7)]
    fill(rows, [5, 9, 12], 7)
    want = rows[[5, 9, 12]].copy()
    mgr.store("r1", keys, [5, 9, 12])
    assert mgr.wait_jobs()
    rows[:] = 0xAB
    mgr.primary = {}
    mgr.free = [40, 30, 20]     # pops from the end: rows 20, 30, 40
    steps_until(mgr, "r2", keys, 3)
    assert [mgr.primary[k] for k in keys] == [20, 30, 40]
    assert np.array_equal(rows[[20, 30, 40]], want)
    untouched = [i for i in range(ROWS) if i not in (20, 30, 40)]
    assert (rows[untouched] == 0xAB).all()
    tier.shutdown()


def test_every_job_reported_once_when_pool_is_down(fresh_server, prefix):
    fresh_server.start()
    port = fresh_server.port
    tier, rows = make(fresh_server.url, prefix)
    mgr = ManagerStandIn(tier, rows)
    keys = [offload_key(h) for h in hashes(4, seed=8)]
    fill(rows, range(4), 8)
    mgr.store("r1", keys, list(range(4)))
    assert mgr.wait_jobs() and mgr.reported[-1][2] is True
    fresh_server.kill()
    mgr.store("r2", [offload_key(h) for h in hashes(4, seed=9)], [4, 5, 6, 7])
    assert mgr.wait_jobs()
    assert mgr.reported[-1][1:] == ("store", False)
    mgr.evict_primary()
    mgr.free = list(range(ROWS))
    n, hits = steps_until(mgr, "r3", keys, 0)      # down: False, not None for ever
    assert hits == 0
    fresh_server.start(port=port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        mgr.store("r4", keys, list(range(4)))
        assert mgr.wait_jobs()
        if mgr.reported[-1][2]:
            break
        time.sleep(0.3)
    assert mgr.reported[-1][2] is True
    time.sleep(1.1)                                  # the miss answers expire
    n, hits = steps_until(mgr, "r5", keys, 4)
    assert hits == 4
    tier.shutdown()


def test_constructor_does_not_raise_when_down(prefix):
    from conftest import free_port
    tier, rows = make("tcp://127.0.0.1:%d" % free_port(), prefix)
    k = offload_key(hashes(1)[0])
    assert tier.lookup(k, tb.ReqContext("r")) is False
    tier.shutdown()


def test_newer_interface_names(server, prefix):
    """get_finished_jobs, drain_jobs, on_new_request, batch_lookup and the
    positional (offloading_spec, view, tier_type) constructor."""
    rows = np.zeros((8, ROW), dtype=np.uint8)
    tier = kv.KVPoolSecondaryTier(Cfg, memoryview(rows), "kvpool", url=server.url,
                                  namespace_prefix=prefix)
    keys = [offload_key(h) for h in hashes(2, seed=10)]
    tier.submit_store(tb.JobMetadata(1, keys, np.array([0, 1]), False, tb.ReqContext("r")))
    tier.drain_jobs(timeout=10)
    got = tier.get_finished_jobs()
    assert [(r.job_id, r.success) for r in got] == [(1, True)]
    assert tier.get_finished() == []
    assert tier.batch_lookup(keys, tb.ReqContext("r")) == [True, True]
    tier.on_new_request(tb.ReqContext("r"))
    tier.request_finished(tb.ReqContext("r"))
    tier.shutdown()


def test_block_of_the_wrong_size_is_a_failed_load(server, prefix, raw):
    """A block whose size is not the row's (another layout wrote it) fails
    the load, writes no row but the job's own (a too-big block: none), and
    the key then answers False."""
    tier, rows = make(server.url, prefix)
    mgr = ManagerStandIn(tier, rows)
    keys = [offload_key(h) for h in hashes(2, seed=11)]
    c = raw(tier.namespace)
    c.put(kv.block_key(keys[0]), bytes(ROW + 8))
    c.put(kv.block_key(keys[1]), bytes(ROW - 8), parent=kv.block_key(keys[0]))
    rows[:] = 0x5A
    n, hits = steps_until(mgr, "r", keys, 0)
    assert hits == 0
    assert all(not ok for _, kind, ok in mgr.reported if kind == "load")
    others = [i for i in range(ROWS) if i not in mgr.load_rows]
    assert mgr.load_rows and (rows[others] == 0x5A).all(), "only the job's rows are written"
    assert [settle(tier, k) for k in keys] == [False, False]
    tier.shutdown()


def with_backend(backend, block=16):
    """Cfg with another attention backend and KV-manager block."""
    return type("Cfg", (Cfg,), {
        "attention_config": type("attention_config", (), {"backend": backend}),
        "cache_config": type("cache_config", (Cfg.cache_config,), {"block_size": block})})


def test_rows_of_different_byte_layouts_never_share(server, prefix, monkeypatch):
    """Finding 1: the primary rows are raw KV pages, so instances whose
    rows have the same size but other bytes (FlashAttention's separate K
    and V, FlashInfer's interleaved ones, HND, a kernel block smaller than
    the manager block) must not share blocks: the namespace names the
    attention backend, NHD/HND and the kernel block."""
    keys = [offload_key(h) for h in hashes(2, seed=21)]
    a, rows_a = make(server.url, prefix)
    fill(rows_a, [0, 1], 21)
    mgr = ManagerStandIn(a, rows_a)
    mgr.store("r1", keys, [0, 1])
    assert mgr.wait_jobs() and mgr.reported[-1][2] is True
    same, _ = make(server.url, prefix)
    assert same.namespace == a.namespace and settle(same, keys[0]) is True
    others = [make(server.url, prefix, cfg=with_backend(vl.FlashInferBackend))[0],
              make(server.url, prefix, cfg=with_backend(vl.FlashInferBlackwell))[0]]
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "HND")
    others.append(make(server.url, prefix)[0])
    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT")
    # FlashInfer runs 64-token kernel blocks under 128-token manager blocks
    others.append(make(server.url, prefix, cfg=with_backend(vl.FlashInferBackend, 128))[0])
    names = [t.namespace for t in others]
    assert ":FLASH_ATTN-NHD-k16:" in a.namespace
    assert [n.split(":")[-2] for n in names] == ["FLASHINFER-NHD-k16", "FLASHINFER-HND-k16",
                                                 "FLASH_ATTN-HND-k16", "FLASHINFER-NHD-k64"]
    assert len(set(names + [a.namespace])) == 5
    for t in others:
        assert settle(t, keys[0]) is False, t.namespace
    for t in [a, same] + others:
        t.shutdown()


def test_tier_refused_when_the_backend_is_chosen_by_the_workers(server, prefix):
    """Finding 1: with the attention backend left to vLLM ("auto"), the
    scheduler-side tier cannot know the rows' byte layout: it refuses to
    start, naming --attention-backend."""
    auto = type("Cfg", (Cfg,), {"attention_config": type("a", (), {"backend": None})})
    with pytest.raises(ValueError) as e:
        make(server.url, prefix, cfg=auto)
    assert "--attention-backend" in str(e.value)
    with pytest.raises(ValueError) as e:       # no attention_config at all (older vLLM)
        make(server.url, prefix, cfg=type("Cfg", (), {"model_config": Cfg.model_config,
                                                      "cache_config": Cfg.cache_config}))
    assert "--attention-backend" in str(e.value)


def test_kv_dtype_that_contradicts_vllm_fails_at_start(server, prefix):
    """The kv_dtype setting replaced the KV dtype vLLM runs in the namespace
    (rows of one size but another format would share blocks). Now the
    namespace takes it from vLLM (the model's bfloat16 here, or
    --kv-cache-dtype), a kv_dtype that contradicts it fails at start, one
    that agrees changes nothing."""
    plain, _ = make(server.url, prefix)
    assert ":bfloat16:" in plain.namespace
    agrees, _ = make(server.url, prefix, kv_dtype="bf16")
    assert agrees.namespace == plain.namespace
    for cfg, wrong, runs in ((Cfg, "float16", "bfloat16"), (with_cache_dtype("fp8_e5m2"),
                                                            "fp8", "fp8_e5m2")):
        with pytest.raises(ValueError) as e:
            make(server.url, prefix, cfg=cfg, kv_dtype=wrong)
        msg = str(e.value)
        assert isinstance(e.value, kv.tier._cfg.ConfigError), msg
        assert "kv_dtype %r" % wrong in msg and "(%s, from " % runs in msg, msg
    for t in (plain, agrees):
        t.shutdown()


def with_cache_dtype(fmt):
    """Cfg with --kv-cache-dtype fmt."""
    cc = type("cache_config", (Cfg.cache_config,), {"cache_dtype": fmt})
    return type("Cfg", (Cfg,), {"cache_config": cc})


@pytest.mark.parametrize("key,value,words", [
    ("namespace", 123, None), ("namespace", ["a"], "namespace"), ("namespace", "", "empty"),
    ("namespace_prefx", "x", "namespace_prefix"), ("model", ["a", "b"], "model")])
def test_tier_settings_name_the_setting(server, prefix, key, value, words):
    """Findings 8 and 14: a namespace of the wrong type, an empty one
    or a misspelt setting is a ConfigError naming the setting (not a raw
    TypeError, and not ignored). A number is a valid name (its text)."""
    if words is None:
        t, _ = make(server.url, prefix, **{key: value})
        assert t.namespace.startswith("123:")
        t.shutdown()
        return
    with pytest.raises(ValueError) as e:
        make(server.url, prefix, **{key: value})
    assert isinstance(e.value, kv.tier._cfg.ConfigError) and words in str(e.value)


def test_row_larger_than_max_block_bytes_fails_at_start(fresh_server, prefix):
    """Finding 14: a row the server can never store is found at start."""
    fresh_server.extra += ["--max-block-bytes", "32KiB"]
    fresh_server.start()
    with pytest.raises(ValueError) as e:
        make(fresh_server.url, prefix)
    assert "max_block_bytes" in str(e.value)


def test_batch_lookup_of_junk_never_raises(server, prefix):
    """Finding 13: an unsized argument answers, never raises."""
    t, _ = make(server.url, prefix)
    assert t.batch_lookup(None, tb.ReqContext("r")) == []
    assert t.batch_lookup(5, tb.ReqContext("r")) == []
    assert t.batch_lookup(iter([offload_key(hashes(1, seed=30)[0])]),
                          tb.ReqContext("r")) == [False]
    t.shutdown()


# ---- issue 29: a request's retention ---------------------------------------------------

def _ns_stats(raw, ns):
    return raw(ns).stats(ns)["namespaces"][ns]


def test_request_retention_stores_and_refreshes(server, prefix, raw):
    """kv_transfer_params {"kvpool_retain_ms": MS} in a job's ReqContext
    (vLLM passes the request's own): its blocks are stored retained, those
    the pool held already included; a request without it stores ordinary
    blocks; a lookup with it refreshes the retention of the run it hits."""
    tier, rows = make(server.url, prefix)
    fill(rows, range(6), 41)
    keys = [offload_key(h) for h in hashes(4, seed=41)]
    plain = tb.ReqContext("plain")
    kept = tb.ReqContext("kept", kv_transfer_params={"kvpool_retain_ms": 60000})
    tier.submit_store(tb.JobMetadata(1, keys, np.array([0, 1, 2, 3]), False, plain))
    tier.drain_jobs(timeout=10)
    st = _ns_stats(raw, tier.namespace)
    assert st["blocks"] == 4 and st["retained_blocks"] == 0
    # the retained request stores blocks 0 and 1, which the pool holds already
    tier.submit_store(tb.JobMetadata(2, keys[:2], np.array([0, 1]), False, kept))
    tier.drain_jobs(timeout=10)
    assert [(r.job_id, r.success) for r in tier.get_finished()] == [(1, True), (2, True)]
    st = _ns_stats(raw, tier.namespace)
    assert st["blocks"] == 4 and st["retained_blocks"] == 2
    # a lookup that asks a retention extends it to the run it hits
    assert tier.batch_lookup(keys, kept) == [True] * 4
    assert _ns_stats(raw, tier.namespace)["retained_blocks"] == 4
    # the deferred lookup path (one MATCH per request per step) asks it too
    more = [offload_key(h) for h in hashes(3, seed=42)]
    fill(rows, range(8, 11), 42)
    tier.submit_store(tb.JobMetadata(3, more, np.array([8, 9, 10]), False, plain))
    tier.drain_jobs(timeout=10)
    assert _ns_stats(raw, tier.namespace)["retained_blocks"] == 4
    other = tb.ReqContext("other", kv_transfer_params={"kvpool_retain_ms": 30000})
    assert settle_ctx(tier, more[0], other) is True
    assert _ns_stats(raw, tier.namespace)["retained_blocks"] == 5
    tier.shutdown()


def settle_ctx(tier, key, ctx, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        r = tier.lookup(key, ctx)
        if r is not None or time.monotonic() > deadline:
            return r
        time.sleep(0.001)


def test_request_retention_junk_and_settings(server, prefix, raw):
    """A retention that is not a whole number of ms is ignored (the job
    succeeds, nothing retained); request_retain false ignores every one;
    retain_first_blocks and retain_ms are refused at start (a tier's jobs
    carry no block position), naming the per-request field instead."""
    tier, rows = make(server.url, prefix)
    fill(rows, range(2), 43)
    keys = [offload_key(h) for h in hashes(2, seed=43)]
    bad = tb.ReqContext("bad", kv_transfer_params={"kvpool_retain_ms": "long"})
    tier.submit_store(tb.JobMetadata(1, keys, np.array([0, 1]), False, bad))
    tier.drain_jobs(timeout=10)
    assert [r.success for r in tier.get_finished()] == [True]
    assert tier.batch_lookup(keys, tb.ReqContext("x", kv_transfer_params=[1])) == [True, True]
    assert _ns_stats(raw, tier.namespace)["retained_blocks"] == 0
    tier.shutdown()
    off, rows = make(server.url, prefix, namespace_prefix=prefix + "-off",
                     request_retain=False)
    fill(rows, range(2), 44)
    keys = [offload_key(h) for h in hashes(2, seed=44)]
    kept = tb.ReqContext("kept", kv_transfer_params={"kvpool_retain_ms": 60000})
    off.submit_store(tb.JobMetadata(1, keys, np.array([0, 1]), False, kept))
    off.drain_jobs(timeout=10)
    assert _ns_stats(raw, off.namespace)["retained_blocks"] == 0
    off.shutdown()
    for extra in ({"retain_first_blocks": 2, "retain_ms": 1000}, {"retain_ms": 1000}):
        with pytest.raises(ValueError) as e:
            make(server.url, prefix, **extra)
        assert "kvpool_retain_ms" in str(e.value)


@pytest.mark.parametrize("speed,offered", [(1e-3, True), (1e12, False)])
def test_estimator_answers_a_hit_only_when_loading_pays(server, prefix, speed, offered):
    """prefill_tokens_per_s: once a load has been timed, a tier whose
    engine prefills a token in 1000 s answers every hit True; one whose
    prefill is practically free answers False (the engine recomputes),
    but for one probe in PROBE_EVERY; the deferred lookups likewise."""
    tier, rows = make(server.url, prefix, prefill_tokens_per_s=speed)
    fill(rows, range(4), 45)
    keys = [offload_key(h) for h in hashes(4, seed=45)]
    ctx = tb.ReqContext("r")
    tier.submit_store(tb.JobMetadata(1, keys, np.array([0, 1, 2, 3]), False, ctx))
    tier.drain_jobs(timeout=10)
    assert tier.batch_lookup(keys, ctx) == [True] * 4       # nothing timed yet: learning
    tier.submit_load(tb.JobMetadata(2, keys, np.array([8, 9, 10, 11]), False, ctx))
    tier.drain_jobs(timeout=10)
    assert [r.success for r in tier.get_finished()] == [True, True]
    assert tier.estimator.s_per_byte is not None
    got = [tier.batch_lookup(keys, ctx) for _ in range(tier.estimator.PROBE_EVERY)]
    if offered:
        assert got == [[True] * 4] * len(got)
        assert settle(tier, keys[0]) is True
    else:
        assert sorted(got) == [[False] * 4] * (len(got) - 1) + [[True] * 4]   # one probe
        assert tier.declined == 4 * (len(got) - 1)
        assert settle(tier, keys[0]) is False
    tier.shutdown()


def test_estimator_setting_checked(server, prefix):
    for bad in (0, -1, "fast"):
        with pytest.raises(ValueError) as e:
            make(server.url, prefix, prefill_tokens_per_s=bad)
        assert "prefill_tokens_per_s" in str(e.value)
