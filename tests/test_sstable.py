"""The SSTable reader against SSTables written by real Cassandra nodes (../shared/cassandra-sstables).

The oracle is the README there (LegacySSTableTest's tables): per version, 5 partitions ``'0'..'4'``;
``_simple``: ``val = 'foo bar baz'``; counters: 1; ``_clust*``: 50 rows per partition with ``ck = str(i) +
LONG``, ``_clust`` values 128 lowercase letters; every cell with a write timestamp.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cassandra_cdc.cli.main import app
from cassandra_cdc.storage.cells import Cell, ComplexColumn, LivenessInfo
from cassandra_cdc.storage.counters import counter_value
from cassandra_cdc.storage.serialization_header import EncodingStats, SerializationHeader
from cassandra_cdc.storage.binary_io import DataOutput
from cassandra_cdc.storage.partition_update import PartitionUpdate
from cassandra_cdc.storage.rows import BoundKind, RangeTombstoneMarker, Row
from cassandra_cdc.schema import ColumnKind, Schema, TableMetadata, parse_schema
from cassandra_cdc.schema.types import (CqlTypeError, is_reversed_class_name, type_from_class_name,
                                        types_from_composite_class_name)
from cassandra_cdc.sstable import (ChecksumError, Descriptor, HeaderComponent, SSTable, SSTableError,
                                   SSTableReadStats, UnsupportedSSTableError, Version, find_sstables)
from cassandra_cdc.sstable.metadata import serialize_metadata
from cassandra_cdc.sstable.sstable_partition import DataHeader, SSTablePartitionSerializer
from cassandra_cdc.sstable.stream import StreamInput
from cassandra_cdc.sstable.compression import READ_BLOCK, CompressedChunks, checksum_blocks, compress_data
from conftest import SSTABLES
from strategies import FEW_COLUMNS, partition_keys, partition_updates, tables

VERSIONS = ["ma", "mb", "mc", "md", "me", "na", "nb", "nc", "oa", "da"]
BASE_TABLES = ["simple", "simple_counter", "clust", "clust_counter"]
LONG = "0123456789" * 120
KEYS = [str(i).encode() for i in range(5)]


def expected_tables(version: str) -> set[str]:
    kinds = list(BASE_TABLES)
    if version in ("ma", "mb", "mc", "md", "me", "na"):
        kinds += [f"{k}_compact" for k in BASE_TABLES]
    if version == "mc":
        kinds.append("inaccurate_min_max")
    return {f"legacy_{version}_{k}" for k in kinds}


def table_dirs() -> list[Path]:
    return sorted(d for v in VERSIONS for d in (SSTABLES / v / "legacy_tables").iterdir())


def legacy_schema(version: str) -> Schema:
    """The tables as LegacySSTableTest creates them."""
    statements = []
    for suffix, options in (("", ""), ("_compact", " WITH COMPACT STORAGE")):
        prefix = f"CREATE TABLE legacy_tables.legacy_{version}"
        statements += [
            f"{prefix}_simple{suffix} (pk text PRIMARY KEY, val text){options};",
            f"{prefix}_simple_counter{suffix} (pk text PRIMARY KEY, val counter){options};",
            f"{prefix}_clust{suffix} (pk text, ck text, val text, PRIMARY KEY (pk, ck)){options};",
            f"{prefix}_clust_counter{suffix} (pk text, ck text, val counter, PRIMARY KEY (pk, ck)){options};",
        ]
    statements.append(f"CREATE TABLE legacy_tables.legacy_{version}_inaccurate_min_max "
                      "(k int, c1 int, c2 int, c3 int, v int, PRIMARY KEY (k, c1, c2, c3));")
    return parse_schema("\n".join(statements))


def kind_of(directory: Path) -> str:
    return directory.name.split("_", 2)[2]


def read_all(sstable: SSTable, table: TableMetadata | None = None) -> tuple[list[tuple[int, PartitionUpdate]],
                                                                            SSTableReadStats]:
    stats = SSTableReadStats()
    return list(sstable.partitions_with_offsets(table, stats=stats)), stats


def test_every_version_directory_and_table_is_there() -> None:
    for version in VERSIONS:
        found = {d.name for d in (SSTABLES / version / "legacy_tables").iterdir()}
        assert found == expected_tables(version), version


def assert_readme_content(sstable: SSTable, updates: list[PartitionUpdate], kind: str, value_column: str) -> None:
    """The README's content, exactly, for one of the legacy_<v>_<kind> tables."""
    stats = sstable.metadata.stats
    assert stats is not None and sstable.metadata.partitioner.endswith("ByteOrderedPartitioner")
    assert [u.key for u in updates] == KEYS  # byte-ordered partitioner: keys in order

    def check_cell(cells: list) -> None:
        assert len(cells) == 1
        cell = cells[0]
        assert cell.column.name == value_column and cell.path is None
        assert stats.min_timestamp <= cell.timestamp <= stats.max_timestamp  # a write timestamp
        assert not cell.is_tombstone and not cell.is_expiring
        if "counter" in kind:
            assert cell.column.type.is_counter and counter_value(cell.value) == 1
        elif kind.startswith("simple"):
            assert cell.value == b"foo bar baz"
        else:
            assert re.fullmatch(rb"[a-z]{128}", cell.value), cell.value

    for update in updates:
        assert update.partition_deletion is None and not update.markers
        if kind.startswith("simple") and kind.endswith("_compact"):
            # COMPACT STORAGE without clustering columns: the value is a static column, no rows
            assert update.rows == [] and update.static_row is not None
            assert update.static_row.liveness is None and update.static_row.deletion is None
            check_cell(update.static_row.cells)
            continue
        assert update.static_row is None
        rows = update.rows
        if kind.startswith("simple"):
            assert len(rows) == 1 and rows[0].clustering == ()
        else:
            clusterings = [row.clustering[0] for row in rows]
            assert len(rows) == 50 and clusterings == sorted(clusterings)
            assert {c.decode() for c in clusterings} == {str(i) + LONG for i in range(50)}
        for row in rows:
            assert row.deletion is None
            # INSERT writes a row liveness (but not into COMPACT STORAGE tables); counter UPDATEs write none
            if "counter" in kind or kind.endswith("_compact"):
                assert row.liveness is None
            else:
                assert row.liveness is not None and stats.min_timestamp <= row.liveness.timestamp <= stats.max_timestamp
            check_cell(row.cells)


