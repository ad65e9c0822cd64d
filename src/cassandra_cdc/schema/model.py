"""Table metadata: what a reader needs to know about a table to decode its partition updates."""

from __future__ import annotations

import enum
import hashlib
import itertools
import uuid
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable, Iterator

from .types import BLOB, EMPTY, CqlType, quote, simple_type


class SchemaError(ValueError):
    """A schema that cannot be read; the message names where (file and line, or table) and what is wrong."""

    def __init__(self, message: str, source: str | None = None, line: int | None = None) -> None:
        where = (source or "") + (f", line {line}" if line is not None else "")
        super().__init__(f"{where}: {message}" if where else message)
        self.reason = message
        self.source = source
        self.line = line


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

    # Cached (in the instance dict, which a frozen dataclass still has): decoders read these per cell.

    @cached_property
    def name_bytes(self) -> bytes:
        return self.name.encode("utf-8")

    @cached_property
    def is_complex(self) -> bool:
        """Non-frozen collection or UDT: stored as one cell per element, with cell paths."""
        return self.type.multi_cell

    @cached_property
    def fixed_value_length(self) -> int | None:
        """Length of every cell value of this column, written without a length; None when values carry
        their length, as those of variable-length types and every element of a complex column do."""
        return None if self.is_complex else self.type.fixed_length

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
    # When the definition was written, in microseconds: the latest write time of the system_schema rows that
    # define it (its tables row and the user types it uses), which every schema change of the table renews.
    # Orders two definitions as Cassandra does; None when not read from a cluster (a CQL file).
    defined_at: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Cassandra keeps regular and static columns in this order (that of a partition update's column
        # header); normalising it makes two definitions of a table equal whatever their declaration order.
        self.regular_and_static = self.sorted_columns(self.regular_and_static)
        self.dropped = self.sorted_columns(self.dropped)
        self._by_name = {c.name_bytes: c for c in self.regular_and_static}
        self._dropped_by_name = {c.name_bytes: c for c in self.dropped}
        #: serialized column lists of partition update headers seen for this table, and their columns
        #: (filled by the commit log's ColumnsSerializer: a table's updates repeat a few of them)
        self.column_headers: dict[bytes, tuple[ColumnMetadata, ...]] = {}

    @property
    def qualified_name(self) -> str:
        return f"{self.keyspace}.{self.name}"

    @property
    def columns(self) -> tuple[ColumnMetadata, ...]:
        return self.partition_key + self.clustering + self.regular_and_static

    @property
    def primary_key(self) -> tuple[ColumnMetadata, ...]:
        return self.partition_key + self.clustering

    @cached_property
    def clustering_types(self) -> tuple[CqlType, ...]:
        return tuple(c.type for c in self.clustering)

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

    # --- COMPACT STORAGE ----------------------------------------------------------------------------

    @property
    def is_static_compact(self) -> bool:
        """COMPACT STORAGE without clustering columns in CQL (a Thrift "static" column family).

        Cassandra 3.x stores the declared columns as static columns, next to a hidden clustering column and
        a hidden value column. Compact tables cannot declare static columns, so having some is the tell.
        """
        return self.compact_storage and any(c.is_static for c in self.regular_and_static)

    @property
    def hidden_columns(self) -> tuple[ColumnMetadata, ...]:
        """Columns Cassandra adds to a COMPACT STORAGE table: present in storage and mutations, not in CQL."""
        if self.is_static_compact:
            return self.clustering + tuple(c for c in self.regular_and_static if not c.is_static)
        if self.compact_storage:
            return tuple(c for c in self.regular_and_static if c.type.kind == "empty")
        return ()

    # --- CQL --------------------------------------------------------------------------------------

    def to_cql(self) -> str:
        """The table as ``DESCRIBE TABLE ... WITH INTERNALS`` prints it (Cassandra 4.x), for :mod:`.cql`.

        A dropped column is declared in ``CREATE TABLE`` and then dropped ``USING TIMESTAMP`` (and added
        again when a column of that name exists now): plain CQL that records its type, kind and drop time.
        Hidden COMPACT STORAGE columns are left out, as ``CREATE TABLE`` recreates them; so a Thrift-era
        table whose hidden columns differ from those (names, comparator type) does not round-trip.
        """
        name = f"{quote(self.keyspace)}.{quote(self.name)}"
        hidden = self.hidden_columns
        dropped_names = {c.name for c in self.dropped}
        clustering = [c for c in self.clustering if c not in hidden]
        current = [c for c in self.regular_and_static if c not in hidden and c.name not in dropped_names]
        body = [*self.partition_key, *clustering, *current, *self.dropped]
        lines = [f"    {self._column_cql(c)}" for c in body]
        lines.append(f"    PRIMARY KEY ({self._primary_key_cql(clustering)})")
        text = (f"CREATE TABLE {name} (\n" + ",\n".join(lines) + "\n) WITH "
                + "\n    AND ".join(self._options_cql(clustering)) + ";")
        for column in self.dropped:
            text += f"\nALTER TABLE {name} DROP {quote(column.name)} USING TIMESTAMP {column.dropped_time};"
            readded = self._by_name.get(column.name_bytes)
            if readded is not None:
                text += f"\nALTER TABLE {name} ADD {self._column_cql(readded)};"
        return text

    def _column_cql(self, column: ColumnMetadata) -> str:
        # The declared columns of a static compact table are static in storage only.
        static = " static" if column.is_static and not self.is_static_compact else ""
        return f"{quote(column.name)} {column.type.cql}{static}"

    def _primary_key_cql(self, clustering: list[ColumnMetadata]) -> str:
        partition_key = ", ".join(quote(c.name) for c in self.partition_key)
        if len(self.partition_key) > 1:
            partition_key = f"({partition_key})"
        return ", ".join([partition_key] + [quote(c.name) for c in clustering])

    def _options_cql(self, clustering: list[ColumnMetadata]) -> list[str]:
        options = [f"ID = {self.id}"]
        if self.compact_storage:
            options.append("COMPACT STORAGE")
        if clustering:
            order = ", ".join(f"{quote(c.name)} {'DESC' if c.reversed else 'ASC'}" for c in clustering)
            options.append(f"CLUSTERING ORDER BY ({order})")
        if self.cdc:
            options.append("cdc = true")
        return options + [f"{k} = {v}" for k, v in sorted(self.options.items())]

    def ddl(self) -> str:
        """The table's CREATE TABLE (:meth:`to_cql`), preceded by CREATE TYPE for every user type it uses
        (dependencies first): all a reader needs to decode its updates."""
        statements: list[str] = []
        seen: set[tuple[str | None, str | None]] = set()
        for udt in (udt for column in self.columns + self.dropped for udt in column.type.user_types()):
            if (udt.udt_keyspace, udt.udt_name) not in seen:
                seen.add((udt.udt_keyspace, udt.udt_name))
                fields = ", ".join(f"{quote(n)} {t.cql}" for n, t in zip(udt.field_names, udt.parameters))
                statements.append(f"CREATE TYPE {quote(udt.udt_keyspace or self.keyspace)}."
                                  f"{quote(udt.udt_name or '')} ({fields});")
        return "\n".join(statements + [self.to_cql()])

    def version_hash(self) -> str:
        """A stable hash of the definition, the user types it uses included: changes whenever the table's
        schema does (an ALTER TYPE of a type it uses too)."""
        return hashlib.sha256(self.ddl().encode()).hexdigest()[:16]


def compact_table_columns(clustering: tuple[ColumnMetadata, ...], regular: list[ColumnMetadata], *,
                          reserved_names: Iterable[str] = ()) \
        -> tuple[tuple[ColumnMetadata, ...], list[ColumnMetadata]]:
    """Clustering and regular/static columns of a COMPACT STORAGE table, as Cassandra 3.x stores them.

    As ``CreateTableStatement.metadataBuilder``: without clustering columns, the declared columns become
    static and a hidden ``column1 text`` clustering column and ``value blob`` (``counter`` in a counter
    table) regular column are added; with clustering columns but no regular column, a hidden ``value``
    column of type ``empty``. Hidden names skip those already used (``column2``, ``value1``, ...);
    ``reserved_names`` are the other used names (the partition key's).
    """
    used = {c.name for c in (*clustering, *regular)} | set(reserved_names)
    if not clustering:
        statics = [replace(c, kind=ColumnKind.STATIC, position=-1) for c in regular]
        value_type = simple_type("counter") if any(c.type.is_counter for c in regular) else BLOB
        hidden_clustering = ColumnMetadata(_fresh_name(_clustering_names(), used), simple_type("text"),
                                           ColumnKind.CLUSTERING, 0)
        value = ColumnMetadata(_fresh_name(_value_names(), used), value_type, ColumnKind.REGULAR)
        return (hidden_clustering,), statics + [value]
    if not regular:
        return clustering, [ColumnMetadata(_fresh_name(_value_names(), used), EMPTY, ColumnKind.REGULAR)]
    return clustering, list(regular)


# CompactTables.DefaultNames: the candidate names of hidden compact columns, in order.
def _clustering_names() -> Iterator[str]:
    return (f"column{i}" for i in itertools.count(1))


def _value_names() -> Iterator[str]:
    return itertools.chain(["value"], (f"value{i}" for i in itertools.count(1)))


def _fresh_name(candidates: Iterator[str], used: set[str]) -> str:
    name = next(c for c in candidates if c not in used)
    used.add(name)
    return name


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
        # The same tables by the 16 bytes of their id, as partition updates start: no UUID to build.
        self._tables_by_id_bytes: dict[bytes, TableMetadata] = {}
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
            del self._tables_by_id_bytes[old.id.bytes]
        self._tables_by_id[table.id] = table
        self._tables_by_id_bytes[table.id.bytes] = table
        self._tables_by_name[(table.keyspace, table.name)] = table
        self.keyspace(table.keyspace)

    def table_by_id(self, table_id: uuid.UUID) -> TableMetadata | None:
        return self._tables_by_id.get(table_id)

    def table_by_id_bytes(self, table_id: bytes) -> TableMetadata | None:
        """A table by the 16 big-endian bytes of its id."""
        return self._tables_by_id_bytes.get(table_id)

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
