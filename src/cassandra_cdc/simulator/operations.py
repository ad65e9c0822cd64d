"""CQL statements as data, and the exact ``Mutation`` Cassandra writes for each (docs/storage-format.md §16).

Every operation names its table as ``"keyspace.table"``, carries its write timestamp in microseconds and
gives column values as Python values the DataStax driver serializes (a UDT as a mapping of field names or a
tuple). The statement's execution time (``nowInSec``: local deletion time of tombstones, base of TTL
expiry) is taken as its timestamp in seconds, as for server-side timestamps.

What Cassandra writes (``UpdateParameters``, ``Operation`` subclasses, ``DeleteStatement``):

* ``INSERT`` writes primary key liveness (the row marker); ``UPDATE`` does not.
* ``USING TTL`` makes cells and the liveness expiring at ``now + ttl``.
* ``col = null`` / ``DELETE col`` of a simple column writes a tombstone cell deleted at ``now``.
* ``col = <collection or UDT>`` of a non-frozen column deletes the column at ``timestamp - 1`` (complex
  deletion), then writes one cell per element; ``DELETE col`` deletes it at ``timestamp``.
* Elements: list cells have timeuuid paths; set cells have the element as path and an empty value; map
  cells the key as path; non-frozen UDT cells the field index as a 2-byte path.
* ``DELETE`` of a row, of a clustering prefix or slice, of a partition: row deletion, range tombstone
  bound markers, partition deletion.
* Counter updates: the leader replica turns the delta into a counter context with one global shard, its
  own, holding its running total and clock (``CounterMutation.updateWithCurrentValue``); every replica
  writes that context.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..commitlog import Mutation
from ..storage import BoundKind, Cell, ComplexColumn, DeletionTime, LivenessInfo, PartitionUpdate, RangeTombstoneMarker, Row
from ..storage.counters import CounterShard, encode_counter_context
from ..storage.rows import Clustering, ColumnData
from ..schema import ColumnMetadata, CqlType, Schema, TableMetadata
from .ordering import order_key, serialize, udt_field_values

MICROS_PER_SECOND = 1_000_000


# --- operations -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Operation:
    """A CQL statement on one partition of ``table`` (``"keyspace.table"``)."""

    table: str
    _: KW_ONLY
    timestamp: int  # microseconds

    if TYPE_CHECKING:
        # Every operation has primary key values (partition key, then all or a prefix of the clustering
        # columns): a field of most, a property of Insert. Declared for type checkers only, as a class
        # attribute would become the default value of the subclasses' ``key`` fields.
        @property
        def key(self) -> Mapping[str, Any]: ...

    @property
    def now_seconds(self) -> int:
        """When the statement ran, in seconds: local deletion time of its tombstones, base of its TTLs."""
        return self.timestamp // MICROS_PER_SECOND


@dataclass(frozen=True)
class Insert(Operation):
    """``INSERT INTO table (...) VALUES (...) [USING TTL ttl]``: ``values`` include the primary key."""

    values: Mapping[str, Any]
    ttl: int | None = None

    @property
    def key(self) -> Mapping[str, Any]:
        return self.values


@dataclass(frozen=True)
class Update(Operation):
    """``UPDATE table [USING TTL ttl] SET col = value, ... WHERE key``.

    Setting only static columns, ``key`` holds just the partition key. A non-frozen collection or UDT value
    overwrites the whole column; None (or an empty collection) deletes it.
    """

    key: Mapping[str, Any]
    set: Mapping[str, Any]
    ttl: int | None = None


@dataclass(frozen=True)
class DeleteRow(Operation):
    """``DELETE FROM table WHERE <full primary key>`` (a partition deletion if the table has no clustering)."""

    key: Mapping[str, Any]


@dataclass(frozen=True)
class DeletePartition(Operation):
    """``DELETE FROM table WHERE <partition key>``."""

    key: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteRange(Operation):
    """``DELETE FROM table WHERE <partition key> AND <clustering prefix> [AND ck >(=) start] [AND ck <(=) end]``.

    ``key`` holds the partition key and equalities on a prefix of the clustering columns; ``start`` and
    ``end`` bound the next clustering column (by value, whatever its clustering order).
    """

    key: Mapping[str, Any]
    start: Any = None
    end: Any = None
    start_inclusive: bool = True
    end_inclusive: bool = True


@dataclass(frozen=True)
class DeleteColumns(Operation):
    """``DELETE col, ... FROM table WHERE key``."""

    key: Mapping[str, Any]
    columns: Sequence[str]


@dataclass(frozen=True)
class AppendToList(Operation):
    """``UPDATE table SET col = col + [values] WHERE key``."""

    key: Mapping[str, Any]
    column: str
    values: Sequence[Any]
    ttl: int | None = None


@dataclass(frozen=True)
class AddToSet(Operation):
    """``UPDATE table SET col = col + {elements} WHERE key``."""

    key: Mapping[str, Any]
    column: str
    elements: Sequence[Any]
    ttl: int | None = None


@dataclass(frozen=True)
class RemoveFromSet(Operation):
    """``UPDATE table SET col = col - {elements} WHERE key``."""

    key: Mapping[str, Any]
    column: str
    elements: Sequence[Any]


@dataclass(frozen=True)
class PutInMap(Operation):
    """``UPDATE table SET col = col + {k: v, ...} WHERE key`` (or ``col[k] = v``)."""

    key: Mapping[str, Any]
    column: str
    entries: Mapping[Any, Any]
    ttl: int | None = None


@dataclass(frozen=True)
class RemoveMapKeys(Operation):
    """``UPDATE table SET col = col - {keys} WHERE key`` (or ``DELETE col[k]``)."""

    key: Mapping[str, Any]
    column: str
    keys: Sequence[Any]


@dataclass(frozen=True)
class SetUdtFields(Operation):
    """``UPDATE table SET col.field = value, ... WHERE key`` on a non-frozen UDT column (None deletes the field)."""

    key: Mapping[str, Any]
    column: str
    fields: Mapping[str, Any]
    ttl: int | None = None


@dataclass(frozen=True)
class CounterAdd(Operation):
    """``UPDATE table SET col = col + delta WHERE key`` on a counter column."""

    key: Mapping[str, Any]
    column: str
    delta: int


# --- keys and elements (shared with the table model: what a statement addresses) ----------------------

def table_of(schema: Schema, name: str) -> TableMetadata:
    keyspace, _, table_name = name.partition(".")
    table = schema.table(keyspace, table_name)
    if table is None:
        raise KeyError(f"no table {name!r} in the schema")
    return table


def column_of(table: TableMetadata, name: str) -> ColumnMetadata:
    column = table.column(name.encode("utf-8"))
    if column is None or column.dropped_time is not None:
        raise KeyError(f"no column {name!r} in {table.qualified_name}")
    return column


def partition_key_of(table: TableMetadata, key: Mapping[str, Any]) -> bytes:
    """The partition key bytes (``CompositeType`` for several columns) of a statement's key values."""
    missing = [c.name for c in table.partition_key if c.name not in key]
    if missing:
        raise ValueError(f"{table.qualified_name}: partition key column(s) {', '.join(missing)} not given")
    return table.compose_partition_key([serialize(c.type, key[c.name]) for c in table.partition_key])


