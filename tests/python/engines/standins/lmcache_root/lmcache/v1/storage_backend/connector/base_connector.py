"""STAND-IN of LMCache's RemoteConnector (base_connector.py, wxsms/LMCache
9f5cee0c), written from the contract, not LMCache's code: six abstract
methods; __init__(config, metadata) sets the chunk metadata a connector
uses for partial chunks (save_chunk_meta from extra_config, default true;
meta_shapes/meta_dtypes from metadata.get_shapes()/get_dtypes() when
present, else from the deprecated kv_shape (layers, 2, tokens, heads,
head size) as (2, layers, tokens, heads x head size); full_chunk_size_bytes;
single_token_size = full / chunk_size); reshape_partial_chunk(obj, bytes)
cuts an object down to the tokens `bytes` hold (token dimension 2)."""

import abc

import torch

STANDIN = True


class RemoteConnector(abc.ABC):
    def __init__(self, config, metadata):
        assert metadata is not None
        extra = getattr(config, "extra_config", None)
        self.save_chunk_meta = extra is None or extra.get("save_chunk_meta", True)
        if hasattr(metadata, "get_shapes"):
            self.meta_shapes = metadata.get_shapes()
            self.meta_dtypes = metadata.get_dtypes()
        else:
            layers, kv, tokens, heads, dim = metadata.kv_shape
            self.meta_shapes = [torch.Size((kv, layers, tokens, heads * dim))]
            self.meta_dtypes = [metadata.kv_dtype]
        self.meta_fmt = "KV_MLA_FMT" if getattr(metadata, "use_mla", False) else "KV_2LTD"
        es = torch.empty((), dtype=self.meta_dtypes[0]).element_size()
        self.full_chunk_size_bytes = sum(s.numel() for s in self.meta_shapes) * es
        chunk = getattr(config, "chunk_size", None) or self.meta_shapes[0][2]
        assert self.full_chunk_size_bytes % chunk == 0
        self.single_token_size = self.full_chunk_size_bytes // chunk

    def reshape_partial_chunk(self, memory_obj, bytes_read):
        if bytes_read == 0 or bytes_read % self.single_token_size or \
                bytes_read > self.full_chunk_size_bytes:
            raise ValueError("bytes_read %d is illegal" % bytes_read)
        if bytes_read == self.full_chunk_size_bytes:
            return memory_obj
        tokens = bytes_read // self.single_token_size
        return memory_obj.cut_tokens(tokens)

    @abc.abstractmethod
    async def exists(self, key):
        ...

    @abc.abstractmethod
    def exists_sync(self, key):
        ...

    @abc.abstractmethod
    async def get(self, key):
        ...

    @abc.abstractmethod
    async def put(self, key, memory_obj):
        ...

    @abc.abstractmethod
    async def list(self):
        ...

    @abc.abstractmethod
    async def close(self):
        ...
