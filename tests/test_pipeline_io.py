"""The pipeline's Kafka I/O against a real local Spark: the ``cdc-kafka`` streaming source and the tasks'
transactional / at-least-once sinks. Transactions run on real Apache Kafka (``real_kafka``), the rest on
the embedded broker (noida-db)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewPartitions
from pyspark.sql import functions as F
from typer.testing import CliRunner

from cassandra_cdc.cli.main import app

from cassandra_cdc.kafka.schema_catalog import SchemaCatalog
from cassandra_cdc.pipeline.pipeline_config import ConfigError
from cassandra_cdc.pipeline.pipeline_config import load_config as load_pipeline_config
from cassandra_cdc.pipeline.checkpoint_files import checkpoint_files
from cassandra_cdc.pipeline.streaming_job import (STATE_LAYOUT_FILE, balanced_group_keys, check_checkpoint,
                                        check_checkpoint_logs, check_state_layout, sink_settings)
from cassandra_cdc.pipeline.event_sink import (BatchCommitLog, MicroBatchTask, SinkError, SinkSettings,
                                               TransactionalProducer, TransactionalTaskSink, first_cause,
                                               task_sink)
from cassandra_cdc.pipeline.kafka_source import (KafkaInputPartition, KafkaSourceError, KafkaStreamReader, OffsetRange,
                                           SourceOptions, admit, group_ranges, read_range)
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.kafka.schema_records import SchemaRecord
from cassandra_cdc.kafka.topic_names import schema_topics
from cassandra_cdc.pipeline.spark_session import (CLASS_ARCHIVE_VARIABLE, FILE_SYSTEM_CHECKPOINT_FILES,
                                                  ROCKSDB_PROVIDER, STATE_SERVER_LOGGER, WORKER_DAEMON,
                                                  class_archive_options, kafka_format_available)
from cassandra_cdc.pipeline.schema_changes import SchemaChangeEncoder
from cassandra_cdc.pipeline.worker_daemon import without_bundled_archives
from test_schema_changes import ORDERS, RECORD, offline_config


def produce(broker, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    with Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "acks": "all"}) as producer:
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
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows") == "false"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == WORKER_DAEMON
    assert spark.sparkContext.master == "local[2,4]"  # task retries, as on a cluster
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == FILE_SYSTEM_CHECKPOINT_FILES
    # pip's PySpark ships without Spark's Kafka connector jar, and the tests add none (docs/pipeline.md);
    # the answer must not raise either way.
    assert kafka_format_available(spark) is False
    # No warning for each read of a page not written yet (millions on a large table's first load).
    state_server_log = spark._jvm.org.apache.logging.log4j.LogManager.getLogger(STATE_SERVER_LOGGER)
    assert state_server_log.isErrorEnabled() and not state_server_log.isWarnEnabled()


def test_python_workers_import_pyspark_from_the_installed_package(spark):
    """Spark puts the archive pip's PySpark bundles first on the workers' path; imported from there, every
    module is compiled again in every worker."""
    import pyspark

    bundled = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"
    assert bundled.is_file()

    def worker_imports(_: int) -> tuple[str, list[str]]:
        import sys

        import pyspark
        return pyspark.__file__, sys.path

    [(imported_from, path)] = spark.sparkContext.parallelize([0], 1).map(worker_imports).collect()
    assert imported_from == pyspark.__file__
    assert not [entry for entry in path if entry.endswith(".zip") and "pyspark" in entry]


def test_the_class_archive_make_install_wrote_is_mapped_by_a_driver_jvm(tmp_path):
    """``-Xshare:on``: a JVM that cannot map the archive (written for another JDK or other jars, or not an
    archive) does not start, where the pipeline's driver would start without it, more slowly."""
    archive = os.environ.get(CLASS_ARCHIVE_VARIABLE)
    if not archive:
        reason = f"{CLASS_ARCHIVE_VARIABLE} is not set (`make test` names the archive `make install` writes)"
        if os.environ.get("CASSANDRA_CDC_REQUIRE_JVM"):
            pytest.fail(reason)
        pytest.skip(reason)
    driver = textwrap.dedent(f"""
        from cassandra_cdc.pipeline.spark_session import class_archive_options, spark_session
        options = class_archive_options({archive!r}) + ["-Xshare:on"]
        spark = spark_session("local[1]", "class-archive-check", 1,
                              {{"spark.driver.extraJavaOptions": " ".join(options)}})
        print("rows", spark.range(3).count())
        """)
    run = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0 and "rows 3" in run.stdout, run.stdout + run.stderr
    not_an_archive = tmp_path / "not-an-archive.jsa"
    not_an_archive.write_bytes(b"\0" * 4096)
    run = subprocess.run([sys.executable, "-c", driver.replace(repr(archive), repr(str(not_an_archive)))],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode != 0 and "rows 3" not in run.stdout


def test_a_class_archive_that_is_not_there_is_named_and_left_out(tmp_path, caplog):
    missing = str(tmp_path / "spark-classes.jsa")
    assert class_archive_options(missing) == []
    assert missing in caplog.text and CLASS_ARCHIVE_VARIABLE in caplog.text


def test_only_archives_bundled_beside_their_installed_package_are_dropped(tmp_path):
    import py4j
    import pyspark

    site = Path(pyspark.__file__).parents[1]
    assert Path(py4j.__file__).parents[1] == site
    bundled = [str(path) for path in sorted((site / "pyspark" / "python" / "lib").glob("*.zip"))]
    assert len(bundled) == 2  # pyspark.zip and py4j's
    # A Spark distribution's archives are the only copy of PySpark its processes have: they stay, whatever
    # the directory is named.
    distribution = tmp_path / "pyspark" / "python" / "lib"
    distribution.mkdir(parents=True)
    (distribution / "pyspark.zip").touch()
    path = [*bundled, str(distribution / "pyspark.zip"), str(site), str(tmp_path)]
    assert without_bundled_archives(path) == [str(distribution / "pyspark.zip"), str(site), str(tmp_path)]
    # Without the installed package's directory on the path, the archives are how PySpark is imported.
    assert without_bundled_archives(bundled) == bundled


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


def test_source_reads_committed_transactions_only(spark, real_kafka, tmp_path):
    """Transaction markers and aborted records take offsets; batches still end where they should, also
    when they start after an abort of the producer that commits the next records (real Kafka: noida-db
    lists stale aborted transactions in fetch responses and hides those)."""
    topic = "source-transactions"
    real_kafka.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": real_kafka.bootstrap_servers, "transactional.id": "test-source"})
    producer.init_transactions(30)
    expected = []
    for round_ in range(6):
        producer.begin_transaction()
        records = [(i % 2, b"r%d-%d" % (round_, i), b"x") for i in range(10)]
        for partition, key, value in records:
            producer.produce(topic, value, key, partition=partition)
        if round_ % 3 == 1:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            expected += records
    producer.close()
    batches = run_available_now(spark, real_kafka, topic, tmp_path / "checkpoint", max_offsets=7)
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
    transactional.close()
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


def test_source_emitting_offset_ranges_plans_them_in_one_task_and_read_range_reads_them(spark, broker, tmp_path):
    """``emit=offsetRanges``: rows name each Kafka partition's offsets of the batch, in one task; reading
    those ranges with ``read_range`` gives every record once, as ``emit=records`` would."""
    topic = "source-ranges"
    broker.create_topic(topic, 3)
    records = [(i % 3, b"k%d" % i, b"v%d" % i) for i in range(900)]
    produce(broker, topic, records)
    options = {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic, "emit": "offsetRanges"}
    reader = KafkaStreamReader(SourceOptions.parse(options))
    [task] = reader.partitions({"0": 0, "1": 100, "2": 0}, {"0": 300, "1": 300, "2": 0})
    batch = next(reader.read(task))
    assert batch.to_pylist() == [{"topic": topic, "partition": 0, "startOffset": 0, "endOffset": 300},
                                 {"topic": topic, "partition": 1, "startOffset": 100, "endOffset": 300}]

    batches = []
    query = (spark.readStream.format("cdc-kafka").options(**options).option("maxOffsetsPerTrigger", 400).load()
             .writeStream.foreachBatch(lambda df, _: batches.append(df.collect()))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None and len(batches) == 3
    source = SourceOptions.parse(options)
    read = [(row.partition, message.key(), message.value()) for rows in batches for row in rows
            for messages in read_range(source, OffsetRange(row.partition, row.startOffset, row.endOffset))
            for message in messages]
    assert sorted(read) == sorted(records)
    with pytest.raises(KafkaSourceError, match="emit must be"):
        SourceOptions.parse({**options, "emit": "everything"})


# --- sink.py ---------------------------------------------------------------------------------------

def write_task(settings: SinkSettings, task: MicroBatchTask, topic: str, count: int,
               fail: bool = False) -> TransactionalTaskSink:
    """What a stateful task does with its sink: ``count`` records, then commit (or abort, as a failed task)."""
    sink = task_sink(settings, task)
    for i in range(count):
        sink.produce(topic, b"%d" % i, b"b%d-p%d-%d" % (task.batch_id, task.partition, i))
    if fail:
        sink.abort()
    else:
        sink.commit()
    return sink  # type: ignore[return-value]


def test_transactional_task_sink_commits_each_partition_of_a_batch_once(real_kafka):
    output = "replay-output"
    real_kafka.create_topic(output, 2)
    settings = SinkSettings(real_kafka.bootstrap_servers, "replay-commits", "test-replay")
    for partition in (0, 1):
        assert write_task(settings, MicroBatchTask(0, partition, "query-1"), output, 250).records == 250
    # Batch 0 again, after a crash before Spark recorded it: every partition is already committed.
    for partition in (0, 1):
        again = write_task(settings, MicroBatchTask(0, partition, "query-1"), output, 250)
        assert again.skipped and again.records == 0
    assert write_task(settings, MicroBatchTask(1, 0, "query-1"), output, 10).records == 10
    # So does a process that never wrote them (a new Python worker): this one, with a commit log of its own.
    commits = BatchCommitLog({"bootstrap.servers": real_kafka.bootstrap_servers}, "replay-commits")
    try:
        assert [commits.last_batch(f"test-replay-{p}", "query-1") for p in (0, 1, 2)] == [1, 0, None]
        assert commits.last_batch("test-replay-0", "another-query") is None  # a new checkpoint starts over
    finally:
        commits.close()
    values = [value for _, _, _, value in read_topic(real_kafka, output)]
    assert sorted(values) == sorted([b"b0-p%d-%d" % (p, i) for p in (0, 1) for i in range(250)]
                                    + [b"b1-p0-%d" % i for i in range(10)])
    markers = [json.loads(value) for _, _, _, value in read_topic(real_kafka, "replay-commits")]
    assert sorted((m["partition"], m["batch_id"], m["records"]) for m in markers) == [(0, 0, 250), (0, 1, 10),
                                                                                       (1, 0, 250)]


def test_transactional_task_sink_of_a_failed_task_leaves_nothing_visible(real_kafka):
    output = "abort-output"
    real_kafka.create_topic(output, 1)
    settings = SinkSettings(real_kafka.bootstrap_servers, "abort-commits", "test-abort")
    failed = write_task(settings, MicroBatchTask(0, 0, "query-1"), output, 300, fail=True)
    assert failed.records == 300 and not failed.skipped  # produced in a transaction, then aborted
    assert read_topic(real_kafka, output) == []
    assert read_topic(real_kafka, "abort-commits") == []
    # The retry of the task writes it, once.
    assert write_task(settings, MicroBatchTask(0, 0, "query-1"), output, 300).records == 300
    assert len(read_topic(real_kafka, output)) == 300


def test_transactional_producer_kept_by_a_worker_is_replaced_after_another_wrote_its_partition(real_kafka):
    """Workers keep their transactional producers across batches. When a partition moves to another
    worker, that worker's producer fences the first one; the first worker must notice (the other's
    commit marker) and register a new producer instead of failing its next batch."""
    output = "kept-producer-output"
    real_kafka.create_topic(output, 1)
    settings = SinkSettings(real_kafka.bootstrap_servers, "kept-producer-commits", "test-kept")

    def in_worker(worker: dict, batch_id: int) -> tuple[int, bool]:
        """Run one task as the given worker process would, with that worker's kept clients."""
        kept = TransactionalProducer._instances, BatchCommitLog._instances
        TransactionalProducer._instances, BatchCommitLog._instances = worker["producers"], worker["commits"]
        try:
            sink = write_task(settings, MicroBatchTask(batch_id, 0, "query-1"), output, 3)
            return sink.records, sink.skipped
        finally:
            TransactionalProducer._instances, BatchCommitLog._instances = kept

    first, second = ({"producers": {}, "commits": {}} for _ in range(2))
    assert in_worker(first, 0) == (3, False)
    assert in_worker(first, 1) == (3, False)
    kept_producer = next(iter(first["producers"].values()))
    assert in_worker(second, 2) == (3, False)  # registers the id again: fences the first worker's producer
    assert in_worker(first, 3) == (3, False)
    assert next(iter(first["producers"].values())) is not kept_producer
    assert in_worker(second, 3) == (0, True)  # a replay of batch 3 elsewhere: already committed
    assert in_worker(first, 4) == (3, False)
    values = [value for _, _, _, value in read_topic(real_kafka, output)]
    assert values == [b"b%d-p0-%d" % (batch_id, i) for batch_id in range(5) for i in range(3)]


def test_a_checkpoint_of_an_earlier_transactional_id_goes_on_without_a_duplicate(real_kafka):
    """Versions that named every query ``cassandra-cdc`` wrote their markers under ``cassandra-cdc-<p>``. On
    the checkpoint such a version wrote, the query renamed skips what that run committed, and fences an
    attempt of that run still open under the earlier id, which then cannot commit."""
    output, commit_topic = "renamed-output", "renamed-commits"
    real_kafka.create_topic(output, 1)
    earlier_name = f"renamed-earlier-{uuid.uuid4().hex[:8]}"
    earlier = SinkSettings(real_kafka.bootstrap_servers, commit_topic, earlier_name)
    for batch_id in (0, 1):
        assert write_task(earlier, MicroBatchTask(batch_id, 0, "query-1"), output, 3).records == 3
    # A task of batch 2 of the earlier run, still running: its transaction is open when the new one starts.
    stale = Producer({"bootstrap.servers": real_kafka.bootstrap_servers,
                      "transactional.id": f"{earlier_name}-0"})
    stale.init_transactions(30)
    stale.begin_transaction()
    stale.produce(output, b"stale", b"stale-b2")
    stale.flush(30)

    renamed = SinkSettings(real_kafka.bootstrap_servers, commit_topic, "renamed-now", (earlier_name,))
    replay = write_task(renamed, MicroBatchTask(1, 0, "query-1"), output, 3)
    assert replay.skipped and replay.records == 0
    assert write_task(renamed, MicroBatchTask(2, 0, "query-1"), output, 3).records == 3
    with pytest.raises(KafkaException):
        stale.commit_transaction(30)
    # Another checkpoint (query id) under the earlier name is not this one's.
    assert write_task(renamed, MicroBatchTask(0, 0, "query-2"), output, 1).records == 1
    values = [value for _, _, _, value in read_topic(real_kafka, output)]
    assert values == [b"b%d-p0-%d" % (batch_id, i) for batch_id in range(3) for i in range(3)] + [b"b0-p0-0"]


def test_a_task_whose_transaction_outlives_its_timeout_fails_saying_which_setting_to_change(real_kafka):
    """Kafka aborts a transaction open longer than its transaction.timeout.ms (a task of a large batch): the
    task fails naming the setting, and nothing it wrote is visible; with the default timeout it goes through."""
    output = "timed-out-output"
    real_kafka.create_topic(output, 1)
    short = SinkSettings(real_kafka.bootstrap_servers, "timed-out-commits", "test-timed-out",
                         producer=(("transaction.timeout.ms", 2000),))
    sink = task_sink(short, MicroBatchTask(0, 0, "query-1"))
    sink.produce(output, b"early", b"written within the timeout")
    wait_until_aborted(real_kafka, output)
    with pytest.raises(SinkError, match=r"open for \d+ s, longer than its transaction.timeout.ms \(2000 ms\)"):
        sink.produce(output, b"late", b"written after it")
        sink.commit()
    assert read_topic(real_kafka, output) == []
    default = SinkSettings(real_kafka.bootstrap_servers, "timed-out-commits", "test-timed-out")
    assert write_task(default, MicroBatchTask(0, 0, "query-1"), output, 3).records == 3
    assert len(read_topic(real_kafka, output)) == 3


def wait_until_aborted(broker, topic: str) -> None:
    """Until the broker has aborted the one transaction open on ``topic`` (partition 0): its end marker
    written, a read_committed consumer's end of the partition is its end for all consumers. The broker
    checks for transactions open too long every second (the test broker's setting), later when loaded."""
    partition = TopicPartition(topic, 0)
    committed = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "test-abort-wait",
                          "isolation.level": "read_committed"})
    uncommitted = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "test-abort-wait",
                            "isolation.level": "read_uncommitted"})
    try:
        deadline = time.monotonic() + 60
        while True:
            stable = committed.get_watermark_offsets(partition, timeout=10, cached=False)[1]
            end = uncommitted.get_watermark_offsets(partition, timeout=10, cached=False)[1]
            if stable == end > 1:  # past the record and the abort marker
                return
            assert time.monotonic() < deadline, f"the transaction on {topic} is open (ends {stable}, {end})"
            time.sleep(0.2)
    finally:
        committed.close()
        uncommitted.close()


