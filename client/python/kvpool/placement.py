"""Rendezvous (HRW) ranking of pool nodes for a block, the same as
libkvpool's (client/lib/hrw.c; docs/cluster.md):

    score(key, name) = fmix64(fold(key) ^ seed(name))
    fold(key)  = XOR of the key's four 64-bit little-endian words
    seed(name) = first 8 bytes, little-endian, of SHA-256(name)
    fmix64     = MurmurHash3's 64-bit finaliser

The nodes are ranked for a key by score, highest first; an equal score
goes to the smaller name (bytewise).

- Per block (``block_owners``): a block lives on the first node of its own
  key's ranking; a hot block (one many chains share, such as a system
  prompt) also on the next ones, hot_replicas in all. The owner depends on
  the key (which commits to the chain up to it) and the names only -
  never on what a client saw - so any client finds any block.
- Per segment (``segment_owners``, the earlier placement): a chain is cut
  into segments of D blocks (default 32); segment k (blocks k*D ..
  k*D+D-1) lives on the first node of the ranking of its first block.

Written in pure Python on purpose: tests/data/hrw_vectors.json checks it
against the C library, so placement cannot drift between the two.
"""

import hashlib
import struct

SEGMENT_BLOCKS = 32
HOT_REPLICAS = 2
_M64 = (1 << 64) - 1


def _fmix64(k):
    k ^= k >> 33
    k = (k * 0xff51afd7ed558ccd) & _M64
    k ^= k >> 33
    k = (k * 0xc4ceb9fe1a85ec53) & _M64
    k ^= k >> 33
    return k


def _raw(name):
    return name.encode() if isinstance(name, str) else bytes(name)


def node_seed(name):
    """The per-node half of the score (name: str or bytes)."""
    return struct.unpack("<Q", hashlib.sha256(_raw(name)).digest()[:8])[0]


def _fold(key):
    if len(key) != 32:
        raise ValueError("kvpool: a key is 32 bytes, got %d" % len(key))
    a, b, c, d = struct.unpack("<4Q", bytes(key))
    return a ^ b ^ c ^ d


def score(key, name):
    """HRW score (int, 0..2**64-1) of a 32-byte key on node `name`."""
    return _fmix64(_fold(key) ^ node_seed(name))


class Ranker:
    """The ranking of a fixed list of node names, with their seeds computed
    once (what a client does once per membership change)."""

    def __init__(self, names):
        if not names:
            raise ValueError("kvpool: no nodes")
        self.names = list(names)
        self._raw = [_raw(n) for n in self.names]
        self._seeds = [node_seed(n) for n in self.names]

    def ranked(self, key, count=None):
        """Indices of the nodes for `key`, best first (the first `count`)."""
        f = _fold(key)
        order = sorted(range(len(self._seeds)),
                       key=lambda i: (-_fmix64(f ^ self._seeds[i]), self._raw[i]))
        return order if count is None else order[:count]


def ranked(key, names):
    """Indices of `names` ordered for `key`: highest score first."""
    return Ranker(names).ranked(key)


def owner(key, names):
    """Index in `names` of the node ranked first for `key`."""
    return ranked(key, names)[0]


def owners(key, names, count):
    """The first `count` indices of the ranking (fewer when there are fewer
    names)."""
    if count < 1:
        raise ValueError("kvpool: count must be >= 1")
    return ranked(key, names)[:count]


def block_owners(key, names, hot=False, hot_replicas=HOT_REPLICAS):
    """Indices of the nodes that hold block `key`, best first: the first
    of its ranking, or the first hot_replicas for a hot block."""
    if hot_replicas < 1:
        raise ValueError("kvpool: hot_replicas must be >= 1")
    return owners(key, names, hot_replicas if hot else 1)


def segment_owners(chain, names, segment_blocks=SEGMENT_BLOCKS):
    """Owner index of each segment of a chain (a list of 32-byte keys)."""
    if segment_blocks < 1:
        raise ValueError("kvpool: segment_blocks must be >= 1")
    r = Ranker(names)
    return [r.ranked(chain[i], 1)[0] for i in range(0, len(chain), segment_blocks)]
