"""Creating topics (kafka/admin.py), as the agent's publisher and the test broker do it."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource

from agent_harness import Harness, running, wait_until
from cassandra_cdc.agent.publisher import Publisher
from cassandra_cdc.simulator import EmbeddedBroker


def _partitions_and_cleanup(broker: EmbeddedBroker, topic: str) -> tuple[int, str]:
    admin = broker.admin()
    partitions = len(admin.list_topics(topic, timeout=10).topics[topic].partitions)
    [config] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return partitions, config.result()["cleanup.policy"].value


def test_missing_topics_are_created_and_existing_ones_left_as_they_are(broker: EmbeddedBroker) -> None:
    suffix = uuid.uuid4().hex[:8]
    existing, raw, schemas = (f"topics-{name}-{suffix}" for name in ("existing", "raw", "schemas"))
    broker.create_topic(existing, 2)
    broker.create_topic(existing, 5, compacted=True)  # exists: nothing to do
    publisher = Publisher(broker.bootstrap_servers, 64 * 1024 * 1024)
    publisher.ensure_topics({existing: (7, True), raw: (3, False), schemas: (1, True)})
    assert _partitions_and_cleanup(broker, existing) == (2, "delete")
    assert _partitions_and_cleanup(broker, raw) == (3, "delete")
    assert _partitions_and_cleanup(broker, schemas) == (1, "compact")


def test_a_topic_kafka_refuses_to_create_is_named_in_the_error(broker: EmbeddedBroker) -> None:
    topic = f"refused-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(broker.bootstrap_servers, 64 * 1024 * 1024)
    with pytest.raises(KafkaException, match=f"^cannot create topic {topic}: ") as refused:
        publisher.ensure_topics({topic: (0, False)})
    assert refused.value.args[0].code() == KafkaError.INVALID_PARTITIONS  # what the agent's startup looks at


def test_a_created_topic_answers_for_every_partition_at_once(real_kafka) -> None:
    """Once ``create_missing_topics`` returns, each partition's leader answers: a client's first request
    (here the end offsets; for the sink, its first produce) does not find the topic unknown."""
    from confluent_kafka import Consumer, TopicPartition

    from cassandra_cdc.kafka.admin import create_missing_topics

    admin = real_kafka.admin()
    consumer = Consumer({"bootstrap.servers": real_kafka.bootstrap_servers, "group.id": "unused"})
    try:
        for attempt in range(5):
            topic = f"ready-{attempt}-{uuid.uuid4().hex[:8]}"
            create_missing_topics(admin, {topic: (3, False)}, 30.0)
            for partition in range(3):
                assert consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30,
                                                      cached=False) == (0, 0)
    finally:
        consumer.close()


def auto_created(real_kafka: Any, topic: str) -> None:
    """``topic`` as a broker with auto.create.topics.enable (Kafka's default, on here) makes it when a client
    asks for its metadata before anyone created it: with the broker's num.partitions, one."""
    producer = Producer({"bootstrap.servers": real_kafka.bootstrap_servers})
    deadline = time.monotonic() + 30
    while (metadata := producer.list_topics(topic, timeout=10).topics[topic]).error is not None:
        assert time.monotonic() < deadline, f"the broker did not auto-create {topic}: {metadata.error}"
        time.sleep(0.2)
    assert len(metadata.partitions) == 1


def partition_count(real_kafka: Any, topic: str) -> int:
    return len(real_kafka.admin().list_topics(topic, timeout=10).topics[topic].partitions)


def test_an_auto_created_empty_raw_topic_is_grown_to_the_configured_partitions(
        real_kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(tmp_path, real_kafka)
    auto_created(real_kafka, h.raw_topic)
    with caplog.at_level(logging.WARNING, "cassandra_cdc.agent"), running(h.config()) as agent:
        wait_until(lambda: agent.not_ready() is None, "the agent tailing")
        assert partition_count(real_kafka, h.raw_topic) == 3
        h.write(50)  # synced every 25: all of them
        reader = h.raw_reader()
        reader.wait_for(lambda: reader.has_all(h.expected), "every change published")
    h.close()
    assert set(reader.by_partition) == {0, 1, 2}
    warnings = [r.getMessage() for r in caplog.records if "kafka.raw_topic_partitions" in r.getMessage()]
    assert warnings == [f"the raw topic {h.raw_topic} had 1 partition(s), fewer than "
                        "kafka.raw_topic_partitions (3): something else created it (a broker with "
                        "auto.create.topics.enable creates a topic a client asks about); it held no record, "
                        "so it now has 3"]


def test_an_auto_created_raw_topic_holding_records_is_left_as_it_is_and_said_once(
        real_kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(tmp_path, real_kafka)
    auto_created(real_kafka, h.raw_topic)
    producer = Producer({"bootstrap.servers": real_kafka.bootstrap_servers})
    producer.produce(h.raw_topic, b"a record of before", b"key")
    assert producer.flush(30) == 0
    with caplog.at_level(logging.WARNING, "cassandra_cdc.agent"), running(h.config()) as agent:
        wait_until(lambda: agent.not_ready() is None, "the agent tailing")
        h.write(25)  # synced every 25: all of them
        consumer = Consumer({"bootstrap.servers": real_kafka.bootstrap_servers, "group.id": "unused"})
        try:
            wait_until(lambda: consumer.get_watermark_offsets(TopicPartition(h.raw_topic, 0), timeout=10,
                                                              cached=False)[1] == 1 + len(h.expected),
                       "every change published after the record already there")
        finally:
            consumer.close()
    assert partition_count(real_kafka, h.raw_topic) == 1
    warnings = [r.getMessage() for r in caplog.records if "kafka.raw_topic_partitions" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"the raw topic {h.raw_topic} has 1 partition(s), fewer than "
                                  "kafka.raw_topic_partitions (3), and holds records: it is left as it is")
