"""The binding over several nodes: kvpool.Client takes the same cluster
URLs as libkvpool (a node list, or etcd://HOST:PORT/CLUSTER), and blocks
land where kvpool.placement (the pure-Python HRW twin) says: each on the
first node of its own key's ranking."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

import kvpool
from kvpool import placement

from conftest import Server, free_port, skip_or_fail

FLAGS = ("--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "1",
         "--log-level", "warn", "--rdma-port", "0")


@pytest.fixture
def three():
    servers = [Server(*FLAGS).start() for _ in range(3)]
    yield servers
    for s in servers:
        s.stop()


def _chain(tag, n):
    return kvpool.block_hashes(list(range(n * 4)), block_size=4, extra=tag.encode())


def test_node_list_and_placement(three):
    url = "tcp://" + ",".join("127.0.0.1:%d" % s.port for s in three)
    names = ["127.0.0.1:%d" % s.port for s in three]
    keys = _chain("py-cluster", 70)
    blocks = [bytes([i % 251]) * 512 for i in range(len(keys))]
    with kvpool.Client(url, "pycl") as c:
        c.put_chain(keys, blocks)
        assert c.match(keys) == len(keys)
        assert c.get_many(keys) == blocks
        st = c.stats()
        assert len(st["cluster"]["nodes"]) == 3
        assert st["blocks"] == len(keys)
    # Each block sits on the owner kvpool.placement names (its own key's
    # first node), stored with no parent there.
    direct = [kvpool.Client(s.url, "pycl") for s in three]
    try:
        for k in keys:
            o = placement.block_owners(k, names)[0]
            for i, d in enumerate(direct):
                assert d.match([k]) == (1 if i == o else 0)
    finally:
        for d in direct:
            d.close()
    # Another handle (a fresh process would do the same) finds any key.
    with kvpool.Client(url, "pycl") as other:
        assert other.get_many(keys[40:45]) == blocks[40:45]


def test_native_async_link_on_a_cluster(three):
    # The engine adapters' asynchronous link uses libkvpool's asynchronous
    # calls on a cluster URL too (it fell back to a worker thread running
    # requests one at a time while cluster handles answered -EOPNOTSUPP).
    import select
    from kvpool._adapters import link as _link
    from kvpool._adapters.async_link import make_async_link

    url = "tcp://" + ",".join("127.0.0.1:%d" % s.port for s in three)
    keys = _chain("py-cluster-async", 40)
    blocks = [bytes([i % 251]) * 300 for i in range(len(keys))]
    link = _link.Link(url, "pycl-async")
    a = make_async_link(link)
    try:
        assert a.native
        ids = {a.submit_put_many(keys, blocks, [None] + keys[:-1], tag="p"): "p"}
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 1 and time.monotonic() < deadline:
            select.select([a.event_fd()], [], [], 1)
            got += a.poll()
        assert got and got[0].status == 0 and got[0].statuses == [0] * len(keys)
        bufs = [bytearray(300) for _ in keys]
        ids = [a.submit_match(keys, tag="m"), a.submit_get_into_many(keys, bufs, tag="g"),
               a.submit_exists_many(keys, tag="e")]
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            select.select([a.event_fd()], [], [], 1)
            got += a.poll()
        by = {c.tag: c for c in got}
        assert sorted(c.id for c in got) == sorted(ids)
        assert by["m"].matched == len(keys)
        assert by["g"].status == 0 and [bytes(b) for b in bufs] == blocks
        assert by["e"].statuses == [0] * len(keys)
    finally:
        a.close()
        link.close()


def test_node_down_is_a_miss(three):
    url = "tcp://" + ",".join("127.0.0.1:%d" % s.port for s in three)
    keys = _chain("py-down", 96)
    with kvpool.Client(url, "pydown") as c:
        c.put_chain(keys, [b"x" * 256] * len(keys))
        assert c.match(keys) == 96
        three[placement.owner(keys[32], ["127.0.0.1:%d" % s.port for s in three])].kill()
        m = c.match(keys)           # no exception: the dead node's segment is short
        assert m < 96
        got = c.get_many(keys[:m])
        assert all(isinstance(g, bytes) for g in got)


def _etcd_or_skip():
    etcd = shutil.which(os.environ.get("KVPOOL_ETCD", "etcd"))
    if not etcd:
        skip_or_fail("etcd is not installed (apt-get install etcd-server)")
    return etcd


def test_etcd_url():
    etcd = _etcd_or_skip()
    d = tempfile.mkdtemp(prefix="kvpool-etcd-")
    cport, pport = free_port(), free_port()
    lc, lp = "http://127.0.0.1:%d" % cport, "http://127.0.0.1:%d" % pport
    proc = subprocess.Popen([etcd, "--name", "py", "--data-dir", d + "/data",
                             "--listen-client-urls", lc, "--advertise-client-urls", lc,
                             "--listen-peer-urls", lp, "--initial-advertise-peer-urls", lp,
                             "--initial-cluster", "py=" + lp, "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node = None
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", cport), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        url = "etcd://127.0.0.1:%d/py" % cport
        node = Server(*(FLAGS + ("--cluster", url, "--node-name", "py1",
                                 "--cluster-lease-s", "2"))).start()
        deadline = time.monotonic() + 10
        while True:
            with kvpool.Client(url, "pyetcd") as c:
                if c.stats()["cluster"]["nodes"]:
                    keys = _chain("py-etcd", 40)
                    c.put_chain(keys, [b"y" * 128] * 40)
                    assert c.match(keys) == 40
                    assert c.stats()["cluster"]["nodes"][0]["name"] == "py1"
                    assert c.stats()["cluster"]["etcd"]["reachable"] is True
                    break
            assert time.monotonic() < deadline, "the node never showed up in etcd"
            time.sleep(0.2)
    finally:
        if node:
            node.stop()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)
