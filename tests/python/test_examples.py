"""The examples run end to end against a real kvpoold."""

import os
import subprocess
import sys

from conftest import ROOT

EXAMPLES = os.path.join(ROOT, "client", "python", "examples")


def run(script, *args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script)] + list(args),
                          env=env, capture_output=True, text=True, timeout=120)


def test_offload(server, np):
    r = run("offload.py", server.url, "pytest:offload")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 of 7 blocks matched and loaded" in r.stdout and "verified" in r.stdout
    # Run twice: the second run starts from the same empty namespace.
    r = run("offload.py", server.url, "pytest:offload")
    assert r.returncode == 0 and "5 of 7 blocks" in r.stdout, r.stdout + r.stderr


def test_bench_get_smoke(server, np):
    """A short run; its C side is `kvpool bench` (small, so that make test
    stays light) where the CLI has it, else `kvpool get` per block."""
    r = run("bench_get.py", "--server", server.url, "--namespace", "pytest:bench",
            "--blocks", "8", "--seconds", "0.2", "--rounds", "1", "--c-bench-args",
            "--sizes 65536 --ops put,get --duration 0.2 --source-bytes 1MiB "
            "--namespace pytest:bench-c")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "get_into" in r.stdout and "GB/s" in r.stdout and "  C: " in r.stdout
