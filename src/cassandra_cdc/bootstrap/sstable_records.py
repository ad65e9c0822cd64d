"""From the partitions of an SSTable to raw records, as an agent would publish them (docs/raw-records.md).

One partition gives one record, or several when it is large: at most ``RecordLimits.rows`` rows and
about ``RecordLimits.bytes`` bytes each, so that records stay well under Kafka's message size
(``storage.partition_split`` says how a partition is cut).

Record fields for snapshot data: flag ``snapshot``; ``segment_id`` is the SSTable's generation (a
number, or a 63-bit hash of a 5.0 UUID generation); ``position`` is the Data.db offset of the
partition, plus the piece's index for the pieces after the first (still below the next partition's
offset); ``write_time`` is the smallest timestamp of the piece, as for commit log records. The update
is serialized for commit log version 7, or 8 when a local deletion time does not fit a signed 32-bit
int (5.0's unsigned times, after 2038).

Cells of columns the table's schema does not know at all (neither current nor dropped) are left out,
counted, and logged once per SSTable: the pipeline could not decode a record naming them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Iterator

from ..storage.cells import INT_MAX, Cell, ComplexColumn
from ..storage.binary_io import DataOutput
from ..storage.partition_update import PartitionUpdate, PartitionUpdateSerializer, peek_min_timestamp
from ..storage.partition_split import RecordLimits, split_partition
from ..storage.rows import RangeTombstoneMarker, Row, Unfiltered
from ..schema import TableMetadata
from ..sstable import DataRange, SSTable, SSTableReadStats
from ..kafka.raw_records import RawRecord

log = logging.getLogger(__name__)

COMMITLOG_VERSION = 7
COMMITLOG_VERSION_UNSIGNED_DELETION_TIMES = 8


@dataclass
class RecordStats:
    partitions: int = 0
    rows: int = 0
    range_tombstone_markers: int = 0
    records: int = 0
    record_bytes: int = 0
    split_partitions: int = 0
    unknown_cells: int = 0
    empty_partitions: int = 0  # nothing left once unknown columns were left out


class RecordBuilder:
    """Raw records of the partitions of one SSTable (one builder per task)."""

    def __init__(self, sstable: SSTable, table: TableMetadata, node_id: str,
                 limits: RecordLimits = RecordLimits()) -> None:
        self.sstable = sstable
        self.table = table
        self.node_id = node_id
        self.limits = limits
        self.segment_id = sstable_segment_id(sstable)
        self.check_deletion_times = sstable.version.has_uint_deletion_time
        self.stats = RecordStats()
        header = sstable.data_header(table).header
        unknown = [c for c in (*header.regulars, *header.statics) if table.column(c.name_bytes) is None]
        self.unknown_columns = frozenset(c.name_bytes for c in unknown)
        if unknown:
            log.warning("%s: leaving out columns %s, which the schema of %s does not know (not even as "
                        "dropped); their cells are counted as unknown_cells", sstable.data_path,
                        ", ".join(sorted(c.name for c in unknown)), table.qualified_name)

    def read(self, data_range: DataRange | None = None,
             read_stats: SSTableReadStats | None = None) -> Iterator[tuple[bytes, list[RawRecord]]]:
        """Read the partitions starting in ``data_range`` (all by default): each one's Kafka key and records.

        Each partition's size in Data.db (up to the next one's start) tells whether it may need splitting,
        so the rows of most partitions are never measured one by one.
        """
        table = self.table
        end = self.sstable.data_length if data_range is None or data_range.end is None else data_range.end
        pending: tuple[int, PartitionUpdate] | None = None
        for offset, update in self.sstable.partitions_with_offsets(table, data_range, read_stats):
            if pending is not None:
                start, previous = pending
                yield record_key_of(table, previous), self.records(start, previous, offset - start)
            pending = (offset, update)
        if pending is not None:
            yield record_key_of(table, pending[1]), self.records(pending[0], pending[1], end - pending[0])

    def records(self, offset: int, update: PartitionUpdate, size_hint: int | None = None) -> list[RawRecord]:
        """The records of the partition starting at Data.db ``offset``; ``size_hint``: its size in Data.db."""
        stats = self.stats
        stats.partitions += 1
        rows = len(update.rows)
        stats.rows += rows
        stats.range_tombstone_markers += len(update.unfiltereds) - rows
        if self.unknown_columns:
            update = self._without_unknown_columns(update)
            if update.is_empty:
                stats.empty_partitions += 1
                return []
        limits = self.limits
        if len(update.unfiltereds) <= limits.rows and size_hint is not None and size_hint <= limits.bytes:
            pieces = [update]
        else:
            pieces = split_partition(update, limits)
            if len(pieces) > 1:
                stats.split_partitions += 1
        records = []
        for index, piece in enumerate(pieces):
            version = self._version(piece)
            out = DataOutput()
            PartitionUpdateSerializer.serialize(piece, out, version)
            data = bytes(out)
            write_time = peek_min_timestamp(data)
            records.append(RawRecord(self.node_id, self.segment_id, offset + index, version,
                                     0 if write_time is None else write_time, data, snapshot=True))
            stats.records += 1
            stats.record_bytes += len(data)
        return records

    def _version(self, update: PartitionUpdate) -> int:
        if self.check_deletion_times and max_local_deletion_time(update) > INT_MAX:
            return COMMITLOG_VERSION_UNSIGNED_DELETION_TIMES
        return COMMITLOG_VERSION

    def _without_unknown_columns(self, update: PartitionUpdate) -> PartitionUpdate:
        unknown = self.unknown_columns
        regulars = tuple(c for c in update.regular_columns if c.name_bytes not in unknown)
        statics = tuple(c for c in update.static_columns if c.name_bytes not in unknown)
        unfiltereds: list[Unfiltered] = []
        for unfiltered in update.unfiltereds:
            if isinstance(unfiltered, Row):
                row = self._row_without_unknown(unfiltered)
                if row is not None:
                    unfiltereds.append(row)
            else:
                unfiltereds.append(unfiltered)
        static_row = self._row_without_unknown(update.static_row) if update.static_row is not None else None
        return PartitionUpdate(update.table, update.key, unfiltereds, static_row, update.partition_deletion,
                               regulars, statics)

    def _row_without_unknown(self, row: Row) -> Row | None:
        kept = [d for d in row.cells if d.column.name_bytes not in self.unknown_columns]
        if len(kept) == len(row.cells):
            return row
        self.stats.unknown_cells += sum(len(d.cells) if isinstance(d, ComplexColumn) else 1
                                        for d in row.cells if d.column.name_bytes in self.unknown_columns)
        if not kept and row.liveness is None and row.deletion is None:
            return None
        return Row(row.clustering, kept, row.liveness, row.deletion, row.shadowable_deletion, row.is_static)


def max_local_deletion_time(update: PartitionUpdate) -> int:
    """The largest local deletion (or expiration) time in the update, -1 if none."""
    best = -1
    if update.partition_deletion is not None:
        best = update.partition_deletion.local_deletion_time
    rows = update.unfiltereds if update.static_row is None else [update.static_row, *update.unfiltereds]
    for unfiltered in rows:
        if isinstance(unfiltered, RangeTombstoneMarker):
            for deletion in (unfiltered.open_deletion, unfiltered.close_deletion):
                if deletion is not None and deletion.local_deletion_time > best:
                    best = deletion.local_deletion_time
            continue
        if unfiltered.deletion is not None and unfiltered.deletion.local_deletion_time > best:
            best = unfiltered.deletion.local_deletion_time
        liveness = unfiltered.liveness
        if liveness is not None and liveness.local_expiration_time is not None \
                and liveness.local_expiration_time > best:
            best = liveness.local_expiration_time
        for data in unfiltered.cells:
            cells: list[Cell] = data.cells if isinstance(data, ComplexColumn) else [data]
            if isinstance(data, ComplexColumn) and data.deletion is not None \
                    and data.deletion.local_deletion_time > best:
                best = data.deletion.local_deletion_time
            for cell in cells:
                if cell.local_deletion_time is not None and cell.local_deletion_time > best:
                    best = cell.local_deletion_time
    return best


def sstable_segment_id(sstable: SSTable) -> int:
    """What snapshot records carry as segment id: the SSTable's generation, or a hash of a UUID generation."""
    generation = sstable.descriptor.generation
    if generation.isdigit() and int(generation) < 1 << 63:
        return int(generation)
    return int.from_bytes(hashlib.md5(generation.encode()).digest()[:8], "big") & ((1 << 63) - 1)


def record_key_of(table: TableMetadata, update: PartitionUpdate) -> bytes:
    """The Kafka key of a partition's records (``topics.raw.record_key`` without parsing the bytes)."""
    return table.id.bytes + bytes(update.key)


__all__ = ["COMMITLOG_VERSION", "RecordBuilder", "RecordLimits", "RecordStats", "max_local_deletion_time",
           "record_key_of", "sstable_segment_id"]
