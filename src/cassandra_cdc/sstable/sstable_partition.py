"""Partitions of Data.db: the partition header, then rows and range tombstone markers with their sizes.

Data.db is a sequence of partitions, each::

    uint16 key length, key bytes
    partition deletion   ma-nc: int32 localDeletionTime, int64 markedForDeleteAt (LIVE: Integer.MAX_VALUE,
                         Long.MIN_VALUE); oa/da: one byte 0x80 for LIVE, else int64 markedForDeleteAt (top bit
                         clear) and uint32 localDeletionTime
    static row           only when the Statistics.db header has static columns (possibly an empty row)
    rows and markers     as in a partition update (docs/storage-format.md §10.2, §10.5), except that after a
                         row's clustering (a marker's bound) come ``uvint size`` (of what follows it: the
                         next field and the body) and ``uvint previous unfiltered size`` (the whole length
                         of the row or marker before; for the first one, from the partition's start)
    0x01                 end of partition

Timestamps, TTLs and deletion times inside rows are deltas from the header's ``EncodingStats``, as in the
commit log; the column lists and their types are the Statistics.db header's, in Cassandra's column order.
"""

from __future__ import annotations

from ..storage.cells import INT_MAX, LONG_MIN, DeletionTime
from ..storage.serialization_header import SerializationHeader
from ..storage.binary_io import DataOutput
from ..storage.partition_update import PartitionUpdate
from ..storage.rows import (END_OF_PARTITION, EXTENSION_FLAG, IS_MARKER, IS_STATIC, ClusteringSerializer,
                              RangeTombstoneMarker, Row, Unfiltered, UnfilteredSerializer)
from ..schema.model import TableMetadata
from .sstable_descriptor import Version
from .stream import StreamInput

LIVE_DELETION = 0x80  # oa/da: the one byte of DeletionTime.LIVE


class DataHeader:
    """What every partition of one Data.db is read with: the table, the version, the serialization header
    (encoding stats, column lists with their stored types, clustering types)."""

    __slots__ = ("table", "version", "header")

    def __init__(self, table: TableMetadata, version: Version, header: SerializationHeader) -> None:
        self.table = table
        self.version = version
        self.header = header


class PartitionDeletionSerializer:
    """The partition-level ``DeletionTime`` of a partition header (not delta-coded)."""

    @staticmethod
    def deserialize(inp: StreamInput, version: Version) -> DeletionTime | None:
        if version.has_uint_deletion_time:
            first = inp.byte()
            if first & LIVE_DELETION:
                if first != LIVE_DELETION:
                    raise ValueError(f"invalid deletion time flags {first:#04x}")
                return None
            marked_for_delete_at = (first << 56) | int.from_bytes(inp.raw(7), "big")
            return DeletionTime(marked_for_delete_at, inp.int32() & 0xFFFFFFFF)
        local_deletion_time = inp.int32()
        marked_for_delete_at = inp.int64()
        if marked_for_delete_at == LONG_MIN and local_deletion_time == INT_MAX:
            return None
        return DeletionTime(marked_for_delete_at, local_deletion_time)

    @staticmethod
    def serialize(deletion: DeletionTime | None, version: Version) -> bytes:
        if version.has_uint_deletion_time:
            if deletion is None:
                return bytes((LIVE_DELETION,))
            if deletion.marked_for_delete_at < 0:  # its top bit would read as the LIVE flag
                raise ValueError(f"a partition deletion at timestamp {deletion.marked_for_delete_at} "
                                 f"cannot be written in format {version.name}")
            return (deletion.marked_for_delete_at.to_bytes(8, "big", signed=True)
                    + (deletion.local_deletion_time & 0xFFFFFFFF).to_bytes(4, "big"))
        if deletion is None:
            deletion = DeletionTime(LONG_MIN, INT_MAX)
        return (deletion.local_deletion_time.to_bytes(4, "big", signed=True)
                + deletion.marked_for_delete_at.to_bytes(8, "big", signed=True))


class SizeMismatch(ValueError):
    """A row or marker whose decoded length differs from its recorded size (wrong types or corruption)."""


