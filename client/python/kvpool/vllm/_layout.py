"""The byte layout of the vLLM connector's blocks, and how each attention
backend's KV caches map to it.

One canonical layout (version 1) for every backend: a kvpool block is a
chunk of `chunk_blocks` KV-manager blocks of one worker, and holds, for
each KV-cache group (in vLLM's order), for each of its layers (in natural
order of their names), K then V (MLA: the one latent), the chunk's tokens
in order, each token's heads, each head's head_size elements, in the
KV cache's dtype. So the bytes do not depend on the backend, on NHD or
HND, or on the kernel block size: instances of one model share blocks
whatever attention backend they run.

What the scheduler side knows (kv_cache_config) names the layout
(ModelLayout.tag); what a worker's tensors hold is checked against it
(LayerLayout), so a worker whose KV caches do not match refuses them
rather than store or load wrong bytes.

Sources (read, not copied): vLLM's model runner reshapes a raw buffer per
layer into attn_backend.get_kv_cache_shape(kernel blocks, kernel block,
heads, head_size) permuted by get_kv_cache_stride_order(), and maps a KV
manager block b to kernel blocks b*r .. b*r+r-1 (BlockTable.
map_to_kernel_blocks, r = manager block // kernel block)
(local-inference-lab/vllm 28be48fa: v1/worker/gpu_model_runner.py
_reshape_kv_cache_tensors, v1/worker/block_table.py).

Internal: the names may change.
"""

import hashlib
import re

from .._adapters.buffers import raw_buffer

LAYOUT_VERSION = "kv1"

# KV-cache spec classes, by name (vLLM's v1/kv_cache_interface.py), so that
# nothing here imports vLLM: the served kinds, and those refused.
_ATTENTION = ("FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec",
              "AttentionSpec")
_MLA = ("MLAAttentionSpec",)
# groups whose blocks vLLM frees while their request still runs: the
# manager's remove_skipped_blocks hands the blocks out of the window (or
# the local chunk) back to the pool at the next allocation, and another
# request's forward may write them in the next step
# (local-inference-lab/vllm 28be48fa: v1/core/single_type_kv_cache_manager.py,
# SlidingWindowManager and ChunkedLocalAttentionManager get_num_skipped_tokens)
_FREED_EARLY = ("SlidingWindowSpec", "ChunkedLocalAttentionSpec")
_REFUSED = {"MambaSpec": "a Mamba (state) group",
            "CrossAttentionSpec": "a cross-attention group",
            "EncoderOnlyAttentionSpec": "an encoder-only attention group",
            "SinkFullAttentionSpec": "attention with sinks",
            "TQFullAttentionSpec": "TurboQuant-packed KV"}


# vLLM's KVQuantMode values (vllm/v1/kv_cache_interface.py): the KV caches
# whose bytes mean something only with scales kept outside the cache. A
# per-tensor scale may be computed by each instance (--calculate-kv-scales),
# so two instances' bytes of one token need not mean the same values.
_QUANT_REFUSED = {
    1: "an fp8 KV cache with per-tensor scales (--kv-cache-dtype fp8, fp8_e4m3 or "
       "fp8_e5m2 on a non-MLA model)",
    2: "an int8 KV cache with per-token-head scales (--kv-cache-dtype "
       "int8_per_token_head)",
    3: "an fp8 KV cache with per-token-head scales (--kv-cache-dtype "
       "fp8_per_token_head)",
    4: "an nvfp4 KV cache (--kv-cache-dtype nvfp4: packed data, block scales)",
}


def _kind(spec):
    """("kv" | "mla", None) or (None, why it is not served)."""
    names = [c.__name__ for c in type(spec).__mro__]
    for n in names:
        if n in _REFUSED:
            return None, _REFUSED[n]
    hv = getattr(spec, "head_size_v", None)
    if hv not in (None, getattr(spec, "head_size", None)):
        return None, "K and V of different head sizes (%s and %s)" % (spec.head_size, hv)
    mode = int(getattr(spec, "kv_quant_mode", 0) or 0)
    if mode:
        return None, _QUANT_REFUSED.get(mode, "a quantized KV cache with scales (vLLM's "
                                        "kv_quant_mode %d)" % mode)
    for n in names:
        if n in _MLA:
            return "mla", None
    for n in names:
        if n in _ATTENTION:
            return "kv", None
    return None, "a KV-cache spec this adapter does not know (%s)" % type(spec).__name__


