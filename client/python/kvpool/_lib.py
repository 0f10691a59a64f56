"""ctypes declarations of libkvpool (client/kvpool.h) and the few CPython
C-API calls the binding uses to reach caller memory without copying it.

The library is looked for, in order:
  1. libkvpool.so next to this file: the copy a wheel carries (make wheel,
     make install, pip install of the wheel). It is the library these
     declarations were built with, so it always comes first: $KVPOOL_LIB
     does not replace it (a warning says so when KVPOOL_LIB is set to
     another file); a package without the copy (make wheel WHEEL_LIB=,
     pip install client/python, Debian's python3-kvpool) has none;
  2. $KVPOOL_LIB, the path of the library file itself (any build dir);
     when it is set, nothing after it is tried, so a wrong path fails
     the import with its own error;
  3. build/libkvpool.so of the source tree this package sits in
     (client/python/kvpool -> ../../../build), after `make`;
  4. libkvpool.so.1 on the dynamic linker's search path (Debian's
     libkvpool1, or `make install` then ldconfig).
When none loads, the ImportError gives each one's dlopen error, and says
which shared libraries the library needs but the system lacks (a slim
image without libcurl4, say).
"""

import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_int, c_size_t, c_ssize_t,
                    c_uint16, c_uint32, c_uint64, c_void_p, py_object)

KEY_BYTES = 32
DEFAULT_URL = "tcp://127.0.0.1:7470"
DEFAULT_TIMEOUT_MS = 10000


class iovec(Structure):
    _fields_ = [("iov_base", c_void_p), ("iov_len", c_size_t)]


class put_block(Structure):
    _fields_ = [("key", c_char_p), ("parent", c_char_p),
                ("iov", POINTER(iovec)), ("iovcnt", c_int), ("retain_ms", c_uint32)]


class get_block(Structure):
    _fields_ = [("key", c_char_p), ("iov", POINTER(iovec)),
                ("iovcnt", c_int), ("length", c_uint64)]


class completion(Structure):
    """struct kvpool_completion."""
    _fields_ = [("id", c_uint64), ("tag", c_uint64), ("op", c_int), ("status", c_int),
                ("count", c_size_t), ("matched", c_size_t)]


class options(Structure):
    """struct kvpool_options."""
    _fields_ = [("token", c_char_p), ("timeout_ms", c_uint32), ("tls_flags", c_uint32),
                ("tls_ca_file", c_char_p), ("tls_cert_file", c_char_p),
                ("tls_key_file", c_char_p)]


TLS_NO_VERIFY_HOSTNAME = 1  # KVPOOL_TLS_NO_VERIFY_HOSTNAME


class limits(Structure):
    _fields_ = [("max_block_bytes", c_uint64), ("max_batch_blocks", c_uint32),
                ("max_frame_bytes", c_uint32), ("max_lease_ms", c_uint32),
                ("rdma_port", c_uint16), ("protocol_version", c_uint16),
                ("max_inflight_put_bytes", c_uint64), ("max_match_wait_ms", c_uint32),
                ("max_retain_ms", c_uint32)]


class match_opts(Structure):
    """struct kvpool_match_opts."""
    _fields_ = [("lease_ms", c_uint32), ("wait_ms", c_uint32), ("want", c_uint32),
                ("retain_ms", c_uint32)]


class match_result(Structure):
    """struct kvpool_match_result."""
    _fields_ = [("matched", c_size_t), ("present", c_size_t), ("retained", c_size_t),
                ("lease_ms", c_uint32), ("retain_ms", c_uint32), ("flags", c_uint32)]


# The shared libraries libkvpool.so links (ldd), by the Debian 12 package
# that has each: what the ImportError tells a slim image to install.
_NEEDED = {
    "libcurl.so.4": "libcurl4", "libjson-c.so.5": "libjson-c5", "libxxhash.so.0": "libxxhash0",
    "libcrypto.so.3": "libssl3", "librdmacm.so.1": "librdmacm1",
    "libibverbs.so.1": "libibverbs1",
}


