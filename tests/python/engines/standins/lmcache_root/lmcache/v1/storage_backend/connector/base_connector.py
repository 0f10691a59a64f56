"""STAND-IN of LMCache's RemoteConnector (base_connector.py @01712fbd),
written from the contract: six abstract methods, no __init__. Not LMCache's
code."""

import abc

STANDIN = True


class RemoteConnector(abc.ABC):
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
