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
from typing import Any, Callable, Sequence

from ..schema.model import ColumnMetadata, TableMetadata
from ..schema.types import PROTOCOL_VERSION, CqlType
from .clustering import Clustering, ClusteringComparator, value_sort_key
from .row_state import RowState
from .partition_state import (NO_TIMESTAMP, PartitionState, cell_is_live, counter_value, deleted_at,
                    liveness_is_live)

STATIC_CLUSTERING: Clustering = ()
DEFAULT_GC_GRACE_SECONDS = 864_000

_INT = struct.Struct(">i")
_EMPTY_IS_A_VALUE = frozenset({"text", "varchar", "ascii", "blob"})

RawValues = tuple[Any, ...]
# The raw form of a visible row: (regular values or None for the static-only row, static values).
RawRow = tuple[RawValues | None, RawValues]
# Where a column's data is in a ``RowState``: ``cells``, ``complex`` or ``counters``.
_CELL, _COMPLEX, _COUNTER = range(3)
# A raw value (never None) to the value the driver decodes.
Decoder = Callable[[Any], Any]


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
        self._regular_layout = self._layout(self.regulars)
        self._static_layout = self._layout(self.statics)
        # How each shown column is decoded, in output order (partition key, clustering, regular then
        # static columns: ``table.columns``), with where its raw value is.
        self._key_decoders = tuple((c.name, value_decoder(c.type)) for c in table.partition_key)
        self._clustering_decoders = tuple((c.name, c.position, value_decoder(c.type))
                                          for c in table.clustering if c.name not in hidden)
        self._regular_decoders = tuple((c.name, index, column_decoder(c))
                                       for index, c in enumerate(self.regulars) if c.name not in hidden)
        self._static_decoders = tuple((c.name, index, column_decoder(c))
                                      for index, c in enumerate(self.statics) if c.name not in hidden)
        self._no_values: RawValues = (None,) * len(self.regulars)
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
        return self._values(row, self._regular_layout, deleted, now, require_live=True)

    def row_is_live(self, state: PartitionState, clustering: Clustering, row: RowState, now: int) -> bool:
        deleted = self.row_deletion(state, clustering, row)
        return self._values(row, self._regular_layout, deleted, now, require_live=True) is not None

    def static_values(self, state: PartitionState, now: int) -> tuple[bool, RawValues]:
        """Whether the static row is live, and the raw values of the static columns."""
        static = state.static
        if static is None or not self.statics and static.liveness is None:
            return False, (None,) * len(self.statics)
        deleted = deleted_at(state.deletion)
        if static.deletion is not None:
            deleted = max(deleted, static.deletion[0])
        values = self._values(static, self._static_layout, deleted, now, require_live=False)
        assert values is not None
        live = liveness_is_live(static.liveness, deleted, now) or any(v is not None for v in values)
        return live, values

    def _layout(self, columns: Sequence[ColumnMetadata]) -> tuple[tuple[str, int, int], ...]:
        """Per column: its name, which part of a ``RowState`` keeps its data, and the timestamp at or before
        which that data is deleted anyway (when the column was dropped)."""
        return tuple((c.name, _COMPLEX if c.is_complex else _COUNTER if c.type.is_counter else _CELL,
                      self.dropped.get(c.name, NO_TIMESTAMP)) for c in columns)

    def _values(self, row: RowState, layout: tuple[tuple[str, int, int], ...], deleted: int, now: int,
                require_live: bool) -> RawValues | None:
        live = liveness_is_live(row.liveness, deleted, now)
        values: list[Any] = []
        for name, part, dropped in layout:
            cutoff = dropped if dropped > deleted else deleted
            value: Any = None
            if part == _CELL:
                cell = row.cells.get(name)
                if cell is not None and cell_is_live(cell, cutoff, now):
                    value = cell[3]
            elif part == _COMPLEX:
                entry = row.complex.get(name)
                if entry is not None:
                    if entry[0] is not None and entry[0][0] > cutoff:
                        cutoff = entry[0][0]
                    elements = tuple(sorted((path, cell[3]) for path, cell in entry[1].items()
                                            if cell_is_live(cell, cutoff, now)))
                    value = elements or None
            else:
                counter = row.counters.get(name)
                if counter is not None:
                    value = counter_value(counter, cutoff)
            if value is not None:
                live = True
            values.append(value)
        if require_live and not live:
            return None
        return tuple(values)

    # --- decoded rows -----------------------------------------------------------------------------

    def partition_key_values(self, key: bytes) -> dict[str, Any]:
        values = self.table.split_partition_key(key)
        return {name: decode(value) for (name, decode), value in zip(self._key_decoders, values)}

    def decode_row(self, key_values: dict[str, Any], clustering: Clustering,
                   raw: RawRow | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        values, static_values = raw
        row = dict(key_values)
        for name, position, decode in self._clustering_decoders:
            value = clustering[position] if clustering else None
            row[name] = None if value is None else decode(value)
        _decode_into(row, self._regular_decoders, self._no_values if values is None else values)
        _decode_into(row, self._static_decoders, static_values)
        return row

    def decode_change(self, key_values: dict[str, Any], clustering: Clustering, before: RawRow | None,
                      after: RawRow | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """``decode_row`` of a row before and after a change: the values the change left alone are decoded
        once (most of a row's, as an update writes a few columns)."""
        decoded_before = self.decode_row(key_values, clustering, before)
        if decoded_before is None or after is None:
            return decoded_before, self.decode_row(key_values, clustering, after)
        decoded_after = dict(decoded_before)
        _decode_into(decoded_after, self._regular_decoders, self._no_values if after[0] is None else after[0],
                     self._no_values if before[0] is None else before[0])
        _decode_into(decoded_after, self._static_decoders, after[1], before[1])
        return decoded_before, decoded_after


def _decode_into(row: dict[str, Any], decoders: tuple[tuple[str, int, Decoder], ...], values: RawValues,
                 unchanged_from: RawValues | None = None) -> None:
    """Set the decoded ``values`` in ``row``; with ``unchanged_from``, only those that differ from it."""
    for name, index, decode in decoders:
        value = values[index]
        if unchanged_from is not None and (value is unchanged_from[index] or value == unchanged_from[index]):
            continue
        row[name] = None if value is None else decode(value)


def value_decoder(cql_type: CqlType) -> Decoder:
    """A stored value as the driver decodes it; an empty value of a type where it means nothing is None.

    ``CqlType.deserialize`` without its checks per call (half the cost): stored values are bytes already.
    """
    if cql_type.kind == "empty":
        return lambda data: None
    deserialize = cql_type.driver_type.deserialize
    if cql_type.kind in _EMPTY_IS_A_VALUE:
        return lambda data: deserialize(data, PROTOCOL_VERSION)
    return lambda data: deserialize(data, PROTOCOL_VERSION) if data else None


def column_decoder(column: ColumnMetadata) -> Decoder:
    """How a regular or static column's raw value (see ``TableView._values``) is decoded."""
    if column.type.is_counter:
        return lambda total: total
    if column.is_complex:
        path_key = value_sort_key(column.type.path_type)
        return lambda elements: decode_elements(column.type, sorted(elements, key=lambda e: path_key(e[0])))
    return value_decoder(column.type)


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


__all__ = ["NO_TIMESTAMP", "STATIC_CLUSTERING", "RawRow", "TableView", "decode_elements",
           "table_view"]
