"""The pipeline's Kafka I/O against a real broker (noida-db) and a real local Spark: the ``cdc-kafka``
streaming source and the transactional / at-least-once sinks."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewPartitions
from pyspark.sql import functions as F

import pyarrow as pa

from cassandra_cdc.pipeline.catalog import SchemaCatalog
from cassandra_cdc.pipeline.config import ConfigError
from cassandra_cdc.pipeline.config import load_config as load_pipeline_config
from cassandra_cdc.pipeline.job import balanced_bucket_keys, check_state_layout
from cassandra_cdc.pipeline.sink import KafkaAtLeastOnceSink, KafkaTransactionalSink, _CommitLog, _TransactionalProducer
from cassandra_cdc.pipeline.source import (KafkaInputPartition, KafkaSourceError, KafkaStreamReader, OffsetRange,
                                           SourceOptions, admit, group_ranges)
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.topics.schemas import SchemaRecord
from cassandra_cdc.pipeline.spark import (FILE_SYSTEM_CHECKPOINT_FILES, ROCKSDB_PROVIDER, WORKER_DAEMON,
                                         kafka_format_available)


def produce(broker, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "acks": "all"})
    for partition, key, value in records:
        producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


def read_topic(broker, topic: str, isolation: str = "read_committed") -> list[tuple[int, int, bytes, bytes]]:
    """Everything in ``topic`` up to its end, as ``(partition, offset, key, value)``."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "test-reader",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, partition, 0) for partition in partitions])
        records, at_end = [], set()
        deadline = time.monotonic() + 30
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, f"{topic} was not read to its end"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                at_end.add(message.partition())
                continue
            records.append((message.partition(), message.offset(), message.key(), message.value()))
        return records
    finally:
        consumer.close()


