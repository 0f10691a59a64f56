"""The adapters copy no payload in Python: each engine adapter moves 1 MiB
pages through the pool (set, exists, get) in a child process under the
copy counter (tests/bench/copycount.c, preloaded), and the bytes copied
by memcpy/memmove calls of 4 KiB or more during the measured phase stay
under 2% of the payload moved (measured: 0). A control run that copies
each page once in Python shows the counter sees such copies."""

import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, skip_or_fail

HERE = os.path.dirname(os.path.abspath(__file__))


def counts(path):
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
    return out


@pytest.mark.parametrize("engine", ["control", "sglang", "vllm", "vllm-connector", "lmcache"])
def test_no_python_copy_of_payload(server, engine, tmp_path):
    lib = os.environ.get("KVPOOL_COPYCOUNT") or os.path.join(ROOT, "build", "tests",
                                                             "libcopycount.so")
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("sanitizer build: ASan replaces memcpy, the counter would see nothing")
    if not os.path.exists(lib):
        skip_or_fail("no copy counter at %s (make %s)" % (lib, "build/tests/libcopycount.so"))
    pytest.importorskip("torch")
    before, after = str(tmp_path / "before"), str(tmp_path / "after")
    sig = signal.SIGRTMIN + 2
    env = dict(os.environ, LD_PRELOAD=lib, COPYCOUNT_OUT=after, COPYCOUNT_SIGNAL=str(int(sig)))
    r = subprocess.run([sys.executable, os.path.join(HERE, "copycount_child.py"), engine,
                        server.url, "cc-" + engine, str(int(sig)), before],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    payload = int(r.stdout.split()[-1])
    a, b = counts(before), counts(after)
    copied = b["big_bytes"] - a["big_bytes"]
    print("%s: %d payload bytes moved, %d bytes copied in big memcpy calls"
          % (engine, payload, copied))
    assert payload >= 64 << 20
    if engine == "control":        # the measurement sees Python-side copies
        assert copied >= payload // 2, "the counter saw %d bytes" % copied
        return
    assert copied < payload * 0.02, "%s copied %d bytes for %d of payload" % (
        engine, copied, payload)