def test_a_transaction_timeout_the_brokers_refuse_is_named(real_kafka):
    """Kafka's brokers accept transactions up to transaction.max.timeout.ms (15 minutes by default)."""
    settings = SinkSettings(real_kafka.bootstrap_servers, "too-long-commits", "test-too-long",
                            producer=(("transaction.timeout.ms", 900_001),))
    with pytest.raises(SinkError, match=r"shorter transaction.timeout.ms than this one \(900001 ms\)"):
        task_sink(settings, MicroBatchTask(0, 0, "query-1")).produce("too-long-output", b"k", b"v")


def create_topic_refusing_large_records(broker, topic: str) -> None:
    """``topic`` with 1 partition whose broker refuses a record over 1 KiB (``MSG_SIZE_TOO_LARGE``)."""
    from confluent_kafka.admin import NewTopic

    admin = broker.admin()  # kept until the creation's answer: a destroyed client fails it
    [created] = admin.create_topics([NewTopic(topic, 1, config={"max.message.bytes": "1024"})]).values()
    created.result()


@pytest.mark.parametrize("exactly_once", [True, False])
def test_a_task_with_a_record_the_broker_refuses_fails(real_kafka, exactly_once):
    output = f"refused-record-{exactly_once}".lower()
    create_topic_refusing_large_records(real_kafka, output)
    settings = SinkSettings(real_kafka.bootstrap_servers, "refused-record-commits",
                            f"test-refused-{exactly_once}", exactly_once=exactly_once)
    sink = task_sink(settings, MicroBatchTask(0, 0, "query-1"))
    sink.produce(output, b"small", b"fits")
    # Under the client's 1 MB limit, so sent; over the topic's even compressed (random bytes): refused.
    sink.produce(output, b"large", os.urandom(4096))
    with pytest.raises(SinkError, match="records were not delivered.*MSG_SIZE_TOO_LARGE"):
        sink.commit()
    if exactly_once:  # the transaction was aborted: neither record, nor a marker, is visible
        assert read_topic(real_kafka, output) == []
        assert read_topic(real_kafka, "refused-record-commits") == []


