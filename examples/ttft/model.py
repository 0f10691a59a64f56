"""A reference Llama-architecture decoder on CPU (torch), with a paged KV
cache laid out so that a kvpool block lands in it with no copy.

Architecture (as in Llama 2/3): token embedding; per layer RMSNorm ->
grouped-query attention with rotary position embeddings -> residual ->
RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head; greedy
decoding. Weights are random, drawn from a seeded generator: two processes
built with the same Config hold bit-identical weights (two "GPU nodes"
serving one model). Nothing is downloaded.

KV cache layout (block-major, paged)
------------------------------------
One preallocated tensor per node:

    kv[slot, layer, kv, token, kv_head, dim]      kv = 0 (K) or 1 (V)
    shape (cache_blocks, layers, 2, block_tokens, kv_heads, head_dim)

A request owns a block table: the slot of each of its blocks (any slots,
in any order). kv[slot] is one contiguous run of
layers * 2 * block_tokens * kv_heads * head_dim values, and that run is the
block's kvpool payload, byte for byte: for layer 0..L-1, K then V, each
block_tokens x kv_heads x head_dim in row-major order, in the cache dtype.
So a put sends kv[slot] and a get receives into kv[slot] directly: no
staging buffer, no reshuffle (the same layout on every node of a
namespace). K is stored after the rotary embedding, as engines store it.

Block payload bytes = 2 * layers * kv_heads * head_dim * block_tokens *
dtype bytes (the KV size per token times block_tokens).
"""

import math
from dataclasses import asdict, dataclass

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Config:
    """The model's geometry. Defaults: sized so that a cold prefill of 4,096
    tokens takes several seconds on 2 CPU cores with OpenBLAS."""
    layers: int = 4
    hidden: int = 512
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    ffn: int = 1024
    vocab: int = 32000
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"
    block_tokens: int = 16
    seed: int = 0

    def check(self):
        """Raise ValueError naming the first inconsistent field."""
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab",
                     "block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError("%s must be >= 1, got %d" % (name, getattr(self, name)))
        if self.heads % self.kv_heads:
            raise ValueError("heads (%d) must be a multiple of kv_heads (%d)"
                             % (self.heads, self.kv_heads))
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embedding), got %d" % self.head_dim)
        if self.dtype not in DTYPES:
            raise ValueError("dtype must be one of %s, got %r" % (sorted(DTYPES), self.dtype))
        return self

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype]

    @property
    def kv_bytes_per_token(self):
        """2 x layers x KV heads x head dim x bytes per value."""
        return (2 * self.layers * self.kv_heads * self.head_dim
                * torch.tensor([], dtype=self.torch_dtype).element_size())

    @property
    def block_bytes(self):
        return self.kv_bytes_per_token * self.block_tokens

    def namespace(self):
        """The kvpool namespace: everything that makes two nodes' blocks
        interchangeable (geometry, weights seed, dtype, layout, block size)."""
        return ("ttft-ref-llama:L%d-h%d-q%d-kv%d-d%d-f%d-v%d-s%d:%s:tp1:blockmajor:b%d"
                % (self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim,
                   self.ffn, self.vocab, self.seed, self.dtype, self.block_tokens))

    def as_dict(self):
        return asdict(self)


