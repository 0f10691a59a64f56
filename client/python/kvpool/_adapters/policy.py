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

import logging
import math
import threading

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
    0..2^32-1, default 0) must both be set for the first-blocks hint;
    `request_retain` (default true) lets a request's own retention (see
    the module doc) apply. A value that cannot work raises ConfigError.
    """

    def __init__(self, cfg, owner):
        self.first_blocks = _cfg.integer(cfg.get("retain_first_blocks"), owner,
                                         "retain_first_blocks", 0, 0)
        self.retain_ms = _cfg.milliseconds(cfg.get("retain_ms"), owner, "retain_ms", 0)
        self.per_request = _cfg.flag(cfg.get("request_retain"), owner, "request_retain", True)
        if bool(self.first_blocks) != bool(self.retain_ms):
            raise _cfg.ConfigError("%s: retain_first_blocks (%d) and retain_ms (%d) go together: "
                                   "set both to retain the first blocks of every chain, or "
                                   "neither" % (owner, self.first_blocks, self.retain_ms))
        self._warned = False

    @property
    def active(self):
        """Could any block be retained (a hint, or per-request ones)?"""
        return bool(self.first_blocks) or self.per_request

    def request_ms(self, value):
        """A request's own retention as the engine handed it (None: none):
        whole ms in 0..2^32-1; anything else is ignored, logged once (a
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
        return v

    def for_blocks(self, first_index, count, request_ms=None):
        """retain_ms for `count` blocks whose first is block `first_index`
        of its chain (0 = the chain's first block): a request's own
        retention for all of them, else retain_ms for those among the
        chain's first retain_first_blocks, else 0. A list of ints."""
        if request_ms is not None:
            return [request_ms] * count
        out = []
        for i in range(first_index, first_index + count):
            out.append(self.retain_ms if i < self.first_blocks else 0)
        return out


class LoadEstimator:
    """When loading a hit pays.

    Loading m blocks is modelled as m x block_bytes x (seconds per byte),
    an exponentially weighted average of the adapter's own GETs (alpha
    0.5: one slow GET after fast ones moves it most of the way at once).
    Prefilling tokens p0..p1 (p0 of them already cached) as
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

    ALPHA = 0.5
    PROBE_EVERY = 8
    SAMPLES = 32
    MIN_PREFILL_TOKENS = 64   # shorter computes are the LM head and fixed costs

    def __init__(self, prefill_tokens_per_s=None):
        self.s_per_byte = None
        self.prefills = []
        self.a = 1.0 / prefill_tokens_per_s if prefill_tokens_per_s else None
        self.b = 0.0 if prefill_tokens_per_s else None
        self.skipped = 0
        self.offered = self.declined = self.probes = 0
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg, owner):
        """From an adapter's extra configuration: `prefill_tokens_per_s`
        (> 0; unset: offer every hit, nothing is estimated)."""
        v = cfg.get("prefill_tokens_per_s")
        if v is None or v == "":
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

    def record_load(self, nbytes, seconds):
        """A GET of nbytes took `seconds` (only whole, successful ones)."""
        if nbytes <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        x = seconds / nbytes
        with self._lock:
            self.s_per_byte = x if self.s_per_byte is None else \
                (1 - self.ALPHA) * self.s_per_byte + self.ALPHA * x

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
        """(blocks to load, why) for a hit of `matched` blocks."""
        with self._lock:
            if matched <= 0:
                return 0, "miss"
            if self.a is None:
                return matched, "no prefill figure"
            if self.s_per_byte is None:
                self.offered += 1
                return matched, "learning"
            if matched * block_bytes * self.s_per_byte < self.compute_s(matched * block_tokens):
                self.skipped = 0
                self.offered += 1
                return matched, "load pays"
            self.skipped += 1
            if self.skipped % self.PROBE_EVERY == 0:
                self.probes += 1
                return matched, "probe"
            self.declined += 1
            return 0, "recompute pays"

    def offer(self, matched, block_bytes, block_tokens):
        """decide()'s block count only."""
        return self.decide(matched, block_bytes, block_tokens)[0]

    def state(self):
        with self._lock:
            return dict(load_bytes_per_s=1 / self.s_per_byte if self.s_per_byte else None,
                        prefill_s_per_token=self.a, prefill_s_per_token_pair=self.b,
                        offered=self.offered, declined=self.declined, probes=self.probes)
