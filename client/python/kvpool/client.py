"""kvpool.Client: one libkvpool handle (one TCP connection) as a Python
object.

Payloads are any object with the buffer protocol (bytes, bytearray,
memoryview, array.array, numpy arrays) or a contiguous torch CPU tensor,
or a list/tuple of such pieces (a scatter-gather list: per-layer slices of
one block need no staging copy). The binding passes their addresses to
libkvpool: put sends from them and get_into receives into them with no copy
in Python. The GIL is released while libkvpool waits for the network.
"""

import ctypes
import errno as _errno
import json
import os
import select
import threading
import time
from collections import namedtuple

from . import _lib
from .errors import ConnectionError as _ConnectionError
from .errors import (Busy, InvalidArgument, NotRegistered, TooLarge, last_server_message,
                     make_error)

_lib_fns = _lib.lib
_KEY = _lib.KEY_BYTES

# Errors after which a batch call did nothing per block: they are raised
# rather than returned as per-block statuses.
_CALL_ERRORS = frozenset(-e for e in (
    _errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EPIPE, _errno.ETIMEDOUT,
    _errno.EPROTO, _errno.ENOMEM, _errno.EINVAL, _errno.EOPNOTSUPP))

# get_many receives into buffers of a guessed size only while they add up
# to at most this much; beyond it, it asks the sizes first (a round trip
# without payload) rather than risk allocating guess * count bytes.
_GET_MANY_GUESS_BYTES = 256 << 20

Limits = namedtuple("Limits", "max_block_bytes max_batch_blocks max_frame_bytes max_lease_ms "
                              "rdma_port protocol_version max_inflight_put_bytes "
                              "max_match_wait_ms max_retain_ms")
Limits.__doc__ = """The server's limits, from its HELLO reply (sizes in bytes, times in
ms). protocol_version is the version the connection uses (1 or 2);
max_match_wait_ms and max_retain_ms cap match(wait_ms=) and retain_ms=
(0 from a server that speaks protocol 1 only: it neither waits nor
retains)."""

# Flags of MatchResult.flags (protocol v2, proto/PROTOCOL.md section 14).
MATCH_LEASE_CUT = 0x001       # the lease of the whole present run would pass a
#                               leased-bytes bound: matched is the run whose lease fits
MATCH_WAITED = 0x002          # the server waited (fewer than `want` were present)
MATCH_WAIT_TIMEOUT = 0x004    # answered because wait_ms passed
MATCH_WAIT_REFUSED = 0x008    # the server's limit on waiting matches: answered at once
MATCH_WAIT_CLAMPED = 0x010    # wait_ms was cut to the server's max_match_wait_ms
MATCH_WAIT_ENDED = 0x020      # the server ended the wait early (drop, reload, shutdown)
MATCH_RETAIN_BUDGET = 0x040   # retention refused (in part) for the budget
MATCH_RETAIN_CLAMPED = 0x080  # retain_ms was cut to the server's max_retain_ms

# Per-block flags put_many(..., flags=[]) fills in.
PUT_RETAINED = 0x01           # a retention was taken
PUT_RETAIN_BUDGET = 0x02      # asked, refused for the budget: stored without it
PUT_RETAIN_CLAMPED = 0x04     # retain_ms was cut to the server's max_retain_ms

MatchResult = namedtuple("MatchResult", "matched present retained lease_ms retain_ms flags")
MatchResult.__doc__ = """What Client.match_detail answers.

matched    leading blocks of the chain the pool holds (leased, when a lease
           was asked): what match() returns
present    leading blocks present when the server answered (> matched only
           with MATCH_LEASE_CUT)
retained   leading blocks whose retention was set or extended
lease_ms   lease granted (0: none)
retain_ms  retention granted (0: none)
flags      MATCH_* bits (0 from a server that speaks protocol 1 only)"""

Completion = namedtuple("Completion",
                        "id tag op status statuses lengths matched flags result message",
                        defaults=((), None, ""))
Completion.__doc__ = """A finished asynchronous request (Client.poll).

id        what submit_* returned
tag       the tag given to submit_* (any object; None by default)
op        "put" | "get" | "exists" | "match" | "delete"
status    0 or a negative errno: what the synchronous call would have
          returned (-errno.ECANCELED after cancel); never raised
statuses  per block/key: 0 or a negative errno ([] for match)
lengths   get: bytes received per block (the block's size also for
          -errno.EMSGSIZE when the server said it; 0 otherwise); else []
matched   match: the leading run the pool holds; else 0
flags     put: per block PUT_* bits (0 where none); else []
result    match: the MatchResult when status is 0; else None
message   the server's words for this request's refusal ("" when it
          carries none), e.g. "put refused: the token is read-only..."."""

_OP_NAMES = {1: "put", 2: "get", 3: "exists", 4: "match", 5: "delete"}


class _Pending:
    """What an asynchronous request keeps alive until its completion is
    polled: the pins of its buffers and every ctypes array libkvpool was
    given (blocks, iovecs, keys, statuses)."""

    __slots__ = ("tag", "pins", "keep", "st", "blocks", "n", "fl", "flags_out", "mres",
                 "moved")

    def __init__(self, tag, pins, keep, st, blocks, n, fl=None, flags_out=None, mres=None):
        self.tag, self.pins, self.keep, self.st, self.blocks, self.n = \
            tag, pins, keep, st, blocks, n
        self.fl, self.flags_out, self.mres = fl, flags_out, mres
        self.moved = False   # a tensor of it was resized: cancelled, -EFAULT

    def tensors(self):
        """Whether a torch tensor is among its buffers."""
        return self.pins is not None and any(p.tensor for p in self.pins.pins)

    def tensor_moved(self):
        return self.pins is not None and any(p.moved() for p in self.pins.pins)

    def release(self):
        if self.pins is not None:
            self.pins.__exit__(None, None, None)
            self.pins = None


