"""Table metadata: what a reader needs to know about a table to decode its partition updates."""

from __future__ import annotations

import enum
import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from .types import BLOB, EMPTY, CqlType, quote, simple_type


class ColumnKind(enum.IntEnum):
    # Ordinals as in Cassandra's ColumnMetadata.Kind: they take part in the column sort order.
    PARTITION_KEY = 0
    CLUSTERING = 1
    REGULAR = 2
    STATIC = 3


@dataclass(frozen=True)
class ColumnMetadata:
    name: str
    type: CqlType
    kind: ColumnKind
    position: int = -1  # index within the partition key or clustering; -1 for regular/static columns
    reversed: bool = False  # clustering order DESC
    dropped_time: int | None = None  # microseconds; set for a column that was dropped

    @property
    def name_bytes(self) -> bytes:
        return self.name.encode("utf-8")

    @property
    def is_complex(self) -> bool:
        """Non-frozen collection or UDT: stored as one cell per element, with cell paths."""
        return self.type.multi_cell

    @property
    def is_static(self) -> bool:
        return self.kind is ColumnKind.STATIC

    def sort_key(self) -> tuple[int, bytes]:
        """Cassandra's ColumnMetadata order: kind, simple before complex, position, then name bytes.

        The name part is the first 8 bytes with the top bit flipped (so a name whose first byte is
        >= 0x80 sorts before ASCII names), then the whole name, unsigned.
        """
        name = self.name_bytes
        prefix = int.from_bytes(name[:8].ljust(8, b"\0"), "big") ^ (1 << 63)
        position = max(self.position, 0)
        order = (self.kind << 61) | ((1 << 60) if self.is_complex else 0) | (position << 48) | (prefix >> 16)
        return order, name


@dataclass
class TableMetadata:
    keyspace: str
    name: str
    id: uuid.UUID
    partition_key: tuple[ColumnMetadata, ...]
    clustering: tuple[ColumnMetadata, ...]
    regular_and_static: tuple[ColumnMetadata, ...]
    dropped: tuple[ColumnMetadata, ...] = ()
    cdc: bool = False
    compact_storage: bool = False
    options: dict[str, str] = field(default_factory=dict)  # other WITH options, as CQL text

    def __post_init__(self) -> None:
        self._by_name = {c.name_bytes: c for c in self.regular_and_static}
        self._dropped_by_name = {c.name_bytes: c for c in self.dropped}

    @property
    def qualified_name(self) -> str:
        return f"{self.keyspace}.{self.name}"

    @property
    def columns(self) -> tuple[ColumnMetadata, ...]:
        return self.partition_key + self.clustering + self.regular_and_static

    @property
    def primary_key(self) -> tuple[ColumnMetadata, ...]:
        return self.partition_key + self.clustering

    @property
    def is_counter(self) -> bool:
        return any(c.type.is_counter for c in self.regular_and_static)

    def column(self, name_bytes: bytes) -> ColumnMetadata | None:
        """A regular or static column by its name bytes, falling back to dropped columns.

        Cassandra resolves header names the same way, so mutations written before a DROP decode.
        """
        return self._by_name.get(name_bytes) or self._dropped_by_name.get(name_bytes)

    def sorted_columns(self, columns: Iterable[ColumnMetadata]) -> tuple[ColumnMetadata, ...]:
        return tuple(sorted(columns, key=ColumnMetadata.sort_key))

    # --- partition keys ---------------------------------------------------------------------------

    def split_partition_key(self, key: bytes) -> list[bytes]:
        """The values of the partition key columns (a composite key is CompositeType-encoded)."""
        if len(self.partition_key) == 1:
            return [key]
        values, pos = [], 0
        for _ in self.partition_key:
            if pos + 2 > len(key):
                raise ValueError(f"composite partition key of {self.qualified_name} is truncated: {key.hex()}")
            size = int.from_bytes(key[pos:pos + 2], "big")
            values.append(key[pos + 2:pos + 2 + size])
            pos += 3 + size  # length, value, end-of-component byte
        if pos != len(key):
            raise ValueError(f"composite partition key of {self.qualified_name} has extra bytes: {key.hex()}")
        return values

    def compose_partition_key(self, values: list[bytes]) -> bytes:
        if len(values) != len(self.partition_key):
            raise ValueError(f"{self.qualified_name} has {len(self.partition_key)} partition key columns")
        if len(values) == 1:
            return values[0]
        return b"".join(len(v).to_bytes(2, "big") + v + b"\0" for v in values)

    # --- CQL --------------------------------------------------------------------------------------

    def to_cql(self) -> str:
        """``CREATE TABLE`` as cqlsh ``DESCRIBE`` prints it (parseable by :mod:`.cql`)."""
        lines = []
        hidden = self._hidden_compact_columns()
        for column in self.columns:
            if column.name in hidden:
                continue
            static = " static" if column.is_static and not self._static_compact else ""
            lines.append(f"    {quote(column.name)} {column.type.cql}{static}")
        pk = ", ".join(quote(c.name) for c in self.partition_key)
        if len(self.partition_key) > 1:
            pk = f"({pk})"
        clustering = [c for c in self.clustering if c.name not in hidden]
        key = ", ".join([pk] + [quote(c.name) for c in clustering])
        lines.append(f"    PRIMARY KEY ({key})")
        options = []
        if self.compact_storage:
            options.append("COMPACT STORAGE")
        options.append(f"ID = {self.id}")
        if clustering:
            order = ", ".join(f"{quote(c.name)} {'DESC' if c.reversed else 'ASC'}" for c in clustering)
            options.append(f"CLUSTERING ORDER BY ({order})")
        if self.cdc:
            options.append("cdc = true")
        options += [f"{k} = {v}" for k, v in sorted(self.options.items())]
        text = f"CREATE TABLE {quote(self.keyspace)}.{quote(self.name)} (\n" + ",\n".join(lines) + "\n)"
        text += " WITH " + "\n    AND ".join(options) + ";"
        for column in self.dropped:
            kind = " static" if column.is_static else ""
            text += (f"\nALTER TABLE {quote(self.keyspace)}.{quote(self.name)} DROP {quote(column.name)}{kind}"
                     f" USING TIMESTAMP {column.dropped_time};  -- type {column.type.cql}")
        return text

    def version_hash(self) -> str:
        """A stable hash of the definition: changes whenever the table's schema does."""
        return hashlib.sha256(self.to_cql().encode()).hexdigest()[:16]

    @property
    def _static_compact(self) -> bool:
        return self.compact_storage and not self.clustering_declared

    @property
    def clustering_declared(self) -> bool:
        return any(c.name not in self._hidden_compact_columns() for c in self.clustering)

    def _hidden_compact_columns(self) -> set[str]:
        if not self.compact_storage:
            return set()
        hidden = {c.name for c in self.regular_and_static if c.type is EMPTY or c.type.kind == "empty"}
        if all(c.is_static for c in self.regular_and_static if c.name not in hidden) and \
                [c.name for c in self.clustering] == [STATIC_COMPACT_CLUSTERING]:
            hidden |= {STATIC_COMPACT_CLUSTERING, STATIC_COMPACT_VALUE}
        return hidden


