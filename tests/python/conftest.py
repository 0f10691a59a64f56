"""Fixtures of the Python binding's tests: a real kvpoold on a free
loopback port, clients bound to a namespace of their own per test, and
the rule that a skipped test fails under CI=true (as in the C harness).

Environment (tests/python/pytest.sh sets them from BUILD):
  KVPOOLD           the kvpoold binary (default: build/kvpoold)
  KVPOOL_LIB        the libkvpool.so the package loads (default: build/)
  KVPOOL_TEST_DATA  tests/data
  CI=true           a missing kvpoold, pytest module or numpy fails
"""

import importlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import kvpool  # noqa: E402  (needs the path above)

READY_TIMEOUT_S = 10
STOP_TIMEOUT_S = 10


def under_ci():
    return os.environ.get("CI") == "true"


def skip_or_fail(why):
    """Skip the current test; under CI=true fail it instead."""
    if under_ci():
        pytest.fail("cannot run under CI=true: " + why)
    pytest.skip(why)


def need(module):
    """Import an optional module (numpy) or skip (fail under CI)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        skip_or_fail("python3 module %s is not installed (apt-get install python3-%s)"
                     % (module, module))


def data_path(name):
    return os.path.join(os.environ.get("KVPOOL_TEST_DATA") or os.path.join(ROOT, "tests", "data"),
                        name)


def free_port():
    """A loopback port the kernel says is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One kvpoold child process on 127.0.0.1."""

    def __init__(self, *extra):
        self.binary = os.environ.get("KVPOOLD") or os.path.join(ROOT, "build", "kvpoold")
        self.extra = list(extra)
        self.proc = None
        self.port = None
        self.log = None

    @property
    def url(self):
        return "tcp://127.0.0.1:%d" % self.port

    def start(self, port=None):
        """Start on `port` (None: a free one, retried if another process
        takes it first) and wait until a client can ping it."""
        if not os.access(self.binary, os.X_OK):
            skip_or_fail("no kvpoold at %s (run make, or set KVPOOLD)" % self.binary)
        for _ in range(5):
            self.port = port or free_port()
            self.log = tempfile.TemporaryFile()   # never a pipe: a full pipe stalls it
            self.proc = subprocess.Popen(
                [self.binary, "--listen", "127.0.0.1", "--port", str(self.port),
                 "--admin-port", "0"] + self.extra,
                stdout=subprocess.DEVNULL, stderr=self.log)
            if self._wait_ready():
                return self
            self.kill()
            if port:
                time.sleep(0.2)
        raise RuntimeError("kvpoold did not start on a free port")

    def _wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with kvpool.Client(self.url, "ready-check", timeout=5) as c:
                    c.ping()
                return True
            except kvpool.errors.Denied:      # a server with a tokens file answers
                return True
            except (kvpool.ConnectionError, kvpool.Timeout):
                # a loaded machine (2 cores shared by builds) can take
                # over a second to answer the first HELLO: not a failure
                time.sleep(0.05)
        return False

    def stop(self):
        """SIGTERM and wait; returns the exit status (0: clean shutdown)."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return "timeout"
        self.proc = None
        if rc != 0:
            print("kvpoold exited %s; its log:\n%s" % (rc, self.log_text()))
        self.log.close()
        return rc

    def log_text(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.log.close()


@pytest.fixture(scope="session")
def server():
    """One kvpoold for the whole session; it must shut down cleanly."""
    s = Server("--dram-capacity", "256MiB", "--threads", "2").start()
    yield s
    assert s.stop() == 0, "kvpoold did not shut down cleanly"


@pytest.fixture
def fresh_server():
    """A kvpoold of the test's own (to stop or restart it)."""
    s = Server("--dram-capacity", "64MiB", "--threads", "1")
    yield s
    s.kill()


@pytest.fixture
def namespace(request):
    """A namespace of the test's own: tests do not see each other's blocks."""
    return "pytest:" + re.sub(r"[^A-Za-z0-9_.:-]", "_", request.node.name)[:200]


@pytest.fixture
def client(server, namespace):
    with kvpool.Client(server.url, namespace) as c:
        c.drop_namespace()
        yield c


@pytest.fixture
def np():
    return need("numpy")


@pytest.fixture
def torch():
    """torch (python3-torch) is optional everywhere, CI included."""
    return pytest.importorskip("torch")