def _err(code, context, **extra):
    """make_error for a synchronous call that just failed on this thread:
    the message ends with the reason the server gave, if it gave one (which
    quota, how full; why a token was refused)."""
    return make_error(code, context, server=last_server_message(), **extra)


def _key(key, what="key"):
    """A key as 32 bytes; TypeError or InvalidArgument otherwise."""
    if isinstance(key, bytes):
        k = key
    elif isinstance(key, (bytearray, memoryview)):
        k = bytes(key)
    else:
        raise TypeError("kvpool: %s must be bytes, not %s" % (what, type(key).__name__))
    if len(k) != _KEY:
        raise InvalidArgument(-_errno.EINVAL, "kvpool: %s must be %d bytes, got %d"
                              % (what, _KEY, len(k)))
    return k


def _int_arg(value, name, lo=0, hi=0xFFFFFFFF):
    """An integer argument: TypeError for anything but an int (a bool, a
    float or a str is refused rather than converted), InvalidArgument when
    it is out of lo..hi."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("kvpool: %s must be an int, not %s" % (name, type(value).__name__))
    if not lo <= value <= hi:
        raise InvalidArgument(-_errno.EINVAL, "kvpool: %s must be %d .. %d, got %d"
                              % (name, lo, hi, value))
    return value


def _text_arg(value, name, none_ok=False):
    """A str or bytes argument as bytes (None passes when none_ok). Anything
    else is a TypeError, never converted: libkvpool takes a C string, and
    an int (an all-digit token read from JSON or YAML) would reach it as an
    address."""
    if value is None and none_ok:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    hint = ""
    if isinstance(value, int) and not isinstance(value, bool) and name == "token":
        hint = " (an all-digit token read from JSON, YAML or an environment parser " \
               "arrives as an int: quote it, or pass str(token))"
    raise TypeError("kvpool: %s must be str or bytes%s, not %s%s"
                    % (name, " or None" if none_ok else "", type(value).__name__, hint))


def _path_arg(value, name):
    """A file name (str, bytes or os.PathLike) as bytes, or None."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return os.fsencode(value)
    return _text_arg(value, name)


def _namespace(namespace, what):
    """A namespace name as bytes: 1..255 bytes of printable ASCII 0x21..0x7e
    (no spaces). TypeError for anything but str or bytes; InvalidArgument
    saying what is wrong otherwise (libkvpool would only say "invalid
    argument")."""
    raw = _text_arg(namespace, "namespace")
    bad = None
    if not raw:
        bad = "it is empty"
    elif len(raw) > 255:
        bad = "it is %d bytes, over 255" % len(raw)
    else:
        for i, b in enumerate(raw):
            if b < 0x21 or b > 0x7e:
                bad = "byte %d is %s" % (i, "a space" if b == 0x20 else "0x%02x" % b)
                break
    if bad:
        raise InvalidArgument(-_errno.EINVAL, "%s: namespace %r is not valid: %s (a name is "
                              "1..255 bytes of printable ASCII 0x21..0x7e, no spaces)"
                              % (what, namespace, bad))
    return raw


def _not_empty(total, what):
    """Refuse a block of 0 bytes before anything is sent (libkvpool would
    answer -EMSGSIZE, which reads as "too large")."""
    if total == 0:
        raise InvalidArgument(-_errno.EINVAL, "%s: empty block (0 bytes): kvpool stores "
                              "blocks of 1 byte or more" % what)


def _keys(keys):
    """A list of keys as one contiguous bytes object, and their count."""
    ks = [_key(k) for k in keys]
    return b"".join(ks), len(ks)


def _short(key):
    return key.hex()[:16]


def _ms(value, name, what):
    """A time in milliseconds (lease_ms, wait_ms, retain_ms) as a u32: an
    int (TypeError for anything else, bool included), 0 .. 2**32 - 1
    (InvalidArgument otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("kvpool: %s: %s must be an int (milliseconds), not %s"
                        % (what, name, type(value).__name__))
    if not 0 <= value <= 0xFFFFFFFF:
        raise InvalidArgument(-_errno.EINVAL, "%s: %s must be 0 .. 4294967295 ms, got %d"
                              % (what, name, value))
    return value


def _match_opts(n, lease_ms, wait_ms, want, retain_ms, what):
    """struct kvpool_match_opts of a match over n keys; want None (or 0)
    is the whole chain."""
    if want is None:
        w = 0
    elif isinstance(want, bool) or not isinstance(want, int):
        raise TypeError("kvpool: %s: want must be an int or None, not %s"
                        % (what, type(want).__name__))
    elif want < 0 or want > n:
        raise InvalidArgument(-_errno.EINVAL, "%s: want %d is not within the chain of %d keys"
                              % (what, want, n))
    else:
        w = want
    return _lib.match_opts(_ms(lease_ms, "lease_ms", what), _ms(wait_ms, "wait_ms", what), w,
                           _ms(retain_ms, "retain_ms", what))


def _retains(retain_ms, n, what):
    """retain_ms for each of n blocks: one int for all, or a sequence of n."""
    if isinstance(retain_ms, (list, tuple)):
        if len(retain_ms) != n:
            raise InvalidArgument(-_errno.EINVAL, "%s: %d blocks but %d retain_ms values"
                                  % (what, n, len(retain_ms)))
        return [_ms(r, "retain_ms", what) for r in retain_ms]
    return [_ms(retain_ms, "retain_ms", what)] * n


def _flags_list(flags, what):
    """The caller's list for per-block flags (None: not wanted)."""
    if flags is not None and not isinstance(flags, list):
        raise TypeError("kvpool: %s: flags must be a list to fill (or None), not %s"
                        % (what, type(flags).__name__))
    return flags


