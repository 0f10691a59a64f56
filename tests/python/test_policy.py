"""The engine adapters' policy (kvpool._adapters.policy, issue 29): which
retention each stored block asks for, and the load estimator's choice
between loading a hit and recomputing it. Pure computation: no server,
no timing."""

import pytest

from kvpool._adapters.config import ConfigError
from kvpool._adapters.policy import LoadEstimator, RetainHints


def test_retain_hints():
    h = RetainHints({"retain_first_blocks": 3, "retain_ms": 60000, "request_retain": True}, "t")
    assert h.for_blocks(0, 5) == [60000, 60000, 60000, 0, 0]
    assert h.for_blocks(2, 3) == [60000, 0, 0]
    assert h.for_blocks(4, 2) == [0, 0]
    # a request's own retention for all its blocks, beyond the hint's
    assert h.for_blocks(4, 2, h.request_ms(5000)) == [5000, 5000]
    assert h.request_ms("7000") == 7000
    assert h.request_ms(None) is None
    for bad in (-1, 2**32, "soon", 1.5, True):
        assert h.request_ms(bad) is None                 # ignored, never raised
    off = RetainHints({"request_retain": False}, "t")
    assert off.request_ms(5000) is None and off.for_blocks(0, 2) == [0, 0]
    assert not off.active
    with pytest.raises(ConfigError, match="go together"):
        RetainHints({"retain_first_blocks": 2}, "t")
    with pytest.raises(ConfigError, match="retain_ms"):
        RetainHints({"retain_first_blocks": 2, "retain_ms": -5}, "t")
    with pytest.raises(ConfigError, match="retain_first_blocks"):
        RetainHints({"retain_first_blocks": "many", "retain_ms": 5}, "t")


def test_request_retention_is_opt_in_and_capped():
    """A request's retention comes from the end user's request body: it is
    honoured only when the operator opts in (request_retain), and then cut
    to request_retain_max_ms."""
    default = RetainHints({}, "t")
    assert default.request_ms(86400000) is None and not default.active
    assert default.for_blocks(0, 2, default.request_ms(86400000)) == [0, 0]
    capped = RetainHints({"request_retain": True, "request_retain_max_ms": 60000}, "t")
    assert capped.request_ms(86400000) == 60000
    assert capped.request_ms(1000) == 1000
    assert capped.request_ms(0) == 0
    with pytest.raises(ConfigError, match="request_retain true"):
        RetainHints({"request_retain_max_ms": 60000}, "t")
    for bad in (0, -1, 2**32, "soon", 1.5):
        with pytest.raises(ConfigError, match="request_retain_max_ms"):
            RetainHints({"request_retain": True, "request_retain_max_ms": bad}, "t")


def test_request_retention_never_lowers_the_first_blocks_hint():
    """Per block the larger of the hint and the request's retention: a
    request asking 0 (or 1 ms) cannot opt the shared prompt out."""
    h = RetainHints({"retain_first_blocks": 2, "retain_ms": 60000, "request_retain": True}, "t")
    assert h.for_blocks(0, 4, 0) == [60000, 60000, 0, 0]
    assert h.for_blocks(0, 4, 1) == [60000, 60000, 1, 1]
    assert h.for_blocks(1, 3, 90000) == [90000, 90000, 90000]


def test_first_blocks_refresh_is_rate_limited_per_head(monkeypatch):
    """refresh_due: once per retain_ms / 2 per chain head; none without a
    hint; a bounded memory of heads."""
    now = [100.0]
    monkeypatch.setattr("kvpool._adapters.policy.time.monotonic", lambda: now[0])
    h = RetainHints({"retain_first_blocks": 2, "retain_ms": 4000}, "t")
    assert h.refresh_due(b"a") and h.refresh_due(b"b")
    assert not h.refresh_due(b"a")
    now[0] += 1.9
    assert not h.refresh_due(b"a")
    now[0] += 0.2                                  # 2.1 s > 4000 ms / 2
    assert h.refresh_due(b"a") and not h.refresh_due(b"a")
    assert not RetainHints({}, "t").refresh_due(b"a")
    h.REFRESH_HEADS = 8
    for i in range(20):
        assert h.refresh_due(bytes([i + 10]))
    assert len(h._refreshed) == 8


def test_estimator_configured_speed():
    assert not LoadEstimator.from_config({}, "t").enabled
    assert LoadEstimator.from_config({}, "t").decide(5, 1, 1) == (5, "no prefill figure")
    est = LoadEstimator.from_config({"prefill_tokens_per_s": "1000"}, "t")
    assert est.enabled
    assert est.decide(0, 65536, 16) == (0, "miss")
    assert est.decide(4, 65536, 16) == (4, "learning")
    est.record_load(1 << 30, 1.0)                         # ~1 GB/s: 64 KiB in 61 us
    est.record_load(1 << 20, 1e-3)
    assert est.decide(4, 65536, 16) == (4, "load pays")   # vs 16 ms of prefill per block
    for _ in range(10):
        est.record_load(1 << 20, 10.0)                    # 100 KB/s: 0.6 s per block
    assert est.decide(4, 65536, 16)[1] == "recompute pays"
    for bad in (0, -1, "fast", float("inf"), True, ""):
        with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
            LoadEstimator.from_config({"prefill_tokens_per_s": bad}, "t")


