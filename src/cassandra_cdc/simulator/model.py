"""What a table must contain after a set of operations: an oracle computed at the CQL level.

``TableModel`` applies statements by CQL semantics, not by building and merging Cassandra's cells, so it
stays independent of the mutation layer it is meant to check (it shares only the serialization of keys
and values). The rules it encodes:

* last write wins per column (and per collection element), by timestamp; at equal timestamps a deletion
  wins, then the greater value (Cassandra's tie-break);
* a deletion at timestamp ``t`` (partition, range, row, whole collection) hides data written at ``<= t``;
* a TTL'd write is a value until ``write time + ttl``, then a deletion (so it still hides older values);
* a row exists while its INSERT row marker is live or any of its non-key columns has a value: an
  INSERTed row survives with all-null columns, an UPDATEd one disappears with its last value;
* static columns belong to the partition (hidden only by partition deletions); a partition whose rows
  are all gone but whose statics have values shows one row with null clustering columns;
* counters are the sum of their deltas.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..schema import ColumnMetadata, CqlType, TableMetadata
from .operations import (AddToSet, AppendToList, CounterAdd, DeleteColumns, DeletePartition, DeleteRange, DeleteRow,
                         Insert, Operation, PutInMap, RemoveFromSet, RemoveMapKeys, SetUdtFields, Update,
                         clustering_of, column_of, element_cells, partition_key_of, udt_field_index,
                         udt_field_path)
from .ordering import order_key, serialize

NEVER = -(1 << 63)  # the timestamp of "no deletion"
_INT = struct.Struct(">i")


@dataclass(slots=True)
class _Write:
    """One write of a column or element: a value (``b""`` for set elements and row markers) or None for a
    deletion; a TTL'd value turns into a deletion at ``expires`` (seconds)."""

    timestamp: int
    value: bytes | None
    expires: int | None = None

    def supersedes(self, other: "_Write") -> bool:
        if self.timestamp != other.timestamp:
            return self.timestamp > other.timestamp
        if (self.value is None) != (other.value is None):
            return self.value is None
        return (self.value or b"") > (other.value or b"")

    def value_at(self, now: int, deleted_at: int) -> bytes | None:
        """The value at ``now`` under a deletion at ``deleted_at``: None if deleted, shadowed or expired."""
        if self.timestamp <= deleted_at or (self.expires is not None and now >= self.expires):
            return None
        return self.value


def _put(writes: dict[Any, _Write], key: Any, write: _Write) -> None:
    current = writes.get(key)
    if current is None or write.supersedes(current):
        writes[key] = write


@dataclass(slots=True)
class _Collection:
    """A non-frozen collection or UDT: its elements (by list position key, element, map key or field
    index) and the latest deletion of the whole column."""

    deleted_at: int = NEVER
    elements: dict[Any, _Write] = field(default_factory=dict)


@dataclass(slots=True)
class _Columns:
    """The non-key columns of a row, or the static columns of a partition."""

    simple: dict[str, _Write] = field(default_factory=dict)
    collections: dict[str, _Collection] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def collection(self, name: str) -> _Collection:
        return self.collections.setdefault(name, _Collection())


@dataclass(slots=True)
class _Row(_Columns):
    marker: _Write | None = None
    deleted_at: int = NEVER


@dataclass(slots=True)
class _Range:
    """A range deletion: clusterings starting with ``prefix`` whose next value lies between the bounds."""

    prefix: tuple[bytes, ...]
    start: bytes | None
    end: bytes | None
    start_inclusive: bool
    end_inclusive: bool
    timestamp: int

    def covers(self, clustering: tuple[bytes, ...], types: tuple[CqlType, ...]) -> bool:
        size = len(self.prefix)
        if clustering[:size] != self.prefix:
            return False
        if self.start is None and self.end is None:
            return True
        value_type = types[size]
        value = order_key(value_type, clustering[size])
        if self.start is not None:
            start = order_key(value_type, self.start)
            if value < start or (value == start and not self.start_inclusive):
                return False
        if self.end is not None:
            end = order_key(value_type, self.end)
            if value > end or (value == end and not self.end_inclusive):
                return False
        return True


@dataclass(slots=True)
class _Partition:
    deleted_at: int = NEVER
    ranges: list[_Range] = field(default_factory=list)
    static: _Columns = field(default_factory=_Columns)
    rows: dict[tuple[bytes, ...], _Row] = field(default_factory=dict)


