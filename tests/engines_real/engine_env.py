"""Loading the engines' own modules from source snapshots, for the
real-code tier (tests/engines_real; `make test-engines-real`).

The snapshots come from environment variables, each a folder that holds
the engine's Python package:

    KVPOOL_VLLM_SRC     a vLLM checkout: the folder with vllm/
    KVPOOL_SGLANG_SRC   an SGLang checkout: the folder with python/sglang/
                        (or the python/ folder itself)
    KVPOOL_LMCACHE_SRC  an LMCache checkout: the folder with lmcache/

Nothing from a snapshot is copied into this project. The engines cannot
be installed here (no PyPI; Debian's python3-torch is 1.13), so loading
them takes a few import-only stubs. Each is listed below with its reason
(STUBS, printed by the runner); a stub never stands in for code the tests
drive. Where a module would only run on a newer torch, the gap is filled
the same way (TORCH_GAPS). What an engine imports and Debian packages is installed
instead of being stubbed (tests/engines_real/run.sh installs them).
LMCache's compiled native_storage_ops (its
Bitmap) is built from the snapshot's own csrc/storage_manager with
pybind11 into a cache folder, once.
"""

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import sysconfig
import types

STUBS = []          # (module, reason) actually installed in this process
TORCH_GAPS = []     # torch attributes added, with the reason


def commit_of(path, engine=None):
    """The commit of a snapshot folder: $KVPOOL_<ENGINE>_COMMIT, else git's
    HEAD, else the '<engine> <commit>' line of a COMMITS file beside the
    folder (how exported snapshots record it), else 'unknown'."""
    if engine and os.environ.get("KVPOOL_%s_COMMIT" % engine.upper()):
        return os.environ["KVPOOL_%s_COMMIT" % engine.upper()]
    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip()
    except OSError:
        pass
    listing = os.path.join(os.path.dirname(os.path.abspath(path)), "COMMITS")
    name = engine or os.path.basename(os.path.abspath(path))
    try:
        with open(listing) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == name:
                    return parts[1] + (" (%s)" % parts[2] if len(parts) > 2 else "")
    except OSError:
        pass
    return "unknown"


def source(engine):
    """(root folder on sys.path, checkout folder) of an engine's snapshot,
    or None when its variable is not set."""
    var = {"vllm": "KVPOOL_VLLM_SRC", "sglang": "KVPOOL_SGLANG_SRC",
           "lmcache": "KVPOOL_LMCACHE_SRC"}[engine]
    path = os.environ.get(var)
    if not path:
        return None
    path = os.path.abspath(path)
    if engine == "sglang" and os.path.isdir(os.path.join(path, "python", "sglang")):
        return os.path.join(path, "python"), path
    if not os.path.isdir(os.path.join(path, engine)):
        raise SystemExit("%s=%s has no %s/ folder" % (var, path, engine))
    checkout = path if engine != "sglang" else os.path.dirname(path)
    return path, checkout


class _AnyMeta(type):
    """Class-level attribute access on a stubbed name gives another stub
    (msgspec.msgpack.Encoder in an annotation), and subclassing takes any
    class keywords (class M(msgspec.Struct, tag=True))."""

    def __new__(mcs, name, bases, ns, **kwargs):
        return super().__new__(mcs, name, bases, ns)

    def __init__(cls, name, bases, ns, **kwargs):
        super().__init__(name, bases, ns)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _AnyMeta(name, (_Anything,), {})
        setattr(cls, name, value)
        return value

    def __call__(cls, *args, **kwargs):
        # used as a decorator (@stub.thing): the decorated object itself
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):          # Stub[int] in an annotation
        return cls

    def __or__(cls, other):              # Stub | None in an annotation
        return cls

    __ror__ = __or__


class _Anything(metaclass=_AnyMeta):
    """What a stubbed name gives: a class that takes any arguments, whose
    instances take any call; as a decorator it returns what it decorates."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __init_subclass__(cls, **kwargs):
        pass


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _AnyMeta(name, (_Anything,), {})
        setattr(self, name, value)
        return value


def stub(name, reason, _force=False, **attrs):
    """Install module `name` (and missing parents) as an import-only stub;
    a module already imported stays, unless _force."""
    if name in sys.modules and not isinstance(sys.modules[name], _StubModule):
        if not _force:
            return sys.modules[name]
        del sys.modules[name]
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            m = _StubModule(n)
            m.__path__ = []
            m.__spec__ = importlib.machinery.ModuleSpec(n, None, is_package=True)
            sys.modules[n] = m
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], m)
    mod = sys.modules[name]
    for k, v in attrs.items():
        setattr(mod, k, v)
    STUBS.append((name, reason))
    return mod


def torch_gaps():
    """Torch attributes that torch 1.13 lacks and the engines name at import
    time (dtype tables): placeholders that are never a tensor's dtype here."""
    import torch

    class MissingDtype:
        def __init__(self, name):
            self.name = name
            self.is_floating_point = False
            self.itemsize = 1

        def __repr__(self):
            return "torch.%s (missing in torch %s)" % (self.name, torch.__version__)

    added = []
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
              "float8_e8m0fnu", "float4_e2m1fn_x2", "uint16", "uint32", "uint64"):
        if not hasattr(torch, n):
            setattr(torch, n, MissingDtype(n))
            added.append(n)
    if added:
        TORCH_GAPS.append(("torch.%s" % ", torch.".join(added),
                           "dtypes added after torch 1.13, named in the engines' dtype tables"))
    if not hasattr(torch.float16, "itemsize"):
        # torch.dtype is a C type: its attribute table is patched in place
        import ctypes
        import gc
        table = gc.get_referents(torch.dtype.__dict__)[0]
        sizes = {}

        def itemsize(dtype):
            if dtype not in sizes:
                sizes[dtype] = torch.empty((), dtype=dtype).element_size()
            return sizes[dtype]
        table["itemsize"] = property(itemsize)
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(torch.dtype))
        TORCH_GAPS.append(("torch.dtype.itemsize", "added in torch 2.1; the engines size "
                           "buffers with it (element_size() of a 0-d tensor here)"))


