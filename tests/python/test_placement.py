"""Placement is the same in the binding and in libkvpool: the pure-Python
HRW twin (kvpool.placement) and the C library (kvpool_hrw_score,
kvpool_hrw_owner and kvpool_hrw_rank through ctypes) against
tests/data/hrw_vectors.json."""

import ctypes
import hashlib
import json

import pytest

import kvpool
from kvpool import placement

from conftest import data_path


def _vectors():
    with open(data_path("hrw_vectors.json"), encoding="utf-8") as f:
        return json.load(f)


def _c_fns():
    lib = kvpool._lib.lib
    lib.kvpool_hrw_score.restype = ctypes.c_uint64
    lib.kvpool_hrw_score.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.kvpool_hrw_owner.restype = ctypes.c_int
    lib.kvpool_hrw_owner.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                     ctypes.c_size_t]
    lib.kvpool_hrw_rank.restype = ctypes.c_int
    lib.kvpool_hrw_rank.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                    ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.c_size_t]
    return lib


def test_python_matches_vectors():
    doc = _vectors()
    names = doc["nodes"]
    assert len(doc["vectors"]) >= 10
    for v in doc["vectors"]:
        key = bytes.fromhex(v["key_hex"])
        assert [str(placement.score(key, n)) for n in names] == v["scores"]
        assert placement.owner(key, names[:3]) == v["owner_of_3"]
        assert placement.owner(key, names[:4]) == v["owner_of_4"]
        assert placement.owner(key, names) == v["owner_of_6"]
        assert placement.ranked(key, names[:3]) == v["ranking_of_3"]
        assert placement.ranked(key, names[:4]) == v["ranking_of_4"]
        assert placement.ranked(key, names) == v["ranking_of_6"]
        assert placement.block_owners(key, names) == v["ranking_of_6"][:1]
        assert placement.block_owners(key, names, hot=True) == v["ranking_of_6"][:2]
        assert placement.block_owners(key, names, hot=True, hot_replicas=3) == \
            v["ranking_of_6"][:3]


def test_c_library_matches_python():
    lib = _c_fns()
    names = [n.encode() for n in _vectors()["nodes"]]
    arr = (ctypes.c_char_p * len(names))(*names)
    for i in range(500):
        key = hashlib.sha256(b"py-vs-c %d" % i).digest()
        for n in names:
            assert lib.kvpool_hrw_score(key, n) == placement.score(key, n)
        assert lib.kvpool_hrw_owner(key, arr, len(names)) == placement.owner(key, names)
        out = (ctypes.c_size_t * len(names))()
        assert lib.kvpool_hrw_rank(key, arr, len(names), out, len(names)) == len(names)
        assert list(out) == placement.ranked(key, names)
    assert lib.kvpool_hrw_owner(key, arr, 0) == -22
    assert lib.kvpool_hrw_rank(key, arr, 0, out, 1) == -22


def test_segment_owners_and_errors():
    names = ["a", "b", "c"]
    chain = [hashlib.sha256(b"%d" % i).digest() for i in range(70)]
    owners = placement.segment_owners(chain, names, segment_blocks=32)
    assert len(owners) == 3
    assert owners == [placement.owner(chain[0], names), placement.owner(chain[32], names),
                      placement.owner(chain[64], names)]
    with pytest.raises(ValueError):
        placement.score(b"short", "a")
    with pytest.raises(ValueError):
        placement.owner(chain[0], [])
    with pytest.raises(ValueError):
        placement.segment_owners(chain, names, segment_blocks=0)
    with pytest.raises(ValueError):
        placement.owners(chain[0], names, 0)
    with pytest.raises(ValueError):
        placement.block_owners(chain[0], names, hot=True, hot_replicas=0)
    assert placement.owners(chain[0], names, 5) == placement.ranked(chain[0], names)
