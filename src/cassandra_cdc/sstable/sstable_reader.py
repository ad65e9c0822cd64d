"""``SSTable``: one SSTable's components, its metadata, and its partitions streamed from Data.db.

Example::

    sstable = SSTable("data/shop/orders-1b2c.../nb-7-big-Data.db")
    for update in sstable.partitions(schema.table("shop", "orders")):   # or partitions() alone
        ...
    # split one SSTable over several tasks (ranges of partition start offsets in Data.db)
    for data_range in sstable.chunk_ranges(count=8):
        for update in sstable.partitions(table, data_range):
            ...
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator, NamedTuple

from ..storage.binary_io import EndOfData
from ..storage.partition_update import PartitionUpdate
from ..schema.model import TableMetadata
from ..schema.types import CqlTypeError
from .compression import CompressedChunks, CompressionInfo, ReadCounters, UncompressedBlocks, read_digest
from .sstable_descriptor import Descriptor, Version, is_data_file
from .sstable_errors import ChecksumError, SSTableError
from .index import big_index_entries, bti_index_entries
from .metadata import HeaderComponent, SSTableMetadata, read_metadata
from .sstable_partition import DataHeader, SSTablePartitionSerializer
from .stream import StreamInput
from .header_table import serialization_header, table_from_header

DEFAULT_TASK_BYTES = 128 << 20


class DataRange(NamedTuple):
    """Partitions starting at uncompressed Data.db offsets ``start <= offset < end`` (``end`` None: to the end)."""

    start: int
    end: int | None


@dataclass
class SSTableReadStats:
    """What one read of Data.db saw and checked."""

    partitions: int = 0
    rows: int = 0
    range_tombstone_markers: int = 0
    chunks: int = 0
    file_bytes: int = 0  # bytes of Data.db read (compressed chunks with their CRCs)
    chunk_crcs_checked: bool = False
    digest_checked: bool = False


class SSTable:
    """One SSTable, named by any of its component files (usually Data.db) or by the directory holding it.

    Nothing is opened until needed and no file stays open, so an SSTable can be sent to other processes.
    """

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            data_files = sorted(p for p in path.iterdir() if is_data_file(p))
            if len(data_files) != 1:
                found = ", ".join(p.name for p in data_files) or "none"
                raise SSTableError(f"a directory holding one SSTable was expected; Data.db files found: {found}",
                                   path)
            path = data_files[0]
        self.descriptor = Descriptor.from_path(path)
        self.data_path = self.descriptor.path("Data.db")
        if not self.data_path.exists():
            raise SSTableError("no such Data.db file", self.data_path)

    def __repr__(self) -> str:
        return f"SSTable({str(self.data_path)!r})"

    @property
    def version(self) -> Version:
        return self.descriptor.version

    def component(self, name: str) -> Path:
        return self.descriptor.path(name)

    def has(self, name: str) -> bool:
        return self.component(name).exists()

    # --- metadata ---------------------------------------------------------------------------------

    @cached_property
    def metadata(self) -> SSTableMetadata:
        """Statistics.db: partitioner, min/max timestamps, and the serialization header."""
        return read_metadata(self.component("Statistics.db"), self.version)

    def read_header(self) -> HeaderComponent:
        """The serialization header of Statistics.db: encoding stats, and every column with its stored type."""
        return self.metadata.header

    @cached_property
    def compression(self) -> CompressionInfo | None:
        """CompressionInfo.db, or None for an uncompressed SSTable."""
        path = self.component("CompressionInfo.db")
        return CompressionInfo.read(path, self.version) if path.exists() else None

    @property
    def data_length(self) -> int:
        """Length of the (uncompressed) Data.db."""
        info = self.compression
        return info.data_length if info is not None else self.data_path.stat().st_size

    def table_from_header(self, keyspace: str | None = None, name: str | None = None) -> TableMetadata:
        """A table built from Statistics.db alone, named after the SSTable's directories unless told."""
        keyspace = keyspace or self.descriptor.keyspace or "unknown"
        name = name or self.descriptor.table or "unknown"
        try:
            return table_from_header(self.read_header(), keyspace, name, self.descriptor.table_id)
        except CqlTypeError as error:
            raise SSTableError(f"Statistics.db: {error}", self.component("Statistics.db")) from None

    def data_header(self, schema_table: TableMetadata | None = None) -> DataHeader:
        """What Data.db is decoded with: Statistics.db's column lists and types, named by ``schema_table``."""
        table = schema_table if schema_table is not None else self.table_from_header()
        try:
            header = serialization_header(self.read_header(), table, self.version)
        except (CqlTypeError, ValueError) as error:
            raise SSTableError(f"Statistics.db: {error}", self.component("Statistics.db")) from None
        return DataHeader(table, self.version, header)

    # --- Data.db ------------------------------------------------------------------------------------

    def partitions(self, schema_table: TableMetadata | None = None, data_range: DataRange | None = None,
                   stats: SSTableReadStats | None = None) -> Iterator[PartitionUpdate]:
        """The partitions of Data.db in order, one at a time, as partition updates.

        Values are decoded with the types Statistics.db records; ``schema_table`` (default: a table built
        from Statistics.db alone) gives the names. ``data_range`` limits the read to the partitions
        starting in it (its ``start`` must be a partition start, as :meth:`chunk_ranges` gives). Every
        chunk's CRC is checked, and the whole file's digest when the read covers the whole file.
        """
        for _, update in self.partitions_with_offsets(schema_table, data_range, stats):
            yield update

    def partitions_with_offsets(self, schema_table: TableMetadata | None = None,
                                data_range: DataRange | None = None,
                                stats: SSTableReadStats | None = None) -> Iterator[tuple[int, PartitionUpdate]]:
        """As :meth:`partitions`, with the Data.db offset each partition starts at."""
        data = self.data_header(schema_table)
        start, end = (data_range.start, data_range.end) if data_range is not None else (0, None)
        stats = stats if stats is not None else SSTableReadStats()
        counters = ReadCounters()
        inp = self._open(start, counters)
        try:
            while True:
                offset = inp.position
                # at_end() past the last chunk lets the chunk reader finish: that checks the digest
                if (end is not None and offset >= end) or inp.at_end():
                    break
                try:
                    update = SSTablePartitionSerializer.deserialize(inp, data)
                except (ValueError, IndexError, struct.error) as error:
                    raise self._decode_error(error, offset, inp.position) from None
                stats.partitions += 1
                rows = len(update.rows)
                stats.rows += rows
                stats.range_tombstone_markers += len(update.unfiltereds) - rows
                yield offset, update
        finally:
            stats.chunks += counters.chunks
            stats.file_bytes += counters.compressed_bytes
            stats.chunk_crcs_checked |= counters.crc_checked
            stats.digest_checked |= counters.digest_verified

    def _open(self, start: int, counters: ReadCounters) -> StreamInput:
        digest = read_digest(self.component("Digest.crc32"))
        info = self.compression
        if info is not None:
            chunks: CompressedChunks | UncompressedBlocks = CompressedChunks(self.data_path, info, start, digest,
                                                                             counters)
        else:
            chunks = UncompressedBlocks(self.data_path, self.component("CRC.db"), start, digest, counters)
        inp = StreamInput(chunks, chunks.start_offset)
        if start > inp.position:
            try:
                inp.skip_to(start)
            except EndOfData:
                raise SSTableError(f"range start {start} is past the end of the data", self.data_path) from None
        return inp

    def _decode_error(self, error: Exception, partition_offset: int, position: int) -> SSTableError:
        if isinstance(error, SSTableError):
            return error
        return SSTableError(f"cannot decode the partition starting at offset {partition_offset} "
                            f"(stopped at offset {position} of the uncompressed data): {error}",
                            self.data_path, partition_offset)

    # --- splitting ----------------------------------------------------------------------------------

    def partition_offsets(self) -> Iterator[int]:
        """Data.db offset of every partition, in order: from Index.db (big), Partitions.db (bti), or else
        by scanning Data.db (skipping rows by their recorded sizes)."""
        for _, position in self.index_entries():
            yield position

    def index_entries(self) -> Iterator[tuple[bytes | None, int]]:
        """(partition key, Data.db offset) of every partition; the key may be None for bti partitions
        without a row index."""
        if self.version.format == "big" and self.has("Index.db"):
            yield from big_index_entries(self.component("Index.db"))
        elif self.version.format == "bti" and self.has("Partitions.db"):
            yield from bti_index_entries(self.component("Partitions.db"), self.component("Rows.db"))
        else:
            yield from self._scan_entries()

    def _scan_entries(self) -> Iterator[tuple[bytes, int]]:
        data = self.data_header()
        inp = self._open(0, ReadCounters())
        while not inp.at_end():
            offset = inp.position
            try:
                key = SSTablePartitionSerializer.skip(inp, data)
            except (ValueError, IndexError, struct.error) as error:
                raise self._decode_error(error, offset, inp.position) from None
            yield key, offset

    def chunk_ranges(self, count: int | None = None, target_bytes: int = DEFAULT_TASK_BYTES) -> list[DataRange]:
        """Split Data.db into about ``count`` ranges (default: one per ``target_bytes`` of uncompressed data)
        that start at partition boundaries, for reading one SSTable in several tasks.

        Every partition starts in exactly one range; a range may be empty of partitions only when
        the SSTable is.
        """
        length = self.data_length
        if count is None:
            count = max(1, -(-length // max(1, target_bytes)))
        targets = [length * i // count for i in range(1, count)]
        starts = [0]
        next_target = 0
        for offset in self.partition_offsets():
            while next_target < len(targets) and targets[next_target] <= offset:
                next_target += 1
                if offset > starts[-1]:
                    starts.append(offset)
            if next_target == len(targets):
                break
        return [DataRange(s, e) for s, e in zip(starts, [*starts[1:], None])]


def find_sstables(directory: str | Path) -> list[SSTable]:
    """Every SSTable whose Data.db is in ``directory`` (not in its subdirectories), by generation."""
    directory = Path(directory)
    return [SSTable(p) for p in sorted(directory.iterdir(), key=_generation_order) if is_data_file(p)]


def _generation_order(path: Path) -> tuple[int, str]:
    parts = path.name.split("-")
    generation = parts[1] if len(parts) > 1 else ""
    return (int(generation), "") if generation.isdigit() else (1 << 62, generation)


__all__ = ["ChecksumError", "DataRange", "SSTable", "SSTableReadStats", "find_sstables"]
