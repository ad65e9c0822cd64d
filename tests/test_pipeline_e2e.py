"""End to end: three simulated replicas (RF=3) write commit logs, three agents publish them, the Spark
pipeline (local[2], RocksDB state) merges them, and the events on the output topics, replayed into a
table, equal the table state the simulator computes independently from the CQL operations."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from conftest import start_agents
from cassandra_cdc.demo.table_check import normalized, replay
from cassandra_cdc.pipeline.pipeline_config import load_config as load_pipeline_config
from cassandra_cdc.pipeline.streaming_job import start
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Clock, Cluster, EmbeddedBroker, Workload

SCHEMA = """
CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '3'};
CREATE TABLE shop.orders (
    id int, line int, item text, qty int, price double, paid boolean, note text static,
    tags set<text>, attrs map<text, int>, history list<int>,
    PRIMARY KEY (id, line)
) WITH ID = 3f1b5a8e-0000-4000-8000-000000000001 AND cdc = true;
CREATE TABLE shop.visits (page text PRIMARY KEY, hits counter) WITH ID = 3f1b5a8e-0000-4000-8000-000000000002
    AND cdc = true;
CREATE TABLE shop.users (id int PRIMARY KEY, name text, email text) WITH ID = 3f1b5a8e-0000-4000-8000-000000000003
    AND cdc = true;
CREATE TABLE shop.audit (id int PRIMARY KEY, what text) WITH ID = 3f1b5a8e-0000-4000-8000-000000000004;
"""


def consume_events(broker: EmbeddedBroker, topics: list[str]) -> list[tuple[str, dict[str, Any]]]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"check-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        assignments = []
        metadata = consumer.list_topics(timeout=10).topics
        for topic in topics:
            if topic in metadata:
                assignments += [TopicPartition(topic, p, 0) for p in metadata[topic].partitions]
        consumer.assign(assignments)
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in assignments}
        pending = {k for k, end in ends.items() if end > 0}
        events: list[tuple[int, str, dict[str, Any]]] = []
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    continue
                place = (message.topic(), message.partition())
                if message.value() is not None:
                    events.append((message.offset(), message.topic(), json.loads(message.value())["payload"]))
                if message.offset() + 1 >= ends[place]:
                    pending.discard(place)
        return [(topic, payload) for _, topic, payload in events]
    finally:
        consumer.close()


def test_replicas_merge_into_exactly_the_table_state(broker: EmbeddedBroker, tmp_path: Path, spark: Any) -> None:
    server = "e2e"
    (tmp_path / "schema.cql").write_text(SCHEMA)
    schema = parse_schema(SCHEMA)
    clock = Clock()
    workload = Workload(schema, seed=7, tables=["shop.orders", "shop.visits", "shop.users", "shop.audit"], keys=25,
                        clock=clock, ttl_seconds=(1, 3))
    cluster = Cluster(tmp_path / "cluster", schema, nodes=3, rf=3, cassandra_version="4.1", seed=3, shuffle=True,
                      segment_size=256 * 1024)
    agents = start_agents(cluster, broker, server, tmp_path)
    pipeline_config = load_pipeline_config(None, {
        "server": server, "checkpoint": str(tmp_path / "checkpoint"),
        "kafka.bootstrap_servers": broker.bootstrap_servers, "kafka.max_offsets_per_trigger": 3000,
        "spark.trigger_interval": "500 milliseconds"})
    query = start(spark, pipeline_config)
    try:
        cluster.run(workload.take(1500), sync_every=50)
        cluster.close_all()
        # Let every TTL pass: the pipeline must emit the expiries by itself.
        time.sleep(max(0.0, clock.now_seconds + 4 - time.time()))
        deadline = time.monotonic() + 180
        topics = {t: f"{server}.shop.{t}" for t in ("orders", "visits", "users")}
        while True:
            now = int(time.time())
            events = consume_events(broker, list(topics.values()))
            results = {}
            for table, topic in topics.items():
                metadata = schema.table("shop", table)
                key_columns = [c.name for c in metadata.primary_key]
                got = replay(events, topic, key_columns)
                expected = {k: normalized(v) for k, v in cluster.rows(f"shop.{table}", now).items()}
                results[table] = (got, expected)
            if all(got == expected for got, expected in results.values()) or time.monotonic() > deadline:
                break
            time.sleep(2)
        for table, (got, expected) in results.items():
            assert got == expected, table
        assert all(results[t][1] for t in results), "the workload left rows in every table"
        assert not any(topic.endswith(".audit") for topic, _ in events), "a table without CDC has no events"
        assert query.exception() is None
    finally:
        query.stop()
        for agent, thread in agents:
            agent.stop()
            thread.join(timeout=30)
