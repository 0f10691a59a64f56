"""The prefill-to-decode hand-off through the pool, as vLLM's disaggregated
proxy drives it (kv_transfer_params do_remote_decode on the prefill
instance, do_remote_prefill on the decode instance), against a real
kvpoold. The prefill instance (kv_producer) runs in a process of its own
(vllm_pd_child); the decode instance (kv_consumer) in the test's, with
other block ids; both are driven by the stand-in engine loop
(vllm_standin_engine). Every loaded token's KV must be byte-exact. See
docs/engines.md ("Prefill-to-decode hand-off")."""

import multiprocessing
import time

import pytest

torch = pytest.importorskip("torch")

import kvpool  # noqa: E402
from kvpool.vllm import block_key  # noqa: E402

from test_vllm_connector import BLOCKS, BS, Instance  # noqa: E402
from vllm_standin_engine import Engine, Req  # noqa: E402
import vllm_pd_child  # noqa: E402

CTX = multiprocessing.get_context("spawn")
N = 100                       # prompt tokens: 6 whole blocks of 16, 4 tokens more
FULL = (N // BS) * BS         # 96
PROD_IDS = list(range(3, 3 + 7))
DEC_IDS = list(range(BLOCKS - 1, BLOCKS - 1 - 8, -1))     # other blocks, reversed
PUT_MS = 3000                 # a store batch's bound: 3 calls x the tests' timeout_s 1.0


def tokens_and_hashes(n=N):
    tokens = [(977 + i) % 30000 for i in range(n)]
    return tokens, kvpool.block_hashes(tokens, BS)


class Producer:
    """The prefill instance in its own process (vllm_pd_child)."""

    def __init__(self, url, prefix, n=N, tp=1, extra=None):
        self.conn, child = CTX.Pipe()
        self.p = CTX.Process(target=vllm_pd_child.producer_main,
                             args=(child, url, prefix, n, 1, PROD_IDS, tp, extra), daemon=True)
        self.p.start()
        self.namespace = self._recv(120)

    def _recv(self, timeout):
        assert self.conn.poll(timeout), "no answer from the prefill process"
        kind, value = self.conn.recv()
        if kind == "error":
            raise AssertionError("prefill process failed:\n" + value)
        return value

    def result(self, timeout=120):
        out = self._recv(timeout)
        self.p.join(30)
        return out


def decode_engine(url, prefix, policy="recompute", warm=True, **extra):
    extra.setdefault("pd_wait_ms", 20000)
    inst = Instance(url, prefix, role="kv_consumer", policy=policy, warm=warm, **extra)
    return Engine(inst, seed=2, policy=policy)


def match_requests(client, ns):
    """The server's MATCH count for namespace ns (STATS)."""
    return client.stats().get("namespaces", {}).get(ns, {}).get("match_requests", 0)


def test_handoff_between_two_processes(server, prefix, raw):
    """The proxy's order: prefill first (max_tokens 1), then decode with the
    params prefill answered. The prefill instance frees its blocks once
    the pool has them all, without waiting for the decode side; the decode
    instance loads every whole prompt block into other block ids,
    byte-exact, computes the rest; a later turn hits the same blocks."""
    prod = Producer(server.url, prefix).result()
    assert prod["held"] is True, "the blocks were held for the stores in flight"
    assert prod["params"] == {"do_remote_prefill": True, "do_remote_decode": False,
                              "kvpool_tokens": FULL, "kvpool_put_ms": PUT_MS}
    assert prod["held_at_free"] == [FULL // BS], "freed only once the pool held every block"
    assert prod["free"] == prod["blocks"], "every prefill block is free again"
    tokens, hashes = tokens_and_hashes()
    dec = decode_engine(server.url, prefix)
    req = dec.add(Req("decode-1", tokens, hashes, params=dict(prod["params"]), max_tokens=2,
                      ids=DEC_IDS))
    dec.run(lambda: req.finished())
    assert dec.ask_log[0] == ("decode-1", FULL, True), "an asynchronous load of 96 tokens"
    assert req.status.name == "FINISHED_LENGTH_CAPPED" and not req.load_failed
    assert ("recved", "decode-1") in [e[:2] for e in dec.events]
    # loaded tokens byte-exact, in other blocks; the tail computed here
    got, want = dec.inst.read(0, [DEC_IDS], N), torch.from_numpy(prod["kv"][0])
    assert torch.equal(got[:, :, :FULL], want[:, :, :FULL])
    assert not torch.equal(got[:, :, FULL], want[:, :, FULL]), "token 96 computed, not loaded"
    r = dec.inst.workers[0]._receiver
    assert (r.jobs, r.complete, r.short) == (1, 1, 0)
    dec.run(dec.idle)
    # a later turn: the same blocks are prefix hits for any instance of the model
    t2, h2 = tokens_and_hashes(N + 40)
    both = Engine(Instance(server.url, prefix, role="kv_both"), seed=3)
    turn = both.add(Req("turn-2", t2, h2, max_tokens=1, ids=list(range(12, 21))))
    both.run(lambda: turn.finished())
    assert both.ask_log[0] == ("turn-2", FULL, False)
    assert torch.equal(both.inst.read(0, [list(range(12, 21))], FULL), want[:, :, :FULL])
    both.run(both.idle)
    for e in (dec, both):
        e.inst.close()


def test_handoff_past_the_lease_bound_loads_every_block(fresh_server, prefix):
    """A hand-off wait whose lease would pass kvpoold's
    max_conn_leased_bytes (a kvpoold without the lease cut answers QUOTA):
    the decode worker waits unleased and loads every block (the GET follows
    at once on the same connection) instead of loading none."""
    chunk = 2 * 3 * 2 * 16 * BS * 2          # test_vllm_connector's layers, heads, dim
    fresh_server.extra += ["--max-conn-leased-bytes", str(2 * chunk)]
    fresh_server.start()
    prod = Producer(fresh_server.url, prefix).result()
    tokens, hashes = tokens_and_hashes()
    dec = decode_engine(fresh_server.url, prefix)
    req = dec.add(Req("decode-1", tokens, hashes, params=dict(prod["params"]), max_tokens=2,
                      ids=DEC_IDS))
    dec.run(lambda: req.finished())
    assert not req.load_failed
    got, want = dec.inst.read(0, [DEC_IDS], N), torch.from_numpy(prod["kv"][0])
    assert torch.equal(got[:, :, :FULL], want[:, :, :FULL])
    r = dec.inst.workers[0]._receiver
    assert (r.jobs, r.complete, r.short) == (1, 1, 0)
    dec.run(dec.idle)
    dec.inst.close()


def test_decode_first_waits_for_prefill(server, prefix, raw):
    """The router sends the request to both instances at once: the decode
    instance's wait (one MATCH per request) covers the prefill still
    running, and it loads the blocks as soon as they are stored."""
    tokens, hashes = tokens_and_hashes()
    dec = decode_engine(server.url, prefix, warm=False)
    ns = dec.inst.scheduler.namespace_for_rank(0)
    before = match_requests(raw(ns), ns)
    req = dec.add(Req("both-1", tokens, hashes, params={"do_remote_prefill": True},
                      max_tokens=2, ids=DEC_IDS))
    dec.step()
    assert dec.ask_log[0] == ("both-1", None, False), "asked again once the workers answered"
    dec.run(lambda: req in dec.remote)
    assert dec.ask_log[-1] == ("both-1", FULL, True)
    for _ in range(20):                  # the decode engine keeps stepping while it waits
        dec.step()
        time.sleep(0.01)
    assert req in dec.remote and not req.finished(), "still waiting: nothing stored yet"
    prod = Producer(server.url, prefix).result()
    dec.run(lambda: req.finished())
    assert not req.load_failed
    assert torch.equal(dec.inst.read(0, [DEC_IDS], FULL),
                       torch.from_numpy(prod["kv"][0])[:, :, :FULL])
    r = dec.inst.workers[0]._receiver
    assert (r.jobs, r.complete, r.waited, r.timed_out) == (1, 1, 1, 0)
    assert r.cut == 0, "no kvpool_tokens (the prefill may still run): pd_wait_ms"
    after = match_requests(raw(ns), ns)
    assert after - before == 1 + prod["store_matches"] + prod["probe_matches"], \
        "one MATCH for the decode request; the others: the prefill's store batches and the " \
        "test's own check when its blocks were freed"
    dec.run(dec.idle)
    dec.inst.close()


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_short_handoff_after_the_wait(server, prefix, policy):
    """The prefill instance stored only the first 48 tokens (it saw a
    shorter prompt): the decode instance waits pd_wait_ms, then reports
    the blocks that did not arrive. With "recompute" the request computes
    them and finishes; with "fail" it ends with an error. Either way every
    block is freed and nothing raises."""
    Producer(server.url, prefix, n=48).result()
    tokens, hashes = tokens_and_hashes()
    dec = decode_engine(server.url, prefix, policy=policy, pd_wait_ms=300)
    req = dec.add(Req("short-1", tokens, hashes, params={"do_remote_prefill": True},
                      max_tokens=1, ids=DEC_IDS))
    t0 = time.monotonic()
    dec.run(lambda: req.finished())
    waited = time.monotonic() - t0
    r = dec.inst.workers[0]._receiver
    assert (r.jobs, r.short, r.timed_out) == (1, 1, 1)
    assert waited >= 0.25, "the wait ran its course before the load"
    assert req.load_failed
    assert ("load-failed", "short-1", 3) in dec.events, "cut at the first missing block"
    if policy == "recompute":
        assert req.status.name == "FINISHED_LENGTH_CAPPED"
        assert req.num_computed_tokens >= N
    else:
        assert req.status.name == "FINISHED_ERROR"
    dec.run(dec.idle)
    dec.inst.close()


def test_stored_then_evicted_handoff_is_recomputed_without_the_full_wait(server, prefix,
                                                                         raw):
    """The prefill instance stored the blocks and answered kvpool_tokens,
    then they were evicted before the decode side came. The decode side
    waited the whole pd_wait_ms (30 s by default) before recomputing,
    although the params said the PUTs had been submitted (a fresh-clone
    test). Now the params carry kvpool_put_ms, how long those PUTs can
    still take (3 x the prefill's timeout_s; 0 once every one has ended),
    and the decode side waits no longer than that: here 3 s instead of
    pd_wait_ms 20 s, and not at all with kvpool_put_ms 0. Either way the
    request is recomputed and finishes."""
    prod = Producer(server.url, prefix).result()
    params = prod["params"]
    tokens, hashes = tokens_and_hashes()
    keys = [block_key(h) for h in hashes[:FULL // BS]]
    c = raw(prod["namespace"])
    c.delete_many(keys)                  # evicted before the decode side comes
    assert c.match(keys) == 0
    dec = decode_engine(server.url, prefix)          # pd_wait_ms 20000
    r = None
    for i, put_ms, most in ((1, PUT_MS, 10.0), (2, 0, 1.5)):
        req = dec.add(Req("gone-%d" % i, tokens, hashes,
                          params=dict(params, kvpool_put_ms=put_ms), max_tokens=1, ids=DEC_IDS))
        t0 = time.monotonic()
        dec.run(lambda: req.finished())
        waited = time.monotonic() - t0
        assert waited < most, "waited %.1f s for blocks stored and gone" % waited
        assert req.load_failed and req.status.name == "FINISHED_LENGTH_CAPPED"
        assert req.num_computed_tokens >= N
        r = dec.inst.workers[0]._receiver
        dec.run(dec.idle)
    assert (r.jobs, r.short, r.cut) == (2, 2, 2)
    assert (r.waited, r.timed_out) == (1, 1), "kvpool_put_ms 0: answered at once, not parked"
    dec.inst.close()
    assert params["kvpool_tokens"] == FULL and params["kvpool_put_ms"] == PUT_MS


def test_prefill_frees_blocks_with_no_decode(server, prefix, raw):
    """No decode instance ever asks: the prefill instance (TP 2) frees
    every block once both workers' stores are acknowledged, and each
    worker reports the request finished sending exactly once."""
    prod = Producer(server.url, prefix, tp=2).result()
    assert prod["held"] is True
    assert prod["held_at_free"] == [FULL // BS, FULL // BS]
    assert prod["free"] == prod["blocks"]
    sent = [e for e in prod["events"] if e[0] == "sent"]
    freed = [e for e in prod["events"] if e[0] == "freed"]
    assert len(sent) == 1 and len(freed) == 1 and sent[0][2] == freed[0][2]


def test_pool_down_means_recompute(fresh_server, prefix):
    """The pool is down: the decode instance's hand-off loads answer misses
    (the request is recomputed, after no wait), the prefill instance's
    stores fail and its blocks are freed all the same; nothing raises
    into the engine."""
    fresh_server.start()
    url = fresh_server.url
    tokens, hashes = tokens_and_hashes()
    dec = decode_engine(url, prefix)
    prod = Engine(Instance(url, prefix, role="kv_producer"), seed=1)
    fresh_server.kill()
    req = dec.add(Req("down-1", tokens, hashes, params={"do_remote_prefill": True},
                      max_tokens=1, ids=DEC_IDS))
    t0 = time.monotonic()
    dec.run(lambda: req.finished())
    assert time.monotonic() - t0 < 5, "a pool that is down is a miss at once"
    assert req.load_failed and req.status.name == "FINISHED_LENGTH_CAPPED"
    dec.run(dec.idle)
    p = prod.add(Req("down-p", tokens, hashes, params={"do_remote_decode": True},
                     max_tokens=1, ids=PROD_IDS))
    prod.run(prod.idle)
    assert p.status.name == "FINISHED_LENGTH_CAPPED"
    assert prod.inst.workers[0]._pipeline.chunks_failed == FULL // BS
    for e in (dec, prod):
        e.inst.close()


def test_roles_and_params_on_the_wrong_instance(server, prefix):
    """do_remote_prefill on a producer is computed there; do_remote_decode
    on a consumer gets no params (nothing was handed off); a request
    without params is untouched by the hand-off paths."""
    tokens, hashes = tokens_and_hashes()
    prod = Engine(Instance(server.url, prefix, role="kv_producer"), seed=1)
    r1 = prod.add(Req("wrong-1", tokens, hashes, params={"do_remote_prefill": True},
                      max_tokens=1, ids=PROD_IDS))
    prod.run(prod.idle)
    assert prod.ask_log[0] == ("wrong-1", 0, False) and r1.result_params is None
    dec = decode_engine(server.url, prefix)
    r2 = dec.add(Req("wrong-2", tokens, hashes, params={"do_remote_decode": True},
                     max_tokens=1, ids=DEC_IDS))
    dec.run(dec.idle)
    assert r2.result_params is None and r2.held is False
    for e in (prod, dec):
        e.inst.close()


def test_handoff_params_bound_the_wait(server, prefix):
    """kvpool_tokens 0 (the prefill instance handed nothing off): no
    asynchronous load, no wait."""
    tokens, hashes = tokens_and_hashes()
    dec = decode_engine(server.url, prefix)
    req = dec.add(Req("none-1", tokens, hashes, params={"do_remote_prefill": True,
                                                         "kvpool_tokens": 0},
                      max_tokens=1, ids=DEC_IDS))
    dec.run(dec.idle)
    assert dec.ask_log[0] == ("none-1", 0, False) and req.status.name == "FINISHED_LENGTH_CAPPED"
    dec.inst.close()


def test_no_handoff_load_with_several_kv_cache_groups(server, prefix):
    """A hybrid model (full-attention and sliding-window groups): vLLM's
    scheduler cannot take load errors for several groups, so no hand-off
    load is offered (a timeout could not be reported); the request is
    computed on the decode instance."""
    from test_vllm_connector import Setup
    inst = Instance(server.url, prefix, Setup(sliding=32), role="kv_consumer")
    tokens, hashes = tokens_and_hashes()
    req = Req("hma-1", tokens, hashes, params={"do_remote_prefill": True})
    assert inst.scheduler.get_num_new_matched_tokens(req, 0) == (0, False)
    assert inst.scheduler.get_num_new_matched_tokens(req, 0) == (0, False)
    inst.close()


def test_a_waiting_handoff_holds_up_no_other(server, prefix):
    """Two hand-offs on one decode instance: the first waits for blocks that
    never come, the second's are in the pool. The second loads at once
    (each wait has a connection of its own; a parked MATCH holds up its
    connection's later requests), while the first still waits."""
    prod = Engine(Instance(server.url, prefix, role="kv_producer"), seed=1)
    t_b, h_b = tokens_and_hashes()
    p = prod.add(Req("p-b", t_b, h_b, params={"do_remote_decode": True}, max_tokens=1,
                     ids=PROD_IDS))
    prod.run(prod.idle)
    t_a = [(5 + 31 * i) % 30000 for i in range(64)]
    h_a = kvpool.block_hashes(t_a, BS)
    dec = decode_engine(server.url, prefix, pd_wait_ms=3000)
    first = dec.add(Req("first", t_b, h_b, params=dict(p.result_params), max_tokens=1,
                        ids=DEC_IDS))
    dec.run(dec.idle)                    # one receiving thread, idle again
    assert first.status.name == "FINISHED_LENGTH_CAPPED" and not first.load_failed
    # both handed to the workers in one step, the one that waits first
    a = dec.add(Req("never", t_a, h_a, params={"do_remote_prefill": True}, max_tokens=1,
                    ids=list(range(12, 17))))
    b = dec.add(Req("stored", t_b, h_b, params=dict(p.result_params), max_tokens=1,
                    ids=DEC_IDS))
    dec.run(lambda: b.finished(), timeout_s=2.5)
    assert not b.load_failed and a in dec.remote, "the second did not queue behind the first"
    r = dec.inst.workers[0]._receiver
    dec.run(lambda: a.finished())
    assert a.load_failed and a.status.name == "FINISHED_LENGTH_CAPPED"
    assert (r.jobs, r.complete, r.short, r.timed_out) == (3, 2, 1, 1)
    dec.run(dec.idle)
    for e in (prod, dec):
        e.inst.close()
