"""Pipeline throughput and end-to-end latency (Spark local[2], RocksDB state, Apache Kafka).

Throughput: a workload of ``--records`` raw records (each write copied by RF=3 replicas) over
``--keys`` partition keys is published to the raw topic as the agents would, then the pipeline
processes the backlog from scratch; reported: raw records/s in total and per core
(2 cores), with and without the session/query start-up.

Latency: three simulated nodes, three agents and the pipeline run together (on the backlog's state, for a
series shape, its partitions appended to and updated as the shape says); writes go into the
segments at a steady moderate rate with a sync every 50 ms (Cassandra's periodic sync is 10 s by
default; a faster one is what a latency-minded deployment uses), and each write's event is timed
from the write into the segment to its arrival in the output topic; reported: p50/p99 after a warm-up
(``--warmup-seconds`` of writes: the first batch with data starts the stateful stage's Python workers),
the warm-up's own figures apart, and what the micro-batches cost (the query progress's ``durationMs``).
With ``--latency-writer raw`` the writes' raw records are published at once instead, as the agents would
(timed from their publication): the pipeline's part alone, with the CPU the nodes and agents would take.

    python benchmarks/pipeline_throughput.py [--records 1000000] [--keys 100000] [--latency-seconds 60]

The backlog's table shape (``Shape``): one row per partition key (``bench.users``, the default), or, with
``--rows-per-partition N`` > 1, a time series (``bench.series``: a clustering column) whose partitions grow by
appended rows up to N each, ``--update-existing F`` of the writes updating a random existing row instead
(with ``--preload-keys K``: K partitions of N rows each are put in the state first, and the backlog appends
beyond them);
``--zipf S`` picks each write's partition Zipf-distributed over the keys (hot partitions) rather than in turn;
``--copies-apart SECONDS`` publishes each replica's copy of a write as late as a lag of up to that long would
(at ``--copies-rate`` writes per second), so that the copies of a write reach different micro-batches.

The broker is Apache Kafka as ``make install`` fetches it (``--broker embedded``: the stand-in noida-db, which
answers fetches at once where Kafka holds them, so that waits a real broker imposes do not show). It shares
the two cores: its CPU is reported apart, and the pipeline's by part (``cpu_s_by_part``: its JVM's threads by
name, its Python workers), to say where a run's time goes.

Targets (issue 37): with 10M partitions in the state, 12,000 raw records/s per core from a cold start; the
wide shapes within 80% of one row per partition; p99 latency under 2 s at 1,000 writes/s.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import datetime
import heapq
import itertools
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from cassandra_cdc.agent import Agent  # noqa: E402
from cassandra_cdc.agent import load_config as agent_config  # noqa: E402
from cassandra_cdc.commitlog import Mutation, MutationSerializer  # noqa: E402
from cassandra_cdc.pipeline.pipeline_config import load_config as pipeline_config  # noqa: E402
from cassandra_cdc.pipeline.group_state import page_of  # noqa: E402
from cassandra_cdc.pipeline.streaming_job import start  # noqa: E402
from cassandra_cdc.pipeline.spark_session import spark_session  # noqa: E402
from cassandra_cdc.schema import parse_schema  # noqa: E402
from cassandra_cdc.simulator import Cluster, EmbeddedBroker, Insert, Update, to_mutation  # noqa: E402
from cassandra_cdc.simulator.operations import Operation  # noqa: E402
from cassandra_cdc.localcluster import KafkaBroker  # noqa: E402
from cassandra_cdc.kafka.raw_records import RawRecord, encode_update, record_key  # noqa: E402
from cassandra_cdc.kafka.schema_records import SchemaRecord  # noqa: E402

SCHEMA = """CREATE TABLE bench.users (id bigint PRIMARY KEY, name text, email text, age int, score double,
    city text) WITH ID = 6c0e7a10-0000-4000-8000-0000000000b1 AND cdc = true;
CREATE TABLE bench.series (pk bigint, ts bigint, v text, PRIMARY KEY (pk, ts))
    WITH ID = 6c0e7a10-0000-4000-8000-0000000000b2 AND cdc = true;"""
CORES = os.cpu_count() or 2
Broker = KafkaBroker | EmbeddedBroker
BROKERS: dict[str, type[Broker]] = {"kafka": KafkaBroker, "embedded": EmbeddedBroker}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> tuple[float, float]:
    """CPU time used so far by this process and its descendants (the JVM, Python workers), and by the broker.

    On a shared machine, wall time says how much CPU others left; the first says what the pipeline needs.
    The broker shares the two cores in these runs (in production Kafka runs elsewhere): the second says
    how much of them it took. Reaped children count through their parent's cumulative times (Spark's
    daemons reap the workers).
    """
    ours = {os.getpid(), *descendants(os.getpid())}
    total = broker = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat_fields(entry / "stat")
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # ended meanwhile
            used = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
            if is_broker(command):
                broker += used
            elif int(entry.name) in ours:
                total += used
    return total / CLOCK_TICKS, broker / CLOCK_TICKS


def is_broker(command: bytes) -> bool:
    """Whether a process's command line is the broker's: the stand-in's or Apache Kafka's main class."""
    return b"noida" in command or b"\0kafka.Kafka\0" in command


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a ``/proc`` stat file after the command name (which may hold spaces): state first."""
    return stat.read_text().rsplit(")", 1)[1].split()


