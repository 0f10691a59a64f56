"""A host KV pool with the fields SGLang's storage backends use (page_size,
layout, size, kv_buffer, dtype, get_page_buffer_meta, get_size_per_token,
get_ksize_per_token) over a CPU tensor, with the buffer dimensions and
per-page pieces of the project's engine notes (§2.4). SGLang's real host
pool does not import without a GPU build, so the tests use this one."""

import torch


class FakeHostPool:
    def __init__(self, layout="page_first", mla=False, page_size=4, layers=3, heads=2,
                 head_dim=8, pages=96, dtype=torch.bfloat16, guard_pages=1):
        self.layout = layout
        self.mla = mla
        self.page_size = page_size
        self.layers = layers
        self.heads = heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.guard = guard_pages           # untouched pages at each end
        slots = (pages + 2 * guard_pages) * page_size
        self.size = slots
        if mla:
            shape = (layers, slots, 1, head_dim) if layout == "layer_first" else \
                (slots, layers, 1, head_dim)
        else:
            shape = (2, layers, slots, heads, head_dim) if layout == "layer_first" else \
                (2, slots, layers, heads, head_dim)
        self.kv_buffer = torch.zeros(shape, dtype=dtype)
        self.es = self.kv_buffer.element_size()

    def get_ksize_per_token(self):
        return self.layers * (1 if self.mla else self.heads) * self.head_dim * self.es

    def get_size_per_token(self):
        return self.get_ksize_per_token() * (1 if self.mla else 2)

    def page_bytes(self):
        return self.get_size_per_token() * self.page_size

    def indices(self, first_page, n_pages):
        """host_indices of n_pages pages from page first_page (after the guard)."""
        lo = (self.guard + first_page) * self.page_size
        return torch.arange(lo, lo + n_pages * self.page_size, dtype=torch.int64)

    def get_page_buffer_meta(self, host_indices):
        ptrs, sizes = [], []
        kv, p, es = self.kv_buffer, self.page_size, self.es
        for i in range(0, len(host_indices), p):
            s = int(host_indices[i])
            if self.mla and self.layout == "layer_first":
                for layer in range(self.layers):
                    ptrs.append(kv[layer, s].data_ptr())
                    sizes.append(p * self.head_dim * es)
            elif self.mla:
                ptrs.append(kv[s].data_ptr())
                sizes.append(self.layers * p * self.head_dim * es)
            elif self.layout == "layer_first":
                for layer in range(self.layers):
                    for k_or_v in (0, 1):
                        ptrs.append(kv[k_or_v, layer, s].data_ptr())
                        sizes.append(p * self.heads * self.head_dim * es)
            else:
                for k_or_v in (0, 1):
                    ptrs.append(kv[k_or_v, s].data_ptr())
                    sizes.append(self.layers * p * self.heads * self.head_dim * es)
        return ptrs, sizes

    def page_view(self, host_indices):
        """The bytes of the pages at host_indices, per page (a copy, for checks)."""
        ptrs, sizes = self.get_page_buffer_meta(host_indices)
        n = len(host_indices) // self.page_size
        per = len(ptrs) // n
        import ctypes
        out = []
        for i in range(n):
            out.append(b"".join(ctypes.string_at(ptrs[j], sizes[j])
                                for j in range(i * per, (i + 1) * per)))
        return out

    def fill_random(self, seed):
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer.copy_(torch.randn(self.kv_buffer.shape, generator=g).to(self.dtype))

    def raw_bytes(self):
        """The whole buffer's bytes (a copy, for checks)."""
        return self.kv_buffer.reshape(-1).view(torch.uint8).numpy().tobytes()