def test_records_purged_after_a_failed_transaction_do_not_hide_why_it_failed():
    """The delivery reports of records purged from the queue can come before the refused record's (the
    order the failure above saw once in CI); the message names the refusal."""
    purged = [KafkaError(KafkaError._PURGE_QUEUE), KafkaError(KafkaError._PURGE_INFLIGHT)]
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    assert first_cause([*purged, refused, purged[0]]) is refused
    assert first_cause(purged) is purged[0]  # nothing else to name
    assert first_cause(["no offset for a record of t [0]", refused]) == "no offset for a record of t [0]"


def test_a_task_sink_needs_a_streaming_task(spark):
    with pytest.raises(SinkError, match="not in a task"):
        MicroBatchTask.current()  # the driver: no task, no batch id
    rows = spark.range(1).rdd.map(lambda _: MicroBatchTask.current()).collect
    with pytest.raises(Exception, match="not in a task"):
        rows()  # a task outside of a streaming query has no batch id


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
    catalog = SchemaCatalog.shared(broker.bootstrap_servers, (topic,))
    assert SchemaCatalog.shared(broker.bootstrap_servers, (topic,)) is catalog
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
    producer.close()


def test_a_definition_older_than_the_one_held_does_not_replace_it(real_kafka, caplog):
    """An agent whose node applies a DROP later than the others' publishes the table without the DROP after
    they published it with: the catalog keeps the newer definition, whose dropped column decodes the
    records written before the DROP; a later change is taken."""
    topic = f"catalog-late-{uuid.uuid4().hex[:8]}"
    table_id = "6c0e7a10-0000-4000-8000-0000000000e1"
    create = f"CREATE TABLE ks.t (id int PRIMARY KEY, a text, b int) WITH ID = {table_id} AND cdc = true;"
    with Producer({"bootstrap.servers": real_kafka.bootstrap_servers, "acks": "all"}) as producer:
        def publish(cql: str, node: str) -> str:
            record = SchemaRecord.of(parse_schema(cql).table("ks", "t"), node)
            producer.produce(topic, record.encode(), record.key)
            assert producer.flush(30) == 0
            return record.version

        before = publish(create, "node3")
        dropped = publish(create + " ALTER TABLE ks.t DROP b USING TIMESTAMP 1700000000000000;", "node1")
        publish(create, "node3")  # late: node3 had not applied the DROP yet
        catalog = SchemaCatalog(real_kafka.bootstrap_servers, (topic,))
        try:
            with caplog.at_level("WARNING", logger="cassandra_cdc"):
                assert catalog.refresh() is True
            table, version = catalog.table(uuid.UUID(table_id))
            assert version == dropped != before
            assert [c.name for c in table.dropped] == ["b"] and [c.name for c in table.columns] == ["id", "a"]
            assert [r.getMessage() for r in caplog.records if "node3" in r.getMessage() and "lacks b" in
                    r.getMessage()] != []
            added = publish(create + " ALTER TABLE ks.t DROP b USING TIMESTAMP 1700000000000000;"
                            " ALTER TABLE ks.t ADD c int;", "node2")
            assert catalog.refresh() is True and catalog.table(uuid.UUID(table_id))[1] == added
            # b added again: a definition from between its DROP and its ADD, published late, is older too
            drop = " ALTER TABLE ks.t DROP b USING TIMESTAMP 1700000000000000; ALTER TABLE ks.t ADD c int;"
            added_again = publish(create + drop + " ALTER TABLE ks.t ADD b int;", "node1")
            publish(create + drop, "node3")
            assert catalog.refresh() is True
            table, version = catalog.table(uuid.UUID(table_id))
            assert version == added_again and [c.name for c in table.columns] == ["id", "a", "b", "c"]
            # dropped again later: taken
            dropped_again = publish(create + drop + " ALTER TABLE ks.t ADD b int;"
                                    " ALTER TABLE ks.t DROP b USING TIMESTAMP 1700000000000001;", "node2")
            assert catalog.refresh() is True and catalog.table(uuid.UUID(table_id))[1] == dropped_again
        finally:
            catalog.close()


