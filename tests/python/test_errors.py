"""libkvpool's errors become kvpool.Error subclasses carrying the C code
and a message; connection failures are also builtin ConnectionErrors."""

import builtins
import errno
import pickle
import socket
import threading
import time

import pytest

import kvpool

K = kvpool.block_hashes(list(range(16)), 16)[0]

MAPPING = {
    errno.ENOENT: kvpool.Miss, errno.ENOLINK: kvpool.NoParent, errno.ENOSPC: kvpool.Full,
    errno.EDQUOT: kvpool.QuotaExceeded, errno.EAGAIN: kvpool.Busy,
    errno.EMSGSIZE: kvpool.TooLarge, errno.EACCES: kvpool.Denied,
    errno.EBADMSG: kvpool.ChecksumError, errno.EIO: kvpool.ServerIOError,
    errno.EPROTO: kvpool.ProtocolError, errno.EOPNOTSUPP: kvpool.Unsupported,
    errno.EINVAL: kvpool.InvalidArgument, errno.ENOMEM: kvpool.OutOfMemory,
    errno.EEXIST: kvpool.AlreadyRegistered, errno.ECONNREFUSED: kvpool.ConnectionError,
    errno.ECONNRESET: kvpool.ConnectionError, errno.EPIPE: kvpool.ConnectionError,
    errno.ETIMEDOUT: kvpool.Timeout, errno.ENODEV: kvpool.Unsupported,
}


def test_every_documented_errno_has_a_class():
    """Each errno kvpool.h documents maps to its own class with the
    library's own description."""
    for e, cls in MAPPING.items():
        assert kvpool.error_class(-e) is cls
        assert issubclass(cls, kvpool.Error)
        assert kvpool.strerror(-e) != kvpool.strerror(-123456)
    assert kvpool.error_class(-errno.EXDEV) is kvpool.Error
    assert issubclass(kvpool.ConnectionError, builtins.ConnectionError)
    assert issubclass(kvpool.Timeout, builtins.TimeoutError)
    assert issubclass(kvpool.InvalidArgument, ValueError)


def test_error_attributes_and_pickle():
    e = kvpool.Miss(-errno.ENOENT, "get 00: not found")
    assert (e.code, e.errno, e.message, str(e)) == (-2, 2, "get 00: not found", "get 00: not found")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is kvpool.Miss and back.code == -2 and str(back) == str(e)
    c = kvpool.ConnectionError(-errno.ECONNREFUSED, "connect: refused")
    assert c.errno == errno.ECONNREFUSED and isinstance(c, OSError)
    assert str(pickle.loads(pickle.dumps(c))) == "connect: refused"


def test_miss(client):
    with pytest.raises(kvpool.Miss) as ei:
        client.get(K)
    assert ei.value.code == -errno.ENOENT and ei.value.errno == errno.ENOENT
    assert "not found" in str(ei.value) and K.hex()[:16] in str(ei.value)
    with pytest.raises(kvpool.Miss):
        client.get_into(K, bytearray(10))


def test_too_large(client):
    limit = client.limits.max_block_bytes
    with pytest.raises(kvpool.TooLarge) as ei:
        client.put(K, bytearray(limit + 1))                   # refused before sending
    assert ei.value.code == -errno.EMSGSIZE
    client.put(K, bytes(1000))
    with pytest.raises(kvpool.TooLarge) as ei:
        client.get_into(K, bytearray(999))                    # buffer too small
    assert ei.value.block_bytes == 1000 and "1000 bytes" in str(ei.value)
    assert client.put_many([K, K], [bytearray(limit + 1), b"x"]) == [-errno.EMSGSIZE, 0]


def test_empty_block(client):
    """kvpool stores blocks of 1 byte or more: an empty one is a bad
    argument (a ValueError saying so), refused before anything is sent,
    not "too large"."""
    for empty in (b"", bytearray(), [b"", memoryview(b"")]):
        with pytest.raises(kvpool.InvalidArgument) as ei:
            client.put(K, empty)
        assert isinstance(ei.value, ValueError) and ei.value.code == -errno.EINVAL
        assert "empty block (0 bytes)" in str(ei.value), str(ei.value)
    with pytest.raises(kvpool.InvalidArgument) as ei:
        client.put_many([K, K], [b"x", b""])
    assert "put_many block 1" in str(ei.value) and "empty block" in str(ei.value)
    assert not client.exists(K)                               # nothing was sent
    client.put(K, [b"", b"x"])                                # empty pieces are fine
    assert client.get(K) == b"x"


def test_bad_namespace_says_why(server):
    cases = {
        "has space": "byte 3 is a space",
        "": "it is empty",
        "x" * 256: "it is 256 bytes, over 255",
        "caf\u00e9": "byte 3 is 0xc3",
        "tab\there": "byte 3 is 0x09",
    }
    for ns, why in cases.items():
        with pytest.raises(kvpool.InvalidArgument) as ei:
            kvpool.Client(server.url, ns)
        msg = str(ei.value)
        assert why in msg and "printable ASCII 0x21..0x7e" in msg, msg
        assert ei.value.code == -errno.EINVAL
    with kvpool.Client(server.url, "ok-ns") as c:
        with pytest.raises(kvpool.InvalidArgument) as ei:
            c.stats("a b")
        assert "stats: namespace 'a b' is not valid: byte 1 is a space" in str(ei.value)
        with pytest.raises(kvpool.InvalidArgument):
            c.drop_namespace("")


