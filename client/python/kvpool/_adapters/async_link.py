"""Asynchronous kvpool calls for the engine adapters (LMCache's native L2
plugin, vLLM's offloading tier): AsyncLink, with the shape of the
binding's asynchronous API (Client.submit_*, poll, event_fd, the
Completion tuple of client/kvpool.h's kvpool_poll).

This is the one file that knows how the asynchronous calls are made.
make_async_link() picks:
  - NativeAsyncLink when the binding has the asynchronous API
    (Client.submit_get_into_many, poll, event_fd): requests are pipelined
    on the Link's one connection and a poller thread, the only one that
    closes that connection, drives the binding's poll() (libkvpool makes
    progress inside poll);
  - AsyncLink otherwise (or with KVPOOL_ENGINE_ASYNC=thread): a worker
    thread per AsyncLink runs the synchronous calls in submission order.
Both keep a MATCH and the GET after it on one connection, so the lease
holds; both re-put a block refused with -ENOLINK as a root before its
completion is reported; completions come through on_complete(c) or
poll() + event_fd() alike.

Never raises for a pool failure: a pool that is down completes every
request with status -ENOTCONN (nothing was sent) or the call's -errno.
"""

import collections
import errno as _errno
import itertools
import os
import threading

from . import link as _link
from ..errors import Busy

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

    native = False

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

    def submit_put_many(self, keys, buffers, parents=None, tag=None, retain_ms=0):
        """retain_ms: as Client.put_many's (an int for every block); a server
        that keeps no retention ignores it."""
        return self._submit("put", (list(keys), list(buffers), parents, retain_ms), tag)

    def submit_get_into_many(self, keys, buffers, tag=None):
        return self._submit("get", (list(keys), list(buffers)), tag)

    def submit_exists_many(self, keys, tag=None):
        return self._submit("exists", (list(keys),), tag)

    def submit_match(self, keys, lease_ms=0, tag=None, retain_ms=0):
        """retain_ms > 0: extend the matched run's retention (Client.match)."""
        return self._submit("match", (list(keys), lease_ms, retain_ms), tag)

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
                _link.log.warning("kvpool: async %s failed: %r", op, e)
                c = Completion(rid, tag, op, -_errno.EIO, [-_errno.EIO] * n, [], 0)
            self._deliver(c)

    def _deliver(self, c):
        """Hand completion c to on_complete, or queue it for poll()."""
        if self.on_complete is not None:
            try:
                self.on_complete(c)
            except Exception as e:
                _link.log.warning("kvpool: async completion callback: %r", e)
            with self._cv:
                self._inflight -= 1
            return
        with self._cv:
            self._done.append(c)
            os.eventfd_write(self._efd, 1)
            self._cv.notify_all()

    def _execute(self, rid, tag, op, args):
        keys = args[0]
        n = len(keys)
        down = Completion(rid, tag, op, _link.DOWN, [_link.DOWN] * n, [], 0)
        if op == "put":
            st = self.link.call("put", lambda c: _link.put_rerooting(
                c, keys, args[1], args[2], args[3]), None)
            if st is None:
                return down
            return Completion(rid, tag, op, next((s for s in st if s), 0), st, [], 0)
        if op == "get":
            got = self.link.call("get", lambda c: _get_lengths(c, keys, args[1]), None)
            if got is None:
                return down
            st, lengths = got
            return Completion(rid, tag, op, next((s for s in st if s), 0), st, lengths, 0)
        if op == "exists":
            got = self.link.call("exists", lambda c: c.exists_many(keys), None)
            if got is None:
                return down
            return Completion(rid, tag, op, 0, [0 if g else _link.MISS for g in got], [], 0)
        if op == "match":
            more = {"retain_ms": args[2]} if len(args) > 2 and args[2] else {}
            m = self.link.call("match", lambda c: c.match(keys, args[1], **more), None)
            if m is None:
                return down
            return Completion(rid, tag, op, 0, [], [], m)
        if op == "delete":
            got = self.link.call("delete", lambda c: c.delete_many(keys), None)
            if got is None:
                return down
            return Completion(rid, tag, op, 0, [0 if g else _link.MISS for g in got], [], 0)
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