def _natural(name):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def element_size(dtype):
    size = getattr(dtype, "itemsize", None)
    if size:
        return int(size)
    import torch
    return torch.empty((), dtype=dtype).element_size()


class LayerSpec:
    """What one layer's KV cache holds, from the KV-cache spec."""

    __slots__ = ("name", "group", "kind", "heads", "head_size", "dtype", "es")

    def __init__(self, name, group, kind, heads, head_size, dtype):
        self.name, self.group, self.kind = name, group, kind
        self.heads, self.head_size, self.dtype = heads, head_size, dtype
        self.es = element_size(dtype)

    @property
    def token_bytes(self):
        return (1 if self.kind == "mla" else 2) * self.heads * self.head_size * self.es


class ModelLayout:
    """The canonical layout of one worker's blocks, from kv_cache_config.

    served: False with `why` when a group cannot be served (Mamba, cross
    attention, groups of different block sizes, no kv_cache_config).
    freed_early: a group's blocks may be freed (and reused) while their
    request runs (sliding window, chunked local attention), so a store in
    flight must not read them in place.
    block_size: the KV manager's block (tokens). layers: LayerSpec in
    canonical order. token_bytes: one token's bytes (every layer's K and
    V). tag: the layout's name in a namespace (its shape, then
    b<token_bytes>).
    """

    def __init__(self, kv_cache_config):
        self.served, self.why = False, None
        self.layers, self.block_size, self.groups, self.tag = [], 0, 0, None
        self.num_blocks = 0
        self.freed_early = False
        if kv_cache_config is None:
            self.why = "vLLM passed no kv_cache_config (a release older than the one this " \
                       "adapter was written against)"
            return
        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
        self.num_blocks = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
        if not groups:
            self.why = "kv_cache_config has no KV-cache group"
            return
        sizes = set()
        for g, group in enumerate(groups):
            gspec = group.kv_cache_spec
            per_layer = getattr(gspec, "kv_cache_specs", None)   # UniformTypeKVCacheSpecs
            for name in sorted(group.layer_names, key=_natural):
                spec = per_layer[name] if isinstance(per_layer, dict) else gspec
                if any(c.__name__ in _FREED_EARLY for c in type(spec).__mro__):
                    self.freed_early = True
                kind, why = _kind(spec)
                if kind is None:
                    self.why = "%s (layer %s)" % (why, name)
                    return
                heads = 1 if kind == "mla" else int(spec.num_kv_heads)
                self.layers.append(LayerSpec(name, g, kind, heads, int(spec.head_size),
                                             spec.dtype))
                sizes.add(int(spec.block_size))
        if len(sizes) != 1:
            self.why = "KV-cache groups of different block sizes %s" % sorted(sizes)
            return
        self.block_size = sizes.pop()
        self.groups = len(groups)
        self.served = True
        first = self.layers[0]
        self.token_bytes = sum(s.token_bytes for s in self.layers)
        uniform = all((s.kind, s.heads, s.head_size, _dtype_name(s.dtype)) ==
                      (first.kind, first.heads, first.head_size, _dtype_name(first.dtype))
                      for s in self.layers)
        if uniform and self.groups == 1:
            if first.kind == "mla":
                self.tag = "%s-mla-l%dd%d" % (LAYOUT_VERSION, len(self.layers), first.head_size)
            else:
                self.tag = "%s-l%dh%dd%d" % (LAYOUT_VERSION, len(self.layers), first.heads,
                                              first.head_size)
        else:
            desc = ";".join("%d:%s:%d:%d:%s" % (s.group, s.kind, s.heads, s.head_size,
                                                _dtype_name(s.dtype)) for s in self.layers)
            self.tag = "%s-g%d-%s" % (LAYOUT_VERSION, self.groups,
                                      hashlib.sha256(desc.encode()).hexdigest()[:12])
        # the bytes of one token (every layer's K and V), whatever the
        # namespace's dtype part says: two instances whose chunks differ in
        # size never share a namespace, so a hit never loads a block of
        # another size (which vLLM's "fail" policy would turn into a failed
        # request)
        self.tag += "-b%d" % self.token_bytes
        self.is_mla = all(s.kind == "mla" for s in self.layers)
        self.dtype = first.dtype

    def chunk_bytes(self, chunk_blocks):
        return sum(s.token_bytes for s in self.layers) * self.block_size * chunk_blocks


