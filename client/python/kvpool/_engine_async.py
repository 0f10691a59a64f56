"""Asynchronous kvpool calls for the engine adapters (LMCache's native L2
plugin, vLLM's offloading tier): AsyncLink, with the shape of the
binding's asynchronous API (Client.submit_*, poll, event_fd, the
Completion tuple of client/kvpool.h's kvpool_poll).

This is the one file that knows how the asynchronous calls are made.
Today they run on a worker thread per AsyncLink over the synchronous
binding, in submission order (so a MATCH and the GET after it share one
connection and the lease holds), and completions are signalled through
an eventfd. When the binding has Client.submit_get_into_many, this file
is the one to switch over to it. What the switch must keep: one thread
that polls the Client and is the only one to close it (the binding does
not allow close() during poll()), so a Link that goes down hands its
Client to that thread; requests in flight on a closed Client complete
with -ENOTCONN; a put answered -ENOLINK is re-put (re-rooted) as a
follow-up request before its completion is reported; completions keep
submission order per AsyncLink.

Never raises for a pool failure: a pool that is down completes every
request with status -ENOTCONN (nothing was sent) or the call's -errno.
"""

import collections
import errno as _errno
import itertools
import os
import threading

from . import _engine
from .errors import Busy

Completion = collections.namedtuple("Completion", "id tag op status statuses lengths matched")
Completion.__doc__ = ("A finished request: op is put|get|exists|match|delete; status 0 or "
                      "-errno; statuses per key; lengths per block (get); matched (match).")

DEFAULT_MAX_INFLIGHT = 1024


class AsyncLink:
    """Requests on one Link, completed in order by a worker thread.

    AsyncLink(link, max_inflight=1024, on_complete=None)

    submit_*() return a request id (an int > 0) at once; the buffers and
    keys passed must stay alive and untouched until its completion is
    returned by poll(). submit_* raise kvpool.Busy when max_inflight
    requests are in flight, ValueError after close(). event_fd() is
    readable exactly while poll() has completions to return.
    With on_complete, each Completion is passed to on_complete(c) on the
    worker thread instead (poll() then returns nothing); it must not block.
    """

    def __init__(self, link, max_inflight=DEFAULT_MAX_INFLIGHT, on_complete=None):
        self.link = link
        self.on_complete = on_complete
        self.max_inflight = max_inflight
        self._ids = itertools.count(1)
        self._queue = collections.deque()
        self._done = collections.deque()
        self._cv = threading.Condition()
        self._inflight = 0
        self._closed = False
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, daemon=True, name="kvpool-async")
        self._thread.start()

    # ---- submission ------------------------------------------------------------------

    def _submit(self, op, args, tag):
        with self._cv:
            if self._closed:
                raise ValueError("kvpool: submit on a closed AsyncLink")
            if self._inflight >= self.max_inflight:
                raise Busy(-_errno.EAGAIN, "kvpool: %d requests already in flight"
                           % self._inflight)
            rid = next(self._ids)
            self._inflight += 1
            self._queue.append((rid, tag, op, args))
            self._cv.notify()
        return rid

    def submit_put_many(self, keys, buffers, parents=None, tag=None):
        return self._submit("put", (list(keys), list(buffers), parents), tag)

    def submit_get_into_many(self, keys, buffers, tag=None):
        return self._submit("get", (list(keys), list(buffers)), tag)

    def submit_exists_many(self, keys, tag=None):
        return self._submit("exists", (list(keys),), tag)

    def submit_match(self, keys, lease_ms=0, tag=None):
        return self._submit("match", (list(keys), lease_ms), tag)

    def submit_delete_many(self, keys, tag=None):
        return self._submit("delete", (list(keys),), tag)

    # ---- completion ------------------------------------------------------------------

    def poll(self, max=64, timeout=0.0):
        """Up to `max` completions; waits up to `timeout` seconds for the
        first (0: not at all, None: until one arrives or close())."""
        with self._cv:
            if not self._done and timeout != 0:
                self._cv.wait_for(lambda: self._done or self._closed, timeout)
            out = []
            while self._done and len(out) < max:
                out.append(self._done.popleft())
            if not self._done:
                try:
                    os.eventfd_read(self._efd)
                except BlockingIOError:
                    pass
            self._inflight -= len(out)
        return out

    def event_fd(self):
        return self._efd

    @property
    def inflight(self):
        return self._inflight

    def _run(self):
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                rid, tag, op, args = self._queue.popleft()
            try:
                c = self._execute(rid, tag, op, args)
            except Exception as e:    # a bug in a request: fail it, keep serving
                n = len(args[0])
                _engine.log.warning("kvpool: async %s failed: %r", op, e)
                c = Completion(rid, tag, op, -_errno.EIO, [-_errno.EIO] * n, [], 0)
            if self.on_complete is not None:
                try:
                    self.on_complete(c)
                except Exception as e:
                    _engine.log.warning("kvpool: async completion callback: %r", e)
                with self._cv:
                    self._inflight -= 1
                continue
            with self._cv:
                self._done.append(c)
                os.eventfd_write(self._efd, 1)
                self._cv.notify_all()

    def _execute(self, rid, tag, op, args):
        keys = args[0]
        n = len(keys)
        down = Completion(rid, tag, op, _engine.DOWN, [_engine.DOWN] * n, [], 0)
        if op == "put":
            st = self.link.call("put", lambda c: _engine.put_rerooting(
                c, keys, args[1], args[2]), None)
            if st is None:
                return down
            return Completion(rid, tag, op, next((s for s in st if s), 0), st, [], 0)
        if op == "get":
            got = self.link.call("get", lambda c: c.get_into_many(keys, args[1]), None)
            if got is None:
                return down
            st = [0 if g > 0 else g for g in got]
            return Completion(rid, tag, op, next((s for s in st if s), 0), st,
                              [g if g > 0 else 0 for g in got], 0)
        if op == "exists":
            got = self.link.call("exists", lambda c: c.exists_many(keys), None)
            if got is None:
                return down
            return Completion(rid, tag, op, 0, [0 if g else _engine.MISS for g in got], [], 0)
        if op == "match":
            m = self.link.call("match", lambda c: c.match(keys, args[1]), None)
            if m is None:
                return down
            return Completion(rid, tag, op, 0, [], [], m)
        if op == "delete":
            got = self.link.call("delete", lambda c: c.delete_many(keys), None)
            if got is None:
                return down
            return Completion(rid, tag, op, 0, [0 if g else _engine.MISS for g in got], [], 0)
        raise ValueError("unknown op %r" % op)

    def close(self):
        """Stop the worker after the requests already queued, close the
        event fd. Completions not polled are dropped. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        try:
            os.close(self._efd)
        except OSError:
            pass
