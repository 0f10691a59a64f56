"""make install gives vLLM's plugin loader its vllm.general_plugins entry
point, which names kvpool.vllm:register (the "kvpool" tier type): it comes
from client/python/pyproject.toml, through the wheel's metadata."""

import os
import subprocess
import sys

from conftest import ROOT, skip_or_fail

CODE = r"""
from importlib.metadata import entry_points
eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvpool_tier"]
assert len(eps) == 1, eps
fn = eps[0].load()
import kvpool.vllm
assert fn is kvpool.vllm.register
print("ok")
"""


def test_vllm_plugin_entry_point(tmp_path):
    lib = os.environ.get("KVPOOL_LIB", "")
    build = os.path.dirname(lib) if lib.endswith("libkvpool.so") else os.path.join(ROOT, "build")
    if not os.path.exists(os.path.join(build, "libkvpool.so")):
        skip_or_fail("no built libkvpool.so in %s" % build)
    prefix = tmp_path / "prefix"
    r = subprocess.run(["make", "-s", "-C", ROOT, "BUILD=" + build, "PREFIX=" + str(prefix),
                        "install"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    pydir = prefix / "lib" / ("python%d.%d" % sys.version_info[:2]) / "dist-packages"
    env = {k: v for k, v in os.environ.items() if k not in ("KVPOOL_LIB", "PYTHONPATH")}
    env["PYTHONPATH"] = str(pydir)
    r = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
