"""The Kafka broker stopped and started again (real Apache Kafka, same port and data): the pipeline and the
agents wait it out and resume, and every change is one event for read_committed consumers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from cassandra_cdc.kafka.outage import names_unreachable_kafka
from cassandra_cdc.kafka.raw_records import RawRecord, record_key
from cassandra_cdc.commitlog import Mutation, MutationSerializer
from cassandra_cdc.simulator import Insert, to_mutation
from test_pipeline_faults import V1, RawPublisher, pipeline_command, read_all, stop_pipeline, wait_for

UNREACHABLE_LINE = "is unreachable"
BACK_LINE = "is back after"


def start_logged_pipeline(command: list[str], log_file: Path) -> subprocess.Popen:
    """The pipeline in its own session, its log in ``log_file``."""
    with log_file.open("wb") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def outage_lines(log_file: Path) -> tuple[list[str], list[str]]:
    lines = log_file.read_text(errors="replace").splitlines()
    return ([line for line in lines if UNREACHABLE_LINE in line and "Kafka at" in line],
            [line for line in lines if BACK_LINE in line])


def inserts(schema: Any, ids: range, now: int) -> list[tuple[bytes, bytes]]:
    """The raw records (key, value) an agent publishes for one insert per id (a single replica)."""
    records = []
    for i in ids:
        insert = Insert("app.items", {"id": i, "name": f"n{i}", "qty": i}, timestamp=now + i)
        for update in to_mutation(insert, schema).updates:
            update_bytes = MutationSerializer.serialize(Mutation([update]), 7)[1:]
            records.append((record_key(update_bytes), RawRecord("node1", 1000, 100 * i, 7, now + i,
                                                                update_bytes).encode()))
    return records


def event_ids(bootstrap_servers: str, topic: str) -> list[int]:
    return sorted(event["payload"]["after"]["id"] for event in read_all(bootstrap_servers, topic))


@pytest.mark.parametrize("failure, kafka_away", [
    # The query failures seen while the broker was stopped, as StreamingQueryException texts end.
    ("cassandra_cdc.kafka.consume.KafkaSourceError: cdc-kafka: cannot get the offsets of topic "
     'outage-mid.raw: KafkaError{code=_TRANSPORT,val=-195,str="Failed to get metadata: Local: Broker '
     'transport failure"}', True),
    ("cassandra_cdc.pipeline.event_sink.SinkError: starting batch 2 partition 0 in Kafka transaction "
     'cassandra-cdc-0 failed: KafkaError{code=_UNKNOWN_PARTITION,val=-190,str="Failed to get watermark '
     'offsets: Local: Unknown partition"}', True),
    # The driver's own metadata requests right after the broker came back.
    ('KafkaError{code=NOT_LEADER_FOR_PARTITION,val=6,str="Failed to get watermark offsets: Broker: Not '
     'leader for partition"}', True),
    ("org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired before the position for "
     "partition outage.raw-0 could be determined", True),
    # A broker of a cluster killed: the client drops its handle, failing the requests in flight to it.
    ("cassandra_cdc.kafka.consume.KafkaSourceError: cdc-kafka: cannot get the offsets of topic "
     'kafkafailover.raw: KafkaError{code=_DESTROY_BROKER,val=-137,str="Failed to get watermark offsets: '
     'Local: Broker handle destroyed without termination"}', True),
    # Not Kafka's absence: the pipeline stops on them as before.
    ("org.apache.spark.SparkException: Python worker failed to connect back.", False),
    ('KafkaError{code=TOPIC_AUTHORIZATION_FAILED,val=29,str="Broker: Topic authorization failed"}', False),
])
def test_which_query_failures_name_kafka_out_of_reach(failure: str, kafka_away: bool) -> None:
    assert names_unreachable_kafka(failure) is kafka_away


def test_the_pipeline_started_while_kafka_is_down_waits_for_it(real_kafka: Any, tmp_path: Path) -> None:
    server = "outage-start"
    publisher = RawPublisher(real_kafka.bootstrap_servers, server)
    schema = publisher.schema(V1)
    for key, value in inserts(schema, range(20), time.time_ns() // 1000):
        publisher.raw(key, value)
    publisher.close()
    log_file = tmp_path / "pipeline.log"
    real_kafka.stop()
    process = None
    try:
        process = start_logged_pipeline(pipeline_command(real_kafka, server, tmp_path, {}), log_file)
        assert wait_for(lambda: outage_lines(log_file)[0], 90), log_file.read_text()
        time.sleep(10)
        assert process.poll() is None, log_file.read_text()
    finally:
        real_kafka.start()
    try:
        assert process is not None
        topic = f"{server}.app.items"
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= 20, 180), \
            log_file.read_text()
        assert process.poll() is None
    finally:
        if process is not None:
            stop_pipeline(process)
    assert event_ids(real_kafka.bootstrap_servers, topic) == list(range(20))
    down, back = outage_lines(log_file)
    assert len(down) == 1 and len(back) == 1, "\n".join(down + back)


def test_the_pipeline_waits_out_a_broker_stopped_mid_stream_with_each_event_committed_once(
        real_kafka: Any, tmp_path: Path) -> None:
    server = "outage-mid"
    publisher = RawPublisher(real_kafka.bootstrap_servers, server)
    schema = publisher.schema(V1)
    publisher.close()
    # As an agent publishes: never giving a record up while the broker is away.
    producer = Producer({"bootstrap.servers": real_kafka.bootstrap_servers, "enable.idempotence": True,
                         "acks": "all", "message.timeout.ms": 0, "linger.ms": 5})
    now = time.time_ns() // 1000
    total = 600
    records = inserts(schema, range(total), now)
    log_file = tmp_path / "pipeline.log"
    topic = f"{server}.app.items"
    command = pipeline_command(real_kafka, server, tmp_path, {"max_offsets_per_trigger": 50})
    process = start_logged_pipeline(command, log_file)
    try:
        for key, value in records[:300]:
            producer.produce(f"{server}.raw", value, key)
        assert producer.flush(30) == 0
        # Stopped while the pipeline works through the backlog: mid-batch, maybe in a commit.
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic, "read_uncommitted")) >= 50,
                        180), log_file.read_text()
        real_kafka.stop()
        try:
            for key, value in records[300:]:  # the writes go on: queued by the producer meanwhile
                producer.produce(f"{server}.raw", value, key)
                producer.poll(0)
            time.sleep(30)
            assert process.poll() is None, log_file.read_text()
        finally:
            real_kafka.start()
        assert producer.flush(60) == 0
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= total, 300), \
            log_file.read_text()
        assert process.poll() is None, log_file.read_text()
    finally:
        stop_pipeline(process)
    assert event_ids(real_kafka.bootstrap_servers, topic) == list(range(total))
    down, back = outage_lines(log_file)
    assert len(down) == len(back) <= 1, "\n".join(down + back)