def test_a_definition_written_before_the_one_held_does_not_replace_it(real_kafka, caplog):
    """An agent that starts while its node has not applied an ALTER TYPE ADD publishes the table as it was
    before: it lacks no column, yet its records need the newer type's field. Which definition is older is
    when each was written to its node's ``system_schema``, as each agent read it: the catalog keeps the
    newer, and takes a later one."""
    topic = f"catalog-times-{uuid.uuid4().hex[:8]}"
    table_id = "6c0e7a10-0000-4000-8000-0000000000e2"

    def cql(fields: str, comment: str = "") -> str:
        return (f"CREATE TYPE ks.addr ({fields}); CREATE TABLE ks.t (id int PRIMARY KEY, home frozen<addr>) "
                f"WITH ID = {table_id} AND cdc = true AND comment = '{comment}';")

    with Producer({"bootstrap.servers": real_kafka.bootstrap_servers, "acks": "all"}) as producer:
        def publish(cql: str, node: str, defined_at: int) -> str:
            table = parse_schema(cql).table("ks", "t")
            table.defined_at = defined_at
            record = SchemaRecord.of(table, node)
            producer.produce(topic, record.encode(), record.key)
            assert producer.flush(30) == 0
            return record.version

        publish(cql("street text"), "node1", defined_at=1_000)
        newer = publish(cql("street text, city text"), "node1", defined_at=2_000)
        publish(cql("street text"), "node3", defined_at=1_000)  # node3's agent starts, its node behind
        catalog = SchemaCatalog(real_kafka.bootstrap_servers, (topic,))
        try:
            with caplog.at_level("WARNING", logger="cassandra_cdc"):
                assert catalog.refresh() is True
            table, version = catalog.table(uuid.UUID(table_id))
            assert version == newer and table.columns[1].type.field_names == ("street", "city")
            assert [r.getMessage() for r in caplog.records if "node3" in r.getMessage()
                    and "it was defined at 1970-01-01T00:00:00.001000+00:00" in r.getMessage()] != []
            later = publish(cql("street text, city text", comment="later"), "node2", defined_at=3_000)
            assert catalog.refresh() is True and catalog.table(uuid.UUID(table_id))[1] == later
        finally:
            catalog.close()