def _rms_norm(x, weight, eps):
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Model:
    """The decoder's weights and forward pass over a paged KV cache.
    Thread rules: one request at a time (torch itself uses its threads)."""

    QUERY_CHUNK = 1024  # prefill attention in chunks of queries: bounded memory

    def __init__(self, cfg):
        self.cfg = cfg.check()
        g = torch.Generator().manual_seed(cfg.seed)
        dt = cfg.torch_dtype

        def rand(rows, cols, std):
            return (torch.randn(rows, cols, generator=g) * std).to(dt)

        h, hd = cfg.hidden, cfg.head_dim
        q_out, kv_out = cfg.heads * hd, cfg.kv_heads * hd
        out_std = 1.0 / math.sqrt(2 * cfg.layers * h)
        self.embed = rand(cfg.vocab, h, 1.0)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append({
                # weights are (in, out): y = x @ W; q, k, v fused, gate and up fused
                "attn_norm": torch.ones(h, dtype=dt),
                "wqkv": rand(h, q_out + 2 * kv_out, 1.0 / math.sqrt(h)),
                "wo": rand(q_out, h, out_std),
                "mlp_norm": torch.ones(h, dtype=dt),
                "w_gate_up": rand(h, 2 * cfg.ffn, 1.0 / math.sqrt(h)),
                "w_down": rand(cfg.ffn, h, out_std),
            })
        self.final_norm = torch.ones(h, dtype=dt)
        self.lm_head = rand(h, cfg.vocab, 1.0 / math.sqrt(h))
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self._inv_freq = inv
        self._rope_len = 0
        self._cos = self._sin = None

    # ---- KV cache -------------------------------------------------------------

    def new_cache(self, blocks):
        """A preallocated paged KV cache of `blocks` slots (zeroed)."""
        c = self.cfg
        cache = torch.empty((blocks, c.layers, 2, c.block_tokens, c.kv_heads, c.head_dim),
                            dtype=c.torch_dtype)
        return cache.zero_()    # written, so its pages are faulted in now, not on first load

    def _rope(self, positions):
        """cos, sin of shape (len(positions), head_dim) for absolute positions."""
        need = int(positions[-1]) + 1
        if need > self._rope_len:
            n = max(need, 2 * self._rope_len, 1024)
            t = torch.arange(n, dtype=torch.float64)
            f = torch.outer(t, self._inv_freq)
            emb = torch.cat((f, f), dim=-1)
            self._cos = emb.cos().to(self.cfg.torch_dtype)
            self._sin = emb.sin().to(self.cfg.torch_dtype)
            self._rope_len = n
        return self._cos[positions], self._sin[positions]

    def _slots_offsets(self, table, start, end):
        """Slot and in-block offset of each position start..end-1."""
        bt = self.cfg.block_tokens
        pos = torch.arange(start, end)
        return table[pos // bt], pos % bt

    # ---- forward ----------------------------------------------------------------

    def forward(self, cache, table, tokens, start):
        """Run the decoder over `tokens` (a 1-D int64 tensor) at absolute
        positions start .. start+len-1, attending to the cache's positions
        0 .. start-1 (already there: computed or loaded) and to themselves.
        Writes the new tokens' K and V into `cache` through `table` (an int64
        tensor: block index -> slot; it must cover the new positions).
        Returns the logits of the last token, float32 of shape (vocab,)."""
        c = self.cfg
        n = tokens.shape[0]
        end = start + n
        hd, kvh = c.head_dim, c.kv_heads
        group = c.heads // kvh
        q_out, kv_out = c.heads * hd, kvh * hd
        cos, sin = self._rope(torch.arange(start, end))
        cos, sin = cos[:, None, :], sin[:, None, :]
        new_slots, new_offs = self._slots_offsets(table, start, end)
        nblk = (end + c.block_tokens - 1) // c.block_tokens
        blocks = table[:nblk]
        scale = 1.0 / math.sqrt(hd)

        x = self.embed[tokens]
        for li, w in enumerate(self.layers):
            hx = _rms_norm(x, w["attn_norm"], c.norm_eps)
            qkv = hx @ w["wqkv"]
            q = qkv[:, :q_out].reshape(n, c.heads, hd)
            k = qkv[:, q_out:q_out + kv_out].reshape(n, kvh, hd)
            v = qkv[:, q_out + kv_out:].reshape(n, kvh, hd)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache[new_slots, li, 0, new_offs] = k
            cache[new_slots, li, 1, new_offs] = v
            # This request's K and V for positions 0..end-1, gathered from its blocks.
            kvl = cache[:, li].index_select(0, blocks)           # (nblk, 2, bt, kvh, hd)
            keys = kvl[:, 0].reshape(-1, kvh, hd)[:end]
            vals = kvl[:, 1].reshape(-1, kvh, hd)[:end]
            k_t = keys.permute(1, 2, 0).contiguous()              # (kvh, hd, end)
            v_h = vals.permute(1, 0, 2).contiguous()              # (kvh, end, hd)
            # queries grouped by KV head: (n, kvh, group, hd)
            qg = (q * scale).reshape(n, kvh, group, hd)
            out = torch.empty(n, kvh, group, hd, dtype=x.dtype)
            for a in range(0, n, self.QUERY_CHUNK):
                b = min(n, a + self.QUERY_CHUNK)
                m = b - a
                kend = start + b                                  # keys 0..kend-1 visible
                qc = qg[a:b].permute(1, 2, 0, 3).reshape(kvh, group * m, hd)
                s = torch.bmm(qc, k_t[:, :, :kend]).view(kvh, group, m, kend)
                # causal: query start+a+i sees keys <= start+a+i
                diag = s[..., start + a:kend]
                diag.masked_fill_(torch.ones(m, m, dtype=torch.bool).triu_(1), float("-inf"))
                p = torch.softmax(s.float(), dim=-1).to(x.dtype).view(kvh, group * m, kend)
                o = torch.bmm(p, v_h[:, :kend]).view(kvh, group, m, hd)
                out[a:b] = o.permute(2, 0, 1, 3)
            x = x + out.reshape(n, q_out) @ w["wo"]
            hx = _rms_norm(x, w["mlp_norm"], c.norm_eps)
            gu = hx @ w["w_gate_up"]
            x = x + (torch.nn.functional.silu(gu[:, :c.ffn]) * gu[:, c.ffn:]) @ w["w_down"]
        last = _rms_norm(x[-1:], self.final_norm, c.norm_eps)
        return (last @ self.lm_head).float()[0]

    def greedy(self, cache, table, first_logits, start, count):
        """Greedy decoding: the first token is argmax(first_logits) (the
        prefill's logits, for position `start`); each later one is fed back at
        the next position. Returns `count` token ids. The table must cover
        positions up to start + count - 2."""
        out = [int(torch.argmax(first_logits))]
        pos = start
        while len(out) < count:
            logits = self.forward(cache, table, torch.tensor([out[-1]]), pos)
            out.append(int(torch.argmax(logits)))
            pos += 1
        return out


def dense_reference(model, tokens):
    """The same decoder written the plain way (no paging, no chunking, full
    causal mask, K/V repeated per query head): last-token logits of a cold
    prefill of `tokens`. For tests of Model.forward."""
    c = model.cfg
    n = len(tokens)
    hd, group = c.head_dim, c.heads // c.kv_heads
    q_out, kv_out = c.heads * hd, c.kv_heads * hd
    cos, sin = model._rope(torch.arange(n))
    cos, sin = cos[:, None, :], sin[:, None, :]
    mask = torch.full((n, n), float("-inf")).triu_(1)
    x = model.embed[torch.as_tensor(tokens)]
    for w in model.layers:
        hx = _rms_norm(x, w["attn_norm"], c.norm_eps)
        qkv = hx @ w["wqkv"]
        q = qkv[:, :q_out].reshape(n, c.heads, hd)
        k = qkv[:, q_out:q_out + kv_out].reshape(n, c.kv_heads, hd)
        v = qkv[:, q_out + kv_out:].reshape(n, c.kv_heads, hd)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s.float(), -1).to(x.dtype), v)
        x = x + o.reshape(n, q_out) @ w["wo"]
        hx = _rms_norm(x, w["mlp_norm"], c.norm_eps)
        gu = hx @ w["w_gate_up"]
        x = x + (torch.nn.functional.silu(gu[:, :c.ffn]) * gu[:, c.ffn:]) @ w["w_down"]
    return (_rms_norm(x[-1:], model.final_norm, c.norm_eps) @ model.lm_head).float()[0]


