"""Cells, deletion times and row liveness, with their serializers side by side.

Byte format: docs/storage-format.md §11.1 (cell), §11.4 (complex column), §12 (deletion time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schema.model import ColumnMetadata
from .serialization_header import SerializationHeader, StatsCollector
from .binary_io import DataInput, DataOutput, EndOfData, read_bytes_vint
from .vint import INT_MAX, LONG_MIN, read_unsigned_vint

NO_TTL = 0
# A liveness TTL of Integer.MAX_VALUE marks the "expired liveness" of materialized view rows.
EXPIRED_LIVENESS_TTL = INT_MAX


def no_deletion_time(version: int) -> int:
    """The local deletion time meaning "none": Integer.MAX_VALUE, or 2^32-1 in 5.0's unsigned format."""
    return 0xFFFFFFFF if version >= 8 else INT_MAX


@dataclass(slots=True)
class DeletionTime:
    """A deletion: everything written at or before ``marked_for_delete_at`` is deleted.

    ``local_deletion_time`` is when the deletion happened, in seconds (used for tombstone GC).
    """

    marked_for_delete_at: int
    local_deletion_time: int

    @staticmethod
    def deserialize(inp: DataInput, header: SerializationHeader) -> "DeletionTime":
        """Decode with a local cursor: the bytes must be in ``inp.buf`` (see ``DataInput.require``)."""
        buf = inp.buf
        timestamp_delta, pos = read_unsigned_vint(buf, inp.pos)
        ldt_delta, pos = read_unsigned_vint(buf, pos)
        inp.move_to(pos)
        return DeletionTime(header.timestamp(timestamp_delta), header.ldt(ldt_delta))

    def serialize(self, out: DataOutput, header: SerializationHeader) -> None:
        header.write_timestamp(out, self.marked_for_delete_at)
        header.write_ldt(out, self.local_deletion_time)

    def collect(self, stats: StatsCollector) -> None:
        stats.timestamp_seen(self.marked_for_delete_at)
        stats.ldt_seen(self.local_deletion_time)

    @property
    def is_live(self) -> bool:
        """Cassandra's DeletionTime.LIVE placeholder (no deletion), recognised by its timestamp."""
        return self.marked_for_delete_at == LONG_MIN

    def deletes(self, timestamp: int) -> bool:
        return timestamp <= self.marked_for_delete_at


@dataclass(slots=True)
class LivenessInfo:
    """Primary key liveness ("row marker") written by INSERT; UPDATE writes none.

    ``ttl`` > 0 makes it expiring at ``local_expiration_time`` (seconds).
    """

    timestamp: int
    ttl: int = NO_TTL
    local_expiration_time: int | None = None

    @property
    def is_expiring(self) -> bool:
        return self.ttl != NO_TTL

    def collect(self, stats: StatsCollector) -> None:
        stats.timestamp_seen(self.timestamp)
        if self.is_expiring:
            stats.ttl_seen(self.ttl)
            stats.ldt_seen(self.local_expiration_time)  # type: ignore[arg-type]


@dataclass(slots=True)
class Cell:
    """One value of a simple column, or one element of a complex column (then ``path`` is set).

    A live cell has ``local_deletion_time`` None; an expiring cell has ``ttl`` > 0 and expires at
    ``local_deletion_time``; a tombstone has ``ttl`` 0 and was deleted at ``local_deletion_time``.
    Counter cells hold a counter context as value (see :mod:`.counters`).
    """

    column: ColumnMetadata
    timestamp: int
    value: bytes = b""
    ttl: int = NO_TTL
    local_deletion_time: int | None = None
    path: bytes | None = None

    @property
    def is_tombstone(self) -> bool:
        return self.local_deletion_time is not None and self.ttl == NO_TTL

    @property
    def is_expiring(self) -> bool:
        return self.ttl != NO_TTL

    def collect(self, stats: StatsCollector) -> None:
        stats.timestamp_seen(self.timestamp)
        if self.local_deletion_time is not None:
            stats.ldt_seen(self.local_deletion_time)
            if self.is_expiring:
                stats.ttl_seen(self.ttl)


# Cell flags
IS_DELETED = 0x01
IS_EXPIRING = 0x02
HAS_EMPTY_VALUE = 0x04
USE_ROW_TIMESTAMP = 0x08
USE_ROW_TTL = 0x10
# The flags of cells that have a deletion time (their own or the row's): one test for the common live cell.
_HAS_DELETION_TIME = IS_DELETED | IS_EXPIRING | USE_ROW_TTL


