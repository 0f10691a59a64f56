"""The connection every engine adapter (kvpool.sglang, kvpool.vllm,
kvpool.lmcache) uses: a Link never raises into the engine and reconnects
in the background; a rate-limited log; put_rerooting, the -ENOLINK re-put.

Nothing here imports an engine. Internal: the names may change.
"""

import builtins
import errno as _errno
import logging
import os
import threading
import time

from ..client import Client
from ..errors import Denied, Error, InvalidArgument, Unsupported
from .config import ConfigError

log = logging.getLogger("kvpool.engines")

MISS = -_errno.ENOENT
DOWN = -_errno.ENOTCONN        # the status an adapter reports when no call was made

# What a kvpool call may raise besides a bug: the binding's errors, bad
# arguments (ValueError, TypeError, BufferError) and socket errors.
CALL_FAILURES = (Error, ValueError, TypeError, BufferError, OSError)
# Those after which the connection is assumed gone: answer misses for a
# back-off period while a background thread reconnects.
_LINK_DOWN = (builtins.ConnectionError, TimeoutError)
# What kvpool_connect answers for a configuration that cannot work (a
# malformed URL or namespace, a token too long or refused, rdma:// without
# a device): at start the adapter raises; later it logs and retries.
_CONFIG_REFUSED = (InvalidArgument, Unsupported, Denied)


