"""The prefill-to-decode hand-off through kvpool inside vLLM's own code
(KVPOOL_VLLM_SRC): each instance is vLLM's engine-core Scheduler in a
process of its own (vllm_pd_roles: its KVCacheManager and block pool,
vLLM's KVConnectorFactory building the connector, KVOutputAggregator
combining the workers' outputs) and a process per worker rank
(vllm_roles: KV caches shaped by vLLM's model runner code). Requests are
vLLM Requests with kv_transfer_params in their sampling params, as vLLM's
API server makes them from the disaggregated proxy's requests. vLLM's
Scheduler decides everything a real instance decides: the asynchronous
load (WAITING_FOR_REMOTE_KVS), kv_load_failure_policy on the blocks the
workers report, when a finished request's blocks are freed."""

import os
import time

import pytest

import engine_env

if engine_env.source("vllm") is None:
    pytest.skip("KVPOOL_VLLM_SRC is not set", allow_module_level=True)

os.environ.setdefault("PYTHONHASHSEED", "0")
import vllm_pd_roles  # noqa: E402
import vllm_roles  # noqa: E402
from test_vllm_real import Proc, tokens_for  # noqa: E402

BLOCKS = 24
N = 100
FULL = 96
PUT_MS = 6000           # a store batch's bound: 3 calls x vllm_roles' timeout_s 2.0


def setup(**extra):
    return {"backend": "flash_attn", "block": 16, "heads": 2, "head_size": 64, "layers": 3,
            "num_blocks": BLOCKS, "layout": "NHD", "extra": dict({"pd_wait_ms": 20000}, **extra)}


class Instance:
    """vLLM's Scheduler (one process) and a worker per rank (one each)."""

    def __init__(self, url, prefix, role, policy="recompute", s=None):
        s = s or setup()
        self.engine = Proc(vllm_pd_roles.engine_main, s, url, prefix, role, policy)
        self.workers = [Proc(vllm_roles.worker_main, s, url, prefix, r, role, policy)
                        for r in range(s.get("tp", 1))]
        self.state = None

    def add(self, req_id, tokens, max_tokens=1, params=None, seed=1):
        return self.engine("add", req_id, tokens, max_tokens, params, seed)

    def step(self):
        so, forwards = self.engine("schedule")
        outs = [w("step", so, forwards) for w in self.workers]
        self.state = self.engine("update", outs)
        return self.state

    def run(self, until, timeout_s=60):
        end = time.monotonic() + timeout_s
        while True:
            st = self.step()
            if until(st):
                return st
            assert time.monotonic() < end, "not there after %d s: %r" % (timeout_s, st)
            time.sleep(0.01)

    def status(self, req_id):
        return self.state["requests"][req_id][0]

    def read(self, req_id, n, rank=0):
        return self.workers[rank]("read", self.engine("block_ids_of", req_id), n)

    def events(self, what, req_id=None):
        return [e for e in self.state["events"] if e[1] == what and
                (req_id is None or e[2] == req_id)]

    def close(self):
        for p in [self.engine] + self.workers:
            p.stop()


def done(req_id):
    """The request ended and every block is back in vLLM's block pool."""
    return lambda st: st["requests"][req_id][0].startswith("FINISHED") and \
        st["free_blocks"] == st["total_blocks"] and not st["unfinished"]


def prefill(url, prefix, n=N):
    """A kv_producer instance runs one request as the proxy sends it."""
    p = Instance(url, prefix, "kv_producer")
    try:
        p.add("prefill-1", tokens_for(n, 1), 1, {"do_remote_decode": True}, seed=1)
        p.run(done("prefill-1"))
        fin = p.events("request_finished", "prefill-1")
        assert len(fin) == 1
        held, params, status = fin[0][3]
        assert status == "FINISHED_LENGTH_CAPPED"
        assert held is True, "vLLM kept the blocks for the stores in flight"
        assert p.events("finished_sending", "prefill-1"), "freed on finished_sending"
        kv = p.read("prefill-1", n)
        return params, kv, p.engine("block_ids_of", "prefill-1")
    finally:
        p.close()


def test_handoff_through_vllms_scheduler(server, prefix):
    """The proxy's order: prefill, then decode with the params prefill
    returned; the decode instance's Scheduler waits for the load, then
    computes the last block's tokens and decodes; loaded KV byte-exact in
    other blocks."""
    params, kv, p_ids = prefill(server.url, prefix)
    assert params == {"do_remote_prefill": True, "do_remote_decode": False,
                      "kvpool_tokens": FULL, "kvpool_put_ms": PUT_MS}
    d = Instance(server.url, prefix, "kv_consumer")
    try:
        d.engine("reserve", 8)                     # other block ids than the prefill's
        d.add("decode-1", tokens_for(N, 1), 2, params, seed=2)
        st = d.run(done("decode-1"))
        assert st["requests"]["decode-1"][0] == "FINISHED_LENGTH_CAPPED"
        assert st["requests"]["decode-1"][2] == 2, "two tokens decoded"
        assert d.events("finished_recving", "decode-1") and not d.events("invalid")
        d_ids = d.engine("block_ids_of", "decode-1")
        assert set(d_ids[0][:6]).isdisjoint(p_ids[0][:6])
        got = d.read("decode-1", N)
        assert [row[:FULL] for row in got] == [row[:FULL] for row in kv], \
            "the loaded tokens' KV, byte-exact"
        assert all(g[FULL] != k[FULL] for g, k in zip(got, kv)), "token 96 computed here"
    finally:
        d.close()