class CpuByPart:
    """Where the pipeline's CPU goes: its JVM by thread (named as the JVM names them, numbers dropped:
    RocksDB's compactions, the tasks, the Python state servers, the garbage collector...), its Python
    workers, this driver process; sampled each ``interval`` seconds, so a thread or worker that ends counts
    up to its last sample."""

    def __init__(self, interval: float = 1.0) -> None:
        self._first: dict[tuple[int, int], int] = {}
        self._last: dict[tuple[int, int], tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_every, args=(interval,), daemon=True)

    def __enter__(self) -> "CpuByPart":
        self._sample()
        self._first = {key: ticks for key, (_, ticks) in self._last.items()}  # what started later starts at 0
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self, top: int = 12) -> dict[str, float]:
        """CPU seconds by part, the largest first; the rest summed as ``other``."""
        parts: dict[str, int] = {}
        for key, (part, ticks) in self._last.items():
            parts[part] = parts.get(part, 0) + ticks - self._first.get(key, 0)
        ordered = sorted(parts.items(), key=lambda item: -item[1])
        shown = {part: round(ticks / CLOCK_TICKS, 1) for part, ticks in ordered[:top]}
        rest = sum(ticks for _, ticks in ordered[top:])
        return {**shown, "other": round(rest / CLOCK_TICKS, 1)} if rest else shown

    def _sample_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._sample()

    def _sample(self) -> None:
        for pid in [os.getpid(), *descendants(os.getpid())]:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
                if is_broker(command):
                    continue
                program = command.split(b"\0")[0]
                if b"java" in program:
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        name = "jvm: " + (task / "comm").read_text().strip().rstrip("0123456789#-_ ")
                        self._record((pid, int(task.name)), name, _stat_fields(task / "stat"))
                else:
                    name = "python: this driver" if pid == os.getpid() else "python: workers"
                    self._record((pid, 0), name, _stat_fields(Path(f"/proc/{pid}/stat")))
            except OSError:
                continue  # ended meanwhile

    def _record(self, key: tuple[int, int], part: str, fields: list[str]) -> None:
        self._last[key] = (part, int(fields[11]) + int(fields[12]))  # utime, stime


@dataclass(frozen=True)
class Shape:
    """The table shape of a backlog (see the module's docstring)."""
    rows_per_partition: int = 1
    update_existing: float = 0.0
    zipf: float | None = None
    copies_apart: float = 0.0  # seconds
    copies_rate: float = 1_000.0  # writes per second, to turn copies_apart into writes

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Backlog:
    """The writes of a backlog of ``Shape``, as operations, in order: ``keys`` partition keys."""

    def __init__(self, shape: Shape, keys: int, timestamp: int, preloaded: bool, seed: int = 1) -> None:
        self.shape = shape
        self.keys = keys
        self.timestamp = timestamp
        self.preloaded = preloaded
        self.random = random.Random(seed)
        # Rows in each partition (series): a preloaded one holds ``rows_per_partition`` and grows beyond.
        self.rows = [shape.rows_per_partition if preloaded else 0] * keys
        if shape.zipf is not None:
            weights = [1 / rank ** shape.zipf for rank in range(1, keys + 1)]
            self.cumulative = list(itertools.accumulate(weights))

    def key(self, i: int) -> int:
        if self.shape.zipf is not None:
            return bisect.bisect_left(self.cumulative, self.random.random() * self.cumulative[-1])
        return i * SPREAD % self.keys if self.preloaded else i % self.keys

    def write(self, i: int) -> Operation:
        key, timestamp = self.key(i), self.timestamp + i
        if self.shape.rows_per_partition > 1:
            rows = self.rows[key]
            full = not self.preloaded and rows >= self.shape.rows_per_partition
            if rows and (full or self.random.random() < self.shape.update_existing):
                return Update("bench.series", {"pk": key, "ts": self.random.randrange(rows)}, {"v": f"v{i}"},
                              timestamp=timestamp)
            self.rows[key] += 1
            return Insert("bench.series", {"pk": key, "ts": rows, "v": f"v{i}"}, timestamp=timestamp)
        if i < self.keys and not self.preloaded and self.shape.zipf is None:
            return Insert("bench.users", {"id": key, "name": f"user{key}", "email": f"u{key}@example.com", "age": 30,
                                          "score": 1.5, "city": "Lyon"}, timestamp=timestamp)
        return Update("bench.users", {"id": key}, {"score": float(i), "age": i % 90}, timestamp=timestamp)

    def copy_delays(self) -> tuple[int, int, int]:
        """How many writes later than its write each replica's copy is published."""
        most = int(self.shape.copies_apart * self.shape.copies_rate)
        return (0, 0, 0) if not most else tuple(self.random.randint(0, most) for _ in range(3))  # type: ignore


