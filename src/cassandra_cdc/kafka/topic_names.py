"""The topics' names, as every component derives them, and the raw topic's partitions when it is created."""

from typing import Any

# Partitions of the raw topic as the agents (kafka.raw_topic_partitions) and the bootstrap create it.
RAW_TOPIC_PARTITIONS = 12


class ServerTopics:
    """The topic names every component derives from ``server`` unless configured (``kafka.*_topic``)."""

    server: str
    kafka: Any  # has raw_topic, schema_topic and errors_topic (None: the default)

    @property
    def raw_topic(self) -> str:
        return self.kafka.raw_topic or f"{self.server}.raw"

    @property
    def schema_topic(self) -> str:
        return self.kafka.schema_topic or self.server

    @property
    def errors_topic(self) -> str:
        return self.kafka.errors_topic or f"{self.server}.errors"


def event_topic(server: str, qualified_table: str) -> str:
    """The topic the pipeline writes a table's events to: ``<server>.<keyspace>.<table>``."""
    return f"{server}.{qualified_table}"


__all__ = ["RAW_TOPIC_PARTITIONS", "ServerTopics", "event_topic"]