# ---- one layer's tensor ------------------------------------------------------------------

# Logical shapes of vLLM's attention backends (get_kv_cache_shape order):
# FlashAttention, FlexAttention, ROCm: (2, NB, B, H, D); FlashInfer, Triton:
# (NB, 2, B, H, D); the CPU backend: (2, NB, H, B, D); MLA backends: (NB, B, D).
_TEMPLATES = {"kv": [("kv", "nb", "tok", "h", "d"), ("nb", "kv", "tok", "h", "d"),
                     ("kv", "nb", "h", "tok", "d")],
              "mla": [("nb", "tok", "d")]}
_PROBE = {"nb": 1237, "tok": 48, "h": 5, "d": 72}


def backend_dims(backend, kind, cache_dtype="auto"):
    """The meaning of each dimension of `backend`'s KV cache, asked from the
    backend itself (get_kv_cache_shape with distinct probe sizes), or None
    when it cannot say; ValueError for a dimension that is none of
    K/V, blocks, tokens, heads, head size (a packed or padded layout)."""
    probe = dict(_PROBE, h=1 if kind == "mla" else _PROBE["h"])
    fn = getattr(backend, "get_kv_cache_shape", None)
    if fn is None:
        return None
    try:
        try:
            shape = fn(probe["nb"], probe["tok"], probe["h"], probe["d"],
                       cache_dtype_str=cache_dtype)
        except TypeError:
            shape = fn(probe["nb"], probe["tok"], probe["h"], probe["d"])
    except Exception:
        return None
    by_size = {2: "kv", probe["nb"]: "nb", probe["tok"]: "tok", probe["d"]: "d"}
    if kind != "mla":
        by_size[probe["h"]] = "h"
    dims = []
    for n in shape:
        if n == 1 and kind == "mla":
            dims.append("h1")
            continue
        if n not in by_size:
            raise ValueError("%s's KV cache has a dimension of size %d for head size %d: a "
                             "packed or padded layout" % (getattr(backend, "__name__", backend),
                                                          n, probe["d"]))
        dims.append(by_size[n])
    return tuple(dims)


