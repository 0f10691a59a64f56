#!/usr/bin/env python3
"""An inference engine's KV offload loop over kvpool, in miniature.

Worker 1 prefills a prompt and puts its full KV blocks into the pool.
Worker 2 gets a prompt with the same prefix: it matches the prompt's block
hashes, loads exactly the matched blocks into its own KV cache (no copies),
checks them, and would prefill only the rest.  Usage: offload.py [URL [NS]]
"""
import sys

import numpy as np

import kvpool

# Qwen2.5-7B KV geometry (28 layers, 4 KV heads, head_dim 128), 16-token
# blocks: 896 KiB per block in fp16. 32 cache slots = 28 MiB per worker.
LAYERS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS, SLOTS = 28, 4, 128, 16, 32
SHAPE = (SLOTS, LAYERS, 2, BLOCK_TOKENS, KV_HEADS, HEAD_DIM)


def fake_kv(key):
    """Stand-in for the model: a block's K/V depend on its whole prefix,
    i.e. on its chained hash."""
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    return rng.standard_normal(SHAPE[1:], dtype=np.float32).astype(np.float16)


def main(url=kvpool.DEFAULT_URL, ns="qwen2.5-7b:fp16:tp1:b16:example"):
    system = list(range(1000, 1080))                    # an 80-token shared prefix
    prompt_a = system + [7, 8, 9] * 7                   # 101 tokens: 6 full blocks
    prompt_b = system + [4, 5] * 20                     # 120 tokens: 7 full blocks

    with kvpool.Client(url, ns) as c:
        c.drop_namespace()                              # same figures on every run
        kv1 = np.zeros(SHAPE, dtype=np.float16)        # worker 1's KV cache
        keys_a = kvpool.block_hashes(prompt_a, BLOCK_TOKENS)
        slots_a = list(range(len(keys_a)))              # its block table
        for key, slot in zip(keys_a, slots_a):          # "prefill"
            kv1[slot] = fake_kv(key)
        st = c.put_chain(keys_a, [kv1[s] for s in slots_a])
        assert st == [0] * len(keys_a), [kvpool.strerror(s) for s in st]

        kv2 = np.zeros(SHAPE, dtype=np.float16)        # worker 2's KV cache
        keys_b = kvpool.block_hashes(prompt_b, BLOCK_TOKENS)
        slots_b = [SLOTS - 1 - i for i in range(len(keys_b))]   # its block table
        n = c.match(keys_b, lease_ms=2000)              # leading blocks in the pool
        got = c.get_into_many(keys_b[:n], [kv2[s] for s in slots_b[:n]])
        assert got == [kv2[0].nbytes] * n, got
        for key, slot in zip(keys_b[:n], slots_b[:n]):
            assert np.array_equal(kv2[slot], fake_kv(key)), "block %s differs" % key.hex()
        for key, slot in zip(keys_b[n:], slots_b[n:]):  # prefill only the rest
            kv2[slot] = fake_kv(key)
        st = c.put_chain(keys_b[n:], [kv2[s] for s in slots_b[n:]],
                         parent=keys_b[n - 1] if n else None)
        assert st == [0] * (len(keys_b) - n), [kvpool.strerror(s) for s in st]

    print("prompt B: %d of %d blocks matched and loaded (%d of %d tokens, %.1f MiB), "
          "verified; prefilled %d" % (n, len(keys_b), n * BLOCK_TOKENS, len(prompt_b),
                                      n * kv2[0].nbytes / 2**20, len(keys_b) - n))
    return 0 if n == len(system) // BLOCK_TOKENS else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
