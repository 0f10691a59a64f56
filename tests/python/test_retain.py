"""Retention through the Python binding (issue 29): put_chain with
retain_ms report each block's outcome in flags=, match/match_detail
with retain_ms refresh the matched run, a retention past the budget is
reported per block (leading blocks first), retain_ms above max_retain_ms
is cut and said so, a negative one is refused before anything is sent,
and STATS shows what is retained; kvpoold warns when budgets reach the
pool's capacity."""

import pytest

import kvpool
from conftest import Server

BLOCK = 64 << 10

@pytest.fixture(scope="module")
def small():
    """A pool of its own: 16 MiB of DRAM, retention up to 60 s, 8 blocks of
    budget per namespace."""
    s = Server("--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "2",
               "--max-retain-ms", "60000", "--max-retained-bytes", str(8 * BLOCK)).start()
    yield s
    assert s.stop() == 0

def keys_of(tag, n):
    """n chained keys (distinct per tag)."""
    return kvpool.block_hashes(list(range(ord(tag[0]) * 1000, ord(tag[0]) * 1000 + 16 * n)), 16)

def test_put_reports_retention_leading_blocks_first(small):
    keys = keys_of("a", 10)
    with kvpool.Client(small.url, "py-retain-a") as c:
        flags = []
        st = c.put_chain(keys, [b"a" * BLOCK] * 10, retain_ms=30000, flags=flags)
        assert st == [0] * 10
        assert flags == [kvpool.PUT_RETAINED] * 8 + [kvpool.PUT_RETAIN_BUDGET] * 2
        doc = c.stats("py-retain-a")
        ns = doc["namespaces"]["py-retain-a"]
        assert ns["retained_blocks"] == 8
        assert ns["retain_refused"] == 2
        assert doc["retention"]["max_retain_ms"] == 60000
        c.drop_namespace()

def test_clamped_and_negative(small):
    keys = keys_of("b", 2)
    with kvpool.Client(small.url, "py-retain-b") as c:
        flags = []
        c.put_chain(keys, [b"b" * 100] * 2, retain_ms=2**32 - 1, flags=flags)
        assert flags == [kvpool.PUT_RETAINED | kvpool.PUT_RETAIN_CLAMPED] * 2
        r = c.match_detail(keys, retain_ms=10**9)
        assert (r.matched, r.retained, r.retain_ms) == (2, 2, 60000)
        assert r.flags == kvpool.MATCH_RETAIN_CLAMPED
        with pytest.raises(kvpool.InvalidArgument):
            c.match(keys, retain_ms=-1)
        with pytest.raises(kvpool.InvalidArgument):
            c.put_chain(keys_of("c", 1), [b"c"], retain_ms=-5)
        assert c.match(keys_of("c", 1)) == 0      # nothing was sent
        c.drop_namespace()

def test_match_refresh_and_put_exists(small):
    keys = keys_of("d", 4)
    with kvpool.Client(small.url, "py-retain-d") as c:
        c.put_chain(keys, [b"d" * 100] * 4)       # ordinary
        r = c.match_detail(keys + keys_of("e", 1), retain_ms=20000)
        assert (r.matched, r.present, r.retained, r.retain_ms) == (4, 4, 4, 20000)
        flags = []
        st = c.put_chain(keys, [b"d" * 100] * 4, retain_ms=40000, flags=flags)
        assert st == [0] * 4                      # EXISTS is a success
        assert flags == [kvpool.PUT_RETAINED] * 4
        doc = c.stats("py-retain-d")
        assert doc["namespaces"]["py-retain-d"]["retained_blocks"] == 4
        c.drop_namespace()
        doc = c.stats("py-retain-d")
        assert doc["namespaces"]["py-retain-d"]["retained_blocks"] == 0

def _wait_for(pred, timeout=10.0):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()

def test_budget_warnings_at_start_and_sighup(tmp_path):
    """kvpoold warns when one budget, or the tokens' budgets together,
    reach dram_capacity (at start and on SIGHUP), and says nothing when
    they fit."""
    import os
    import signal
    tok = tmp_path / "tokens"
    a, b = "a" * 32, "b" * 32
    # 10 MiB + the default 4 MiB fit a 16 MiB pool: no warning
    tok.write_text("[tokens]\n%s rw a/ max_retained_bytes=10MiB\n%s rw b/\n" % (a, b))
    os.chmod(tok, 0o600)
    s = Server("--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "1",
               "--tokens-file", str(tok)).start()
    try:
        assert "retention budget" not in s.log_text()
        assert "add up to" not in s.log_text()
        # 13 MiB + 4 MiB do not: the SIGHUP that loads them warns
        tok.write_text("[tokens]\n%s rw a/ max_retained_bytes=13MiB\n%s rw b/\n" % (a, b))
        s.proc.send_signal(signal.SIGHUP)
        assert _wait_for(lambda: "sighup: the retention budgets of the 2 tokens add up to "
                         "17.0 MiB" in s.log_text()), s.log_text()
        # one budget at the pool's size
        tok.write_text("[tokens]\n%s rw a/ max_retained_bytes=16MiB\n%s rw b/\n" % (a, b))
        s.proc.send_signal(signal.SIGHUP)
        assert _wait_for(lambda: "sighup: a token's retention budget (16.0 MiB) is "
                         "dram_capacity" in s.log_text()), s.log_text()
    finally:
        assert s.stop() == 0
    # without tokens: a per-namespace budget, or a pool-wide bound, at the pool's size
    s = Server("--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "1",
               "--max-retained-bytes", "100GiB", "--max-retained-total-bytes", "16MiB").start()
    try:
        log = s.log_text()
        assert "max_retained_bytes (102400.0 MiB per namespace) is dram_capacity" in log
        assert "max_retained_total_bytes (16.0 MiB) is dram_capacity" in log
    finally:
        assert s.stop() == 0
