"""kvpool as LMCache's multiprocess-mode L2 adapter (KVPoolL2Plugin), on
the LMCache server daemon's command line:

    --l2-adapter '{"type": "native_plugin", "module_path": "kvpool.lmcache",
        "class_name": "KVPoolL2Plugin", "max_capacity_gb": 0,
        "adapter_params": {"url": "tcp://pool:7470", "model": "llama3-8b",
                           "kv_dtype": "bf16", "chunk_tokens": 256}}'

Keys: LMCache's key strings map to 32 bytes by SHA-256 of their UTF-8, so
ranks, object groups and salts stay apart in one namespace. The plugin
does not import LMCache. See docs/engines.md.
"""

import collections
import errno as _errno
import logging
import os
import threading
import weakref

from .._adapters import config as _cfg
from .._adapters import link as _link
from .._adapters.async_link import Completion, make_async_link
from .._adapters.keys import make_namespace, string_key
from .._adapters.link import Link, RateLimitedLog

log = logging.getLogger("kvpool.lmcache")

INTERFACE_MP = "LMCache native_plugin L2 adapter (native_plugin_l2_adapter.py @68c638a6)"
DEFAULT_LEASE_MS = 5000     # kvpoold's default max_lease_ms
_MP_KEYS = ("url", "token", "token_file", "timeout_s", "lease_ms", "namespace", "namespace_prefix",
            "model", "kv_dtype", "chunk_tokens")
_MAX_SIZES = 1 << 16        # block sizes learnt by lookups (least recently seen dropped)


def _weak_callback(method):
    """on_complete for an AsyncLink that does not keep `method`'s object
    alive (so a plugin dropped without close() is collected and closed)."""
    ref = weakref.WeakMethod(method)

    def call(c):
        fn = ref()
        if fn is not None:
            fn(c)
    return call


def _release(alinks, links, efd):
    """Close what a plugin holds (close(), or its finalizer when it is
    dropped without close())."""
    for a in alinks:
        try:
            a.close()
        except Exception:
            pass
    for link in links:
        try:
            link.close()
        except Exception:
            pass
    try:
        os.close(efd)
    except (OSError, TypeError):
        pass


def _row_of(key):
    """The (kv_rank, object group, salt) row of an MP key string
    "<model>@<kv_rank:08x>@<group:x>@<chunk hash>[@<salt>]", or the key
    itself when it does not parse (a row of its own)."""
    parts = key.split("@")
    if len(parts) >= 4:
        return (parts[0], parts[1], parts[2], "@".join(parts[4:]))
    return (key,)


# ---- multiprocess mode: the native L2 plugin -----------------------------------------