def _candidates():
    """[(path, role)] in the order _load tries them (see the module's doc)."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    bundled = os.path.join(here, "libkvpool.so")
    if os.path.exists(bundled):
        found.append((bundled, "bundled"))
    env = os.environ.get("KVPOOL_LIB")
    if env:
        return found + [(env, "KVPOOL_LIB")]
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    tree = os.path.join(root, "build", "libkvpool.so")
    if os.path.exists(os.path.join(root, "client", "kvpool.h")):
        found.append((tree, "tree"))
    found.append(("libkvpool.so.1", "system"))
    return found


def _missing_dependency(path, error):
    """The shared library that dlopen of `path` could not find, when it is
    one libkvpool needs rather than `path` itself; else None."""
    first = str(error).split(":", 1)[0].strip()
    if os.sep in first or "cannot open shared object file" not in str(error):
        return None
    if first and first != os.path.basename(path) and ".so" in first:
        return first
    return None


def _load_error(tried):
    """The ImportError for [(path, role, error)]: every dlopen error, then
    what to do about the likeliest cause."""
    lines = ["kvpool: cannot load libkvpool:"]
    for path, role, error in tried:
        text = str(error)
        if not text.startswith(path + ":"):   # dlopen's own message names the file
            text = "%s: %s" % (path, text)
        lines.append("  %s%s" % ("KVPOOL_LIB=" if role == "KVPOOL_LIB" else "", text))
    missing = sorted({m for path, _, e in tried for m in [_missing_dependency(path, e)] if m})
    roles = {role for _, role, _ in tried}
    if missing:
        pkgs = [_NEEDED[m] for m in missing if m in _NEEDED]
        lines.append("libkvpool needs shared libraries this system lacks: %s%s" % (
            ", ".join(missing),
            " (Debian: apt-get install %s)" % " ".join(pkgs) if pkgs else ""))
    elif "KVPOOL_LIB" in roles:
        lines.append("KVPOOL_LIB must name the library file itself (build/libkvpool.so)")
    else:
        lines.append("install libkvpool1 (Debian), or build libkvpool (make) and set KVPOOL_LIB "
                     "to build/libkvpool.so, or install the wheel of make wheel, which carries it")
    return ImportError("\n".join(lines))


def _load():
    tried = []
    for path, role in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append((path, role, "no such file"))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append((path, role, e))
            continue
        env = os.environ.get("KVPOOL_LIB")
        if role == "bundled" and env and (not os.path.exists(env) or
                                          not os.path.samefile(env, path)):
            import warnings
            warnings.warn("kvpool: KVPOOL_LIB=%s is not used: this package carries its own "
                          "libkvpool.so (%s), which comes first; KVPOOL_LIB applies to a package "
                          "without one (make wheel WHEEL_LIB=, pip install client/python)" %
                          (env, path), RuntimeWarning, stacklevel=2)
        return lib
    raise _load_error(tried)


def _declare(lib):
    """Give every function its prototype (ctypes would guess int otherwise)."""
    h = c_void_p
    protos = {
        "kvpool_connect": (c_int, [c_char_p, c_char_p, POINTER(options), POINTER(c_void_p)]),
        "kvpool_close": (None, [h]),
        "kvpool_set_timeout": (None, [h, c_uint32]),
        "kvpool_get_limits": (c_int, [h, POINTER(limits)]),
        "kvpool_put": (c_int, [h, POINTER(put_block), c_size_t, POINTER(c_int)]),
        "kvpool_put_ex": (c_int, [h, POINTER(put_block), c_size_t, POINTER(c_int),
                                  POINTER(c_uint32)]),
        "kvpool_get": (c_int, [h, POINTER(get_block), c_size_t, POINTER(c_int)]),
        "kvpool_put_bytes": (c_int, [h, c_char_p, c_char_p, c_void_p, c_size_t]),
        "kvpool_get_bytes": (c_int, [h, c_char_p, c_void_p, c_size_t, POINTER(c_uint64)]),
        "kvpool_exists": (c_int, [h, c_char_p, c_size_t, POINTER(c_int)]),
        "kvpool_match": (c_int, [h, c_char_p, c_size_t, c_uint32, POINTER(c_size_t)]),
        "kvpool_match_ex": (c_int, [h, c_char_p, c_size_t, POINTER(match_opts),
                                    POINTER(match_result)]),
        "kvpool_delete": (c_int, [h, c_char_p, c_size_t, POINTER(c_int)]),
        "kvpool_drop_namespace": (c_int, [h, c_char_p, POINTER(c_uint64)]),
        "kvpool_stats": (c_int, [h, c_char_p, POINTER(c_void_p)]),
        "kvpool_ping": (c_int, [h, POINTER(c_uint64)]),
        "kvpool_free": (None, [c_void_p]),
        "kvpool_register": (c_int, [h, c_void_p, c_size_t]),
        "kvpool_unregister": (c_int, [h, c_void_p]),
        "kvpool_block_hashes": (c_int, [c_void_p, c_size_t, c_size_t, c_char_p, c_char_p,
                                        c_size_t, c_void_p, c_size_t, POINTER(c_size_t)]),
        "kvpool_strerror": (c_char_p, [c_int]),
        "kvpool_last_server_message": (c_char_p, []),
        # asynchronous API
        "kvpool_set_max_inflight": (c_int, [h, c_uint32]),
        "kvpool_inflight": (c_uint32, [h]),
        "kvpool_submit_put": (c_int, [h, POINTER(put_block), c_size_t, POINTER(c_int), c_uint64,
                                      POINTER(c_uint64)]),
        "kvpool_submit_get": (c_int, [h, POINTER(get_block), c_size_t, POINTER(c_int), c_uint64,
                                      POINTER(c_uint64)]),
        "kvpool_submit_exists": (c_int, [h, c_char_p, c_size_t, POINTER(c_int), c_uint64,
                                         POINTER(c_uint64)]),
        "kvpool_submit_match": (c_int, [h, c_char_p, c_size_t, c_uint32, c_uint64,
                                        POINTER(c_uint64)]),
        "kvpool_submit_put_ex": (c_int, [h, POINTER(put_block), c_size_t, POINTER(c_int),
                                         POINTER(c_uint32), c_uint64, POINTER(c_uint64)]),
        "kvpool_submit_match_ex": (c_int, [h, c_char_p, c_size_t, POINTER(match_opts),
                                           POINTER(match_result), c_uint64,
                                           POINTER(c_uint64)]),
        "kvpool_submit_delete": (c_int, [h, c_char_p, c_size_t, POINTER(c_int), c_uint64,
                                         POINTER(c_uint64)]),
        "kvpool_poll": (c_int, [h, POINTER(completion), c_int, c_int]),
        "kvpool_event_fd": (c_int, [h]),
        "kvpool_cancel": (c_int, [h, c_uint64]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


lib = _load()
_declare(lib)
path = lib._name

# ---- caller memory through the buffer protocol ------------------------------


class Py_buffer(Structure):
    """CPython's Py_buffer (part of the stable ABI since 3.11, unchanged since 3.3)."""
    _fields_ = [("buf", c_void_p), ("obj", c_void_p), ("len", c_ssize_t),
                ("itemsize", c_ssize_t), ("readonly", c_int), ("ndim", c_int),
                ("format", c_char_p), ("shape", c_void_p), ("strides", c_void_p),
                ("suboffsets", c_void_p), ("internal", c_void_p)]


