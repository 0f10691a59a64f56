"""STAND-IN of LMCache's connector package (ConnectorAdapter, ConnectorContext)
for the kvpool contract tests, written from the contract in the project's
engine notes (remote_storage_plugins.rst @4e653f65), not from LMCache's
code. Used only when LMCache is not importable."""

from dataclasses import dataclass
from typing import Any

STANDIN = True


@dataclass
class ConnectorContext:
    url: str
    loop: Any
    local_cpu_backend: Any
    config: Any
    metadata: Any
    plugin_name: str = "kvpool"


class ConnectorAdapter:
    def __init__(self, schema):
        self.schema = schema

    def can_parse(self, url):
        return url.startswith(self.schema)

    def create_connector(self, context):
        raise NotImplementedError
