"""What the engine adapters decide beyond moving bytes: how long a stored
block should stay (retention hints) and whether a hit is worth loading
(the load estimator). Shared by kvpool.sglang, kvpool.vllm and
kvpool.lmcache; nothing here imports an engine or touches the network.

Retention hints (issue 29, docs/engines.md "Retention"): an adapter's
extra configuration may ask that the first `retain_first_blocks` blocks
of every chain (the system prompt every request starts with) be stored
with `retain_ms`, and a request may carry its own retention where the
engine forwards one (which field, per engine: docs/engines.md). The
server caps every retention (max_retain_ms) and bounds it by a budget:
a retention refused is not an error, the block is stored all the same.

The load estimator (issue 29 item 5): loading a hit pays when moving its
bytes takes less time than recomputing its tokens. An adapter keeps a
running estimate of the seconds per byte its own GETs take and of the
engine's prefill cost (configured as `prefill_tokens_per_s`, or fitted
from the prefills the engine reports where it exposes them), and offers
only the part of a hit whose load is expected to win - all of it in the
common case (a pool faster than prefill), none of it on a pool slowed
far below the engine. Without a prefill figure it offers every hit.

Internal: the names may change.
"""

import collections
import logging
import math
import threading
import time

from . import config as _cfg

log = logging.getLogger("kvpool.engines")

# The per-request field names an adapter reads (docs/engines.md).
VLLM_REQUEST_FIELD = "kvpool_retain_ms"          # in a request's kv_transfer_params
LMCACHE_REQUEST_FIELD = "lmcache.kvpool.retain_ms"  # ditto, passed on by LMCache
SGLANG_EXTRA_INFO_FIELD = "retain_ms"            # HiCacheStorageExtraInfo.extra_info


class RetainHints:
    """Which retention to ask for each block an adapter stores.

    RetainHints(cfg, owner): cfg is the adapter's extra configuration;
    `retain_first_blocks` (blocks, >= 0, default 0) and `retain_ms` (ms,
    0..2^32-1, default 0) must both be set for the first-blocks hint.
    `request_retain` (default false) lets a request's own retention (see
    the module doc) apply: the field comes from the end user's request
    body, so honouring it lets any API caller spend the engine's retention
    budget, which the operator opts into; `request_retain_max_ms` (ms,
    1..2^32-1; unset: only the server's max_retain_ms) caps what one
    request may ask. A value that cannot work raises ConfigError.

    Thread rules: any thread may call (refresh_due takes a lock).
    """

    REFRESH_HEADS = 4096    # chain heads whose last refresh is remembered

    def __init__(self, cfg, owner):
        self.first_blocks = _cfg.integer(cfg.get("retain_first_blocks"), owner,
                                         "retain_first_blocks", 0, 0)
        self.retain_ms = _cfg.milliseconds(cfg.get("retain_ms"), owner, "retain_ms", 0)
        self.per_request = _cfg.flag(cfg.get("request_retain"), owner, "request_retain", False)
        cap = cfg.get("request_retain_max_ms")
        self.request_max_ms = None if cap is None else _cfg.integer(
            cap, owner, "request_retain_max_ms", 0, 1, 0xFFFFFFFF)
        if bool(self.first_blocks) != bool(self.retain_ms):
            raise _cfg.ConfigError("%s: retain_first_blocks (%d) and retain_ms (%d) go together: "
                                   "set both to retain the first blocks of every chain, or "
                                   "neither" % (owner, self.first_blocks, self.retain_ms))
        if self.request_max_ms is not None and not self.per_request:
            raise _cfg.ConfigError("%s: request_retain_max_ms caps the retention requests ask "
                                   "for, which only request_retain true honours: set "
                                   "request_retain true too, or drop request_retain_max_ms"
                                   % owner)
        self._warned = False
        self._refreshed = collections.OrderedDict()   # chain head -> monotonic s
        self._lock = threading.Lock()

    @property
    def active(self):
        """Could any block be retained (a hint, or per-request ones)?"""
        return bool(self.first_blocks) or self.per_request

    def request_ms(self, value):
        """A request's own retention as the engine handed it (None: none,
        or request_retain is off): whole ms in 0..2^32-1, cut to
        request_retain_max_ms; anything else is ignored, logged once (a
        request never fails for it)."""
        if value is None or not self.per_request:
            return None
        try:
            v = _cfg.milliseconds(value, "request", "retain_ms")
        except _cfg.ConfigError as e:
            if not self._warned:
                self._warned = True
                log.warning("kvpool: a request's retention is ignored: %s", e)
            return None
        if self.request_max_ms is not None:
            v = min(v, self.request_max_ms)
        return v

    def for_blocks(self, first_index, count, request_ms=None):
        """retain_ms for `count` blocks whose first is block `first_index`
        of its chain (0 = the chain's first block): per block the larger
        of the request's own retention (request_ms, None: none) and the
        first-blocks hint (retain_ms for the chain's first
        retain_first_blocks blocks, else 0), so that a request never
        takes the operator's hint away. A list of ints."""
        req = request_ms or 0
        return [max(req, self.retain_ms if i < self.first_blocks else 0)
                for i in range(first_index, first_index + count)]

    def refresh_due(self, head):
        """Whether to refresh the first-blocks retention of the chain whose
        first blocks end with key `head` now (a MATCH of those blocks with
        retain_ms): True at most once per retain_ms / 2 per head, so that
        a prompt hit many times a second costs one small MATCH per half
        retention, and the retention never lapses while hits keep coming.
        False when there is no first-blocks hint. The last REFRESH_HEADS
        heads are remembered (least recently refreshed forgotten first)."""
        if not self.first_blocks:
            return False
        now = time.monotonic()
        with self._lock:
            last = self._refreshed.get(head)
            if last is not None and now - last < self.retain_ms / 2000.0:
                return False
            self._refreshed[head] = now
            self._refreshed.move_to_end(head)
            while len(self._refreshed) > self.REFRESH_HEADS:
                self._refreshed.popitem(last=False)
            return True


