"""Protocol version 2 through the Python binding, against a real kvpoold:
Client.match(..., wait_ms, want, retain_ms), match_detail and MatchResult,
put_many/put_chain(retain_ms=, flags=), the asynchronous twins and aio,
the new Limits fields, the MATCH_*/PUT_* constants, and argument checks
(a value of the wrong type raises TypeError, never crashes).

Retention is checked as far as the flags and granted retain_ms go (what
retention does to eviction and budgets: test_retain.py and
tests/integration/test_retain.c); a wait only where every block is there
(answered at once) or wait_ms is cut (MATCH_WAIT_CLAMPED). Waiting
itself: test_match_wait.py and tests/integration/test_match_wait.c.
"""

import asyncio
import time

import pytest

import kvpool
import kvpool.aio


def payload(n, seed):
    return bytes((i * 31 + seed * 7) & 0xFF for i in range(n))


def chain(tag, n):
    return kvpool.block_hashes(list(range(n * 4)), 4, extra=tag.encode())


def test_constants_match_the_header():
    assert (kvpool.MATCH_LEASE_CUT, kvpool.MATCH_WAITED, kvpool.MATCH_WAIT_TIMEOUT,
            kvpool.MATCH_WAIT_REFUSED, kvpool.MATCH_WAIT_CLAMPED, kvpool.MATCH_WAIT_ENDED,
            kvpool.MATCH_RETAIN_BUDGET, kvpool.MATCH_RETAIN_CLAMPED) == \
        (0x001, 0x002, 0x004, 0x008, 0x010, 0x020, 0x040, 0x080)
    assert (kvpool.PUT_RETAINED, kvpool.PUT_RETAIN_BUDGET, kvpool.PUT_RETAIN_CLAMPED) == \
        (0x01, 0x02, 0x04)
    assert kvpool.MatchResult._fields == ("matched", "present", "retained", "lease_ms",
                                          "retain_ms", "flags")


def test_limits_v2(client):
    lim = client.limits
    assert lim.protocol_version == 2
    assert lim.max_match_wait_ms == 30000        # kvpoold's defaults
    assert lim.max_retain_ms == 86400000
    assert lim.max_batch_blocks > 0 and lim.max_block_bytes > 0


def test_match_v2_equals_v1(client):
    keys = chain("eq", 6)
    client.put_chain(keys[:4], [payload(100, i) for i in range(4)])
    assert client.match(keys) == 4
    assert client.match(keys, lease_ms=500) == 4
    r = client.match_detail(keys, lease_ms=500)
    assert r == kvpool.MatchResult(4, 4, 0, 500, 0, 0)
    assert client.match_detail(keys) == kvpool.MatchResult(4, 4, 0, 0, 0, 0)
    assert client.match_detail([]) == kvpool.MatchResult(0, 0, 0, 0, 0, 0)
    # want within the chain, retain_ms: answered at once, the run retained
    r = client.match_detail(keys, want=3, retain_ms=60000)
    assert r.matched == 4 and r.retained == 4 and r.retain_ms == 60000 and r.flags == 0
    assert client.match(keys, want=6, wait_ms=0) == 4


def test_match_wait_is_clamped_and_bounded(client):
    keys = chain("clamp", 3)
    client.put_chain(keys, [payload(64, i) for i in range(3)])
    r = client.match_detail(keys, wait_ms=40000)
    assert r.matched == 3
    assert r.flags & kvpool.MATCH_WAIT_CLAMPED
    # all present: answered at once, well within the Client's timeout
    t0 = time.monotonic()
    assert client.match(keys, wait_ms=2000, want=3) == 3
    assert time.monotonic() - t0 < 2.0


def test_put_retain_and_flags(client):
    keys = chain("retain", 3)
    flags = ["stale"]
    assert client.put_chain(keys, [payload(64, i) for i in range(3)], retain_ms=60000,
                            flags=flags) == [0, 0, 0]
    assert flags == [kvpool.PUT_RETAINED] * 3
    flags = []
    assert client.put_many(keys, [payload(64, i) for i in range(3)],
                           parents=[None] + keys[:-1], retain_ms=[0, 1000, 2000],
                           flags=flags) == [0, 0, 0]
    assert flags == [0, kvpool.PUT_RETAINED, kvpool.PUT_RETAINED]   # stored: extended
    client.put(keys[0], payload(64, 0), retain_ms=5)          # EXISTS with a retention
    client.put(kvpool.block_hashes([9, 9, 9, 9], 4)[0], [payload(8, 1), payload(8, 2)],
               retain_ms=10)
    assert client.put_many([], [], retain_ms=5, flags=flags) == [] and flags == []
    assert client.match(keys) == 3


