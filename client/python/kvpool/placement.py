"""Rendezvous (HRW) placement of chain segments on pool nodes, the same as
libkvpool's (client/lib/hrw.c; docs/cluster.md):

    score(key, name) = fmix64(fold(key) ^ seed(name))
    fold(key)  = XOR of the key's four 64-bit little-endian words
    seed(name) = first 8 bytes, little-endian, of SHA-256(name)
    fmix64     = MurmurHash3's 64-bit finaliser

A chain is cut into segments of D blocks (default 32); segment k (blocks
k*D .. k*D+D-1) is owned by the node with the highest score for the key of
its first block; an equal score goes to the smaller name. Written in pure
Python on purpose: tests/data/hrw_vectors.json checks it against the C
library, so placement cannot drift between the two.
"""

import hashlib
import struct

SEGMENT_BLOCKS = 32
_M64 = (1 << 64) - 1


def _fmix64(k):
    k ^= k >> 33
    k = (k * 0xff51afd7ed558ccd) & _M64
    k ^= k >> 33
    k = (k * 0xc4ceb9fe1a85ec53) & _M64
    k ^= k >> 33
    return k


def node_seed(name):
    """The per-node half of the score (name: str or bytes)."""
    raw = name.encode() if isinstance(name, str) else bytes(name)
    return struct.unpack("<Q", hashlib.sha256(raw).digest()[:8])[0]


def score(key, name):
    """HRW score (int, 0..2**64-1) of a 32-byte key on node `name`."""
    if len(key) != 32:
        raise ValueError("kvpool: a key is 32 bytes, got %d" % len(key))
    a, b, c, d = struct.unpack("<4Q", bytes(key))
    return _fmix64(a ^ b ^ c ^ d ^ node_seed(name))


def owner(key, names):
    """Index in `names` of the node that owns a segment starting at `key`."""
    if not names:
        raise ValueError("kvpool: no nodes")
    best = None
    for i, n in enumerate(names):
        s = score(key, n)
        raw = n.encode() if isinstance(n, str) else bytes(n)
        if best is None or s > best[0] or (s == best[0] and raw < best[1]):
            best = (s, raw, i)
    return best[2]


def segment_owners(chain, names, segment_blocks=SEGMENT_BLOCKS):
    """Owner index of each segment of a chain (a list of 32-byte keys)."""
    if segment_blocks < 1:
        raise ValueError("kvpool: segment_blocks must be >= 1")
    return [owner(chain[i], names) for i in range(0, len(chain), segment_blocks)]