LEGACY = [d for d in table_dirs() if kind_of(d) != "inaccurate_min_max"]


@pytest.mark.parametrize("directory", LEGACY, ids=[d.name for d in LEGACY])
def test_every_table_holds_what_the_readme_describes(directory: Path) -> None:
    """With the schema: names from it, every value, counter and timestamp as written, all checksums checked."""
    version = directory.parent.parent.name
    sstable = SSTable(directory)
    assert sstable.version.name == version and sstable.version.format == ("bti" if version == "da" else "big")
    schema_table = legacy_schema(version).table("legacy_tables", directory.name)
    entries, stats = read_all(sstable, schema_table)
    updates = [u for _, u in entries]
    assert all(u.table is schema_table for u in updates)
    assert_readme_content(sstable, updates, kind_of(directory), "val")
    kind = kind_of(directory)
    expected_rows = 250 if kind.startswith("clust") else 0 if kind.endswith("_compact") else 5
    assert stats.partitions == 5 and stats.rows == expected_rows and stats.range_tombstone_markers == 0
    assert stats.chunk_crcs_checked and stats.digest_checked and stats.file_bytes == sstable.data_path.stat().st_size
    # The primary index (Index.db, or the Partitions.db trie for bti) finds exactly where partitions start.
    assert list(sstable.partition_offsets()) == [offset for offset, _ in entries]
    keys = [k for k, _ in sstable.index_entries()]
    assert all(k is None or k == u.key for k, u in zip(keys, updates))


@pytest.mark.parametrize("directory", LEGACY, ids=[d.name for d in LEGACY])
def test_every_table_reads_with_types_from_statistics_alone(directory: Path) -> None:
    sstable = SSTable(directory)
    table = sstable.table_from_header()
    assert (table.keyspace, table.name) == ("legacy_tables", directory.name)
    assert [c.name for c in table.partition_key] == ["key"] and table.partition_key[0].type.kind == "text"
    compact_static = directory.name.endswith("simple_compact") or directory.name.endswith("simple_counter_compact")
    assert [c.name for c in table.clustering] == (["column1"] if "clust" in directory.name or compact_static else [])
    assert [(c.name, c.kind) for c in table.regular_and_static] == [
        ("val", ColumnKind.STATIC if compact_static else ColumnKind.REGULAR)]
    updates = list(sstable.partitions())
    assert_readme_content(sstable, updates, kind_of(directory), "val")
    # the same rows as with the schema
    with_schema = list(sstable.partitions(legacy_schema(sstable.version.name).table("legacy_tables", directory.name)))
    assert [_plain(u) for u in updates] == [_plain(u) for u in with_schema]


def _plain(update: PartitionUpdate) -> tuple:
    def row(r: Row | None) -> tuple | None:
        if r is None:
            return None
        return (r.clustering, r.liveness, r.deletion, [(c.column.name, c.timestamp, c.value) for c in r.cells])
    return update.key, update.partition_deletion, row(update.static_row), [row(r) for r in update.rows]


