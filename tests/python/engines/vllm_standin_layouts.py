"""STAND-IN of how vLLM lays out a worker's KV caches, written from the
contract in the project's engine notes (§0b; local-inference-lab/vllm
28be48fa), not from vLLM's code. The real-code tier (tests/engines_real)
runs vLLM's own backends and reshape code instead.

- KV-cache specs (kv_cache_interface): FullAttentionSpec,
  SlidingWindowSpec, MLAAttentionSpec, MambaSpec; block_size is the KV
  manager's block, num_kv_heads the heads of this rank;
- a KVCacheConfig: num_blocks manager blocks, kv_cache_groups (layer
  names + spec), kv_cache_tensors (raw int8 buffers, each shared by one
  layer of every group);
- attention backends: get_kv_cache_shape(num_blocks, block_size, heads,
  head_size) in logical order and get_kv_cache_stride_order() (NHD or HND):
  FlashAttention (2, NB, B, H, D), FlashInfer (NB, 2, B, H, D), the CPU
  backend (2, NB, H, B, D) with no stride order, MLA (NB, B, D);
- the model runner's reshape: kernel blocks per manager block =
  manager block // kernel block, the raw buffer viewed in the physical
  (stride-ordered) shape and permuted back to the logical shape;
- the static forward context: one layer object per name whose
  get_attn_backend() names the layer's backend;
- what a backend says to the offloading tier's scheduler side: get_name(),
  get_supported_kernel_block_sizes() (ints and MultipleOf(n)) and
  get_required_kv_cache_layout() (FlashInfer on compute capability 10.x
  requires HND: FlashInferBlackwell).
"""

import math
from types import SimpleNamespace

import torch


class KVCacheSpec:
    pass


class AttentionSpec(KVCacheSpec):
    def __init__(self, block_size, num_kv_heads, head_size, dtype):
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.dtype = dtype

    @property
    def page_size_bytes(self):
        es = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.block_size * self.num_kv_heads * self.head_size * es


class FullAttentionSpec(AttentionSpec):
    pass


class SlidingWindowSpec(AttentionSpec):
    def __init__(self, block_size, num_kv_heads, head_size, dtype, sliding_window):
        super().__init__(block_size, num_kv_heads, head_size, dtype)
        self.sliding_window = sliding_window


class MLAAttentionSpec(FullAttentionSpec):
    @property
    def page_size_bytes(self):
        es = torch.empty((), dtype=self.dtype).element_size()
        return self.block_size * self.head_size * es


class MambaSpec(KVCacheSpec):
    def __init__(self, block_size, shapes, dtypes):
        self.block_size = block_size
        self.shapes = shapes
        self.dtypes = dtypes
        self.page_size_bytes = 4096


class MultipleOf:
    """A supported kernel block size: any multiple of base."""

    def __init__(self, base):
        self.base = base


class FlashAttentionBackend:
    layout = "NHD"

    @staticmethod
    def get_name():
        return "FLASH_ATTN"

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [MultipleOf(16)]

    @classmethod
    def get_required_kv_cache_layout(cls):
        return None

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                           cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_kv_cache_stride_order(cls):
        return (0, 1, 2, 3, 4) if cls.layout == "NHD" else (0, 1, 3, 2, 4)


class FlashAttentionHND(FlashAttentionBackend):
    layout = "HND"


class FlashInferBackend:
    layout = "NHD"

    @staticmethod
    def get_name():
        return "FLASHINFER"

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [16, 32, 64]

    @classmethod
    def get_required_kv_cache_layout(cls):
        return None

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                           cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @classmethod
    def get_kv_cache_stride_order(cls):
        return (0, 1, 2, 3, 4) if cls.layout == "NHD" else (0, 1, 3, 2, 4)


class FlashInferHND(FlashInferBackend):
    layout = "HND"


class FlashInferBlackwell(FlashInferBackend):
    """FlashInfer on compute capability 10.x: it requires HND."""

    layout = "HND"

    @classmethod
    def get_required_kv_cache_layout(cls):
        return "HND"


class CPUAttentionBackend:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                           cache_dtype_str="auto"):
        return (2, num_blocks, num_kv_heads, block_size, head_size)


class MLABackend:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                           cache_dtype_str="auto"):
        return (num_blocks, block_size, head_size)


class ScaledTritonBackend:
    """A backend the adapter cannot serve: per-token-head scales padded into
    the last dimension (head_size + 2)."""

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                           cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size + 2)


class _Layer:
    """The static forward context's entry for one attention layer."""

    def __init__(self, backend):
        self._backend = backend

    def get_attn_backend(self):
        return self._backend


def kv_cache_config(num_blocks, groups):
    """groups: [(layer names, spec)]; one raw buffer per layer index, shared
    by the i-th layer of every group (as vLLM's hybrid allocator does)."""
    per = max(len(names) for names, _ in groups)
    tensors = []
    for i in range(per):
        shared = [names[i] for names, _ in groups if i < len(names)]
        size = max(spec.page_size_bytes for _, spec in groups) * num_blocks
        tensors.append(SimpleNamespace(size=size, shared_by=shared))
    return SimpleNamespace(
        num_blocks=num_blocks, kv_cache_tensors=tensors,
        kv_cache_groups=[SimpleNamespace(layer_names=list(names), kv_cache_spec=spec)
                         for names, spec in groups])


def reshape(config, backends, kernel_block_sizes):
    """KV caches per layer as the model runner builds them: {name: tensor}."""
    raw = {}
    for t in config.kv_cache_tensors:
        buf = torch.zeros(t.size, dtype=torch.int8)
        for name in t.shared_by:
            raw[name] = buf
    out = {}
    for gid, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        kernel = kernel_block_sizes[gid]
        for name in group.layer_names:
            num_blocks = raw[name].numel() // spec.page_size_bytes
            if isinstance(spec, MambaSpec):        # a list of state tensors
                out[name] = [raw[name].view(spec.dtypes[0])[:num_blocks * 4].view(
                    num_blocks, *spec.shapes[0])]
                continue
            backend = backends[name]
            nkb = num_blocks * (spec.block_size // kernel)
            shape = backend.get_kv_cache_shape(nkb, kernel, spec.num_kv_heads, spec.head_size)
            order = getattr(backend, "get_kv_cache_stride_order", None)
            order = order() if order else tuple(range(len(shape)))
            phys = tuple(shape[i] for i in order)
            inv = [order.index(i) for i in range(len(order))]
            n = math.prod(phys)
            buf = raw[name].view(spec.dtype)
            if buf.numel() < n:       # a backend that pads: its own, larger buffer
                buf = torch.zeros(n, dtype=spec.dtype)
            out[name] = buf[:n].view(phys).permute(*inv)
    return out


def forward_context(backends):
    return {name: _Layer(b) for name, b in backends.items()}