def clustering_of(table: TableMetadata, key: Mapping[str, Any], *, prefix: bool = False) -> tuple[bytes, ...]:
    """Serialized values of the clustering columns given in ``key``: all or none (any prefix if ``prefix``)."""
    given = [c for c in table.clustering if c.name in key]
    if given != list(table.clustering[:len(given)]) or (not prefix and 0 < len(given) < len(table.clustering)):
        raise ValueError(f"{table.qualified_name}: clustering columns given ({', '.join(c.name for c in given)}) "
                         f"must be {'a prefix' if prefix else 'none or all'} of "
                         f"{', '.join(c.name for c in table.clustering)}")
    return tuple(serialize(c.type, key[c.name]) for c in given)


def element_cells(cql_type: CqlType, value: Any) -> list[tuple[bytes, bytes]]:
    """(cell path, cell value) of each element of a set, map or UDT value (null UDT fields have none)."""
    if cql_type.kind == "set":
        element_type = cql_type.parameters[0]
        pairs = [(serialize(element_type, e), b"") for e in value]
    elif cql_type.kind == "map":
        key_type, value_type = cql_type.parameters
        pairs = [(serialize(key_type, k), serialize(value_type, v)) for k, v in value.items()]
    elif cql_type.kind == "udt":
        pairs = [(udt_field_path(i), serialize(t, v))
                 for i, (t, v) in enumerate(zip(cql_type.parameters, udt_field_values(cql_type, value)))
                 if v is not None]
    else:
        raise TypeError(f"{cql_type.cql} has no keyed elements")
    return pairs