class LayerLayout:
    """Where the canonical bytes of one layer live in its KV cache tensor.

    LayerLayout(tensor, spec, block_size, num_blocks, dims=None)
    dims: the backend's dimension names (backend_dims), or None to infer
    them from the shape (ValueError if that is ambiguous). Raises
    ValueError, with the reason, for a tensor that does not hold `spec`'s
    KV for num_blocks manager blocks of block_size tokens.
    """

    def __init__(self, tensor, spec, block_size, num_blocks, dims=None):
        t = tensor
        self.name, self.spec, self.tensor = spec.name, spec, t
        if not hasattr(t, "stride") or not hasattr(t, "data_ptr"):
            raise ValueError("layer %s: not a tensor (%s)" % (spec.name, type(t).__name__))
        if _dtype_name(t.dtype) != _dtype_name(spec.dtype):
            raise ValueError("layer %s: dtype %s, the KV-cache spec says %s"
                             % (spec.name, _dtype_name(t.dtype), _dtype_name(spec.dtype)))
        shape, kind = tuple(t.shape), spec.kind
        want = {"kv": 2, "h": spec.heads, "d": spec.head_size, "h1": 1}
        candidates = [dims] if dims is not None else _TEMPLATES[kind]
        fits = []
        for tpl in candidates:
            if tpl is None or len(tpl) != len(shape):
                continue
            size = dict(zip(tpl, shape))
            if any(size[k] != v for k, v in want.items() if k in size):
                continue
            nb, tok = size.get("nb", 0), size.get("tok", 0)
            if tok <= 0 or block_size % tok or nb * tok != num_blocks * block_size:
                continue
            fits.append(tpl)
        if not fits:
            raise ValueError("layer %s: shape %s does not hold %s KV of %d heads x %d for %d "
                             "blocks of %d tokens" % (spec.name, shape, kind, spec.heads,
                                                      spec.head_size, num_blocks, block_size))
        if len(fits) > 1:
            raise ValueError("layer %s: shape %s can be read as %s: the attention backend "
                             "is not known, so tokens and heads cannot be told apart"
                             % (spec.name, shape, " or ".join(map(str, fits))))
        dims = fits[0]
        self.dims = dims
        es = t.element_size()
        self.es = es
        stride = dict(zip(dims, t.stride()))         # in elements
        size = dict(zip(dims, shape))
        self.kernel = size["tok"]
        self.r = block_size // self.kernel           # kernel blocks per manager block
        self.heads, self.d = spec.heads, spec.head_size
        self.kvn = 2 if kind == "kv" else 1
        self.nb = size["nb"]
        self.s_kv = stride.get("kv", 0)
        self.s_nb, self.s_tok = stride["nb"], stride["tok"]
        self.s_h, self.s_d = stride.get("h", 0), stride["d"]
        self.device_type = getattr(getattr(t, "device", None), "type", "cpu")
        self.base = t.data_ptr()
        self.offset = t.storage_offset()
        # the canonical (token, head, dim) order of one kernel block is dense
        inner = [(self.kernel, self.s_tok), (self.heads, self.s_h), (self.d, self.s_d)]
        expect, dense = 1, True
        for n, s in reversed(inner):
            if n > 1 and s != expect:
                dense = False
            expect *= n
        self.kernel_elems = expect
        self.dense = dense
        self.adjacent = dense and (self.r == 1 or self.s_nb == expect)
        self.segment_bytes = block_size * self.heads * self.d * es   # one (kv, block)
        self.blocks = num_blocks
        if min(self.s_nb, self.s_tok, self.s_d, self.s_h, self.s_kv) < 0:
            raise ValueError("layer %s: negative strides %s" % (spec.name, t.stride()))

    def spans(self, block, kv):
        """The (address, bytes) runs of (manager block, kv) in canonical order,
        or None when they are not dense (the bytes must be converted)."""
        if not 0 <= block < self.blocks:
            raise IndexError("layer %s: block %d of %d" % (self.name, block, self.blocks))
        if not self.dense:
            return None
        first = block * self.r
        a = self.base + (kv * self.s_kv + first * self.s_nb) * self.es
        n = self.kernel_elems * self.es
        if self.adjacent:
            return [(a, n * self.r)]
        return [(a + j * self.s_nb * self.es, n) for j in range(self.r)]

    def view(self, block, kv):
        """A (kernel blocks, tokens, heads, head_size) view of (manager block,
        kv) in canonical order: copy it to or from a staging row."""
        if not 0 <= block < self.blocks:
            raise IndexError("layer %s: block %d of %d" % (self.name, block, self.blocks))
        t = self.tensor
        off = self.offset + kv * self.s_kv + block * self.r * self.s_nb
        return t.as_strided((self.r, self.kernel, self.heads, self.d),
                            (self.s_nb, self.s_tok, self.s_h or 1, self.s_d), off)


def pieces(spans):
    """Buffer objects over (address, bytes) runs, adjacent runs merged."""
    merged = []
    for a, n in spans:
        if merged and merged[-1][0] + merged[-1][1] == a:
            merged[-1][1] += n
        else:
            merged.append([a, n])
    return [raw_buffer(a, n) for a, n in merged]
