"""The engine adapters' policy (kvpool._adapters.policy, issue 29): which
retention each stored block asks for, and the load estimator's choice
between loading a hit and recomputing it. Pure computation: no server,
no timing."""

import pytest

from kvpool._adapters.config import ConfigError
from kvpool._adapters.policy import LoadEstimator, RetainHints


def test_retain_hints():
    h = RetainHints({"retain_first_blocks": 3, "retain_ms": 60000}, "t")
    assert h.for_blocks(0, 5) == [60000, 60000, 60000, 0, 0]
    assert h.for_blocks(2, 3) == [60000, 0, 0]
    assert h.for_blocks(4, 2) == [0, 0]
    # a request's own retention wins, for all its blocks
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


def test_estimator_configured_speed():
    assert not LoadEstimator.from_config({}, "t").enabled
    assert LoadEstimator.from_config({}, "t").decide(5, 1, 1) == (5, "no prefill figure")
    est = LoadEstimator.from_config({"prefill_tokens_per_s": "1000"}, "t")
    assert est.enabled
    assert est.decide(0, 65536, 16) == (0, "miss")
    assert est.decide(4, 65536, 16) == (4, "learning")
    est.record_load(1 << 30, 1.0)                         # ~1 GB/s: 64 KiB in 61 us
    assert est.decide(4, 65536, 16) == (4, "load pays")   # vs 16 ms of prefill per block
    for _ in range(10):
        est.record_load(1 << 20, 10.0)                    # 100 KB/s: 0.6 s per block
    assert est.decide(4, 65536, 16)[1] == "recompute pays"
    for bad in (0, -1, "fast", float("inf"), True):
        with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
            LoadEstimator.from_config({"prefill_tokens_per_s": bad}, "t")


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
