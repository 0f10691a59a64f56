"""The vLLM connector's asynchronous worker paths (kvpool.vllm.connector).

- StorePipeline, the save path, off the step: wait_for_save hands it each
  store batch (a request's chunks complete after this step, their buffers
  and their parent). It asks the pool with one MATCH how many leading
  chunks it already holds (extending their retention when retain_ms is
  asked) and PUTs the rest, chained, through the adapter's asynchronous
  link on a connection of its own (libkvpool's asynchronous API when the
  binding has it: kvpool._adapters.async_link). A StoreLedger counts each
  request's batches in flight and done: the done counts go back to the
  scheduler (KVPoolWorkerMetadata.done), which frees a finished request's
  blocks at once when every batch is acknowledged and otherwise holds
  them until each worker reports the request as finished sending.
- Receiver, the load path of a prefill-to-decode hand-off: each job is
  one request's chunks. A thread of a small pool sends one MATCH that
  waits (up to the job's deadline) for the leading `want` chunks and
  leases them, then GETs the run present on the same connection, and
  copies staged bytes into the request's blocks. One connection per
  thread: a parked MATCH holds up its connection's later requests. The
  job is handed back (finished receiving) with the block ids that did not
  arrive, which vLLM's kv_load_failure_policy then decides about.

Neither raises into vLLM: a pool that is down completes every store batch
as failed (its blocks are freed all the same: the producer never waits
for anyone) and every load job as missing. Internal: the names may change.
"""

import collections
import logging
import threading
import time

from .._adapters import link as _link
from .._adapters.async_link import make_async_link

log = logging.getLogger("kvpool.vllm")

# calls a store batch makes at most, each bounded by the link's timeout from
# its submit: the MATCH, the PUT, and a PUT again as a root (-ENOLINK)
STORE_CALLS = 3


