"""A MATCH that waits for blocks, through the Python binding against a real
kvpoold (server/srv_mwait.c): Client.match(keys, wait_ms=, want=) woken by
put_chain from another Client, the shorter run on a timeout, want below
the chain, and one MATCH counted per waiting call."""

import threading
import time

import kvpool


def chain(tag, n):
    return [("%s-%02d" % (tag, i)).encode().ljust(32, b".") for i in range(n)]


def payloads(n):
    return [bytes([i]) * 4096 for i in range(n)]


def test_woken_by_a_put_from_another_client(server, client, namespace):
    keys = chain("woken", 4)
    out = {}

    def waiter():
        with kvpool.Client(server.url, namespace) as c:
            t0 = time.monotonic()
            out["r"] = c.match_detail(keys, wait_ms=20000)
            out["s"] = time.monotonic() - t0

    requests0 = client.stats()["ops"]["match"]["requests"]
    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 10
    while client.stats()["ops"]["match"]["waits"]["waiting"] < 1:
        assert time.monotonic() < deadline, "the MATCH never parked"
        time.sleep(0.02)
    client.put_chain(keys, payloads(4))
    t.join(30)
    r = out["r"]
    assert r.matched == 4 and r.present == 4
    assert r.flags == kvpool.MATCH_WAITED
    assert out["s"] < 15
    st = client.stats()["ops"]["match"]
    assert st["waits"]["waiting"] == 0
    # one MATCH for the waiting call (and none for the STATS polls)
    assert st["requests"] == requests0 + 1


def test_timeout_is_a_shorter_match(client):
    keys = chain("short", 4)
    client.put_chain(keys[:2], payloads(2))
    r = client.match_detail(keys, wait_ms=200)
    assert r.matched == 2
    assert r.flags == kvpool.MATCH_WAITED | kvpool.MATCH_WAIT_TIMEOUT
    assert client.match(keys, wait_ms=200) == 2


def test_want_below_the_chain_answers_at_once_when_present(client):
    keys = chain("want", 6)
    client.put_chain(keys[:3], payloads(3))
    t0 = time.monotonic()
    r = client.match_detail(keys, wait_ms=20000, want=3)
    assert time.monotonic() - t0 < 10
    assert r.matched == 3 and r.flags == 0