class TableModel:
    """The expected content of one table, from the operations applied to it (in any order)."""

    def __init__(self, table: TableMetadata) -> None:
        self.table = table
        self._partitions: dict[bytes, _Partition] = {}
        self._clustering_types = tuple(c.type for c in table.clustering)

    def alter(self, table: TableMetadata) -> None:
        """Take a new definition of the table (``ALTER TABLE ... ADD``): what was written stays, and the
        added columns read as null until written."""
        old = self.table
        if table.id != old.id or table.primary_key != old.primary_key:
            raise ValueError(f"{table.qualified_name} is not an ALTER of {old.qualified_name} (other id or primary key)")
        missing = {c.name for c in old.regular_and_static} - {c.name for c in table.regular_and_static}
        if missing:
            raise ValueError(f"dropping columns is not modelled ({', '.join(sorted(missing))} of {old.qualified_name})")
        self.table = table

    def apply(self, op: Operation) -> None:
        table = self.table
        if op.table != table.qualified_name:
            raise ValueError(f"operation on {op.table}, model of {table.qualified_name}")
        partition = self._partitions.setdefault(partition_key_of(table, op.key), _Partition())
        timestamp = op.timestamp
        match op:
            case Insert():
                values = {n: v for n, v in op.values.items() if n not in {c.name for c in table.primary_key}}
                row = self._addressed_row(partition, op)
                if row is not None:
                    _put_marker(row, _Write(timestamp, b"", _expiry(op, op.ttl)))
                self._assign(partition, row, values, op, op.ttl)
            case Update():
                self._assign(partition, self._addressed_row(partition, op), op.set, op, op.ttl)
            case DeleteRow() if table.clustering:
                row = self._row(partition, op)
                row.deleted_at = max(row.deleted_at, timestamp)
            case DeleteRow() | DeletePartition():
                partition.deleted_at = max(partition.deleted_at, timestamp)
            case DeleteRange():
                prefix = clustering_of(table, op.key, prefix=True)
                bound_type = table.clustering[len(prefix)].type if len(prefix) < len(table.clustering) else None
                start, end = (None if v is None or bound_type is None else serialize(bound_type, v)
                              for v in (op.start, op.end))
                partition.ranges.append(_Range(prefix, start, end, op.start_inclusive, op.end_inclusive, timestamp))
            case DeleteColumns():
                for name in op.columns:
                    column = column_of(table, name)
                    columns = self._columns_of(partition, op, column)
                    if column.is_complex:
                        collection = columns.collection(name)
                        collection.deleted_at = max(collection.deleted_at, timestamp)
                    else:
                        _put(columns.simple, name, _Write(timestamp, None))
            case AppendToList():
                elements = self._elements(partition, op, op.column)
                element_type = column_of(table, op.column).type.parameters[0]
                for index, value in enumerate(op.values):
                    # A list keeps its elements in the order they were appended: by statement, then position.
                    _put(elements, (timestamp, index), _Write(timestamp, serialize(element_type, value),
                                                               _expiry(op, op.ttl)))
            case AddToSet() | PutInMap():
                column = column_of(table, op.column)
                value = op.entries if isinstance(op, PutInMap) else op.elements
                elements = self._elements(partition, op, op.column)
                for path, element_value in element_cells(column.type, value):
                    _put(elements, path, _Write(timestamp, element_value, _expiry(op, op.ttl)))
            case RemoveFromSet() | RemoveMapKeys():
                key_type = column_of(table, op.column).type.parameters[0]
                elements = self._elements(partition, op, op.column)
                for removed in (op.keys if isinstance(op, RemoveMapKeys) else op.elements):
                    _put(elements, serialize(key_type, removed), _Write(timestamp, None))
            case SetUdtFields():
                udt = column_of(table, op.column).type
                elements = self._elements(partition, op, op.column)
                for name, value in op.fields.items():
                    index = udt_field_index(udt, name)
                    write = (_Write(timestamp, None) if value is None
                             else _Write(timestamp, serialize(udt.parameters[index], value), _expiry(op, op.ttl)))
                    _put(elements, udt_field_path(index), write)
            case CounterAdd():
                columns = self._columns_of(partition, op, column_of(table, op.column))
                columns.counters[op.column] = columns.counters.get(op.column, 0) + op.delta
            case _:
                raise TypeError(f"unknown operation {op!r}")

    def rows(self, now_seconds: int) -> dict[tuple[Any, ...], dict[str, Any]]:
        """``SELECT *`` at ``now_seconds``: primary key values -> every column's value (None for null).

        Values are what the DataStax driver decodes (``CqlType.deserialize``); a partition with only
        static values has one row whose clustering values are None.
        """
        table = self.table
        regulars = [c for c in table.regular_and_static if not c.is_static]
        statics = [c for c in table.regular_and_static if c.is_static]
        result: dict[tuple[Any, ...], dict[str, Any]] = {}
        for key, partition in self._partitions.items():
            key_values = {c.name: c.type.deserialize(v)
                          for c, v in zip(table.partition_key, table.split_partition_key(key))}
            static_values = self._values(partition.static, statics, now_seconds, partition.deleted_at)
            shown = False
            for clustering, row in partition.rows.items():
                deleted_at = max([partition.deleted_at, row.deleted_at]
                                 + [r.timestamp for r in partition.ranges
                                    if r.covers(clustering, self._clustering_types)])
                values = self._values(row, regulars, now_seconds, deleted_at)
                marker_live = row.marker is not None and row.marker.value_at(now_seconds, deleted_at) is not None
                if marker_live or any(v is not None for v in values.values()):
                    clustering_values = {c.name: c.type.deserialize(v) for c, v in zip(table.clustering, clustering)}
                    self._add_row(result, {**key_values, **clustering_values, **values, **static_values})
                    shown = True
            if not shown and any(v is not None for v in static_values.values()):
                nulls = {c.name: None for c in (*table.clustering, *regulars)}
                self._add_row(result, {**key_values, **nulls, **static_values})
        return result

    # --- applying ---------------------------------------------------------------------------------

    def _addressed_row(self, partition: _Partition, op: Operation) -> _Row | None:
        """The row an INSERT or UPDATE writes, None if it gives no clustering (it sets only statics)."""
        clustering = clustering_of(self.table, op.key)
        if self.table.clustering and not clustering:
            return None
        return partition.rows.setdefault(clustering, _Row())

    def _row(self, partition: _Partition, op: Operation) -> _Row:
        row = self._addressed_row(partition, op)
        if row is None:
            raise ValueError(f"{op!r} needs the full primary key of {self.table.qualified_name}")
        return row

    def _columns_of(self, partition: _Partition, op: Operation, column: ColumnMetadata) -> _Columns:
        return partition.static if column.is_static else self._row(partition, op)

    def _elements(self, partition: _Partition, op: Operation, name: str) -> dict[Any, _Write]:
        return self._columns_of(partition, op, column_of(self.table, name)).collection(name).elements

    def _assign(self, partition: _Partition, row: _Row | None, values: Mapping[str, Any], op: Operation,
                ttl: int | None) -> None:
        """``col = value`` for each column (INSERT values, UPDATE's SET)."""
        timestamp = op.timestamp
        for name, value in values.items():
            column = column_of(self.table, name)
            if column.is_static:
                columns: _Columns = partition.static
            elif row is None:
                raise ValueError(f"{op!r} sets regular column {name} without the full primary key")
            else:
                columns = row
            if not column.is_complex:
                write = (_Write(timestamp, None) if value is None
                         else _Write(timestamp, serialize(column.type, value), _expiry(op, ttl)))
                _put(columns.simple, name, write)
                continue
            # Overwriting a whole collection replaces what was written before this statement.
            collection = columns.collection(name)
            collection.deleted_at = max(collection.deleted_at, timestamp - 1)
            if not value:
                continue
            pairs: list[tuple[Any, bytes]]
            if column.type.kind == "list":
                element_type = column.type.parameters[0]
                pairs = [((timestamp, i), serialize(element_type, v)) for i, v in enumerate(value)]
            else:
                pairs = element_cells(column.type, value)
            for element_key, element_value in pairs:
                _put(collection.elements, element_key, _Write(timestamp, element_value, _expiry(op, ttl)))

    # --- reading ----------------------------------------------------------------------------------

    def _values(self, columns: _Columns, which: list[ColumnMetadata], now: int, deleted_at: int) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for column in which:
            name = column.name
            if column.type.is_counter:
                values[name] = columns.counters.get(name)
            elif column.is_complex:
                collection = columns.collections.get(name)
                values[name] = None if collection is None else _collection_value(
                    column.type, collection, now, max(deleted_at, collection.deleted_at))
            else:
                write = columns.simple.get(name)
                value = None if write is None else write.value_at(now, deleted_at)
                values[name] = None if value is None else column.type.deserialize(value)
        return values

    def _add_row(self, result: dict[tuple[Any, ...], dict[str, Any]], row: dict[str, Any]) -> None:
        result[tuple(row[c.name] for c in self.table.primary_key)] = row