class LoadEstimator:
    """When loading a hit pays.

    Loading x bytes is modelled as c0 + c1 x: a fixed cost per call (round
    trips, the MATCH before it, the adapter's own work) plus a cost per
    byte, fitted by weighted least squares to the adapter's own GETs (the
    last SAMPLES of them, each weighing DECAY times the one after it, so
    that one slow GET after fast ones moves the model most of the way at
    once). While the GETs measured are all of about one size the two terms
    cannot be told apart: a hit of another size x is then known only to
    load in between t0 min(1, x / x0) and t0 max(1, x / x0) (x0, t0: the
    measured size and time), and a hit that might pay within those bounds
    is offered, which measures a second size. A GET that fails or times
    out (record_failed_load) counts as a load of at least the call's
    timeout: a pool that does not answer in time is a slow pool.

    Prefilling tokens p0..p1 (p0 of them already cached) is modelled as
    a x (p1 - p0) + b x (p1^2 - p0^2) / 2: a per token (matmuls) plus b
    per token per earlier token (attention). `prefill_tokens_per_s` in
    the configuration sets a = 1 / it (b = 0); prefills the engine reports
    (record_prefill, where it exposes them) are fitted by least squares
    instead (a, b >= 0, the last SAMPLES of them). Loading the k tokens of
    a hit is offered when its time is below a k + b k^2 / 2. Both costs
    grow with every block, so the offer is the whole hit or nothing.

    Until a load has been measured the whole hit is offered (it must be
    measured); without any prefill figure, always. An adapter that
    declines keeps offering one hit in PROBE_EVERY, so that a pool that
    got fast again is noticed. Thread-safe.
    """

    PROBE_EVERY = 8
    SAMPLES = 32
    DECAY = 0.5               # weight of a load sample relative to the next one
    SAME_SIZE = 1.25          # loads within this ratio of sizes count as one size
    MIN_PREFILL_TOKENS = 64   # shorter computes are the LM head and fixed costs

    def __init__(self, prefill_tokens_per_s=None):
        self.loads = []           # (bytes, seconds), oldest first
        self.c0 = self.c1 = None  # the fitted load model (None: not determined)
        self.prefills = []
        self.a = 1.0 / prefill_tokens_per_s if prefill_tokens_per_s else None
        self.b = 0.0 if prefill_tokens_per_s else None
        self.skipped = 0
        self.offered = self.declined = self.probes = 0
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg, owner):
        """From an adapter's extra configuration: `prefill_tokens_per_s`
        (> 0; unset: offer every hit, nothing is estimated; "" is refused
        like any other value that is not a speed)."""
        v = cfg.get("prefill_tokens_per_s")
        if v is None:
            return cls(None)
        try:
            rate = float(v) if not isinstance(v, bool) else float("nan")
        except (TypeError, ValueError):
            rate = float("nan")
        if not math.isfinite(rate) or rate <= 0:
            raise _cfg.ConfigError("%s: prefill_tokens_per_s must be a number of tokens per "
                                   "second > 0 (the engine's prefill speed), not %r" % (owner, v))
        return cls(rate)

    @property
    def enabled(self):
        return self.a is not None

    @property
    def s_per_byte(self):
        """The measured loads' seconds per byte, all costs included (their
        total time over their total bytes, recent ones weighing most), or
        None before the first."""
        with self._lock:
            if not self.loads:
                return None
            w, sx, st = self._sums()[:3]
            return st / sx

    def record_load(self, nbytes, seconds):
        """A GET of nbytes took `seconds` (a whole, successful one)."""
        if nbytes <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        with self._lock:
            self.loads = (self.loads + [(float(nbytes), float(seconds))])[-self.SAMPLES:]
            self._fit_loads()

    def record_failed_load(self, nbytes, seconds, timeout_s):
        """A GET of nbytes failed or timed out after `seconds`; the call's
        timeout was timeout_s: it counts as a load of max(seconds,
        timeout_s). (A block that was simply not there is no evidence of
        the pool's speed: do not record that.)"""
        if timeout_s is None or not math.isfinite(timeout_s):
            timeout_s = 0.0
        self.record_load(nbytes, max(seconds if math.isfinite(seconds) else 0.0, timeout_s))

    def _sums(self):
        n = len(self.loads)
        w = sx = st = sxx = sxt = 0.0
        for i, (x, t) in enumerate(self.loads):
            k = self.DECAY ** (n - 1 - i)
            w += k
            sx += k * x
            st += k * t
            sxx += k * x * x
            sxt += k * x * t
        return w, sx, st, sxx, sxt

    def _fit_loads(self):
        """t = c0 + c1 x, weighted, c0, c1 >= 0; left undetermined (None)
        while the loads are all of about one size."""
        xs = [x for x, _ in self.loads]
        self.c0 = self.c1 = None
        if max(xs) < self.SAME_SIZE * min(xs):
            return
        w, sx, st, sxx, sxt = self._sums()
        det = w * sxx - sx * sx
        if det <= 0:
            return
        c1 = (w * sxt - sx * st) / det
        c0 = (st - c1 * sx) / w
        if c1 < 0:                       # noise: all of it fixed cost
            c0, c1 = st / w, 0.0
        elif c0 < 0:                     # all of it per byte
            c0, c1 = 0.0, sxt / sxx
        self.c0, self.c1 = c0, c1

    def _load_bounds(self, x):
        """(lowest, highest) seconds expected to load x bytes, or None
        before any load was measured (lock held)."""
        if not self.loads:
            return None
        if self.c0 is not None:
            t = self.c0 + self.c1 * x
            return t, t
        w, sx, st = self._sums()[:3]
        x0, t0 = sx / w, st / w
        r = x / x0
        return t0 * min(1.0, r), t0 * max(1.0, r)

    def load_s(self, nbytes):
        """Expected seconds to load nbytes (the middle of the bounds while
        only one size was measured), or None before the first load."""
        with self._lock:
            lohi = self._load_bounds(nbytes)
        return None if lohi is None else (lohi[0] + lohi[1]) / 2

    def record_prefill(self, tokens, seconds, context_tokens):
        """The engine prefilled `tokens` ending at position context_tokens
        in `seconds`."""
        if tokens < self.MIN_PREFILL_TOKENS or seconds <= 0 or context_tokens < tokens:
            return
        with self._lock:
            self.prefills = (self.prefills +
                             [(context_tokens - tokens, context_tokens, seconds)])[-self.SAMPLES:]
            self._fit()

    def _fit(self):
        """seconds = a x + b y, x = p1 - p0, y = (p1^2 - p0^2) / 2."""
        rows = [(p1 - p0, (p1 * p1 - p0 * p0) / 2.0, t) for p0, p1, t in self.prefills]
        sxx = sum(x * x for x, _, _ in rows)
        sxy = sum(x * y for x, y, _ in rows)
        syy = sum(y * y for _, y, _ in rows)
        sxt = sum(x * t for x, _, t in rows)
        syt = sum(y * t for _, y, t in rows)
        det = sxx * syy - sxy * sxy
        a = b = None
        if det > 1e-12 * sxx * syy:
            a = (sxt * syy - syt * sxy) / det
            b = (syt * sxx - sxt * sxy) / det
        if a is None or a < 0 or b < 0:   # one shape of prompt, or noise: no attention term
            a, b = sxt / sxx, 0.0
        self.a, self.b = a, b

    def compute_s(self, tokens):
        """Predicted seconds to prefill tokens 0..tokens (None: unknown)."""
        if self.a is None:
            return None
        return self.a * tokens + self.b * tokens * tokens / 2

    def decide(self, matched, block_bytes, block_tokens):
        """(blocks to load, why) for a hit of `matched` blocks of
        block_bytes bytes (0 or None: not known yet, offered to learn it)
        and block_tokens tokens each."""
        with self._lock:
            if matched <= 0:
                return 0, "miss"
            if self.a is None:
                return matched, "no prefill figure"
            lohi = self._load_bounds(matched * block_bytes) if block_bytes else None
            if lohi is None:
                self.offered += 1
                return matched, "learning"
            compute = self.compute_s(matched * block_tokens)
            if lohi[1] < compute:
                self.skipped = 0
                self.offered += 1
                return matched, "load pays"
            if lohi[0] < compute:        # may pay: measuring it settles the model
                self.offered += 1
                return matched, "learning"
            self.skipped += 1
            if self.skipped % self.PROBE_EVERY == 0:
                self.probes += 1
                return matched, "probe"
            self.declined += 1
            return 0, "recompute pays"

    def wants_lease(self, most, block_bytes, block_tokens):
        """False when a hit of any length 1..most blocks would be declined
        now, and the next decline is not a probe: the adapter then MATCHes
        without a lease (a hit it will not load must not pin blocks, or
        count against the server's lease bounds). True otherwise, and
        whenever the estimator is off. A hit offered after all (another
        thread's load changed the model meanwhile) must be leased by a
        second MATCH."""
        if self.a is None or most <= 0 or not block_bytes:
            return True
        with self._lock:
            if (self.skipped + 1) % self.PROBE_EVERY == 0:
                return True
            # loading minus computing is concave in the length (the load
            # bounds are linear or the minimum of two lines, the prefill
            # convex), so if both ends are declined every length between is
            for m in (1, most):
                lohi = self._load_bounds(m * block_bytes)
                if lohi is None or lohi[0] < self.compute_s(m * block_tokens):
                    return True
            return False

    def offer(self, matched, block_bytes, block_tokens):
        """decide()'s block count only."""
        return self.decide(matched, block_bytes, block_tokens)[0]

    def state(self):
        with self._lock:
            per_byte = None
            if self.loads:
                w, sx, st = self._sums()[:3]
                per_byte = st / sx
            return dict(load_bytes_per_s=1 / per_byte if per_byte else None,
                        load_fixed_s=self.c0, load_s_per_byte=self.c1,
                        load_samples=len(self.loads),
                        prefill_s_per_token=self.a, prefill_s_per_token_pair=self.b,
                        offered=self.offered, declined=self.declined, probes=self.probes)