def _match_result(r):
    return MatchResult(r.matched, r.present, r.retained, r.lease_ms, r.retain_ms, r.flags)


def _timeout_ms(timeout):
    """Seconds (int or float, > 0) -> libkvpool milliseconds; None -> default."""
    if timeout is None:
        return 0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("kvpool: timeout must be seconds as an int or a float, not %s"
                        % type(timeout).__name__)
    ms = int(round(float(timeout) * 1000))
    if ms < 1 or ms > 0xFFFFFFFF:
        raise InvalidArgument(-_errno.EINVAL, "kvpool: timeout must be 0.001 .. 4294967 s")
    return ms


def _pieces(data):
    """data as a list of buffer objects (a list/tuple is a scatter-gather list)."""
    if isinstance(data, (list, tuple)):
        if not data:
            raise InvalidArgument(-_errno.EINVAL, "kvpool: empty list of buffers")
        return list(data)
    return [data]


def _iovecs(pins, data, writable):
    """Pin every piece of data; returns (iovec array, piece count, total bytes)."""
    parts = _pieces(data)
    iov = (_lib.iovec * len(parts))()
    total = 0
    for i, part in enumerate(parts):
        p = pins.add(part, writable)
        iov[i].iov_base = p.address
        iov[i].iov_len = p.nbytes
        total += p.nbytes
    return iov, len(parts), total