def run_available_now(spark, broker, topic: str, checkpoint: Path, max_offsets: int,
                      max_partitions: int | None = None) -> list[list[tuple]]:
    """Run ``cdc-kafka`` on ``topic`` until it has read what was there at start; rows per micro-batch."""
    batches: list[list[tuple]] = []

    def collect(df, batch_id):
        batches.append([tuple(row) for row in df.collect()])

    query = (spark.readStream.format("cdc-kafka")
             .option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("subscribe", topic)
             .option("maxOffsetsPerTrigger", max_offsets)
             .option("maxPartitions", str(max_partitions or "none"))
             .load()
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    assert query.exception() is None
    return batches


# --- spark.py --------------------------------------------------------------------------------------

def test_session_settings(spark):
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass") == ROCKSDB_PROVIDER
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == WORKER_DAEMON
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == FILE_SYSTEM_CHECKPOINT_FILES
    # No connector jar on this platform (platform-notes.md); the answer must not raise either way.
    assert kafka_format_available(spark) is False


# --- source.py -------------------------------------------------------------------------------------

def test_source_options():
    options = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "SUBSCRIBE": "t",
                                   "kafka.security.protocol": "SSL", "maxOffsetsPerTrigger": "none",
                                   "kafka.isolation.level": "read_uncommitted"})
    assert (options.topic, options.max_offsets_per_trigger, options.fail_on_data_loss) == ("t", None, True)
    config = options.consumer_config()
    assert config["security.protocol"] == "SSL" and config["isolation.level"] == "read_uncommitted"
    assert config["enable.auto.commit"] is False
    defaults = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t"})
    assert defaults.max_offsets_per_trigger == 100_000 and defaults.consumer_config()["isolation.level"] == \
        "read_committed"
    for bad in ({"subscribe": "t"}, {"kafka.bootstrap.servers": "h:1", "subscribe": "a,b"},
                {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"}):
        with pytest.raises(KafkaSourceError):
            SourceOptions.parse(bad)


def test_admit_spreads_the_limit_and_always_admits_one():
    assert admit({0: 10, 1: 0, 2: 5}, 100) == {0: 10, 1: 0, 2: 5}
    assert sum(admit({0: 10, 1: 0, 2: 5}, 7).values()) == 7
    assert admit({0: 100, 1: 3}, 5) == {0: 4, 1: 1}  # a small backlog is not starved by a big one
    assert sum(admit({0: 1, 1: 1, 2: 1}, 1).values()) == 1
    assert admit({0: 0, 1: 0}, 10) == {0: 0, 1: 0}


def test_read_tasks_group_partitions_by_offsets():
    ranges = [OffsetRange(partition, 0, size) for partition, size in enumerate([100, 10, 60, 50, 5])]
    assert group_ranges(ranges, None) == [[r] for r in ranges]
    assert group_ranges(ranges, 5) == [[r] for r in ranges]
    groups = group_ranges(ranges, 2)
    assert sorted(r for group in groups for r in group) == sorted(ranges)  # each range once
    assert sorted(sum(r.end - r.start for r in group) for group in groups) == [110, 115]
    assert all(group == sorted(group) for group in groups)
    with pytest.raises(KafkaSourceError, match="maxPartitions"):
        SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxPartitions": "0"})


def test_source_reads_every_record_once_in_bounded_batches_and_resumes(spark, broker, tmp_path):
    topic = "source-topic"
    broker.create_topic(topic, 3)
    first = [(i % 3, b"k%d" % i, b"v%d" % i) for i in range(1500)]
    produce(broker, topic, first)
    checkpoint = tmp_path / "checkpoint"

    batches = run_available_now(spark, broker, topic, checkpoint, max_offsets=500, max_partitions=2)
    assert [len(rows) for rows in batches] == [500, 500, 500]
    rows = [row for batch in batches for row in batch]
    key, value, topic_name, partition, offset, timestamp, timestamp_type = rows[0]
    assert (topic_name, timestamp_type) == (topic, 0) and timestamp is not None
    assert sorted((row[3], row[1], row[0]) for row in rows) == sorted((p, v, k) for p, k, v in first)
    for kafka_partition in range(3):
        offsets = [row[4] for row in rows if row[3] == kafka_partition]
        assert offsets == list(range(500))  # in order, once each

    # More records, and a partition added to the topic: a restart reads only what is new.
    admin = broker.admin()  # must outlive the future
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    second = [(i % 4, b"k%d" % i, b"w%d" % i) for i in range(400)]
    produce(broker, topic, second)
    batches = run_available_now(spark, broker, topic, checkpoint, max_offsets=500)
    rows = [row for batch in batches for row in batch]
    assert sorted((row[3], row[1], row[0]) for row in rows) == sorted((p, v, k) for p, k, v in second)
    assert sorted(row[4] for row in rows if row[3] == 0) == list(range(500, 600))
    assert sorted(row[4] for row in rows if row[3] == 3) == list(range(100))


def test_source_reads_committed_transactions_only(spark, broker, tmp_path):
    """Transaction markers and aborted records take offsets; batches still end where they should.

    The aborted transactions come from a producer that never commits: noida-db misreports aborted
    transactions (see test_noida_hides_commits_after_an_abort_of_the_same_producer)."""
    topic = "source-transactions"
    broker.create_topic(topic, 2)
    committer, aborter = (Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": name})
                          for name in ("test-source-committer", "test-source-aborter"))
    committer.init_transactions(30)
    aborter.init_transactions(30)
    expected = []
    for round_ in range(6):
        producer = aborter if round_ % 3 == 1 else committer
        producer.begin_transaction()
        records = [(i % 2, b"r%d-%d" % (round_, i), b"x") for i in range(10)]
        for partition, key, value in records:
            producer.produce(topic, value, key, partition=partition)
        if producer is aborter:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            expected += records
    batches = run_available_now(spark, broker, topic, tmp_path / "checkpoint", max_offsets=7)
    rows = [row for batch in batches for row in batch]
    assert sorted((row[3], row[0]) for row in rows) == sorted((p, k) for p, k, _ in expected)
    assert len(batches) > 1


def test_source_task_reads_exact_ranges_with_the_consumer_it_keeps(broker):
    """A Python worker keeps one consumer for its read tasks: each range gives exactly its records, in
    any order of ranges (a replay reads an earlier one again), also when it ends with a transaction's
    commit marker, an offset that is never delivered."""
    topic = "kept-consumer"
    broker.create_topic(topic, 2)
    produce(broker, topic, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(400)])
    transactional = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "kept-consumer"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    transactional.produce(topic, b"in-transaction", b"t", partition=0)
    transactional.commit_transaction(30)  # offsets 200 (record) and 201 (commit marker) of partition 0
    reader = KafkaStreamReader(SourceOptions.parse({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                                   "subscribe": topic}))

    def read(*ranges: tuple[int, int, int]) -> list[bytes]:
        batches = reader.read(KafkaInputPartition(topic, [OffsetRange(*r) for r in ranges]))
        return [value for batch in batches for value in batch.column("value").to_pylist()]

    expected = {partition: [b"v%d" % i for i in range(partition, 400, 2)] for partition in (0, 1)}
    assert read((0, 0, 50)) == expected[0][:50]
    assert read((1, 100, 200)) == expected[1][100:]
    assert read((0, 150, 202)) == expected[0][150:] + [b"in-transaction"]
    assert read((0, 20, 60)) == expected[0][20:60]
    assert read((1, 0, 10)) == expected[1][:10]
    assert read((1, 5, 8), (0, 190, 202), (1, 0, 2)) == expected[1][5:8] + expected[0][190:] + [b"in-transaction"] \
        + expected[1][:2]  # a task reading several ranges


@pytest.mark.xfail(strict=True, reason="noida-db 0.2.3 lists stale aborted transactions in fetch responses")
def test_noida_hides_commits_after_an_abort_of_the_same_producer(broker):
    """Kafka's FetchResponse lists only the aborted transactions overlapping the fetched range;
    noida-db lists every aborted transaction of the partition, so a read_committed consumer that
    starts after an abort takes the producer's later, committed batches for aborted ones.
    (Fixed in noida-db? Then this fails as XPASS: remove it and the caveats in pipeline/sink.py.)"""
    topic = "noida-stale-aborts"
    broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "test-noida"})
    producer.init_transactions(30)
    for round_, abort in enumerate((False, True, False)):
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, b"x", b"r%d-%d" % (round_, i), partition=0)
        if abort:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    # Offsets: 0-2 committed, 3 commit marker, 4-6 aborted, 7 abort marker, 8-10 committed, 11 marker.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "test-noida",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 8)])
    offsets = []
    while (message := consumer.poll(10)) is not None and not message.error():
        offsets.append(message.offset())
    consumer.close()
    assert offsets == [8, 9, 10]


