"""Code the engine adapters (kvpool.sglang, kvpool.vllm, kvpool.lmcache)
share, none of it engine-specific and none of it importing an engine:

  link        Link, a kvpool connection that never raises into the engine
              and reconnects in the background; RateLimitedLog;
              put_rerooting (the -ENOLINK re-put)
  keys        namespaces from an engine's configuration; 32-byte keys from
              engine hashes and key strings
  buffers     engine memory (raw addresses, tensors) as buffer objects
  async_link  make_async_link: requests that complete in the background,
              for the adapters whose engine must never wait on them

Internal: the names may change between releases.
"""
