"""Publishing a table's schema to the schema topic before the first record that needs it, and its drop."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Callable

from confluent_kafka import KafkaError, Message

from ..kafka.schema_records import SchemaRecord
from ..schema import TableMetadata
from .publisher import Publisher

log = logging.getLogger(__name__)


class SchemaPublisher:
    def __init__(self, publisher: Publisher, schema_topic: str, node_id: str, stopping: threading.Event,
                 while_blocked: Callable[[], bool]) -> None:
        self._publisher = publisher
        self._schema_topic = schema_topic
        self._node_id = node_id
        self._stopping = stopping
        self._while_blocked = while_blocked
        # Per table id: the version of its schema last published.
        self._published: dict[uuid.UUID, str] = {}

    def ensure_published(self, table: TableMetadata) -> bool:
        """Publish (and wait for) the table's schema unless this version is published; False if stopped
        meanwhile."""
        version = table.version_hash()
        if self._published.get(table.id) == version:
            return True
        if not self._publish(SchemaRecord.of(table, self._node_id)):
            return False
        self._published[table.id] = version
        log.info("published the schema of %s (version %s)", table.qualified_name, version)
        return True

    def publish_dropped(self, table: TableMetadata) -> bool:
        """Publish (and wait for) the drop of the table, with its last definition; False if stopped
        meanwhile."""
        if not self._publish(SchemaRecord.of(table, self._node_id, dropped=True)):
            return False
        self._published.pop(table.id, None)
        log.info("published the drop of %s (id %s)", table.qualified_name, table.id)
        return True

    def _publish(self, record: SchemaRecord) -> bool:
        delivered: list[tuple[KafkaError | None, Message]] = []
        self._publisher.publish(self._schema_topic, record.key, record.encode(),
                                lambda error, message: delivered.append((error, message)), self._while_blocked)
        while not delivered and not self._stopping.is_set():
            self._publisher.poll(0.05)
        return bool(delivered) and self._publisher.check(*delivered[0])
