"""The asynchronous requests of kvpool.Client (submit_*, poll, event_fd,
cancel, inflight) and the asyncio helpers of kvpool.aio."""

import asyncio
import errno
import hashlib
import select
import sys

import pytest

import kvpool
import kvpool.aio


def keys_of(tag, n):
    return [hashlib.sha256(b"%s-%d" % (tag.encode(), i)).digest() for i in range(n)]


def payload(i, n=4096):
    return bytes((i * 7 + j) & 0xFF for j in range(n))


def drain(client, want, timeout=10.0):
    got = []
    while len(got) < want:
        comps = client.poll(max=want - len(got), timeout=timeout)
        assert comps, "no completion within %s s" % timeout
        got.extend(comps)
    return got


def test_put_get_roundtrip(client):
    ks = keys_of("rt", 8)
    ids = [client.submit_put_many([k], [payload(i)], tag=("put", i)) for i, k in enumerate(ks)]
    assert len(set(ids)) == 8 and all(ids)
    assert client.inflight == 8
    comps = drain(client, 8)
    assert sorted(c.tag[1] for c in comps) == list(range(8))
    for c in comps:
        assert c.op == "put" and c.status == 0 and c.statuses == [0]
    assert client.inflight == 0

    bufs = [bytearray(4096) for _ in ks]
    rid = client.submit_get_into_many(ks, bufs, tag="batch")
    (c,) = drain(client, 1)
    assert c.id == rid and c.tag == "batch" and c.op == "get" and c.status == 0
    assert c.statuses == [0] * 8 and c.lengths == [4096] * 8
    assert all(bytes(b) == payload(i) for i, b in enumerate(bufs))


def test_miss_and_small_buffer(client):
    (k,) = keys_of("small", 1)
    client.put(k, payload(1, 1000))
    buf = bytearray(10)
    client.submit_get_into(k, buf)
    client.submit_get_into(keys_of("nothing", 1)[0], bytearray(10))
    comps = {c.statuses[0] for c in drain(client, 2)}
    assert comps == {-errno.EMSGSIZE, -errno.ENOENT}


def test_exists_match_delete(client):
    ks = keys_of("chain", 5)
    client.put_chain(ks, [payload(i, 100) for i in range(5)])
    client.submit_exists_many(ks + keys_of("absent", 1), tag="e")
    client.submit_match(ks + keys_of("absent", 1), lease_ms=100, tag="m")
    by_tag = {c.tag: c for c in drain(client, 2)}
    assert by_tag["e"].statuses == [0] * 5 + [-errno.ENOENT]
    assert by_tag["m"].matched == 5 and by_tag["m"].statuses == []
    client.submit_delete_many(ks[:1])
    (c,) = drain(client, 1)
    assert c.op == "delete" and c.statuses == [0]
    assert client.exists_many(ks) == [False] * 5


def test_full_queue_raises_busy(client):
    (k,) = keys_of("fq", 1)
    client.put(k, payload(2))
    client.max_inflight = 2
    try:
        client.submit_get_into(k, bytearray(4096))
        client.submit_get_into(k, bytearray(4096))
        with pytest.raises(kvpool.Busy):
            client.submit_get_into(k, bytearray(4096))
        drain(client, 2)
        client.submit_get_into(k, bytearray(4096))
        drain(client, 1)
    finally:
        client.max_inflight = 0


def test_event_fd_and_cancel(client):
    (k,) = keys_of("efd", 1)
    client.put(k, payload(3, 1 << 20))
    fd = client.event_fd()
    assert fd == client.event_fd()
    buf = bytearray(1 << 20)
    rid = client.submit_get_into(k, buf)
    got = []
    while not got:
        r, _, _ = select.select([fd], [], [], 5)
        assert r == [fd]
        got = client.poll(timeout=0)
    assert got[0].id == rid and got[0].status == 0
    assert bytes(buf) == payload(3, 1 << 20)

    ids = [client.submit_get_into(k, bytearray(1 << 20)) for _ in range(4)]
    cancelled = [client.cancel(i) for i in ids]
    assert client.cancel(12345678) is False
    comps = {c.id: c for c in drain(client, 4)}
    for i, was in zip(ids, cancelled):
        assert comps[i].status == (-errno.ECANCELED if was else 0)
    # the connection is still in step
    assert client.get(k) == payload(3, 1 << 20)


def test_buffers_pinned_until_polled(client):
    (k,) = keys_of("pin", 1)
    client.put(k, payload(4))
    buf = bytearray(4096)
    client.submit_get_into(k, buf)
    with pytest.raises(BufferError):
        buf.extend(b"x")            # pinned: cannot be resized under libkvpool
    drain(client, 1)
    buf.extend(b"x")                # released once polled


def test_server_gone(fresh_server):
    fresh_server.start()
    c = kvpool.Client(fresh_server.url, "gone")
    (k,) = keys_of("gone", 1)
    c.put(k, payload(5, 1 << 20))
    ids = [c.submit_get_into(k, bytearray(1 << 20)) for _ in range(8)]
    fresh_server.kill()
    comps = drain(c, 8)
    assert {x.id for x in comps} == set(ids)
    for x in comps:
        assert x.status in (0, -errno.ECONNRESET, -errno.EPIPE)
    with pytest.raises(kvpool.ConnectionError):
        c.submit_get_into(k, bytearray(10))
    c.close()