class Client:
    """A connection to a kvpool server, bound to one namespace.

    Client(url="tcp://127.0.0.1:7470", namespace="default", token=None,
           timeout=10.0, tls_ca=None, tls_cert=None, tls_key=None,
           tls_verify_hostname=True)

    url        "tcp://host:port" (host: a name, IPv4, or [IPv6]); "tls://host:port"
               for a server with a certificate (also "auto://", "rdma://" and
               node lists, as libkvpool takes them)
    namespace  1..255 printable ASCII bytes, no spaces (e.g.
               "llama3-8b:bf16:tp1:b16": blocks of different models or
               layouts must not share one)
    token      auth token (str or bytes) or None
    timeout    seconds allowed for each call, reconnect included (float)
    tls_ca     tls://: file of the CA certificates the server's must chain to
               (None: KVPOOL_TLS_CA, else the system's store)
    tls_cert, tls_key
               tls://: this client's certificate and key, for a server that
               asks for one (None: KVPOOL_TLS_CERT / KVPOOL_TLS_KEY)
    tls_verify_hostname
               tls://: check the certificate names the URL's host (True)

    Connects at once (raises ConnectionError, Denied, InvalidArgument ...).
    Use it as a context manager, or call close(). A Client may be shared by
    threads: its calls are serialised (one connection, replies in order);
    for parallel transfers use one Client per thread.
    """

    def __init__(self, url=_lib.DEFAULT_URL, namespace="default", token=None, timeout=10.0,
                 tls_ca=None, tls_cert=None, tls_key=None, tls_verify_hostname=True):
        self._handle = None
        self._lock = threading.Lock()
        self._get_hint_bytes = 0      # size of the last block get() returned
        self._registered = {}         # address -> Pin of register()ed buffers
        self._pending = {}            # async request id -> _Pending
        self._tensor_reqs = set()     # ids of pending requests with torch tensors
        self._comp = (_lib.completion * 64)()
        url_b = _text_arg(url, "url")
        token = _text_arg(token, "token", none_ok=True)
        opts = _lib.options(token=token, timeout_ms=_timeout_ms(timeout))
        opts.tls_ca_file = _path_arg(tls_ca, "tls_ca")
        opts.tls_cert_file = _path_arg(tls_cert, "tls_cert")
        opts.tls_key_file = _path_arg(tls_key, "tls_key")
        if not tls_verify_hostname:
            opts.tls_flags |= _lib.TLS_NO_VERIFY_HOSTNAME
        ns = _namespace(namespace, "connect %s" % url)
        handle = ctypes.c_void_p()
        rc = _lib_fns.kvpool_connect(url_b, ns,
                                     ctypes.byref(opts), ctypes.byref(handle))
        if rc:
            if rc == -_errno.ENOENT:  # at connect: the host name does not resolve
                raise _ConnectionError(rc, "connect %s: host name does not resolve" % url)
            raise _err(rc, "connect %s namespace %r" % (url, namespace))
        self._handle = handle
        self._timeout_s = opts.timeout_ms / 1000 if opts.timeout_ms else \
            _lib.DEFAULT_TIMEOUT_MS / 1000
        self.url = url
        self.namespace = namespace

    # ---- lifetime -----------------------------------------------------------

    def close(self):
        """Close the connection and forget registered buffers. Idempotent."""
        with self._lock:
            h, self._handle = self._handle, None
            if h:
                _lib_fns.kvpool_close(h)
            for pin in self._registered.values():
                pin.release()
            self._registered.clear()
            # libkvpool touches no request memory after kvpool_close
            for rec in self._pending.values():
                rec.release()
            self._pending.clear()
            self._tensor_reqs.clear()

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return "<kvpool.Client %s namespace=%r %s>" % (getattr(self, "url", "?"),
                                                       getattr(self, "namespace", "?"), state)

    def _h(self):
        """The handle; the caller holds self._lock. Every call into
        libkvpool takes it first, so this is where pending requests whose
        torch tensors were resized are cancelled, before libkvpool can write
        into memory the tensor no longer owns."""
        if self._handle is None:
            raise ValueError("kvpool: operation on a closed Client")
        if self._tensor_reqs:
            self._cancel_moved(self._handle)
        return self._handle

    def _cancel_moved(self, h):
        """Cancel each pending request one of whose tensors was resized or
        given new storage since submit (torch cannot refuse that as a
        bytearray's export does); its completion reports -EFAULT. A request
        already finished (cancel says -ENOENT) wrote before the change."""
        for rid in list(self._tensor_reqs):
            rec = self._pending.get(rid)
            if rec is None or not rec.tensor_moved():
                if rec is None:
                    self._tensor_reqs.discard(rid)
                continue
            self._tensor_reqs.discard(rid)
            if _lib_fns.kvpool_cancel(h, rid) == 0:
                rec.moved = True
                rec.release()

    # ---- settings -----------------------------------------------------------

    @property
    def timeout(self):
        """Seconds allowed for each call (settable)."""
        return self._timeout_s

    @timeout.setter
    def timeout(self, seconds):
        ms = _timeout_ms(seconds)
        with self._lock:
            _lib_fns.kvpool_set_timeout(self._h(), ms)
            self._timeout_s = ms / 1000 if ms else _lib.DEFAULT_TIMEOUT_MS / 1000

    @property
    def limits(self):
        """The server's Limits (reconnects if needed)."""
        out = _lib.limits()
        with self._lock:
            rc = _lib_fns.kvpool_get_limits(self._h(), ctypes.byref(out))
        if rc:
            raise _err(rc, "limits")
        return Limits(*(getattr(out, f) for f, _ in _lib.limits._fields_))

    # ---- single blocks --------------------------------------------------------

    def put(self, key, data, parent=None, retain_ms=0):
        """Store one block: `data` is a buffer or a list of buffers (their
        concatenation is the block). `parent` is the key of the block
        before it in its prompt, or None for a prompt's first block.
        A key already stored is a success (content is never replaced).
        retain_ms > 0 asks the server to keep the block that long (see
        put_many). Raises InvalidArgument for an empty block (0 bytes),
        NoParent, TooLarge, Full, Busy, ChecksumError, ... ."""
        k = _key(key)
        p = None if parent is None else _key(parent, "parent")
        r = _ms(retain_ms, "retain_ms", "put")
        with _lib.Pins() as pins:
            if isinstance(data, (list, tuple)) or r:
                iov, n, total = _iovecs(pins, data, False)
                _not_empty(total, "put %s" % _short(k))
                block = _lib.put_block(k, p, iov, n, r)
                with self._lock:
                    rc = _lib_fns.kvpool_put(self._h(), ctypes.byref(block), 1, None)
            else:
                pin = pins.add(data, False)
                _not_empty(pin.nbytes, "put %s" % _short(k))
                with self._lock:
                    rc = _lib_fns.kvpool_put_bytes(self._h(), k, p, pin.address, pin.nbytes)
        if rc:
            raise _err(rc, "put %s" % _short(k))

    def get_into(self, key, buffer):
        """Receive one block straight into `buffer` (a writable buffer or a
        list of them, filled in order), with no intermediate copy. Returns
        the block's size in bytes (bytes past it are left alone).
        Raises Miss, TooLarge (the buffer is too small; .block_bytes says
        how large the block is), ChecksumError, ... ."""
        k = _key(key)
        length = ctypes.c_uint64(0)
        with _lib.Pins() as pins:
            if isinstance(buffer, (list, tuple)):
                iov, n, _ = _iovecs(pins, buffer, True)
                block = _lib.get_block(k, iov, n, 0)
                with self._lock:
                    rc = _lib_fns.kvpool_get(self._h(), ctypes.byref(block), 1, None)
                length.value = block.length
            else:
                pin = pins.add(buffer, True)
                with self._lock:
                    rc = _lib_fns.kvpool_get_bytes(self._h(), k, pin.address, pin.nbytes,
                                                   ctypes.byref(length))
        if rc:
            raise self._get_error(rc, k, length.value)
        return length.value

    def get(self, key):
        """Return one block as new bytes. Raises Miss, ChecksumError, ... .

        The block's bytes are received straight into the returned object.
        Its size is guessed from the last block get() returned; a first
        get, or a block larger than the guess, costs one more round trip
        (ask the size, then fetch), and a smaller one a copy of its bytes."""
        k = _key(key)
        length = ctypes.c_uint64(0)
        with self._lock:
            h = self._h()
            guess = self._get_hint_bytes
            out = None
            if guess:
                out = _lib.new_bytes(None, guess)
                rc = _lib_fns.kvpool_get_bytes(h, k, _lib.bytes_address(out), guess,
                                               ctypes.byref(length))
            else:
                rc = _lib_fns.kvpool_get_bytes(h, k, None, 0, ctypes.byref(length))
            if rc == -_errno.EMSGSIZE and length.value > guess:
                guess = length.value
                out = _lib.new_bytes(None, guess)
                rc = _lib_fns.kvpool_get_bytes(h, k, _lib.bytes_address(out), guess,
                                               ctypes.byref(length))
            if rc == 0:
                self._get_hint_bytes = length.value
        if rc:
            raise self._get_error(rc, k, length.value)
        return out if length.value == len(out) else out[:length.value]

    def exists(self, key):
        """True if the pool holds the block."""
        return self.exists_many([key])[0]

    def delete(self, key):
        """Remove a block and its descendants; True if it was there."""
        return self.delete_many([key])[0]

    # ---- batches --------------------------------------------------------------

    def put_many(self, keys, buffers, parents=None, retain_ms=0, flags=None):
        """Store len(keys) blocks in pipelined batches. buffers[i] is a
        buffer or a list of buffers; parents[i] (parents=None: all None) the
        parent key of block i or None. Returns a list of statuses: 0 for a
        block stored (or already there), else a negative errno (kvpool.
        strerror(s) describes it, kvpool.error_class(s) is its exception).

        retain_ms (an int for every block, or a sequence of one int per
        block; ms): > 0 asks the server not to evict the block for that
        long after it is stored (or, already stored, to extend its
        retention), capped at Limits.max_retain_ms and within the server's
        retention budget; a retention refused is not an error. flags: a
        list the call fills (replacing its contents) with each block's
        PUT_* bits saying what was granted (all 0 from a server that speaks
        protocol 1 only).

        Raises only for errors that fail the whole call (ConnectionError,
        Timeout, ProtocolError ...) and, before anything is sent, for bad
        arguments (InvalidArgument: an empty block, lengths that differ, a
        retain_ms out of range; TypeError: a retain_ms that is not an int,
        flags that is not a list)."""
        ks = [_key(k) for k in keys]
        rs = _retains(retain_ms, len(ks), "put_many")
        fl_out = _flags_list(flags, "put_many")
        if len(buffers) != len(ks):
            raise InvalidArgument(-_errno.EINVAL, "put_many: %d keys but %d buffers"
                                  % (len(ks), len(buffers)))
        if parents is None:
            ps = [None] * len(ks)
        else:
            if len(parents) != len(ks):
                raise InvalidArgument(-_errno.EINVAL, "put_many: %d keys but %d parents"
                                      % (len(ks), len(parents)))
            ps = [None if p is None else _key(p, "parent") for p in parents]
        if not ks:
            if fl_out is not None:
                fl_out[:] = []
            return []
        blocks = (_lib.put_block * len(ks))()
        st = (ctypes.c_int * len(ks))()
        fl = (ctypes.c_uint32 * len(ks))() if fl_out is not None else None
        with _lib.Pins() as pins:
            for i, k in enumerate(ks):
                iov, n, total = _iovecs(pins, buffers[i], False)
                _not_empty(total, "put_many block %d (%s)" % (i, _short(k)))
                blocks[i] = _lib.put_block(k, ps[i], iov, n, rs[i])  # blocks keeps iov alive
            with self._lock:
                rc = _lib_fns.kvpool_put_ex(self._h(), blocks, len(ks), st, fl)
        out = self._statuses(rc, st, "put_many")
        if fl_out is not None:
            fl_out[:] = list(fl)
        return out

    def put_chain(self, keys, buffers, parent=None, retain_ms=0, flags=None):
        """put_many for one prompt's consecutive blocks: block i's parent is
        keys[i-1], block 0's is `parent` (None: the prompt's first block).
        retain_ms and flags as put_many."""
        ks = list(keys)
        return self.put_many(ks, buffers, [parent] + ks[:-1] if ks else [],
                             retain_ms=retain_ms, flags=flags)

    def get_into_many(self, keys, buffers):
        """Receive len(keys) blocks into buffers[i] (each a writable buffer
        or a list of them), pipelined, with no intermediate copy. Returns a
        list: the block's size in bytes (> 0) where it was received, else a
        negative errno (-errno.ENOENT for a miss, -errno.EMSGSIZE when the
        buffer is too small). Raises only for whole-call errors."""
        ks = [_key(k) for k in keys]
        if len(buffers) != len(ks):
            raise InvalidArgument(-_errno.EINVAL, "get_into_many: %d keys but %d buffers"
                                  % (len(ks), len(buffers)))
        with _lib.Pins() as pins:
            iovs = [_iovecs(pins, b, True)[:2] for b in buffers]
            statuses, lengths = self._get_batch(ks, iovs, "get_into_many")
        return [lengths[i] if s == 0 else s for i, s in enumerate(statuses)]

    def get_many(self, keys):
        """Return len(keys) blocks: a list holding, per block, its bytes, or
        a negative errno where it was not returned (-errno.ENOENT: a miss).
        Blocks are received straight into the returned bytes objects, sized
        by a guess (see get); blocks larger than the guess are fetched again
        in a second batch (their size came with the first reply). When the
        guesses would add up to more than 256 MiB the first batch only asks
        the sizes.
        Raises only for whole-call errors."""
        ks = [_key(k) for k in keys]
        with self._lock:
            guess = self._get_hint_bytes
        if guess * len(ks) > _GET_MANY_GUESS_BYTES:
            guess = 0                   # ask the sizes first rather than over-allocate
        outs = [_lib.new_bytes(None, guess) if guess else None for _ in ks]
        statuses, lengths = self._get_batch(ks, [self._bytes_iov(o) for o in outs], "get_many")
        again = [i for i, s in enumerate(statuses)
                 if s == -_errno.EMSGSIZE and lengths[i] > guess]
        if again:
            for i in again:
                outs[i] = _lib.new_bytes(None, lengths[i])
            st2, len2 = self._get_batch([ks[i] for i in again],
                                        [self._bytes_iov(outs[i]) for i in again], "get_many")
            for j, i in enumerate(again):
                statuses[i], lengths[i] = st2[j], len2[j]
        got = [lengths[i] for i, s in enumerate(statuses) if s == 0]
        if got:
            with self._lock:
                self._get_hint_bytes = got[-1]
        return [s if s else (o if lengths[i] == len(o) else o[:lengths[i]])
                for i, (o, s) in enumerate(zip(outs, statuses))]

    @staticmethod
    def _bytes_iov(out):
        """(iovec array, 1) over a fresh bytes object (None: no room)."""
        iov = (_lib.iovec * 1)()
        if out is not None:
            iov[0].iov_base = _lib.bytes_address(out)
            iov[0].iov_len = len(out)
        return iov, 1

    def _get_batch(self, ks, iovs, what):
        """kvpool_get of blocks ks[i] into iovs[i] = (iovec array, count).
        Returns (statuses, lengths); lengths[i] is the block size when
        statuses[i] is 0 or -EMSGSIZE (0 if unknown)."""
        n = len(ks)
        if not n:
            return [], []
        blocks = (_lib.get_block * n)()
        st = (ctypes.c_int * n)()
        for i, k in enumerate(ks):
            blocks[i] = _lib.get_block(k, iovs[i][0], iovs[i][1], 0)
        with self._lock:
            rc = _lib_fns.kvpool_get(self._h(), blocks, n, st)
        statuses = self._statuses(rc, st, what)
        return statuses, [blocks[i].length if statuses[i] in (0, -_errno.EMSGSIZE) else 0
                          for i in range(n)]

    def exists_many(self, keys, statuses=False):
        """Which blocks the pool holds: a list of bools, one per key (True:
        held). With statuses=True, one status per key instead, as the other
        batch calls return: 0 for a block held, -errno.ENOENT for a miss
        (so never test those for truth: 0 is the success)."""
        raw, n = _keys(keys)
        if not n:
            return []
        st = (ctypes.c_int * n)()
        with self._lock:
            rc = _lib_fns.kvpool_exists(self._h(), raw, n, st)
        if rc:
            raise _err(rc, "exists")
        return list(st) if statuses else [s == 0 for s in st]

    def delete_many(self, keys, statuses=False):
        """Remove blocks and their descendants: a list of bools, True where
        the block was there. With statuses=True, one status per key: 0 for
        a block removed, -errno.ENOENT for one that was not there."""
        raw, n = _keys(keys)
        if not n:
            return []
        st = (ctypes.c_int * n)()
        with self._lock:
            rc = _lib_fns.kvpool_delete(self._h(), raw, n, st)
        if rc:
            raise _err(rc, "delete")
        return list(st) if statuses else [s == 0 for s in st]

    def match(self, keys, lease_ms=0, wait_ms=0, want=None, retain_ms=0):
        """How many leading keys of the chain `keys` the pool holds (an int).
        With lease_ms > 0 those blocks stay pinned for this connection for
        lease_ms (capped by the server's max_lease_ms) or until a get on this
        Client returns them, so the gets that follow cannot miss.

        wait_ms > 0: if fewer than `want` leading blocks (None: the whole
        chain) are there, the server waits up to wait_ms (capped at
        Limits.max_match_wait_ms) for puts that complete them, then answers
        what is there - a timeout is a shorter match, not an error. The
        call may take the Client's timeout plus wait_ms, and holds the
        Client meanwhile: other threads' calls on it wait for it (use a
        second Client for waits). retain_ms > 0
        extends the matched blocks' retention (see put_many). A server that
        speaks protocol 1 only ignores wait_ms, want and retain_ms.
        Raises TypeError for arguments that are not ints, InvalidArgument
        for values out of range (want above len(keys))."""
        return self.match_detail(keys, lease_ms, wait_ms, want, retain_ms).matched

    def match_detail(self, keys, lease_ms=0, wait_ms=0, want=None, retain_ms=0):
        """match() with the server's whole answer: a MatchResult (matched,
        present, retained, lease_ms, retain_ms, flags: MATCH_* bits)."""
        raw, n = _keys(keys)
        opts = _match_opts(n, lease_ms, wait_ms, want, retain_ms, "match")
        out = _lib.match_result()
        if not n:
            return MatchResult(0, 0, 0, 0, 0, 0)
        with self._lock:
            rc = _lib_fns.kvpool_match_ex(self._h(), raw, n, ctypes.byref(opts),
                                          ctypes.byref(out))
        if rc:
            raise _err(rc, "match")
        return _match_result(out)

    # ---- asynchronous requests ----------------------------------------------------
    #
    # submit_* return at once with a request id; poll() returns Completions.
    # From submit until its completion is polled (or cancel() returned
    # True) the binding keeps the request's buffers pinned and its ctypes
    # arrays alive: do not read or write the buffers meanwhile. The calls
    # are serialised with the synchronous ones on the Client's lock, which
    # poll() does not hold while it waits; close() must not run while
    # another thread is inside poll(). A full queue (max_inflight requests
    # submitted and not yet polled) raises Busy.

    def _submit(self, fn, args, rec, what):
        rid = ctypes.c_uint64(0)
        full = False
        with self._lock:
            h = self._h()
            rc = fn(h, *args, 0, ctypes.byref(rid))
            if rc == 0:
                self._pending[rid.value] = rec
                if rec.tensors():
                    self._tensor_reqs.add(rid.value)
            elif rc == -_errno.EAGAIN:
                # -EAGAIN is this Client's own full queue, or a server
                # that turned a reconnect away BUSY: say which
                full = _lib_fns.kvpool_inflight(h) >= self.max_inflight
        if rc:
            rec.release()
            if full:
                raise Busy(rc, "%s: too many requests in flight on this handle "
                           "(max_inflight %d): poll some first" % (what, self.max_inflight))
            if rc == -_errno.EAGAIN:
                raise Busy(rc, "%s: server busy, retry later" % what)
            raise make_error(rc, what)
        return rid.value

    def submit_put_many(self, keys, buffers, parents=None, tag=None, retain_ms=0, flags=None):
        """Asynchronous put_many: returns the request id at once. The
        completion's statuses are put_many's list and its flags the
        per-block PUT_* bits (also copied into `flags`, a list, when the
        completion is polled)."""
        ks = [_key(k) for k in keys]
        rs = _retains(retain_ms, len(ks), "submit_put_many")
        fl_out = _flags_list(flags, "submit_put_many")
        if len(buffers) != len(ks):
            raise InvalidArgument(-_errno.EINVAL, "submit_put_many: %d keys but %d buffers"
                                  % (len(ks), len(buffers)))
        if parents is None:
            ps = [None] * len(ks)
        else:
            if len(parents) != len(ks):
                raise InvalidArgument(-_errno.EINVAL, "submit_put_many: %d keys but %d parents"
                                      % (len(ks), len(parents)))
            ps = [None if p is None else _key(p, "parent") for p in parents]
        n = len(ks)
        blocks = (_lib.put_block * max(n, 1))()
        st = (ctypes.c_int * max(n, 1))()
        fl = (ctypes.c_uint32 * max(n, 1))()
        pins = _lib.Pins()
        keep = [ks, ps]
        try:
            for i, k in enumerate(ks):
                iov, cnt, total = _iovecs(pins, buffers[i], False)
                _not_empty(total, "submit_put_many block %d (%s)" % (i, _short(k)))
                blocks[i] = _lib.put_block(k, ps[i], iov, cnt, rs[i])
                keep.append(iov)
        except BaseException:
            pins.__exit__(None, None, None)
            raise
        keep.append(blocks)  # libkvpool reads the block array until the completion
        rec = _Pending(tag, pins, keep, st, None, n, fl=fl, flags_out=fl_out)
        return self._submit(_lib_fns.kvpool_submit_put_ex, (blocks, n, st, fl), rec,
                            "submit_put_many")

    def submit_get_into_many(self, keys, buffers, tag=None):
        """Asynchronous get_into_many: the blocks land in buffers[i] (each a
        writable buffer or a list of them). Returns the request id."""
        ks = [_key(k) for k in keys]
        if len(buffers) != len(ks):
            raise InvalidArgument(-_errno.EINVAL, "submit_get_into_many: %d keys but %d "
                                  "buffers" % (len(ks), len(buffers)))
        n = len(ks)
        blocks = (_lib.get_block * max(n, 1))()
        st = (ctypes.c_int * max(n, 1))()
        pins = _lib.Pins()
        keep = [ks]
        try:
            for i, k in enumerate(ks):
                iov, cnt, _ = _iovecs(pins, buffers[i], True)
                blocks[i] = _lib.get_block(k, iov, cnt, 0)
                keep.append(iov)
        except BaseException:
            pins.__exit__(None, None, None)
            raise
        rec = _Pending(tag, pins, keep, st, blocks, n)
        return self._submit(_lib_fns.kvpool_submit_get, (blocks, n, st), rec,
                            "submit_get_into_many")

    def submit_get_into(self, key, buffer, tag=None):
        """Asynchronous get_into of one block. Returns the request id."""
        return self.submit_get_into_many([key], [buffer], tag=tag)

    def _submit_keys(self, fn, keys, tag, what, with_st=True):
        raw, n = _keys(keys)
        st = (ctypes.c_int * max(n, 1))() if with_st else None
        rec = _Pending(tag, None, [raw], st, None, n)
        return self._submit(fn, (raw, n, st), rec, what)

    def submit_exists_many(self, keys, tag=None):
        """Asynchronous exists_many: statuses are 0 (held) or -ENOENT."""
        return self._submit_keys(_lib_fns.kvpool_submit_exists, keys, tag, "submit_exists_many")

    def submit_delete_many(self, keys, tag=None):
        """Asynchronous delete_many: statuses are 0 (was there) or -ENOENT."""
        return self._submit_keys(_lib_fns.kvpool_submit_delete, keys, tag, "submit_delete_many")

    def submit_match(self, keys, lease_ms=0, tag=None, wait_ms=0, want=None, retain_ms=0):
        """Asynchronous match (same arguments): the completion's `matched`
        is the leading run and its `result` the MatchResult. A waiting
        match (wait_ms > 0) holds up the requests submitted after it on
        this Client until it is answered (the server answers in order)."""
        raw, n = _keys(keys)
        opts = _match_opts(n, lease_ms, wait_ms, want, retain_ms, "submit_match")
        res = _lib.match_result()
        rec = _Pending(tag, None, [raw, opts], None, None, n, mres=res)
        return self._submit(_lib_fns.kvpool_submit_match_ex,
                            (raw, n, ctypes.byref(opts), ctypes.byref(res)), rec, "submit_match")

    def _completion(self, c, message=""):
        rec = self._pending.pop(c.id, None)
        if rec is None:                 # not ours (cannot happen): report it bare
            return Completion(c.id, None, _OP_NAMES.get(c.op, "?"), c.status, [], [], 0,
                              message=message)
        rec.release()
        self._tensor_reqs.discard(c.id)
        op = _OP_NAMES.get(c.op, "?")
        if rec.moved:
            return Completion(c.id, rec.tag, op, -_errno.EFAULT, [-_errno.EFAULT] * rec.n,
                              [0] * rec.n if op == "get" else [], 0, [], None)
        statuses = list(rec.st[:rec.n]) if rec.st is not None and op != "match" else []
        lengths = []
        if op == "get":
            lengths = [rec.blocks[i].length if statuses[i] in (0, -_errno.EMSGSIZE) else 0
                       for i in range(rec.n)]
        flags = list(rec.fl[:rec.n]) if rec.fl is not None else []
        if rec.flags_out is not None:
            rec.flags_out[:] = flags
        result = None
        if op == "match" and rec.mres is not None and c.status == 0:
            result = _match_result(rec.mres)
        return Completion(c.id, rec.tag, op, c.status, statuses, lengths,
                          c.matched if op == "match" else 0, flags, result, message)

    def poll(self, max=64, timeout=0.0):
        """Up to `max` finished requests as a list of Completion, waiting up
        to `timeout` seconds for the first (0: do not wait; None: until one
        comes, or at once when nothing is in flight)."""
        _int_arg(max, "poll: max", 1, 1 << 20)
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float))):
            raise TypeError("kvpool: poll: timeout must be seconds as an int or a float, "
                            "or None, not %s" % type(timeout).__name__)
        end = None if timeout is None else time.monotonic() + float(timeout)
        efd = None
        while True:
            with self._lock:
                h = self._h()
                if max > len(self._comp):
                    self._comp = (_lib.completion * max)()
                # One at a time: libkvpool keeps one refusal message per
                # poll (the first of its batch), and each Completion
                # carries its own.
                out = []
                while len(out) < max:
                    n = _lib_fns.kvpool_poll(h, self._comp, 1, 0)
                    if n < 0:
                        raise make_error(n, "poll")
                    if n == 0:
                        break
                    msg = _lib_fns.kvpool_last_server_message() or b""
                    out.append(self._completion(self._comp[0],
                                                msg.decode("utf-8", "replace")))
                if out:
                    return out
                if not self._pending:
                    return []
                if efd is None:
                    efd = _lib_fns.kvpool_event_fd(h)
                    if efd < 0:
                        raise make_error(efd, "poll")
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return []
            # The event fd covers completions, socket I/O and timers.
            select.select([efd], [], [], left)

    def event_fd(self):
        """A file descriptor (owned by the Client: do not close it) that is
        readable while poll(timeout=0) has something to do."""
        with self._lock:
            fd = _lib_fns.kvpool_event_fd(self._h())
        if fd < 0:
            raise make_error(fd, "event_fd")
        return fd

    def cancel(self, id):
        """Cancel request `id`. True: its buffers are no longer touched (and
        released now); its completion, status -ECANCELED, still comes from
        poll. False: unknown or already finished."""
        _int_arg(id, "cancel: id", 0, (1 << 64) - 1)
        with self._lock:
            rc = _lib_fns.kvpool_cancel(self._h(), id)
            if rc == 0 and id in self._pending:
                self._pending[id].release()
        if rc == -_errno.ENOENT:
            return False
        if rc:
            raise make_error(rc, "cancel")
        return True

    @property
    def inflight(self):
        """Requests submitted whose completion has not been polled yet."""
        with self._lock:
            return int(_lib_fns.kvpool_inflight(self._h()))

    @property
    def max_inflight(self):
        """The bound on inflight (settable only while inflight is 0)."""
        return getattr(self, "_max_inflight", 64)

    @max_inflight.setter
    def max_inflight(self, n):
        _int_arg(n, "max_inflight")
        with self._lock:
            rc = _lib_fns.kvpool_set_max_inflight(self._h(), n)
        if rc:
            raise make_error(rc, "max_inflight")
        self._max_inflight = int(n) or 64

    # ---- whole pool -------------------------------------------------------------

    def stats(self, namespace=None):
        """The server's statistics as a dict (keys in proto/PROTOCOL.md);
        namespace=None for every namespace, else only that one's entry."""
        out = ctypes.c_void_p()
        ns = None if namespace is None else _namespace(namespace, "stats")
        with self._lock:
            rc = _lib_fns.kvpool_stats(self._h(), ns, ctypes.byref(out))
        if rc:
            raise _err(rc, "stats")
        try:
            text = ctypes.string_at(out.value)
        finally:
            _lib_fns.kvpool_free(out)
        return json.loads(text)

    def drop_namespace(self, namespace=None):
        """Drop every block of a namespace (None: this Client's); returns
        how many blocks were dropped."""
        n = ctypes.c_uint64(0)
        ns = None if namespace is None else _namespace(namespace, "drop_namespace")
        with self._lock:
            rc = _lib_fns.kvpool_drop_namespace(self._h(), ns, ctypes.byref(n))
        if rc:
            raise _err(rc, "drop_namespace")
        return n.value

    def ping(self):
        """One round trip; returns its time in microseconds."""
        rtt_us = ctypes.c_uint64(0)
        with self._lock:
            rc = _lib_fns.kvpool_ping(self._h(), ctypes.byref(rtt_us))
        if rc:
            raise _err(rc, "ping")
        return rtt_us.value

    # ---- registered memory ------------------------------------------------------

    def register(self, buffer):
        """Declare a buffer that will be put from and got into many times
        (a KV-cache arena). With the RDMA transport (not built yet) it
        becomes memory the NIC may access, registered once; over TCP it is
        only checked and recorded, and puts/gets work the same with or
        without it. The buffer stays exported (a bytearray cannot be
        resized) until unregister(buffer) or close().
        Raises AlreadyRegistered if it overlaps a registered buffer."""
        pin = _lib.Pin(buffer, False)
        try:
            with self._lock:
                rc = _lib_fns.kvpool_register(self._h(), pin.address, pin.nbytes)
                if rc == 0:
                    self._registered[pin.address] = pin
        except BaseException:
            pin.release()
            raise
        if rc:
            pin.release()
            raise make_error(rc, "register")

    def unregister(self, buffer):
        """Forget a buffer given to register(). Raises NotRegistered (a
        KeyError) if it was not registered."""
        pin = _lib.Pin(buffer, False)
        address = pin.address
        pin.release()
        with self._lock:
            rc = _lib_fns.kvpool_unregister(self._h(), address)
            held = self._registered.pop(address, None) if rc == 0 else None
        if held is not None:
            held.release()
        if rc == -_errno.ENOENT:
            raise NotRegistered(rc, "unregister: no buffer registered with this Client "
                                "starts at this address")
        if rc:
            raise make_error(rc, "unregister")

    # ---- helpers ----------------------------------------------------------------

    @staticmethod
    def _get_error(rc, key, length):
        if rc == -_errno.EMSGSIZE:
            size = length or None
            what = "get %s" % _short(key)
            if size:
                what += " (block is %d bytes)" % size
            return _err(rc, what, cls=TooLarge, block_bytes=size)
        return _err(rc, "get %s" % _short(key))

    @staticmethod
    def _statuses(rc, st, what):
        """Per-block statuses of a batch call, or raise its whole-call error."""
        if rc in _CALL_ERRORS and all(s == rc for s in st):
            raise _err(rc, what)
        return list(st)
