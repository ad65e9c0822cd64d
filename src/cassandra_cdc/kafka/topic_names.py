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
        """Where the agents and the bootstrap publish table schemas."""
        return self.kafka.schema_topic or default_schema_topic(self.server)

    @property
    def schema_topics_read(self) -> tuple[str, ...]:
        """Where table schemas are read from, in this order (see ``schema_topics``)."""
        return schema_topics(self.server, self.kafka.schema_topic)

    @property
    def errors_topic(self) -> str:
        return self.kafka.errors_topic or f"{self.server}.errors"


# The last part of the default schema topic's name: with a hyphen, which no keyspace or table name has, so
# that it is never the topic of a table's events (``<server>.<keyspace>.<table>``) of any server.
SCHEMA_TOPIC_SUFFIX = "table-schemas"


def default_schema_topic(server: str) -> str:
    return f"{server}.{SCHEMA_TOPIC_SUFFIX}"


def schema_topics(server: str, configured: str | None = None) -> tuple[str, ...]:
    """The topics table schemas are read from, older first: the configured one; by default
    ``<server>.table-schemas`` after ``<server>``, where versions before it published them (``<server>``
    is the name of Debezium's schema change topic; the catalog skips records that are not table schemas)."""
    return (configured,) if configured else (server, default_schema_topic(server))


def event_topic(server: str, qualified_table: str) -> str:
    """The topic the pipeline writes a table's events to: ``<server>.<keyspace>.<table>``."""
    return f"{server}.{qualified_table}"


__all__ = ["RAW_TOPIC_PARTITIONS", "ServerTopics", "default_schema_topic", "event_topic", "schema_topics"]