def test_estimator_fixed_cost_per_call():
    """Loads cost a fixed amount per call plus a cost per byte: fitted
    from loads of two sizes, a long hit that loads faster than it
    recomputes is offered although short ones are not, and one short load
    alone does not make a long hit be declined."""
    page, tokens = 768, 4
    est = LoadEstimator(34815)           # 800 tokens (200 pages) recompute in 23 ms
    est.record_load(page, 768 / 3.6e6)   # one page in 0.21 ms: mostly the fixed cost
    assert est.decide(200, page, tokens) == (200, "learning")   # may pay: measure it
    assert est.state()["offered"] == 1
    est.record_load(200 * page, 0.0077)
    assert est.decide(200, page, tokens) == (200, "load pays")
    assert est.decide(1, page, tokens)[0] == 0          # 0.18 ms fixed vs 0.11 ms of prefill
    st = est.state()
    assert st["load_fixed_s"] == pytest.approx(0.000176, rel=0.05)
    assert st["load_s_per_byte"] == pytest.approx(4.9e-8, rel=0.05)
    # and loads of many sizes from one affine cost are fitted back
    est = LoadEstimator(1000)
    for n in (1, 5, 2, 9, 3, 7) * 3:
        est.record_load(n * 1000, 0.002 + n * 1000 * 1e-6)
    assert est.c0 == pytest.approx(0.002) and est.c1 == pytest.approx(1e-6)
    assert est.load_s(20000) == pytest.approx(0.022)


def test_estimator_learns_from_failed_loads():
    """A load that times out or fails counts as one of at least the
    timeout: a pool slower than the timeout is declined (probed 1 in
    PROBE_EVERY) instead of being offered every hit."""
    est = LoadEstimator(1e6)             # 400 tokens recompute in 0.4 ms
    assert est.decide(100, 768, 4) == (100, "learning")
    est.record_failed_load(100 * 768, 0.02, 1.0)
    assert est.s_per_byte == pytest.approx(1.0 / (100 * 768))
    got = [est.decide(100, 768, 4) for _ in range(est.PROBE_EVERY)]
    assert [g[0] for g in got] == [0] * (est.PROBE_EVERY - 1) + [100]
    assert est.state()["declined"] == est.PROBE_EVERY - 1
    est.record_failed_load(100 * 768, float("nan"), None)   # nothing to learn from
    assert len(est.loads) == 1


def test_estimator_wants_no_lease_for_a_hit_it_declines():
    """wants_lease is False only when every length would be declined and
    the next decline is no probe."""
    est = LoadEstimator(1e6)
    assert est.wants_lease(100, 768, 4)                  # nothing measured
    est.record_load(768, 0.5)
    est.record_load(100 * 768, 1.0)
    assert not est.wants_lease(100, 768, 4)
    for _ in range(est.PROBE_EVERY - 1):
        assert est.decide(50, 768, 4)[0] == 0
    assert est.wants_lease(100, 768, 4)                  # the next one is a probe
    assert est.decide(50, 768, 4)[1] == "probe"
    assert not est.wants_lease(100, 768, 4)
    assert LoadEstimator(None).wants_lease(100, 768, 4)  # off: always lease
    fast = LoadEstimator(10.0)                           # recompute 0.4 s per block
    fast.record_load(768, 0.5)
    fast.record_load(100 * 768, 1.0)
    assert fast.wants_lease(100, 768, 4)


def test_estimator_fits_prefill_and_probes():
    """Fitted prefill = a n + b n^2 / 2: at a load cost between the
    short and the long prefix's per-token compute, the short one is
    recomputed and the long one loaded; a declining estimator probes one
    hit in PROBE_EVERY."""
    est = LoadEstimator()
    a, b = 5e-4, 2e-7
    for p0, p1 in ((0, 1024), (0, 4096), (1024, 1280), (0, 2048), (4096, 4352), (0, 512)):
        est.record_prefill(p1 - p0, a * (p1 - p0) + b * (p1 * p1 - p0 * p0) / 2, p1)
    est.record_prefill(10, 1.0, 10)                       # too short to count
    assert est.a == pytest.approx(a, rel=1e-6) and est.b == pytest.approx(b, rel=1e-6)
    for _ in range(12):
        est.record_load(4 << 20, 2.0)                     # 2 MB/s: 2 ms per 4 KiB token
    assert est.decide(64, 4096 * 16, 16)[1] == "recompute pays"     # 1k tokens: 0.6 ms each
    assert est.decide(2048, 4096 * 16, 16) == (2048, "load pays")   # 32k: 3.8 ms each
    got = [est.decide(64, 4096 * 16, 16) for _ in range(2 * est.PROBE_EVERY)]
    assert [g[1] for g in got].count("probe") == 2
    assert all(g[0] == (64 if g[1] == "probe" else 0) for g in got)
    st = est.state()
    assert st["probes"] == 2 and st["declined"] >= 14 and st["load_bytes_per_s"] > 0
