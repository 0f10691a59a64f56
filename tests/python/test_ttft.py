"""The TTFT demo's reference decoder and its two-node flow (examples/ttft),
on a tiny configuration: 2 layers, a 256-token prefix. Node A prefills and
puts; node B MATCHes, loads into its KV cache and prefills the rest. The
warm path must give the cold path's first-token logits (max abs diff
<= 1e-3, fp32) and greedy tokens, load exactly the blocks the pool holds,
and survive a pool that is gone. No timing is asserted."""

import os
import sys
import tempfile

import pytest

from conftest import ROOT, need

sys.path.insert(0, os.path.join(ROOT, "examples", "ttft"))

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=512,
            block_tokens=16, seed=7)
PREFIX, SUFFIX, EVICT_AT = 256, 40, 10


@pytest.fixture(scope="module")
def ttft():
    need("torch")
    import demo
    import model
    return demo, model


@pytest.fixture
def nodes(ttft, server):
    demo, model = ttft
    cfg = model.Config(**TINY)
    blocks = (PREFIX + SUFFIX + 16) // cfg.block_tokens + 2
    a = demo.NodeProc("A", cfg, server.url, blocks, threads=1)
    b = demo.NodeProc("B", cfg, server.url, blocks, threads=1)
    yield cfg, a, b
    a.close()
    b.close()


