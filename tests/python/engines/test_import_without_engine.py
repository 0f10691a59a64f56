"""kvpool.sglang, kvpool.vllm and kvpool.lmcache import without any engine
installed (a fresh interpreter without the stand-ins), fall back to their
own minimal bases, and import no engine module."""

import os
import subprocess
import sys

from conftest import ROOT

CODE = r"""
import sys
import kvpool.sglang as s, kvpool.vllm as v, kvpool.lmcache as l
assert not s.USING_REAL_BASE and not v.USING_REAL_TIER_BASE
assert not v.USING_REAL_CONNECTOR_BASE and not l.USING_REAL_BASE
assert not any(m.split(".")[0] in ("sglang", "vllm", "lmcache") for m in sys.modules)
assert v.register() is False
b = s.KVPoolHiCacheStorage(None, {})
assert b.batch_exists(["00" * 32]) == 0 and b.batch_get_v1(["00" * 32], None) == [False]
b.close()
print("ok")
"""


def test_imports_without_engines():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.path.join(ROOT, "client", "python")
    r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
