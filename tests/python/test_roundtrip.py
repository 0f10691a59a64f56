"""Round trips through a real kvpoold for every kind of buffer, the batch
calls with their per-block statuses, match and leases, stats, delete,
register, and a Client shared by threads."""

import array
import errno
import threading

import pytest

import kvpool


def key(tag, i=0):
    """A deterministic 32-byte key."""
    return kvpool.block_hashes([i], 1, extra=tag.encode())[0]


def payload(n, seed=0):
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


def test_bytes_put_get(client):
    data = payload(10000, 1)
    client.put(key("b"), data)
    got = client.get(key("b"))
    assert type(got) is bytes and got == data
    assert client.exists(key("b"))
    assert not client.exists(key("absent"))


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "readonly-memoryview", "array"])
def test_stdlib_buffers(client, kind):
    data = payload(4096, 2)
    src = {"bytearray": bytearray(data), "memoryview": memoryview(bytearray(data)),
           "readonly-memoryview": memoryview(data), "array": array.array("B", data)}[kind]
    client.put(key(kind), src)
    out = bytearray(4096)
    assert client.get_into(key(kind), out) == 4096
    assert out == data
    dst = array.array("d", bytes(8192))        # a typed buffer receives raw bytes too
    assert client.get_into(key(kind), dst) == 4096
    assert dst.tobytes()[:4096] == data and dst.tobytes()[4096:] == bytes(4096)


def test_numpy_round_trip(client, np):
    a = np.arange(2 * 3 * 256, dtype=np.float16).reshape(2, 3, 256)
    client.put(key("np"), a)
    b = np.zeros_like(a)
    assert client.get_into(key("np"), b) == a.nbytes
    assert np.array_equal(a, b)
    assert client.get(key("np")) == a.tobytes()
    # A contiguous slice of a bigger array (one block of a KV cache).
    cache = np.zeros((4,) + a.shape, dtype=np.float16)
    assert client.get_into(key("np"), cache[2]) == a.nbytes
    assert np.array_equal(cache[2], a) and not cache[[0, 1, 3]].any()


def test_numpy_refusals(client, np):
    a = np.arange(64, dtype=np.int32)
    with pytest.raises((BufferError, ValueError)):
        client.put(key("strided"), a[::2])            # not contiguous
    client.put(key("ro"), a)
    ro = np.zeros(64, dtype=np.int32)
    ro.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        client.get_into(key("ro"), ro)                # read-only
    with pytest.raises((BufferError, TypeError)):
        client.get_into(key("ro"), b"immutable bytes!" * 16)
    assert not client.exists(key("strided"))


def test_torch_cpu_tensors(client, torch, np):
    t = torch.arange(1024, dtype=torch.float16).reshape(4, 256)
    client.put(key("torch"), t)
    out = torch.zeros_like(t)
    assert client.get_into(key("torch"), out) == 2048
    assert torch.equal(out, t)
    view = torch.zeros(2048, dtype=torch.uint8).numpy()   # through numpy, shares memory
    client.get_into(key("torch"), view)
    assert view.tobytes() == t.numpy().tobytes()
    with pytest.raises(BufferError):
        client.put(key("torch-t"), t.t())                 # not contiguous


def test_torch_kv_cache_batch(client, torch):
    """An engine's torch KV cache: blocks put from and loaded into slots."""
    cache = torch.randn(6, 2, 2, 16, 2, 8).to(torch.float16)   # [slot, layer, K/V, tok, head, dim]
    keys = kvpool.block_hashes(torch.arange(48, dtype=torch.int64), 16)
    assert client.put_chain(keys, [cache[i] for i in range(3)]) == [0, 0, 0]
    client.register(cache)
    got = client.get_into_many(keys, [cache[5], cache[4], cache[3]])
    assert got == [cache[0].numel() * 2] * 3
    assert torch.equal(cache[3:].flip(0), cache[:3])
    client.unregister(cache)


def test_tensor_on_another_device(client):
    """A tensor that is not on the CPU is refused (duck-typed: no GPU here)."""
    class Device:
        type = "cuda"

    class GpuTensor:
        device = Device()

        def data_ptr(self):
            return 4096

        def element_size(self):
            return 2

        def is_contiguous(self):
            return True

        def numel(self):
            return 8

    with pytest.raises(TypeError, match="CPU"):
        client.put(key("gpu"), GpuTensor())


def test_scatter_gather(client, np):
    layers = [np.full(1000, i, dtype=np.uint8) for i in range(5)]   # per-layer slices
    client.put(key("sg"), layers)
    assert client.get(key("sg")) == b"".join(x.tobytes() for x in layers)
    outs = [bytearray(1500), bytearray(1500), bytearray(2000)]
    assert client.get_into(key("sg"), outs) == 5000
    assert b"".join(outs) == b"".join(x.tobytes() for x in layers)


def test_get_size_guess(client):
    """get() guesses the size from the previous block: smaller, larger and
    equal blocks all come back whole."""
    sizes = [1000, 300, 300, 70000, 5, 70000]
    for i, n in enumerate(sizes):
        client.put(key("sz", i), payload(n, i))
    for i, n in enumerate(sizes):
        assert client.get(key("sz", i)) == payload(n, i)
    got = client.get_many([key("sz", i) for i in range(len(sizes))] + [key("sz", 99)])
    assert got[:-1] == [payload(n, i) for i, n in enumerate(sizes)]
    assert got[-1] == -errno.ENOENT