def test_the_catalog_reads_the_schemas_an_earlier_version_published_on_the_server_topic(real_kafka, caplog):
    """Versions before published the table schemas on ``<server>``: after an upgrade the catalog reads them
    there first, then ``<server>.table-schemas``, whose definitions replace them; records on ``<server>`` that
    are not table schemas (the pipeline's schema change events) are skipped without an error."""
    server = "upgraded"
    old, new = schema_topics(server)
    assert (old, new) == (server, f"{server}.table-schemas")
    ids = {"kept": "6c0e7a10-0000-4000-8000-0000000000d1", "altered": "6c0e7a10-0000-4000-8000-0000000000d2"}
    with Producer({"bootstrap.servers": real_kafka.bootstrap_servers, "acks": "all"}) as producer:
        def publish(topic: str, name: str, columns: str) -> None:
            cql = (f"CREATE TABLE ks.{name} (id int PRIMARY KEY{columns}) WITH ID = {ids[name]} "
                   "AND cdc = true;")
            record = SchemaRecord.of(parse_schema(cql).table("ks", name), "node1")
            producer.produce(topic, record.encode(), record.key)

        publish(old, "kept", ", a text")
        publish(old, "altered", ", a text")
        changes = SchemaChangeEncoder(offline_config(server))  # a record as the pipeline writes it
        producer.produce(old, changes.value(RECORD, ORDERS, "CREATE", 1), changes.key("shop"))
        publish(new, "altered", ", a text, b int")
        assert producer.flush(30) == 0
    catalog = SchemaCatalog(real_kafka.bootstrap_servers, (old, new))
    try:
        with caplog.at_level("ERROR", logger="cassandra_cdc"):
            assert catalog.refresh() is True
        assert [[c.name for c in catalog.table(uuid.UUID(ids[name]))[0].columns] for name in ids] == [
            ["id", "a"], ["id", "a", "b"]]
        assert caplog.records == []
        assert catalog.refresh() is False
    finally:
        catalog.close()


