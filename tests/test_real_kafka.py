"""The real Apache Kafka broker of :mod:`cassandra_cdc.localcluster`: what the agent and the pipeline
rely on (idempotent and transactional producers, read_committed consumers) and a broker that keeps
what it acknowledged across a clean restart and a kill -9."""

from __future__ import annotations

import subprocess
import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from cassandra_cdc.kafka.consume import TopicFollower


def read_partition(bootstrap_servers: str, topic: str, isolation: str,
                   start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of partition 0 of ``topic`` from ``start`` to its end, under ``isolation``."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"reader-{topic}",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, start)])
    records = []
    deadline = time.monotonic() + 30
    try:
        while True:
            assert time.monotonic() < deadline, f"{topic} was not read to its end"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return records
            records.append((message.offset(), message.value()))
    finally:
        consumer.close()


def test_transactions_commit_and_abort_as_read_committed_consumers_see_them(real_kafka):
    topic = "real-transactions"
    real_kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": real_kafka.bootstrap_servers, "transactional.id": "test-real",
                         "enable.idempotence": True, "acks": "all"})
    producer.init_transactions(30)
    for round_, abort in enumerate((False, True, False)):
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, b"r%d-%d" % (round_, i), partition=0)
        if abort:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    producer.close()
    # Offsets: 0-2 committed, 3 commit marker, 4-6 aborted, 7 abort marker, 8-10 committed, 11 marker.
    committed = [(0, b"r0-0"), (1, b"r0-1"), (2, b"r0-2"), (8, b"r2-0"), (9, b"r2-1"), (10, b"r2-2")]
    assert read_partition(real_kafka.bootstrap_servers, topic, "read_committed") == committed
    uncommitted = read_partition(real_kafka.bootstrap_servers, topic, "read_uncommitted")
    assert [value for _, value in uncommitted if value.startswith(b"r1-")] == [b"r1-0", b"r1-1", b"r1-2"]
    # Starting after the abort, the later commits stay visible (noida-db hides them: test_pipeline_io).
    assert read_partition(real_kafka.bootstrap_servers, topic, "read_committed", start=8) == committed[3:]


def produce_acknowledged(bootstrap_servers: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "acks": "all"})
    failures = []

    def delivered(error: KafkaError | None, _: object) -> None:
        if error is not None:
            failures.append(error)

    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0 and failures == []
    producer.close()


def test_a_topic_follower_reads_past_a_transaction_marker_once(real_kafka):
    """A transaction's records are followed by its marker, an offset never delivered: once read to it, the
    follower has nothing new (every merge task refreshes the schema catalog this way, every micro-batch)."""
    real_kafka.create_topic("followed", 1)
    producer = Producer({"bootstrap.servers": real_kafka.bootstrap_servers,
                         "transactional.id": "followed-writer"})
    producer.init_transactions(30)
    follower = TopicFollower({"bootstrap.servers": real_kafka.bootstrap_servers, "group.id": "follower",
                              "enable.partition.eof": True, "isolation.level": "read_committed"}, 30)
    try:
        for value in (b"first", b"second"):
            producer.begin_transaction()
            producer.produce("followed", value, b"key")
            producer.commit_transaction(30)
            read: list[bytes] = []
            deadline = time.monotonic() + 30
            # The commit returns before the markers are written: the record is visible a moment later.
            while not read and time.monotonic() < deadline:
                assert follower.read("followed", lambda message: read.append(message.value())) == bool(read)
            assert read == [value]
            assert not follower.read("followed", read.append)  # only the marker is past the record
    finally:
        follower.close()


def test_acknowledged_messages_survive_a_restart_and_a_kill(real_kafka):
    topic = "real-restarts"
    real_kafka.create_topic(topic, 1)
    produce_acknowledged(real_kafka.bootstrap_servers, topic, [b"before-restart-%d" % i for i in range(100)])
    real_kafka.restart()
    produce_acknowledged(real_kafka.bootstrap_servers, topic, [b"before-kill-%d" % i for i in range(100)])
    pid = real_kafka.pid
    real_kafka.kill()
    assert not real_kafka.running
    real_kafka.start()
    assert real_kafka.pid != pid
    values = [value for _, value in read_partition(real_kafka.bootstrap_servers, topic, "read_committed")]
    assert values == ([b"before-restart-%d" % i for i in range(100)]
                      + [b"before-kill-%d" % i for i in range(100)])


# Run in its own process: the suite's Spark session was started without the connector on its classpath.
SPARK_COPY = """
import sys
from pathlib import Path
import pyspark
from cassandra_cdc.localcluster import artifacts
from cassandra_cdc.pipeline.spark_session import spark_session

servers, source, sink = sys.argv[1:]
jars = artifacts.spark_kafka_jars(Path(pyspark.__file__).parent / "jars")
spark = spark_session(app_name="kafka-connector", extra_conf={"spark.jars": ",".join(map(str, jars))})
kafka = {"kafka.bootstrap.servers": servers}
records = spark.read.format("kafka").options(**kafka).option("subscribe", source).load()
records.selectExpr("key", "upper(cast(value as string)) as value").write.format("kafka") \\
    .options(**kafka).option("topic", sink).save()
spark.stop()
"""


def test_spark_reads_and_writes_the_real_broker_with_the_fetched_connector(real_kafka):
    """Spark's built-in ``kafka`` format, from the connector `make install` fetched, in both directions."""
    source, sink = "real-spark-source", "real-spark-sink"
    real_kafka.create_topic(source, 1)
    real_kafka.create_topic(sink, 1)
    produce_acknowledged(real_kafka.bootstrap_servers, source, [b"value-%d" % i for i in range(20)])
    result = subprocess.run([sys.executable, "-c", SPARK_COPY, real_kafka.bootstrap_servers, source, sink],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    values = [value for _, value in read_partition(real_kafka.bootstrap_servers, sink, "read_committed")]
    assert sorted(values) == sorted(b"VALUE-%d" % i for i in range(20))
