"""What pyproject.toml cannot say statically: the version, read from the
one place kvpoold --version reads it (SRV_VERSION in server/srv_server.h),
and the optional copy of libkvpool.so inside the package.

Environment:
  KVPOOL_BUNDLE_LIB   path of a libkvpool.so to ship inside the package as
                      kvpool/libkvpool.so (the wheel is then tagged for
                      this platform); unset or empty = no library inside
  KVPOOL_PY_BUILD     directory for setuptools' intermediate files (build/
                      and kvpool.egg-info); make wheel puts them under
                      $(BUILD)/. Unset: a temporary directory removed when
                      setup.py exits, so pip install client/python and
                      python3 -m build leave nothing in the source tree
"""

import atexit
import os
import re
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # no wheel module: sdists and legacy installs only
    bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "..", "..", "server", "srv_server.h")


def _version():
    """SRV_VERSION from the source tree, or the version an sdist recorded."""
    if os.path.exists(HEADER):
        with open(HEADER, encoding="utf-8") as f:
            m = re.search(r'^#define SRV_VERSION "([^"]+)"', f.read(), re.M)
        if not m:
            raise SystemExit("setup.py: no SRV_VERSION in %s" % HEADER)
        return m.group(1)
    pkg_info = os.path.join(HERE, "PKG-INFO")
    if os.path.exists(pkg_info):
        with open(pkg_info, encoding="utf-8") as f:
            m = re.search(r"^Version: (\S+)", f.read(), re.M)
        if m:
            return m.group(1)
    raise SystemExit("setup.py: cannot find the version: neither %s (a source tree) nor "
                     "PKG-INFO (an sdist) exists" % HEADER)


def _bundled_lib():
    path = os.environ.get("KVPOOL_BUNDLE_LIB", "")
    if path and not os.path.isfile(path):
        raise SystemExit("setup.py: KVPOOL_BUNDLE_LIB=%s is not a file (run make first)" % path)
    return path


class BuildPy(build_py):
    """build_py from a clean slate (a module moved or removed in the source
    must not survive in the build directory and reach the wheel), plus the
    bundled library."""

    def run(self):
        for pkg in self.packages or []:
            top = os.path.join(self.build_lib, pkg.split(".")[0])
            if os.path.isdir(top):
                shutil.rmtree(top)
        super().run()
        lib = _bundled_lib()
        if lib:
            dest = os.path.join(self.build_lib, "kvpool", "libkvpool.so")
            self.copy_file(lib, dest, preserve_mode=True)


cmdclass = {"build_py": BuildPy}

if bdist_wheel is None and {"bdist_wheel", "dist_info", "editable_wheel"} & set(sys.argv):
    # pip install --no-build-isolation in a bare virtualenv: setuptools
    # alone would say "invalid command 'bdist_wheel'"
    raise SystemExit("setup.py: building a wheel needs the wheel package, which this Python "
                     "lacks: make the virtualenv with --system-site-packages (Debian's "
                     "python3-wheel and python3-setuptools), or install the wheel of make "
                     "wheel instead")

if bdist_wheel is not None:
    class BdistWheel(bdist_wheel):
        """A wheel with libkvpool.so inside is for this platform (any
        Python 3, no ABI: the library is loaded with ctypes); without it
        the wheel is pure."""

        def finalize_options(self):
            if _bundled_lib():
                # the package goes to platlib, the wheel's root
                self.distribution.has_ext_modules = lambda: True
            super().finalize_options()

        def get_tag(self):
            tag = super().get_tag()
            if _bundled_lib():
                return ("py3", "none", tag[2])
            return tag

    cmdclass["bdist_wheel"] = BdistWheel

if os.environ.get("KVPOOL_PY_BUILD"):
    base = os.environ["KVPOOL_PY_BUILD"]
    os.makedirs(base, exist_ok=True)
else:
    base = tempfile.mkdtemp(prefix="kvpool-setup-")
    atexit.register(shutil.rmtree, base, True)
options = {"build": {"build_base": base}, "egg_info": {"egg_base": base}}

setup(version=_version(), cmdclass=cmdclass, options=options)