def test_at_least_once_task_sink_creates_topics_and_writes_replays_again(broker):
    output = "at-least-once-output"  # does not exist: the tasks create it
    settings = SinkSettings(broker.bootstrap_servers, "unused-commits", "test-alo", exactly_once=False,
                            topic_partitions=3)
    for _ in range(2):  # a replay writes again
        assert write_task(settings, MicroBatchTask(0, 0, "query-1"), output, 400).records == 400
    values = [value for _, _, _, value in read_topic(broker, output, "read_uncommitted")]
    assert len(values) == 800 and len(set(values)) == 400
    assert len(broker.admin().list_topics(output, timeout=10).topics[output].partitions) == 3


# --- job.py: how state is laid out -----------------------------------------------------------------

@pytest.mark.parametrize("groups, partitions", [(8, 2), (12, 2), (12, 3)])
def test_raw_partitions_are_spread_evenly_over_the_state_partitions(spark, groups, partitions):
    keys = balanced_group_keys(spark, groups, partitions)
    assert len(set(keys)) == groups
    # The shuffle in front of the stateful operator: hash partitioning of the grouping key.
    placed = (spark.createDataFrame([(key,) for key in keys], "group bigint").repartition(partitions, "group")
              .groupBy(F.spark_partition_id().alias("partition")).count().collect())
    assert sorted(row["count"] for row in placed) == [groups // partitions] * partitions


def check_local_state_layout(config, raw_partitions):
    check_state_layout(checkpoint_files(config.checkpoint, None), config, raw_partitions)


def test_a_checkpoint_refuses_another_state_layout(tmp_path):
    def config(shuffle_partitions: int = 2, pages: int = 256):
        return load_pipeline_config(None, {"server": "s", "checkpoint": str(tmp_path / "checkpoint"),
                                           "kafka.bootstrap_servers": "127.0.0.1:1",
                                           "spark.shuffle_partitions": shuffle_partitions,
                                           "spark.state_pages": pages})

    check_local_state_layout(config(), None)  # a new checkpoint, before the raw topic exists
    check_local_state_layout(config(), 12)  # the raw topic's partitions are recorded once it exists
    check_local_state_layout(config(), 12)
    with pytest.raises(ConfigError, match="raw_topic.partitions 12 → 16"):
        check_local_state_layout(config(), 16)
    with pytest.raises(ConfigError, match="spark.shuffle_partitions 2 → 4"):
        check_local_state_layout(config(4), 12)
    with pytest.raises(ConfigError, match="spark.state_pages 256 → 1024"):
        check_local_state_layout(config(pages=1024), 12)
    # A checkpoint with offsets but no record of its layout, or another version of it, was written by an
    # earlier pipeline.
    older = tmp_path / "older"
    (older / "offsets").mkdir(parents=True)
    (older / "offsets" / "0").write_text("v1")
    older_config = load_pipeline_config(None, {"server": "s", "checkpoint": str(older),
                                               "kafka.bootstrap_servers": "127.0.0.1:1"})
    with pytest.raises(ConfigError, match="earlier version"):
        check_local_state_layout(older_config, 12)
    (older / "cassandra-cdc-state.json").write_text(json.dumps({"version": 2, "state.buckets": 64}))
    with pytest.raises(ConfigError, match="earlier version"):
        check_local_state_layout(older_config, 12)
    # The layout before pages (version 3) is read: recorded as version 5 with the configured pages, its groups
    # paged as they are written; the layout before leaves (4) too, with its pages (test_pipeline_upgrade.py).
    (older / "cassandra-cdc-state.json").write_text(json.dumps(
        {"version": 3, "spark.shuffle_partitions": 2, "raw_topic.partitions": 12}))
    check_local_state_layout(older_config, 12)
    assert json.loads((older / "cassandra-cdc-state.json").read_text()) == {
        "version": 5, "spark.shuffle_partitions": 2, "raw_topic.partitions": 12, "spark.state_pages": 256}
    (older / "cassandra-cdc-state.json").write_text(json.dumps(
        {"version": 4, "spark.shuffle_partitions": 2, "raw_topic.partitions": 12, "spark.state_pages": 64}))
    with pytest.raises(ConfigError, match="spark.state_pages 64 → 256"):
        check_local_state_layout(older_config, 12)
    # A damaged record of the layout is named, whatever it holds.
    for damaged in ('{"version": 3, "spark.shuff', "[3, 2]"):
        (older / "cassandra-cdc-state.json").write_text(damaged)
        with pytest.raises(ConfigError, match=r"older/cassandra-cdc-state.json .*restore the checkpoint"):
            check_local_state_layout(older_config, 12)


def test_an_empty_checkpoint_is_refused_once_the_pipeline_committed_output(broker, tmp_path):
    """A lost checkpoint would make a new query that writes every event again: the commit topic's markers
    show the pipeline ran, and only --reset-checkpoint starts it over then."""
    server = f"fresh-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"

    def config(**overrides):
        return load_pipeline_config(None, {"server": server, "checkpoint": str(checkpoint),
                                           "kafka.bootstrap_servers": broker.bootstrap_servers, **overrides})

    check_checkpoint(config())  # a first start
    settings = SinkSettings(broker.bootstrap_servers, f"{server}.pipeline-commits", "cassandra-cdc",
                            topic_partitions=1)
    write_task(settings, MicroBatchTask(0, 1, "the-lost-query"), f"{server}.app.users", 3)
    result = CliRunner().invoke(app, ["pipeline", "--bootstrap-servers", broker.bootstrap_servers,
                                      "--server", server, "--checkpoint", str(checkpoint)])
    assert result.exit_code == 2
    [line] = result.output.splitlines()
    assert str(checkpoint) in line and f"{server}.pipeline-commits" in line and "--reset-checkpoint" in line
    check_checkpoint(config(reset_checkpoint=True))
    (checkpoint / "offsets").mkdir(parents=True)
    offsets = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"0":{"0":3}}'  # as Spark writes them
    (checkpoint / "offsets" / "0").write_text(offsets)
    check_checkpoint(config())  # the checkpoint has progress: a restart


