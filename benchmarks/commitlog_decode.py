"""Commit log decode throughput, single process (= per core).

Generates one segment of typical mutations (a 9-column table, 100-500 serialized bytes each, fixed seed)
with ``SegmentWriter``, then times, best of N runs each:

* floor: read the file and CRC it whole; a bare inline framing loop (size, size CRC, body CRC);
* framing: ``SegmentReader.entries()``;
* agent path: framing + table id + partition key of every entry (what the CDC agent needs to route);
* full decode: framing + ``MutationSerializer.deserialize`` of every entry;
* full decode + CQL value decoding of every cell (informative).

Targets (from the issue): full decode >= 50,000 mutations/s per core; agent path >= 150 MB/s per core.
MB = 10^6 bytes of segment data (header + markers + framed entries; the logical bytes for a compressed
segment). The file is in the page cache: these are CPU figures, not disk figures. "Per core" is measured
as this process's CPU time (``time.process_time``), best of N, so that other work on a shared machine
does not count; ``--clock wall`` uses the wall clock instead. Both are printed.

    python benchmarks/commitlog_decode.py [--segment-size MiB] [--version 7] [--compression LZ4Compressor]
    python benchmarks/commitlog_decode.py --profile     # also cProfile the framing and full decode paths
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import platform
import pstats
import random
import struct
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cassandra_cdc.commitlog import Mutation, MutationSerializer, SegmentFull, SegmentReader, SegmentWriter
from cassandra_cdc.storage import Cell, ComplexColumn, DeletionTime, LivenessInfo, PartitionUpdate, Row
from cassandra_cdc.commitlog.mutation import split_partition_updates
from cassandra_cdc.storage.vint import read_unsigned_vint
from cassandra_cdc.schema.model import ColumnKind, ColumnMetadata, Schema, TableMetadata
from cassandra_cdc.schema.types import map_type, set_type, simple_type

FULL_DECODE_TARGET = 50_000  # mutations/s per core
AGENT_PATH_TARGET = 150.0  # MB/s per core
MB = 1_000_000
SEGMENT_ID = 1_700_000_000_000
SYNC_EVERY = 1 << 20  # bytes of entries between syncs, as a periodic sync would leave them

# --- the table and its mutations ------------------------------------------------------------------


def users_table() -> TableMetadata:
    """ks.users (id uuid, ts timestamp, bucket int, name text, email text, age int, score double,
    tags set<text>, attrs map<text, text>, PRIMARY KEY ((id), ts))"""
    text = simple_type("text")
    regular = [
        ColumnMetadata("bucket", simple_type("int"), ColumnKind.REGULAR),
        ColumnMetadata("name", text, ColumnKind.REGULAR),
        ColumnMetadata("email", text, ColumnKind.REGULAR),
        ColumnMetadata("age", simple_type("int"), ColumnKind.REGULAR),
        ColumnMetadata("score", simple_type("double"), ColumnKind.REGULAR),
        ColumnMetadata("tags", set_type(text), ColumnKind.REGULAR),
        ColumnMetadata("attrs", map_type(text, text), ColumnKind.REGULAR),
    ]
    # Cassandra's column order (simple before complex, then by name): the header order rows follow.
    regular.sort(key=ColumnMetadata.sort_key)
    return TableMetadata(
        keyspace="ks", name="users", id=uuid.UUID("5bc52802-de25-35ed-aeab-188eecebb090"),
        partition_key=(ColumnMetadata("id", simple_type("uuid"), ColumnKind.PARTITION_KEY, 0),),
        clustering=(ColumnMetadata("ts", simple_type("timestamp"), ColumnKind.CLUSTERING, 0),),
        regular_and_static=tuple(regular), cdc=True)


_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
          "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
          "whiskey", "xray", "yankee", "zulu")


class MutationGenerator:
    """Typical CQL writes on ``ks.users``, with a fixed seed.

    Mix: 60% INSERT of all columns (row liveness, collections overwritten), 15% UPDATE of a few columns
    (no liveness), 10% INSERT ... USING TTL, 6% DELETE of some cells, 3% collection element additions,
    3% row deletions, 2% partition deletions, 1% a partition update with several rows.
    """

    def __init__(self, table: TableMetadata, seed: int) -> None:
        self.table = table
        self.rng = random.Random(seed)
        self.col = {c.name: c for c in table.regular_and_static}
        self.regulars = tuple(c for c in table.regular_and_static if not c.is_static)
        self.now_us = 1_750_000_000_000_000
        self.keys = [uuid.UUID(int=self.rng.getrandbits(128), version=4).bytes for _ in range(5000)]

    # values
    def _text(self, low: int, high: int) -> bytes:
        rng = self.rng
        words = []
        size = rng.randint(low, high)
        while sum(len(w) + 1 for w in words) < size:
            words.append(rng.choice(_WORDS))
        return " ".join(words)[:size].encode()

    def _value(self, column: ColumnMetadata) -> bytes:
        rng = self.rng
        if column.name == "bucket":
            return struct.pack(">i", rng.randrange(64))
        if column.name == "age":
            return struct.pack(">i", rng.randint(18, 90))
        if column.name == "score":
            return struct.pack(">d", rng.random() * 1000)
        if column.name == "name":
            return self._text(6, 24)
        if column.name == "email":
            return self._text(12, 32).replace(b" ", b".") + b"@example.com"
        raise AssertionError(column.name)

    def _elements(self, column: ColumnMetadata, ts: int, ttl: int = 0, ldt: int | None = None) -> list[Cell]:
        rng = self.rng
        if column.name == "tags":
            paths = sorted({self._text(3, 10) for _ in range(rng.randint(1, 4))})
            return [Cell(column, ts, b"", ttl, ldt, path) for path in paths]
        paths = sorted({self._text(3, 12) for _ in range(rng.randint(1, 5))})
        return [Cell(column, ts, self._text(8, 48), ttl, ldt, path) for path in paths]

    def _cells(self, columns: tuple[ColumnMetadata, ...], ts: int, ttl: int = 0, ldt: int | None = None,
               overwrite: bool = True) -> list[Cell | ComplexColumn]:
        cells: list[Cell | ComplexColumn] = []
        for column in columns:
            if column.is_complex:
                # Setting a whole collection deletes what was there (a complex deletion at ts - 1).
                deletion = DeletionTime(ts - 1, self.now_us // 1_000_000) if overwrite else None
                cells.append(ComplexColumn(column, self._elements(column, ts, ttl, ldt), deletion))
            else:
                cells.append(Cell(column, ts, self._value(column), ttl, ldt))
        return cells

    def next(self) -> Mutation:
        rng = self.rng
        self.now_us += rng.randint(1, 2000)
        ts, now_s = self.now_us, self.now_us // 1_000_000
        key = rng.choice(self.keys)
        clustering = (struct.pack(">q", ts // 1000 - rng.randrange(86_400_000)),)
        table, regulars = self.table, self.regulars
        update = PartitionUpdate(table, key, regular_columns=regulars)
        roll = rng.random()
        if roll < 0.60:  # INSERT, all columns
            update.unfiltereds.append(Row(clustering, self._cells(regulars, ts), LivenessInfo(ts)))
        elif roll < 0.75:  # UPDATE a few columns: no row liveness
            columns = tuple(sorted(rng.sample(regulars, rng.randint(2, 5)), key=ColumnMetadata.sort_key))
            update.regular_columns = columns
            update.unfiltereds.append(Row(clustering, self._cells(columns, ts)))
        elif roll < 0.85:  # INSERT ... USING TTL
            ttl = rng.choice((3600, 86400, 604800))
            update.unfiltereds.append(Row(clustering, self._cells(regulars, ts, ttl, now_s + ttl),
                                          LivenessInfo(ts, ttl, now_s + ttl)))
        elif roll < 0.91:  # DELETE name, email, ... FROM ks.users WHERE ...: cell tombstones
            simple = [c for c in regulars if not c.is_complex]
            columns = tuple(sorted(rng.sample(simple, rng.randint(1, 3)), key=ColumnMetadata.sort_key))
            update.regular_columns = columns
            update.unfiltereds.append(Row(clustering, [Cell(c, ts, b"", 0, now_s) for c in columns]))
        elif roll < 0.94:  # UPDATE ... SET tags = tags + {...}, attrs['k'] = 'v': elements, no overwrite
            columns = tuple(c for c in regulars if c.is_complex)
            update.regular_columns = columns
            update.unfiltereds.append(Row(clustering, self._cells(columns, ts, overwrite=False)))
        elif roll < 0.97:  # DELETE FROM ks.users WHERE id = ? AND ts = ?
            update.regular_columns = ()
            update.unfiltereds.append(Row(clustering, [], deletion=DeletionTime(ts, now_s)))
        elif roll < 0.99:  # DELETE FROM ks.users WHERE id = ?
            update.regular_columns = ()
            update.partition_deletion = DeletionTime(ts, now_s)
        else:  # an unlogged batch of a few rows of one partition, each setting different columns
            rows = []
            for offset in sorted(rng.sample(range(1000), rng.randint(2, 3))):
                columns = tuple(sorted(rng.sample(regulars, rng.randint(2, 5)), key=ColumnMetadata.sort_key))
                rows.append(Row((struct.pack(">q", ts // 1000 - offset),), self._cells(columns, ts), LivenessInfo(ts)))
            rows.sort(key=lambda r: r.clustering)
            update.unfiltereds.extend(rows)
        return Mutation([update])


@dataclass
class Segment:
    path: Path
    data_bytes: int  # logical bytes: header, markers and framed entries
    file_bytes: int
    mutations: int
    body_sizes: list[int]


def write_segment(directory: Path, table: TableMetadata, size: int, version: int, compression: str | None,
                  seed: int) -> Segment:
    generator = MutationGenerator(table, seed)
    sizes: list[int] = []
    kwargs = {"compression": compression} if compression else {}
    with SegmentWriter(directory, SEGMENT_ID, version, segment_size=size, **kwargs) as writer:
        unsynced = 0
        while True:
            body = MutationSerializer.serialize(generator.next(), version)
            try:
                writer.add(body)
            except SegmentFull:
                break
            sizes.append(len(body))
            unsynced += len(body) + 12
            if unsynced >= SYNC_EVERY:
                writer.sync()
                unsynced = 0
        data_bytes = writer.close()
    return Segment(writer.path, data_bytes, writer.path.stat().st_size, len(sizes), sizes)


# --- the timed paths -------------------------------------------------------------------------------


def floor_read_crc(path: Path, _schema: Schema) -> int:
    with open(path, "rb") as f:
        zlib.crc32(f.read())
    return 0


def floor_bare_framing(path: Path, _schema: Schema) -> int:
    """Sync markers and entry framing with every CRC checked, inline over the file bytes (plain only)."""
    with open(path, "rb") as f:
        data = f.read()
    unpack_from, crc32 = struct.unpack_from, zlib.crc32
    (header_params,) = struct.unpack_from(">H", data, 12)
    offset = 18 + header_params
    view = memoryview(data)
    count = 0
    while offset <= len(data) - 8:
        next_marker, crc = unpack_from(">iI", data, offset)
        if next_marker == 0 and crc == 0:
            break
        pos, end = offset + 8, next_marker
        while pos < end - 4:
            size, size_crc = unpack_from(">iI", data, pos)
            if size == 0:
                break
            size_field = data[pos:pos + 4]
            if crc32(size_field) != size_crc:
                raise AssertionError("size crc")
            body_end = pos + 8 + size
            if crc32(view[pos + 8:body_end], crc32(size_field)) != unpack_from(">I", data, body_end)[0]:
                raise AssertionError("entry crc")
            count += 1
            pos = body_end + 4
        offset = next_marker
    return count


def framing(path: Path, _schema: Schema) -> int:
    count = 0
    with SegmentReader(path) as reader:
        for _entry in reader.entries():
            count += 1
    return count


def agent_path(path: Path, schema: Schema) -> int:
    """Framing + table id + partition key of every entry: what routing a change needs.

    Inline over ``Entry.body`` for now; the table is looked up by its raw 16 id bytes.
    """
    tables = {table.id.bytes: table for table in schema}
    count = 0
    with SegmentReader(path) as reader:
        for entry in reader.entries():
            body = entry.body
            _updates, pos = read_unsigned_vint(body, 0)
            table = tables.get(body[pos:pos + 16])
            key_length, pos = read_unsigned_vint(body, pos + 16)
            key = body[pos:pos + key_length]
            if table is None or len(key) != key_length:
                raise AssertionError("bad entry")
            count += 1
    return count


def agent_path_split(path: Path, schema: Schema) -> int:
    """The agent path through ``split_partition_updates`` (one slice per update)."""
    count = 0
    with SegmentReader(path) as reader:
        version = reader.version
        for entry in reader.entries():
            for update in split_partition_updates(entry.body, schema, version):
                table = schema.table_by_id(uuid.UUID(bytes=update[:16]))
                key_length, pos = read_unsigned_vint(update, 16)
                if table is None or len(update[pos:pos + key_length]) != key_length:
                    raise AssertionError("bad entry")
            count += 1
    return count


def full_decode(path: Path, schema: Schema) -> int:
    count = 0
    with SegmentReader(path) as reader:
        version = reader.version
        deserialize = MutationSerializer.deserialize
        for entry in reader.entries():
            deserialize(entry.body, schema, version)
            count += 1
    return count


def full_decode_cql(path: Path, schema: Schema) -> int:
    count = 0
    with SegmentReader(path) as reader:
        version = reader.version
        for entry in reader.entries():
            mutation = MutationSerializer.deserialize(entry.body, schema, version)
            for update in mutation.updates:
                update.table.partition_key[0].type.deserialize(update.key)
                for row in update.unfiltereds:
                    for value, column in zip(row.clustering, update.table.clustering):
                        if value:
                            column.type.deserialize(value)
                    for data in row.cells:
                        if isinstance(data, ComplexColumn):
                            column_type = data.column.type
                            for cell in data.cells:
                                column_type.path_type.deserialize(cell.path)
                                if cell.value:
                                    column_type.element_type(cell.path).deserialize(cell.value)
                        elif data.value:
                            data.column.type.deserialize(data.value)
            count += 1
    return count


def best_of(runs: int, function: Callable[[Path, Schema], int], path: Path,
            schema: Schema) -> tuple[float, float, int]:
    """Best wall-clock time and best CPU time of this process over ``runs`` runs, and the entry count."""
    best, best_cpu, count = float("inf"), float("inf"), 0
    for _ in range(runs):
        gc.collect()
        started, started_cpu = time.perf_counter(), time.process_time()
        count = function(path, schema)
        best = min(best, time.perf_counter() - started)
        best_cpu = min(best_cpu, time.process_time() - started_cpu)
    return best, best_cpu, count


def profile(function: Callable[[Path, Schema], int], path: Path, schema: Schema, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(function, path, schema)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    return out.getvalue()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segment-size", type=int, default=32, metavar="MiB", help="segment size (default 32)")
    parser.add_argument("--version", type=int, default=7, choices=(6, 7, 8), help="commit log version (default 7)")
    parser.add_argument("--compression", default=None,
                        help="compressor class (LZ4Compressor, SnappyCompressor, DeflateCompressor, "
                             "ZstdCompressor); default: a plain segment")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; the best counts (default 3)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="time the figures are computed from: process CPU time (default) or wall clock")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--profile", action="store_true", help="also cProfile framing and full decode")
    parser.add_argument("--top", type=int, default=25, help="profile lines to print (default 25)")
    args = parser.parse_args(argv)

    table = users_table()
    schema = Schema()
    schema.add_table(table)
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
        started = time.perf_counter()
        segment = write_segment(Path(tmp), table, args.segment_size << 20, args.version, args.compression, args.seed)
        sizes = sorted(segment.body_sizes)
        print(f"cassandra-cdc commit log decode benchmark — Python {platform.python_version()}, "
              f"{cpu_model()}, nproc {os.cpu_count()}")
        print(f"segment: v{args.version} {args.compression or 'plain'}, {segment.data_bytes / MB:.1f} MB of data "
              f"({segment.file_bytes / MB:.1f} MB file), {segment.mutations:,} mutations, body bytes "
              f"min {sizes[0]} / median {sizes[len(sizes) // 2]} / mean {sum(sizes) / len(sizes):.0f} / "
              f"max {sizes[-1]}; written in {time.perf_counter() - started:.1f} s")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        clock = "process CPU time" if args.clock == "cpu" else "wall-clock time"
        print(f"best of {args.runs}, single process; MB/s and mutations/s from the best {clock}; "
              f"MB = 10^6 bytes of segment data; load average {load:.2f} at start\n")

        measurements = [
            ("floor: read file + crc32 whole", floor_read_crc),
            ("floor: bare inline framing + CRCs", floor_bare_framing if not args.compression else None),
            ("framing: SegmentReader.entries()", framing),
            ("agent path: framing + table id + key", agent_path),
            ("agent path via split_partition_updates", agent_path_split),
            ("full decode: MutationSerializer.deserialize", full_decode),
            ("full decode + CQL values (informative)", full_decode_cql),
        ]
        results: dict[str, tuple[float, float]] = {}
        rows = []
        for name, function in measurements:
            if function is None:
                rows.append((name, "n/a", "", "", "", ""))
                continue
            seconds, cpu_seconds, count = best_of(args.runs, function, segment.path, schema)
            if count and count != segment.mutations:
                raise SystemExit(f"{name}: read {count} entries, wrote {segment.mutations}")
            timed = cpu_seconds if args.clock == "cpu" else seconds
            mb_s = segment.data_bytes / MB / timed
            per_s = segment.mutations / timed
            results[name] = (mb_s, per_s)
            rows.append((name, f"{seconds * 1000:,.1f}", f"{cpu_seconds * 1000:,.1f}", f"{mb_s:,.1f}",
                         f"{per_s:,.0f}", f"{timed / segment.mutations * 1e6:.2f}"))
        print_table(("path", "wall ms", "cpu ms", "MB/s", "mutations/s", "µs/mutation"), rows)

        full = results["full decode: MutationSerializer.deserialize"][1]
        agent = results["agent path: framing + table id + key"][0]
        print()
        print(target_line("full decode", full, FULL_DECODE_TARGET, "mutations/s"))
        print(target_line("agent path", agent, AGENT_PATH_TARGET, "MB/s"))

        if args.profile:
            for name, function in (("framing", framing), ("full decode", full_decode)):
                print(f"\n=== cProfile: {name} (top {args.top} by tottime) ===")
                print(profile(function, segment.path, schema, args.top))
    return 0


def target_line(name: str, value: float, target: float, unit: str) -> str:
    if value >= target:
        return f"{name}: {value:,.0f} {unit} — target {target:,.0f} MET"
    return (f"{name}: {value:,.0f} {unit} — target {target:,.0f} NOT MET "
            f"({value / target:.0%} of it; needs {target / value:.2f}x)")


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
        for row in (header, *rows):
            print("  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(row, widths))))
        return
    table = Table(show_edge=False)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=120).print(table)


if __name__ == "__main__":
    sys.exit(main())