def test_decode_first_wait_covers_prefill(server, prefix):
    """The router sends both at once: the decode instance's request waits
    (WAITING_FOR_REMOTE_KVS) while the prefill instance is still to run,
    and loads as soon as the blocks are stored."""
    d = Instance(server.url, prefix, "kv_consumer")
    try:
        d.add("both-1", tokens_for(N, 1), 1, {"do_remote_prefill": True}, seed=2)
        d.run(lambda st: st["requests"]["both-1"][0] == "WAITING_FOR_REMOTE_KVS")
        for _ in range(10):
            st = d.step()
            assert st["requests"]["both-1"][0] == "WAITING_FOR_REMOTE_KVS"
        _, kv, _ = prefill(server.url, prefix)
        d.run(done("both-1"))
        assert d.status("both-1") == "FINISHED_LENGTH_CAPPED" and not d.events("invalid")
        assert [row[:FULL] for row in d.read("both-1", N)] == [row[:FULL] for row in kv]
    finally:
        d.close()


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_short_handoff_and_failure_policy(server, prefix, policy):
    """Only 48 tokens were handed off: after pd_wait_ms the workers report
    the missing blocks; vLLM's Scheduler recomputes them ("recompute") or
    fails the request ("fail"); every block is freed either way."""
    _, kv, _ = prefill(server.url, prefix, n=48)
    d = Instance(server.url, prefix, "kv_consumer", policy, setup(pd_wait_ms=300))
    try:
        d.add("short-1", tokens_for(N, 1), 1, {"do_remote_prefill": True}, seed=2)
        st = d.run(done("short-1"))
        bad = d.events("invalid")
        assert len(bad) == 1 and len(bad[0][3]) == 3, "blocks 3..5 did not arrive"
        if policy == "recompute":
            assert st["requests"]["short-1"][0] == "FINISHED_LENGTH_CAPPED"
            assert st["requests"]["short-1"][2] == 1
            assert d.read("short-1", 48) == kv, "the 48 tokens that arrived, byte-exact"
        else:
            assert st["requests"]["short-1"][0] == "FINISHED_ERROR"
    finally:
        d.close()


def test_stored_then_evicted_handoff_recomputes_within_the_put_bound(fresh_server, prefix):
    """The prefill instance stored and was acknowledged, then the blocks
    were gone before the decode side came (here: kvpoold restarted cold).
    The decode request used to wait the whole pd_wait_ms (20 s here, 30 s
    by default) before vLLM's Scheduler recomputed it (a fresh-clone
    test); the params' kvpool_put_ms (how long the prefill's PUTs could
    still take) now bounds the wait."""
    fresh_server.start()
    port = fresh_server.port
    params, _, _ = prefill(fresh_server.url, prefix)
    fresh_server.stop()
    fresh_server.start(port)                       # the hand-off's blocks are gone
    d = Instance(fresh_server.url, prefix, "kv_consumer")
    try:
        d.engine("reserve", 8)
        d.add("decode-1", tokens_for(N, 1), 2, params, seed=2)
        t0 = time.monotonic()
        st = d.run(done("decode-1"), timeout_s=60)
        waited = time.monotonic() - t0
        assert waited < PUT_MS / 1000.0 + 6, "waited %.1f s (pd_wait_ms: 20 s)" % waited
        assert st["requests"]["decode-1"][0] == "FINISHED_LENGTH_CAPPED"
        assert st["requests"]["decode-1"][2] == 2, "recomputed, then decoded"
        assert len(d.events("invalid")) == 1
    finally:
        d.close()
    assert params["kvpool_tokens"] == FULL and params["kvpool_put_ms"] == PUT_MS


def test_pool_down_recomputes(prefix):
    """No kvpoold: the decode instance recomputes at once, the prefill
    instance frees its blocks; nothing raises into vLLM."""
    from conftest import free_port
    url = "tcp://127.0.0.1:%d" % free_port()
    d = Instance(url, prefix, "kv_consumer")
    p = Instance(url, prefix, "kv_producer")
    try:
        d.add("down-1", tokens_for(N, 1), 1, {"do_remote_prefill": True}, seed=2)
        t0 = time.monotonic()
        d.run(done("down-1"), timeout_s=30)
        assert time.monotonic() - t0 < 15
        assert d.status("down-1") == "FINISHED_LENGTH_CAPPED" and d.events("invalid")
        p.add("down-p", tokens_for(N, 1), 1, {"do_remote_decode": True}, seed=1)
        p.run(done("down-p"), timeout_s=30)
    finally:
        d.close()
        p.close()


def test_hybrid_model_computes_handoffs_locally(server, prefix):
    """Full-attention and sliding-window groups: vLLM's Scheduler cannot take
    load errors for several KV-cache groups (it raises), so the connector
    offers no hand-off load there and vLLM computes the request."""
    d = Instance(server.url, prefix, "kv_consumer", s=dict(setup(), sliding=32))
    try:
        d.add("hma-1", tokens_for(N, 1), 1, {"do_remote_prefill": True}, seed=2)
        st = d.run(done("hma-1"))
        assert st["requests"]["hma-1"][0] == "FINISHED_LENGTH_CAPPED"
        assert not d.events("invalid") and not d.events("finished_recving")
    finally:
        d.close()