def test_a_damaged_checkpoint_file_is_named_in_one_line(spark, broker, tmp_path):
    server = f"damaged-{uuid.uuid4().hex[:8]}"
    broker.create_topic(f"{server}.raw", 1)
    produce(broker, f"{server}.raw", [(0, b"k%d" % i, b"v%d" % i) for i in range(4)])
    checkpoint = tmp_path / "checkpoint"
    run_available_now(spark, broker, f"{server}.raw", checkpoint, max_offsets=2)  # Spark's own batch logs
    (checkpoint / "cassandra-cdc-state.json").write_text(json.dumps(
        {"version": 3, "spark.shuffle_partitions": 2, "raw_topic.partitions": 1}))
    config = load_pipeline_config(None, {"server": server, "checkpoint": str(checkpoint),
                                         "kafka.bootstrap_servers": broker.bootstrap_servers})
    check_checkpoint_logs(checkpoint_files(config.checkpoint, None))
    damaged = max((checkpoint / "offsets").glob("[0-9]*"), key=lambda path: int(path.name))
    damaged.write_bytes(damaged.read_bytes()[:-7] + b"\x00garbage")
    result = CliRunner().invoke(app, ["pipeline", "--bootstrap-servers", broker.bootstrap_servers,
                                      "--server", server, "--checkpoint", str(checkpoint)])
    assert result.exit_code == 2
    [line] = result.output.splitlines()
    assert str(damaged) in line and "restore the checkpoint" in line