def test_inaccurate_min_max_holds_its_row_and_range_deletion() -> None:
    """legacy_mc_inaccurate_min_max: INSERT (100, 4, 4, 4, 4), then DELETE WHERE k=100 AND c1<3."""
    sstable = SSTable(SSTABLES / "mc" / "legacy_tables" / "legacy_mc_inaccurate_min_max")
    table = legacy_schema("mc").table("legacy_tables", "legacy_mc_inaccurate_min_max")
    (update,) = sstable.partitions(table)
    stats = sstable.metadata.stats
    assert update.key == (100).to_bytes(4, "big") and update.partition_deletion is None
    start, end, row = update.unfiltereds
    assert isinstance(start, RangeTombstoneMarker) and isinstance(end, RangeTombstoneMarker)
    assert (start.kind, start.clustering) == (BoundKind.INCL_START_BOUND, ())
    assert (end.kind, end.clustering) == (BoundKind.EXCL_END_BOUND, ((3).to_bytes(4, "big"),))
    assert start.open_deletion == end.close_deletion and start.close_deletion is None and end.open_deletion is None
    deletion = start.open_deletion
    assert deletion.marked_for_delete_at == stats.max_timestamp  # the DELETE came after the INSERT
    assert deletion.local_deletion_time == deletion.marked_for_delete_at // 1_000_000
    assert isinstance(row, Row) and row.clustering == tuple((4).to_bytes(4, "big") for _ in range(3))
    assert row.liveness.timestamp == stats.min_timestamp
    assert [(c.column.name, c.value, c.timestamp) for c in row.cells] == [("v", (4).to_bytes(4, "big"),
                                                                           stats.min_timestamp)]


# --- splitting one SSTable over several tasks -------------------------------------------------------------