class SSTablePartitionSerializer:
    @staticmethod
    def deserialize(inp: StreamInput, data: DataHeader) -> PartitionUpdate:
        """Read the partition starting at the current position (after it, the next one starts)."""
        header = data.header
        key = inp.raw(inp.uint16())
        update = PartitionUpdate(data.table, key, regular_columns=header.regulars, static_columns=header.statics)
        update.partition_deletion = PartitionDeletionSerializer.deserialize(inp, data.version)
        if header.statics:
            static_row = SSTablePartitionSerializer.deserialize_static_row(inp, header)
            if static_row.liveness is not None or static_row.deletion is not None or static_row.cells:
                update.static_row = static_row
        unfiltereds = update.unfiltereds
        while (flags := inp.byte()) != END_OF_PARTITION:
            if flags & IS_MARKER:
                unfiltereds.append(SSTablePartitionSerializer.deserialize_marker(inp, header))
            else:
                unfiltereds.append(SSTablePartitionSerializer.deserialize_row(inp, header, flags))
        return update

    @staticmethod
    def deserialize_static_row(inp: StreamInput, header: SerializationHeader) -> Row:
        flags = inp.byte()
        extended = inp.byte() if flags & EXTENSION_FLAG else 0
        if flags & IS_MARKER or not extended & IS_STATIC:
            raise ValueError(f"expected the static row, found flags {flags:#04x}/{extended:#04x}")
        end = _body_end(inp)
        inp.require(end - inp.position)  # the row serializers read the buffer directly
        row = UnfilteredSerializer.deserialize_row_body(inp, header, flags, extended, ())
        _check_end(inp, end, "static row")
        return row

    @staticmethod
    def deserialize_row(inp: StreamInput, header: SerializationHeader, flags: int) -> Row:
        extended = inp.byte() if flags & EXTENSION_FLAG else 0
        if extended & IS_STATIC:
            raise ValueError("a static row where a regular row or marker was expected")
        clustering = ClusteringSerializer.deserialize(inp, header.clustering_types)
        end = _body_end(inp)
        inp.require(end - inp.position)
        row = UnfilteredSerializer.deserialize_row_body(inp, header, flags, extended, clustering)
        _check_end(inp, end, "row")
        return row

    @staticmethod
    def deserialize_marker(inp: StreamInput, header: SerializationHeader) -> RangeTombstoneMarker:
        kind, clustering = UnfilteredSerializer.deserialize_marker_bound(inp, header)
        end = _body_end(inp)
        inp.require(end - inp.position)
        marker = UnfilteredSerializer.deserialize_marker_deletions(inp, header, kind, clustering)
        _check_end(inp, end, "range tombstone marker")
        return marker

    @staticmethod
    def serialize(update: PartitionUpdate, out: DataOutput, data: DataHeader) -> None:
        """Write the partition as Data.db holds it, with ``data.header``'s encoding stats and column lists."""
        header = data.header
        # The first row's "previous unfiltered" is the partition header (with the static row): its size
        # counts from the partition's start.
        previous_start = len(out)
        out.uint16(len(update.key))
        out += update.key
        out += PartitionDeletionSerializer.serialize(update.partition_deletion, data.version)
        if header.statics:
            static_row = update.static_row if update.static_row is not None else Row((), is_static=True)
            _serialize_unfiltered(static_row, out, header, 0)
        for unfiltered in update.unfiltereds:
            start = len(out)
            _serialize_unfiltered(unfiltered, out, header, start - previous_start)
            previous_start = start
        out.byte(END_OF_PARTITION)

    @staticmethod
    def skip(inp: StreamInput, data: DataHeader) -> bytes:
        """Move past the partition at the current position using the recorded row sizes; return its key."""
        header = data.header
        key = inp.raw(inp.uint16())
        PartitionDeletionSerializer.deserialize(inp, data.version)
        if header.statics:
            flags = inp.byte()
            if flags & EXTENSION_FLAG:
                inp.byte()
            inp.skip_to(_body_end(inp))
        while (flags := inp.byte()) != END_OF_PARTITION:
            if flags & IS_MARKER:
                inp.byte()
                size = inp.uint16()
                if size:
                    ClusteringSerializer.deserialize(inp, header.clustering_types[:size])
            else:
                if flags & EXTENSION_FLAG:
                    inp.byte()
                ClusteringSerializer.deserialize(inp, header.clustering_types)
            inp.skip_to(_body_end(inp))
        return key


def _body_end(inp: StreamInput) -> int:
    """Read a row's (marker's) size and previous size; return where its body ends."""
    size = inp.uvint()
    end = inp.position + size
    inp.uvint()  # size of the previous unfiltered, for reverse iteration
    return end


def _serialize_unfiltered(unfiltered: Unfiltered, out: DataOutput, header: SerializationHeader,
                          previous_size: int) -> None:
    """Write a row or marker with its sizes (of its body, and of the unfiltered before it)."""
    body = DataOutput()
    if isinstance(unfiltered, Row):
        flags = UnfilteredSerializer.serialize_row_head(unfiltered, out, header)
        UnfilteredSerializer.serialize_row_body(unfiltered, body, header, flags)
    else:
        UnfilteredSerializer.serialize_marker_bound(unfiltered, out, header)
        UnfilteredSerializer.serialize_marker_deletions(unfiltered, body, header)
    sizes = DataOutput()
    sizes.uvint(previous_size)
    out.uvint(len(sizes) + len(body))
    out += sizes
    out += body


def _check_end(inp: StreamInput, end: int, what: str) -> None:
    if inp.position != end:
        raise SizeMismatch(f"{what} decoded to offset {inp.position}, its recorded size ends it at {end} "
                           "(corrupt data, or column types other than those it was written with)")