@pytest.mark.parametrize("checkpoint", ["s3a://bucket/ckpt", "hdfs://namenode:8020/cdc/ckpt",
                                        "file:///tmp/ckpt"])
def test_a_hadoop_checkpoint_uri_reaches_spark_untouched(checkpoint):
    config = load_pipeline_config(None, {"server": "s", "checkpoint": checkpoint,
                                         "kafka.bootstrap_servers": "127.0.0.1:1"})
    assert config.checkpoint == checkpoint


def test_a_checkpoint_outside_this_host_is_checked_once_spark_runs(tmp_path):
    config = load_pipeline_config(None, {"server": "s", "checkpoint": "s3a://bucket/ckpt",
                                         "kafka.bootstrap_servers": "127.0.0.1:1"})
    assert checkpoint_files(config.checkpoint, None) is None
    check_checkpoint(config)  # no Kafka, no S3 reached before Spark starts


def test_a_file_uri_checkpoint_is_read_and_written_through_hadoop(spark, broker, tmp_path):
    server = f"hadoop-{uuid.uuid4().hex[:8]}"
    broker.create_topic(f"{server}.raw", 1)
    produce(broker, f"{server}.raw", [(0, b"k%d" % i, b"v%d" % i) for i in range(4)])
    directory = tmp_path / "checkpoint"
    config = load_pipeline_config(None, {"server": server, "checkpoint": f"file://{directory}",
                                         "kafka.bootstrap_servers": broker.bootstrap_servers})
    check_checkpoint(config, spark)  # a new checkpoint
    assert json.loads((directory / STATE_LAYOUT_FILE).read_text()) == {
        "version": 5, "spark.shuffle_partitions": 2, "spark.state_pages": 256, "raw_topic.partitions": 1}
    # Hadoop's local file system writes a checksum beside each file: the layout file went through it.
    assert (directory / f".{STATE_LAYOUT_FILE}.crc").exists()
    run_available_now(spark, broker, f"{server}.raw", directory, max_offsets=2)  # Spark's own batch logs
    check_checkpoint(config)  # before Spark: the same files, read locally
    check_checkpoint(config, spark)
    damaged = max((directory / "offsets").glob("[0-9]*"), key=lambda path: int(path.name))
    damaged.write_bytes(damaged.read_bytes()[:-7] + b"\x00garbage")
    location = f"file://{directory}/offsets/{damaged.name}"
    with pytest.raises(ConfigError, match=rf"checkpoint file {location} is damaged"):
        check_checkpoint(config, spark)


@pytest.mark.parametrize("compacted", [True, False])
def test_the_tasks_create_event_topics_compacted_and_the_errors_topic_not(broker, tmp_path, compacted):
    """Debezium's change topics are compacted, tombstones making compaction forget deleted rows; the errors
    topic is a log, never compacted (output.compacted_topics)."""
    from confluent_kafka.admin import ConfigResource

    server = f"compaction-{uuid.uuid4().hex[:8]}"
    config = load_pipeline_config(None, {"server": server, "checkpoint": str(tmp_path / "checkpoint"),
                                         "kafka.bootstrap_servers": broker.bootstrap_servers,
                                         "output.exactly_once": False, "output.compacted_topics": compacted})
    assert config.output.tombstones  # Debezium's default
    settings = sink_settings(config)
    events, errors = f"{server}.ks.t", config.errors_topic
    for topic in (events, errors):
        write_task(settings, MicroBatchTask(0, 0, "query-1"), topic, 1)
    admin = broker.admin()
    policies = {topic: admin.describe_configs([ConfigResource("topic", topic)])[ConfigResource("topic",
                                                                                               topic)]
                .result()["cleanup.policy"].value for topic in (events, errors)}
    assert policies == {events: "compact" if compacted else "delete", errors: "delete"}
