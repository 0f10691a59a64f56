"""Exceptions of the kvpool binding, one class per error of libkvpool.

Every libkvpool call returns 0 or a negative errno (client/kvpool.h lists
them per function). A failed call raises the class of its errno below;
every class derives from kvpool.Error, which carries:

    code     the value libkvpool returned (a negative errno, e.g. -2)
    errno    the same, positive (errno.ENOENT)
    message  what went wrong, in English (kvpool_strerror plus context)

Classes that mean "the connection failed" also derive from the builtin
ConnectionError (and Timeout from the builtin TimeoutError), so code that
already handles socket errors handles these too.
"""

import builtins
import errno as _errno

from . import _lib


class Error(Exception):
    """Base class of every error libkvpool reports."""

    def __init__(self, code, message=None):
        if message is None:
            message = strerror(code)
        super().__init__(code, message)
        self.code = code
        self.errno = -code
        self.message = message
        self.strerror = message

    def __str__(self):
        return self.message


class Miss(Error):
    """The block is not in the pool (-ENOENT)."""


class NoParent(Error):
    """The block's parent is not stored, so nothing was stored (-ENOLINK)."""


class Full(Error):
    """The pool is full and nothing is evictable (-ENOSPC)."""


class QuotaExceeded(Error):
    """The namespace's quota is used up (-EDQUOT)."""


class Busy(Error):
    """The server is busy (in-flight put bytes or connections at their
    limit); retry later (-EAGAIN)."""


class TooLarge(Error):
    """A block is larger than the server's max_block_bytes, empty, or (on
    a get) larger than the buffer given for it (-EMSGSIZE).

    block_bytes is the block's size when the server reported it (a get
    into a buffer that is too small), else None."""

    def __init__(self, code, message=None, block_bytes=None):
        super().__init__(code, message)
        self.block_bytes = block_bytes


class Denied(Error):
    """The token does not allow this namespace (-EACCES)."""


class ChecksumError(Error):
    """The block's bytes do not match its checksum (-EBADMSG)."""


class ServerIOError(Error):
    """The server failed to read or write its storage (-EIO)."""


class ProtocolError(Error):
    """The server sent something that is not protocol v1, or refused the
    request as malformed (-EPROTO)."""


class Unsupported(Error):
    """The URL scheme or protocol version is not supported, or rdma:// in
    this build (-EOPNOTSUPP); rdma:// on a machine with no RDMA device
    (-ENODEV)."""


class InvalidArgument(Error, ValueError):
    """An argument libkvpool (or the binding) refuses (-EINVAL)."""


class AlreadyRegistered(Error):
    """The memory overlaps a region already registered (-EEXIST)."""


class NotRegistered(Error, KeyError):
    """No registered region starts at this buffer (-ENOENT from unregister)."""

    def __str__(self):  # KeyError would quote the message otherwise
        return self.message


class OutOfMemory(Error, MemoryError):
    """libkvpool could not allocate memory (-ENOMEM)."""


class ConnectionError(Error, builtins.ConnectionError):
    """The server is not reachable, or the connection broke during the call
    (-ECONNREFUSED, -ECONNRESET, -EPIPE; -ENOENT when connecting: the host
    name does not resolve). The next call reconnects. On a cluster URL also:
    every node that may hold a block is down (-EHOSTDOWN), and no node is
    registered under the etcd cluster name (-ENXIO, at connect)."""


class Timeout(Error, builtins.TimeoutError):
    """No complete reply within the timeout (-ETIMEDOUT). The connection was
    dropped; the next call reconnects."""


_BY_ERRNO = {
    _errno.ENOENT: Miss,
    _errno.ENOLINK: NoParent,
    _errno.ENOSPC: Full,
    _errno.EDQUOT: QuotaExceeded,
    _errno.EAGAIN: Busy,
    _errno.EMSGSIZE: TooLarge,
    _errno.EACCES: Denied,
    _errno.EBADMSG: ChecksumError,
    _errno.EIO: ServerIOError,
    _errno.EPROTO: ProtocolError,
    _errno.EPROTONOSUPPORT: Unsupported,
    _errno.EOPNOTSUPP: Unsupported,
    _errno.ENODEV: Unsupported,
    _errno.EINVAL: InvalidArgument,
    _errno.EFAULT: InvalidArgument,
    _errno.EEXIST: AlreadyRegistered,
    _errno.ENOMEM: OutOfMemory,
    _errno.ECONNREFUSED: ConnectionError,
    _errno.ECONNRESET: ConnectionError,
    _errno.EPIPE: ConnectionError,
    _errno.EHOSTDOWN: ConnectionError,
    _errno.ENXIO: ConnectionError,
    _errno.ETIMEDOUT: Timeout,
}


# Statuses only the binding reports, with their descriptions.
_BINDING_MESSAGES = {
    _errno.EFAULT: "a buffer (a torch tensor) was resized or moved while the request was in "
                   "flight: the request was cancelled before anything was written there",
}


def strerror(code):
    """libkvpool's English description of a status (0 or a negative errno),
    or the binding's for the statuses only it reports (-EFAULT)."""
    if -int(code) in _BINDING_MESSAGES:
        return _BINDING_MESSAGES[-int(code)]
    return _lib.lib.kvpool_strerror(int(code)).decode()


def error_class(code):
    """The exception class for a negative errno returned by libkvpool."""
    return _BY_ERRNO.get(-int(code), Error)


def make_error(code, context=None, cls=None, server=None, **extra):
    """Build (not raise) the exception for `code`; `context` (e.g. "get
    5d85718e...") prefixes the message, and `server` (the reason the server
    gave, e.g. which quota and how full) follows it."""
    message = strerror(code)
    if int(code) == -_errno.EAGAIN:
        # libkvpool's words cover a submit's full queue too; the binding
        # says that case itself (Client._submit), so here it is the server
        message = "server busy, retry later"
    if context:
        message = "%s: %s" % (context, message)
    if server:
        # libkvpool's own words (a TLS handshake, a file that does not
        # load, a cluster node's) are not the server's: no "server:" label
        own = server.startswith(("tls", "tls:")) or " tls handshake " in " " + server
        message = "%s (%s%s)" % (message, "" if own else "server: ", server)
    return (cls or error_class(code))(code, message, **extra)


def last_server_message():
    """The reason the server gave for the last call that failed on this
    thread (libkvpool keeps it per thread and clears it at each
    synchronous call), or None."""
    raw = _lib.lib.kvpool_last_server_message()
    return raw.decode(errors="replace") if raw else None