class StagingRows:
    """Host rows of `size` bytes for the chunks that go through staging
    (KV caches in GPU memory, HND layouts, null blocks), one per chunk of a
    store batch or load job, returned when it completes. Pinned when CUDA
    is there. At most `limit_bytes` exist: take() answers None beyond
    (the caller then skips the batch: reuse is lost, no request fails).
    Thread-safe."""

    def __init__(self, size, limit_bytes):
        self.size = int(size)
        self.limit = max(1, int(limit_bytes) // max(self.size, 1))
        self._free = []
        self._made = 0
        self._lock = threading.Lock()
        self._pin = None

    def take(self, n):
        """n rows (uint8 tensors of `size` bytes), or None when the limit
        would be passed."""
        import torch
        with self._lock:
            if n > len(self._free) + self.limit - self._made:
                return None
            out = [self._free.pop() for _ in range(min(n, len(self._free)))]
            need = n - len(out)
            self._made += need
        if self._pin is None:
            self._pin = bool(getattr(torch, "cuda", None) and torch.cuda.is_available())
        out.extend(torch.empty(self.size, dtype=torch.uint8, pin_memory=self._pin)
                   for _ in range(need))
        return out

    def give(self, rows):
        if rows:
            with self._lock:
                self._free.extend(rows)


class StoreLedger:
    """Per request: store batches in flight, batches done (cumulative), and
    the done counts not yet reported to the scheduler. Thread-safe; wait()
    lets a caller wait for requests to have nothing in flight."""

    def __init__(self):
        self._cv = threading.Condition()
        self._inflight = collections.Counter()
        self._done = collections.Counter()
        self._report = {}

    def begin(self, req_id):
        with self._cv:
            self._inflight[req_id] += 1

    def end(self, req_id, began=True):
        """A batch of req_id is done (began=False: one that never started,
        e.g. nothing to store on this worker)."""
        with self._cv:
            if began:
                self._inflight[req_id] -= 1
                if self._inflight[req_id] <= 0:
                    del self._inflight[req_id]
            self._done[req_id] += 1
            self._report[req_id] = self._done[req_id]
            self._cv.notify_all()

    def busy(self, req_id):
        with self._cv:
            return self._inflight.get(req_id, 0) > 0

    def in_flight(self):
        with self._cv:
            return sum(self._inflight.values())

    def report(self):
        """{req_id: batches done} changed since the last call."""
        with self._cv:
            out, self._report = self._report, {}
        return out

    def forget(self, req_id):
        """Drop a finished request's counts (nothing of it in flight)."""
        with self._cv:
            if not self._inflight.get(req_id):
                self._done.pop(req_id, None)
                self._report.pop(req_id, None)

    def wait(self, req_ids=None, timeout_s=5.0):
        """Wait until req_ids (None: every request) have nothing in flight;
        True if so within timeout_s."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while True:
                pending = [r for r in (self._inflight if req_ids is None else req_ids)
                           if self._inflight.get(r)]
                left = end - time.monotonic()
                if not pending:
                    return True
                if left <= 0:
                    return False
                self._cv.wait(left)


class _Batch:
    __slots__ = ("req_id", "keys", "bufs", "parent", "rows", "retain_ms", "rows_pool")

    def __init__(self, req_id, keys, bufs, parent, rows, retain_ms, rows_pool):
        self.req_id, self.keys, self.bufs, self.parent = req_id, keys, bufs, parent
        self.rows, self.retain_ms, self.rows_pool = rows, retain_ms, rows_pool


class StorePipeline:
    """Store batches through an asynchronous link (see the module doc).

    StorePipeline(link, ledger, warn): link is a kvpool._adapters Link of
    the pipeline's own (its connection carries nothing else); ledger the
    worker's StoreLedger. submit() returns at once; the batch's buffers
    (views of the KV cache, or staging rows) must stay untouched until the
    ledger says the request has nothing in flight. Thread-safe."""

    def __init__(self, link, ledger, warn):
        self.link = link
        self.ledger = ledger
        self.warn = warn
        self.chunks_put = 0          # chunks sent (the pool lacked them)
        self.chunks_held = 0         # chunks the pool held already
        self.chunks_failed = 0       # chunks not stored (pool down, full, refused)
        self.batches = 0             # batches submitted (one MATCH each)
        self._alink = make_async_link(link, on_complete=self._complete)

    def submit(self, req_id, keys, bufs, parent, rows=None, rows_pool=None, retain_ms=0):
        """Store keys[i] from bufs[i] (keys[0]'s parent: `parent`), skipping
        the leading run the pool holds. rows (staging rows) go back to
        rows_pool when the batch is done."""
        b = _Batch(req_id, list(keys), list(bufs), parent, rows, retain_ms, rows_pool)
        self.ledger.begin(req_id)
        self.batches += 1
        try:
            self._alink.submit_match(b.keys, 0, tag=b, retain_ms=retain_ms)
        except Exception as e:         # Busy (too many in flight) or closed
            self.warn.warning("store-submit", "kvpool.vllm: store of %d chunks not sent: %s",
                              len(b.keys), e)
            self._finish(b, failed=len(b.keys))

    def _complete(self, c):
        """The asynchronous link's completion callback (its own thread)."""
        b = c.tag
        try:
            if c.op == "match":
                if c.status:
                    self._finish(b, failed=len(b.keys), status=c.status)
                    return
                m = min(int(c.matched), len(b.keys))
                self.chunks_held += m
                if m == len(b.keys):
                    self._finish(b)
                    return
                idx = range(m, len(b.keys))
                parents = [b.keys[i - 1] if i > 0 else b.parent for i in idx]
                self._alink.submit_put_many([b.keys[i] for i in idx], [b.bufs[i] for i in idx],
                                            parents, tag=b, retain_ms=b.retain_ms)
                return
            bad = [s for s in c.statuses if s]
            self.chunks_put += len(c.statuses) - len(bad)
            self._finish(b, failed=len(bad), status=bad[0] if bad else 0)
        except Exception as e:
            self.warn.warning("store-complete", "kvpool.vllm: store completion: %r", e)
            self._finish(b, failed=len(b.keys))

    def _finish(self, b, failed=0, status=0):
        if failed:
            self.chunks_failed += failed
            self.warn.warning("store", "kvpool.vllm: %d of %d chunks not stored (%s)", failed,
                              len(b.keys), _link.strerror_of(status) if status else "not sent")
        if b.rows and b.rows_pool is not None:
            b.rows_pool.give(b.rows)
        b.bufs = b.rows = None
        self.ledger.end(b.req_id)

    def close(self, timeout_s=5.0):
        """Wait (up to timeout_s) for the batches in flight, then stop."""
        self.ledger.wait(None, timeout_s)
        self._alink.close()


class _Job:
    __slots__ = ("req_id", "keys", "chunks", "deadline", "want", "cut")

    def __init__(self, req_id, keys, chunks, deadline, cut=False):
        self.req_id, self.keys, self.chunks, self.deadline = req_id, keys, chunks, deadline
        self.want = len(keys)
        self.cut = cut           # the wait was cut short by the prefill's params


class Receiver:
    """Load jobs that wait for their blocks (see the module doc).

    Receiver(conn, wait_ms, max_waits): conn is the worker's
    KVPoolConnector (it makes the connections and owns the buffers and
    the copies into blocks). submit() returns at once; take() hands back
    the jobs done since the last call as (req_ids, failed block ids).
    Thread-safe."""

    def __init__(self, conn, wait_ms, max_waits):
        self.conn = conn
        self.wait_ms = int(wait_ms)
        self.max_waits = max(1, int(max_waits))
        self._cv = threading.Condition()
        self._jobs = collections.deque()
        self._threads = []
        self._idle = 0
        self._done = []
        self._closed = False
        self.jobs = 0                # jobs taken
        self.complete = 0            # jobs that loaded every chunk they wanted
        self.short = 0               # jobs that loaded fewer (the rest is reported)
        self.waited = 0              # jobs whose MATCH the server parked
        self.timed_out = 0           # ... and answered on its wait_ms
        self.refused = 0             # ... answered without waiting (a server limit)
        self.cut = 0                 # jobs whose wait the prefill's params cut short

    def submit(self, req_id, keys, chunks, wait_ms=None):
        """Queue a job that waits up to wait_ms (None or more than the
        Receiver's wait_ms: that) for its chunks, counted from now."""
        wait = self.wait_ms if wait_ms is None else max(0, min(int(wait_ms), self.wait_ms))
        job = _Job(req_id, list(keys), list(chunks), time.monotonic() + wait / 1000.0,
                   cut=wait < self.wait_ms)
        with self._cv:
            if self._closed:
                self._done.append((req_id, self.conn._blocks_of(chunks)))
                return
            self.jobs += 1
            self.cut += job.cut
            self._jobs.append(job)
            # one thread per job waiting to start (a job must not queue behind
            # another's wait), up to max_waits
            if len(self._jobs) > self._idle and len(self._threads) < self.max_waits:
                t = threading.Thread(target=self._run, daemon=True,
                                     name="kvpool-pd-recv-%d" % len(self._threads))
                self._threads.append(t)
                t.start()
            self._cv.notify()

    def take(self):
        """([req_id], set of failed block ids) of the jobs done since the
        last call."""
        with self._cv:
            done, self._done = self._done, []
        failed = set()
        for _, blocks in done:
            failed.update(blocks)
        return [r for r, _ in done], failed

    def _run(self):
        link = None
        try:
            while True:
                with self._cv:
                    self._idle += 1
                    self._cv.wait_for(lambda: self._jobs or self._closed)
                    self._idle -= 1
                    if not self._jobs:
                        return
                    job = self._jobs.popleft()
                failed = None
                try:
                    if link is None:
                        link = self.conn._pd_link()
                    failed = self._serve(link, job)
                except Exception as e:
                    self.conn.warn.warning("pd-recv", "kvpool.vllm: hand-off load of %s: %r",
                                           job.req_id, e)
                finally:
                    if failed is None:
                        failed = self.conn._blocks_of(job.chunks)
                    with self._cv:
                        self._done.append((job.req_id, failed))
        finally:
            if link is not None:
                link.close()

    def _serve(self, link, job):
        """One MATCH that waits, the GET of the run present, the copies into
        blocks; returns the block ids that did not arrive."""
        import kvpool
        conn = self.conn
        n = len(job.keys)
        wait = max(0, int((job.deadline - time.monotonic()) * 1000))
        def wait_match(c):
            try:
                return c.match_detail(job.keys, lease_ms=conn.lease_ms, wait_ms=wait,
                                      want=job.want)
            except kvpool.QuotaExceeded:
                # the lease bound (a kvpoold without the lease cut): wait
                # unleased; the GET follows at once on this connection
                link._bound("hand-off wait", n, None)
                return c.match_detail(job.keys, lease_ms=0, wait_ms=wait, want=job.want)
        r = link.call("hand-off wait", wait_match, None)
        m = min(int(r.matched), n) if r is not None else 0
        if r is not None and r.flags & kvpool.MATCH_LEASE_CUT:
            # the lease bound cut the leased run: the rest is there, unleased;
            # the GET follows at once on this connection
            link._bound("hand-off wait", r.present, r.matched)
            m = min(int(r.present), n)
        if r is not None:
            if r.flags & kvpool.MATCH_WAITED:
                self.waited += 1
            if r.flags & kvpool.MATCH_WAIT_TIMEOUT:
                self.timed_out += 1
            if r.flags & kvpool.MATCH_WAIT_REFUSED:
                self.refused += 1
                conn.warn.warning("pd-refused", "kvpool.vllm: the pool answered a hand-off "
                                  "wait without waiting (max_conn_match_waits, "
                                  "tenant_max_match_waits or max_match_wait_bytes reached): %d of %d chunks present",
                                  m, n)
        loaded = conn._receive(link, job.keys[:m], job.chunks[:m]) if m else set()
        if len(loaded) == n:
            self.complete += 1
        else:
            self.short += 1
            if job.cut and r is not None:
                conn.warn.warning("pd-gone", "kvpool.vllm: a hand-off found %d of the %d "
                                  "chunks its prefill instance had stored, after waiting as "
                                  "long as its PUTs could take: evicted or lost before the "
                                  "decode side came (pd_retain_ms on the prefill instance "
                                  "retains them); the rest is recomputed", m, n)
        return conn._blocks_of([c for i, c in enumerate(job.chunks) if i not in loaded])

    def close(self):
        """Stop the threads once their current job is done (a waiting MATCH
        ends by its deadline); the jobs not started are reported failed."""
        with self._cv:
            self._closed = True
            left, self._jobs = list(self._jobs), collections.deque()
            for job in left:
                self._done.append((job.req_id, self.conn._blocks_of(job.chunks)))
            self._cv.notify_all()
