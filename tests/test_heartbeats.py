"""Debezium's heartbeats from the pipeline (``output.heartbeat_interval_ms``) on a real Kafka broker: none by
default; when set, records on ``__debezium-heartbeat.<server>`` with Debezium's key and value schemas
(``io.debezium.connector.common.ServerNameKey``, ``...Heartbeat``), every interval while the pipeline runs,
which Kafka Connect's own JsonConverter reads and writes back unchanged."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from agent_harness import TopicReader, wait_until
from conftest import RAW_TOPIC_PARTITIONS
from test_connect_json import json_converter_round_trip

from cassandra_cdc.kafka.admin import create_missing_topics
from cassandra_cdc.pipeline.pipeline_config import load_config
from cassandra_cdc.pipeline.streaming_job import start

SERVER = "beating"
TOPIC = f"__debezium-heartbeat.{SERVER}"
# Debezium's heartbeat schemas (its SchemaFactory), as Kafka's JsonConverter writes them.
KEY = {"schema": {"type": "struct", "fields": [{"type": "string", "optional": False, "field": "serverName"}],
                  "optional": False, "name": "io.debezium.connector.common.ServerNameKey", "version": 1},
       "payload": {"serverName": SERVER}}
VALUE_SCHEMA = {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}],
                "optional": False, "name": "io.debezium.connector.common.Heartbeat", "version": 1}


def pipeline(broker: Any, spark: Any, server: str, checkpoint: Path, **output: Any) -> Any:
    """The pipeline of ``server`` (its raw topic empty), started."""
    create_missing_topics(AdminClient({"bootstrap.servers": broker.bootstrap_servers}),
                          {f"{server}.raw": (RAW_TOPIC_PARTITIONS, False)}, timeout=60)
    return start(spark, load_config(None, {
        "server": server, "checkpoint": str(checkpoint), "kafka.bootstrap_servers": broker.bootstrap_servers,
        "spark.trigger_interval": "500 milliseconds",
        **{f"output.{name}": value for name, value in output.items()}}))


def topics(broker: Any) -> set[str]:
    return set(AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=30).topics)


def test_heartbeats_only_when_asked_in_debeziums_format(real_kafka: Any, spark: Any, tmp_path: Path) -> None:
    quiet = pipeline(real_kafka, spark, "quiet", tmp_path / "quiet")
    try:
        wait_until(lambda: quiet.lastProgress is not None, "a micro-batch", timeout=120)
        time.sleep(2)
    finally:
        quiet.stop()
    assert "__debezium-heartbeat.quiet" not in topics(real_kafka)

    started_ms = time.time_ns() // 10**6
    beating = pipeline(real_kafka, spark, SERVER, tmp_path / "beating", heartbeat_interval_ms=200)
    try:
        reader = TopicReader(real_kafka, TOPIC)
        wait_until(lambda: reader.poll() >= 0 and len(reader.messages) >= 3, "three heartbeats", timeout=120)
    finally:
        beating.stop()
    stopped_ms = time.time_ns() // 10**6
    time.sleep(1)
    reader.poll(1)
    heartbeats = reader.messages
    reader.consumer.close()
    assert {message.key() for message in heartbeats} == {json.dumps(KEY, separators=(",", ":")).encode()}
    values = [json.loads(message.value()) for message in heartbeats]
    assert all(value["schema"] == VALUE_SCHEMA for value in values), values[0]
    times = [value["payload"]["ts_ms"] for value in values]
    assert times == sorted(times) and started_ms <= times[0] and times[-1] <= stopped_ms, times
    assert len(set(times)) == len(times)  # one per interval, not one burst
    written = [heartbeats[0].key(), heartbeats[0].value()]
    assert json_converter_round_trip(written) == written