@pytest.mark.parametrize("version", ["ma", "nb", "da"])
def test_chunk_ranges_give_every_partition_to_exactly_one_task(version: str) -> None:
    sstable = SSTable(SSTABLES / version / "legacy_tables" / f"legacy_{version}_clust")
    table = legacy_schema(version).table("legacy_tables", f"legacy_{version}_clust")
    whole = [_plain(u) for u in sstable.partitions(table)]
    offsets = list(sstable.partition_offsets())
    for count in (1, 2, 3, 5, 9):
        ranges = sstable.chunk_ranges(count)
        assert 1 <= len(ranges) <= min(count, 5) and ranges[0].start == 0 and ranges[-1].end is None
        assert all(r.start in offsets for r in ranges)
        parts = []
        for data_range in ranges:
            stats = SSTableReadStats()
            parts += [_plain(u) for u in sstable.partitions(table, data_range, stats)]
            assert stats.partitions >= 1
            assert stats.digest_checked == (len(ranges) == 1)  # the whole-file digest only for a whole read
        assert parts == whole
    assert len(sstable.chunk_ranges(target_bytes=sstable.data_length // 2)) == 2


def test_partition_offsets_by_scanning_without_an_index(tmp_path: Path) -> None:
    for version, index in (("nc", "Index.db"), ("da", "Partitions.db")):
        source = SSTable(SSTABLES / version / "legacy_tables" / f"legacy_{version}_clust_counter")
        copy = copy_sstable(source, tmp_path / version / "legacy_tables" / "t", skip={index, "Rows.db"})
        assert not copy.has(index)
        assert list(copy.partition_offsets()) == list(source.partition_offsets())
        assert [k for k, _ in copy.index_entries()] == KEYS


# --- codecs, uncompressed data, damage -----------------------------------------------------------------

def copy_sstable(sstable: SSTable, directory: Path, skip: set[str] = frozenset()) -> SSTable:
    copy_components(sstable, directory, skip)
    return SSTable(directory / sstable.data_path.name)


def copy_components(sstable: SSTable, directory: Path, skip: set[str] = frozenset()) -> Descriptor:
    directory.mkdir(parents=True, exist_ok=True)
    prefix = sstable.descriptor.prefix + "-"
    for path in sstable.descriptor.directory.iterdir():
        if path.name.startswith(prefix) and path.name[len(prefix):] not in skip:
            shutil.copyfile(path, directory / path.name)
    return Descriptor.from_path(directory / sstable.data_path.name)


def uncompressed_data(sstable: SSTable) -> bytes:
    return b"".join(CompressedChunks(sstable.data_path, sstable.compression))


def rewrite(sstable: SSTable, directory: Path, compressor: str | None, chunk_length: int = 4096,
            max_compressed_length: int = (1 << 31) - 1, data: bytes | None = None) -> SSTable:
    """The same SSTable with its Data.db re-encoded: another compressor and chunk length, or uncompressed
    with a CRC.db (Statistics.db and the index stay valid: offsets are in uncompressed data)."""
    data = uncompressed_data(sstable) if data is None else data
    copy = copy_components(sstable, directory, skip={"Data.db", "CompressionInfo.db", "Digest.crc32"})
    if compressor is None:
        file = data
        copy.path("CRC.db").write_bytes(checksum_blocks(data, chunk_length))
    else:
        file, info = compress_data(data, compressor, sstable.version, chunk_length, max_compressed_length)
        copy.path("CompressionInfo.db").write_bytes(info.serialize(sstable.version))
    copy.path("Data.db").write_bytes(file)
    copy.path("Digest.crc32").write_text(str(zlib.crc32(file)))
    return SSTable(copy.path("Data.db"))


@pytest.mark.parametrize("compressor", ["SnappyCompressor", "org.apache.cassandra.io.compress.DeflateCompressor",
                                        "ZstdCompressor", "LZ4Compressor", None])
@pytest.mark.parametrize("version", ["mc", "oa", "da"])
def test_every_codec_and_uncompressed_data_read_the_same(tmp_path: Path, compressor: str | None, version: str) -> None:
    source = SSTable(SSTABLES / version / "legacy_tables" / f"legacy_{version}_clust")
    table = legacy_schema(version).table("legacy_tables", source.descriptor.table)
    expected = [_plain(u) for u in source.partitions(table)]
    copy = rewrite(source, tmp_path / "legacy_tables" / source.descriptor.table, compressor)
    assert (copy.compression is None) == (compressor is None)
    entries, stats = read_all(copy, table)
    assert [_plain(u) for _, u in entries] == expected
    assert stats.chunk_crcs_checked and stats.digest_checked and stats.chunks > 60
    # ranges start inside chunks here (4 KiB chunks, partitions of about 65 KiB)
    parts = [_plain(u) for r in copy.chunk_ranges(4) for u in copy.partitions(table, r)]
    assert parts == expected


def test_chunks_stored_uncompressed_when_compression_does_not_pay(tmp_path: Path) -> None:
    """4.0+: a chunk whose compressed form reaches maxCompressedLength is stored as is."""
    source = SSTable(SSTABLES / "nb" / "legacy_tables" / "legacy_nb_clust")
    copy = rewrite(source, tmp_path / "legacy_tables" / "t", "LZ4Compressor", chunk_length=4096,
                   max_compressed_length=224)
    info = copy.compression
    assert info.max_compressed_length == 224
    raw = [i for i in range(info.chunk_count - 1) if info.chunk_offsets[i + 1] - info.chunk_offsets[i] - 4 == 4096]
    assert raw and len(raw) < info.chunk_count - 1  # some chunks raw, others compressed
    assert [_plain(u) for u in copy.partitions()] == [_plain(u) for u in source.partitions()]


# --- buffer boundaries: what is read does not depend on where chunks and read blocks end ------------------

CODECS = ["LZ4Compressor", "SnappyCompressor", "DeflateCompressor", "ZstdCompressor"]
# Small SSTables (every one of their fields can straddle a boundary): each partition header form (ma-nc,
# oa/da), counters, compact storage, range tombstone markers.
SMALL = ["mc/legacy_mc_simple", "mc/legacy_mc_simple_counter_compact", "mc/legacy_mc_inaccurate_min_max",
         "na/legacy_na_simple_counter", "oa/legacy_oa_simple", "da/legacy_da_simple_counter"]


def contents(sstable: SSTable, table: TableMetadata | None = None) -> list[tuple]:
    """Everything read: offsets, keys, partition deletions, static rows, rows and markers."""
    return [(offset, u.key, u.partition_deletion, u.static_row, u.unfiltereds)
            for offset, u in sstable.partitions_with_offsets(table)]


def legacy(name: str) -> SSTable:
    version, table = name.split("/")
    return SSTable(SSTABLES / version / "legacy_tables" / table)


@pytest.mark.parametrize("compressor", [None, *CODECS])
@pytest.mark.parametrize("name", SMALL)
def test_small_sstables_read_the_same_through_chunks_of_every_size(tmp_path: Path, name: str,
                                                                  compressor: str | None) -> None:
    """Every chunk length (compressed) or read block size (uncompressed, CRC.db's block) from 1 byte to the
    whole file: the same partitions as read in one buffer."""
    source = legacy(name)
    data = uncompressed_data(source)
    directory = tmp_path / "legacy_tables" / source.descriptor.table
    expected = contents(rewrite(source, directory, compressor, len(data), data=data))
    assert expected and len(expected) == len(contents(source))
    for size in range(1, len(data)):
        assert contents(rewrite(source, directory, compressor, size, data=data)) == expected, f"chunks of {size}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["mc/legacy_mc_clust_counter", "oa/legacy_oa_clust"]),
       compressor=st.sampled_from([None, *CODECS]), size=st.integers(1, 9000))
def test_sstables_read_the_same_through_chunks_of_any_size(tmp_path: Path, name: str, compressor: str | None,
                                                           size: int) -> None:
    source = legacy(name)
    data = uncompressed_data(source)
    directory = tmp_path / (compressor or "uncompressed") / "legacy_tables" / source.descriptor.table
    expected = contents(rewrite(source, directory, compressor, len(data), data=data))
    assert contents(rewrite(source, directory, compressor, size, data=data)) == expected


def test_a_table_larger_than_one_read_block_reads_every_partition(tmp_path: Path) -> None:
    """An uncompressed mc SSTable of 65,536 one-row partitions: partition headers straddle the 64 KiB read
    blocks, and each reads as written (no partition deletions, every row)."""
    source = legacy("mc/legacy_mc_simple")
    data = uncompressed_data(source)
    first, second = list(source.partition_offsets())[:2]
    key_length = int.from_bytes(data[first:first + 2], "big")
    after_key = data[first + 2 + key_length:second]  # partition deletion, row, end of partition
    keys = [str(i).encode() for i in range(65536)]
    many = b"".join(len(key).to_bytes(2, "big") + key + after_key for key in keys)
    copy = rewrite(source, tmp_path / "legacy_tables" / "legacy_mc_simple", None, READ_BLOCK, data=many)
    updates = list(copy.partitions())
    assert [u.key for u in updates] == keys
    assert not [u.key for u in updates if u.partition_deletion is not None or u.markers]
    assert {tuple(c.value for c in row.cells) for u in updates for row in u.rows} == {(b"foo bar baz",)}
    assert sum(len(u.rows) for u in updates) == len(keys)


def test_a_damaged_chunk_is_a_checksum_error_naming_file_chunk_and_offset(tmp_path: Path) -> None:
    source = SSTable(SSTABLES / "nb" / "legacy_tables" / "legacy_nb_clust")
    copy = copy_sstable(source, tmp_path / "legacy_tables" / "legacy_nb_clust")
    info = copy.compression
    chunk = 7
    start = info.chunk_offsets[chunk]
    data = bytearray(copy.data_path.read_bytes())
    data[start + 10] ^= 0x40
    copy.data_path.write_bytes(bytes(data))
    stats = SSTableReadStats()
    seen = []
    with pytest.raises(ChecksumError) as caught:
        for update in copy.partitions(stats=stats):
            seen.append(update.key)
    error = caught.value
    assert (error.path, error.offset, error.chunk) == (str(copy.data_path), start, chunk)
    assert f"checksum mismatch in chunk {chunk}" in str(error) and str(copy.data_path) in str(error)
    assert f"at offset {start}" in str(error)
    # chunk 7 (of 16 KiB) lies in the second partition: the first was read before the damage
    assert seen == [b"0"] and stats.partitions == 1
    # a task whose range lies after the damage still reads its partitions
    later = [r for r in copy.chunk_ranges(5) if r.start > (chunk + 1) * info.chunk_length]
    assert [u.key for r in later for u in copy.partitions(data_range=r)] == KEYS[2:]


def test_whole_file_digest_and_metadata_checksums_are_checked(tmp_path: Path) -> None:
    source = SSTable(SSTABLES / "oa" / "legacy_tables" / "legacy_oa_simple")
    copy = copy_sstable(source, tmp_path / "legacy_tables" / "legacy_oa_simple")
    digest = int(copy.component("Digest.crc32").read_text())
    copy.component("Digest.crc32").write_text(str(digest ^ 1))
    with pytest.raises(ChecksumError, match="whole file") as caught:
        list(copy.partitions())
    assert caught.value.path == str(copy.data_path) and caught.value.chunk is None
    statistics = bytearray(copy.component("Statistics.db").read_bytes())
    statistics[-10] ^= 0x01  # inside the last component (the serialization header)
    copy.component("Statistics.db").write_bytes(bytes(statistics))
    with pytest.raises(ChecksumError, match="checksum mismatch in metadata component HEADER") as caught:
        SSTable(copy.data_path).read_header()
    assert caught.value.path == str(copy.component("Statistics.db"))


def test_undecodable_rows_name_the_partition_and_offset(tmp_path: Path) -> None:
    """A row whose recorded size disagrees with its content (checksums intact): a decode error naming the
    Data.db file and the partition's offset."""
    source = SSTable(SSTABLES / "md" / "legacy_tables" / "legacy_md_clust")
    data = bytearray(uncompressed_data(source))
    # partition 0: key "0" (2 + 1 bytes), partition deletion (12), row flags (1), clustering header (1),
    # the clustering value's length (2-byte vint) and its 1201 bytes: then the row size
    at = 3 + 12 + 1 + 1 + 2 + 1201
    assert data[at - 1203:at - 1201] == b"\x84\xb1" and data[at - 1201:at] == ("0" + LONG).encode()
    data[at] -= 1  # a one-byte vint
    copy = rewrite(source, tmp_path / "legacy_tables" / "legacy_md_clust", "LZ4Compressor", data=bytes(data))
    with pytest.raises(SSTableError) as caught:
        list(copy.partitions())
    assert not isinstance(caught.value, ChecksumError)
    assert (caught.value.path, caught.value.offset) == (str(copy.data_path), 0)
    assert "cannot decode the partition starting at offset 0" in str(caught.value)
    assert "its recorded size ends it at" in str(caught.value)


# --- writing Data.db and Statistics.db; the order of the header's columns ----------------------------------

@pytest.mark.parametrize("name", ["mc/legacy_mc_clust", "mc/legacy_mc_inaccurate_min_max",
                                  "mc/legacy_mc_simple_compact", "na/legacy_na_simple_counter_compact",
                                  "nb/legacy_nb_clust_counter", "oa/legacy_oa_clust_counter",
                                  "da/legacy_da_clust"])
def test_partitions_serialize_to_the_bytes_cassandra_wrote(name: str) -> None:
    source = legacy(name)
    data = source.data_header()
    out = DataOutput()
    for update in source.partitions():
        SSTablePartitionSerializer.serialize(update, out, data)
    assert bytes(out) == uncompressed_data(source)


def read_partitions(chunks: list[bytes], data: DataHeader) -> list[tuple]:
    inp = StreamInput(chunks)
    partitions = []
    while not inp.at_end():
        update = SSTablePartitionSerializer.deserialize(inp, data)
        partitions.append((update.key, update.partition_deletion, update.static_row, update.unfiltereds))
    return partitions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=tables(regular_counts=FEW_COLUMNS), version_name=st.sampled_from(["nb", "oa"]), data=st.data())
