"""Partition updates as JSON objects, one per row-level change: the ``cassandra-cdc dump`` format.

Values are shown as CQL's ``SELECT JSON`` shows them (text as strings, numbers as numbers, varint and
decimal too, exactly: write them with :func:`~..schema.types.json_text`; blobs as 0x-hex, uuids as
strings); timestamps are microseconds, TTLs and local
deletion/expiry times seconds, exactly as stored.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..schema.model import ColumnMetadata, TableMetadata
from ..schema.types import CqlType, json_text
from .cells import Cell, ComplexColumn, DeletionTime, LivenessInfo
from .counters import counter_value
from .partition_update import PartitionUpdate
from .rows import Clustering, RangeTombstoneMarker, Row

class KeyDecodeError(ValueError):
    """A partition key or clustering value that its declared type cannot decode: the schema does not
    describe the data (a null in its place would pass for a real key)."""


def render_value(cql_type: CqlType, value: bytes | None) -> Any:
    """A stored value as JSON; an empty value (``blobAsInt(0x)``) is "0x" for blobs, else "", as SELECT JSON
    shows it."""
    if value is None:
        return None
    if not value:
        return "0x" if cql_type.kind == "blob" else ""
    if cql_type.is_counter:
        return counter_value(value)
    return cql_type.to_json(cql_type.deserialize(value))


def _safe_value(cql_type: CqlType, value: bytes | None) -> tuple[Any, str | None]:
    try:
        return render_value(cql_type, value), None
    except Exception as error:  # a value the type's decoder rejects: show its bytes and why
        return None, f"cannot decode {len(value or b'')} bytes as {cql_type.cql}: {error}"


def _deletion(deletion: DeletionTime) -> dict[str, int]:
    return {"timestamp": deletion.marked_for_delete_at, "local_deletion_time": deletion.local_deletion_time}


def _liveness(liveness: LivenessInfo) -> dict[str, int]:
    out = {"timestamp": liveness.timestamp}
    if liveness.is_expiring:
        out |= {"ttl": liveness.ttl, "expires_at": liveness.local_expiration_time}  # type: ignore[dict-item]
    return out


def _named_values(columns: tuple[ColumnMetadata, ...], values: Clustering | list[bytes]) -> dict[str, Any]:
    named = {}
    for column, value in zip(columns, values):
        named[column.name], error = _safe_value(column.type, value)
        if error:
            raise KeyDecodeError(f"primary key column {column.name}: {error} "
                                 "(is that its type in the schema?)")
    return named


def partition_key_text(table: TableMetadata, key: bytes) -> str:
    """A partition key as JSON, e.g. ``{"id": 7}``, for messages; its bytes in hex when its types do not
    decode it."""
    try:
        return json_text(_named_values(table.partition_key, table.split_partition_key(key)))
    except ValueError:
        return f"0x{key.hex()}"


def render_cell(cell: Cell) -> dict[str, Any]:
    column = cell.column
    out: dict[str, Any] = {"column": column.name}
    if cell.path is not None:
        out["path"], _ = _safe_value(column.type.path_type, cell.path)
        if column.type.kind == "udt":
            index = int.from_bytes(cell.path, "big")
            names = column.type.field_names
            out["path"] = names[index] if index < len(names) else index
        value_type = column.type.element_type(cell.path)
    else:
        value_type = column.type
    if cell.is_tombstone:
        out["value"] = None
    else:
        out["value"], error = _safe_value(value_type, cell.value)
        if error:
            out |= {"raw": "0x" + cell.value.hex(), "error": error}
    out["timestamp"] = cell.timestamp
    if cell.is_expiring:
        out |= {"ttl": cell.ttl, "expires_at": cell.local_deletion_time}
    if cell.is_tombstone:
        out |= {"tombstone": True, "deleted_at": cell.local_deletion_time}
    return out


def _render_row_cells(row: Row) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    for data in row.cells:
        if isinstance(data, ComplexColumn):
            if data.deletion is not None:
                cells.append({"column": data.column.name, "collection_deletion": _deletion(data.deletion)})
            cells.extend(render_cell(c) for c in data.cells)
        else:
            cells.append(render_cell(data))
    return cells


def render_partition_update(update: PartitionUpdate, source: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One object per change in the update: partition deletion, static row, rows, range deletions.

    Raises KeyDecodeError for a key or clustering value the table's types cannot decode."""
    table = update.table
    try:
        key_values = table.split_partition_key(update.key)
    except ValueError as error:
        raise KeyDecodeError(str(error)) from None
    base = {"keyspace": table.keyspace, "table": table.name,
            "key": _named_values(table.partition_key, key_values)}
    if update.partition_deletion is not None:
        yield base | {"type": "partition_deletion", "deletion": _deletion(update.partition_deletion)} | source
    if update.static_row is not None:
        yield base | _render_row(update.static_row, table) | source
    open_marker: RangeTombstoneMarker | None = None
    for unfiltered in update.unfiltereds:
        if isinstance(unfiltered, Row):
            yield base | _render_row(unfiltered, table) | source
            continue
        if unfiltered.kind.closes and open_marker is not None:
            yield base | _render_range(open_marker, unfiltered, table) | source
        open_marker = unfiltered if unfiltered.kind.opens else None


def _render_row(row: Row, table: TableMetadata) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "static_row" if row.is_static else "row"}
    if table.clustering and not row.is_static:
        out["clustering"] = _named_values(table.clustering, row.clustering)
    if row.liveness is not None:
        out["liveness"] = _liveness(row.liveness)
    if row.deletion is not None:
        out["deletion"] = _deletion(row.deletion) | ({"shadowable": True} if row.shadowable_deletion else {})
    out["cells"] = _render_row_cells(row)
    return out


def _render_range(start: RangeTombstoneMarker, end: RangeTombstoneMarker, table: TableMetadata) -> dict[str, Any]:
    return {
        "type": "range_deletion",
        "start": {"clustering": _named_values(table.clustering[:len(start.clustering)], start.clustering),
                  "inclusive": start.kind.opens_inclusive},
        "end": {"clustering": _named_values(table.clustering[:len(end.clustering)], end.clustering),
                "inclusive": end.kind.closes_inclusive},
        "deletion": _deletion(start.open_deletion),  # type: ignore[arg-type]
    }
