"""Kafka, for every component: topic names, what goes on the topics between agent, bootstrap and pipeline,
and how they are read. Imports no Spark.

- ``raw_records``: the raw change records the agents (and bootstrap) publish and the pipeline consumes;
- ``schema_records``: the table schema records on the compacted schema topic; ``schema_catalog`` reads them;
- ``consume``: reading partitions with a consumer (offset ranges, what is queued, pausing at the end).
"""

from typing import Any


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
