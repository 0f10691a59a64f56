"""The adapters' shared helpers (kvpool._adapters): namespaces, keys, the
rate-limited log, the reconnecting Link and the asynchronous link."""

import logging
import select
import time
import types

import pytest

import kvpool
from kvpool._adapters import keys as _keys
from kvpool._adapters import link as _link
from kvpool._adapters.async_link import AsyncLink, NativeAsyncLink, make_async_link

NATIVE = hasattr(kvpool.Client, "submit_get_into_many")
KINDS = ["thread"] + (["native"] if NATIVE else [])


def test_namespace_parts_and_long_names():
    assert _keys.make_namespace("a b", "é", "x:y") == "a_b:__:x:y"
    long1 = _keys.make_namespace("p", "m" * 300)
    long2 = _keys.make_namespace("p", "m" * 299 + "n")
    assert len(long1) == 255 and len(long2) == 255 and long1 != long2
    assert long1.startswith("p:mmm")


def test_keys():
    assert _keys.pad_key(b"\1" * 16) == b"\1" * 16 + bytes(16)
    assert _keys.pad_key(b"\2" * 32) == b"\2" * 32
    with pytest.raises(ValueError):
        _keys.pad_key(b"\3" * 33)
    with pytest.raises(TypeError):
        _keys.pad_key("not bytes")
    assert len(_keys.string_key("model@1@0@ab")) == 32
    assert _keys.string_key("a") != _keys.string_key("a@salt")


def test_rate_limited_log(caplog):
    log = _link.RateLimitedLog(logging.getLogger("kvpool.test"), interval_s=0.2)
    with caplog.at_level(logging.WARNING, "kvpool.test"):
        assert log.warning("t", "one %d", 1)
        assert not log.warning("t", "two")
        assert log.warning("u", "other topic")
        time.sleep(0.25)
        assert log.warning("t", "three")
    assert [r.getMessage() for r in caplog.records] == [
        "one 1", "other topic", "three (1 similar messages suppressed)"]


def test_link_down_answers_default_at_once(fresh_server):
    fresh_server.start()
    port = fresh_server.port
    link = _link.Link(fresh_server.url, "common", timeout_s=1.0)
    assert link.up and link.call("ping", lambda c: c.ping(), None) is not None
    fresh_server.kill()
    assert link.call("ping", lambda c: c.ping(), "down") == "down"
    assert not link.up
    t0 = time.monotonic()
    assert link.call("ping", lambda c: c.ping(), "down") == "down"
    assert time.monotonic() - t0 < 0.05, "a Link that is down does not touch the network"
    fresh_server.start(port=port)
    deadline = time.monotonic() + 15
    while not link.up and time.monotonic() < deadline:
        time.sleep(0.05)
    assert link.up and link.reconnects == 1
    link.close()
    link.close()


@pytest.mark.parametrize("kind", KINDS)
def test_async_link_completions(server, kind):
    """Both AsyncLink kinds (the thread-backed one, and the one over the
    binding's asynchronous API when the binding has it)."""
    link = _link.Link(server.url, "common-async-" + kind)
    a = (AsyncLink if kind == "thread" else NativeAsyncLink)(link, max_inflight=4)
    keys = kvpool.block_hashes(list(range(4)), 1, extra=b"async" + kind.encode())
    missing = kvpool.block_hashes([1], 1, extra=b"never stored")[0]
    ids = [a.submit_put_many(keys, [b"x" * 100] * 4, [missing] + keys[:-1], tag="p"),
           a.submit_match(keys, 1000, tag="m"),
           a.submit_get_into_many(keys, [bytearray(100) for _ in keys], tag="g"),
           a.submit_exists_many(keys, tag="e")]
    with pytest.raises(kvpool.Busy):
        a.submit_delete_many(keys)
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 4 and time.monotonic() < deadline:
        select.select([a.event_fd()], [], [], 1)
        got += a.poll()
    by = {c.tag: c for c in got}
    assert sorted(c.id for c in got) == sorted(ids)
    assert [by[t].op for t in "pmge"] == ["put", "match", "get", "exists"]
    assert by["p"].statuses == [0] * 4, "an absent parent: re-put as a root"
    assert by["m"].matched in (0, 4)       # the native kind may match before the re-put
    assert by["e"].statuses in ([0] * 4, [-2] * 4)
    assert not select.select([a.event_fd()], [], [], 0)[0]
    assert a.inflight == 0
    g = a.submit_get_into_many(keys, [bytearray(100) for _ in keys])
    deadline = time.monotonic() + 10
    out = []
    while not out and time.monotonic() < deadline:
        out = a.poll(timeout=1)
    assert out[0].id == g and out[0].lengths == [100] * 4 and out[0].status == 0
    a.close()
    a.close()
    with pytest.raises(ValueError):
        a.submit_exists_many(keys)
    link.close()


