"""Property tests: what the commit log writer writes, the reader reads back, exactly.

Mutation level: ``MutationSerializer`` round trips for commit log versions 6, 7 and 8. Segment level:
``SegmentWriter`` segments (plain, every compressor, encrypted) read back by ``SegmentReader`` with the
same entries at the same positions, ``_cdc.idx`` files as Cassandra writes them, resumable tailing, and
damage reported where Cassandra's reader would report it.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cassandra_cdc.commitlog import (DamageKind, Entry, KeyStore, Mutation, MutationSerializer, SegmentFull,
                                     SegmentReader, SegmentWriter)
from cassandra_cdc.schema.model import ColumnMetadata, Schema, TableMetadata
from conftest import entry_fields, read_in_steps
from strategies import FEW_COLUMNS, identifiers, mutations, related_tables, schema_of

VERSIONS = (6, 7, 8)
COMPRESSORS = ("LZ4Compressor", "SnappyCompressor", "DeflateCompressor", "ZstdCompressor", "NoopCompressor")
ENCRYPTED = "encrypted"
EVERY_LAYOUT = (None, *COMPRESSORS, ENCRYPTED)  # plain, compressed, encrypted
# Room for the segment header (the longest: encryption params with an escaped key alias) and two markers.
HEADER_ROOM = 512

SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def assert_same(expected: Any, actual: Any, where: str = "mutation") -> None:
    """Field-by-field equality of the commit log's dataclasses; columns compare by name, tables by id."""
    if isinstance(expected, ColumnMetadata):
        assert isinstance(actual, ColumnMetadata) and actual.name == expected.name, \
            f"{where}: column {expected.name!r} read back as {actual!r}"
    elif isinstance(expected, TableMetadata):
        assert isinstance(actual, TableMetadata) and actual.id == expected.id, \
            f"{where}: table {expected.id} read back as {actual!r}"
    elif dataclasses.is_dataclass(expected):
        assert type(actual) is type(expected), f"{where}: {type(expected).__name__} read back as {actual!r}"
        for f in dataclasses.fields(expected):
            assert_same(getattr(expected, f.name), getattr(actual, f.name), f"{where}.{f.name}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), \
            f"{where}: {expected!r} read back as {actual!r}"
        for i, (item, read) in enumerate(zip(expected, actual)):
            assert_same(item, read, f"{where}[{i}]")
    else:
        assert type(actual) is type(expected) and actual == expected, \
            f"{where}: {expected!r} read back as {actual!r}"


# --- mutations ----------------------------------------------------------------------------------------


def check_round_trip(mutation: Mutation, schema: Schema, version: int) -> None:
    """deserialize(serialize(m)) == m, and serialize(deserialize(bytes)) == bytes."""
    body = MutationSerializer.serialize(mutation, version)
    decoded = MutationSerializer.deserialize(body, schema, version)
    assert_same(mutation, decoded)
    assert MutationSerializer.serialize(decoded, version) == body


@pytest.mark.parametrize("version", VERSIONS)
@settings(SETTINGS, max_examples=60)
@given(data=st.data())
def test_mutation_round_trip(version: int, data: st.DataObject) -> None:
    tables = data.draw(related_tables())
    check_round_trip(data.draw(mutations(tables, version)), schema_of(tables), version)


@settings(SETTINGS, max_examples=25)
@given(version=st.sampled_from(VERSIONS), data=st.data())
def test_wide_mutation_round_trip(version: int, data: st.DataObject) -> None:
    """Headers of 64 columns or more encode a row's column subset as indexes, not as a bitmap."""
    tables = data.draw(related_tables(max_tables=1, regular_counts=st.integers(64, 70)))
    check_round_trip(data.draw(mutations(tables, version)), schema_of(tables), version)


# --- segments -----------------------------------------------------------------------------------------


@dataclass
class Workload:
    """Mutations to write, serialized, and how many times to sync after each (a repeated sync has
    nothing new to write)."""

    version: int
    schema: Schema
    mutations: list[Mutation]
    bodies: list[bytes]
    syncs_after: list[int]


@st.composite
def workloads(draw: st.DrawFn, max_mutations: int = 6) -> Workload:
    version = draw(st.sampled_from(VERSIONS))
    tables = draw(related_tables(max_tables=2, regular_counts=FEW_COLUMNS))
    written = draw(st.lists(mutations(tables, version), min_size=1, max_size=max_mutations))
    syncs_after = draw(st.lists(st.sampled_from((0, 0, 1, 2)), min_size=len(written), max_size=len(written)))
    bodies = [MutationSerializer.serialize(m, version) for m in written]
    return Workload(version, schema_of(tables), written, bodies, syncs_after)


@dataclass(frozen=True)
class WriterSetup:
    """How segments are written: ``SegmentWriter`` options, and the keystore that reads them."""

    options: dict[str, Any]
    keystore: KeyStore | None = None


@st.composite
def writer_setups(draw: st.DrawFn, codecs: tuple[str | None, ...]) -> WriterSetup:
    """Plain (None), a compressor class name, or ENCRYPTED with a random AES-128/256 key and IV."""
    codec = draw(st.sampled_from(codecs))
    if codec is None:
        return WriterSetup({})
    if codec != ENCRYPTED:
        return WriterSetup({"compression": codec})
    alias = draw(st.one_of(identifiers(), st.just("testing:1")).filter(lambda a: len(a) <= 10))
    key = draw(st.sampled_from((16, 32)).flatmap(lambda size: st.binary(min_size=size, max_size=size)))
    options = {"encryption": (alias, key), "iv": draw(st.binary(min_size=16, max_size=16)),
               "encryption_chunk_size": draw(st.integers(16, 1024))}
    return WriterSetup(options, KeyStore({alias: key}))


@dataclass
class WrittenSegment:
    """One segment as written: its entries' bodies and the positions ``add()`` returned."""

    writer: SegmentWriter
    positions: list[int] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    closed_at: int | None = None

    @property
    def entries(self) -> list[tuple[int, bytes]]:
        return list(zip(self.positions, self.bodies))


def write_segments(directory: Path, workload: Workload, setup: WriterSetup, segment_size: int,
                   first_id: int, on_sync: Callable[[WrittenSegment], None] | None = None) \
        -> list[WrittenSegment]:
    """Write the workload's bodies, starting a new segment whenever one is full; close them all.

    After every sync the ``_cdc.idx`` file must hold the synced position (plus COMPLETED if the sync
    closed a segment that had no room left for another sync marker); a sync with nothing new to write
    keeps that position.
    """
    segments: list[WrittenSegment] = []

    def next_segment() -> WrittenSegment:
        if segments:
            segments[-1].closed_at = segments[-1].writer.close()
        writer = SegmentWriter(directory, first_id + len(segments), workload.version,
                               segment_size=segment_size, cdc_index_directory=directory, **setup.options)
        segments.append(WrittenSegment(writer))
        return segments[-1]

    current = next_segment()
    for body, syncs in zip(workload.bodies, workload.syncs_after):
        if current.writer.closed:
            current = next_segment()
        try:
            position = current.writer.add(body)
        except SegmentFull:
            current = next_segment()
            position = current.writer.add(body)
        current.positions.append(position)
        current.bodies.append(body)
        synced_before = None
        for _ in range(syncs):
            synced = current.writer.sync()
            assert synced_before is None or synced == synced_before
            completed = "\nCOMPLETED" if current.writer.closed else ""
            assert index_text(current) == f"{synced}{completed}"
            synced_before = synced
            if on_sync is not None:
                on_sync(current)
    current.closed_at = current.writer.close()
    return segments


def index_text(segment: WrittenSegment) -> str:
    assert segment.writer.cdc_index_path is not None
    return segment.writer.cdc_index_path.read_text(encoding="ascii")


def read_entries(segment: WrittenSegment, setup: WriterSetup, **options: int | None) \
        -> tuple[list[Entry], SegmentReader]:
    with SegmentReader(segment.writer.path, setup.keystore, **options) as reader:
        return list(reader.entries()), reader


def pairs(entries: list[Entry]) -> list[tuple[int, bytes]]:
    return [(entry.position, entry.body) for entry in entries]


def roomy_segment_size(workload: Workload) -> int:
    """A segment size that holds the whole workload (entries, every sync marker, the header)."""
    return sum(len(body) + 12 + 8 for body in workload.bodies) + HEADER_ROOM


def segment_sizes(workload: Workload) -> st.SearchStrategy[int]:
    """From room for the largest entry only (a new segment for almost every entry) to room for all."""
    smallest = max(len(body) for body in workload.bodies) + 12 + HEADER_ROOM
    return st.integers(smallest, max(smallest, roomy_segment_size(workload)))


segment_ids = st.integers(1, 1 << 62)


@SETTINGS
@given(workload=workloads(), setup=writer_setups(EVERY_LAYOUT), data=st.data())
def test_segments_round_trip(workload: Workload, setup: WriterSetup, data: st.DataObject) -> None:
    segment_size = data.draw(segment_sizes(workload), "segment size")
    first_id = data.draw(segment_ids, "first segment id")
    with tempfile.TemporaryDirectory() as directory:
        segments = write_segments(Path(directory), workload, setup, segment_size, first_id)
        read_bodies = []
        for number, segment in enumerate(segments):
            entries, reader = read_entries(segment, setup)
            assert pairs(entries) == segment.entries
            assert reader.damage == []
            assert reader.finished
            assert reader.position == segment.closed_at
            assert reader.segment_id == first_id + number
            assert index_text(segment) == f"{segment.closed_at}\nCOMPLETED"
            read_bodies += [entry.body for entry in entries]
    assert read_bodies == workload.bodies
    for mutation, body in zip(workload.mutations, read_bodies):
        assert_same(mutation, MutationSerializer.deserialize(body, workload.schema, workload.version))


@SETTINGS
@given(version=st.sampled_from(VERSIONS), setup=writer_setups(EVERY_LAYOUT), segment_id=segment_ids)
def test_closed_empty_segment(version: int, setup: WriterSetup, segment_id: int) -> None:
    """A segment closed before any entry holds one empty section; its idx is COMPLETED at once."""
    with tempfile.TemporaryDirectory() as directory:
        writer = SegmentWriter(directory, segment_id, version, segment_size=4096,
                               cdc_index_directory=directory, **setup.options)
        segment = WrittenSegment(writer, closed_at=writer.close())
        entries, reader = read_entries(segment, setup)
        assert index_text(segment) == f"{segment.closed_at}\nCOMPLETED"
    assert segment.closed_at == writer.descriptor.header_size + 8
    assert entries == [] and reader.damage == [] and reader.finished


@SETTINGS
@given(workload=workloads(), setup=writer_setups(EVERY_LAYOUT), data=st.data())
def test_tailing_resumes_after_the_indexed_position(workload: Workload, setup: WriterSetup,
                                                    data: st.DataObject) -> None:
    """Read a segment being written up to its ``_cdc.idx`` offset, then, once it is complete, resume
    after the last entry read: every entry is delivered exactly once."""
    chosen = data.draw(st.integers(0, len(workload.bodies) - 1), "sync to tail at")
    workload.syncs_after[chosen] = max(1, workload.syncs_after[chosen])
    tail_at = sum(workload.syncs_after[:chosen])  # how many syncs come before the chosen one
    segment_size = data.draw(segment_sizes(workload), "segment size")
    synced: list[WrittenSegment] = []  # the segment of every sync so far
    early_reads: list[tuple[WrittenSegment, int, list[Entry]]] = []

    def tail(segment: WrittenSegment) -> None:
        if len(synced) == tail_at:
            limit = int(index_text(segment).split("\n")[0])
            entries, reader = read_entries(segment, setup, limit=limit)
            assert reader.damage == [] and not reader.finished
            early_reads.append((segment, limit, entries))
        synced.append(segment)

    with tempfile.TemporaryDirectory() as directory:
        write_segments(Path(directory), workload, setup, segment_size, data.draw(segment_ids), on_sync=tail)
        assert len(early_reads) == 1
        segment, limit, before = early_reads[0]
        assert pairs(before) == [(p, b) for p, b in segment.entries if p <= limit]
        again, _ = read_entries(segment, setup, limit=limit)  # the same limit once the segment is complete
        assert pairs(again) == pairs(before)
        resume_at = before[-1].position if before else 0
        after, reader = read_entries(segment, setup, start=resume_at)
        assert reader.damage == [] and reader.finished
    assert pairs(before) + pairs(after) == segment.entries


@SETTINGS
@given(workload=workloads(), setup=writer_setups(EVERY_LAYOUT), data=st.data())
def test_a_segment_read_in_steps_gives_what_one_read_gives(workload: Workload, setup: WriterSetup,
                                                           data: st.DataObject) -> None:
    """Wherever reads of a segment stop (every logical position, in a marker, a section or an entry, of every
    layout: plain, each compressor, encrypted), the entries are those of one read of the whole segment."""
    with tempfile.TemporaryDirectory() as directory:
        segments = write_segments(Path(directory), workload, setup, roomy_segment_size(workload),
                                  data.draw(segment_ids))
        (segment,) = segments
        path = segment.writer.path
        whole, _ = read_entries(segment, setup)
        assert pairs(whole) == segment.entries
        expected = entry_fields(whole)
        for limit in range(segment.closed_at + 1):
            assert entry_fields(read_in_steps(path, setup.keystore, [limit])) == expected, f"limit {limit}"
        limits = sorted(data.draw(st.lists(st.integers(0, segment.closed_at), max_size=20), "limits"))
        assert entry_fields(read_in_steps(path, setup.keystore, limits)) == expected


@SETTINGS
@given(workload=workloads(), setup=writer_setups(EVERY_LAYOUT), slack=st.integers(0, 15),
       segment_id=segment_ids)
def test_sync_without_room_for_another_marker_closes_the_segment(workload: Workload, setup: WriterSetup,
                                                                 slack: int, segment_id: int) -> None:
    """As Cassandra's, a sync whose next sync marker would not fit closes the segment (idx COMPLETED)."""
    with tempfile.TemporaryDirectory() as directory:
        probe = SegmentWriter(directory, segment_id, workload.version, **setup.options)
        header_size = probe.descriptor.header_size
        probe.close()
        os.remove(probe.path)
        size = header_size + 8 + sum(len(body) + 12 for body in workload.bodies) + slack
        writer = SegmentWriter(directory, segment_id, workload.version, segment_size=size,
                               cdc_index_directory=directory, **setup.options)
        segment = WrittenSegment(writer, [writer.add(body) for body in workload.bodies], workload.bodies)
        synced = writer.sync()
        assert synced == segment.positions[-1]
        assert writer.closed == (slack < 8)
        assert index_text(segment) == f"{synced}" + ("\nCOMPLETED" if slack < 8 else "")
        segment.closed_at = writer.close()
        entries, reader = read_entries(segment, setup)
    assert pairs(entries) == segment.entries
    assert reader.damage == [] and reader.finished and reader.position == segment.closed_at


def write_one_segment(directory: Path, workload: Workload, setup: WriterSetup,
                      segment_id: int) -> WrittenSegment:
    segments = write_segments(directory, workload, setup, roomy_segment_size(workload), segment_id)
    assert len(segments) == 1
    return segments[0]


def section_spans(segment: WrittenSegment, setup: WriterSetup) -> list[tuple[int, int, int, int]]:
    """(file offset, file end, logical start, logical end) of every sync section of an intact segment."""
    with SegmentReader(segment.writer.path, setup.keystore) as reader:
        sections = [(s.file_offset, s.logical_start, s.logical_end) for s in reader.sections()]
    file_ends = [offset for offset, _, _ in sections[1:]] + [os.path.getsize(segment.writer.path)]
    return [(offset, end, start, stop) for (offset, start, stop), end in zip(sections, file_ends)]


@SETTINGS
@given(workload=workloads(), data=st.data())
def test_flipped_byte_in_an_entry_loses_only_that_entry(workload: Workload, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory:
        segment = write_one_segment(Path(directory), workload, WriterSetup({}), data.draw(segment_ids))
        victim = data.draw(st.integers(0, len(segment.bodies) - 1), "damaged entry")
        body, position = segment.bodies[victim], segment.positions[victim]
        entry_start = position - len(body) - 12
        offset = entry_start + 8 + data.draw(st.integers(0, len(body) - 1), "byte in the body")
        with open(segment.writer.path, "r+b") as file:
            file.seek(offset)
            original = file.read(1)[0]
            file.seek(offset)
            file.write(bytes([original ^ data.draw(st.integers(1, 255), "xor mask")]))
        entries, reader = read_entries(segment, WriterSetup({}))
    assert pairs(entries) == segment.entries[:victim] + segment.entries[victim + 1:]
    assert [(d.kind, d.position) for d in reader.damage] == [(DamageKind.ENTRY_CRC_MISMATCH, entry_start)]
    assert reader.finished


@SETTINGS
@given(workload=workloads(), setup=writer_setups((*COMPRESSORS, ENCRYPTED)), data=st.data())
def test_truncated_last_section_keeps_earlier_sections(workload: Workload, setup: WriterSetup,
                                                       data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory:
        segment = write_one_segment(Path(directory), workload, setup, data.draw(segment_ids))
        offset, end, logical_start, _ = section_spans(segment, setup)[-1]
        os.truncate(segment.writer.path, data.draw(st.integers(offset + 8, end - 1), "truncated length"))
        entries, reader = read_entries(segment, setup)
    assert pairs(entries) == [(p, b) for p, b in segment.entries if p < logical_start]
    assert [d.kind for d in reader.damage] == [DamageKind.SYNC_MARKER_PAST_END]
    assert not reader.finished


@SETTINGS
@given(workload=workloads(), data=st.data())
def test_truncated_plain_segment_keeps_every_entry_before_the_cut(workload: Workload, data: st.DataObject) -> None:
    """As Cassandra's replay: a plain section cut short by the end of the file is read up to the cut."""
    plain = WriterSetup({})
    with tempfile.TemporaryDirectory() as directory:
        segment = write_one_segment(Path(directory), workload, plain, data.draw(segment_ids))
        offset, _, start, stop = [span for span in section_spans(segment, plain) if span[3] > span[2]][-1]
        cut = data.draw(st.integers(offset + 8, stop - 1), "truncated length")
        os.truncate(segment.writer.path, cut)
        entries, reader = read_entries(segment, plain)
    assert pairs(entries) == [(p, b) for p, b in segment.entries if p <= cut]
    assert [d.kind for d in reader.damage] == [DamageKind.SYNC_MARKER_PAST_END]
    assert not reader.finished


@SETTINGS
@given(workload=workloads(), setup=writer_setups(tuple(c for c in COMPRESSORS if c != "NoopCompressor")),
       data=st.data())
def test_undecodable_section_loses_only_its_entries(workload: Workload, setup: WriterSetup,
                                                     data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory:
        segment = write_one_segment(Path(directory), workload, setup, data.draw(segment_ids))
        spans = section_spans(segment, setup)
        victim = data.draw(st.integers(0, len(spans) - 1), "damaged section")
        offset, end, logical_start, logical_end = spans[victim]
        compressed_start = offset + 8 + 4  # after the sync marker and the uncompressed length
        with open(segment.writer.path, "r+b") as file:
            file.seek(compressed_start)
            file.write(b"\xff" * (end - compressed_start))  # no codec decodes this
        entries, reader = read_entries(segment, setup)
    assert pairs(entries) == [(p, b) for p, b in segment.entries if not logical_start < p <= logical_end]
    assert [(d.kind, d.section) for d in reader.damage] == [(DamageKind.UNREADABLE_SECTION, victim + 1)]
    assert reader.finished