def test_written_partitions_read_back_through_chunks_of_every_size(table: TableMetadata, version_name: str,
                                                                  data: st.DataObject) -> None:
    """Random partitions (deletions, static rows, rows with every kind of cell, range tombstone markers)
    written as Data.db: read back whole, and through chunks of 1 to 48 bytes and of uneven sizes, they are
    what was written."""
    version = Version(version_name, "big")
    commitlog_version = version.header_version
    keys = data.draw(st.lists(partition_keys(table), min_size=1, max_size=4), "keys")
    written = [data.draw(partition_updates(table, key, commitlog_version), "update") for key in keys]
    if version.has_uint_deletion_time:  # 5.0 formats cannot hold a partition deletion at a negative timestamp
        assume(all(u.partition_deletion is None or u.partition_deletion.marked_for_delete_at >= 0
                   for u in written))
    stats = [update.stats() for update in written]
    header = SerializationHeader(table, commitlog_version,
                                 EncodingStats(min(s.min_timestamp for s in stats),
                                               min(s.min_local_deletion_time for s in stats),
                                               min(s.min_ttl for s in stats)),
                                 tuple(c for c in table.regular_and_static if not c.is_static),
                                 tuple(c for c in table.regular_and_static if c.is_static))
    data_header = DataHeader(table, version, header)
    out = DataOutput()
    for update in written:
        SSTablePartitionSerializer.serialize(update, out, data_header)
    encoded = bytes(out)
    expected = read_partitions([encoded], data_header)
    assert expected == [(u.key, u.partition_deletion, u.static_row, u.unfiltereds) for u in written]
    for size in range(1, 49):
        chunks = [encoded[i:i + size] for i in range(0, len(encoded), size)]
        assert read_partitions(chunks, data_header) == expected, f"chunks of {size} bytes"
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(encoded) - 1), max_size=40), "cuts")))
    uneven = [encoded[start:stop] for start, stop in zip([0, *cuts], [*cuts, len(encoded)])]
    assert read_partitions(uneven, data_header) == expected