def _get_lengths(client, keys, buffers):
    """(statuses, lengths) of a get into buffers, as the asynchronous API
    reports them: lengths[i] is the block's size when statuses[i] is 0 or
    -EMSGSIZE (a buffer too small: nothing written), else 0."""
    from .. import _lib
    from .. import client as _client
    if len(buffers) != len(keys) or not hasattr(client, "_get_batch"):
        got = client.get_into_many(keys, buffers)
        return [0 if g >= 0 else g for g in got], [g if g >= 0 else 0 for g in got]
    ks = [_client._key(k) for k in keys]
    with _lib.Pins() as pins:
        iovs = [_client._iovecs(pins, b, True)[:2] for b in buffers]
        return client._get_batch(ks, iovs, "get_into_many")


# ---- over the binding's asynchronous API ----------------------------------------------

_CONN_ERRORS = frozenset(-e for e in (_errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EPIPE,
                                      _errno.ETIMEDOUT, _errno.ENOTCONN, _errno.ECONNABORTED))


class _Req:
    __slots__ = ("rid", "tag", "op", "args", "client", "first", "again")

    def __init__(self, rid, tag, op, args):
        self.rid, self.tag, self.op, self.args = rid, tag, op, args
        self.client = None
        self.first = None        # a put's statuses before its -ENOLINK re-put
        self.again = None        # positions re-put