def test_get_many_is_no_refusal(server, namespace):
    """get_many and get on a new Client (no size guess yet) ask the sizes
    with an empty buffer: the server must not count that as too_large."""
    keys = kvpool.block_hashes(list(range(64)), 16)
    with kvpool.Client(server.url, namespace) as c:
        c.drop_namespace()
        assert c.put_chain(keys, [bytes([i]) * 5000 for i in range(4)]) == [0] * 4
    with kvpool.Client(server.url, namespace) as c:
        before = c.stats()["ops"]["errors"]["too_large"]
        assert c.get_many(keys) == [bytes([i]) * 5000 for i in range(4)]
    with kvpool.Client(server.url, namespace) as c:
        assert c.get(keys[2]) == bytes([2]) * 5000
        assert c.get_many(keys[:2]) == [bytes([0]) * 5000, bytes([1]) * 5000]
        assert c.stats()["ops"]["errors"]["too_large"] == before
        with pytest.raises(kvpool.TooLarge):
            c.get_into(keys[0], bytearray(4999))              # a real refusal counts
        assert c.stats()["ops"]["errors"]["too_large"] == before + 1


def test_no_parent(client):
    with pytest.raises(kvpool.NoParent) as ei:
        client.put(K, b"abc", parent=b"\x01" * 32)
    assert ei.value.code == -errno.ENOLINK
    assert not client.exists(K)


def test_bad_arguments(client):
    for bad in (b"short", b"x" * 33, bytearray(31)):
        with pytest.raises(kvpool.InvalidArgument) as ei:
            client.put(bad, b"data")
        assert isinstance(ei.value, ValueError) and ei.value.code == -errno.EINVAL
    with pytest.raises(ValueError):
        client.get(b"k" * 31)
    with pytest.raises(ValueError):
        client.match([K, b"k"])
    with pytest.raises(ValueError):
        client.put(K, b"x", parent=b"p" * 5)
    with pytest.raises(TypeError):
        client.get("a str is not a key" + "x" * 14)
    with pytest.raises(TypeError):
        client.put(K, 12345)                                  # no buffer protocol
    with pytest.raises(ValueError):
        kvpool.Client("tcp://127.0.0.1:1", "has space")
    with pytest.raises(ValueError):
        kvpool.Client("not a url", "ns")
    with pytest.raises(ValueError):
        kvpool.Client("tcp://127.0.0.1:1", "ns", timeout=0)
    with pytest.raises(kvpool.Unsupported):
        kvpool.Client("udp://127.0.0.1:7471", "ns")
    # rdma:// is a known scheme: Unsupported without RDMA in the build or
    # without a device (-ENODEV); with one, nothing answers rdma_cm there.
    with pytest.raises(kvpool.Error):
        kvpool.Client("rdma://127.0.0.1:7471", "ns", timeout=2)


def test_closed_client(server):
    c = kvpool.Client(server.url, "pytest:closed")
    c.close()
    assert c.closed
    with pytest.raises(ValueError):
        c.get(K)
    c.close()                                                 # idempotent


def test_connection_refused():
    with socket.socket() as s:                                # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(kvpool.ConnectionError) as ei:
        kvpool.Client("tcp://127.0.0.1:%d" % port, "ns", timeout=2)
    assert isinstance(ei.value, builtins.ConnectionError)
    assert ei.value.code == -errno.ECONNREFUSED


def test_unresolvable_host():
    with pytest.raises(kvpool.ConnectionError):
        kvpool.Client("tcp://no-such-host.invalid:7470", "ns", timeout=2)


def test_server_gone_then_back(fresh_server):
    fresh_server.start()
    port = fresh_server.port
    c = kvpool.Client(fresh_server.url, "pytest:restart", timeout=2)
    c.put(K, b"before")
    assert fresh_server.stop() == 0
    with pytest.raises(builtins.ConnectionError) as ei:       # caught as the builtin
        c.get(K)
    assert isinstance(ei.value, kvpool.ConnectionError)
    assert ei.value.code in (-errno.ECONNREFUSED, -errno.ECONNRESET, -errno.EPIPE)
    with pytest.raises(kvpool.ConnectionError):
        c.put_many([K], [b"x"])                               # a batch raises it too
    fresh_server.start(port)
    assert c.exists(K) is False                               # reconnected; DRAM only
    c.put(K, b"after")
    assert c.get(K) == b"after"
    c.close()


def test_timeout():
    """A server that accepts and never answers: the call times out."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    held = []
    stop = threading.Event()

    def accept():
        lsock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(lsock.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(kvpool.Timeout) as ei:
            kvpool.Client("tcp://127.0.0.1:%d" % lsock.getsockname()[1], "ns", timeout=0.3)
        elapsed = time.monotonic() - t0
        assert isinstance(ei.value, builtins.TimeoutError)
        assert ei.value.code == -errno.ETIMEDOUT
        assert 0.25 <= elapsed < 3
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        lsock.close()