MARSHAL = "org.apache.cassandra.db.marshal."
INT, TEXT = MARSHAL + "Int32Type", MARSHAL + "UTF8Type"


def test_rows_decode_in_cassandras_column_order_whatever_order_statistics_lists_them(tmp_path: Path) -> None:
    """Cassandra encodes rows in the order of its ``Columns`` (simple columns before complex ones, then by
    name), which need not be the order Statistics.db lists them in."""
    table = parse_schema("CREATE TABLE ks.mixed (pk int, ck int, s_tags set<text> static, "
                         "s_note text static, tags list<int>, b int, a text, PRIMARY KEY (pk, ck));"
                         ).table("ks", "mixed")
    assert [c.name for c in table.regular_and_static] == ["a", "b", "tags", "s_note", "s_tags"]
    column = {c.name: c for c in table.regular_and_static}
    version = Version("mc", "big")
    timestamp = 1_700_000_000_000_000

    def cell(name: str, value: bytes, path: bytes | None = None) -> Cell:
        return Cell(column[name], timestamp, value, path=path)

    update = PartitionUpdate(table, (1).to_bytes(4, "big"))
    static_tags = ComplexColumn(column["s_tags"], [cell("s_tags", b"", b"x")])
    update.static_row = Row((), [cell("s_note", b"note"), static_tags], LivenessInfo(timestamp),
                            is_static=True)
    tags = ComplexColumn(column["tags"], [cell("tags", (5).to_bytes(4, "big"), uuid.uuid1().bytes)])
    update.unfiltereds.append(Row(((2).to_bytes(4, "big"),),
                                  [cell("a", b"alpha"), cell("b", (7).to_bytes(4, "big")), tags],
                                  LivenessInfo(timestamp)))
    canonical = SerializationHeader(table, version.header_version, update.stats(),
                                    tuple(c for c in table.regular_and_static if not c.is_static),
                                    tuple(c for c in table.regular_and_static if c.is_static))
    out = DataOutput()
    SSTablePartitionSerializer.serialize(update, out, DataHeader(table, version, canonical))
    # Statistics.db lists complex columns first and the simple ones out of name order
    stored = HeaderComponent(canonical.stats, INT, (INT,),
                             {b"s_tags": f"{MARSHAL}SetType({TEXT})", b"s_note": TEXT},
                             {b"tags": f"{MARSHAL}ListType({INT})", b"b": INT, b"a": TEXT})
    directory = tmp_path / "ks" / f"mixed-{table.id.hex}"
    directory.mkdir(parents=True)
    (directory / "mc-1-big-Data.db").write_bytes(bytes(out))
    (directory / "mc-1-big-Statistics.db").write_bytes(serialize_metadata(stored, version))
    sstable = SSTable(directory)
    for schema_table in (table, None):
        (read,) = sstable.partitions(schema_table)
        assert [(c.column.name, c.value) for c in read.static_row.cells[:1]] == [("s_note", b"note")]
        assert [(c.column.name, c.path) for c in read.static_row.cells[1].cells] == [("s_tags", b"x")]
        (row,) = read.rows
        assert [c.column.name for c in row.cells] == ["a", "b", "tags"]
        assert [c.value for c in row.cells[:2]] == [b"alpha", (7).to_bytes(4, "big")]
        assert [c.value for c in row.cells[2].cells] == [(5).to_bytes(4, "big")]


