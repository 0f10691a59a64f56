"""Fixtures of the real-code tier: a real kvpoold (the Python suite's
Server, from tests/python/conftest.py) and a namespace prefix per test.
Each test file loads one engine's snapshot (engine_env) and skips, with
one line, when its variable is not set."""

import hashlib
import importlib.util
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

_spec = importlib.util.spec_from_file_location(
    "kvpool_python_conftest", os.path.join(ROOT, "tests", "python", "conftest.py"))
_py = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_py)
Server, free_port = _py.Server, _py.free_port
server, fresh_server = _py.server, _py.fresh_server


@pytest.fixture
def prefix(request):
    name = request.node.name
    return "real-%s-%s" % (re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40],
                           hashlib.sha256(name.encode()).hexdigest()[:8])