def udt_field_path(index: int) -> bytes:
    """``UserType.cellPathForField``: the field's index as a big-endian short."""
    return index.to_bytes(2, "big")


def udt_field_index(cql_type: CqlType, name: str) -> int:
    try:
        return cql_type.field_names.index(name)
    except ValueError:
        raise KeyError(f"{cql_type.cql} has no field {name!r}") from None


# Between the UUID epoch (1582-10-15) and the Unix epoch, in the 100 ns ticks of version 1 UUIDs.
_UUID_EPOCH_OFFSET = 0x01B21DD213814000
# 100 ns ticks per microsecond of write timestamp: how many list elements one statement can append.
LIST_ELEMENTS_PER_STATEMENT = 10
_LIST_PATH_NODE = 0x5CA1AB1E0001


def list_cell_path(timestamp: int, index: int) -> bytes:
    """The timeuuid path of the ``index``-th element a list append at ``timestamp`` writes.

    Cassandra takes these from a timeuuid clock of the coordinator; deriving them from the write timestamp
    keeps the mutation identical on every replica and orders appends by timestamp, which makes the
    element order predictable, at the cost of at most ``LIST_ELEMENTS_PER_STATEMENT`` elements per append.
    """
    if not 0 <= index < LIST_ELEMENTS_PER_STATEMENT:
        raise ValueError(f"a simulated list append writes at most {LIST_ELEMENTS_PER_STATEMENT} elements")
    ticks = _UUID_EPOCH_OFFSET + timestamp * LIST_ELEMENTS_PER_STATEMENT + index
    time_hi_version = ((ticks >> 48) & 0x0FFF) | 0x1000
    fields = (ticks & 0xFFFFFFFF, (ticks >> 32) & 0xFFFF, time_hi_version, 0x80, 0, _LIST_PATH_NODE)
    return uuid.UUID(fields=fields).bytes


# --- counters ---------------------------------------------------------------------------------------

class CounterLedger:
    """Each leader's shard of each counter: the running total and clock its next context will carry.

    This is the state a Cassandra replica reads back (from its counter cache or memtables) when it leads
    an increment, kept per counter cell and leader.
    """

    def __init__(self) -> None:
        self._shards: dict[tuple[str, bytes, Clustering, str, uuid.UUID], CounterShard] = {}

    def advance(self, table: TableMetadata, op: CounterAdd, leader: uuid.UUID) -> CounterShard:
        """The leader's new shard for ``op``: clock ``max(timestamp, previous clock + 1)``, total + delta."""
        cell = (table.qualified_name, partition_key_of(table, op.key), clustering_of(table, op.key), op.column,
                leader)
        previous = self._shards.get(cell)
        if previous is None:
            shard = CounterShard(leader, op.timestamp, op.delta)
        else:
            shard = CounterShard(leader, max(op.timestamp, previous.clock + 1), previous.count + op.delta)
        self._shards[cell] = shard
        return shard


# --- mutations --------------------------------------------------------------------------------------

def to_mutation(op: Operation, schema: Schema, counter_shard: CounterShard | None = None) -> Mutation:
    """The mutation Cassandra writes to the commit log for ``op``.

    ``counter_shard`` is required for ``CounterAdd``: the leader's shard after the increment (see
    ``CounterLedger``), which is what every replica writes.
    """
    table = table_of(schema, op.table)
    if op.table != table.qualified_name:
        raise ValueError(f"operation on {op.table!r}, table {table.qualified_name!r}")
    return _MutationBuilder(table, op).build(counter_shard)