def test_paged_forward_matches_the_plain_decoder(ttft):
    """Model.forward (paged cache, shuffled block table, chunked causal
    attention, prefix then suffix) against a dense textbook version."""
    _, model = ttft
    import torch
    cfg = model.Config(**TINY)
    m = model.Model(cfg)
    m.QUERY_CHUNK = 64                   # several chunks, one partial
    toks = torch.randint(0, cfg.vocab, (200,), generator=torch.Generator().manual_seed(3))
    want = model.dense_reference(m, toks.tolist())
    table = torch.randperm(20, generator=torch.Generator().manual_seed(4))
    cache = m.new_cache(20)
    got = m.forward(cache, table, toks, 0)
    assert float((got - want).abs().max()) <= 1e-4
    cache2 = m.new_cache(20)
    m.forward(cache2, table, toks[:96], 0)
    got2 = m.forward(cache2, table, toks[96:], 96)
    assert float((got2 - want).abs().max()) <= 1e-4
    # the K/V written are the block payloads: position 100's K of layer 1
    slot = int(table[100 // cfg.block_tokens])
    assert torch.allclose(cache[slot, 1, 0, 100 % cfg.block_tokens],
                          cache2[slot, 1, 0, 100 % cfg.block_tokens], atol=1e-5)
    assert float(cache[slot, 1, 0, 100 % cfg.block_tokens].abs().max()) > 0
    assert cfg.block_bytes == cache[0].numel() * cache.element_size()


def test_config_rejects_bad_geometry(ttft):
    _, model = ttft
    with pytest.raises(ValueError, match="kv_heads"):
        model.Config(heads=6, kv_heads=4).check()
    with pytest.raises(ValueError, match="head_dim"):
        model.Config(head_dim=15).check()
    with pytest.raises(ValueError, match="dtype"):
        model.Config(dtype="int8").check()


def test_warm_equals_cold_and_evicted_tail(ttft, nodes, server):
    demo, _ = ttft
    import kvpool
    cfg, a, b = nodes
    with kvpool.Client(server.url, cfg.namespace()) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        pool.drop_namespace()
        r = demo.correctness(a, b, cfg, PREFIX, SUFFIX, tmp, decode=16, pool=pool,
                             evict_at=EVICT_AT)
        pool.drop_namespace()
    assert r["a_put_blocks"] == PREFIX // cfg.block_tokens
    assert r["cold_loaded_blocks"] == 0
    assert r["loaded_blocks"] == PREFIX // cfg.block_tokens == 16
    assert r["computed_tokens"] == SUFFIX
    assert r["pool_error"] is None
    assert r["max_abs_diff"] <= 1e-3
    assert r["tokens_equal"] and len(r["tokens"]) == 16
    ev = r["evicted"]
    assert ev["loaded_blocks"] == EVICT_AT
    assert ev["computed_tokens"] == PREFIX + SUFFIX - EVICT_AT * cfg.block_tokens
    assert ev["max_abs_diff"] <= 1e-3 and ev["tokens_equal"]


def test_whole_prompt_in_pool_still_computes_the_last_token(ttft, nodes, server):
    """A prompt of exactly 16 full blocks, all in the pool: 15 are loaded and
    the last block is computed (its last token's logits are the output)."""
    demo, _ = ttft
    import kvpool
    cfg, a, b = nodes
    prompt = demo.random_tokens(PREFIX, cfg.vocab, 5)
    with kvpool.Client(server.url, cfg.namespace()) as pool:
        pool.drop_namespace()
        assert a.request(prompt, use_pool=False, put=True)["put_blocks"] == 16
        cold = b.request(prompt, use_pool=False, decode=4)
        warm = b.request(prompt, use_pool=True, decode=4)
        pool.drop_namespace()
    assert warm["matched_blocks"] == warm["loaded_blocks"] == 15
    assert warm["computed_tokens"] == cfg.block_tokens
    assert warm["tokens"] == cold["tokens"]


def test_resident_prefix_and_background_put(ttft, nodes, server):
    """The compute floor's request (resident_blocks: the prefix's KV taken
    as already in the cache) gives the warm request's output; a put on the
    node's put thread (async_put) stores every computed block, from a copy,
    so that the other node loads them all after a flush, with the same
    output, even though the first node reused its slots meanwhile."""
    demo, _ = ttft
    import kvpool
    cfg, a, b = nodes
    prefix = demo.random_tokens(PREFIX, cfg.vocab, 8)
    prompt = prefix + demo.random_tokens(SUFFIX, cfg.vocab, 9)
    with kvpool.Client(server.url, cfg.namespace()) as pool:
        pool.drop_namespace()
        ra = a.request(prefix, use_pool=False, put=True, async_put=True)
        assert ra["put_blocks"] == 16                  # queued
        a.request(demo.random_tokens(PREFIX, cfg.vocab, 10), use_pool=False, decode=2)
        assert a.flush()["puts"] == 16
        cold = b.request(prompt, use_pool=False, decode=4)
        warm = b.request(prompt, use_pool=True, decode=4)
        floor = b.request(prompt, use_pool=False, decode=4, resident_blocks=16)
        pool.drop_namespace()
    assert warm["loaded_blocks"] == 16
    assert floor["loaded_blocks"] == 0 and floor["computed_tokens"] == SUFFIX
    assert floor["match_s"] == 0 and floor["hash_s"] == 0
    assert warm["tokens"] == cold["tokens"] == floor["tokens"]
    with pytest.raises(RuntimeError, match="resident_blocks"):
        b.request(prompt, use_pool=True, resident_blocks=1)
    with pytest.raises(RuntimeError, match="resident_blocks"):
        b.request(prompt, use_pool=False, resident_blocks=(PREFIX + SUFFIX) // 16 + 1)


def test_choose_window_finds_recurring_prefixes(ttft):
    """The trace panel's window: where an empty pool would hit most."""
    demo, _ = ttft
    import json
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.jsonl")
        with open(path, "w") as f:
            for i in range(40):    # requests 20..29 share one prefix, the rest none
                ids = [1000, 1001, 1002, 5000 + i] if 20 <= i < 30 else [10 * i, 10 * i + 1]
                f.write(json.dumps(dict(timestamp=i, input_length=512 * len(ids),
                                        output_length=1, hash_ids=ids)) + "\n")
        start, reuse, med, first = demo.choose_window(path, 10)
    assert start == 20
    assert reuse == pytest.approx(27 / 40)
    assert first == 0.0 and med == 0.0


def test_pool_gone_means_full_prefill(ttft, fresh_server):
    """Node B whose pool is not there serves every request by computing it
    all, with the same output, and says why in pool_error."""
    demo, model = ttft
    cfg = model.Config(**TINY)
    fresh_server.start()
    url = fresh_server.url
    fresh_server.stop()                  # nothing listens there any more
    b = demo.NodeProc("B", cfg, url, 24, threads=1)
    try:
        assert b.hello["pool_error"]
        prompt = demo.random_tokens(100, cfg.vocab, 6)
        cold = b.request(prompt, use_pool=False, decode=3)
        warm = b.request(prompt, use_pool=True, put=True, decode=3)
        assert warm["loaded_blocks"] == 0 and warm["computed_tokens"] == 100
        assert warm["tokens"] == cold["tokens"]
        assert "pool unavailable" in warm["pool_error"]
    finally:
        b.close()


def test_node_rejects_bad_requests_and_keeps_serving(ttft, server):
    demo, model = ttft
    cfg = model.Config(**TINY)
    b = demo.NodeProc("B", cfg, server.url, 4, threads=1)
    try:
        with pytest.raises(RuntimeError, match="token ids"):
            b.request([cfg.vocab], use_pool=False)
        with pytest.raises(RuntimeError, match="empty prompt"):
            b.request([], use_pool=False)
        with pytest.raises(RuntimeError, match="needs .* blocks"):
            b.request(list(range(100)), use_pool=False)      # 4 slots hold 64 tokens
        assert b.request([1, 2, 3], use_pool=True, decode=2)["computed_tokens"] == 3
    finally:
        b.close()
