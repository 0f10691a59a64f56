"""How the real-code tier loads vLLM's modules from a snapshot (see
engine_env).

vLLM's package __init__ files import the whole engine (CUDA kernels,
Triton, torch 2 distributed APIs, every model config), and its config
classes are pydantic 2 dataclasses (Debian 12 has pydantic 1). So the
tier loads an explicit list of vLLM's modules, REAL below: what it drives.
Their parent packages are registered without running their __init__.py.
Every other vLLM module they import is an import-only stub, recorded
with the module that imports it (printed by the runner): those are the
kernels, ops, platforms, model layers and configs that the driven code
names but does not call on the paths the tier runs. A module that is not
installed here is stubbed the same way, and so is a name a bare package
would have re-exported. A stub reached by the driven code makes a check
fail, not pass.

Driven (REAL): KVConnectorBase_V1, SupportsHMA, KVConnectorRole and the
metadata types (kv_connector/v1/base.py) and KVConnectorFactory
(kv_connector/factory.py); Request and the block hasher (v1/request.py,
v1/core/kv_cache_utils.py, utils/hashing.py); the KV-cache specs and
KVCacheConfig (v1/kv_cache_interface.py); the scheduler output types
(v1/core/sched/output.py, v1/outputs.py); the attention backends'
get_kv_cache_shape and get_kv_cache_stride_order (FlashAttention,
FlashInfer, Triton, the CPU backend, MLA) and get_kv_cache_layout /
set_kv_cache_layout; the model runner's KV-cache reshape
(v1/worker/gpu/attn_utils.py _reshape_kv_cache) and
BlockTable.map_to_kernel_blocks; for the hand-off tests, the engine
core's Scheduler with its KVCacheManager, coordinator, block pool,
request queues and stop checks (v1/core/...), and KVOutputAggregator
(kv_connector/utils.py); for the offloading tier, the tiering layer's
SecondaryTierFactory, SecondaryTierManager, JobMetadata and OffloadKey
(v1/kv_offload), and the attention backend registry
(AttentionBackendEnum.get_class) with each backend's kernel block sizes
and required KV-cache layout.
"""

import builtins
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

import engine_env

REAL = {
    "vllm.logger", "vllm.envs", "vllm.logging_utils", "vllm.logging_utils.formatter",
    "vllm.logging_utils.access_log_filter", "vllm.logging_utils.lazy",
    "vllm.logging_utils.log_time", "vllm.logging_utils.torch_tensor",
    "vllm.distributed.kv_transfer.kv_connector.base",
    "vllm.distributed.kv_transfer.kv_connector.v1",
    "vllm.distributed.kv_transfer.kv_connector.v1.base",
    "vllm.distributed.kv_transfer.kv_connector.factory",
    "vllm.v1.core.sched.output", "vllm.v1.outputs",
    "vllm.v1.kv_cache_interface", "vllm.v1.core.kv_cache_utils", "vllm.utils.hashing",
    "vllm.v1.request",
    "vllm.v1.attention.backend", "vllm.v1.attention.backends.utils",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.flashinfer",
    "vllm.v1.attention.backends.triton_attn", "vllm.v1.attention.backends.cpu_attn",
    "vllm.model_executor.layers.attention.mla_attention",
    "vllm.v1.worker.gpu.attn_utils", "vllm.v1.worker.block_table",
    "vllm.utils", "vllm.utils.torch_utils", "vllm.utils.math_utils", "vllm.utils.func_utils",
    "vllm.utils.collection_utils", "vllm.v1.utils",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.kv_offload.base", "vllm.v1.kv_offload.tiering.base",
    "vllm.v1.kv_offload.tiering.factory", "vllm.v1.attention.backends.registry",
    "vllm.utils.import_utils",
    # the engine core's scheduler (the hand-off tests: vllm_pd_roles)
    "vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.interface",
    "vllm.v1.core.sched.request_queue", "vllm.v1.core.sched.utils",
    "vllm.v1.core.kv_cache_coordinator", "vllm.v1.core.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager", "vllm.v1.core.kv_cache_metrics",
    "vllm.v1.core.encoder_cache_manager", "vllm.distributed.kv_transfer.kv_connector.utils",
}
_PARENTS = {".".join(m.split(".")[:i]) for m in REAL for i in range(1, m.count(".") + 1)}
BARE = sorted(_PARENTS - REAL)
_OWN = ("vllm", "kvpool")
_real_import = builtins.__import__


class _VllmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """vllm.* modules outside REAL (and their parents) become stubs."""

    def __init__(self):
        self.importer = "?"

    def find_spec(self, name, path, target=None):
        if not name.startswith("vllm.") or name in REAL or name in _PARENTS:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        engine_env.stub(spec.name, "imported by %s: not driven" % self.importer)
        return sys.modules[spec.name]

    def exec_module(self, module):
        pass


