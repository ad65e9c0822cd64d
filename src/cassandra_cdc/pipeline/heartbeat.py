"""Debezium's heartbeats, optional (``output.heartbeat_interval_ms``, Debezium's ``heartbeat.interval.ms``;
0, the default: none).

While the pipeline's query runs, the driver writes a record to ``<prefix>.<server>`` (the prefix
``output.heartbeat_topic_prefix``, Debezium's ``topic.heartbeat.prefix``, default ``__debezium-heartbeat``)
every interval, in the events' format, with Debezium's schemas: the key a struct
``io.debezium.connector.common.ServerNameKey`` with ``serverName`` (the server name), the value a struct
``io.debezium.connector.common.Heartbeat`` with ``ts_ms``, the time it was written. A consumer sees the
pipeline alive even when no table changes. The topic has one partition and, as the event topics, is
created compacted by default (``output.compacted_topics``): its key never changes, so it keeps the latest.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Producer
from pyspark.sql.streaming import StreamingQuery

from ..events.event_encoder import SchemaRegistry, StructEncoder
from ..events.field_mapping import connect_schema
from .event_sink import SinkSettings, ensure_topic
from .pipeline_config import PipelineConfig

log = logging.getLogger(__name__)

KEY_SCHEMA_NAME = "io.debezium.connector.common.ServerNameKey"
VALUE_SCHEMA_NAME = "io.debezium.connector.common.Heartbeat"
SCHEMA_VERSION = 1


def heartbeat_topic(config: PipelineConfig) -> str:
    return f"{config.output.heartbeat_topic_prefix}.{config.server}"


class HeartbeatEncoder:
    """A heartbeat's key and value in the events' format (Connect JSON, or Avro through the schema
    registry)."""

    def __init__(self, config: PipelineConfig) -> None:
        self.topic = heartbeat_topic(config)
        self._server = config.server
        registry = None if config.output.format == "json" else SchemaRegistry(
            config.output.registry_client_settings())
        self._key = StructEncoder(connect_schema(
            "struct", fields=[connect_schema("string", field="serverName")], name=KEY_SCHEMA_NAME,
            version=SCHEMA_VERSION), config.output.format, f"{self.topic}-key", registry)
        self._value = StructEncoder(connect_schema(
            "struct", fields=[connect_schema("int64", field="ts_ms")], name=VALUE_SCHEMA_NAME,
            version=SCHEMA_VERSION), config.output.format, f"{self.topic}-value", registry)

    def key(self) -> bytes:
        return self._key.encode({"serverName": self._server})

    def value(self, ts_ms: int) -> bytes:
        return self._value.encode({"ts_ms": ts_ms})


class Heartbeats:
    """Writes a heartbeat every ``output.heartbeat_interval_ms`` while ``query`` is active, from a daemon
    thread of the driver; a heartbeat Kafka does not acknowledge is logged, and the next one tried (if the
    topic cannot be created at the start, the thread ends with that error: the query goes on without
    heartbeats)."""

    def __init__(self, config: PipelineConfig, sink: SinkSettings, query: StreamingQuery) -> None:
        self._interval = config.output.heartbeat_interval_ms / 1000
        self._encoder = HeartbeatEncoder(config)
        self._sink = sink
        self._compacted = config.output.compacted_topics
        self._query = query
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)

    def start(self) -> "Heartbeats":
        self._thread.start()
        return self

    def _run(self) -> None:
        ensure_topic(self._sink.admin_settings(), self._encoder.topic, partitions=1,
                     compacted=self._compacted)
        producer = Producer(self._sink.producer_settings(acks="all"))
        key = self._encoder.key()
        try:
            while self._query.isActive:
                producer.produce(self._encoder.topic, self._encoder.value(time.time_ns() // 1_000_000), key,
                                 on_delivery=self._delivered)
                producer.poll(0)
                time.sleep(self._interval)
        finally:
            producer.flush(10)

    @staticmethod
    def _delivered(error: Any, _message: Any) -> None:
        if error is not None:
            log.warning("a heartbeat was not written: %s", error)


__all__ = ["HeartbeatEncoder", "Heartbeats", "heartbeat_topic"]
