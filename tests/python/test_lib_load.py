"""Which libkvpool the package loads, and what it says when none loads
(kvpool/_lib.py): the copy inside the package first, $KVPOOL_LIB never
silently ignored, and an ImportError that names the shared library a slim
image lacks instead of telling the user to run make."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, skip_or_fail

PKG = os.path.join(ROOT, "client", "python", "kvpool")


def real_lib():
    lib = os.environ.get("KVPOOL_LIB") or os.path.join(ROOT, "build", "libkvpool.so")
    if not os.path.exists(lib):
        skip_or_fail("no built libkvpool.so at %s" % lib)
    return lib


@pytest.fixture
def broken_lib(tmp_path):
    """A shared library that needs libkvpoolgone.so, which is not there:
    what dlopen meets in an image without libcurl4."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        skip_or_fail("no C compiler")
    (tmp_path / "gone.c").write_text("int kvpool_gone(void) { return 1; }\n")
    (tmp_path / "broken.c").write_text("int kvpool_gone(void);\n"
                                       "int kvpool_broken(void) { return kvpool_gone(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libkvpoolgone.so"),
                    str(tmp_path / "gone.c")], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libbroken.so"),
                    str(tmp_path / "broken.c"), "-L" + str(tmp_path), "-lkvpoolgone"], check=True)
    (tmp_path / "libkvpoolgone.so").unlink()
    return str(tmp_path / "libbroken.so")


def installed_copy(tmp_path, lib):
    """The package outside the source tree with `lib` as its own
    kvpool/libkvpool.so, as a wheel installs it."""
    site = tmp_path / "site"
    shutil.copytree(PKG, str(site / "kvpool"), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(lib, str(site / "kvpool" / "libkvpool.so"))
    return str(site)


def run(path, env_lib, code="import kvpool; print(kvpool.library_path)"):
    env = {k: v for k, v in os.environ.items() if k not in ("KVPOOL_LIB", "PYTHONPATH")}
    env["PYTHONPATH"] = path
    if env_lib is not None:
        env["KVPOOL_LIB"] = env_lib
    return subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True,
                          text=True, timeout=60)


def test_missing_dependency_is_named(broken_lib):
    """KVPOOL_LIB names a library whose dependency is missing: the import
    fails, naming that dependency, and does not send the user to make."""
    r = run(os.path.dirname(PKG), broken_lib)
    assert r.returncode != 0
    assert "KVPOOL_LIB=%s: libkvpoolgone.so: cannot open shared object file" % broken_lib \
        in r.stderr, r.stderr
    assert "libkvpool needs shared libraries this system lacks: libkvpoolgone.so" in r.stderr
    assert "run `make`" not in r.stderr


def test_kvpool_lib_wrong_path_fails(tmp_path):
    """From a package without a copy inside, a KVPOOL_LIB that names no
    file fails the import loudly (nothing else is tried)."""
    r = run(os.path.dirname(PKG), str(tmp_path / "nonexistent.so"))
    assert r.returncode != 0
    assert "KVPOOL_LIB=%s: no such file" % (tmp_path / "nonexistent.so") in r.stderr, r.stderr
    assert "KVPOOL_LIB must name the library file itself" in r.stderr


def test_bundled_copy_first_and_kvpool_lib_warned(tmp_path):
    """An installed package's own copy comes first; a KVPOOL_LIB set to
    another file (here: none at all) is not used, and a warning says so.
    Set to the copy itself, or unset, there is no warning."""
    site = installed_copy(tmp_path, real_lib())
    own = os.path.join(site, "kvpool", "libkvpool.so")
    r = run(site, str(tmp_path / "nonexistent.so"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == own
    assert "KVPOOL_LIB=%s is not used: this package carries its own libkvpool.so (%s)" % (
        tmp_path / "nonexistent.so", own) in r.stderr, r.stderr
    for env_lib in (own, None):
        r = run(site, env_lib)
        assert r.returncode == 0 and r.stdout.strip() == own, r.stderr
        assert "KVPOOL_LIB" not in r.stderr, r.stderr


def test_bundled_copy_broken(tmp_path, broken_lib):
    """An installed package whose own copy cannot load (a dependency is
    missing) falls to KVPOOL_LIB; when that fails too, the error names
    both and the missing library."""
    site = installed_copy(tmp_path, broken_lib)
    own = os.path.join(site, "kvpool", "libkvpool.so")
    r = run(site, real_lib())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == real_lib()
    r = run(site, str(tmp_path / "nonexistent.so"))
    assert r.returncode != 0
    assert "%s: libkvpoolgone.so: cannot open shared object file" % own in r.stderr, r.stderr
    assert "KVPOOL_LIB=%s: no such file" % (tmp_path / "nonexistent.so") in r.stderr
    assert "libkvpool needs shared libraries this system lacks: libkvpoolgone.so" in r.stderr
