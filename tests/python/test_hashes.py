"""kvpool.block_hashes against tests/data/hash_vectors.json (the vectors
the C unit tests check), against an independent hashlib version of the
scheme, and its argument checks."""

import array
import hashlib
import json
import random
import struct

import pytest

import kvpool
from conftest import data_path


def load_vectors():
    with open(data_path("hash_vectors.json")) as f:
        return json.load(f)["vectors"]


def reference(tokens, block_size, parent=None, extra=b""):
    """The scheme of kvpool.h, written again with hashlib."""
    out, prev = [], parent
    for i in range(len(tokens) // block_size):
        h = hashlib.sha256()
        if prev is not None:
            h.update(prev)
        h.update(struct.pack("<%dI" % block_size, *tokens[i * block_size:(i + 1) * block_size]))
        if prev is None and extra:
            h.update(extra)
        prev = h.digest()
        out.append(prev)
    return out


@pytest.mark.parametrize("v", load_vectors(), ids=lambda v: v["name"])
def test_shared_vectors(v):
    got = kvpool.block_hashes(v["token_ids"], v["block_size_tokens"],
                              extra=bytes.fromhex(v["extra_hex"]))
    assert [h.hex() for h in got] == v["block_hashes_hex"]
    assert all(type(h) is bytes and len(h) == 32 for h in got)


def test_vectors_file_is_not_empty():
    assert len(load_vectors()) >= 5


def test_matches_hashlib():
    rng = random.Random(5)
    for _ in range(50):
        bs = rng.randint(1, 20)
        toks = [rng.randrange(2**32) for _ in range(rng.randint(0, 100))]
        extra = bytes(rng.randrange(256) for _ in range(rng.randint(0, 9)))
        assert kvpool.block_hashes(toks, bs, extra=extra) == reference(toks, bs, extra=extra)


def test_chain_continues_through_parent():
    toks = list(range(100, 164))
    full = kvpool.block_hashes(toks, 16, extra=b"lora-7")
    tail = kvpool.block_hashes(toks[32:], 16, parent=full[1], extra=b"ignored with a parent")
    assert tail == full[2:]
    assert kvpool.block_hashes(toks, 16) != full                  # extra changes block 0 on


def test_token_containers(np):
    toks = list(range(70000, 70048))
    want = kvpool.block_hashes(toks, 16)
    assert kvpool.block_hashes(array.array("I", toks), 16) == want
    assert kvpool.block_hashes(tuple(toks), 16) == want
    assert kvpool.block_hashes(np.array(toks, dtype=np.uint32), 16) == want
    assert kvpool.block_hashes(np.array(toks, dtype=np.int64), 16) == want
    assert kvpool.block_hashes(np.array(toks, dtype=np.uint32)[::-1][::-1], 16) == want


def test_partial_and_empty():
    assert kvpool.block_hashes(list(range(15)), 16) == []
    assert kvpool.block_hashes([], 4) == []
    assert len(kvpool.block_hashes(list(range(33)), 16)) == 2


def test_bad_arguments():
    for bad_size in (0, -1, 1.5, None):
        with pytest.raises((ValueError, TypeError)):
            kvpool.block_hashes([1, 2], bad_size)
    for bad_tokens in ([-1], [2**32]):
        with pytest.raises(kvpool.InvalidArgument):
            kvpool.block_hashes(bad_tokens, 1)
    with pytest.raises(TypeError):
        kvpool.block_hashes(["a"], 1)
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.block_hashes([1], 1, parent=b"short")
