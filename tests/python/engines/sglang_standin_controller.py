"""STAND-IN of the parts of SGLang's HiCacheController that call a storage
backend, written from the contract in the project's engine notes (§2.3),
not from SGLang's code: prefetch = batch_exists per 128 keys, stopping at
the first short answer, MIN over ranks, then batch_get_v1 per batch
counting leading Trues; backup = all(batch_set_v1(...)) per batch,
stopping at the first failure; MLA ranks other than 0 skip the write."""

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

BATCH = 128


def exists_run(backend, keys, prefix_keys=None, pass_prefix=True):
    """Leading pages present, as the prefetch thread counts them."""
    n = 0
    prefix = list(prefix_keys or [])
    for i in range(0, len(keys), BATCH):
        batch = keys[i:i + BATCH]
        info = HiCacheStorageExtraInfo(prefix_keys=list(prefix) if pass_prefix else None)
        got = backend.batch_exists(batch, info)
        assert type(got) is int and 0 <= got <= len(batch), got
        n += got
        if got < len(batch):
            break
        prefix.extend(batch)
    return n


def load(backend, keys, host_indices, page, prefix_keys=None):
    """batch_get_v1 per batch into host_indices; the pages completed."""
    done = 0
    prefix = list(prefix_keys or [])
    for i in range(0, len(keys), BATCH):
        batch = keys[i:i + BATCH]
        res = backend.batch_get_v1(batch, host_indices[i * page:(i + len(batch)) * page],
                                   HiCacheStorageExtraInfo(prefix_keys=list(prefix)))
        assert isinstance(res, list) and len(res) == len(batch), res
        assert all(type(r) is bool for r in res)
        lead = res.index(False) if False in res else len(res)
        done += lead
        if lead < len(batch):
            break
        prefix.extend(batch)
    return done


def prefetch(backends, keys, host_indices_per_rank, page, prefix_keys=None):
    """Every rank's exists, the MIN, then every rank's loads."""
    hit = min(exists_run(b, keys, prefix_keys) for b in backends)
    return hit, [load(b, keys[:hit], h, page, prefix_keys)
                 for b, h in zip(backends, host_indices_per_rank)]


def backup(backend, keys, host_indices, page, prefix_keys=None):
    """Pages written before the first failed batch (as the backup thread)."""
    cfg = backend.storage_config
    if cfg.is_mla_model and cfg.tp_rank != 0:
        return len(keys)                          # backup_skip
    done = 0
    prefix = list(prefix_keys or [])
    for i in range(0, len(keys), BATCH):
        batch = keys[i:i + BATCH]
        res = backend.batch_set_v1(batch, host_indices[i * page:(i + len(batch)) * page],
                                   HiCacheStorageExtraInfo(prefix_keys=list(prefix)))
        assert isinstance(res, list) and len(res) == len(batch), res
        if not all(res):
            break
        done += len(batch)
        prefix.extend(batch)
    return done