PyBUF_SIMPLE = 0   # contiguous bytes, no format: what a block payload is
PyBUF_WRITABLE = 1

_api = ctypes.pythonapi
_get_buffer = _api.PyObject_GetBuffer
_get_buffer.restype = c_int
_get_buffer.argtypes = [py_object, POINTER(Py_buffer), c_int]
_release_buffer = _api.PyBuffer_Release
_release_buffer.restype = None
_release_buffer.argtypes = [POINTER(Py_buffer)]

# A new bytes object whose contents the binding fills in before anyone else
# sees it: the documented way C code builds bytes (PyBytes_FromStringAndSize
# with NULL). Lets get() return bytes with no copy after the receive.
new_bytes = _api.PyBytes_FromStringAndSize
new_bytes.restype = py_object
new_bytes.argtypes = [c_void_p, c_ssize_t]
bytes_address = _api.PyBytes_AsString
bytes_address.restype = c_void_p
bytes_address.argtypes = [py_object]


def _is_tensor(obj):
    """A torch tensor (duck-typed: the binding does not import torch)."""
    return all(hasattr(obj, a) for a in ("data_ptr", "element_size", "is_contiguous"))


class Pin:
    """The address and size of a caller buffer, held for as long as this
    object is not released: a buffer-protocol export (so a bytearray cannot
    be resized under us) or a reference to a torch tensor (kept alive; torch
    has no way to refuse a resize, so moved() tells whether it happened)."""

    __slots__ = ("address", "nbytes", "_view", "_obj", "tensor")

    def __init__(self, obj, writable):
        self._view = None
        self._obj = obj
        self.tensor = False
        if _is_tensor(obj):
            self.tensor = True
            self._pin_tensor(obj)
            return
        view = Py_buffer()
        _get_buffer(obj, ctypes.byref(view), PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        self._view = view
        self.address = view.buf
        self.nbytes = view.len

    def _pin_tensor(self, t):
        """torch tensors have no buffer protocol; a contiguous CPU tensor's
        memory is data_ptr() .. + numel() * element_size()."""
        device = getattr(t, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            raise TypeError("kvpool: only CPU tensors can be used over TCP (got %s)" % device)
        if not t.is_contiguous():
            raise BufferError("kvpool: tensor is not contiguous")
        self.address = t.data_ptr()
        self.nbytes = t.numel() * t.element_size()

    def moved(self):
        """A pinned tensor was resized or given other storage (resize_,
        set_) since it was pinned: its memory is no longer the pinned
        range. Always False for buffer-protocol objects (they cannot be)."""
        t = self._obj
        if not self.tensor or t is None:
            return False
        return t.data_ptr() != self.address or t.numel() * t.element_size() < self.nbytes

    def release(self):
        if self._view is not None:
            _release_buffer(ctypes.byref(self._view))
            self._view = None
        self._obj = None

    def __del__(self):
        self.release()


class Pins:
    """A list of Pin, released together (a context manager)."""

    def __init__(self):
        self.pins = []

    def add(self, obj, writable):
        p = Pin(obj, writable)
        self.pins.append(p)
        return p

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.pins:
            p.release()
        self.pins = []