# --- schema changes, descriptors, types -------------------------------------------------------------

def test_stored_types_decode_after_schema_changes() -> None:
    """A schema changed since the SSTable was written: a column added, the value column dropped (and
    re-added with another type). Values decode with the types Statistics.db records."""
    version = "nb"
    schema = parse_schema(f"""
        CREATE TABLE legacy_tables.legacy_{version}_clust (pk text, ck text, val text, extra int, PRIMARY KEY (pk, ck));
        ALTER TABLE legacy_tables.legacy_{version}_clust DROP val USING TIMESTAMP 1;
        ALTER TABLE legacy_tables.legacy_{version}_clust ADD val blob;
    """)
    table = schema.table("legacy_tables", f"legacy_{version}_clust")
    assert table.column(b"val").type.kind == "blob"
    sstable = SSTable(SSTABLES / version / "legacy_tables" / f"legacy_{version}_clust")
    updates = list(sstable.partitions(table))
    assert_readme_content(sstable, updates, "clust", "val")
    cell = updates[0].rows[0].cells[0]
    assert cell.column.type.kind == "text"  # the stored type, not the schema's blob
    assert updates[0].regular_columns == (cell.column,)


def test_a_table_that_does_not_match_the_sstable_is_refused() -> None:
    sstable = SSTable(SSTABLES / "nb" / "legacy_tables" / "legacy_nb_clust")
    other = legacy_schema("nb").table("legacy_tables", "legacy_nb_simple")
    with pytest.raises(SSTableError, match="records 1 clustering columns, legacy_tables.legacy_nb_simple has 0"):
        list(sstable.partitions(other))


def test_descriptors_and_directories(tmp_path: Path) -> None:
    table_dir = tmp_path / "data" / "shop" / "orders-0123456789abcdef0123456789abcdef"
    uuid_name = "oa-3gfz_0x8h_1vhm82g1h8nfkpc7nl-big-Data.db"
    for directory in (table_dir, table_dir / "snapshots" / "before-upgrade", table_dir / "backups"):
        descriptor = Descriptor.from_path(directory / uuid_name)
        assert (descriptor.keyspace, descriptor.table, str(descriptor.table_id)) == (
            "shop", "orders", "01234567-89ab-cdef-0123-456789abcdef")
        assert descriptor.generation == "3gfz_0x8h_1vhm82g1h8nfkpc7nl" and descriptor.version.name == "oa"
        assert descriptor.path("Statistics.db") == directory / "oa-3gfz_0x8h_1vhm82g1h8nfkpc7nl-big-Statistics.db"
    with pytest.raises(UnsupportedSSTableError, match="before 3.0"):
        Descriptor.from_path(tmp_path / "ks-t-ka-1-Data.db")
    with pytest.raises(UnsupportedSSTableError, match="'ob' of format 'big' is not supported"):
        Descriptor.from_path(tmp_path / "ob-1-big-Data.db")
    with pytest.raises(SSTableError, match="no such Data.db"):
        SSTable(tmp_path / "nb-1-big-Data.db")
    # a directory of several SSTables
    source = SSTable(SSTABLES / "nb" / "legacy_tables" / "legacy_nb_simple")
    directory = tmp_path / "ks" / "legacy_nb_simple"
    copy_sstable(source, directory)
    for path in directory.iterdir():
        shutil.copyfile(path, directory / path.name.replace("nb-1-", "nb-12-"))
    assert [s.descriptor.generation for s in find_sstables(directory)] == ["1", "12"]
    with pytest.raises(SSTableError, match="one SSTable was expected"):
        SSTable(directory)