def publish_backlog(broker: Broker, server: str, records: int, keys: int, shape: Shape,
                    preloaded: bool = False) -> int:
    """Publish about ``records`` raw records (a multiple of 3: whole writes, one copy per replica); return how
    many.

    The first write of each of ``keys`` keys is an insert, the others updates; with ``preloaded`` (the keys
    are in the state already), every write is an update of a key spread over all of them. A series appends
    rows (see ``Backlog``)."""
    schema = parse_schema(SCHEMA)
    producer = raw_producer(broker.bootstrap_servers)
    timestamp = time.time_ns() // 1000 - 3_600_000_000 + (3_000_000_000 if preloaded else 0)
    backlog = Backlog(shape, keys, timestamp, preloaded)
    delayed: list[tuple[int, int, bytes, bytes]] = []  # (due write, sequence, key, value), a heap
    sequence = itertools.count()
    for i in range(records // 3):
        update = MutationSerializer.serialize(Mutation(to_mutation(backlog.write(i), schema).updates), 7)[1:]
        for node, delay in zip(("node1", "node2", "node3"), backlog.copy_delays()):
            heapq.heappush(delayed, (i + delay, next(sequence), record_key(update),
                                     RawRecord(node, 1, i, 7, timestamp + i, update).encode()))
        while delayed and delayed[0][0] <= i:
            _, _, key, value = heapq.heappop(delayed)
            produce(producer, f"{server}.raw", key, value)
    while delayed:
        _, _, key, value = heapq.heappop(delayed)
        produce(producer, f"{server}.raw", key, value)
    producer.flush(600)
    return records // 3 * 3


def create_raw_topic(broker: Broker, server: str) -> None:
    """The raw topic, and the table's definition on the schema topic, as the agents publish them."""
    producer = raw_producer(broker.bootstrap_servers)
    for table in parse_schema(SCHEMA):
        record = SchemaRecord.of(table, "bench")
        producer.produce(server, record.encode(), record.key)
    producer.flush(60)
    broker.create_topic(f"{server}.raw", 12)


def raw_producer(bootstrap_servers: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "acks": "all",
                     "linger.ms": 20, "compression.type": "lz4"})


