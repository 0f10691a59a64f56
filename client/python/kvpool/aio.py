"""asyncio helpers over kvpool.Client's asynchronous requests.

The Client's event fd is watched with loop.add_reader while some request
is awaited; when it turns readable, the reader calls Client.poll(timeout=0)
and resolves the futures of the requests that finished. Nothing blocks the
event loop: submits return at once and I/O happens inside those polls.

    c = kvpool.Client(url, "ns")
    rid = c.submit_get_into(key, buf)
    comp = await kvpool.aio.wait(c, rid)          # a kvpool.Completion

    ac = kvpool.aio.AsyncClient(c)
    lengths = await ac.get_into_many(keys, bufs)  # as Client.get_into_many

Completions of requests nobody awaits (yet) are kept until wait() asks for
them. Use one event loop per Client. While a wait is pending, do not call
Client.poll yourself: the reader would race you for the completions.

A wait that is cancelled (task.cancel(), asyncio.wait_for timing out)
cancels its request: when the await ends, libkvpool no longer writes into
the request's buffers (a GET's buffer may hold part of the block), and
the request's completion is collected and dropped in the background, so
its slot comes free (max_inflight is not used up by abandoned requests).
"""

import asyncio
import errno as _errno

from .errors import make_error

__all__ = ["wait", "AsyncClient"]

# Errors that fail a whole call of the synchronous API (they are raised there).
_CALL_ERRORS = frozenset(-e for e in (
    _errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EPIPE, _errno.ETIMEDOUT,
    _errno.EPROTO, _errno.ENOMEM, _errno.EINVAL, _errno.EOPNOTSUPP, _errno.ECANCELED))


class _Dispatcher:
    """One per Client: routes polled completions to awaiting futures."""

    def __init__(self, client, loop):
        self.client = client
        self.loop = loop
        self.fd = client.event_fd()
        self.waiting = {}     # id -> Future
        self.finished = {}    # id -> Completion nobody awaited yet
        self.abandoned = set()  # ids whose wait was cancelled: completion dropped
        self.reading = False

    def _on_readable(self):
        try:
            comps = self.client.poll(max=64, timeout=0)
        except Exception as e:  # the Client was closed or broke: fail every waiter
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(e)
            self.waiting.clear()
            self.abandoned.clear()
            self._stop()
            return
        for comp in comps:
            if comp.id in self.abandoned:
                self.abandoned.discard(comp.id)  # its slot is free now
                continue
            fut = self.waiting.pop(comp.id, None)
            if fut is None:
                self.finished[comp.id] = comp
            elif not fut.done():
                fut.set_result(comp)
        if not self.waiting and not self.abandoned:
            self._stop()

    def _start(self):
        if not self.reading:
            self.loop.add_reader(self.fd, self._on_readable)
            self.reading = True

    def _stop(self):
        if self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    async def wait(self, rid):
        comp = self.finished.pop(rid, None)
        if comp is not None:
            return comp
        fut = self.loop.create_future()
        self.waiting[rid] = fut
        self._start()
        # The request may have finished inside its submit: look once now.
        self._on_readable()
        try:
            return await fut
        except asyncio.CancelledError:
            if not fut.done() or fut.cancelled():
                self._abandon(rid)
            raise
        finally:
            if self.waiting.get(rid) is fut:
                del self.waiting[rid]
                if not self.waiting and not self.abandoned:
                    self._stop()

    def _abandon(self, rid):
        """The wait for rid was cancelled: cancel the request, so that
        nothing is written into its buffers once the await has ended, and
        keep reading until its completion (-ECANCELED, or its result if it
        had finished) comes, to drop it and free its slot."""
        if self.finished.pop(rid, None) is not None or rid not in self.client._pending:
            return                    # polled already: nothing in flight, slot free
        try:
            self.client.cancel(rid)   # False: finished, completion not polled yet
        except Exception:             # the Client was closed: nothing in flight
            return
        self.abandoned.add(rid)
        self._start()
        # the completion of a cancelled request is ready at once
        self.loop.call_soon(self._on_readable)


def _dispatcher(client):
    loop = asyncio.get_running_loop()
    d = getattr(client, "_aio_dispatcher", None)
    if d is None or d.loop is not loop:
        d = _Dispatcher(client, loop)
        client._aio_dispatcher = d
    return d


async def wait(client, rid):
    """Await the Completion of request `rid` of `client` (a kvpool.Client)."""
    return await _dispatcher(client).wait(rid)


def _raise_call_error(comp, what):
    """Raise a whole-request failure the way the synchronous call does."""
    if comp.status in _CALL_ERRORS and (not comp.statuses or
                                        all(s == comp.status for s in comp.statuses)):
        raise make_error(comp.status, what)


class AsyncClient:
    """A kvpool.Client's data calls as coroutines, with the results of
    their synchronous twins (and their exceptions for whole-call errors).
    Several may be awaited at once (asyncio.gather): they are in flight
    together on the one connection."""

    def __init__(self, client):
        self.client = client

    async def put_many(self, keys, buffers, parents=None, retain_ms=0, flags=None):
        comp = await wait(self.client, self.client.submit_put_many(
            keys, buffers, parents, retain_ms=retain_ms, flags=flags))
        _raise_call_error(comp, "put_many")
        return comp.statuses

    async def get_into_many(self, keys, buffers):
        comp = await wait(self.client, self.client.submit_get_into_many(keys, buffers))
        _raise_call_error(comp, "get_into_many")
        return [comp.lengths[i] if s == 0 else s for i, s in enumerate(comp.statuses)]

    async def get_into(self, key, buffer):
        """The block's size; raises as Client.get_into does."""
        comp = await wait(self.client, self.client.submit_get_into(key, buffer))
        if comp.status:
            raise make_error(comp.status, "get_into")
        return comp.lengths[0]

    async def exists_many(self, keys):
        comp = await wait(self.client, self.client.submit_exists_many(keys))
        if comp.status:
            raise make_error(comp.status, "exists")
        return [s == 0 for s in comp.statuses]

    async def delete_many(self, keys):
        comp = await wait(self.client, self.client.submit_delete_many(keys))
        if comp.status:
            raise make_error(comp.status, "delete")
        return [s == 0 for s in comp.statuses]

    async def match(self, keys, lease_ms=0, wait_ms=0, want=None, retain_ms=0):
        """As Client.match; a wait (wait_ms > 0) does not block the loop."""
        return (await self.match_detail(keys, lease_ms, wait_ms, want, retain_ms)).matched

    async def match_detail(self, keys, lease_ms=0, wait_ms=0, want=None, retain_ms=0):
        """As Client.match_detail: a kvpool.MatchResult."""
        comp = await wait(self.client, self.client.submit_match(
            keys, lease_ms, wait_ms=wait_ms, want=want, retain_ms=retain_ms))
        if comp.status:
            raise make_error(comp.status, "match")
        return comp.result
