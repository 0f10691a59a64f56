"""Engine memory as buffer objects, without copies: raw (address, size)
regions of an engine's KV memory (ctypes arrays over the address) and the
address of a torch tensor or any buffer object. Nothing here imports an
engine. Internal: the names may change."""

import ctypes
import threading

from .. import _lib


_ARRAY_TYPES = {}
_ARRAY_TYPES_LOCK = threading.Lock()


def raw_buffer(address, nbytes):
    """A writable buffer object over nbytes of memory at `address` (an int),
    with no copy. The caller keeps the memory alive while it is in use.
    One ctypes array type is made per distinct size and kept (ctypes never
    frees them), so engines with a few fixed piece sizes make a few."""
    t = _ARRAY_TYPES.get(nbytes)
    if t is None:
        with _ARRAY_TYPES_LOCK:
            t = _ARRAY_TYPES.setdefault(nbytes, ctypes.c_char * nbytes)
    return t.from_address(address)


def tensor_address(t):
    """(address, nbytes) of a contiguous CPU torch tensor, or of any buffer
    object (numpy array, memoryview); ValueError for a non-contiguous one."""
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):
        if not t.is_contiguous():
            raise ValueError("kvpool: tensor is not contiguous")
        return t.data_ptr(), t.numel() * t.element_size()
    pin = _lib.Pin(t, False)
    try:
        return pin.address, pin.nbytes
    finally:
        pin.release()