# Cassandra 3.x "static" compact tables (COMPACT STORAGE without clustering columns) store the declared
# columns as static columns plus a hidden clustering column and a hidden value column.
STATIC_COMPACT_CLUSTERING = "column1"
STATIC_COMPACT_VALUE = "value"
# Compact tables with clustering columns but no regular column carry a hidden EmptyType value column.
DENSE_COMPACT_VALUE = "value"


def compact_table_columns(clustering: tuple[ColumnMetadata, ...], regular: list[ColumnMetadata]) \
        -> tuple[tuple[ColumnMetadata, ...], list[ColumnMetadata]]:
    """Clustering and regular/static columns of a COMPACT STORAGE table, as Cassandra 3.x stores them."""
    if not clustering:
        statics = [ColumnMetadata(c.name, c.type, ColumnKind.STATIC) for c in regular]
        hidden_clustering = (ColumnMetadata(STATIC_COMPACT_CLUSTERING, simple_type("text"), ColumnKind.CLUSTERING, 0),)
        return hidden_clustering, statics + [ColumnMetadata(STATIC_COMPACT_VALUE, BLOB, ColumnKind.REGULAR)]
    if not regular:
        return clustering, [ColumnMetadata(DENSE_COMPACT_VALUE, EMPTY, ColumnKind.REGULAR)]
    return clustering, regular


@dataclass
class KeyspaceMetadata:
    name: str
    replication: dict[str, str] = field(default_factory=lambda: {"class": "SimpleStrategy", "replication_factor": "1"})
    durable_writes: bool = True
    user_types: dict[str, CqlType] = field(default_factory=dict)


class Schema:
    """Keyspaces, user types and tables, with tables found by id (as partition updates name them)."""

    def __init__(self) -> None:
        self.keyspaces: dict[str, KeyspaceMetadata] = {}
        self._tables_by_id: dict[uuid.UUID, TableMetadata] = {}
        self._tables_by_name: dict[tuple[str, str], TableMetadata] = {}

    def add_keyspace(self, keyspace: KeyspaceMetadata) -> None:
        existing = self.keyspaces.get(keyspace.name)
        if existing:
            keyspace.user_types = {**existing.user_types, **keyspace.user_types}
        self.keyspaces[keyspace.name] = keyspace

    def keyspace(self, name: str) -> KeyspaceMetadata:
        if name not in self.keyspaces:
            self.keyspaces[name] = KeyspaceMetadata(name)
        return self.keyspaces[name]

    def add_table(self, table: TableMetadata) -> None:
        """Add or replace a table (a replaced definition keeps its id unless the id changed)."""
        old = self._tables_by_name.get((table.keyspace, table.name))
        if old is not None and old.id != table.id:
            del self._tables_by_id[old.id]
        self._tables_by_id[table.id] = table
        self._tables_by_name[(table.keyspace, table.name)] = table
        self.keyspace(table.keyspace)

    def table_by_id(self, table_id: uuid.UUID) -> TableMetadata | None:
        return self._tables_by_id.get(table_id)

    def table(self, keyspace: str, name: str) -> TableMetadata | None:
        return self._tables_by_name.get((keyspace, name))

    def merge(self, other: "Schema") -> None:
        for keyspace in other.keyspaces.values():
            self.add_keyspace(keyspace)
        for table in other:
            self.add_table(table)

    def __iter__(self) -> Iterator[TableMetadata]:
        return iter(list(self._tables_by_id.values()))

    def __len__(self) -> int:
        return len(self._tables_by_id)


def system_table_id(keyspace: str, table: str) -> uuid.UUID:
    """Id of a system table: Java's UUID.nameUUIDFromBytes(keyspace + table)."""
    return uuid.UUID(bytes=hashlib.md5((keyspace + table).encode()).digest(), version=3)
