"""get_into writes into the caller's memory: the buffer does not move and
Python allocates nothing of the payload's size; get allocates the payload
once (the bytes it returns), never twice."""

import ctypes
import tracemalloc

import kvpool

BLOCK_BYTES = 4 << 20
SMALL_BYTES = 64 << 10   # far below one payload: bookkeeping only


def address_of(buf):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def peak_bytes(fn):
    """Peak Python memory traced while fn() runs (above what was there)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base


def test_get_into_keeps_the_buffer(client, np):
    src = np.random.default_rng(7).integers(0, 255, BLOCK_BYTES, dtype=np.uint8)
    k = kvpool.block_hashes([1, 2, 3], 3)[0]
    client.put(k, src)
    dst = np.zeros(BLOCK_BYTES, dtype=np.uint8)
    before = dst.__array_interface__["data"][0]
    assert client.get_into(k, dst) == BLOCK_BYTES
    assert dst.__array_interface__["data"][0] == before
    assert np.array_equal(dst, src)

    ba = bytearray(BLOCK_BYTES)
    before = address_of(ba)
    client.get_into(k, ba)
    assert address_of(ba) == before and ba == src.tobytes()


def test_get_into_allocates_no_payload(client, np):
    k = kvpool.block_hashes([4, 5, 6], 3)[0]
    client.put(k, np.ones(BLOCK_BYTES, dtype=np.uint8))
    dst = np.zeros(BLOCK_BYTES, dtype=np.uint8)
    client.get_into(k, dst)                     # warm up (connection, caches)
    dst[:] = 0
    peak = peak_bytes(lambda: client.get_into(k, dst))
    assert peak < SMALL_BYTES, "get_into allocated %d bytes" % peak
    assert dst.all()
    peak = peak_bytes(lambda: client.get_into_many([k, k], [dst, dst]))
    assert peak < SMALL_BYTES, "get_into_many allocated %d bytes" % peak


def test_get_allocates_the_payload_once(client, np):
    """The measurement can see a payload-sized allocation: get() makes one
    (the bytes it returns) and no second (no staging buffer)."""
    k = kvpool.block_hashes([7, 8, 9], 3)[0]
    client.put(k, np.full(BLOCK_BYTES, 3, dtype=np.uint8))
    client.get(k)                               # learns the size: one round trip later
    peak = peak_bytes(lambda: client.get(k))
    assert BLOCK_BYTES <= peak < BLOCK_BYTES + SMALL_BYTES


def test_get_many_does_not_over_allocate(client):
    """After a 4 MiB get, a get_many of 100 small blocks must not allocate
    100 buffers of 4 MiB: it asks the sizes first."""
    big = kvpool.block_hashes([1], 1, extra=b"big")[0]
    client.put(big, bytes(BLOCK_BYTES))
    client.get(big)                             # the size guess is now 4 MiB
    keys = [kvpool.block_hashes([i], 1, extra=b"small")[0] for i in range(100)]
    client.put_many(keys, [bytes([i]) * 100 for i in range(100)])
    got = []
    peak = peak_bytes(lambda: got.extend(client.get_many(keys)))
    assert got == [bytes([i]) * 100 for i in range(100)]
    assert peak < 4 * BLOCK_BYTES, "get_many allocated %d bytes" % peak
