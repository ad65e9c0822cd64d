"""What a CQL ``SELECT`` shows of a partition state: which rows are live, and their column values.

Views are computed in two steps. First a *raw* form, cheap to build and to compare: per row, the live
values of its regular columns as stored bytes (collections as sorted ``(path, value)`` pairs, counters
as their sum); it is None when the row is not live. Then, only for rows whose raw form changed, the
decoded CQL row: column name -> the value ``CqlType.deserialize`` gives (collections in Cassandra's
order, as the DataStax driver decodes them), partition key and clustering columns included.

A row is live (``Row.hasLiveData``) while its primary key liveness is live or any of its cells is; the
static row likewise. A partition whose rows are all dead but whose static row is live shows one row,
with null clustering and regular columns: it is keyed by the empty clustering ``()`` here.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from ..schema.model import ColumnMetadata, TableMetadata
from ..schema.types import CqlType
from .clustering import Clustering, ClusteringComparator, value_sort_key
from .state import (NO_TIMESTAMP, PartitionState, RowState, cell_is_live, counter_value, deleted_at,
                    liveness_is_live)

STATIC_CLUSTERING: Clustering = ()
DEFAULT_GC_GRACE_SECONDS = 864_000

_INT = struct.Struct(">i")
_EMPTY_IS_A_VALUE = frozenset({"text", "varchar", "ascii", "blob"})

RawValues = tuple[Any, ...]
# The raw form of a visible row: (regular values or None for the static-only row, static values).
RawRow = tuple[RawValues | None, RawValues]


class TableView:
    """What merging and viewing need of a table's schema, computed once per table definition."""

    def __init__(self, table: TableMetadata) -> None:
        self.table = table
        self.comparator = ClusteringComparator(table.clustering)
        self.clustering_sort_key = self.comparator.sort_key()
        hidden = {c.name for c in table.hidden_columns}
        self.regulars = tuple(c for c in table.regular_and_static if not c.is_static)
        self.statics: tuple[ColumnMetadata, ...] = tuple(c for c in table.regular_and_static if c.is_static)
        self.current = {c.name: c for c in table.regular_and_static}
        self.dropped = {c.name: c.dropped_time for c in table.dropped if c.dropped_time is not None}
        self.output_names = [c.name for c in table.columns if c.name not in hidden]
        self._hidden = hidden
        self._path_keys = {c.name: value_sort_key(c.type.path_type) for c in table.regular_and_static
                           if c.is_complex}
        try:
            self.gc_grace = int(table.options.get("gc_grace_seconds", DEFAULT_GC_GRACE_SECONDS))
        except ValueError:
            self.gc_grace = DEFAULT_GC_GRACE_SECONDS

    def accepts(self, name: str, timestamp: int) -> bool:
        """Whether data of this column at this timestamp belongs to the table (not dropped before it)."""
        if name not in self.current:
            return False
        dropped = self.dropped.get(name)
        return dropped is None or timestamp > dropped

    # --- raw views --------------------------------------------------------------------------------

    def row_deletion(self, state: PartitionState, clustering: Clustering, row: RowState | None) -> int:
        """The timestamp at or before which the row's data is deleted: partition, range and row deletions."""
        deleted = deleted_at(state.deletion)
        if row is not None and row.deletion is not None and row.deletion[0] > deleted:
            deleted = row.deletion[0]
        covers = self.comparator.covers
        for start, start_inclusive, end, end_inclusive, deletion in state.ranges:
            if deletion[0] > deleted and covers(start, start_inclusive, end, end_inclusive, clustering):
                deleted = deletion[0]
        return deleted

    def row_values(self, state: PartitionState, clustering: Clustering, now: int) -> RawValues | None:
        """The raw values of a regular row, None when it is not live (or absent)."""
        row = state.rows.get(clustering)
        if row is None:
            return None
        deleted = self.row_deletion(state, clustering, row)
        return self._values(row, self.regulars, deleted, now, require_live=True)

    def row_is_live(self, state: PartitionState, clustering: Clustering, row: RowState, now: int) -> bool:
        deleted = self.row_deletion(state, clustering, row)
        return self._values(row, self.regulars, deleted, now, require_live=True) is not None

    def static_values(self, state: PartitionState, now: int) -> tuple[bool, RawValues]:
        """Whether the static row is live, and the raw values of the static columns."""
        static = state.static
        if static is None or not self.statics and static.liveness is None:
            return False, (None,) * len(self.statics)
        deleted = deleted_at(state.deletion)
        if static.deletion is not None:
            deleted = max(deleted, static.deletion[0])
        values = self._values(static, self.statics, deleted, now, require_live=False)
        assert values is not None
        live = liveness_is_live(static.liveness, deleted, now) or any(v is not None for v in values)
        return live, values

    def _values(self, row: RowState, columns: Sequence[ColumnMetadata], deleted: int, now: int,
                require_live: bool) -> RawValues | None:
        live = liveness_is_live(row.liveness, deleted, now)
        values: list[Any] = []
        dropped = self.dropped
        for column in columns:
            name = column.name
            cutoff = deleted
            if dropped and name in dropped:
                cutoff = max(cutoff, dropped[name])  # type: ignore[type-var]
            value: Any = None
            if column.is_complex:
                entry = row.complex.get(name)
                if entry is not None:
                    if entry[0] is not None and entry[0][0] > cutoff:
                        cutoff = entry[0][0]
                    elements = tuple(sorted((path, cell[3]) for path, cell in entry[1].items()
                                            if cell_is_live(cell, cutoff, now)))
                    value = elements or None
            elif column.type.is_counter:
                counter = row.counters.get(name)
                if counter is not None:
                    value = counter_value(counter, cutoff)
            else:
                cell = row.cells.get(name)
                if cell is not None and cell_is_live(cell, cutoff, now):
                    value = cell[3]
            if value is not None:
                live = True
            values.append(value)
        if require_live and not live:
            return None
        return tuple(values)

    # --- decoded rows -----------------------------------------------------------------------------

    def partition_key_values(self, key: bytes) -> dict[str, Any]:
        table = self.table
        values = table.split_partition_key(key)
        return {c.name: decode_value(c.type, v) for c, v in zip(table.partition_key, values)}

    def decode_row(self, key_values: dict[str, Any], clustering: Clustering,
                   raw: RawRow | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        values, static_values = raw
        row = dict(key_values)
        hidden = self._hidden
        for column in self.table.clustering:
            if column.name not in hidden:
                value = clustering[column.position] if clustering else None
                row[column.name] = None if value is None else decode_value(column.type, value)
        if values is None:
            values = (None,) * len(self.regulars)
        for column, value in zip(self.regulars, values):
            if column.name not in hidden:
                row[column.name] = self._decode_column(column, value)
        for column, value in zip(self.statics, static_values):
            if column.name not in hidden:
                row[column.name] = self._decode_column(column, value)
        return {name: row.get(name) for name in self.output_names}

    def _decode_column(self, column: ColumnMetadata, raw: Any) -> Any:
        if raw is None:
            return None
        if column.type.is_counter:
            return raw
        if column.is_complex:
            return decode_elements(column.type, sorted(raw, key=lambda e: self._path_keys[column.name](e[0])))
        return decode_value(column.type, raw)


def decode_value(cql_type: CqlType, data: bytes) -> Any:
    """A stored value as the driver decodes it; an empty value of a type where it means nothing is None."""
    if not data and cql_type.kind not in _EMPTY_IS_A_VALUE:
        return None
    return cql_type.deserialize(data)


def decode_elements(cql_type: CqlType, elements: Sequence[tuple[bytes, bytes]]) -> Any:
    """A non-frozen collection or UDT from its live cells (path, value), in Cassandra's path order."""
    kind = cql_type.kind
    if kind == "udt":
        fields: list[bytes | None] = [None] * len(cql_type.field_names)
        for path, value in elements:
            index = int.from_bytes(path, "big")
            if index < len(fields):
                fields[index] = value
        return cql_type.deserialize(b"".join(_INT.pack(-1) if v is None else _sized(v) for v in fields))
    if kind == "list":
        items = [_sized(value) for _, value in elements]
    elif kind == "set":
        items = [_sized(path) for path, _ in elements]
    else:
        items = [_sized(path) + _sized(value) for path, value in elements]
    return cql_type.deserialize(_INT.pack(len(items)) + b"".join(items))


def _sized(data: bytes) -> bytes:
    return _INT.pack(len(data)) + data


_VIEWS: dict[int, TableView] = {}


def table_view(table: TableMetadata) -> TableView:
    """The (cached) view of a table definition."""
    view = _VIEWS.get(id(table))
    if view is None or view.table is not table:
        if len(_VIEWS) > 1024:
            _VIEWS.clear()
        view = _VIEWS[id(table)] = TableView(table)
    return view


__all__ = ["NO_TIMESTAMP", "STATIC_CLUSTERING", "RawRow", "TableView", "decode_elements", "decode_value",
           "table_view"]