class _MutationBuilder:
    """Collects what one statement writes to one partition, then lays it out as a ``PartitionUpdate``."""

    def __init__(self, table: TableMetadata, op: Operation) -> None:
        self.table = table
        self.op = op
        self.timestamp = op.timestamp
        self.now = op.now_seconds
        self.ttl: int = getattr(op, "ttl", None) or 0
        self.partition_key = partition_key_of(table, op.key)
        self.data: dict[str, ColumnData] = {}
        self.liveness: LivenessInfo | None = None
        self.row_deletion: DeletionTime | None = None
        self.partition_deletion: DeletionTime | None = None
        self.markers: list[RangeTombstoneMarker] = []

    @property
    def deletion(self) -> DeletionTime:
        return DeletionTime(self.timestamp, self.now)

    def build(self, counter_shard: CounterShard | None) -> Mutation:
        op = self.op
        match op:
            case Insert():
                regular_values = {n: v for n, v in op.values.items() if n not in self._key_column_names}
                self.assign_all(regular_values)
                if self._addresses_row(op.key):
                    self.liveness = (LivenessInfo(self.timestamp, self.ttl, self.now + self.ttl) if self.ttl
                                     else LivenessInfo(self.timestamp))
            case Update():
                self.assign_all(op.set)
            case DeleteRow():
                if self.table.clustering:
                    self.row_deletion = self.deletion
                else:
                    self.partition_deletion = self.deletion
            case DeletePartition():
                self.partition_deletion = self.deletion
            case DeleteRange():
                self.markers = self.range_markers(op)
            case DeleteColumns():
                for name in op.columns:
                    column = column_of(self.table, name)
                    self.data[name] = (ComplexColumn(column, [], self.deletion) if column.is_complex
                                       else self.cell(column, None))
            case AppendToList():
                column = column_of(self.table, op.column)
                self.add_elements(column, self.list_elements(column, op.values))
            case AddToSet() | PutInMap():
                column = column_of(self.table, op.column)
                value = op.entries if isinstance(op, PutInMap) else op.elements
                self.add_elements(column, element_cells(column.type, value))
            case RemoveFromSet() | RemoveMapKeys():
                column = column_of(self.table, op.column)
                removed = op.keys if isinstance(op, RemoveMapKeys) else op.elements
                path_type = column.type.path_type
                self.add_elements(column, [(serialize(path_type, e), None) for e in removed])
            case SetUdtFields():
                column = column_of(self.table, op.column)
                fields: list[tuple[bytes, bytes | None]] = []
                for name, value in op.fields.items():
                    index = udt_field_index(column.type, name)
                    field_type = column.type.parameters[index]
                    fields.append((udt_field_path(index), None if value is None else serialize(field_type, value)))
                self.add_elements(column, fields)
            case CounterAdd():
                if counter_shard is None:
                    raise ValueError("a counter update needs the leader's counter shard (see CounterLedger)")
                column = column_of(self.table, op.column)
                self.data[op.column] = Cell(column, self.timestamp, encode_counter_context([counter_shard]))
            case _:
                raise TypeError(f"unknown operation {op!r}")
        return Mutation([self.partition_update()])

    @property
    def _key_column_names(self) -> set[str]:
        return {c.name for c in self.table.primary_key}

    def _addresses_row(self, key: Mapping[str, Any]) -> bool:
        """Whether the statement writes a regular row (not only static columns): the clustering is given."""
        return not self.table.clustering or len(clustering_of(self.table, key)) == len(self.table.clustering)

    def cell(self, column: ColumnMetadata, value: bytes | None, path: bytes | None = None) -> Cell:
        """A live (expiring under TTL) cell, or a tombstone when ``value`` is None."""
        if value is None:
            return Cell(column, self.timestamp, b"", local_deletion_time=self.now, path=path)
        if self.ttl:
            return Cell(column, self.timestamp, value, self.ttl, self.now + self.ttl, path)
        return Cell(column, self.timestamp, value, path=path)

    def assign_all(self, values: Mapping[str, Any]) -> None:
        """``col = value`` for each column: INSERT values and UPDATE's SET clause."""
        for name, value in values.items():
            column = column_of(self.table, name)
            if not column.is_complex:
                self.data[name] = self.cell(column, None if value is None else serialize(column.type, value))
                continue
            # An overwrite: delete what was there just before this write, then add the new elements.
            if not value:
                elements: list[tuple[bytes, bytes | None]] = []
            elif column.type.kind == "list":
                elements = self.list_elements(column, value)
            else:
                elements = list(element_cells(column.type, value))
            self.add_elements(column, elements, DeletionTime(self.timestamp - 1, self.now))

    def list_elements(self, column: ColumnMetadata, values: Sequence[Any]) -> list[tuple[bytes, bytes | None]]:
        element_type = column.type.parameters[0]
        return [(list_cell_path(self.timestamp, i), serialize(element_type, v)) for i, v in enumerate(values)]

    def add_elements(self, column: ColumnMetadata, elements: Sequence[tuple[bytes, bytes | None]],
                     deletion: DeletionTime | None = None) -> None:
        """Cells of a complex column, sorted by path as Cassandra keeps them (None values: tombstones)."""
        path_type = column.type.path_type
        ordered = sorted(elements, key=lambda element: order_key(path_type, element[0]))
        self.data[column.name] = ComplexColumn(column, [self.cell(column, value, path) for path, value in ordered],
                                               deletion)

    def range_markers(self, op: DeleteRange) -> list[RangeTombstoneMarker]:
        """The two bound markers of a prefix or slice deletion (``Slice.make``), in clustering order."""
        prefix = clustering_of(self.table, op.key, prefix=True)
        bounded = op.start is not None or op.end is not None
        if bounded and len(prefix) == len(self.table.clustering):
            raise ValueError(f"{self.table.qualified_name}: a slice needs a clustering column after the prefix")
        if not prefix and not bounded:
            raise ValueError("a range deletion without clustering restriction is a partition deletion")
        low: Clustering = prefix
        high: Clustering = prefix
        low_inclusive = high_inclusive = True
        if bounded:
            column = self.table.clustering[len(prefix)]
            if op.start is not None:
                low, low_inclusive = prefix + (serialize(column.type, op.start),), op.start_inclusive
            if op.end is not None:
                high, high_inclusive = prefix + (serialize(column.type, op.end),), op.end_inclusive
            if column.reversed:
                # Clustering order is descending on this column: the slice starts at the high value.
                low, high, low_inclusive, high_inclusive = high, low, high_inclusive, low_inclusive
        start_kind = BoundKind.INCL_START_BOUND if low_inclusive else BoundKind.EXCL_START_BOUND
        end_kind = BoundKind.INCL_END_BOUND if high_inclusive else BoundKind.EXCL_END_BOUND
        return [RangeTombstoneMarker(start_kind, low, open_deletion=self.deletion),
                RangeTombstoneMarker(end_kind, high, close_deletion=self.deletion)]

    def partition_update(self) -> PartitionUpdate:
        table = self.table
        columns = table.sorted_columns(column_of(table, name) for name in self.data)
        regulars = tuple(c for c in columns if not c.is_static)
        statics = tuple(c for c in columns if c.is_static)
        unfiltereds: list[Row | RangeTombstoneMarker] = list(self.markers)
        if regulars or self.liveness is not None or self.row_deletion is not None:
            clustering = clustering_of(table, self.op.key)
            if len(clustering) != len(table.clustering):
                raise ValueError(f"{table.qualified_name}: writing or deleting a row needs the full primary key")
            unfiltereds.append(Row(clustering, [self.data[c.name] for c in regulars], self.liveness,
                                   self.row_deletion))
        static_row = Row((), [self.data[c.name] for c in statics], is_static=True) if statics else None
        return PartitionUpdate(table, self.partition_key, unfiltereds, static_row, self.partition_deletion,
                               regular_columns=regulars, static_columns=statics)