class CellSerializer:
    @staticmethod
    def deserialize(inp: DataInput, header: SerializationHeader, column: ColumnMetadata,
                    liveness: LivenessInfo | None) -> Cell:
        """Decode a cell with a local cursor: its bytes must all be in ``inp.buf`` (``DataInput.require``)."""
        buf, pos = inp.buf, inp.pos
        flags = buf[pos]
        pos += 1
        if flags & USE_ROW_TIMESTAMP:
            if liveness is None:
                raise ValueError(f"cell of {column.name} uses the row timestamp but the row has none")
            timestamp = liveness.timestamp
        else:
            delta, pos = read_unsigned_vint(buf, pos)
            timestamp = header.timestamp(delta)
        ttl, ldt = NO_TTL, None
        if flags & _HAS_DELETION_TIME:
            if flags & USE_ROW_TTL:
                if liveness is None or not liveness.is_expiring:
                    raise ValueError(f"cell of {column.name} uses the row TTL but the row has none")
                ttl, ldt = liveness.ttl, liveness.local_expiration_time
            else:
                delta, pos = read_unsigned_vint(buf, pos)
                ldt = header.ldt(delta)
                if flags & IS_EXPIRING:
                    delta, pos = read_unsigned_vint(buf, pos)
                    ttl = header.ttl(delta)
        path = None
        if column.is_complex:
            path, pos = read_bytes_vint(buf, pos)
        if flags & HAS_EMPTY_VALUE:
            value = b""
        elif (fixed := column.fixed_value_length) is not None:
            value = buf[pos:pos + fixed]
            pos += fixed
        else:
            value, pos = read_bytes_vint(buf, pos)
        if pos > inp.end:
            raise EndOfData(f"cell of {column.name} at offset {inp.pos} runs past the end")
        inp.pos = pos
        return Cell(column, timestamp, value, ttl, ldt, path)

    @staticmethod
    def serialize(cell: Cell, out: DataOutput, header: SerializationHeader, liveness: LivenessInfo | None) -> None:
        is_expiring = cell.is_expiring
        use_row_timestamp = liveness is not None and cell.timestamp == liveness.timestamp
        use_row_ttl = (is_expiring and liveness is not None and liveness.is_expiring
                       and cell.ttl == liveness.ttl and cell.local_deletion_time == liveness.local_expiration_time)
        flags = 0
        if cell.is_tombstone:
            flags |= IS_DELETED
        if is_expiring:
            flags |= IS_EXPIRING
        if not cell.value:
            flags |= HAS_EMPTY_VALUE
        if use_row_timestamp:
            flags |= USE_ROW_TIMESTAMP
        if use_row_ttl:
            flags |= USE_ROW_TTL
        out.byte(flags)
        if not use_row_timestamp:
            header.write_timestamp(out, cell.timestamp)
        if not use_row_ttl and cell.local_deletion_time is not None:
            header.write_ldt(out, cell.local_deletion_time)
            if is_expiring:
                header.write_ttl(out, cell.ttl)
        if cell.column.is_complex:
            out.bytes_vint(cell.path or b"")
        if cell.value:
            if cell.column.fixed_value_length is not None:
                out += cell.value
            else:
                out.bytes_vint(cell.value)


@dataclass(slots=True)
class ComplexColumn:
    """The cells of one non-frozen collection or UDT column in a row.

    ``deletion`` (e.g. the overwrite of a whole collection) deletes every element written at or
    before its timestamp; None when the row carries no deletion for this column.
    """

    column: ColumnMetadata
    cells: list[Cell] = field(default_factory=list)
    deletion: DeletionTime | None = None

    def collect(self, stats: StatsCollector) -> None:
        if self.deletion is not None:
            self.deletion.collect(stats)
        for cell in self.cells:
            cell.collect(stats)


class ComplexColumnSerializer:
    @staticmethod
    def deserialize(inp: DataInput, header: SerializationHeader, column: ColumnMetadata,
                    liveness: LivenessInfo | None, has_complex_deletion: bool) -> ComplexColumn:
        deletion = None
        if has_complex_deletion:
            deletion = DeletionTime.deserialize(inp, header)
            if deletion.is_live:
                deletion = None
        count = inp.uvint()
        cells = [CellSerializer.deserialize(inp, header, column, liveness) for _ in range(count)]
        return ComplexColumn(column, cells, deletion)

    @staticmethod
    def serialize(data: ComplexColumn, out: DataOutput, header: SerializationHeader,
                  liveness: LivenessInfo | None, has_complex_deletion: bool) -> None:
        if has_complex_deletion:
            deletion = data.deletion or DeletionTime(LONG_MIN, no_deletion_time(header.version))
            deletion.serialize(out, header)
        out.uvint(len(data.cells))
        for cell in data.cells:
            CellSerializer.serialize(cell, out, header, liveness)
