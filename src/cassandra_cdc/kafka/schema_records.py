"""Table schema records on the compacted schema topic (default ``<server>.table-schemas``).

Key: ``<keyspace>.<table>`` (UTF-8). Value (JSON)::

    {"keyspace": "shop", "table": "orders", "table_id": "5a1c…", "version": "3f2a…",
     "cql": "CREATE TABLE shop.orders (…) WITH ID = 5a1c… AND cdc = true;",
     "node": "node1", "ts_ms": 1700000000000, "defined_at": 1699999990000000}

``version`` changes whenever the definition does; the pipeline decodes a raw record with the schema
whose ``table_id`` matches it, and the latest ``version`` of it. ``defined_at`` (microseconds) is when
the definition was written to the node's ``system_schema`` (``TableMetadata.defined_at``): what orders two
versions of a table published out of order. It is absent when the schema came from a CQL file.

When a table is dropped, each agent that saw it go publishes its last definition once more with
``"dropped": true`` (absent otherwise, so that readers of earlier versions read every other record): what
the pipeline writes Debezium's ``DROP`` from, and still decodes the table's late records with.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ..schema import TableMetadata, parse_schema


# Fields left out of a record at these values, so that readers of versions before them read it.
_OMITTED_AT = {"dropped": False, "defined_at": None}


@dataclass(frozen=True)
class SchemaRecord:
    keyspace: str
    table: str
    table_id: str
    version: str
    cql: str
    node: str
    ts_ms: int
    dropped: bool = False
    defined_at: int | None = None

    @staticmethod
    def of(table: TableMetadata, node: str, dropped: bool = False) -> "SchemaRecord":
        return SchemaRecord(table.keyspace, table.name, str(table.id), table.version_hash(), table.ddl(), node,
                            int(time.time() * 1000), dropped, table.defined_at)

    @property
    def key(self) -> bytes:
        return f"{self.keyspace}.{self.table}".encode()

    def encode(self) -> bytes:
        fields = {name: value for name, value in self.__dict__.items()
                  if name not in _OMITTED_AT or value != _OMITTED_AT[name]}
        return json.dumps(fields, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes) -> "SchemaRecord":
        return SchemaRecord(**json.loads(value))

    @staticmethod
    def looks_like_one(value: bytes) -> bool:
        """Whether ``value`` is meant as a schema record (a JSON object with ``cql``), readable or not."""
        try:
            fields = json.loads(value)
        except ValueError:
            return False
        return isinstance(fields, dict) and "cql" in fields

    def table_metadata(self) -> TableMetadata:
        schema = parse_schema(self.cql, source=f"schema record {self.keyspace}.{self.table}")
        table = schema.table(self.keyspace, self.table)
        if table is None:
            raise ValueError(f"schema record {self.keyspace}.{self.table} does not define that table")
        table.defined_at = self.defined_at
        return table