class RateLimitedLog:
    """Log a warning at most once per `interval_s` per topic, with the
    number of the same topic's warnings suppressed since the last one.
    Thread-safe."""

    def __init__(self, logger=log, interval_s=10.0):
        self.logger = logger
        self.interval_s = interval_s
        self._last = {}
        self._suppressed = {}
        self._lock = threading.Lock()

    def warning(self, topic, fmt, *args):
        """Log fmt % args under `topic`; returns True if it was logged."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(topic)
            if last is not None and now - last < self.interval_s:
                self._suppressed[topic] = self._suppressed.get(topic, 0) + 1
                return False
            self._last[topic] = now
            dropped = self._suppressed.pop(topic, 0)
        if dropped:
            fmt += " (%d similar messages suppressed)"
            args = args + (dropped,)
        self.logger.warning(fmt, *args)
        return True


def strerror_of(code):
    """The English description of a status (0 or a negative errno)."""
    try:
        from ..errors import strerror
        return strerror(code)
    except Exception:
        return os.strerror(-int(code)) if code else "success"


# ---- a connection that never raises ------------------------------------------------

class Link:
    """One kvpool Client for an adapter, which never raises into the engine.

    Link(url, namespace, token=None, timeout_s=2.0, name="", backoff_s=(0.2, 5.0))

    call(what, fn, default) runs fn(client) and returns its result; when
    the pool is down (the Link is waiting to reconnect), or fn raises one
    of CALL_FAILURES, it returns `default` and logs a rate-limited warning.
    A connection error or timeout marks the Link down: calls answer
    `default` at once, without touching the network, while a background
    thread retries (back-off doubling from backoff_s[0] to backoff_s[1])
    and brings it up again, re-registering the arenas given to
    register(). The first connection is tried in the constructor (a
    refusal is quick) and in the background after that.

    The first connection is made in the constructor: when kvpool_connect
    refuses the configuration itself (InvalidArgument: a malformed URL or
    namespace, a token too long; Unsupported: a scheme this build lacks;
    Denied: the server refuses the token), the constructor raises
    ConfigError, so the engine fails at start with the reason. Only a
    pool that cannot be reached makes a Link start down (with
    strict=False, for a Link opened while the engine runs, a refusal too:
    it is logged and retried like an unreachable pool). lease_ms, when
    given, is compared with the server's max_lease_ms on each connection:
    a lease the server will cut is logged once. block_bytes, when given,
    is the size of the adapter's largest block: when it is over the
    server's max_block_bytes every store would fail, so on the first
    connection the constructor raises ConfigError, and on a later one
    (the pool was down at start) it is logged once as an error.

    Thread rules: any thread may call; the Client serialises calls.
    close() is idempotent and stops the reconnect thread.
    """

    def __init__(self, url, namespace, token=None, timeout_s=2.0, name="",
                 backoff_s=(0.2, 5.0), warn=None, lease_ms=None, strict=True,
                 block_bytes=None):
        self.url = url
        self.namespace = namespace
        self.token = token
        self.timeout_s = float(timeout_s)
        self.name = name or namespace
        self.backoff_s = backoff_s
        self.warn = warn or RateLimitedLog()
        self.failures = 0            # calls that failed (any reason)
        self.reconnects = 0          # times the Link came back up
        self._arenas = []            # buffers to register on each connect
        self.on_down = None          # see _down
        self.lease_ms = lease_ms
        self._lease_warned = False
        self.block_bytes = block_bytes
        self._block_warned = False
        self._client = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = None
        self._connect(first=strict)
        if self._client is None:
            self._start_reconnect()

    # -- state
    @property
    def up(self):
        return self._client is not None

    def _connect(self, first=False):
        """Try once to connect; True on success. On the first try, a
        configuration kvpool_connect refuses raises ConfigError."""
        try:
            c = Client(self.url, self.namespace, token=self.token, timeout=self.timeout_s)
        except _CONFIG_REFUSED as e:
            if first:
                raise ConfigError("kvpool: %s: cannot use url %r with namespace %r: %s"
                                  % (self.name, self.url, self.namespace, e)) from None
            self.warn.warning(("connect", self.url), "kvpool: %s refused by %s: %s; "
                              "answering misses, retrying in the background",
                              self.name, self.url, e)
            return False
        except CALL_FAILURES as e:
            self.warn.warning(("connect", self.url), "kvpool: cannot reach %s for %s: %s; "
                              "answering misses, reconnecting in the background",
                              self.url, self.name, e)
            return False
        self._check_lease(c)
        try:
            self._check_block(c, first)
        except ConfigError:
            c.close()
            raise
        for arena in list(self._arenas):
            try:
                c.register(arena)
            except CALL_FAILURES as e:
                self.warn.warning(("register", self.url), "kvpool: register on %s: %s",
                                  self.url, e)
        with self._lock:
            if self._closed.is_set():
                c.close()
                return False
            old, self._client = self._client, c
        if old is not None:
            if self.on_down is not None:
                self.on_down(old)
            else:
                old.close()
        return True

    @staticmethod
    def _limits(c):
        """The server's Limits (a property of the binding's Client; a method
        in bindings before it), or None when it cannot be read."""
        try:
            lim = c.limits
            return lim() if callable(lim) else lim
        except CALL_FAILURES:
            return None

    def _check_lease(self, c):
        """Log once when the server will cut lease_ms to its max_lease_ms."""
        if not self.lease_ms or self._lease_warned:
            return
        cap = getattr(self._limits(c), "max_lease_ms", 0)
        if cap and self.lease_ms > cap:
            self._lease_warned = True
            log.warning("kvpool: %s: lease_ms %d is cut to the server's max_lease_ms %d: "
                        "what an exists check pins stays loadable for %d ms only (raise "
                        "max_lease_ms in kvpoold's configuration, or lower lease_ms)",
                        self.name, self.lease_ms, cap, cap)

    def _check_block(self, c, first):
        """A block larger than the server's max_block_bytes can never be
        stored: ConfigError on the first connection, else one error."""
        if not self.block_bytes or self._block_warned:
            return
        cap = getattr(self._limits(c), "max_block_bytes", 0)
        if cap and self.block_bytes > cap:
            msg = ("kvpool: %s: blocks of %d bytes are over the server's max_block_bytes %d at "
                   "%s: every store would fail (raise max_block_bytes in kvpoold's "
                   "configuration, or use smaller pages or chunks)"
                   % (self.name, self.block_bytes, cap, self.url))
            if first:
                raise ConfigError(msg)
            self._block_warned = True
            log.error(msg)

    def _start_reconnect(self):
        with self._lock:
            if self._closed.is_set() or (self._thread and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._reconnect_loop, daemon=True,
                                            name="kvpool-reconnect")
            self._thread.start()

    def _reconnect_loop(self):
        delay = self.backoff_s[0]
        while not self._closed.wait(delay):
            if self._connect():
                self.reconnects += 1
                log.info("kvpool: %s reconnected to %s", self.name, self.url)
                return
            delay = min(delay * 2, self.backoff_s[1])

    def _down(self, client):
        """Drop `client` (if still current) and reconnect in the background.
        With on_down set (an asynchronous user that polls the Client), the
        Client is handed to on_down(client) to close instead."""
        with self._lock:
            if self._client is not client:
                return
            self._client = None
            hook = self.on_down
        if hook is not None:
            hook(client)
        else:
            try:
                client.close()
            except CALL_FAILURES:
                pass
        self._start_reconnect()

    # -- calls
    def call(self, what, fn, default):
        """fn(client) or `default` (see the class comment). Never raises
        for a pool failure; a bug in fn (another exception) propagates."""
        c = self._client
        if c is None:
            self.failures += 1
            return default
        try:
            return fn(c)
        except CALL_FAILURES as e:
            self.failures += 1
            if isinstance(e, _LINK_DOWN):
                self._down(c)
                self.warn.warning(("down", self.url), "kvpool: %s on %s failed: %s; "
                                  "answering misses until it reconnects", what, self.name, e)
            else:
                self.warn.warning(("call", what), "kvpool: %s on %s failed: %s",
                                  what, self.name, e)
            return default

    def register(self, buffer):
        """Register an engine arena now (if connected) and on every
        reconnect. Failures are logged, not raised (over TCP registration
        is only a record)."""
        self._arenas.append(buffer)
        self.call("register", lambda c: c.register(buffer), None)

    def close(self):
        """Close the connection and stop reconnecting. Idempotent."""
        self._closed.set()
        with self._lock:
            c, self._client = self._client, None
            t = self._thread
        if c is not None:
            try:
                c.close()
            except CALL_FAILURES:
                pass
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        self._arenas = []


def statuses_or(result, n, default=DOWN):
    """result if it is a list of n statuses, else [default] * n."""
    if isinstance(result, list) and len(result) == n:
        return result
    return [default] * n


def _put_many(client, keys, bufs, parents, retain_ms):
    """client.put_many, with retain_ms only when some block asks one."""
    asked = retain_ms if isinstance(retain_ms, int) else any(retain_ms)
    if asked:
        return client.put_many(keys, bufs, parents, retain_ms=retain_ms)
    return client.put_many(keys, bufs, parents)


def put_rerooting(client, keys, bufs, parents, retain_ms=0):
    """put_many, then again for the blocks refused with -ENOLINK (their
    parent was evicted or never stored): a refused block whose parent is
    an earlier refused block of the batch keeps it (both are put again, in
    order); the others are put with parent=None. A re-rooted block still
    matches, since MATCH does not check links. retain_ms: the retention
    asked for each block (an int for all, or a sequence of one int per
    block; 0: none; see Client.put_many); put_many is called without it
    when no block asks one."""
    st = _put_many(client, keys, bufs, parents, retain_ms)
    again = [i for i, s in enumerate(st) if s == -_errno.ENOLINK]
    if again:
        p2, earlier = [], set()
        for i in again:
            p = parents[i] if parents else None
            p2.append(p if p is not None and p in earlier else None)
            earlier.add(keys[i])
        r2 = retain_ms if isinstance(retain_ms, int) else [retain_ms[i] for i in again]
        st2 = _put_many(client, [keys[i] for i in again], [bufs[i] for i in again], p2, r2)
        for j, i in enumerate(again):
            st[i] = st2[j]
    return st
