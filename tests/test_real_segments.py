"""The reader and writer against segments written by real Cassandra nodes (../shared/cassandra-commitlogs)."""

from __future__ import annotations

import shutil
import struct
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cassandra_cdc.commitlog import (CommitLogError, DamageKind, DescriptorError, MutationSerializer,
                                     SegmentReader, SegmentWriter)
from cassandra_cdc.commitlog.replay import ReplayStats, replay
from conftest import (COMMITLOGS, REAL_DIRECTORIES, entry_fields, full_schema, keystore_for, read_hash_txt,
                      read_in_steps, real_segments, upgrade_table_schema)


def upgrade_test_hash(value: int, data: bytes) -> int:
    """CommitLogUpgradeTest's hash: additive, with Java int wrap-around."""
    shift = 0
    for byte in data:
        value = (value + (byte << shift)) & 0xFFFFFFFF
        shift = (shift + 8) & 0x1F
    return value


@pytest.mark.parametrize("directory", REAL_DIRECTORIES)
def test_hash_oracle(directory: str) -> None:
    """cells and hash of hash.txt, computed as Cassandra's CommitLogUpgradeTest does."""
    expected = read_hash_txt(directory)
    schema = upgrade_table_schema(directory)
    table = next(iter(schema))
    assert table.id == uuid.UUID(expected["cfid"].strip())
    cells, value = 0, 0
    stats = ReplayStats()
    for path in real_segments(directory):
        with SegmentReader(path, keystore_for(directory)) as segment:
            for _, mutation in replay(segment, schema, stats):
                for update in mutation.updates:
                    for row in update.rows:
                        if row.clustering and (row.clustering[0] or b"").startswith(b"name"):
                            for cell in row.cells:
                                cells += 1
                                value = upgrade_test_hash(value, cell.value)
            assert segment.damage == [] and segment.finished
    signed = value - (1 << 32) if value & 0x80000000 else value
    assert (cells, signed) == (int(expected["cells"]), int(expected["hash"]))
    assert stats.undecodable == 0
    assert sum(stats.skipped_unknown_tables.values()) > 0  # the system-table mutations, skipped and counted


ENTRY_COUNTS = {"3.0.13-encrypted": 1480, "3.0.29-encrypted": 176, "3.4-encrypted": 14562,
                "3.4-encrypted-2016": 8778, "4.0.11-encrypted": 358}


@pytest.mark.parametrize("directory", REAL_DIRECTORIES)
def test_every_entry_decodes_and_reencodes_to_the_same_bytes(directory: str) -> None:
    """With the system schemas of that version, every entry decodes with all bytes consumed, and the
    writer's serializers give back exactly the bytes Cassandra wrote."""
    schema = full_schema(directory)
    stats = ReplayStats()
    kinds = set()
    for path in real_segments(directory):
        with SegmentReader(path, keystore_for(directory)) as segment:
            for entry, mutation in replay(segment, schema, stats):
                assert MutationSerializer.serialize(mutation, segment.version) == entry.body, entry.position
                kinds.update(u.table.qualified_name for u in mutation.updates)
            assert segment.damage == []
    assert stats.entries == stats.mutations == ENTRY_COUNTS[directory]
    assert not stats.skipped_unknown_tables and stats.undecodable == 0
    assert "Keyspace1.Standard1" in kinds and any(k.startswith("system_schema.") for k in kinds)


INTACT_DIRECTORIES = [*REAL_DIRECTORIES, "2.2", "2.2-lz4", "2.2-snappy"]


def whole_read(directory: str) -> list[tuple[Path, list[tuple], list[int]]]:
    """Every segment of a directory: its entries read in one go, and the logical ends of its sections."""
    keystore = keystore_for(directory) if directory in REAL_DIRECTORIES else None
    segments = []
    for path in real_segments(directory):
        with SegmentReader(path, keystore) as reader:
            ends = [section.logical_end for section in reader.sections()]
        with SegmentReader(path, keystore) as reader:
            segments.append((path, entry_fields(list(reader.entries())), ends))
    return segments


