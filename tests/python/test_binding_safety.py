"""The Python binding cannot crash its host or write where it must not
(issue 28 item 6): every argument's type is checked before libkvpool sees
it; a cancelled await cancels its request (no buffer written after the
await ended) and frees its slot; torch tensors given to asynchronous calls
stay alive until completion, and one resized meanwhile is never written;
an error's message carries the server's reason."""

import asyncio
import errno
import gc
import hashlib
import os
import subprocess
import sys
import weakref

import pytest

import kvpool
import kvpool.aio
from conftest import ROOT, Server


def keys_of(tag, n):
    return [hashlib.sha256(b"%s-%d" % (tag.encode(), i)).digest() for i in range(n)]


def test_token_int_is_refused_not_a_crash(server):
    """Client(token=<int>) used to hand the int to libkvpool as a char
    pointer and segfault the process. Run it in a child so that a crash
    fails the test instead of killing pytest."""
    code = ("import kvpool\n"
            "try:\n"
            "    kvpool.Client(%r, 'ns', token=1234567890123456)\n"
            "except TypeError as e:\n"
            "    print('TypeError:', e)\n" % server.url)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, "child died with %d: %s" % (r.returncode, r.stderr)
    assert "TypeError:" in r.stdout and "token must be str or bytes" in r.stdout
    assert "quote it" in r.stdout


@pytest.mark.parametrize("kwargs", [
    dict(namespace=5), dict(namespace=None), dict(url=7470), dict(token=1.5),
    dict(token=["t"]), dict(timeout="10"), dict(timeout=True),
])
def test_connect_argument_types(server, kwargs):
    args = dict(url=server.url, namespace="types")
    args.update(kwargs)
    with pytest.raises(TypeError):
        kvpool.Client(**args)


def test_call_argument_types(client):
    k = keys_of("types", 1)
    with pytest.raises(TypeError):
        client.match(k, lease_ms=True)
    with pytest.raises(TypeError):
        client.match(k, lease_ms=1.0)
    with pytest.raises(TypeError):
        client.submit_match(k, lease_ms="5")
    with pytest.raises(TypeError):
        client.poll(max=True)
    with pytest.raises(TypeError):
        client.poll(timeout="1")
    with pytest.raises(TypeError):
        client.cancel("1")
    with pytest.raises(TypeError):
        client.stats(namespace=3)
    with pytest.raises(TypeError):
        client.drop_namespace(3)
    with pytest.raises(TypeError):
        client.timeout = "3"
    with pytest.raises(TypeError):
        client.max_inflight = 8.0
    with pytest.raises(TypeError):
        client.put(k[0], 12345)
    with pytest.raises(TypeError):
        client.put(12345, b"x")
    # nothing was sent, and the Client still works
    client.put(k[0], b"ok")
    assert client.get(k[0]) == b"ok"


def test_cancelled_await_cancels_and_frees_its_slot(client):
    """asyncio.wait_for timing out on an aio GET: once the await ended,
    nothing is written into its buffer, and 3 x max_inflight such timeouts
    leave the Client usable (before, the 65th submit raised Busy and a GET
    later overwrote the caller's reused buffer)."""
    big = 8 << 20
    k = keys_of("cancel", 1)[0]
    client.put(k, bytes(range(256)) * (big // 256))
    ac = kvpool.aio.AsyncClient(client)

    async def run():
        timeouts = 0
        for i in range(3 * client.max_inflight):
            buf = bytearray(b"\xee") * big
            try:
                await asyncio.wait_for(ac.get_into(k, buf), timeout=0.0005)
            except asyncio.TimeoutError:
                timeouts += 1
                snap = bytes(buf)
                # let the loop (and libkvpool) run: nothing may land in buf now
                await asyncio.sleep(0.002)
                await ac.exists_many([k])
                assert bytes(buf) == snap, "buffer written after its await ended"
        # every slot came free: the queue is empty and new requests work
        for _ in range(200):
            if client.inflight == 0:
                break
            await asyncio.sleep(0.01)
        assert client.inflight == 0
        got = bytearray(big)
        assert await ac.get_into(k, got) == big
        assert bytes(got[:256]) == bytes(range(256))
        return timeouts

    timeouts = asyncio.run(run())
    assert timeouts > 0, "no await timed out: the test did not test anything"


def test_tensor_kept_alive_until_completion(client, torch):
    k = keys_of("tensor", 1)[0]
    client.put(k, b"t" * 4096)
    t = torch.zeros(4096, dtype=torch.uint8)
    ref = weakref.ref(t)
    rid = client.submit_get_into(k, t)
    del t
    gc.collect()
    assert ref() is not None, "tensor freed while its GET was in flight"
    comp = [c for c in client.poll(timeout=10) if c.id == rid][0]
    assert comp.status == 0 and comp.lengths == [4096]
    gc.collect()
    assert ref() is None, "tensor still held after its completion"


def test_resized_tensor_is_never_written(client, torch):
    """torch cannot refuse resize_ the way a bytearray's buffer export
    does; a request whose tensor was resized meanwhile is cancelled before
    libkvpool touches memory the tensor no longer owns, and completes with
    -EFAULT."""
    k = keys_of("resize", 1)[0]
    n = 4 << 20
    client.put(k, b"r" * n)
    t = torch.zeros(n, dtype=torch.uint8)
    rid = client.submit_get_into(k, t)
    t.resize_(4 * n)            # new storage: the pinned range is freed
    t.fill_(7)
    comps = []
    while not comps:
        comps = [c for c in client.poll(timeout=10) if c.id == rid]
    assert comps[0].status == -errno.EFAULT
    assert comps[0].statuses == [-errno.EFAULT]
    assert int(t.min()) == 7 and int(t.max()) == 7
    err = kvpool.errors.make_error(-errno.EFAULT, "get")
    assert isinstance(err, kvpool.InvalidArgument) and "resized" in str(err)
    # the Client goes on
    assert client.get(k) == b"r" * n


def test_quota_message_carries_the_server_reason(tmp_path):
    """A request the server refuses as a whole says why, and the exception
    says it too (before, only libkvpool's generic line)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("quota-token-0123456789abcdef rw q/\n")
    tokens.chmod(0o600)
    s = Server("--dram-capacity", "64MiB", "--max-block-bytes", "1MiB", "--threads", "1",
               "--tokens-file", str(tokens), "--tenant-max-namespaces", "1").start()
    tok = "quota-token-0123456789abcdef"
    try:
        with kvpool.Client(s.url, "q/one", token=tok) as c:
            c.put(keys_of("q", 1)[0], b"q" * 1024)
        with kvpool.Client(s.url, "q/two", token=tok) as c:
            with pytest.raises(kvpool.QuotaExceeded) as ei:
                c.put(keys_of("q", 2)[0], b"q" * 1024)
        msg = str(ei.value)
        assert "(server: namespace q/two not created: the token already has 1 namespaces " \
               "(tenant_max_namespaces 1))" in msg, msg
        # a refused HELLO says why too
        with pytest.raises(kvpool.Denied) as ei:
            kvpool.Client(s.url, "q/one", token="not-a-known-token-0123456")
        assert "unknown token" in str(ei.value)
    finally:
        assert s.stop() == 0
