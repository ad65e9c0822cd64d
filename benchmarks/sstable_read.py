"""SSTable reading throughput for bootstrap, single process (= per core).

Workloads:

* ``fixture``: the real ``legacy_<v>_clust`` SSTables (../shared/cassandra-sstables; LZ4, 50 rows per
  partition, rows of ~1.3 KB: a 1200-character clustering value and a 128-character value), read
  repeatedly;
* ``small-rows``: a synthetic SSTable in the same table's format (``nb``, LZ4, 16 KiB chunks, as Cassandra
  4.x+ writes by default): 400 partitions of 500 rows, ``ck`` 8-12 characters, ``val`` 40-80 characters,
  about 80 bytes per row: the per-row cost dominates.

Paths, each timed in CPU seconds of this process (best of N runs):

* ``read``: ``SSTable.partitions()``: chunks read, CRC-checked, decompressed, every row and cell decoded;
* ``records``: read + what a bootstrap task does per partition (``RecordBuilder``: split large
  partitions, serialize as commit log partition updates, build raw records), without Kafka;
* ``publish`` (with ``--kafka``, default): a whole bootstrap task (``publish_task``) into an embedded
  broker (noida-db), idempotent producer with ``acks=all``, LZ4; the broker runs in other processes and
  is not counted.

Target (from the issue): 50,000 rows/s per core. MB = 10^6 bytes; "data" is uncompressed Data.db, "file"
the bytes read from disk (page cache: these are CPU figures, not disk figures).

    python benchmarks/sstable_read.py [--runs 5] [--no-kafka] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import platform
import pstats
import random
import shutil
import string
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cassandra_cdc.bootstrap.task_plan import SSTableSlice  # noqa: E402
from cassandra_cdc.bootstrap.sstable_records import RecordBuilder  # noqa: E402
from cassandra_cdc.storage.cells import Cell, LivenessInfo  # noqa: E402
from cassandra_cdc.storage.binary_io import DataOutput  # noqa: E402
from cassandra_cdc.storage.rows import ClusteringSerializer, Row, UnfilteredSerializer  # noqa: E402
from cassandra_cdc.storage.vint import write_unsigned_vint  # noqa: E402
from cassandra_cdc.schema import TableMetadata, parse_schema  # noqa: E402
from cassandra_cdc.sstable import SSTable  # noqa: E402
from cassandra_cdc.sstable.compression import compress_data  # noqa: E402
from cassandra_cdc.sstable.sstable_partition import PartitionDeletionSerializer  # noqa: E402

TARGET_ROWS_PER_SECOND = 50_000
MB = 1_000_000
SHARED = Path(__file__).resolve().parents[2] / "shared" / "cassandra-sstables"
FIXTURE_VERSIONS = ("nb", "oa", "da")
CQL = "CREATE TABLE legacy_tables.legacy_{v}_clust (pk text, ck text, val text, PRIMARY KEY (pk, ck));"


@dataclass
class Workload:
    name: str
    sstables: list[tuple[SSTable, TableMetadata]]
    repeat: int  # reads of every SSTable per run

    @property
    def rows(self) -> int:
        return self.repeat * sum(sum(len(u.rows) for u in s.partitions(t)) for s, t in self.sstables)

    @property
    def data_bytes(self) -> int:
        return self.repeat * sum(s.data_length for s, _ in self.sstables)

    @property
    def file_bytes(self) -> int:
        return self.repeat * sum(s.data_path.stat().st_size for s, _ in self.sstables)


def table_of(version: str) -> TableMetadata:
    return parse_schema(CQL.format(v=version)).table("legacy_tables", f"legacy_{version}_clust")


def fixture_workload(repeat: int) -> Workload:
    sstables = [(SSTable(SHARED / v / "legacy_tables" / f"legacy_{v}_clust"), table_of(v))
                for v in FIXTURE_VERSIONS]
    return Workload("fixture", sstables, repeat)


def small_rows_sstable(directory: Path, partitions: int = 400, rows: int = 500, seed: int = 1) -> SSTable:
    """An ``nb`` SSTable of ``legacy_nb_clust``'s format holding small rows (see the module docstring).

    Written as Cassandra lays Data.db out (partition header, rows with their sizes, end marker), with the
    fixture's Statistics.db (its serialization header: types and the encoding stats the deltas use).
    """
    fixture = SSTable(SHARED / "nb" / "legacy_tables" / "legacy_nb_clust")
    table = table_of("nb")
    target = directory / "legacy_tables" / "legacy_nb_clust"
    target.mkdir(parents=True)
    shutil.copyfile(fixture.component("Statistics.db"), target / "nb-1-big-Statistics.db")
    header = fixture.data_header(table).header
    (val,) = header.regulars
    rng = random.Random(seed)
    base = header.stats.min_timestamp
    data = DataOutput()
    for p in sorted(range(partitions), key=lambda k: str(k)):
        key = f"p{p:06d}".encode()
        data.uint16(len(key))
        data += key
        data += PartitionDeletionSerializer.serialize(None, fixture.version)
        previous = 0
        for ck in sorted(f"c{i:0{rng.randint(7, 11)}d}" for i in range(rows)):
            timestamp = base + rng.randrange(10**9)
            value = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(40, 80))).encode()
            row = Row((ck.encode(),), [Cell(val, timestamp, value)], LivenessInfo(timestamp))
            whole = DataOutput()
            UnfilteredSerializer.serialize_row(row, whole, header)
            clustering = DataOutput()
            ClusteringSerializer.serialize(row.clustering, clustering, header.clustering_types)
            head = 1 + len(clustering)  # flags, clustering: then Data.db has the row's sizes
            body = write_unsigned_vint(previous) + bytes(whole[head:])
            data += whole[:head]
            data += write_unsigned_vint(len(body))
            data += body
            previous = len(body)
        data.byte(0x01)
    file, info = compress_data(bytes(data), "LZ4Compressor", fixture.version, chunk_length=16 << 10)
    (target / "nb-1-big-CompressionInfo.db").write_bytes(info.serialize(fixture.version))
    (target / "nb-1-big-Data.db").write_bytes(file)
    (target / "nb-1-big-Digest.crc32").write_text(str(zlib.crc32(file)))
    sstable = SSTable(target)
    assert sum(len(u.rows) for u in sstable.partitions(table)) == partitions * rows
    return sstable


def read_rows(workload: Workload) -> int:
    rows = 0
    for _ in range(workload.repeat):
        for sstable, table in workload.sstables:
            for update in sstable.partitions(table):
                rows += len(update.rows)
    return rows


def build_records(workload: Workload) -> int:
    records = 0
    for _ in range(workload.repeat):
        for sstable, table in workload.sstables:
            for _, partition_records in RecordBuilder(sstable, table, "bench").read():
                records += len(partition_records)
    return records


def timed(function: Callable[[], object], runs: int) -> float:
    """Best CPU time of ``runs`` calls."""
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        start = time.process_time()
        function()
        best = min(best, time.process_time() - start)
    return best


def report(label: str, workload: Workload, seconds: float) -> str:
    rows_per_second = workload.rows / seconds
    verdict = "meets" if rows_per_second >= TARGET_ROWS_PER_SECOND else "below"
    data, file = workload.data_bytes / seconds / MB, workload.file_bytes / seconds / MB
    return f"| {workload.name} | {label} | {rows_per_second:,.0f} | {data:,.1f} | {file:,.1f} | {verdict} |"


def publish_workload(workload: Workload, runs: int) -> float | None:
    from cassandra_cdc.bootstrap.publish import PublishSettings, publish_task
    from cassandra_cdc.simulator import EmbeddedBroker

    with tempfile.TemporaryDirectory() as directory, EmbeddedBroker(Path(directory) / "broker") as broker:
        best = float("inf")
        for run in range(runs):
            gc.collect()
            start = time.process_time()
            for _ in range(workload.repeat):
                for sstable, table in workload.sstables:
                    settings = PublishSettings(broker.bootstrap_servers, f"bench.raw{run}", table)
                    task = SSTableSlice("bench", "bench", str(sstable.data_path), 0, None,
                                        sstable.data_length)
                    publish_task(task, settings)
            best = min(best, time.process_time() - start)
        return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kafka", action=argparse.BooleanOptionalAction, default=True,
                        help="also time whole bootstrap tasks publishing to an embedded broker")
    parser.add_argument("--profile", action="store_true", help="cProfile the records path of small rows")
    args = parser.parse_args()
    print(f"Python {platform.python_version()} on {platform.machine()}, {args.runs} runs, best CPU time\n")
    with tempfile.TemporaryDirectory() as directory:
        small = small_rows_sstable(Path(directory))
        workloads = [fixture_workload(repeat=20),
                     Workload("small-rows", [(small, table_of("nb"))], repeat=1)]
        print("| workload | path | rows/s per core | data MB/s | file MB/s | 50k rows/s target |")
        print("|---|---|---|---|---|---|")
        for workload in workloads:
            print(report("read", workload, timed(lambda w=workload: read_rows(w), args.runs)), flush=True)
            seconds = timed(lambda w=workload: build_records(w), args.runs)
            print(report("records", workload, seconds), flush=True)
            if args.kafka:
                seconds = publish_workload(workload, max(1, args.runs // 2))
                if seconds:
                    print(report("publish", workload, seconds), flush=True)
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(build_records, workloads[1])
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