# --- sink.py ---------------------------------------------------------------------------------------

def events(spark, topic: str, count: int, partitions: int = 2):
    """A static DataFrame of ``count`` serialized events in ``partitions`` Spark partitions."""
    return (spark.range(0, count, numPartitions=partitions)
            .select(F.lit(topic).alias("topic"),
                    F.col("id").cast("string").cast("binary").alias("key"),
                    F.concat(F.lit("event-"), F.col("id").cast("string")).cast("binary").alias("value")))


def test_transactional_sink_stream_exactly_once_across_replays(spark, broker, tmp_path):
    source, output = "sink-input", "sink-output"
    broker.create_topic(source, 3)
    broker.create_topic(output, 2)
    produce(broker, source, [(i % 3, b"k%d" % i, b"v%d" % i) for i in range(2000)])
    sink = KafkaTransactionalSink(broker.bootstrap_servers, "sink-commits", "test-stream")
    reports = []

    def write(df, batch_id):
        reports.append(sink.write_batch(df, batch_id))

    def run(checkpoint):
        query = (spark.readStream.format("cdc-kafka")
                 .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                 .option("subscribe", source).option("maxOffsetsPerTrigger", 800).load()
                 .select(F.lit(output).alias("topic"), "key", "value")
                 .writeStream.foreachBatch(write)
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    checkpoint = tmp_path / "checkpoint"
    run(checkpoint)
    assert len(reports) == 3 and sum(report.records for report in reports) == 2000

    def committed_values():
        values = [value for _, _, _, value in read_topic(broker, output)]
        assert len(values) == len(set(values))  # no duplicates
        return values

    assert sorted(committed_values()) == sorted(b"v%d" % i for i in range(2000))

    # A driver crash after the sink wrote the last batch but before Spark recorded it: Spark runs it
    # again on restart, with the same offsets; every partition is already committed.
    last = max(int(path.name) for path in (checkpoint / "commits").iterdir() if path.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    shutil.rmtree(checkpoint / "commits" / ".crc", ignore_errors=True)
    for crc in (checkpoint / "commits").glob(f".{last}.crc"):
        crc.unlink()
    reports.clear()
    run(checkpoint)
    assert [report.batch_id for report in reports] == [last]
    assert reports[0].records == 0 and reports[0].partitions_skipped and not reports[0].partitions_written
    assert len(committed_values()) == 2000


def test_transactional_sink_replayed_batch_is_skipped(spark, broker):
    output = "replay-output"
    broker.create_topic(output, 2)
    sink = KafkaTransactionalSink(broker.bootstrap_servers, "replay-commits", "test-replay")
    df = events(spark, output, 500)
    first = sink.write_batch(df, 0)
    assert first.records == 500 and first.partitions_written == [0, 1]
    again = sink.write_batch(df, 0)  # the same batch after a crash
    assert again.records == 0 and again.partitions_skipped == [0, 1]
    # A new sink object (a restarted driver) finds the markers as well.
    assert KafkaTransactionalSink(broker.bootstrap_servers, "replay-commits", "test-replay") \
        .write_batch(df, 0).partitions_skipped == [0, 1]
    assert sink.write_batch(events(spark, output, 10), 1).records == 10
    # So does a process that never wrote them (a new Python worker): this one.
    commits = _CommitLog.of({"bootstrap.servers": broker.bootstrap_servers}, "replay-commits")
    try:
        assert [commits.last_batch(f"test-replay-{p}", None) for p in (0, 1, 2)] == [1, 1, None]
    finally:
        commits.close()
    values = [value for _, _, _, value in read_topic(broker, output)]
    assert len(values) == 510 and len(set(values)) == 500
    markers = [json.loads(value) for _, _, _, value in read_topic(broker, "replay-commits")]
    assert sorted((m["partition"], m["batch_id"]) for m in markers) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_transactional_sink_aborts_a_failed_task(spark, broker):
    output = "abort-output"
    broker.create_topic(output, 1)

    class CrashBeforeCommit(KafkaTransactionalSink):
        def _produce_marker(self, producer, key, value):
            producer.flush(30)  # the records are on the broker, in the open transaction
            # Only builtins in here: the class is pickled by value into Spark's Python workers, which
            # cannot import this test module.
            raise RuntimeError(f"task for {key} crashes before committing")

    failing = CrashBeforeCommit(broker.bootstrap_servers, "abort-commits", "test-abort")
    with pytest.raises(Exception, match="crashes before committing"):
        failing.write_batch(events(spark, output, 300), 0)
    # Produced, then aborted. (When the first task fails, Spark may cancel the other before it writes.)
    assert len(read_topic(broker, output, "read_uncommitted")) in (150, 300)
    assert read_topic(broker, output) == []
    assert read_topic(broker, "abort-commits") == []

    # The retry of the batch writes it, once.
    retry = KafkaTransactionalSink(broker.bootstrap_servers, "abort-commits", "test-abort")
    assert retry.write_batch(events(spark, output, 300), 0).records == 300
    assert len(read_topic(broker, output)) == 300


def test_transactional_producer_kept_by_a_worker_is_replaced_after_another_wrote_its_partition(broker):
    """Workers keep their transactional producers across batches. When a partition moves to another
    worker, that worker's producer fences the first one; the first worker must notice (the other's
    commit marker) and register a new producer instead of failing its next batch."""
    output = "kept-producer-output"
    broker.create_topic(output, 1)
    sink = KafkaTransactionalSink(broker.bootstrap_servers, "kept-producer-commits", "test-kept")
    sink._prepare()

    def rows(batch_id: int) -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pydict({"topic": [output] * 3, "key": [b"k"] * 3,
                                            "value": [b"b%d-%d" % (batch_id, i) for i in range(3)]})]

    def in_worker(worker: dict, batch_id: int) -> tuple[int, bool]:
        """Run one task as the given worker process would, with that worker's kept clients."""
        kept = _TransactionalProducer._instances, _CommitLog._instances
        _TransactionalProducer._instances, _CommitLog._instances = worker["producers"], worker["commits"]
        try:
            return sink._write_partition(iter(rows(batch_id)), 0, batch_id, "query-1")
        finally:
            _TransactionalProducer._instances, _CommitLog._instances = kept

    first, second = ({"producers": {}, "commits": {}} for _ in range(2))
    assert in_worker(first, 0) == (3, False)
    assert in_worker(first, 1) == (3, False)
    kept_producer = next(iter(first["producers"].values()))
    assert in_worker(second, 2) == (3, False)  # registers the id again: fences the first worker's producer
    assert in_worker(first, 3) == (3, False)
    assert next(iter(first["producers"].values())) is not kept_producer
    assert in_worker(second, 3) == (0, True)  # a replay of batch 3 elsewhere: already committed
    assert in_worker(first, 4) == (3, False)
    values = [value for _, _, _, value in read_topic(broker, output)]
    assert values == [b"b%d-%d" % (batch_id, i) for batch_id in range(5) for i in range(3)]


def test_schema_catalog_is_shared_and_reads_only_what_is_new(broker):
    topic = "catalog-schemas"
    broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})

    def publish(cql: str) -> None:
        table = parse_schema(cql).table("ks", "t")
        record = SchemaRecord.of(table, "cluster")
        producer.produce(topic, record.encode(), record.key)
        assert producer.flush(30) == 0

    table_id = "6c0e7a10-0000-4000-8000-0000000000c1"
    catalog = SchemaCatalog.shared(broker.bootstrap_servers, topic)
    assert SchemaCatalog.shared(broker.bootstrap_servers, topic) is catalog
    assert catalog.refresh() is False  # nothing published yet
    publish(f"CREATE TABLE ks.t (id int PRIMARY KEY, a text) WITH ID = {table_id} AND cdc = true;")
    found = catalog.table(uuid.UUID(table_id))
    assert found is not None and [c.name for c in found[0].columns] == ["id", "a"]
    assert catalog.refresh() is False  # nothing new: nothing read
    publish(f"CREATE TABLE ks.t (id int PRIMARY KEY, a text, b int) WITH ID = {table_id} AND cdc = true;")
    assert catalog.refresh() is True
    table, version = catalog.table(uuid.UUID(table_id))
    assert [c.name for c in table.columns] == ["id", "a", "b"] and version != found[1]
    assert catalog.table(uuid.UUID(table_id).bytes) == (table, version)  # as records carry the id
    catalog.close()