def test_batches(client, np):
    keys = kvpool.block_hashes(list(range(64)), 8)
    blocks = np.random.default_rng(1).integers(0, 255, (8, 3000), dtype=np.uint8)
    assert client.put_chain(keys[:6], list(blocks[:6])) == [0] * 6
    # Block 7's parent (keys[6]) is not stored: that block alone fails.
    st = client.put_many([keys[7], keys[6]], [blocks[7], blocks[6]], [keys[6], keys[5]])
    assert st == [-errno.ENOLINK, 0]
    assert kvpool.error_class(st[0]) is kvpool.NoParent
    assert client.exists_many(keys) == [True] * 7 + [False]
    assert client.match(keys) == 7
    assert client.match([keys[0], keys[7], keys[1]]) == 1      # stops at the first miss
    out = np.zeros_like(blocks)
    res = client.get_into_many(keys, list(out))
    assert res == [3000] * 7 + [-errno.ENOENT]
    assert np.array_equal(out[:7], blocks[:7]) and not out[7].any()
    small = [bytearray(10), bytearray(3000)]
    assert client.get_into_many(keys[:2], small) == [-errno.EMSGSIZE, 3000]
    assert client.get_many([]) == [] and client.put_many([], []) == []
    with pytest.raises(ValueError):
        client.put_many(keys[:2], [blocks[0]])


def test_large_batch_splits(client):
    """More blocks than the server's max_batch_blocks go in several frames."""
    limit = client.limits.max_batch_blocks
    n = limit + 10
    keys = [key("many", i) for i in range(n)]
    assert client.put_many(keys, [payload(64, i) for i in range(n)]) == [0] * n
    outs = [bytearray(64) for _ in range(n)]
    assert client.get_into_many(keys, outs) == [64] * n
    assert outs[limit + 5] == payload(64, limit + 5)
    assert sum(client.exists_many(keys)) == n


def test_match_lease(client):
    keys = kvpool.block_hashes(list(range(32)), 8)
    client.put_chain(keys, [payload(100, i) for i in range(4)])
    before = client.stats()["leases_active"]
    assert client.match(keys, lease_ms=2000) == 4
    assert client.stats()["leases_active"] >= before + 1
    with pytest.raises(ValueError):
        client.match(keys, lease_ms=-1)


def test_stats_delete_drop(client, namespace):
    keys = kvpool.block_hashes(list(range(24)), 8)
    client.put_chain(keys, [payload(512, i) for i in range(3)])
    s = client.stats(namespace)
    assert s["protocol"] == 2 and list(s["namespaces"]) == [namespace]
    ns = s["namespaces"][namespace]
    assert ns["blocks"] == 3 and ns["bytes"] == 3 * 512 and ns["puts"] == 3
    assert client.delete(keys[1]) is True                     # takes keys[2] with it
    assert client.exists_many(keys) == [True, False, False]
    # the status form (issue 20 item 10): 0 is success, a miss is -ENOENT
    assert client.exists_many(keys, statuses=True) == [0, -errno.ENOENT, -errno.ENOENT]
    assert client.delete_many([keys[1], keys[0]]) == [False, True]
    assert client.delete_many([keys[0]], statuses=True) == [-errno.ENOENT]
    client.put(keys[0], b"x")
    assert client.drop_namespace() == 1
    assert client.ping() >= 0


def test_register(client, np):
    arena = np.zeros((4, 1024), dtype=np.float32)
    client.register(arena)
    with pytest.raises(kvpool.AlreadyRegistered) as ei:
        client.register(arena[1])                              # inside the same memory
    assert ei.value.code == -errno.EEXIST
    a = np.arange(1024, dtype=np.float32)
    client.put(key("reg"), a)
    assert client.get_into(key("reg"), arena[3]) == 4096     # registered memory works
    assert np.array_equal(arena[3], a)
    client.unregister(arena)
    with pytest.raises(kvpool.NotRegistered) as ei:
        client.unregister(arena)
    assert isinstance(ei.value, KeyError) and ei.value.code == -errno.ENOENT
    client.register(arena)                                     # again after unregister


def test_register_holds_the_buffer(client):
    """A registered bytearray cannot be resized (its memory would move)."""
    ba = bytearray(4096)
    client.register(ba)
    with pytest.raises(BufferError):
        ba.extend(b"x")
    client.unregister(ba)
    ba.extend(b"x")
    assert len(ba) == 4097
    with pytest.raises(kvpool.InvalidArgument):
        client.register(bytearray())                           # empty: -EINVAL


def test_threads_share_a_client(client):
    errors = []

    def worker(t):
        try:
            for i in range(40):
                k = key("thr%d" % t, i)
                client.put(k, payload(2000, t * 100 + i))
                assert client.get(k) == payload(2000, t * 100 + i)
        except Exception as e:       # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(client.exists_many([key("thr%d" % t, i) for t in range(4) for i in range(40)])) \
        == 160