def bare_package(name, path):
    """Register package `name` at `path` without running its __init__.py
    (used where that file imports far more than the modules driven)."""
    m = types.ModuleType(name)
    m.__path__ = [path]
    m.__file__ = os.path.join(path, "__init__.py")
    sys.modules[name] = m
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, m)
    return m


# ---- LMCache -------------------------------------------------------------------------------

def _cache_dir():
    d = os.environ.get("KVPOOL_ENGINES_REAL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "kvpool-engines-real")
    os.makedirs(d, exist_ok=True)
    return d


def build_lmcache_native_ops(checkout):
    """Build LMCache's native_storage_ops (csrc/storage_manager, pybind11)
    from the snapshot, once per snapshot commit; returns its folder."""
    src = os.path.join(checkout, "csrc", "storage_manager")
    files = sorted(f for f in os.listdir(src) if f.endswith(".cpp"))
    digest = hashlib.sha256()
    for f in files:
        with open(os.path.join(src, f), "rb") as fh:
            digest.update(fh.read())
    out = os.path.join(_cache_dir(), "lmcache-native-" + digest.hexdigest()[:16])
    so = os.path.join(out, "native_storage_ops" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(so):
        os.makedirs(out, exist_ok=True)
        inc = subprocess.run([sys.executable, "-m", "pybind11", "--includes"],
                             capture_output=True, text=True).stdout.split()
        if not inc:
            inc = ["-I" + sysconfig.get_paths()["include"]]
        cmd = ["g++", "-O1", "-shared", "-fPIC", "-std=c++17"] + inc + \
            ["-I" + src] + [os.path.join(src, f) for f in files] + ["-o", so + ".tmp",
                                                                     "-lpthread"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit("building LMCache's native_storage_ops failed:\n" + r.stderr[-3000:])
        os.rename(so + ".tmp", so)
    return out


def load_lmcache():
    """Make the LMCache snapshot importable; its commit, or None if unset."""
    got = source("lmcache")
    if got is None:
        return None
    root, checkout = got
    torch_gaps()
    native = build_lmcache_native_ops(checkout)
    stub("numba", "LMCache's pure-Python fallback ops decorate two helpers with numba.njit "
         "at import (not installed here; the decorator is the identity, the helpers are "
         "not on the paths driven)", njit=_Anything(), jit=_Anything())
    stub("cpuinfo", "lmcache.usage_context imports py-cpuinfo for usage reports, which "
         "are off here (not packaged in Debian 12)")
    stub("aiofile", "the GDS backend (not driven) imports aiofile (not packaged in Debian 12)")
    stub("msgspec", "the cache controller's message types (not driven) subclass msgspec.Struct "
         "(not packaged in Debian 12)")
    stub("prometheus_client", "LMCache registers its metrics at start with a multiprocess "
         "mode (livemostrecent) that Debian 12's python3-prometheus-client 0.16 lacks; the "
         "metrics are never read here", _force=True)
    stub("transformers", "the CacheGen serde (not driven; remote_serde is naive) imports "
         "transformers.AutoConfig (not packaged in Debian 12)")
    sys.path.insert(0, root)
    import lmcache
    lmcache.__path__.append(native)       # lmcache.native_storage_ops, built above
    return commit_of(checkout, "lmcache")


# ---- SGLang --------------------------------------------------------------------------------

def load_sglang():
    """Make the SGLang snapshot's storage backend interface importable."""
    got = source("sglang")
    if got is None:
        return None
    root, checkout = got
    sys.path.insert(0, root)
    # sglang/__init__.py and sglang/srt/__init__.py import the whole server
    # (384 modules, CUDA kernels): the storage interface needs neither.
    bare_package("sglang", os.path.join(root, "sglang"))
    bare_package("sglang.srt", os.path.join(root, "sglang", "srt"))
    bare_package("sglang.srt.mem_cache", os.path.join(root, "sglang", "srt", "mem_cache"))
    return commit_of(checkout, "sglang")


# ---- vLLM ----------------------------------------------------------------------------------

def load_vllm():
    """Make the vLLM snapshot importable (see VLLM_STUBS in vllm_env)."""
    got = source("vllm")
    if got is None:
        return None
    root, checkout = got
    torch_gaps()
    sys.path.insert(0, root)
    from vllm_env import prepare
    prepare(root)
    return commit_of(checkout, "vllm")


def report(engine, commit):
    print("%s snapshot %s (%s)" % (engine, commit, os.environ.get(
        {"vllm": "KVPOOL_VLLM_SRC", "sglang": "KVPOOL_SGLANG_SRC",
         "lmcache": "KVPOOL_LMCACHE_SRC"}[engine])))
    for name, why in TORCH_GAPS:
        print("  gap filled: %s: %s" % (name, why))
    for name, why in STUBS:
        print("  import-only stub %s: %s" % (name, why))


__all__ = ["load_lmcache", "load_sglang", "load_vllm", "stub", "bare_package", "report",
           "STUBS", "TORCH_GAPS", "commit_of"]
_ = (importlib, importlib.abc, importlib.machinery)