_FINDER = _VllmFinder()


def library_gaps():
    import typing_extensions
    if not hasattr(typing_extensions, "deprecated"):
        def deprecated(msg, *a, **k):
            return lambda obj: obj
        typing_extensions.deprecated = deprecated
        engine_env.TORCH_GAPS.append(("typing_extensions.deprecated", "typing_extensions 4.5; "
                                      "Debian 12 has 4.4 (a decorator that marks an API)"))


def _importer(globals):
    return (globals or {}).get("__name__", "") or ""


def _why(mod, who):
    if mod in BARE:
        return "imported by %s: a re-export of a package whose __init__ is not run" % who
    if mod.split(".")[0] == "torch":
        return "imported by %s: not in torch %s" % (who, __import__("torch").__version__)
    return "imported by %s: not in the version installed here" % who


def _lenient_import(name, globals=None, locals=None, fromlist=(), level=0):
    """builtins.__import__ while vLLM modules load: see the module doc."""
    who = _importer(globals)
    if not who.startswith("vllm"):
        return _real_import(name, globals, locals, fromlist, level)
    _FINDER.importer = who
    try:
        mod = _real_import(name, globals, locals, fromlist, level)
    except ModuleNotFoundError as e:
        missing = e.name or name
        if missing.split(".")[0] in _OWN:
            raise
        engine_env.stub(missing, "imported by %s: not installed here" % who)
        mod = _real_import(name, globals, locals, fromlist, level)
    if fromlist:
        for n in fromlist:
            if n == "*" or hasattr(mod, n):
                continue
            try:
                importlib.import_module(mod.__name__ + "." + n)
                if hasattr(mod, n):
                    continue
            except Exception:
                pass
            setattr(mod, n, engine_env._AnyMeta(n, (engine_env._Anything,), {}))
            engine_env.STUBS.append(("%s.%s" % (mod.__name__, n), _why(mod.__name__, who)))
    return mod


def torch_library_gap():
    """vLLM registers its custom ops (CUDA and CPU kernels, none driven here)
    in a torch.library.Library("vllm", "FRAGMENT") at import; torch 1.13
    knows only DEF and IMPL libraries. A FRAGMENT library becomes one that
    records nothing."""
    import torch.library as tl
    real = tl.Library

    class Library(real):
        def __init__(self, ns, kind, dispatch_key=""):
            self._kvpool_noop = kind not in ("DEF", "IMPL")
            if not self._kvpool_noop:
                super().__init__(ns, kind, dispatch_key)
            else:
                self.ns, self.kind, self.dispatch_key = ns, kind, dispatch_key

        def define(self, *a, **k):
            if not self._kvpool_noop:
                return super().define(*a, **k)

        def impl(self, *a, **k):
            if not self._kvpool_noop:
                return super().impl(*a, **k)

        def _register_fake(self, *a, **k):
            return None

        def __del__(self):
            if not getattr(self, "_kvpool_noop", True):
                super().__del__()
    tl.Library = Library
    if not hasattr(tl, "infer_schema"):
        tl.infer_schema = lambda *a, **k: "() -> ()"
        engine_env.TORCH_GAPS.append(("torch.library.infer_schema", "torch 2.4; gives a "
                                      "schema string for the registrations above"))
    engine_env.TORCH_GAPS.append(("torch.library.Library(kind=FRAGMENT)", "torch 1.13 has "
                                  "only DEF/IMPL libraries; vLLM's custom-op registrations "
                                  "(kernels, not driven) go to a library that records nothing"))


def torch_annotation_gaps():
    """Names vLLM uses in annotations and op tags at import, missing in
    torch 1.13: torch.SymInt (annotations only) and torch.Tag members
    (tags of custom-op registrations, which record nothing here)."""
    import torch
    added = []
    if not hasattr(torch, "SymInt"):
        torch.SymInt = int
        added.append("torch.SymInt")
    for tag in ("flexible_layout", "needs_fixed_stride_order", "cudagraph_unsafe",
                "pt2_compliant_tag", "needs_exact_strides"):
        if not hasattr(torch.Tag, tag):
            setattr(torch.Tag, tag, torch.Tag.generated)
            added.append("torch.Tag." + tag)
    if added:
        engine_env.TORCH_GAPS.append((", ".join(added), "not in torch %s; named in "
                                      "annotations and custom-op tags at import"
                                      % torch.__version__))


def prepare(root):
    library_gaps()
    torch_annotation_gaps()
    torch_library_gap()
    sys.meta_path.insert(0, _FINDER)
    for name in BARE:
        engine_env.bare_package(name, os.path.join(root, *name.split(".")))
    builtins.__import__ = _lenient_import
