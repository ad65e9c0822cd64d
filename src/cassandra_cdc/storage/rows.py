"""Rows, range tombstone markers and clusterings, with their serializers side by side.

Byte format: docs/storage-format.md §10.1-§10.2 (row), §10.3 (clustering values), §10.4 (column
subsets), §10.5 (range tombstone marker).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence, Union

from ..schema.model import ColumnMetadata
from ..schema.types import CqlType
from .cells import (Cell, CellSerializer, ComplexColumn, ComplexColumnSerializer, DeletionTime, LivenessInfo)
from .serialization_header import SerializationHeader, StatsCollector
from .binary_io import DataInput, DataOutput

# A clustering value: bytes, b"" for an empty value, None for null (possible in markers and legacy data).
Clustering = tuple[bytes | None, ...]
ColumnData = Union[Cell, ComplexColumn]

# Row flags
END_OF_PARTITION = 0x01
IS_MARKER = 0x02
HAS_TIMESTAMP = 0x04
HAS_TTL = 0x08
HAS_DELETION = 0x10
HAS_ALL_COLUMNS = 0x20
HAS_COMPLEX_DELETION = 0x40
EXTENSION_FLAG = 0x80
# Extended row flags
IS_STATIC = 0x01
HAS_SHADOWABLE_DELETION = 0x02


@dataclass(slots=True)
class Row:
    """A row: its clustering, primary key liveness, deletion and column data (in header order)."""

    clustering: Clustering
    cells: list[ColumnData] = field(default_factory=list)
    liveness: LivenessInfo | None = None
    deletion: DeletionTime | None = None
    shadowable_deletion: bool = False  # materialized-view row deletions (deprecated since 4.0)
    is_static: bool = False

    def collect(self, stats: StatsCollector) -> None:
        if self.liveness is not None:
            self.liveness.collect(stats)
        if self.deletion is not None:
            self.deletion.collect(stats)
        for data in self.cells:
            data.collect(stats)


class BoundKind(enum.IntEnum):
    """``ClusteringPrefix.Kind`` ordinals of range tombstone bounds and boundaries."""

    EXCL_END_BOUND = 0
    INCL_START_BOUND = 1
    EXCL_END_INCL_START_BOUNDARY = 2
    INCL_END_EXCL_START_BOUNDARY = 5
    INCL_END_BOUND = 6
    EXCL_START_BOUND = 7

    @property
    def is_boundary(self) -> bool:
        return self in (BoundKind.EXCL_END_INCL_START_BOUNDARY, BoundKind.INCL_END_EXCL_START_BOUNDARY)

    @property
    def opens(self) -> bool:
        return self.is_boundary or self in (BoundKind.INCL_START_BOUND, BoundKind.EXCL_START_BOUND)

    @property
    def closes(self) -> bool:
        return self.is_boundary or self in (BoundKind.INCL_END_BOUND, BoundKind.EXCL_END_BOUND)

    @property
    def opens_inclusive(self) -> bool:
        return self in (BoundKind.INCL_START_BOUND, BoundKind.EXCL_END_INCL_START_BOUNDARY)

    @property
    def closes_inclusive(self) -> bool:
        return self in (BoundKind.INCL_END_BOUND, BoundKind.INCL_END_EXCL_START_BOUNDARY)


@dataclass(slots=True)
class RangeTombstoneMarker:
    """One end of a range deletion (a bound), or where one range ends and the next starts (a boundary).

    ``close_deletion`` is the deletion of the range ending here, ``open_deletion`` of the range starting
    here; a bound has one of them, a boundary both.
    """

    kind: BoundKind
    clustering: Clustering
    open_deletion: DeletionTime | None = None
    close_deletion: DeletionTime | None = None

    def collect(self, stats: StatsCollector) -> None:
        for deletion in (self.close_deletion, self.open_deletion):
            if deletion is not None:
                deletion.collect(stats)


Unfiltered = Union[Row, RangeTombstoneMarker]


class ClusteringSerializer:
    """Clustering values "without size": per batch of 32 values a header of null/empty bits."""

    @staticmethod
    def deserialize(inp: DataInput, types: Sequence[CqlType]) -> Clustering:
        values: list[bytes | None] = []
        for start in range(0, len(types), 32):
            header = inp.uvint()
            for value_type in types[start:start + 32]:
                if header & 2:
                    values.append(None)
                elif header & 1:
                    values.append(b"")
                elif (fixed := value_type.fixed_length) is not None:
                    values.append(inp.raw(fixed))
                else:
                    values.append(inp.bytes_vint())
                header >>= 2
        return tuple(values)

    @staticmethod
    def serialize(clustering: Clustering, out: DataOutput, types: Sequence[CqlType]) -> None:
        for start in range(0, len(clustering), 32):
            batch = clustering[start:start + 32]
            header = 0
            for k, value in enumerate(batch):
                if value is None:
                    header |= 2 << (2 * k)
                elif not value:
                    header |= 1 << (2 * k)
            out.uvint(header)
            for value, value_type in zip(batch, types[start:start + 32]):
                if value:
                    if value_type.fixed_length is not None:
                        out += value
                    else:
                        out.bytes_vint(value)


class ColumnSubsetSerializer:
    """Which of the header's columns a row has (``Columns.serializeSubset``)."""

    @staticmethod
    def deserialize(inp: DataInput, superset: tuple[ColumnMetadata, ...]) -> tuple[ColumnMetadata, ...]:
        encoded = inp.uvint()
        if encoded == 0:
            return superset
        count = len(superset)
        if count < 64:
            # A bitmap of the *missing* columns.
            if encoded >> count:
                raise ValueError(f"column subset bitmap {encoded:#x} has bits beyond {count} columns")
            return tuple(c for i, c in enumerate(superset) if not (encoded >> i) & 1)
        missing = encoded
        present = count - missing
        if present < count // 2:
            return tuple(superset[inp.uvint()] for _ in range(present))
        skipped = {inp.uvint() for _ in range(missing)}
        return tuple(c for i, c in enumerate(superset) if i not in skipped)

    @staticmethod
    def serialize(columns: Sequence[ColumnMetadata], out: DataOutput, superset: tuple[ColumnMetadata, ...]) -> None:
        count = len(superset)
        present = {c.name_bytes for c in columns}
        if count < 64:
            out.uvint(sum(1 << i for i, c in enumerate(superset) if c.name_bytes not in present))
            return
        missing = count - len(columns)
        out.uvint(missing)
        if len(columns) < count // 2:
            wanted = [i for i, c in enumerate(superset) if c.name_bytes in present]
        else:
            wanted = [i for i, c in enumerate(superset) if c.name_bytes not in present]
        for index in wanted:
            out.uvint(index)


