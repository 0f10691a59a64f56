"""Contract tests of kvpool.vllm.KVPoolConnector (a vLLM KV connector, for
releases without the tiering layer), driven as vLLM's scheduler and model
runner drive a connector, against a real kvpoold. See docs/engines.md and
the engine notes (§3.2, §5)."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import kvpool  # noqa: E402
import kvpool.vllm as kv  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,  # noqa: E402
                                                               KVConnectorRole)

from vllm_standin_scheduler import Request, step  # noqa: E402

BS = 16          # tokens per vLLM block
LAYERS = 3
HEADS = 2
DIM = 16
BLOCKS = 32


def vllm_config(url, prefix, tp=1, mla=False, rank=0, **extra):
    ec = dict({"url": url, "namespace_prefix": prefix, "timeout_s": 1.0, "rank": rank}, **extra)
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="KVPoolConnector",
                                           kv_connector_module_path="kvpool.vllm",
                                           kv_role="kv_both", kv_connector_extra_config=ec,
                                           kv_load_failure_policy="recompute"),
        model_config=SimpleNamespace(model="test/llama-8b", dtype="float16", use_mla=mla),
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto",
                                     prefix_caching_hash_algo="sha256", num_gpu_blocks=BLOCKS),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                        rank=rank))


def kv_caches(mla):
    shape = (BLOCKS, BS, DIM) if mla else (2, BLOCKS, BS, HEADS, DIM)
    return {"layer.%d" % i: torch.zeros(shape, dtype=torch.float16) for i in range(LAYERS)}


class Instance:
    """One vLLM instance: a scheduler-side connector and tp workers."""

    def __init__(self, url, prefix, tp=1, mla=False, **extra):
        self.scheduler = KVConnectorFactory.create_connector(
            vllm_config(url, prefix, tp, mla, **extra), KVConnectorRole.SCHEDULER, None)
        assert isinstance(self.scheduler, KVConnectorBase_V1)
        self.workers, self.caches = [], []
        for r in range(tp):
            w = KVConnectorFactory.create_connector(vllm_config(url, prefix, tp, mla, rank=r,
                                                                **extra),
                                                    KVConnectorRole.WORKER, None)
            caches = kv_caches(mla)
            w.register_kv_caches(caches)
            w.layer_names = list(caches)
            self.workers.append(w)
            self.caches.append(caches)

    def block_bytes(self, rank, block):
        out = []
        for t in self.caches[rank].values():
            if t.dim() == 5:
                out += [t[0, block].numpy().tobytes(), t[1, block].numpy().tobytes()]
            else:
                out.append(t[block].numpy().tobytes())
        return b"".join(out)

    def forward(self, seed):
        """A stand-in forward pass: writes KV values derived from (seed,
        rank, block position) into the blocks computed in this step."""
        def run(rank, first_block, block_ids=None):
            ids = self.block_ids
            for pos in range(first_block, len(ids)):
                for t in self.caches[rank].values():
                    value = float((seed * 31 + rank * 7 + pos) % 200)
                    if t.dim() == 5:
                        t[:, ids[pos]] = value
                    else:
                        t[ids[pos]] = value
        return run

    def close(self):
        for c in [self.scheduler] + self.workers:
            c.shutdown()
            c.shutdown()


def prompt(n, seed=1):
    tokens = [(seed * 977 + i) % 30000 for i in range(n)]
    return tokens, kvpool.block_hashes(tokens, BS)


def run_request(inst, req_id, tokens, hashes, seed, local=0, ids=None):
    inst.block_ids = ids or list(range(3, 3 + (len(tokens) + BS - 1) // BS))
    return step(inst.scheduler, inst.workers, Request(req_id, tokens, hashes), inst.block_ids,
                local, inst.forward(seed))


@pytest.mark.parametrize("stage_a,stage_b", [(False, False), (True, False), (False, True)])
def test_factory_and_store_then_load(server, prefix, stage_a, stage_b):
    """Also through the host staging buffer used for KV caches in GPU
    memory (forced here on CPU tensors): both paths store the same bytes."""
    tokens, hashes = prompt(100)
    a = Instance(server.url, prefix, stage_through_host=stage_a)
    ext, errors = run_request(a, "r1", tokens, hashes, seed=1)
    assert ext == 0 and errors == [set()]
    want = [a.block_bytes(0, b) for b in a.block_ids[:6]]
    b = Instance(server.url, prefix, stage_through_host=stage_b)   # empty caches
    ext, errors = run_request(b, "r2", tokens, hashes, seed=2, ids=list(range(10, 17)))
    assert ext == 96, "aligned len(prompt) - 1 = 96 tokens (6 blocks)"
    assert errors == [set()]
    assert [b.block_bytes(0, x) for x in b.block_ids[:6]] == want
    # the block after the loaded ones was computed, not loaded
    assert b.block_bytes(0, b.block_ids[6]) != a.block_bytes(0, a.block_ids[6])
    a.close()
    b.close()


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


def test_two_ranks_take_the_min(server, prefix, raw):
    tokens, hashes = prompt(100, seed=5)
    a = Instance(server.url, prefix, tp=2)
    run_request(a, "r1", tokens, hashes, seed=5)
    ns1 = a.workers[1].namespace_for_rank(1)
    assert ns1 != a.workers[0].namespace_for_rank(0)
    raw(ns1).delete(kv.block_key(hashes[3]))
    b = Instance(server.url, prefix, tp=2)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=6)
    assert ext == 48 and errors == [set(), set()]
    for r in (0, 1):
        assert [b.block_bytes(r, x) for x in b.block_ids[:3]] == \
            [a.block_bytes(r, x) for x in a.block_ids[:3]]
    a.close()
    b.close()


def test_mla_rank0_writes_every_rank_reads(server, prefix, raw):
    tokens, hashes = prompt(80, seed=7)
    a = Instance(server.url, prefix, tp=2, mla=True)
    ns = a.workers[0].namespace_for_rank(0)
    assert ns == a.workers[1].namespace_for_rank(1)
    run_request(a, "r1", tokens, hashes, seed=7)
    assert raw(ns).match([kv.block_key(h) for h in hashes]) == 5
    b = Instance(server.url, prefix, tp=2, mla=True)
    ext, errors = run_request(b, "r2", tokens, hashes, seed=8)
    assert ext == 64 and errors == [set(), set()]
    for r in (0, 1):
        assert [b.block_bytes(r, x) for x in b.block_ids[:4]] == \
            [a.block_bytes(0, x) for x in a.block_ids[:4]]
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
    b.scheduler._reqs.pop("r2")                  # forget the answer: ask again, pool down
    ext, errors = step(b.scheduler, b.workers, req, b.block_ids, 0, b.forward(10))
    assert ext == 0, "a pool that is down gives (0, False)"
    assert errors == [set()]
    # a load that fails: answered by a live pool, loaded from a dead one
    fresh_server.start(port=port)
    c = Instance(fresh_server.url, prefix)
    run_request(c, "r3", tokens, hashes, seed=11)
    # the instance that saw the pool die hits again, with no restart of its own
    import time
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if b.scheduler.get_num_new_matched_tokens(Request("r2b%f" % time.monotonic(), tokens,
                                                          hashes), 0)[0] == 48:
            break
        time.sleep(0.2)
    ext, errors = step(b.scheduler, b.workers, Request("r2c", tokens, hashes),
                       list(range(20, 24)), 0, b.forward(10))
    assert ext == 48 and errors == [set()]
    d = Instance(fresh_server.url, prefix)
    scheduler, worker = d.scheduler, d.workers[0]
    req = Request("r4", tokens, hashes)
    assert scheduler.get_num_new_matched_tokens(req, 0) == (48, False)
    from vllm_standin_scheduler import Blocks
    scheduler.update_state_after_alloc(req, Blocks([1, 2, 3, 4]), 48)
    meta = scheduler.build_connector_meta(SimpleNamespace(
        scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={}))
    fresh_server.kill()
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(SimpleNamespace())
    assert worker.get_block_ids_with_load_errors() == {1, 2, 3}
    assert worker.get_block_ids_with_load_errors() == set()
    for i in (a, b, c, d):
        i.close()


def test_other_seed_and_layout_never_hit(server, prefix):
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
