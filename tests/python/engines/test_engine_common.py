"""The adapters' shared helpers (kvpool._engine, kvpool._engine_async):
namespaces, keys, the rate-limited log, and the asynchronous shim."""

import logging
import select
import time

import pytest

import kvpool
from kvpool import _engine
from kvpool._engine_async import AsyncLink


def test_namespace_parts_and_long_names():
    assert _engine.make_namespace("a b", "é", "x:y") == "a_b:__:x:y"
    long1 = _engine.make_namespace("p", "m" * 300)
    long2 = _engine.make_namespace("p", "m" * 299 + "n")
    assert len(long1) == 255 and len(long2) == 255 and long1 != long2
    assert long1.startswith("p:mmm")


def test_keys():
    assert _engine.pad_key(b"\1" * 16) == b"\1" * 16 + bytes(16)
    assert _engine.pad_key(b"\2" * 32) == b"\2" * 32
    with pytest.raises(ValueError):
        _engine.pad_key(b"\3" * 33)
    with pytest.raises(TypeError):
        _engine.pad_key("not bytes")
    assert len(_engine.string_key("model@1@0@ab")) == 32
    assert _engine.string_key("a") != _engine.string_key("a@salt")


def test_rate_limited_log(caplog):
    log = _engine.RateLimitedLog(logging.getLogger("kvpool.test"), interval_s=0.2)
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
    link = _engine.Link(fresh_server.url, "common", timeout_s=1.0)
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


def test_async_link_completions_in_order(server):
    link = _engine.Link(server.url, "common-async")
    a = AsyncLink(link, max_inflight=4)
    keys = kvpool.block_hashes(list(range(4)), 1, extra=b"async")
    ids = [a.submit_put_many(keys, [b"x" * 100] * 4, [None] + keys[:-1], tag="p"),
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
    assert [c.id for c in got] == ids
    assert [c.op for c in got] == ["put", "match", "get", "exists"]
    assert got[0].statuses == [0] * 4 and got[1].matched == 4
    assert got[2].lengths == [100] * 4 and got[3].statuses == [0] * 4
    assert not select.select([a.event_fd()], [], [], 0)[0]
    assert a.inflight == 0
    a.close()
    a.close()
    with pytest.raises(ValueError):
        a.submit_exists_many(keys)
    link.close()
