"""make install puts a package the system python3 imports (the wheel of
make wheel, installed by pip), and it loads the libkvpool.so that came
inside it, without $KVPOOL_LIB or the source tree."""

import os
import re
import subprocess
import sys

from conftest import ROOT, skip_or_fail


def version():
    """SRV_VERSION, the one version number (server/srv_server.h)."""
    with open(os.path.join(ROOT, "server", "srv_server.h")) as f:
        return re.search(r'^#define SRV_VERSION "([^"]+)"', f.read(), re.M).group(1)


def test_make_install(tmp_path):
    lib = os.environ.get("KVPOOL_LIB", "")
    build = os.path.dirname(lib) if lib.endswith("libkvpool.so") else os.path.join(ROOT, "build")
    if not os.path.exists(os.path.join(build, "libkvpool.so")):
        skip_or_fail("no built libkvpool.so in %s" % build)
    prefix = tmp_path / "prefix"
    r = subprocess.run(["make", "-s", "-C", ROOT, "BUILD=" + build, "PREFIX=" + str(prefix),
                        "install"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    pydir = prefix / "lib" / ("python%d.%d" % sys.version_info[:2]) / "dist-packages"
    assert (pydir / "kvpool" / "__init__.py").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("KVPOOL_LIB", "PYTHONPATH")}
    env["PYTHONPATH"] = str(pydir)
    r = subprocess.run([sys.executable, "-c",
                        "import kvpool; print(kvpool.__file__); print(kvpool.library_path); "
                        "print(kvpool.block_hashes(range(16), 16)[0].hex())"],
                       env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    mod, libpath, h = r.stdout.split()
    assert mod.startswith(str(pydir))
    assert libpath == str(pydir / "kvpool" / "libkvpool.so")
    # pip's record of what it installed, so that pip uninstall can remove it
    record = (pydir / ("kvpool-%s.dist-info" % version()) / "RECORD").read_text()
    assert "kvpool/libkvpool.so," in record and "kvpool/__init__.py," in record
    assert not (pydir / "kvpool" / "_installed.py").exists()
    assert h == "5d85718ec594b982c252d0279e5966ffca33a5eaf2a455038d3ab331fde70cea"


def test_make_install_runs_ldconfig(tmp_path):
    """make install refreshes the dynamic linker's cache (issue 20 item 10),
    except for a staged DESTDIR install."""
    lib = os.environ.get("KVPOOL_LIB", "")
    build = os.path.dirname(lib) if lib.endswith("libkvpool.so") else os.path.join(ROOT, "build")
    if not os.path.exists(os.path.join(build, "libkvpool.so")):
        skip_or_fail("no built libkvpool.so in %s" % build)
    if os.geteuid() != 0:
        skip_or_fail("make install runs ldconfig only as root")
    marker = tmp_path / "ldconfig-ran"
    fake = tmp_path / "fake-ldconfig"
    fake.write_text("#!/bin/sh\necho ran >> '%s'\n" % marker)
    fake.chmod(0o755)
    for destdir, want in (("", True), (str(tmp_path / "stage"), False)):
        if marker.exists():
            marker.unlink()
        r = subprocess.run(["make", "-s", "-C", ROOT, "BUILD=" + build,
                            "PREFIX=" + str(tmp_path / "prefix"), "DESTDIR=" + destdir,
                            "SYSCONFDIR=" + str(tmp_path / "etc"), "LDCONFIG=" + str(fake),
                            "install"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert marker.exists() == want, (destdir, r.stdout)
