"""Partition updates: one table's changes to one partition (docs/storage-format.md §9.1, §9.2, §9.4)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Sequence

from ..schema.model import ColumnMetadata, Schema, TableMetadata
from .cells import DeletionTime
from .decode_errors import MutationDecodeError, UnknownTableError
from .serialization_header import TIMESTAMP_EPOCH, EncodingStats, SerializationHeader, StatsCollector
from .binary_io import DataInput, DataOutput
from .rows import END_OF_PARTITION, RangeTombstoneMarker, Row, Unfiltered, UnfilteredSerializer
from .vint import read_unsigned_vint, s64

# Partition flags
IS_EMPTY = 0x01
_INT64_LIMIT = 1 << 63
IS_REVERSED = 0x02
HAS_PARTITION_DELETION = 0x04
HAS_STATIC_ROW = 0x08
HAS_ROW_ESTIMATE = 0x10
# What Cassandra writes for a partition update: IS_EMPTY alone, or the other flags with the row count
# (``update.rowCount()``) always there, and never IS_REVERSED. Anything else is damage, not data.
_UPDATE_FLAGS = HAS_PARTITION_DELETION | HAS_STATIC_ROW | HAS_ROW_ESTIMATE

# Column lists cached per table (ColumnsSerializer): enough for every subset a workload's statements write,
# bounded for a wide table updated in arbitrary column combinations.
MAX_CACHED_COLUMN_HEADERS = 1024


@dataclass(slots=True)
class PartitionUpdate:
    """The changes of one table in one partition.

    ``regular_columns`` and ``static_columns`` are the header's column lists (the columns the statement
    wrote, in Cassandra's column order); rows index into them. ``unfiltereds`` holds rows and range
    tombstone markers in clustering order.
    """

    table: TableMetadata
    key: bytes
    unfiltereds: list[Unfiltered] = field(default_factory=list)
    static_row: Row | None = None
    partition_deletion: DeletionTime | None = None
    regular_columns: tuple[ColumnMetadata, ...] = ()
    static_columns: tuple[ColumnMetadata, ...] = ()

    @property
    def rows(self) -> list[Row]:
        return [u for u in self.unfiltereds if isinstance(u, Row)]

    @property
    def markers(self) -> list[RangeTombstoneMarker]:
        return [u for u in self.unfiltereds if isinstance(u, RangeTombstoneMarker)]

    @property
    def is_empty(self) -> bool:
        return self.partition_deletion is None and self.static_row is None and not self.unfiltereds

    def stats(self) -> EncodingStats:
        """The minimums Cassandra records for the update's timestamps, deletion times and TTLs."""
        collector = StatsCollector()
        if self.partition_deletion is not None:
            self.partition_deletion.collect(collector)
        if self.static_row is not None:
            self.static_row.collect(collector)
        for unfiltered in self.unfiltereds:
            unfiltered.collect(collector)
        return collector.stats()


class PartitionUpdateSerializer:
    @staticmethod
    def deserialize(inp: DataInput, schema: Schema, version: int) -> PartitionUpdate:
        start = inp.pos
        table, key, flags = PartitionUpdateSerializer._deserialize_key(inp, schema)
        if flags == IS_EMPTY:
            return PartitionUpdate(table, key)
        stats, statics, regulars = PartitionUpdateSerializer._deserialize_columns(inp, table, flags)
        header = SerializationHeader(table, version, stats, regulars, statics)
        update = PartitionUpdate(table, key, regular_columns=regulars, static_columns=statics)
        if flags & HAS_PARTITION_DELETION:
            update.partition_deletion = DeletionTime.deserialize(inp, header)
        if flags & HAS_STATIC_ROW:
            update.static_row = UnfilteredSerializer.deserialize_static_row(inp, header)
        row_count = inp.uvint()
        unfiltereds = update.unfiltereds
        while (row_flags := inp.byte()) != END_OF_PARTITION:
            unfiltereds.append(UnfilteredSerializer.deserialize(inp, header, row_flags))
        # Checked once at the end rather than per row: more unfiltereds than rows means range markers.
        if len(unfiltereds) != row_count and len(update.rows) != row_count:
            raise MutationDecodeError(f"partition update announces {row_count} rows but holds "
                                      f"{len(update.rows)}", start)
        return update

    @staticmethod
    def check_columns(update: bytes, schema: Schema) -> None:
        """Decode a serialized update up to its header's column lists, not its rows: raises
        ``MutationDecodeError`` when it names a column its table's definition in ``schema`` lacks (a
        definition older than the one the node wrote it with), ``UnknownTableError`` for an unknown table."""
        inp = DataInput(update)
        try:
            table, _, flags = PartitionUpdateSerializer._deserialize_key(inp, schema)
            if flags != IS_EMPTY:
                PartitionUpdateSerializer._deserialize_columns(inp, table, flags)
        except MutationDecodeError:
            raise
        except (ValueError, IndexError, KeyError) as error:  # EndOfData is a ValueError
            raise MutationDecodeError(str(error), inp.pos) from error

    @staticmethod
    def _deserialize_key(inp: DataInput, schema: Schema) -> tuple[TableMetadata, bytes, int]:
        """The update's table, partition key and flags (checked to be a mutation's)."""
        start = inp.pos
        table_id = inp.raw(16)
        table = schema.table_by_id_bytes(table_id)
        if table is None:
            raise UnknownTableError(uuid.UUID(bytes=table_id), start)
        key = inp.bytes_vint()
        flags_offset = inp.pos
        flags = inp.byte()
        if flags != IS_EMPTY and (flags & ~_UPDATE_FLAGS or not flags & HAS_ROW_ESTIMATE):
            raise MutationDecodeError(f"partition update flags {flags:#04x} are not a mutation's",
                                      flags_offset)
        return table, key, flags

    @staticmethod
    def _deserialize_columns(inp: DataInput, table: TableMetadata, flags: int) -> tuple[
            EncodingStats, tuple[ColumnMetadata, ...], tuple[ColumnMetadata, ...]]:
        """The header after the flags: the encoding stats, the static and the regular columns."""
        stats = EncodingStats.deserialize(inp)
        statics = ColumnsSerializer.deserialize(inp, table, static=True) if flags & HAS_STATIC_ROW else ()
        regulars = ColumnsSerializer.deserialize(inp, table, static=False)
        return stats, statics, regulars

    @staticmethod
    def serialize(update: PartitionUpdate, out: DataOutput, version: int) -> None:
        out += update.table.id.bytes
        out.bytes_vint(update.key)
        if update.is_empty:
            out.byte(IS_EMPTY)
            return
        # Mutations always carry the row estimate (``update.rowCount()``).
        flags = HAS_ROW_ESTIMATE
        if update.partition_deletion is not None:
            flags |= HAS_PARTITION_DELETION
        if update.static_row is not None:
            flags |= HAS_STATIC_ROW
        out.byte(flags)
        stats = update.stats()
        stats.serialize(out)
        if update.static_row is not None:
            ColumnsSerializer.serialize(update.static_columns, out)
        ColumnsSerializer.serialize(update.regular_columns, out)
        header = SerializationHeader(update.table, version, stats, update.regular_columns, update.static_columns)
        if update.partition_deletion is not None:
            update.partition_deletion.serialize(out, header)
        if update.static_row is not None:
            UnfilteredSerializer.serialize_row(update.static_row, out, header)
        out.uvint(len(update.rows))
        for unfiltered in update.unfiltereds:
            if isinstance(unfiltered, Row):
                UnfilteredSerializer.serialize_row(unfiltered, out, header)
            else:
                UnfilteredSerializer.serialize_marker(unfiltered, out, header)
        out.byte(END_OF_PARTITION)