class UnfilteredSerializer:
    """Rows and range tombstone markers in a partition update (messaging form, no row sizes)."""

    @staticmethod
    def deserialize(inp: DataInput, header: SerializationHeader, flags: int) -> Unfiltered:
        """Decode the row or marker whose ``flags`` byte was just read (and is not END_OF_PARTITION)."""
        if flags & IS_MARKER:
            return UnfilteredSerializer.deserialize_marker(inp, header)
        extended = inp.byte() if flags & EXTENSION_FLAG else 0
        if extended & IS_STATIC:
            raise ValueError("a static row where a regular row or marker was expected")
        clustering = ClusteringSerializer.deserialize(inp, header.clustering_types)
        return UnfilteredSerializer.deserialize_row_body(inp, header, flags, extended, clustering)

    @staticmethod
    def deserialize_static_row(inp: DataInput, header: SerializationHeader) -> Row:
        flags = inp.byte()
        extended = inp.byte() if flags & EXTENSION_FLAG else 0
        if not extended & IS_STATIC:
            raise ValueError("the static row does not carry the IS_STATIC flag")
        return UnfilteredSerializer.deserialize_row_body(inp, header, flags, extended, ())

    @staticmethod
    def deserialize_row_body(inp: DataInput, header: SerializationHeader, flags: int, extended: int,
                             clustering: Clustering) -> Row:
        """The rest of a row; its cells are read straight from ``inp.buf`` (see ``DataInput.require``)."""
        is_static = bool(extended & IS_STATIC)
        liveness = None
        if flags & HAS_TIMESTAMP:
            timestamp = header.read_timestamp(inp)
            if flags & HAS_TTL:
                ttl = header.read_ttl(inp)
                liveness = LivenessInfo(timestamp, ttl, header.read_ldt(inp))
            else:
                liveness = LivenessInfo(timestamp)
        deletion = DeletionTime.deserialize(inp, header) if flags & HAS_DELETION else None
        superset = header.columns(is_static)
        columns = superset if flags & HAS_ALL_COLUMNS else ColumnSubsetSerializer.deserialize(inp, superset)
        has_complex_deletion = bool(flags & HAS_COMPLEX_DELETION)
        cells: list[ColumnData] = [
            ComplexColumnSerializer.deserialize(inp, header, column, liveness, has_complex_deletion)
            if column.is_complex else CellSerializer.deserialize(inp, header, column, liveness)
            for column in columns]
        return Row(clustering, cells, liveness, deletion, bool(extended & HAS_SHADOWABLE_DELETION), is_static)

    @staticmethod
    def serialize_row(row: Row, out: DataOutput, header: SerializationHeader) -> None:
        flags = UnfilteredSerializer.serialize_row_head(row, out, header)
        UnfilteredSerializer.serialize_row_body(row, out, header, flags)

    @staticmethod
    def serialize_row_head(row: Row, out: DataOutput, header: SerializationHeader) -> int:
        """A row's flags and clustering (SSTables put sizes between these and the body); returns the flags."""
        superset = header.columns(row.is_static)
        flags = 0
        extended = (IS_STATIC if row.is_static else 0) | (HAS_SHADOWABLE_DELETION if row.shadowable_deletion else 0)
        if extended:
            flags |= EXTENSION_FLAG
        if row.liveness is not None:
            flags |= HAS_TIMESTAMP
            if row.liveness.is_expiring:
                flags |= HAS_TTL
        if row.deletion is not None:
            flags |= HAS_DELETION
        if len(row.cells) == len(superset):
            flags |= HAS_ALL_COLUMNS
        if any(isinstance(d, ComplexColumn) and d.deletion is not None for d in row.cells):
            flags |= HAS_COMPLEX_DELETION
        out.byte(flags)
        if extended:
            out.byte(extended)
        if not row.is_static:
            ClusteringSerializer.serialize(row.clustering, out, header.clustering_types)
        return flags

    @staticmethod
    def serialize_row_body(row: Row, out: DataOutput, header: SerializationHeader, flags: int) -> None:
        liveness = row.liveness
        if liveness is not None:
            header.write_timestamp(out, liveness.timestamp)
            if liveness.is_expiring:
                header.write_ttl(out, liveness.ttl)
                header.write_ldt(out, liveness.local_expiration_time)  # type: ignore[arg-type]
        if row.deletion is not None:
            row.deletion.serialize(out, header)
        if not flags & HAS_ALL_COLUMNS:
            superset = header.columns(row.is_static)
            ColumnSubsetSerializer.serialize([d.column for d in row.cells], out, superset)
        has_complex_deletion = bool(flags & HAS_COMPLEX_DELETION)
        for data in row.cells:
            if isinstance(data, ComplexColumn):
                ComplexColumnSerializer.serialize(data, out, header, liveness, has_complex_deletion)
            else:
                CellSerializer.serialize(data, out, header, liveness)

    @staticmethod
    def deserialize_marker(inp: DataInput, header: SerializationHeader) -> RangeTombstoneMarker:
        kind, clustering = UnfilteredSerializer.deserialize_marker_bound(inp, header)
        return UnfilteredSerializer.deserialize_marker_deletions(inp, header, kind, clustering)

    @staticmethod
    def deserialize_marker_bound(inp: DataInput, header: SerializationHeader) -> tuple[BoundKind, Clustering]:
        """A marker's kind and clustering prefix (SSTables put sizes between these and the deletions)."""
        kind = BoundKind(inp.byte())
        size = inp.uint16()
        types = header.clustering_types
        if size > len(types):
            raise ValueError(f"range tombstone bound has {size} values, the table {len(types)} clustering columns")
        return kind, ClusteringSerializer.deserialize(inp, types[:size]) if size else ()

    @staticmethod
    def deserialize_marker_deletions(inp: DataInput, header: SerializationHeader, kind: BoundKind,
                                     clustering: Clustering) -> RangeTombstoneMarker:
        """A boundary's closing then opening deletion, or a bound's one deletion."""
        if kind.is_boundary:
            close = DeletionTime.deserialize(inp, header)
            return RangeTombstoneMarker(kind, clustering, DeletionTime.deserialize(inp, header), close)
        deletion = DeletionTime.deserialize(inp, header)
        if kind.opens:
            return RangeTombstoneMarker(kind, clustering, open_deletion=deletion)
        return RangeTombstoneMarker(kind, clustering, close_deletion=deletion)

    @staticmethod
    def serialize_marker(marker: RangeTombstoneMarker, out: DataOutput, header: SerializationHeader) -> None:
        UnfilteredSerializer.serialize_marker_bound(marker, out, header)
        UnfilteredSerializer.serialize_marker_deletions(marker, out, header)

    @staticmethod
    def serialize_marker_bound(marker: RangeTombstoneMarker, out: DataOutput,
                               header: SerializationHeader) -> None:
        out.byte(IS_MARKER)
        out.byte(marker.kind)
        out.uint16(len(marker.clustering))
        if marker.clustering:
            ClusteringSerializer.serialize(marker.clustering, out, header.clustering_types)

    @staticmethod
    def serialize_marker_deletions(marker: RangeTombstoneMarker, out: DataOutput,
                                   header: SerializationHeader) -> None:
        if marker.kind.closes:
            _require(marker.close_deletion, marker).serialize(out, header)
        if marker.kind.opens:
            _require(marker.open_deletion, marker).serialize(out, header)


def _require(deletion: DeletionTime | None, marker: RangeTombstoneMarker) -> DeletionTime:
    if deletion is None:
        raise ValueError(f"{marker.kind.name} marker at {marker.clustering} lacks its deletion time")
    return deletion
