"""kvpool.block_hashes: the chained block hashes of a token sequence,
computed by libkvpool's kvpool_block_hashes so that Python and C agree bit
for bit (SHA-256 over the parent hash, the block's token ids as uint32
little-endian, and `extra` on a prompt's first block)."""

import array
import ctypes

from . import _lib
from .errors import InvalidArgument, make_error

_U32_FORMATS = ("I", "=I", "<I", "@I")


def _tokens_u32(token_ids):
    """(buffer, count): token_ids as an object exporting contiguous native
    uint32 (itself, with no copy, when it already is one, e.g. array('I')
    or a numpy uint32 array), and how many tokens it holds."""
    try:
        m = memoryview(token_ids)
    except TypeError:
        m = None
    if m is not None and m.format in _U32_FORMATS and m.itemsize == 4 and m.c_contiguous:
        return m, m.nbytes // 4
    if hasattr(token_ids, "tolist"):  # numpy arrays and torch tensors of other dtypes
        token_ids = token_ids.tolist()
    try:
        a = array.array("I", token_ids)
    except OverflowError:
        raise InvalidArgument(-22, "block_hashes: token ids must be in 0..2**32-1") from None
    except TypeError as e:
        raise TypeError("block_hashes: token_ids must be a sequence of ints (%s)" % e) from None
    if a.itemsize != 4:  # array's "I" is C unsigned int; 4 bytes on every Linux ABI
        raise TypeError("block_hashes: this platform's unsigned int is not 32 bits")
    return a, len(a)


def block_hashes(token_ids, block_size, parent=None, extra=b""):
    """The chained hashes of the full blocks of token_ids, as a list of
    32-byte bytes (a trailing partial block is ignored).

    token_ids   ints in 0..2**32-1 (list, array('I'), numpy array, ...)
    block_size  tokens per block, >= 1
    parent      None for a prompt's first block, or the 32-byte hash of the
                block just before token_ids[0] (continues a chain)
    extra       bytes mixed into the first block's hash when parent is None
                (a LoRA id, a tenant salt); ignored when parent is given,
                since the parent already carries it

    Raises InvalidArgument (a ValueError) for a bad block_size, parent or
    token id, TypeError for arguments of the wrong type.
    """
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise InvalidArgument(-22, "block_hashes: block_size must be an int >= 1")
    if parent is not None:
        parent = bytes(parent)
        if len(parent) != _lib.KEY_BYTES:
            raise InvalidArgument(-22, "block_hashes: parent must be %d bytes, got %d"
                                  % (_lib.KEY_BYTES, len(parent)))
        extra = b""
    extra = bytes(extra) if extra else b""
    tokens, n_tokens = _tokens_u32(token_ids)
    n_blocks = n_tokens // block_size
    out = ctypes.create_string_buffer(max(n_blocks, 1) * _lib.KEY_BYTES)
    n_out = ctypes.c_size_t()
    with _lib.Pins() as pins:
        addr = pins.add(tokens, False).address if n_tokens else None
        rc = _lib.lib.kvpool_block_hashes(addr, n_tokens, block_size, parent,
                                          extra or None, len(extra), out, n_blocks,
                                          ctypes.byref(n_out))
    if rc:
        raise make_error(rc, "block_hashes")
    raw = out.raw
    return [raw[i * _lib.KEY_BYTES:(i + 1) * _lib.KEY_BYTES] for i in range(n_out.value)]