def test_make_async_link_picks_the_native_kind_when_there(server, monkeypatch):
    link = _link.Link(server.url, "common-pick")
    a = make_async_link(link)
    assert a.native == NATIVE
    a.close()
    monkeypatch.setenv("KVPOOL_ENGINE_ASYNC", "thread")
    b = make_async_link(link)
    assert not b.native
    b.close()
    link.close()


def test_make_async_link_cluster_urls_get_the_native_kind():
    # libkvpool's asynchronous calls work on cluster handles (they answered
    # -EOPNOTSUPP, and adapters on a node list or an etcd:// URL fell back
    # to a worker thread running requests one at a time).
    for url in ("tcp://127.0.0.1:1,127.0.0.1:2", "etcd://127.0.0.1:2379/c"):
        link = types.SimpleNamespace(url=url, on_down=None, _client=None)
        a = make_async_link(link)
        assert a.native == NATIVE, url
        a.close()


@pytest.mark.parametrize("kind", KINDS)
def test_async_link_pool_down_then_back(fresh_server, kind):
    fresh_server.start()
    port = fresh_server.port
    link = _link.Link(fresh_server.url, "common-down", timeout_s=1.0)
    a = (AsyncLink if kind == "thread" else NativeAsyncLink)(link)
    keys = kvpool.block_hashes(list(range(3)), 1, extra=b"down")

    def one(submit):
        rid = submit()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for c in a.poll(timeout=0.5):
                assert c.id == rid
                return c
        raise AssertionError("no completion")
    assert one(lambda: a.submit_put_many(keys, [b"y" * 10] * 3)).status == 0
    fresh_server.kill()
    for _ in range(3):
        c = one(lambda: a.submit_match(keys, 0))
        assert c.matched == 0
    fresh_server.start(port=port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if one(lambda: a.submit_put_many(keys, [b"y" * 10] * 3)).status == 0:
            break
        time.sleep(0.2)
    assert one(lambda: a.submit_match(keys, 0)).matched == 3
    a.close()
    link.close()


def test_lease_cap_is_warned_about(fresh_server, caplog):
    """Finding 7: a lease_ms above the server's max_lease_ms is logged
    once on connecting (Client.limits is a property: calling it raised a
    TypeError the Link swallowed, so the warning never fired)."""
    fresh_server.extra += ["--max-lease-ms", "1000"]
    fresh_server.start()
    with caplog.at_level(logging.WARNING, "kvpool.engines"):
        link = _link.Link(fresh_server.url, "lease-cap", lease_ms=60000, name="t")
    got = [r.getMessage() for r in caplog.records if "max_lease_ms" in r.getMessage()]
    assert len(got) == 1 and "1000" in got[0]
    link.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kvpool.engines"):
        link = _link.Link(fresh_server.url, "lease-cap", lease_ms=1000, name="t")
    assert not [r for r in caplog.records if "max_lease_ms" in r.getMessage()]
    link.close()


def test_block_over_max_block_bytes_fails_at_start(fresh_server):
    """Finding 14: a Link told its block size refuses at start a server
    whose max_block_bytes is smaller."""
    fresh_server.extra += ["--max-block-bytes", "4KiB"]
    fresh_server.start()
    with pytest.raises(_link.ConfigError) as e:
        _link.Link(fresh_server.url, "mbb", block_bytes=8192, name="t")
    assert "max_block_bytes" in str(e.value) and "8192" in str(e.value)
    _link.Link(fresh_server.url, "mbb", block_bytes=4096, name="t").close()


@pytest.mark.skipif(not NATIVE, reason="the binding has no asynchronous API")
def test_failed_reput_is_reported_failed(server):
    """Finding 9: when the re-put of a block refused with -ENOLINK
    cannot be sent (the client is busy, or its connection dropped), the
    completion reports that block failed, at its own position (it said 0,
    from another position's status, for a block never stored)."""
    got = []
    link = _link.Link(server.url, "reput-fail")
    a = NativeAsyncLink(link, on_complete=got.append)
    real = a._send

    def flaky(c, req, args):
        if req.again is not None:               # the re-put
            raise kvpool.Busy(-11, "simulated: in-flight limit reached")
        return real(c, req, args)
    a._send = flaky
    keys = kvpool.block_hashes(list(range(2)), 1, extra=b"reput-fail")
    missing = kvpool.block_hashes([7], 1, extra=b"never stored")[0]
    a.submit_put_many(keys, [b"A" * 64, b"B" * 64], [None, missing])
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    held = link.call("exists", lambda c: c.exists_many(keys), None)
    assert held == [True, False]
    assert got[0].statuses[0] == 0 and got[0].statuses[1] == -11
    assert got[0].status == -11
    a.close()
    link.close()