class KVPoolL2Plugin:
    """LMCache's native_plugin L2 adapter over a kvpool server.

    KVPoolL2Plugin(**adapter_params); params (all optional):
        url, token, timeout_s (2.0), lease_ms (5000),
        namespace, or model / kv_dtype / chunk_tokens / namespace_prefix
        ("lmcache-mp") from which the namespace
        <prefix>:<model>:<kv_dtype>:c<chunk_tokens> is made.

    submit_batch_{get,set,exists,delete} return a future id at once (also
    when the pool is down) and never raise; drain_completions() returns
    [(future_id, ok, error_str, result_bools)] and empties event_fd().
    Exists answers per key (LMCache's gap-keeping trim policies,
    SEGMENTED_PREFIX and SPARSE, see every key held); the leading run of
    each (kv_rank, group, salt) row is pinned by a MATCH lease until the
    get. Get is True per key whose view was filled exactly (the block's
    size is the view's size). Every key is stored as a root (no parent):
    a delete then removes exactly the keys LMCache names, so its usage
    accounting stays exact (chained keys would take their descendants with
    them, and the plugin interface can report only the keys asked).

    Settings that cannot work raise ConfigError in the constructor.
    After close(), submits still answer a future id (never completed) and
    touch no file descriptor. Threads: submit_* may be called from several
    threads while another drains.
    """

    def __init__(self, **params):
        self.params = dict(params)
        who = "kvpool.lmcache native plugin"
        _cfg.check_keys(params, _MP_KEYS, who)
        self.url = _cfg.url(params.get("url"), who)
        self.lease_ms = _cfg.milliseconds(params.get("lease_ms"), who, "lease_ms",
                                          DEFAULT_LEASE_MS)
        timeout = _cfg.seconds(params.get("timeout_s"), who, "timeout_s", 2.0)
        token = _cfg.token(params.get("token"), who, token_file=params.get("token_file"))
        ns = _cfg.text(params.get("namespace"), who, "namespace")
        if not ns:
            ns = make_namespace(
                _cfg.text(params.get("namespace_prefix"), who, "namespace_prefix", "lmcache-mp"),
                _cfg.text(params.get("model"), who, "model", "unknown-model"),
                _cfg.text(params.get("kv_dtype"), who, "kv_dtype", "unknown-dtype"),
                "c%d" % _cfg.integer(params.get("chunk_tokens"), who, "chunk_tokens", 256, 1))
        self.namespace = ns
        self.warn = RateLimitedLog(log)
        self._lock = threading.Lock()
        self._ids = 0
        self._ready = collections.deque()
        self._parts = {}          # future id -> [op, parts left, result bools, ok, err]
        self._sizes = collections.OrderedDict()   # key -> block size seen by an exists
        self._closed = False
        self._read_link = Link(self.url, ns, token=token, timeout_s=timeout,
                               name="lmcache-mp read " + ns, warn=self.warn,
                               lease_ms=self.lease_ms)
        try:
            self._write_link = Link(self.url, ns, token=token, timeout_s=timeout,
                                    name="lmcache-mp write " + ns, warn=self.warn)
        except Exception:
            self._read_link.close()
            raise
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._read = make_async_link(self._read_link, on_complete=_weak_callback(self._on_part))
        self._write = make_async_link(self._write_link,
                                      on_complete=_weak_callback(self._on_part))
        # LMCache may drop a plugin without close(): its connections,
        # threads and event fd go with it
        self._finalizer = weakref.finalize(self, _release, (self._read, self._write),
                                           (self._read_link, self._write_link), self._efd)

    # ---- completions -----------------------------------------------------------------

    def event_fd(self):
        """An fd readable while completions wait for drain_completions()
        (-1 after close())."""
        return -1 if self._efd is None else self._efd

    def _new_future(self, op, n, parts):
        with self._lock:
            self._ids += 1
            fid = self._ids
            self._parts[fid] = [op, parts, [False] * n, True, ""]
        return fid

    def _finish(self, fid):
        """Move future fid to the ready list; the caller holds _lock. After
        close() the future is dropped: its fd is gone."""
        op, _, bools, ok, err = self._parts.pop(fid)
        if self._efd is None:
            return
        self._ready.append((fid, ok, err, bools))
        os.eventfd_write(self._efd, 1)

    def _fail_now(self, op, n, err):
        fid = self._new_future(op, n, 1)
        with self._lock:
            st = self._parts[fid]
            st[3], st[4] = False, err
            self._finish(fid)
        return fid

    def _on_part(self, c):
        """An AsyncLink completion: c.tag = (future id, positions, what)."""
        fid, positions, what = c.tag[:3]
        if what == "exists":
            self._remember_sizes(c)
        with self._lock:
            st = self._parts.get(fid)
            if st is None:
                return
            try:
                self._merge(st, c, positions, what)
            except Exception as e:        # never leave a future without completion
                st[3], st[4] = False, repr(e)
            st[1] -= 1
            if st[1] == 0:
                self._finish(fid)

    @staticmethod
    def _merge(st, c, positions, what):
        """Fold one part's completion into future state st; caller holds _lock."""
        bools = st[2]
        if what in ("exists", "exists-run"):
            # the leased leading run (MATCH), or per key (a size query: a GET
            # with no room answers -EMSGSIZE and the block's size, sending
            # nothing): a key is there if either says so
            for j, pos in enumerate(positions):
                if what == "exists-run":
                    bools[pos] = bools[pos] or j < c.matched
                elif j < len(c.statuses) and c.statuses[j] in (0, -_errno.EMSGSIZE):
                    bools[pos] = True
            if c.status and c.status not in (_link.MISS, -_errno.EMSGSIZE):
                st[3], st[4] = False, _link.strerror_of(c.status)
        elif what == "get":
            sizes = c.tag[3]
            for j, pos in enumerate(positions):
                bools[pos] = (c.statuses[j] == 0 and j < len(c.lengths)
                              and c.lengths[j] == sizes[j])
            if not all(bools[p] for p in positions):
                st[3] = False
                st[4] = st[4] or _link.strerror_of(
                    next((s for s in c.statuses if s), -_errno.EMSGSIZE))
        else:   # set, delete
            for j, pos in enumerate(positions):
                bools[pos] = c.statuses[j] == 0 or (what == "delete" and
                                                    c.statuses[j] == _link.MISS)
            if not all(bools[p] for p in positions):
                st[3] = False
                st[4] = st[4] or _link.strerror_of(next(s for s in c.statuses if s))

    def _remember_sizes(self, c):
        """Keep the block sizes a size query reported (tag[3]: its keys),
        so the get that follows can refuse a view of another size."""
        keys = c.tag[3] if len(c.tag) > 3 else ()
        with self._lock:
            for j, k in enumerate(keys):
                s = c.statuses[j] if j < len(c.statuses) else None
                n = c.lengths[j] if j < len(c.lengths) else 0
                if s in (0, -_errno.EMSGSIZE) and n:
                    self._sizes[k] = n
                    self._sizes.move_to_end(k)
                else:
                    self._sizes.pop(k, None)
            while len(self._sizes) > _MAX_SIZES:
                self._sizes.popitem(last=False)

    def drain_completions(self):
        """Every finished future: [(future_id, ok, error_str, result_bools)]."""
        with self._lock:
            out = list(self._ready)
            self._ready.clear()
            if self._efd is not None:
                try:
                    os.eventfd_read(self._efd)
                except (BlockingIOError, OSError):
                    pass
        return out

    # ---- submissions -------------------------------------------------------------------

    def _keys(self, keys):
        for k in keys:
            if not isinstance(k, (str, bytes)):
                raise TypeError("a key must be a string, not %s" % type(k).__name__)
        return [string_key(k) for k in keys]

    @staticmethod
    def _count(keys):
        try:
            return len(keys)
        except TypeError:
            return 0

    def submit_batch_exists(self, keys):
        """Future id; its bools: per key, whether the pool holds it."""
        try:
            if self._closed:
                return self._fail_now("exists", self._count(keys), "closed")
            keys = list(keys)
            rows = collections.OrderedDict()
            for i, k in enumerate(keys):
                rows.setdefault(_row_of(k), []).append(i)
            ks = self._keys(keys)
            fid = self._new_future("exists", len(keys), 2 * len(rows) or 1)
            if not rows:
                with self._lock:
                    self._finish(fid)
                return fid
            for positions in rows.values():
                row = [ks[i] for i in positions]
                self._submit(self._read, "submit_match", fid, positions, "exists-run", row,
                             self.lease_ms)
                # each key's presence and size, with no bytes sent
                self._submit(self._read, "submit_get_into_many", fid, positions, "exists",
                             row, [bytearray(0) for _ in row], extra=row)
            return fid
        except Exception as e:
            self.warn.warning("exists", "kvpool.lmcache: submit_batch_exists: %r", e)
            return self._fail_now("exists", self._count(keys), repr(e))

    def _submit(self, alink, method, fid, positions, what, *args, sizes=None, extra=None):
        """One part of future fid; a refused submission fails that part.
        The tag is (fid, positions, what[, sizes or extra])."""
        tag = (fid, positions, what) if sizes is None and extra is None else \
            (fid, positions, what, sizes if sizes is not None else extra)
        try:
            getattr(alink, method)(*args, tag=tag)
        except Exception as e:
            n = len(positions)
            self._on_part(Completion(0, tag, what, -_errno.EAGAIN, [-_errno.EAGAIN] * n,
                                     [0] * n, 0))
            self.warn.warning("submit", "kvpool.lmcache: %s refused: %r", what, e)

    def submit_batch_get(self, keys, views):
        """Future id; its bools: True where views[i] was filled exactly."""
        try:
            if self._closed:
                return self._fail_now("get", self._count(keys), "closed")
            keys, views = list(keys), list(views)
            if len(views) != len(keys):
                return self._fail_now("get", len(keys), "%d keys but %d views"
                                      % (len(keys), len(views)))
            if not keys:
                return self._empty("get")
            ks = self._keys(keys)
            sizes = [memoryview(v).nbytes for v in views]
            # a block whose size a lookup reported and that differs from its
            # view is refused here, so the view is left untouched
            with self._lock:
                known = [self._sizes.get(k) for k in ks]
            go = [i for i in range(len(ks)) if known[i] is None or known[i] == sizes[i]]
            fid = self._new_future("get", len(keys), 1)
            if len(go) < len(ks):
                with self._lock:
                    st = self._parts[fid]
                    st[3], st[4] = False, _link.strerror_of(-_errno.EMSGSIZE)
            if not go:
                with self._lock:
                    self._finish(fid)
                return fid
            self._submit(self._read, "submit_get_into_many", fid, go, "get",
                         [ks[i] for i in go], [views[i] for i in go],
                         sizes=[sizes[i] for i in go])
            return fid
        except Exception as e:
            self.warn.warning("get", "kvpool.lmcache: submit_batch_get: %r", e)
            return self._fail_now("get", self._count(keys), repr(e))

    def _empty(self, op):
        fid = self._new_future(op, 0, 1)
        with self._lock:
            self._finish(fid)
        return fid

    def submit_batch_set(self, keys, views):
        """Future id; its bools: True where the object is stored (or
        already was). Every key is a root (see the class comment)."""
        try:
            if self._closed:
                return self._fail_now("set", self._count(keys), "closed")
            keys, views = list(keys), list(views)
            if len(views) != len(keys):
                return self._fail_now("set", len(keys), "%d keys but %d views"
                                      % (len(keys), len(views)))
            if not keys:
                return self._empty("set")
            ks = self._keys(keys)
            fid = self._new_future("set", len(keys), 1)
            self._submit(self._write, "submit_put_many", fid, list(range(len(keys))), "set",
                         ks, views, None)
            return fid
        except Exception as e:
            self.warn.warning("set", "kvpool.lmcache: submit_batch_set: %r", e)
            return self._fail_now("set", self._count(keys), repr(e))

    def submit_batch_delete(self, keys):
        """Future id; deleting a key the pool does not hold is a success.
        Exactly the keys named are removed."""
        try:
            if self._closed:
                return self._fail_now("delete", self._count(keys), "closed")
            keys = list(keys)
            if not keys:
                return self._empty("delete")
            ks = self._keys(keys)
            with self._lock:
                for k in ks:
                    self._sizes.pop(k, None)
            fid = self._new_future("delete", len(keys), 1)
            self._submit(self._write, "submit_delete_many", fid, list(range(len(keys))),
                         "delete", ks)
            return fid
        except Exception as e:
            self.warn.warning("delete", "kvpool.lmcache: submit_batch_delete: %r", e)
            return self._fail_now("delete", self._count(keys), repr(e))

    def close(self):
        """Finish what is queued, close the connections and the event fd.
        Idempotent; later submits touch no fd. A plugin dropped without
        close() is closed when it is collected."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer.detach()
        for a in (self._read, self._write):
            a.close()
        for link in (self._read_link, self._write_link):
            link.close()
        with self._lock:
            efd, self._efd = self._efd, None
            self._ready.clear()
            self._sizes.clear()
        try:
            os.close(efd)
        except (OSError, TypeError):
            pass


__all__ = ["KVPoolL2Plugin", "INTERFACE_MP"]
