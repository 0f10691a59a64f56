"""The memory the index keeps for blocks on the NVMe tier, against the rule
kvpoold's start-up check uses (SRV_NVME_INDEX_BYTES_PER_BLOCK in
server/srv_memlimit.h; docs/configuration.md, "Memory"): a block that
costs more than the rule says would let a full tier outgrow the memory
the check promised, so this fails first. And kvpoold warns, with the
numbers, when the memory it may use cannot hold a full tier's index."""

import os
import re
import subprocess
import time

import kvpool
from conftest import ROOT, Server, free_port

BLOCKS = 100000


def rule():
    with open(os.path.join(ROOT, "server", "srv_memlimit.h")) as f:
        text = f.read()
    per_block = int(re.search(r"#define SRV_NVME_INDEX_BYTES_PER_BLOCK (\d+)u", text).group(1))
    extent = int(re.search(r"#define SRV_NVME_MIN_EXTENT (\d+)u", text).group(1))
    return per_block, extent


def test_nvme_index_bytes_per_block(tmp_path):
    """100,000 blocks on a 1 GiB tier behind a 64 MiB arena (so nearly all
    of them live on NVMe only): STATS index_bytes grows by no more than
    the rule's bytes per block, and by more than the 116-byte header
    (the measure is real)."""
    per_block, _ = rule()
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    s = Server("--dram-capacity", "64MiB", "--threads", "1", "--nvme-dir", str(nvme),
               "--nvme-capacity", "1GiB").start()
    try:
        payload = os.urandom(512)   # one 4 KiB extent each: the smallest
        with kvpool.Client(s.url, "nvme-index") as c:
            before = c.stats()
            for first in range(0, BLOCKS, 1000):
                keys = [i.to_bytes(8, "little") * 4 for i in range(first, first + 1000)]
                assert c.put_many(keys, [payload] * len(keys)) == [0] * len(keys)
            deadline = time.monotonic() + 60
            while True:
                after = c.stats()
                on_nvme = after["tiers"]["nvme"]["blocks"]
                if on_nvme >= BLOCKS or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert after["blocks"] - before["blocks"] == BLOCKS
        assert on_nvme >= BLOCKS - after["tiers"]["dram"]["blocks"], after["tiers"]
        grown = (after["index_bytes"] - before["index_bytes"]) / BLOCKS
        print("index bytes per block: %.1f (rule: %d)" % (grown, per_block))
        assert 116 < grown <= per_block, (
            "a block on the NVMe tier costs %.1f bytes of index; SRV_NVME_INDEX_BYTES_PER_BLOCK "
            "(%d) must cover it: raise it, and the memory in deploy/kubernetes with it" %
            (grown, per_block))
    finally:
        assert s.stop() == 0


def test_nvme_index_warning(tmp_path):
    """A tier whose index cannot fit any host's memory at 4 KiB blocks
    (300 TiB: 12.9 TB of index) is warned about at start with its numbers
    (the tier itself is then refused: no filesystem here holds 300 TiB);
    a small tier starts without the warning."""
    per_block, extent = rule()
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    cap = 300 << 40
    r = subprocess.run([Server().binary, "--listen", "127.0.0.1", "--port", str(free_port()),
                        "--admin-port", "0", "--rdma-port", "0", "--dram-capacity", "64MiB",
                        "--threads", "1", "--nvme-dir", str(nvme), "--nvme-capacity", "300TiB",
                        "--nvme-segment-size", "16GiB"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, "a 300 TiB tier started on this filesystem"
    warn = [line for line in r.stderr.splitlines() if " warn the NVMe tier's index" in line]
    assert warn, r.stderr
    assert ("nvme_capacity (%d bytes) holds up to %d blocks of %d bytes, %d bytes of index each "
            "(%d bytes)" % (cap, cap // extent, extent, per_block, cap // extent * per_block)
            in warn[0]), warn[0]
    assert "enough while the tier's blocks average at least" in warn[0]
    assert "raise the limit to" in warn[0] and "or lower nvme_capacity to" in warn[0]

    small = tmp_path / "small"
    small.mkdir()
    s = Server("--dram-capacity", "64MiB", "--threads", "1", "--nvme-dir", str(small),
               "--nvme-capacity", "256MiB").start()
    try:
        assert "index may outgrow memory" not in s.log_text()
    finally:
        assert s.stop() == 0