@pytest.mark.parametrize("directory", INTACT_DIRECTORIES)
def test_real_segments_read_in_steps_give_what_one_read_gives(directory: str) -> None:
    """Reads stopping just before, at and just after the end of every sync section (plain, LZ4, Snappy,
    encrypted), each resuming after the one before: the entries of one read."""
    keystore = keystore_for(directory) if directory in REAL_DIRECTORIES else None
    segments = whole_read(directory)
    assert any(expected for _, expected, _ in segments)
    for path, expected, ends in segments:
        limits = sorted({limit for end in ends for limit in (end - 1, end, end + 1)})
        assert entry_fields(read_in_steps(path, keystore, limits)) == expected


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(directory=st.sampled_from(INTACT_DIRECTORIES), data=st.data())
def test_real_segments_read_in_steps_anywhere_give_what_one_read_gives(directory: str,
                                                                        data: st.DataObject) -> None:
    keystore = keystore_for(directory) if directory in REAL_DIRECTORIES else None
    for path, expected, ends in whole_read(directory):
        limits = data.draw(st.lists(st.integers(0, ends[-1] if ends else 0), max_size=30), "limits")
        assert entry_fields(read_in_steps(path, keystore, sorted(limits))) == expected


def test_system_mutations_carry_what_the_format_doc_describes() -> None:
    """3.0.13 system tables exercise composite keys, partition deletions, expiring cells, complex deletions."""
    schema = full_schema("3.0.13-encrypted")
    seen = {"composite_key": False, "partition_deletion": False, "expiring": False, "complex_deletion": False,
            "multi_table": False}
    for path in real_segments("3.0.13-encrypted"):
        with SegmentReader(path) as segment:
            for _, mutation in replay(segment, schema):
                seen["multi_table"] |= len(mutation.updates) >= 3
                for update in mutation.updates:
                    if update.table.qualified_name == "system.sstable_activity":
                        assert len(update.table.split_partition_key(update.key)) == 3
                        seen["composite_key"] = True
                    seen["partition_deletion"] |= update.partition_deletion is not None
                    for row in update.rows:
                        for data in row.cells:
                            seen["complex_deletion"] |= getattr(data, "deletion", None) is not None
                            seen["expiring"] |= getattr(data, "is_expiring", False)
    assert all(seen.values()), seen


@pytest.mark.parametrize("directory", ["3.0.13-encrypted", "3.0.29-encrypted", "4.0.11-encrypted"])
def test_writer_reproduces_plain_segments_byte_for_byte(directory: str, tmp_path: Path) -> None:
    """Re-writing each entry with the same sync points gives back the exact file Cassandra wrote."""
    for path in real_segments(directory):
        with SegmentReader(path) as original:
            sections = [(s.logical_start, s.logical_end) for s in original.sections()]
        with SegmentReader(path) as original:
            entries = list(original.entries())
        writer = SegmentWriter(tmp_path, original.segment_id, original.version, segment_size=path.stat().st_size)
        for index, (start, end) in enumerate(sections):
            for entry in entries:
                if start <= entry.start < end:
                    assert writer.add(entry.body) == entry.position
            if index < len(sections) - 1:
                writer.sync()
        writer.close()
        assert writer.path.read_bytes() == path.read_bytes()


def test_writer_reproduces_encrypted_segment_structure(tmp_path: Path) -> None:
    """The 3.4 encrypted segment: same header, same sections, same plain bytes in every section.

    (The ciphertext itself differs because 2016's lz4-java produced other, equally valid LZ4 blocks.)
    """
    directory = "3.4-encrypted"
    keystore = keystore_for(directory)
    path = real_segments(directory)[0]
    with SegmentReader(path, keystore) as original:
        descriptor = original.descriptor
        sections = [(s.logical_start, s.logical_end, bytes(s.data)) for s in original.sections()]
    alias = descriptor.params["encKeyAlias"]
    writer = SegmentWriter(tmp_path, descriptor.segment_id, descriptor.version, segment_size=1 << 30,
                           encryption=(alias, keystore.key(alias)), iv=bytes.fromhex(descriptor.params["encIV"]))
    with SegmentReader(path, keystore) as original:
        entries = list(original.entries())
    for index, (start, end, _) in enumerate(sections):
        for entry in entries:
            if start <= entry.start < end:
                writer.add(entry.body)
        if index < len(sections) - 1:
            writer.sync()
    writer.close()
    assert writer.path.read_bytes()[:descriptor.header_size] == path.read_bytes()[:descriptor.header_size]
    with SegmentReader(writer.path, keystore) as rewritten:
        assert [(s.logical_start, s.logical_end, bytes(s.data)) for s in rewritten.sections()] == sections