class ColumnsSerializer:
    """A header's column list: a count, then each column's name bytes."""

    @staticmethod
    def deserialize(inp: DataInput, table: TableMetadata, static: bool) -> tuple[ColumnMetadata, ...]:
        """The header's ``static`` (or regular) columns: each of them one of the table's of that kind."""
        # A table's updates repeat a few column lists: skip over the names and look the list's bytes up,
        # resolving the names only the first time.
        buf, start = inp.buf, inp.pos
        count, pos = read_unsigned_vint(buf, start)
        for _ in range(count):
            name_length, pos = read_unsigned_vint(buf, pos)
            pos += name_length
        inp.move_to(pos)
        encoded = buf[start:pos]
        columns = table.column_headers.get(encoded)
        if columns is None:
            columns = ColumnsSerializer._resolve(DataInput(encoded), table)
            if len(table.column_headers) < MAX_CACHED_COLUMN_HEADERS:
                table.column_headers[encoded] = columns
        first = columns[0] if columns else None
        if first is not None and first.is_static != static and first.dropped_time is None:
            kind = "static" if static else "regular"
            raise ValueError(f"the {kind} columns of a {table.qualified_name} update list {first.name!r}")
        return columns

    @staticmethod
    def _resolve(inp: DataInput, table: TableMetadata) -> tuple[ColumnMetadata, ...]:
        columns: list[ColumnMetadata] = []
        listed_static: bool | None = None  # whether the columns so far are static
        for _ in range(inp.uvint()):
            name = inp.bytes_vint()
            column = table.column(name)
            if column is None:
                raise ValueError(f"unknown column {name.decode('utf-8', 'replace')!r} of {table.qualified_name}")
            # A dropped column's kind may not be known: it is taken for either.
            if column in columns or (listed_static is not None and column.dropped_time is None
                                       and column.is_static != listed_static):
                raise ValueError(f"the column list of a {table.qualified_name} update mixes static and "
                                 f"regular columns or repeats one: {[c.name for c in columns + [column]]}")
            if listed_static is None and column.dropped_time is None:
                listed_static = column.is_static
            columns.append(column)
        return tuple(columns)

    @staticmethod
    def serialize(columns: Sequence[ColumnMetadata], out: DataOutput) -> None:
        out.uvint(len(columns))
        for column in columns:
            out.bytes_vint(column.name_bytes)


def peek_min_timestamp(update: bytes | memoryview) -> int | None:
    """The smallest timestamp of a serialized partition update, read from its encoding stats.

    Only the table id, key and flags are skipped, so this costs nothing like a decode (the agent calls
    it for every record). None for an empty update.
    """
    key_length, key_start = read_unsigned_vint(update, 16)
    return peek_min_timestamp_after_key(update, key_start + key_length)


def peek_min_timestamp_after_key(update: bytes | memoryview, key_end: int) -> int | None:
    """``peek_min_timestamp`` for a caller that has read the partition key already (it ends at ``key_end``)."""
    if update[key_end] & IS_EMPTY:
        return None
    timestamp_delta, _ = read_unsigned_vint(update, key_end + 1)
    timestamp = timestamp_delta + TIMESTAMP_EPOCH
    return timestamp if timestamp < _INT64_LIMIT else s64(timestamp)  # s64 only when it wraps: per record
