"""docker/entrypoint.sh outside a container (issue 20 item 9): its health
check reaches kvpoold where kvpoold really listens, taken from kvpoold's
own reading of the flags after the image name and of KVPOOL_LISTEN, not
guessed from KVPOOL_PORT / KVPOOL_ADMIN_PORT alone."""

import os
import signal
import subprocess
import time

import pytest

from conftest import ROOT, free_port, skip_or_fail

ENTRYPOINT = os.path.join(ROOT, "docker", "entrypoint.sh")


def binaries():
    kvpoold = os.environ.get("KVPOOLD") or os.path.join(ROOT, "build", "kvpoold")
    cli = os.environ.get("KVPOOL_CLI") or os.path.join(ROOT, "build", "kvpool")
    if not (os.access(kvpoold, os.X_OK) and os.access(cli, os.X_OK)):
        skip_or_fail("kvpoold or kvpool not built")
    return kvpoold, cli


def run_case(tmp_path, env_extra, flags, host):
    kvpoold, cli = binaries()
    port, admin = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    env.update(KVPOOLD=kvpoold, KVPOOL_CLI=cli, KVPOOL_HEALTH_FILE=str(tmp_path / "health.env"),
               # what a health check that reads the environment would believe
               KVPOOL_PORT="1", KVPOOL_ADMIN_PORT="2")
    env.update(env_extra)
    argv = ["sh", ENTRYPOINT, "kvpoold", "--port", str(port), "--admin-port", str(admin),
            "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "1"] + flags
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 15
        ok = None
        while time.time() < deadline:
            r = subprocess.run(["sh", ENTRYPOINT, "health", "--timeout-ms", "2000"], env=env,
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                ok = r
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
        assert ok is not None, "never healthy: %s %s" % (r.stdout, r.stderr)
        assert ok.stdout.startswith("healthy"), ok.stdout
        with open(tmp_path / "health.env") as f:
            text = f.read()
        assert "HEALTH_HOST=%s\n" % host in text, text
        assert "HEALTH_PORT=%d\n" % port in text and "HEALTH_ADMIN_PORT=%d\n" % admin in text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_health_follows_flags_after_the_image_name(tmp_path):
    run_case(tmp_path, {}, [], "127.0.0.1")


def test_health_follows_kvpool_listen(tmp_path):
    # an address other than 127.0.0.1 (still loopback: the test needs no network)
    run_case(tmp_path, {"KVPOOL_LISTEN": "127.0.0.2"}, [], "127.0.0.2")
