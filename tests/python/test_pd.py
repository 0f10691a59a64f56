"""The prefill -> decode hand-off demo (examples/pd) on a tiny model: the
decode node's output equals one node doing both, with one MATCH per
request; and the three failures: the prefill node killed mid-prompt (the
decode node computes the rest after its wait, same output), the decode
node never coming (the prefill node frees its slots, the pool keeps the
blocks), kvpoold restarted during a wait (a miss, then the full prefill,
same output). No timing is asserted."""

import argparse
import os
import sys
import tempfile

import pytest

from conftest import ROOT, need

sys.path.insert(0, os.path.join(ROOT, "examples", "pd"))

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=512,
            block_tokens=16, seed=7)
PROMPT = 256


@pytest.fixture(scope="module")
def pd():
    need("torch")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import pd_demo
    import model
    return pd_demo, model


def opts(**kw):
    a = dict(chunk=64, wait_ms=20000, decode=16, fail_tokens=PROMPT, fail_chunk=64,
             fail_wait_ms=500)
    a.update(kw)
    return argparse.Namespace(**a)


@pytest.fixture
def nodes(pd, server):
    pd_demo, model = pd
    cfg = model.Config(**TINY)
    blocks = (PROMPT + 16) // cfg.block_tokens + 2
    pre = pd_demo.NodeProc("prefill", cfg, server.url, blocks, 1)
    dec = pd_demo.NodeProc("decode", cfg, server.url, blocks, 1)
    yield cfg, pre, dec
    pre.close()
    dec.close()


def test_handoff_equals_one_node(pd, nodes, server):
    pd_demo, _ = pd
    import kvpool
    cfg, pre, dec = nodes
    with kvpool.Client(server.url, cfg.namespace()) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        for seed in (10, 11):           # both orders: reference first and last
            row = pd_demo.measure(pre, dec, cfg, PROMPT, opts(), tmp, pool, lambda s: None, seed)
            assert row["put_blocks"] == PROMPT // cfg.block_tokens
            assert row["matched"] == row["loaded_blocks"] == PROMPT // cfg.block_tokens
            assert row["max_abs_diff"] <= 1e-3
            assert row["tokens_equal"]
            assert row["match_requests"] == 1
            assert row["pool_error"] is None
        pool.drop_namespace()


def test_prefill_killed_mid_prompt(pd, nodes, server):
    pd_demo, _ = pd
    import kvpool
    cfg, pre, dec = nodes
    with kvpool.Client(server.url, cfg.namespace()) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        pool.drop_namespace()
        out = pd_demo.fail_prefill_killed(pre, dec, cfg, opts(), tmp, lambda s: None)
        pool.drop_namespace()
    assert out["killed_after_blocks"] < out["blocks"]
    assert out["loaded_blocks"] == out["killed_after_blocks"]
    assert "WAIT_TIMEOUT" in out["flags"]
    assert out["tokens_equal"] and out["max_abs_diff"] <= 1e-3
    assert out["ok"]


def test_decode_never_arrives(pd, nodes, server):
    pd_demo, _ = pd
    import kvpool
    cfg, pre, dec = nodes
    with kvpool.Client(server.url, cfg.namespace()) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        pool.drop_namespace()
        out = pd_demo.fail_decode_absent(pre, dec, cfg, opts(), tmp, pool, lambda s: None)
        pool.drop_namespace()
    assert out["pool_holds_blocks"] == out["blocks"] == out["put_blocks"]
    assert out["late_decode_loaded"] == out["blocks"]
    assert "WAITED" not in out["late_decode_flags"]
    assert out["ok"]


def test_server_restarted_during_a_wait(pd, tmp_path):
    pd_demo, model = pd
    import kvpool
    binary = os.environ.get("KVPOOLD") or os.path.join(ROOT, "build", "kvpoold")
    cli = os.path.join(os.path.dirname(binary), "kvpool")
    if not (os.access(binary, os.X_OK) and os.access(cli, os.X_OK)):
        pytest.skip("no kvpoold or kvpool CLI built")
    cfg = model.Config(**TINY)
    server = pd_demo.Server(binary, cli, ["--dram-capacity", "64MiB", "--threads", "1"],
                            str(tmp_path / "kvpoold.log"))
    server.start()
    blocks = (PROMPT + 16) // cfg.block_tokens + 2
    pre = pd_demo.NodeProc("prefill", cfg, server.url, blocks, 1)
    dec = pd_demo.NodeProc("decode", cfg, server.url, blocks, 1)
    try:
        out = pd_demo.fail_server_restart(
            pre, dec, cfg, opts(), str(tmp_path), server,
            lambda: kvpool.Client(server.url, cfg.namespace()), lambda s: None)
    finally:
        pre.close()
        dec.close()
        rc = server.stop()
    assert out["server_exit"] == 0 and rc == 0
    assert out["matched"] == 0 and out["computed_tokens"] == PROMPT
    assert out["tokens_equal"] and out["max_abs_diff"] <= 1e-3
    assert out["next_loaded_blocks"] == out["next_blocks"]
    assert out["ok"]
