"""A real checkpoint of the state layout before pages (version 3: each group's state one value, with the
group's truncations), and the raw records it was written from, for the test that restarts a pipeline on it
(test_pipeline_upgrade.py).

The checkpoint in tests/data was made by running this module with the pipeline code of main at 3c22a26
(the last commit of that layout), from a copy of it:

    PYTHONPATH=<copy>/src python tests/unpaged_checkpoint.py tests/data/checkpoint-layout3.tar.gz

It publishes ``FIRST``, a ``TRUNCATE`` of the table at ``TRUNCATED_MS`` and ``AFTER`` to a new broker, runs
that pipeline until their events are out, stops it, and archives its checkpoint. The test publishes the
same records in the same order (so that the checkpoint's offsets name the same records), restores the
checkpoint, and runs this version of the pipeline on what follows.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Producer

from cassandra_cdc.commitlog import Mutation, MutationSerializer
from cassandra_cdc.kafka.raw_records import RawRecord, TruncationRecord, record_key
from cassandra_cdc.kafka.schema_records import SchemaRecord
from cassandra_cdc.schema import Schema, parse_schema
from cassandra_cdc.simulator import Insert, to_mutation
from test_pipeline_faults import read_all

SERVER = "upgrade"
RAW_PARTITIONS = 4
SCHEMA = parse_schema("""CREATE TABLE app.items (id int PRIMARY KEY, name text, qty int)
    WITH ID = 5c0e7a10-0000-4000-8000-0000000000c3 AND cdc = true;""")
TIMESTAMP = 1_790_000_000_000_000  # fixed: the records are the same bytes whenever they are published
FIRST = [Insert("app.items", {"id": key, "name": f"item{key}", "qty": key}, timestamp=TIMESTAMP + key)
         for key in range(1, 41)]
TRUNCATED_MS = TIMESTAMP // 1000 + 100
AFTER = [Insert("app.items", {"id": key, "name": f"item{key}", "qty": key},
                timestamp=TIMESTAMP + 200_000 + key) for key in range(1, 21)]
NODES = ("node1", "node2", "node3")
EVENTS = len(FIRST) + 1 + len(AFTER)  # the truncation's event once


def settings(bootstrap_servers: str, checkpoint: Path, server: str = SERVER) -> dict[str, Any]:
    return {"server": server, "checkpoint": str(checkpoint), "kafka.bootstrap_servers": bootstrap_servers,
            "kafka.source": "python", "spark.trigger_interval": "500 milliseconds"}


def producer(bootstrap_servers: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "acks": "all"})


def publish(bootstrap_servers: str, ops: list[Any], schema_record: bool = False,
            nodes: tuple[str, ...] = NODES, server: str = SERVER, schema: Schema = SCHEMA) -> None:
    """Raw records as the agents of ``nodes`` publish them (one copy per replica), in order; with
    ``schema_record``, first the definition of each table of ``schema``."""
    out = producer(bootstrap_servers)
    if schema_record:
        for table in schema:
            record = SchemaRecord.of(table, "node1")
            out.produce(server, record.encode(), record.key)
    for position, op in enumerate(ops):
        update = MutationSerializer.serialize(Mutation(to_mutation(op, schema).updates), 7)[1:]
        for node in nodes:
            value = RawRecord(node, 1000, position, 7, op.timestamp, update).encode()
            out.produce(f"{server}.raw", value, record_key(update))
        out.flush(30)  # one write at a time: the records' order in each partition is the same every run


def publish_truncation(bootstrap_servers: str, truncated_ms: int, nodes: tuple[str, ...] = NODES) -> None:
    """Each node's truncation record of the table, to every raw partition, as the agents publish them."""
    out = producer(bootstrap_servers)
    for node in nodes:
        record = TruncationRecord(node, SCHEMA.table("app", "items").id.bytes, 1000, 5000, truncated_ms)
        for partition in range(RAW_PARTITIONS):
            out.produce(f"{SERVER}.raw", record.encode(), record.key(), partition=partition)
        out.flush(30)


def publish_checkpointed(bootstrap_servers: str) -> None:
    """What the archived checkpoint's pipeline read, in the same order."""
    publish(bootstrap_servers, FIRST, schema_record=True)
    publish_truncation(bootstrap_servers, TRUNCATED_MS)
    publish(bootstrap_servers, AFTER)


def archive_checkpoint(archive: Path, publish_records: Callable[[str], None], topic: str, events: int,
                       server: str = SERVER) -> None:
    """Publish ``publish_records``' records (given the broker's address) to a new broker, run the pipeline
    until ``events`` events are on ``topic``, stop it and archive its checkpoint to ``archive``."""
    from cassandra_cdc.pipeline.pipeline_config import load_config
    from cassandra_cdc.pipeline.spark_session import spark_session
    from cassandra_cdc.pipeline.streaming_job import start
    from cassandra_cdc.simulator import EmbeddedBroker

    with tempfile.TemporaryDirectory() as directory, EmbeddedBroker(Path(directory) / "broker") as broker:
        broker.create_topic(f"{server}.raw", RAW_PARTITIONS)
        publish_records(broker.bootstrap_servers)
        checkpoint = Path(directory) / "checkpoint"
        spark = spark_session("local[2]", "checkpoint-maker", 2)
        query = start(spark, load_config(None, settings(broker.bootstrap_servers, checkpoint, server)))
        deadline = time.monotonic() + 300
        while (len(read_all(broker.bootstrap_servers, topic)) < events
               and time.monotonic() < deadline and query.isActive):
            time.sleep(1)
        time.sleep(5)  # the batch's state committed after its events
        query.stop()
        spark.stop()
        written = len(read_all(broker.bootstrap_servers, topic))
        errors = len(read_all(broker.bootstrap_servers, f"{server}.errors"))
        if query.exception() is not None or written != events or errors:
            sys.exit(f"no checkpoint archived: {written} events of {events}, {errors} errors, "
                     f"{query.exception()}")
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(checkpoint, arcname="checkpoint")


def main(archive: Path) -> None:
    archive_checkpoint(archive, publish_checkpointed, f"{SERVER}.app.items", EVENTS)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
