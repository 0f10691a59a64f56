"""STAND-IN of the parts of vLLM's TieringOffloadingManager and scheduler
that drive a secondary tier, written from the contract in the project's
engine notes (§3.1), not from vLLM's code:

- lookup: finished jobs are processed first (a reported job id that is
  not outstanding fails an assertion, as it crashes vLLM's scheduler); a
  primary hit counts; a primary transfer in flight, or a tier's None,
  marks the request deferred and the loop goes on; a tier's True allocates
  a primary row, queues a promotion and counts as deferred; the first
  False ends the prefix (_maximal_prefix_lookup);
- take_events: one submit_load per (tier, request) with its promotions;
- a failed promotion frees its row; a store is one submit_store per
  request with the rows pinned until it is reported.
"""

import numpy as np
from vllm.v1.kv_offload.tiering.base import JobMetadata


class ReqContext:
    def __init__(self, req_id):
        self.req_id = req_id
        self.kv_transfer_params = None


class ManagerStandIn:
    def __init__(self, tier, rows):
        self.tier = tier
        self.rows = rows                 # np array (num_blocks, row_bytes): the primary
        self.primary = {}                # key -> row
        self.free = list(range(rows.shape[0]))
        self.outstanding = {}            # job id -> (kind, keys, block ids)
        self.promoting = {}              # key -> row (a load in flight)
        self.queued = {}                 # req_id -> [(key, row)]
        self.next_job = 1
        self.reported = []
        self.load_rows = set()           # every row given to a submit_load

    def _process_finished(self):
        for r in self.tier.get_finished():
            assert r.job_id in self.outstanding, "unknown or duplicate job %r" % r.job_id
            kind, keys, ids = self.outstanding.pop(r.job_id)
            self.reported.append((r.job_id, kind, r.success))
            if kind == "load":
                for k, b in zip(keys, ids):
                    self.promoting.pop(k, None)
                    if r.success:
                        self.primary[k] = b
                    else:
                        self.free.append(b)

    def lookup(self, req_id, keys):
        """(leading hits, deferred) for one request, as one scheduler step."""
        self._process_finished()
        ctx = ReqContext(req_id)
        hits, defer = 0, False
        for k in keys:
            if k in self.primary:
                hits += 1
                continue
            if k in self.promoting:
                defer = True
                hits += 1
                continue
            r = self.tier.lookup(k, ctx)
            if r is None:
                defer = True
                hits += 1
                continue
            if r is False:
                break
            assert r is True, r
            if not self.free:
                break
            b = self.free.pop()
            self.promoting[k] = b
            self.queued.setdefault(req_id, []).append((k, b))
            defer = True
            hits += 1
        self.take_events()
        return hits, defer

    def take_events(self):
        for req_id, items in self.queued.items():
            job = JobMetadata(self.next_job, [k for k, _ in items],
                              np.array([b for _, b in items], dtype=np.int64), True,
                              ReqContext(req_id))
            self.outstanding[self.next_job] = ("load", job.keys, list(job.block_ids))
            self.load_rows.update(int(b) for b in job.block_ids)
            self.next_job += 1
            self.tier.submit_load(job)
        self.queued = {}

    def store(self, req_id, keys, rows):
        job = JobMetadata(self.next_job, list(keys), np.array(rows, dtype=np.int64), False,
                          ReqContext(req_id))
        self.outstanding[self.next_job] = ("store", job.keys, list(rows))
        self.next_job += 1
        self.tier.submit_store(job)
        return job.job_id

    def evict_primary(self):
        for k, b in self.primary.items():
            self.free.append(b)
        self.primary = {}

    def wait_jobs(self, timeout=10.0):
        import time
        deadline = time.monotonic() + timeout
        while self.outstanding and time.monotonic() < deadline:
            self._process_finished()
            time.sleep(0.005)
        self._process_finished()
        return not self.outstanding