def test_aio(client):
    ks = keys_of("aio", 6)
    ac = kvpool.aio.AsyncClient(client)

    async def main():
        st = await ac.put_many(ks, [payload(i) for i in range(6)])
        assert st == [0] * 6
        bufs = [bytearray(4096) for _ in ks]
        lens, matched, present = await asyncio.gather(
            ac.get_into_many(ks, bufs), ac.match(ks), ac.exists_many(ks))
        assert lens == [4096] * 6 and matched == 6 and present == [True] * 6
        assert all(bytes(b) == payload(i) for i, b in enumerate(bufs))
        rid = client.submit_get_into(ks[0], bytearray(4096))
        comp = await kvpool.aio.wait(client, rid)
        assert comp.status == 0
        assert await ac.delete_many(ks[:1]) == [True]

    asyncio.run(main())


RO_TOKEN = "async-ro-0123456789abcdef0123"
RW_TOKEN = "async-rw-0123456789abcdef0123"


def test_completion_message_per_request(tmp_path):
    """Each Completion carries the server's words for its own refusal:
    kvpool_poll keeps one message per call, so a batch poll used to lose
    them (and Completion had no field for them)."""
    from conftest import Server
    tokens = tmp_path / "tokens"
    tokens.write_text("[tokens]\n%s rw ro-\n%s ro ro-\n" % (RW_TOKEN, RO_TOKEN))
    tokens.chmod(0o600)
    srv = Server("--dram-capacity", "64MiB", "--threads", "1",
                 "--tokens-file", str(tokens)).start()
    try:
        with kvpool.Client(srv.url, "ro-msgs", token=RO_TOKEN) as c:
            ks = keys_of("msg", 3)
            a = c.submit_exists_many([ks[0]])
            b = c.submit_put_many([ks[1]], [payload(1)])
            d = c.submit_exists_many([ks[2]])
            c.exists(ks[0])          # queued behind them: all three are done now
            comps = {x.id: x for x in c.poll(max=8, timeout=5)}
            assert set(comps) == {a, b, d}
            assert comps[b].status == -errno.EACCES
            assert "read-only" in comps[b].message
            assert comps[a].status == 0 and comps[a].message == ""
            assert comps[d].status == 0 and comps[d].message == ""
    finally:
        srv.stop()


def test_full_queue_says_poll(client):
    """The Client's own full queue (max_inflight) is named as such, not as
    a server that is busy."""
    client.max_inflight = 2
    ks = keys_of("fullq", 3)
    try:
        client.submit_exists_many([ks[0]])
        client.submit_exists_many([ks[1]])
        with pytest.raises(kvpool.Busy) as ei:
            client.submit_exists_many([ks[2]])
        assert "poll some first" in str(ei.value)
        assert "max_inflight" in str(ei.value)
        assert "server" not in str(ei.value)
        drain(client, 2)
    finally:
        client.max_inflight = 0


def test_sync_call_behind_a_waiting_match(server, namespace):
    """A put made on a Client while its submitted waiting match is parked
    in the server queues behind it: it neither times out after the
    Client's timeout (1 s; the wait is 2.5 s) nor ends the wait."""
    with kvpool.Client(server.url, namespace, timeout=1.0) as c:
        (miss,) = keys_of("behind-miss", 1)
        (other,) = keys_of("behind-other", 1)
        rid = c.submit_match([miss], wait_ms=2500)
        c.put(other, payload(3))
        (comp,) = drain(c, 1)
        assert comp.id == rid and comp.status == 0
        assert comp.result.flags == kvpool.MATCH_WAITED | kvpool.MATCH_WAIT_TIMEOUT
        assert c.exists(other)


def test_put_block_array_lives_until_completion(client):
    """A submitted put's block array (keys, iovecs) is read by libkvpool
    until the request completes: the binding must keep it alive. Large
    blocks keep the requests queued while the allocator is churned, so a
    freed array would be reused under them (a crash, or blocks stored
    under wrong keys; without the array kept, 1 to 3 rounds of 5 crashed)."""
    import ctypes
    import gc

    for rnd in range(5):
        ks = keys_of("uaf%d" % rnd, 8)
        data = [bytes([rnd * 8 + i + 1]) * (4 << 20) for i in range(8)]
        ids = [client.submit_put_many([ks[i]], [data[i]]) for i in range(8)]
        gc.collect()
        junk = [(ctypes.c_char * 64)(*([0x41] * 64)) for _ in range(20000)]
        comps = drain(client, 8, timeout=30.0)
        del junk
        assert sorted(c.id for c in comps) == sorted(ids)
        assert all(c.status == 0 and c.statuses == [0] for c in comps)
        for i, k in enumerate(ks):
            buf = bytearray(4 << 20)
            assert client.get_into(k, buf) == 4 << 20
            assert bytes(buf) == data[i]
        client.delete_many(ks)