def add_model_args(parser):
    """The model's flags (shared by the node and the demo driver)."""
    d = Config()
    g = parser.add_argument_group("model (every node of one namespace must agree)")
    g.add_argument("--layers", type=int, default=d.layers)
    g.add_argument("--hidden", type=int, default=d.hidden, help="hidden size")
    g.add_argument("--heads", type=int, default=d.heads, help="query heads")
    g.add_argument("--kv-heads", type=int, default=d.kv_heads, help="KV heads (GQA)")
    g.add_argument("--head-dim", type=int, default=d.head_dim)
    g.add_argument("--ffn", type=int, default=d.ffn, help="SwiGLU intermediate size")
    g.add_argument("--vocab", type=int, default=d.vocab)
    g.add_argument("--dtype", default=d.dtype, choices=sorted(DTYPES))
    g.add_argument("--block-tokens", type=int, default=d.block_tokens,
                   help="tokens per KV block (default %(default)s, as in vLLM)")
    g.add_argument("--seed", type=int, default=d.seed, help="weights seed")


def config_from_args(args):
    return Config(layers=args.layers, hidden=args.hidden, heads=args.heads,
                  kv_heads=args.kv_heads, head_dim=args.head_dim, ffn=args.ffn,
                  vocab=args.vocab, dtype=args.dtype, block_tokens=args.block_tokens,
                  seed=args.seed).check()


def model_argv(cfg):
    """The flags that rebuild cfg in another process."""
    return ["--layers", str(cfg.layers), "--hidden", str(cfg.hidden), "--heads",
            str(cfg.heads), "--kv-heads", str(cfg.kv_heads), "--head-dim", str(cfg.head_dim),
            "--ffn", str(cfg.ffn), "--vocab", str(cfg.vocab), "--dtype", cfg.dtype,
            "--block-tokens", str(cfg.block_tokens), "--seed", str(cfg.seed)]


def blas_library():
    """Which BLAS this process has mapped (torch's CPU matmuls go through
    it on Debian): 'openblas' or 'reference' (netlib, ~8x slower here),
    with the library's path."""
    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if "blas" in p.rsplit("/", 1)[-1]:
                    paths.add(p)
    except OSError:
        return "unknown", ""
    # libtorch links libblas.so.3 (the Debian alternative) ahead of
    # libopenblas.so.0, so sgemm_ comes from whichever libblas.so.3 is mapped.
    for p in sorted(paths):
        if p.rsplit("/", 1)[-1].startswith("libblas.so"):
            return ("openblas" if "openblas" in p else "reference"), p
    for p in sorted(paths):
        if "openblas" in p:
            return "openblas", p
    return "unknown", ", ".join(sorted(paths))
