"""A real checkpoint of the state layout before pages (version 3: each group's state one value), and the raw
records it was written from, for the test that restarts a pipeline on it (test_pipeline_upgrade.py).

The checkpoint in tests/data was made by running this module with the pipeline code of main at f0c872c
(the last commit of that layout), from a checkout of it:

    PYTHONPATH=<checkout>/src python tests/unpaged_checkpoint.py tests/data/checkpoint-layout3.tar.gz

It publishes ``FIRST`` to a new broker, runs that pipeline until their events are out, stops it, and archives
its checkpoint. The test publishes the same records in the same order (so that the checkpoint's offsets
name the same records), restores the checkpoint, and runs this version of the pipeline on what follows.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from cassandra_cdc.commitlog import Mutation, MutationSerializer
from cassandra_cdc.kafka.raw_records import RawRecord, record_key
from cassandra_cdc.kafka.schema_records import SchemaRecord
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Insert, to_mutation

SERVER = "upgrade"
RAW_PARTITIONS = 4
SCHEMA = parse_schema("""CREATE TABLE app.items (id int PRIMARY KEY, name text, qty int)
    WITH ID = 5c0e7a10-0000-4000-8000-0000000000c3 AND cdc = true;""")
TIMESTAMP = 1_790_000_000_000_000  # fixed: the records are the same bytes whenever they are published
FIRST = [Insert("app.items", {"id": key, "name": f"item{key}", "qty": key}, timestamp=TIMESTAMP + key)
         for key in range(1, 41)]


def settings(bootstrap_servers: str, checkpoint: Path) -> dict[str, Any]:
    return {"server": SERVER, "checkpoint": str(checkpoint), "kafka.bootstrap_servers": bootstrap_servers,
            "kafka.source": "python", "spark.trigger_interval": "500 milliseconds"}


def publish(bootstrap_servers: str, ops: list[Any], schema_record: bool = False) -> None:
    """Raw records as three agents publish them (one copy per replica), in order."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "acks": "all"})
    if schema_record:
        record = SchemaRecord.of(SCHEMA.table("app", "items"), "node1")
        producer.produce(SERVER, record.encode(), record.key)
    for position, op in enumerate(ops):
        update = MutationSerializer.serialize(Mutation(to_mutation(op, SCHEMA).updates), 7)[1:]
        for node in ("node1", "node2", "node3"):
            value = RawRecord(node, 1000, position, 7, op.timestamp, update).encode()
            producer.produce(f"{SERVER}.raw", value, record_key(update))
        producer.flush(30)  # one write at a time: the records' order in each partition is the same every run


def events_count(bootstrap_servers: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "checkpoint-maker",
                         "isolation.level": "read_committed"})
    topic = f"{SERVER}.app.items"
    metadata = consumer.list_topics(timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return 0
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
               for partition in metadata.partitions)


def main(archive: Path) -> None:
    from cassandra_cdc.pipeline.pipeline_config import load_config
    from cassandra_cdc.pipeline.spark_session import spark_session
    from cassandra_cdc.pipeline.streaming_job import start
    from cassandra_cdc.simulator import EmbeddedBroker

    with tempfile.TemporaryDirectory() as directory, EmbeddedBroker(Path(directory) / "broker") as broker:
        broker.create_topic(f"{SERVER}.raw", RAW_PARTITIONS)
        publish(broker.bootstrap_servers, FIRST, schema_record=True)
        checkpoint = Path(directory) / "checkpoint"
        spark = spark_session("local[2]", "checkpoint-maker", 2)
        query = start(spark, load_config(None, settings(broker.bootstrap_servers, checkpoint)))
        deadline = time.monotonic() + 300
        # An event is one offset, plus a transaction marker per batch: past len(FIRST) once all are out.
        while events_count(broker.bootstrap_servers) < len(FIRST) and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(5)
        query.stop()
        spark.stop()
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(checkpoint, arcname="checkpoint")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