def test_argument_types(client):
    keys = chain("types", 2)
    with pytest.raises(TypeError):
        client.match(keys, wait_ms="10")
    with pytest.raises(TypeError):
        client.match(keys, want="2")
    with pytest.raises(TypeError):
        client.match(keys, retain_ms=1.5)
    with pytest.raises(TypeError):
        client.match(keys, wait_ms=True)
    with pytest.raises(TypeError):
        client.match(keys, lease_ms=None)
    with pytest.raises(TypeError):
        client.match_detail([1, 2])                      # ints where keys are due
    with pytest.raises(kvpool.InvalidArgument):
        client.match(keys, want=3)                        # above len(keys)
    with pytest.raises(kvpool.InvalidArgument):
        client.match(keys, want=-1)
    with pytest.raises(kvpool.InvalidArgument):
        client.match(keys, wait_ms=-5)
    with pytest.raises(kvpool.InvalidArgument):
        client.match(keys, retain_ms=1 << 32)
    with pytest.raises(TypeError):
        client.put_many(keys, [b"a", b"b"], retain_ms="60000")
    with pytest.raises(TypeError):
        client.put_many(keys, [b"a", b"b"], retain_ms=[1, "2"])
    with pytest.raises(kvpool.InvalidArgument):
        client.put_many(keys, [b"a", b"b"], retain_ms=[1])
    with pytest.raises(TypeError):
        client.put_many(keys, [b"a", b"b"], flags=(0, 0))
    with pytest.raises(TypeError):
        client.put(keys[0], b"x", retain_ms=None)
    with pytest.raises(TypeError):
        client.submit_match(keys, wait_ms="1")
    with pytest.raises(TypeError):
        client.submit_put_many(keys, [b"a", b"b"], retain_ms=2.0)
    # nothing was sent, and the Client still works
    assert client.match(keys) == 0
    assert client.inflight == 0


def test_async_v2(client):
    keys = chain("async", 5)
    client.put_chain(keys[:3], [payload(32, i) for i in range(3)])
    flags = []
    rid_m = client.submit_match(keys, lease_ms=300, want=2, tag="m")
    rid_p = client.submit_put_many(keys[3:], [payload(32, 3), payload(32, 4)],
                                   parents=keys[2:4], retain_ms=1000, flags=flags, tag="p")
    rid_m2 = client.submit_match(keys, tag="m2")
    got = {}
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        for comp in client.poll(timeout=1.0):
            got[comp.tag] = comp
    assert set(got) == {"m", "p", "m2"}
    m, p, m2 = got["m"], got["p"], got["m2"]
    assert m.id == rid_m and p.id == rid_p and m2.id == rid_m2
    assert m.status == 0 and m.matched == 3
    assert m.result == kvpool.MatchResult(3, 3, 0, 300, 0, 0)
    assert p.status == 0 and p.statuses == [0, 0]
    assert p.flags == [kvpool.PUT_RETAINED] * 2 and flags == p.flags
    assert m2.matched == 5 and m2.result.matched == 5   # behind the put, in request order
    assert not m.flags and p.result is None


def test_aio_v2(client):
    keys = chain("aio", 4)
    ac = kvpool.aio.AsyncClient(client)

    async def run():
        flags = []
        st = await ac.put_many(keys, [payload(16, i) for i in range(4)],
                               parents=[None] + keys[:-1], retain_ms=500, flags=flags)
        n = await ac.match(keys, wait_ms=100, want=4)
        r = await ac.match_detail(keys, lease_ms=200)
        return st, flags, n, r

    st, flags, n, r = asyncio.run(run())
    assert st == [0] * 4 and flags == [kvpool.PUT_RETAINED] * 4
    assert n == 4
    assert r == kvpool.MatchResult(4, 4, 0, 200, 0, 0)
