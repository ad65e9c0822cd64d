"""Table schemas as the agents publish them on the schema topic, read wherever records are decoded.

The pipeline never connects to Cassandra: a raw record names its table by id, and the schema topic
maps ids to definitions. The catalog reads the (compacted, small) topic to its end, and again when a
record names a table it does not know or a column its definition lacks (a schema change).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from ..schema import Schema, TableMetadata
from ..topics.schemas import SchemaRecord

log = logging.getLogger(__name__)

REFRESH_INTERVAL_SECONDS = 1.0


class SchemaCatalog:
    def __init__(self, bootstrap_servers: str, topic: str, consumer: dict[str, Any] | None = None) -> None:
        self._settings = {"bootstrap.servers": bootstrap_servers, "group.id": "cassandra-cdc-schema-reader",
                          "enable.auto.commit": False, "isolation.level": "read_committed", **(consumer or {})}
        self.topic = topic
        self.schema = Schema()
        self._versions: dict[uuid.UUID, str] = {}
        self._refreshed_at = float("-inf")

    def table(self, table_id: uuid.UUID, refresh: bool = True) -> tuple[TableMetadata, str] | None:
        """The latest definition of a table and its version, reading the topic again if unknown."""
        table = self.schema.table_by_id(table_id)
        if table is None and refresh and self.refresh():
            table = self.schema.table_by_id(table_id)
        return None if table is None else (table, self._versions[table_id])

    def refresh(self) -> bool:
        """Read the topic again (at most once a second); return whether it was read."""
        if time.monotonic() - self._refreshed_at < REFRESH_INTERVAL_SECONDS:
            return False
        self._refreshed_at = time.monotonic()
        consumer = Consumer(self._settings)
        try:
            metadata = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if metadata is None or metadata.error is not None:
                return True
            ends = {}
            for partition in metadata.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=10)
                if high > low:
                    ends[partition] = high
            consumer.assign([TopicPartition(self.topic, p, 0) for p in ends])
            while ends:
                for message in consumer.consume(1000, timeout=1.0):
                    if message.error() is not None:
                        continue
                    self._add(message.value())
                    if message.offset() + 1 >= ends.get(message.partition(), 0):
                        ends.pop(message.partition(), None)
        finally:
            consumer.close()
        return True

    def _add(self, value: bytes | None) -> None:
        if not value:
            return
        try:
            record = SchemaRecord.decode(value)
            table = record.table_metadata()
        except (ValueError, TypeError) as error:
            log.error("ignoring an unreadable schema record: %s", error)
            return
        self.schema.add_table(table)
        self._versions[table.id] = record.version