# The 2.2 fixtures (commit log version 5): framing and damage as the directory's README describes.
DAMAGED = {
    "2.2-lz4-truncated": (DamageKind.SYNC_MARKER_PAST_END, 463, 6119, 6119),
    "2.2-lz4-bitrot": (DamageKind.ENTRY_CRC_MISMATCH, 70, 318, 6133),
    "2.2-lz4-bitrot2": (DamageKind.UNREADABLE_SECTION, 59, 144, 6119),
}


@pytest.mark.parametrize("directory", DAMAGED)
def test_damage_is_reported_precisely_and_intact_entries_delivered(directory: str) -> None:
    kind, section, before, total = DAMAGED[directory]
    path = real_segments(directory)[0]
    delivered_before_damage = None
    with SegmentReader(path) as segment:
        entries = 0
        for _ in segment.entries():
            if segment.damage and delivered_before_damage is None:
                delivered_before_damage = entries
            entries += 1
        assert [(d.kind, d.section) for d in segment.damage] == [(kind, section)]
        damage = segment.damage[0]
    assert (delivered_before_damage if delivered_before_damage is not None else entries) == before
    assert entries == total
    assert damage.path == str(path) and damage.file_offset > 0
    assert str(path) in str(damage) and f"section {section}" in str(damage)
    if kind is DamageKind.ENTRY_CRC_MISMATCH:
        assert len(damage.raw) == 309  # the damaged entry's bytes are kept for quarantine


@pytest.mark.parametrize("directory,count", [("2.2", 6449), ("2.2-lz4", 6134), ("2.2-snappy", 6133)])
def test_intact_22_segments_frame_completely(directory: str, count: int) -> None:
    entries = 0
    for path in real_segments(directory):
        with SegmentReader(path) as segment:
            entries += sum(1 for _ in segment.entries())
            assert segment.damage == [] and segment.finished
    assert entries == count


def test_pre_30_mutations_are_refused_clearly() -> None:
    with SegmentReader(real_segments("2.2")[0]) as segment:
        with pytest.raises(CommitLogError, match="pre-3.0 mutations"):
            next(replay(segment, full_schema("3.0.13-encrypted")))


def test_old_versions_and_bad_headers_are_rejected(tmp_path: Path) -> None:
    original = real_segments("4.0.11-encrypted")[0]
    v4 = tmp_path / "CommitLog-4-1.log"
    v4.write_bytes(struct.pack(">iqi", 4, 1, 0) + bytes(100))
    with pytest.raises(DescriptorError, match="unsupported commit log version 4"):
        SegmentReader(v4)
    corrupt = tmp_path / original.name
    shutil.copy(original, corrupt)
    with open(corrupt, "r+b") as f:
        f.seek(16)
        f.write(b"\0\0\0\0")
    with pytest.raises(DescriptorError, match="header CRC mismatch") as error:
        SegmentReader(corrupt)
    assert str(corrupt) in str(error.value)


def test_encrypted_segment_without_a_key_names_the_alias() -> None:
    with pytest.raises(CommitLogError, match="testing:1"):
        SegmentReader(real_segments("3.4-encrypted")[0])


def test_positions_are_cassandras_logical_positions() -> None:
    """In a plain segment the position of an entry is the file offset just past its CRC (format doc A.5)."""
    with SegmentReader(COMMITLOGS / "4.0.11-encrypted" / "CommitLog-7-1699285478684.log") as segment:
        entry = next(e for e in segment.entries() if e.start == 1584)
    assert entry.position == 1584 + 12 + 180
    assert entry.body[:17] == bytes.fromhex("01657e52107cbb11ee9858c9aa1eb53e69")