@pytest.mark.parametrize("class_name, cql, multi_cell", [
    ("org.apache.cassandra.db.marshal.UTF8Type", "text", False),
    ("org.apache.cassandra.db.marshal.ReversedType(org.apache.cassandra.db.marshal.TimestampType)", "timestamp", False),
    ("org.apache.cassandra.db.marshal.ListType(org.apache.cassandra.db.marshal.Int32Type)", "list<int>", True),
    ("org.apache.cassandra.db.marshal.FrozenType(org.apache.cassandra.db.marshal.MapType("
     "org.apache.cassandra.db.marshal.UTF8Type,org.apache.cassandra.db.marshal.SetType("
     "org.apache.cassandra.db.marshal.UUIDType)))", "frozen<map<text, frozen<set<uuid>>>>", False),
    ("org.apache.cassandra.db.marshal.TupleType(org.apache.cassandra.db.marshal.LongType,"
     "org.apache.cassandra.db.marshal.BytesType)", "tuple<bigint, blob>", False),
    ("org.apache.cassandra.db.marshal.UserType(shop,61646472657373,"
     "737472656574:org.apache.cassandra.db.marshal.UTF8Type,7a6970:org.apache.cassandra.db.marshal.Int32Type)",
     "address", True),
    ("org.apache.cassandra.db.marshal.VectorType(org.apache.cassandra.db.marshal.FloatType,3)", "vector<float, 3>",
     False),
    ("CounterColumnType", "counter", False),
])
def test_types_from_class_names(class_name: str, cql: str, multi_cell: bool) -> None:
    parsed = type_from_class_name(class_name)
    assert (parsed.cql, parsed.multi_cell) == (cql, multi_cell)
    assert is_reversed_class_name(class_name) == class_name.startswith("org.apache.cassandra.db.marshal.Reversed")
    if parsed.kind == "udt":
        assert parsed.field_names == ("street", "zip") and parsed.udt_keyspace == "shop"


def test_composite_partition_keys_and_unknown_types() -> None:
    types = types_from_composite_class_name("org.apache.cassandra.db.marshal.CompositeType("
                                            "org.apache.cassandra.db.marshal.Int32Type,"
                                            "org.apache.cassandra.db.marshal.UTF8Type)")
    assert [t.cql for t in types] == ["int", "text"]
    with pytest.raises(CqlTypeError, match="unsupported type class"):
        type_from_class_name("org.apache.cassandra.db.marshal.DynamicCompositeType(s=>UTF8Type)")


# --- cassandra-cdc dump ------------------------------------------------------------------------------

def test_dump_prints_sstable_rows_like_commit_log_changes(tmp_path: Path) -> None:
    directory = SSTABLES / "me" / "legacy_tables" / "legacy_me_clust_counter"
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text("CREATE TABLE legacy_tables.legacy_me_clust_counter "
                           "(pk text, ck text, val counter, PRIMARY KEY (pk, ck));\n")
    data_file = str(directory / "me-1-big-Data.db")
    runner = CliRunner()
    result = runner.invoke(app, ["dump", "--schema", str(schema_file), data_file])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 250
    first = lines[0]
    assert first["keyspace"] == "legacy_tables" and first["table"] == "legacy_me_clust_counter"
    assert first["key"] == {"pk": "0"} and first["type"] == "row" and first["clustering"] == {"ck": "0" + LONG}
    assert first["sstable"] == data_file and first["position"] == 0
    assert [{k: v for k, v in c.items() if k != "timestamp"} for c in first["cells"]] == [{"column": "val", "value": 1}]
    assert {line["position"] for line in lines} == set(SSTable(directory).partition_offsets())
    assert "5 partitions, 250 rows" in result.stderr and "Digest.crc32 verified" in result.stderr

    # without a schema: names from Statistics.db; a directory stands for the SSTable in it
    result = runner.invoke(app, ["dump", str(directory)])
    assert result.exit_code == 0, result.output
    without = [json.loads(line) for line in result.stdout.splitlines()]
    assert without[0]["key"] == {"key": "0"} and without[0]["clustering"] == {"column1": "0" + LONG}
    assert [line["cells"] for line in without] == [line["cells"] for line in lines]


def test_dump_reports_a_damaged_sstable_and_exits_1(tmp_path: Path) -> None:
    source = SSTable(SSTABLES / "oa" / "legacy_tables" / "legacy_oa_clust")
    copy = copy_sstable(source, tmp_path / "legacy_tables" / "legacy_oa_clust")
    data = bytearray(copy.data_path.read_bytes())
    data[copy.compression.chunk_offsets[0] + 5] ^= 0xFF
    copy.data_path.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["dump", str(copy.data_path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"{copy.data_path} at offset 0: checksum mismatch in chunk 0" in result.stderr
    # a component other than Data.db stands for its SSTable; a directory without inputs is refused
    result = CliRunner().invoke(app, ["dump", str(copy.component("Statistics.db")), str(copy.data_path)])
    assert result.exit_code == 1 and result.stderr.count("checksum mismatch in chunk 0") == 1
    result = CliRunner().invoke(app, ["dump", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "holds no commit log segment and no SSTable" in result.stderr
    result = CliRunner().invoke(app, ["dump", str(SSTABLES / "oa" / "legacy_tables" / "legacy_oa_simple"),
                                      str(tmp_path / "CommitLog-7-1.log")], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "does not exist" in result.stderr