def _expiry(op: Operation, ttl: int | None) -> int | None:
    return op.now_seconds + ttl if ttl else None


def _put_marker(row: _Row, marker: _Write) -> None:
    if row.marker is None or marker.supersedes(row.marker):
        row.marker = marker


def _collection_value(cql_type: CqlType, collection: _Collection, now: int, deleted_at: int) -> Any:
    """The column's value as a SELECT returns it (elements in Cassandra's order), or None when empty."""
    live = {k: v for k, w in collection.elements.items() if (v := w.value_at(now, deleted_at)) is not None}
    if not live:
        return None
    kind = cql_type.kind
    if kind == "udt":
        fields = [live.get(udt_field_path(i)) for i in range(len(cql_type.field_names))]
        packed = b"".join(_INT.pack(-1) if v is None else _INT.pack(len(v)) + v for v in fields)
        return cql_type.deserialize(packed)
    if kind == "list":
        ordered = [live[k] for k in sorted(live)]
        items = [_INT.pack(len(v)) + v for v in ordered]
    else:
        keys = sorted(live, key=lambda k: order_key(cql_type.parameters[0], k))
        items = [_INT.pack(len(k)) + k + (_INT.pack(len(live[k])) + live[k] if kind == "map" else b"") for k in keys]
    return cql_type.deserialize(_INT.pack(len(items)) + b"".join(items))