def test_at_least_once_sink_creates_topics(spark, broker):
    output = "at-least-once-output"  # does not exist: the tasks create it
    sink = KafkaAtLeastOnceSink(broker.bootstrap_servers, topic_partitions=3)
    assert sink.write_batch(events(spark, output, 400), 0).records == 400
    assert sink.write_batch(events(spark, output, 400), 0).records == 400  # a replay writes again
    records = read_topic(broker, output, "read_uncommitted")
    values = [value for _, _, _, value in records]
    assert len(values) == 800 and len(set(values)) == 400
    assert len(broker.admin().list_topics(output, timeout=10).topics[output].partitions) == 3
    with pytest.raises(Exception, match="lacks columns"):
        sink.write_batch(spark.range(3), 1)


# --- job.py: how state is laid out -----------------------------------------------------------------

@pytest.mark.parametrize("buckets, partitions", [(8, 2), (16, 2), (12, 3)])
def test_state_buckets_are_spread_evenly_over_the_state_partitions(spark, buckets, partitions):
    keys = balanced_bucket_keys(spark, buckets, partitions)
    assert len(set(keys)) == buckets
    # The shuffle in front of the stateful operator: hash partitioning of the grouping key.
    placed = (spark.createDataFrame([(key,) for key in keys], "bucket bigint").repartition(partitions, "bucket")
              .groupBy(F.spark_partition_id().alias("partition")).count().collect())
    assert sorted(row["count"] for row in placed) == [buckets // partitions] * partitions


def test_a_checkpoint_refuses_other_state_settings(tmp_path):
    def config(buckets: int = 8):
        return load_pipeline_config(None, {"server": "s", "checkpoint": str(tmp_path / "checkpoint"),
                                           "kafka.bootstrap_servers": "127.0.0.1:1", "state.buckets": buckets})

    check_state_layout(config())  # a new checkpoint records its settings
    check_state_layout(config())
    with pytest.raises(ConfigError, match="state.buckets 8 → 16"):
        check_state_layout(config(16))
    # A checkpoint with offsets but no record of its layout was written before the layout was recorded.
    older = tmp_path / "older"
    (older / "offsets").mkdir(parents=True)
    (older / "offsets" / "0").write_text("v1")
    with pytest.raises(ConfigError, match="earlier version"):
        check_state_layout(load_pipeline_config(None, {"server": "s", "checkpoint": str(older),
                                                       "kafka.bootstrap_servers": "127.0.0.1:1"}))