class NativeAsyncLink(AsyncLink):
    """AsyncLink over the binding's Client.submit_* / poll (see the module
    doc). Same interface and guarantees, except that completions of
    different requests may come in another order than submitted (a put
    re-put after -ENOLINK completes later)."""

    native = True
    POLL_S = 0.05

    def __init__(self, link, max_inflight=DEFAULT_MAX_INFLIGHT, on_complete=None):
        self._reqs = {}            # rid -> _Req sent to a Client
        self._ready = collections.deque()   # completions made without the pool
        self._retired = []         # Clients the Link gave up, to fail and close
        self._tuned = set()
        link.on_down = self._retire
        super().__init__(link, max_inflight, on_complete)

    def _retire(self, client):
        """The Link dropped `client` (any thread): the poller fails its
        requests and closes it, never while inside its poll()."""
        with self._cv:
            self._retired.append(client)
            self._cv.notify_all()

    def _submit(self, op, args, tag):
        with self._cv:
            if self._closed:
                raise ValueError("kvpool: submit on a closed AsyncLink")
            if self._inflight >= self.max_inflight:
                raise Busy(-_errno.EAGAIN, "kvpool: %d requests already in flight"
                           % self._inflight)
            rid = next(self._ids)
            self._inflight += 1
        req = _Req(rid, tag, op, args)
        c = self.link._client
        if c is None:
            self._fail_soon(req)
            return rid
        try:
            self._send(c, req, args)
        except Busy:
            with self._cv:
                self._inflight -= 1
            raise
        except _link.CALL_FAILURES as e:
            if isinstance(e, _link._LINK_DOWN):
                self.link._down(c)
            else:
                _link.log.warning("kvpool: async %s refused: %s", op, e)
            self._fail_soon(req)
        return rid

    def _send(self, c, req, args):
        """Submit req (or its re-put) on Client c; the caller handles errors."""
        if id(c) not in self._tuned:
            self._tuned.add(id(c))
            try:
                if c.inflight == 0:
                    c.max_inflight = max(c.max_inflight, self.max_inflight)
            except _link.CALL_FAILURES:
                pass
        with self._cv:
            req.client = c
            self._reqs[req.rid] = req
        try:
            if req.op == "put":
                c.submit_put_many(args[0], args[1], args[2], tag=req.rid,
                                  retain_ms=args[3] if len(args) > 3 else 0)
            elif req.op == "get":
                c.submit_get_into_many(args[0], args[1], tag=req.rid)
            elif req.op == "exists":
                c.submit_exists_many(args[0], tag=req.rid)
            elif req.op == "match":
                c.submit_match(args[0], args[1], tag=req.rid,
                               retain_ms=args[2] if len(args) > 2 else 0)
            elif req.op == "delete":
                c.submit_delete_many(args[0], tag=req.rid)
            else:
                raise ValueError("unknown op %r" % req.op)
        except BaseException:
            with self._cv:
                self._reqs.pop(req.rid, None)
            raise
        with self._cv:
            self._cv.notify_all()

    def _fail_soon(self, req, status=_link.DOWN):
        n = len(req.args[0])
        c = Completion(req.rid, req.tag, req.op, status, [status] * n,
                       [0] * n if req.op == "get" else [], 0)
        with self._cv:
            self._ready.append(c)
            self._cv.notify_all()

    def _run(self):
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._ready or self._retired or self._closed or
                                  any(r.client is self.link._client for r in
                                      self._reqs.values()), self.POLL_S)
                ready, self._ready = list(self._ready), collections.deque()
                retired, self._retired = self._retired, []
                if self._closed and not self._reqs and not ready and not retired:
                    return
            for c in ready:
                self._deliver(c)
            for client in retired:
                self._fail_client(client)
            c = self.link._client
            if c is None or not any(r.client is c for r in list(self._reqs.values())):
                if self._closed and self._reqs:
                    for client in {id(r.client): r.client for r in self._reqs.values()}.values():
                        self._fail_client(client)
                continue
            try:
                got = c.poll(max=64, timeout=self.POLL_S)
            except _link.CALL_FAILURES as e:
                _link.log.warning("kvpool: async poll failed: %s", e)
                self.link._down(c)
                continue
            for comp in got:
                self._complete(c, comp)

    def _fail_client(self, client):
        """Every request still on `client` completes with -ENOTCONN; then close it."""
        with self._cv:
            mine = [r for r in self._reqs.values() if r.client is client]
            for r in mine:
                del self._reqs[r.rid]
        for r in mine:
            n = len(r.args[0])
            self._deliver(Completion(r.rid, r.tag, r.op, _link.DOWN, [_link.DOWN] * n,
                                     [0] * n if r.op == "get" else [], 0))
        try:
            client.close()
        except _link.CALL_FAILURES:
            pass

    def _complete(self, client, comp):
        with self._cv:
            req = self._reqs.pop(comp.tag, None)
        if req is None:
            return
        if comp.status in _CONN_ERRORS:
            self.link._down(client)
        st = list(comp.statuses)
        if req.op == "put" and req.again is None and comp.status not in _CONN_ERRORS:
            again = [i for i, s in enumerate(st) if s == -_errno.ENOLINK]
            if again:
                keys, bufs, parents = req.args[:3]
                retain = req.args[3] if len(req.args) > 3 else 0
                p2, earlier = [], set()
                for i in again:
                    p = parents[i] if parents else None
                    p2.append(p if p is not None and p in earlier else None)
                    earlier.add(keys[i])
                req.first, req.again = st, again
                try:
                    self._send(client, req, ([keys[i] for i in again], [bufs[i] for i in again],
                                             p2, retain))
                    return
                except _link.CALL_FAILURES as e:
                    # the re-put was never sent: its blocks are not stored
                    _link.log.warning("kvpool: re-put after -ENOLINK refused: %s", e)
                    code = getattr(e, "code", None) or getattr(e, "errno", None)
                    code = -abs(code) if isinstance(code, int) and code else -_errno.EIO
                    for i in again:
                        st[i] = code
                    req.first, req.again = None, None
                    if isinstance(e, _link._LINK_DOWN):
                        self.link._down(client)
        if req.again is not None:
            merged = list(req.first)
            for j, i in enumerate(req.again):
                merged[i] = st[j] if j < len(st) else comp.status
            st = merged
        status = next((s for s in st if s), 0) if req.op == "put" else comp.status
        if req.op == "get":
            lengths = list(comp.lengths)
            st = [0 if s == 0 else s for s in st]
        else:
            lengths = []
        self._deliver(Completion(req.rid, req.tag, req.op, status, st, lengths, comp.matched))

    def close(self):
        """Finish (or fail) what is in flight, then stop the poller. The
        Link's connection stays the Link's. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self.link.on_down = None
        try:
            os.close(self._efd)
        except OSError:
            pass


def make_async_link(link, max_inflight=DEFAULT_MAX_INFLIGHT, on_complete=None):
    """NativeAsyncLink when the binding has the asynchronous API (and
    KVPOOL_ENGINE_ASYNC is not "thread"), else the thread-backed AsyncLink.
    Every URL: one node, a node list or etcd:// (libkvpool's asynchronous
    calls work on cluster handles, whose node threads run the nodes' parts
    in parallel)."""
    from ..client import Client
    if hasattr(Client, "submit_get_into_many") and \
            os.environ.get("KVPOOL_ENGINE_ASYNC") != "thread":
        return NativeAsyncLink(link, max_inflight, on_complete)
    return AsyncLink(link, max_inflight, on_complete)
