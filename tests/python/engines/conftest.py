"""Fixtures of the engine adapters' contract tests (kvpool.sglang,
kvpool.vllm, kvpool.lmcache).

The engines are not installed here. For each engine whose real module does
not import, standins/<engine>_root goes on sys.path: minimal stand-ins of
the engine's base classes and loaders, written from the contract in the
project's engine notes and marked STAND-IN in each file. When the real
engine imports, the same tests run against its base classes. The session
summary says once which engines used a stand-in.
"""

import importlib
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINES = {
    "sglang": "sglang.srt.mem_cache.hicache_storage",
    "vllm": "vllm.v1.kv_offload.tiering.base",
    "lmcache": "lmcache.v1.storage_backend.connector.base_connector",
}
USED_STANDINS = []


def _install_standins():
    for engine, module in ENGINES.items():
        try:
            importlib.import_module(module)
            continue
        except Exception:
            for name in [m for m in sys.modules if m == engine or m.startswith(engine + ".")]:
                del sys.modules[name]
        sys.path.append(os.path.join(HERE, "standins", engine + "_root"))
        USED_STANDINS.append(engine)
    # the adapters bind their base class when first imported: forget any
    # import made before the above (kvpool.vllm and kvpool.lmcache are
    # packages: their modules go too)
    for name in [m for m in sys.modules if m.split(".")[:2] in
                 (["kvpool", "sglang"], ["kvpool", "vllm"], ["kvpool", "lmcache"])]:
        del sys.modules[name]


_install_standins()
sys.path.insert(0, HERE)


def pytest_terminal_summary(terminalreporter):
    if USED_STANDINS:
        terminalreporter.write_line(
            "engine contract tests: used the stand-in base classes (written from the "
            "contract) for %s: the real engine is not importable" % ", ".join(USED_STANDINS))


def uses_standin(engine):
    return engine in USED_STANDINS


@pytest.fixture
def prefix(request):
    """A namespace prefix of the test's own."""
    import hashlib
    import re
    name = request.node.name
    return "t-%s-%s" % (re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:48],
                        hashlib.sha256(name.encode()).hexdigest()[:8])


@pytest.fixture
def raw(server):
    """Raw kvpool Clients by namespace (closed at the end)."""
    import kvpool
    made = []

    def make(namespace):
        c = kvpool.Client(server.url, namespace)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()