def produce(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:  # the producer's queue is full: wait for deliveries
            producer.poll(0.1)


# A multiplier prime to any key count used here: the updates of preloaded keys go to keys spread over all.
SPREAD = 2_654_435_761
# The id and row of the preload's template insert: their 8 bytes are nowhere else in its serialization.
TEMPLATE_KEY = 0x5EED_0DD5_5EED_0DD5
TEMPLATE_ROW = 0x0DD5_5EED_0DD5_5EED


def preload_insert(key: int, row: int, timestamp: int, series: bool) -> bytes:
    """The partition update of the preload's insert of ``key`` (and, in a series, of its row ``row``),
    serialized as an agent reads it."""
    if series:
        op = Insert("bench.series", {"pk": key, "ts": row, "v": "preloaded"}, timestamp=timestamp)
    else:
        op = Insert("bench.users", {"id": key, "name": "preloaded", "email": "preloaded@example.com",
                                    "age": 30, "score": 1.5, "city": "Lyon"}, timestamp=timestamp)
    return MutationSerializer.serialize(Mutation(to_mutation(op, parse_schema(SCHEMA)).updates), 7)[1:]


class PreloadInserts:
    """The preload's inserts, made from one serialized insert with its key's (and row's) bytes replaced: the
    serializer costs ~0.1 ms a record in Python, a replacement microseconds. Every other value is the same for
    all inserts, so the bytes are the serializer's own (``check`` compares them)."""

    def __init__(self, timestamp: int, series: bool) -> None:
        self.timestamp = timestamp
        self.series = series
        self.template = preload_insert(TEMPLATE_KEY, TEMPLATE_ROW, timestamp, series)
        self.key_offsets = self._offsets(TEMPLATE_KEY)
        self.row_offsets = self._offsets(TEMPLATE_ROW) if series else []

    def _offsets(self, marker: int) -> list[int]:
        found = _long_bytes(marker)
        return [i for i in range(len(self.template)) if self.template.startswith(found, i)]

    def update(self, key: int, row: int = 0) -> bytes:
        update = bytearray(self.template)
        for offsets, value in ((self.key_offsets, key), (self.row_offsets, row)):
            for offset in offsets:
                update[offset:offset + 8] = _long_bytes(value)
        return bytes(update)

    def check(self, writes: list[tuple[int, int]]) -> None:
        for key, row in writes:
            if self.update(key, row) != preload_insert(key, row, self.timestamp, self.series):
                raise AssertionError(f"the preload's insert of key {key}, row {row} differs from the "
                                     "serializer's")


def _long_bytes(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)  # a bigint, as Cassandra serializes it


def publish_preload(bootstrap_servers: str, topic: str, keys: list[int], rows: int, timestamp: int) -> None:
    """One replica's raw records of the inserts of ``keys``, in that order, each key's ``rows`` rows in
    clustering order (one process's share)."""
    inserts = PreloadInserts(timestamp, rows > 1)
    producer = raw_producer(bootstrap_servers)
    for key in keys:
        for row in range(rows):
            position = key * rows + row
            record_key_bytes, value = encode_update(b"node1", 1, position, 7, inserts.update(key, row))
            produce(producer, topic, record_key_bytes, value)
    producer.flush(600)


def keys_by_page(keys: int, pages: int, table_id: bytes) -> list[list[int]]:
    """The keys in the order of their state pages, in one share per core (each a range of pages).

    A group keeps a bounded number of its pages read (``PAGES_IN_MEMORY_BYTES``): inserts in page order
    read and write each page once per batch, as a bulk load in key order would, where inserts in random
    order would write pages back and read them again once the state outgrows the bound."""
    page = [page_of(table_id + _long_bytes(key), pages) for key in range(keys)]
    ordered = sorted(range(keys), key=page.__getitem__)
    return [ordered[keys * i // CORES:keys * (i + 1) // CORES] for i in range(CORES)]


def preload(broker: Broker, spark: Any, config: Any, keys: int, rows: int) -> dict[str, Any]:
    """Put ``keys`` partition keys of ``rows`` rows each in the state by a bulk path: one insert per row, one
    copy (not the three replicas' copies: the others would be skipped by their digest anyway), in the order
    of their state pages, published by one process per core, then read by the pipeline in batches of 1M
    records, the largest it is given. Returns how long it took."""
    started = time.monotonic()
    timestamp = time.time_ns() // 1000 - 3_600_000_000
    PreloadInserts(timestamp, rows > 1).check([(0, 0), (1, rows - 1), (keys // 2, rows // 2), (keys - 1, 1)])
    table = "series" if rows > 1 else "users"
    table_id = parse_schema(SCHEMA).table("bench", table).id.bytes
    shares = [(broker.bootstrap_servers, f"{config.server}.raw", share, rows, timestamp)
              for share in keys_by_page(keys, config.spark.state_pages, table_id)]
    # Spawned, not forked: this process runs the JVM's gateway and librdkafka threads.
    with multiprocessing.get_context("spawn").Pool(CORES) as pool:
        pool.starmap(publish_preload, shares)
    publish_s = time.monotonic() - started
    kafka = config.kafka.model_copy(update={"max_offsets_per_trigger": 1_000_000})
    bulk = config.model_copy(update={"kafka": kafka})
    batches, _ = run_query(spark, bulk, keys * rows)
    state_bytes = checkpoint_bytes(Path(config.checkpoint))
    pipeline_s = time.monotonic() - started - publish_s
    return {"keys": keys, "rows_per_key": rows, "publish_s": round(publish_s, 1),
            "pipeline_s": round(pipeline_s, 1), "batches": len(batches), "checkpoint_bytes": state_bytes}


def run_query(spark: Any, config: Any, records: int) -> tuple[list[dict[str, Any]], float]:
    """Run the pipeline until it has read ``records`` raw records more than its checkpoint had; its batches
    with data, in order, and the query's start (epoch seconds)."""
    query_start_epoch = time.time()
    query = start(spark, config)
    # By batch id: recentProgress keeps only the last 100 updates, and the state's timers add no-data batches.
    batches: dict[int, dict] = {}
    while sum(map(raw_records, batches.values())) < records:
        query.awaitTermination(1)  # recentProgress costs the JVM a JSON per progress kept: not too often
        if query.exception() is not None:
            raise RuntimeError(f"the pipeline failed: {query.exception()}")
        batches.update((p["batchId"], p) for p in query.recentProgress if raw_records(p))
    query.stop()
    return [batches[i] for i in sorted(batches)], query_start_epoch


def settings_from_environment() -> dict[str, Any]:
    """Pipeline settings of a run (BENCH_SETTINGS, JSON: e.g. {"spark.state_pages": 1024})."""
    return json.loads(os.environ.get("BENCH_SETTINGS", "{}"))


def checkpoint_bytes(checkpoint: Path) -> int:
    return sum(path.stat().st_size for path in checkpoint.rglob("*") if path.is_file())


def state_bytes_per_batch(checkpoint: Path, batch_ids: list[int]) -> dict[str, int]:
    """What the state store wrote to the checkpoint for these batches: each state partition's changelog of
    the batch's version (its changes), and the snapshots (``.zip`` and their SST files) made meanwhile."""
    changelogs = []
    for batch in batch_ids:
        files = checkpoint.glob(f"state/0/*/{batch + 1}.changelog")
        changelogs.append(sum(path.stat().st_size for path in files))
    ordered = sorted(changelogs) or [0]
    return {"batches": len(changelogs), "changelog_p50": ordered[len(ordered) // 2],
            "changelog_max": ordered[-1], "changelog_total": sum(changelogs)}


class WorkerMemory:
    """The peak resident memory of the Python processes under this one (Spark's Python daemon and workers),
    sampled each ``interval`` seconds: the largest single process and the largest sum at one time."""

    def __init__(self, interval: float = 0.5) -> None:
        self.peak_process = 0
        self.peak_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)

    def start(self) -> "WorkerMemory":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "WorkerMemory":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _sample(self, interval: float) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(interval):
            total = 0
            for pid in descendants(os.getpid()):
                try:
                    if b"python" not in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                        continue
                    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except OSError:
                    continue  # ended meanwhile
                total += rss
                self.peak_process = max(self.peak_process, rss)
            self.peak_total = max(self.peak_total, total)


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int(_stat_fields(entry / "stat")[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], list(children.get(root, []))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending += children.get(pid, [])
    return found


def throughput(broker: Broker, work: Path, records: int, keys: int, batch_records: int,
               preload_keys: int, shape: Shape) -> dict[str, Any]:
    server = "bench"
    config = pipeline_config(None, {"server": server, "checkpoint": str(work / "checkpoint"),
                                    "kafka.bootstrap_servers": broker.bootstrap_servers,
                                    "kafka.max_offsets_per_trigger": batch_records,
                                    "kafka.events_topic_partitions": 6, **settings_from_environment()})
    session_start = time.monotonic()
    spark = spark_session("local[2]", "pipeline-benchmark", config.spark.shuffle_partitions,
                          json.loads(os.environ.get("BENCH_CONF", "{}")))
    session_s = time.monotonic() - session_start
    create_raw_topic(broker, server)
    rows = shape.rows_per_partition
    preloaded = preload(broker, spark, config, preload_keys, rows) if preload_keys else None
    started = time.monotonic()
    records = publish_backlog(broker, server, records, preload_keys or keys, shape, preloaded=bool(preload_keys))
    published = time.monotonic() - started
    cpu_start, broker_cpu_start = cpu_seconds()
    with WorkerMemory() as memory, CpuByPart() as cpu_by_part:
        ordered, query_start_epoch = run_query(spark, config, records)
    cpu, broker_cpu = (used - start for used, start in zip(cpu_seconds(), (cpu_start, broker_cpu_start)))
    first = ordered[0]
    # From the query's start (or from the end of its first batch, which pays the cold start: the query's
    # planning, the Python workers' start, the JVM's compilation) to the end of the batch that read the last
    # record, by the query's own clock; the loop above notices it up to a second later.
    total = _batch_end(ordered[-1]) - query_start_epoch
    steady = _batch_end(ordered[-1]) - _batch_end(first)
    state = ordered[-1]["stateOperators"][0]
    return {"records": records, "shape": shape.describe(), "preload": preloaded, "publish_s": published, "session_s": session_s,
            "query_s": total, "first_batch_s": first["batchDuration"] / 1000, "records_per_s": records / total,
            "per_core": records / total / CORES,
            "steady_per_core": (records - raw_records(first)) / steady / CORES if steady > 0 else 0.0,
            "cpu_s": cpu, "records_per_cpu_s": records / cpu, "broker_cpu_s": broker_cpu,
            "cpu_s_by_part": cpu_by_part.seconds(),
            "load_average": os.getloadavg(),
            "durations_ms": {k: sum(p["durationMs"].get(k, 0) for p in ordered) for k in ordered[0]["durationMs"]},
            "batches": len(ordered), "batch_sizes": [raw_records(p) for p in ordered],
            "batch_s": [p["batchDuration"] / 1000 for p in ordered],
            "batch_start_s": [round(_epoch_seconds(p["timestamp"]) - query_start_epoch, 2) for p in ordered],
            "first_batch_ms": first["durationMs"],
            "state_memory_bytes": state["memoryUsedBytes"],
            "worker_peak_rss": memory.peak_process, "workers_peak_rss_total": memory.peak_total,
            "checkpoint_bytes": checkpoint_bytes(Path(config.checkpoint)),
            "state_written": state_bytes_per_batch(Path(config.checkpoint), [p["batchId"] for p in ordered]),
            "state_metrics": {k: v for k, v in state.get("customMetrics", {}).items()
                              if k in ("rocksdbSstFileSize", "rocksdbTotalBytesWritten")}}


def _epoch_seconds(timestamp: str) -> float:
    """A query progress's ``timestamp`` (ISO 8601, UTC, milliseconds) in seconds since the epoch."""
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _batch_end(progress: dict[str, Any]) -> float:
    return _epoch_seconds(progress["timestamp"]) + progress["batchDuration"] / 1000


def raw_records(progress: dict[str, Any]) -> int:
    """Raw records a micro-batch read: the offsets it advanced (the source's rows name offset ranges)."""
    def offsets(value: Any) -> dict[str, int]:
        return (json.loads(value) if isinstance(value, str) else value) or {}

    source = progress["sources"][0]
    end, start = offsets(source.get("endOffset")), offsets(source.get("startOffset"))
    return sum(end.values()) - sum(start.get(partition, 0) for partition in end)


# The first row the latency run appends to a partition: after every row the preload and the backlog wrote.
LATENCY_ROWS_FROM = 1 << 40


class LatencyWrites:
    """The latency run's writes, each with a number its event carries back: new users from ``first_key`` on,
    or, for a series shape, rows appended to the backlog's partitions (in turn, or Zipf-distributed) and,
    ``update_existing`` of the time, updates of a random row the backlog wrote."""

    def __init__(self, shape: Shape, keys: int, first_key: int, filled: int) -> None:
        self.shape = shape
        self.series = shape.rows_per_partition > 1
        self.topic_table = "bench.series" if self.series else "bench.users"
        self.first_key = first_key
        self.backlog = Backlog(shape, keys, 0, preloaded=False, seed=2)
        self.filled = max(1, filled)  # rows 0 to filled - 1 exist in every partition
        self.appended = [0] * keys

    def write(self, n: int) -> Operation:
        timestamp = time.time_ns() // 1000
        if not self.series:
            return Insert("bench.users", {"id": self.first_key + n, "name": "x", "age": 1}, timestamp=timestamp)
        key = self.backlog.key(n)
        if self.backlog.random.random() < self.shape.update_existing:
            return Update("bench.series", {"pk": key, "ts": self.backlog.random.randrange(self.filled)},
                          {"v": f"w{n}"}, timestamp=timestamp)
        self.appended[key] += 1
        return Insert("bench.series", {"pk": key, "ts": LATENCY_ROWS_FROM + self.appended[key], "v": f"w{n}"},
                      timestamp=timestamp)

    def number(self, event: dict[str, Any]) -> int | None:
        """The write an event is of (None: not one of these writes)."""
        after = event["payload"]["after"]
        if after is None:
            return None
        if not self.series:
            return after["id"] - self.first_key
        value = after.get("v") or ""
        return int(value[1:]) if value.startswith("w") else None


def latency(broker: Broker, work: Path, seconds: float, rate: float, raw_partitions: int,
            warmup: float, server: str = "lat", checkpoint: Path | None = None,
            writes: LatencyWrites | None = None, raw_writer: bool = False) -> dict[str, Any]:
    """With ``checkpoint`` (and the ``server`` whose raw topic it read), on the state it holds; ``writes``:
    new users by default; ``raw_writer``: the writes published as raw records (``RawWriter``), not through
    simulated nodes and agents."""
    writes = writes or LatencyWrites(Shape(), 1, 0, 0)
    if raw_writer:
        writer: AgentsWriter | RawWriter = RawWriter(broker, server, fresh=checkpoint is None)
    else:
        writer = AgentsWriter(broker, work, server, raw_partitions)
    checkpoint = checkpoint or work / "lat-checkpoint"
    config = pipeline_config(None, {"server": server, "checkpoint": str(checkpoint),
                                    "kafka.bootstrap_servers": broker.bootstrap_servers,
                                    "spark.trigger_interval": "100 milliseconds",
                                    "kafka.events_topic_partitions": 2, **settings_from_environment()})
    spark = spark_session("local[2]", "latency-benchmark", config.spark.shuffle_partitions,
                          json.loads(os.environ.get("BENCH_CONF", "{}")))
    memory = WorkerMemory().start()
    query = start(spark, config)
    written: dict[int, float] = {}
    arrived: dict[int, float] = {}
    stop = threading.Event()

    def consume() -> None:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "latency",
                             "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
        topic = f"{server}.{writes.topic_table}"
        while not stop.is_set():
            metadata = consumer.list_topics(timeout=5).topics.get(topic)
            if metadata is None or metadata.error is not None:
                time.sleep(0.2)
                continue
            # From each partition's end: the events of the preload and the backlog are not timed.
            consumer.assign([TopicPartition(topic, partition, consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10)[1]) for partition in metadata.partitions])
            break
        while not stop.is_set():
            for message in consumer.consume(500, timeout=0.2):
                if message.error() is None and message.value():
                    number = writes.number(json.loads(message.value()))
                    if number is not None:
                        arrived.setdefault(number, time.monotonic())
        consumer.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(10)  # the session and the query start
    interval = 1 / rate
    cpu_by_part = CpuByPart().__enter__()
    broker_cpu_start = cpu_seconds()[1]
    writing_from = time.monotonic()
    key = 0
    # The first writes meet a cold pipeline (its stateful stage's Python workers start with the first batch
    # that has data, and the JVM compiles as it goes): they are written, but measured apart from the rest.
    measured_from = time.monotonic() + warmup
    first_measured = None
    end = measured_from + seconds
    progress: dict[int, dict] = {}
    next_progress = time.monotonic()
    while time.monotonic() < end:
        if time.monotonic() >= next_progress:  # recentProgress keeps the last 100 batches only
            progress.update((p["batchId"], p) for p in query.recentProgress if raw_records(p))
            next_progress = time.monotonic() + 5
        key += 1
        if first_measured is None and time.monotonic() >= measured_from:
            first_measured = key
        writer.write(writes.write(key))
        written[key] = time.monotonic()  # durable (synced, or published) within 50 ms of this
        # Each write at its time from the start, not an interval after the last: the writes' own cost does not
        # slow the rate down, and a writer that fell behind catches up.
        time.sleep(max(0.0, writing_from + key * interval - time.monotonic()))
    writing_s = time.monotonic() - writing_from
    cpu_by_part.__exit__(None, None, None)
    broker_cpu = cpu_seconds()[1] - broker_cpu_start
    writer.flush()
    deadline = time.monotonic() + 60
    while len(arrived) < len(written) and time.monotonic() < deadline:
        time.sleep(0.5)
    stop.set()
    progress.update((p["batchId"], p) for p in query.recentProgress if raw_records(p))
    query.stop()
    memory.stop()
    writer.close()
    measured = [k for k in sorted(written) if k >= (first_measured or key + 1)]
    in_order = [arrived[k] - written[k] for k in measured if k in arrived]
    delays = sorted(in_order)
    quarters = [sorted(in_order[i * len(in_order) // 4:(i + 1) * len(in_order) // 4]) for i in range(4)]
    return {"warmup_writes": len(written) - len(measured),
            "first_write_ms": round(1000 * (arrived[1] - written[1])) if 1 in arrived else None,
            "warmup_p99_ms": round(1000 * percentile(sorted(arrived[k] - written[k] for k in written
                                                           if k not in measured and k in arrived), 0.99)),
            "writes": len(measured), "writes_per_s": round(len(written) / writing_s),
            "events": len(delays), "p50_ms": 1000 * statistics.median(delays),
            "p99_ms": 1000 * percentile(delays, 0.99), "max_ms": 1000 * delays[-1],
            "p99_ms_by_quarter": [round(1000 * percentile(quarter, 0.99)) for quarter in quarters if quarter],
            "batches_with_data": len(progress), "batch_ms": batch_costs(progress),
            # While writing (the writer, any agents and the event consumer are this driver's threads).
            "cpu_s_by_part": cpu_by_part.seconds(), "broker_cpu_s": broker_cpu,
            "writing_s": round(writing_s, 1),
            "worker_peak_rss": memory.peak_process, "workers_peak_rss_total": memory.peak_total,
            "checkpoint_bytes": checkpoint_bytes(checkpoint),
            "state_written": state_bytes_per_batch(checkpoint, sorted(progress)),
            "load_average": os.getloadavg()}


class AgentsWriter:
    """Writes into the commit logs of three simulated nodes (RF=3), synced every 50 ms, which three agents
    tail and publish: the whole path from a write to its event."""

    def __init__(self, broker: Broker, work: Path, server: str, raw_partitions: int) -> None:
        schema_file = work / "latency.cql"
        schema_file.write_text(SCHEMA)
        self.cluster = Cluster(work / "cluster", parse_schema(SCHEMA), nodes=3, rf=3, cassandra_version="4.1",
                               segment_size=4 << 20)
        self.agents = []
        for node in self.cluster.nodes:
            agent = Agent(agent_config(None, {
                "server": server, "node_id": node.node_id, "cdc_raw": str(node.cdc_raw_dir),
                "state_dir": str(work / f"state-{node.node_id}"), "schema.file": str(schema_file),
                "metrics.port": 0, "kafka.bootstrap_servers": broker.bootstrap_servers,
                "kafka.raw_topic_partitions": raw_partitions}))
            thread = threading.Thread(target=agent.run, daemon=True)
            thread.start()
            self.agents.append((agent, thread))
        self.next_sync = time.monotonic()

    def write(self, op: Operation) -> None:
        self.cluster.execute(op)
        if time.monotonic() >= self.next_sync:
            self.cluster.sync_all()
            self.next_sync = time.monotonic() + 0.05

    def flush(self) -> None:
        self.cluster.sync_all()

    def close(self) -> None:
        for agent, thread in self.agents:
            agent.stop()
            thread.join(30)


class RawWriter:
    """Publishes the three replicas' raw records of each write at once, as three agents would: the pipeline's
    part of the latency alone, on a machine that has no room for the nodes and the agents beside it (an
    agent's own part, from a write to its raw record, is agent_throughput.py's)."""

    def __init__(self, broker: Broker, server: str, fresh: bool) -> None:
        if fresh:
            create_raw_topic(broker, server)
        self.schema = parse_schema(SCHEMA)
        self.topic = f"{server}.raw"
        self.producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True,
                                  "acks": "all", "linger.ms": 5, "compression.type": "lz4"})
        self.position = 0

    def write(self, op: Operation) -> None:
        update = MutationSerializer.serialize(Mutation(to_mutation(op, self.schema).updates), 7)[1:]
        self.position += 1
        for node in ("node1", "node2", "node3"):
            produce(self.producer, self.topic, record_key(update),
                    RawRecord(node, 1, self.position, 7, op.timestamp, update).encode())
        self.producer.poll(0)

    def flush(self) -> None:
        self.producer.flush(60)

    def close(self) -> None:
        self.flush()


def batch_costs(progress: dict[int, dict]) -> dict[str, dict[str, int]]:
    """p50 and p90 of each part of the micro-batches that read data (the query progress's ``durationMs``)."""
    parts: dict[str, list[int]] = {}
    for batch in progress.values():
        for part, ms in batch["durationMs"].items():
            parts.setdefault(part, []).append(ms)
    return {part: {"p50": int(statistics.median(values)), "p90": sorted(values)[int(0.9 * (len(values) - 1))]}
            for part, values in parts.items()}


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[int(fraction * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="raw records (RF=3 copies included)")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct partition keys")
    parser.add_argument("--batch-records", type=int, default=250_000, help="raw records per micro-batch at most")
    parser.add_argument("--latency-seconds", type=float, default=60, help="duration of the latency run")
    parser.add_argument("--warmup-seconds", type=float, default=15,
                        help="writes before the measured ones, measured apart: the pipeline's cold start")
    parser.add_argument("--rate", type=float, default=100, help="writes per second in the latency run")
    parser.add_argument("--raw-partitions", type=int, default=12,
                        help="partitions of the raw topic in the latency run (the agent's default: 12); the "
                             "source reads each in its own task, every micro-batch")
    parser.add_argument("--preload-keys", type=int, default=0,
                        help="partition keys put in the state first (one insert each, or, with "
                             "--rows-per-partition, that many rows each; in batches of 1M records); the "
                             "backlog then updates them (or appends to a series' partitions), and the "
                             "latency run writes on that state")
    parser.add_argument("--rows-per-partition", type=int, default=1,
                        help="> 1: a time series table, its partitions appended to up to this many rows each "
                             "(with --preload-keys: preloaded with this many rows each, then appended to)")
    parser.add_argument("--update-existing", type=float, default=0.0,
                        help="with --rows-per-partition: the fraction of writes updating a random existing row")
    parser.add_argument("--zipf", type=float, default=None,
                        help="pick each write's partition Zipf-distributed with this exponent (hot partitions)")
    parser.add_argument("--copies-apart", type=float, default=0.0,
                        help="publish each replica's copy up to this many seconds of writes late")
    parser.add_argument("--copies-rate", type=float, default=1_000.0,
                        help="writes per second, to turn --copies-apart into writes")
    parser.add_argument("--broker", choices=sorted(BROKERS), default="kafka",
                        help="Apache Kafka (as `make install` provides it) or the stand-in broker noida-db")
    parser.add_argument("--latency-writer", choices=("agents", "raw"), default="agents",
                        help="agents: writes into three simulated nodes' commit logs, tailed by three agents "
                             "(the whole path); raw: their raw records published at once, as the agents would "
                             "(the pipeline's part alone, with the nodes' and agents' CPU left to it)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, BROKERS[args.broker](Path(directory) / "broker") as broker:
        try:
            run(args, broker, Path(directory))
        finally:  # before the broker stops: the Python workers' Kafka clients would retry it until the end
            spark_session("local[2]", "pipeline-benchmark", 2).stop()


def run(args: argparse.Namespace, broker: Broker, work: Path) -> None:
    shape = Shape(args.rows_per_partition, args.update_existing, args.zipf, args.copies_apart, args.copies_rate)
    if not args.skip_throughput:
        figures = throughput(broker, work, args.records, args.keys, args.batch_records, args.preload_keys, shape)
        print("throughput:", json.dumps(figures, indent=1))
        print(f"raw records/s per core: {figures['per_core']:,.0f} (the target at 10M keys: 12,000)")
    if args.skip_latency:
        return
    on_state = not args.skip_throughput and (args.preload_keys or shape.rows_per_partition > 1)
    series_keys = args.preload_keys or args.keys
    filled = (shape.rows_per_partition if args.preload_keys
              else min(shape.rows_per_partition, args.records // 3 // series_keys)) if on_state else 0
    writes = (LatencyWrites(shape, series_keys, 0, filled) if shape.rows_per_partition > 1
              else LatencyWrites(shape, args.keys, args.preload_keys, 0))
    on_backlog = {"server": "bench", "checkpoint": work / "checkpoint"} if on_state else {}
    lat = latency(broker, work, args.latency_seconds, args.rate, args.raw_partitions, args.warmup_seconds,
                  **on_backlog, writes=writes, raw_writer=args.latency_writer == "raw")
    print("latency:", json.dumps(lat, indent=1))
    print(f"target p99 < 2 s: {'met' if lat['p99_ms'] < 2000 else 'NOT met'}")


if __name__ == "__main__":
    main()
