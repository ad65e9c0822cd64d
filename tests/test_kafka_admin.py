"""Creating topics (kafka/admin.py), as the agent's publisher and the test broker do it."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource

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
