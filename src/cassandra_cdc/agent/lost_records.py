"""At start: has the raw topic lost records Kafka had acknowledged to this agent?

A broker restarted without records it had acknowledged (``acks`` or ``min.insync.replicas`` too low, an
unclean leader election) leaves its partitions ending before offsets the agent saw acknowledged. The agent
running at that moment learns it from its producer (``OUT_OF_ORDER_SEQUENCE_NUMBER``); a restarted one
would carry on past the gap. So the agent keeps, with its positions, the highest offset Kafka acknowledged
per partition, and compares it with the partitions' ends when it starts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ..kafka.admin import admin_settings
from .agent_config import AgentConfig

WATERMARK_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class LostPartition:
    partition: int
    end: int  # the partition's high watermark: the offset its next record gets
    acknowledged: int  # the highest offset Kafka had acknowledged to this agent

    @property
    def records(self) -> int:
        """How many of the records Kafka acknowledged are gone, at least."""
        return self.acknowledged - self.end + 1


class LostRecords(RuntimeError):
    """The raw topic no longer holds records Kafka had acknowledged to this agent."""


class LostRecordsUnknown(RuntimeError):
    """The partitions' ends could not be read: whether records were lost is not known."""


def lost_partitions(config: AgentConfig, topic: str, acknowledged: dict[int, int]) -> list[LostPartition]:
    """The partitions of a topic that end at or before an offset Kafka had acknowledged."""
    if not acknowledged:
        return []
    consumer = Consumer(_client_settings(config))
    try:
        lost = []
        for partition, offset in sorted(acknowledged.items()):
            _, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), WATERMARK_TIMEOUT_SECONDS)
            if end <= offset:
                lost.append(LostPartition(partition, end, offset))
        return lost
    except KafkaException as error:
        raise LostRecordsUnknown(f"cannot read where the partitions of {topic} end ({error.args[0].str()}), to "
                                 "check that Kafka kept every record it acknowledged: start the agent again "
                                 "when Kafka answers") from None
    finally:
        consumer.close()


def describe_loss(topic: str, lost: list[LostPartition]) -> str:
    """One line: which partitions lost what, and what to do."""
    partitions = ", ".join(f"partition {p.partition} ends at offset {p.end} but Kafka had acknowledged this "
                           f"agent's record at offset {p.acknowledged}" for p in lost)
    return (f"Kafka lost records it had acknowledged: {topic} {partitions} ({sum(p.records for p in lost)} records "
            "gone at least; a broker restarted without them, or an unclean leader election). The agent cannot "
            "publish again what it already cleaned up: run bootstrap for the affected tables, and fix the brokers' "
            "durability (acks=all needs min.insync.replicas >= 2, unclean.leader.election.enable=false)")


def _client_settings(config: AgentConfig) -> dict[str, Any]:
    """A consumer that only reads offsets, connecting as the agent's producer does (security settings)."""
    connection = admin_settings(config.kafka.librdkafka(config.kafka.producer))
    return {**connection, "group.id": f"cassandra-cdc-agent-{uuid.uuid4().hex}", "enable.auto.commit": False}
