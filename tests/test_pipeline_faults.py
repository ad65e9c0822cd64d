"""The pipeline under change and failure: a schema change mid-stream, a damaged raw record, and a
restart after ``kill -9`` of the pipeline process. Raw records are published here as an agent would
(same record format, schema record first), so each test controls exactly what the pipeline sees."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from cassandra_cdc.commitlog import Mutation, MutationSerializer
from cassandra_cdc.pipeline.pipeline_config import load_config
from cassandra_cdc.localcluster import S3Server
from cassandra_cdc.pipeline.streaming_job import STATE_LAYOUT_FILE, start
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Insert, Update, to_mutation
from cassandra_cdc.kafka.raw_records import RawRecord, record_key
from cassandra_cdc.kafka.schema_records import SchemaRecord
from conftest import require_jvm_artifacts
from full_disk import fill, small_filesystem

CHECKPOINT_BUCKET = "checkpoints"
TABLE_ID = "5c0e7a10-0000-4000-8000-00000000000a"
V1 = f"""CREATE TABLE app.items (id int PRIMARY KEY, name text, qty int) WITH ID = {TABLE_ID} AND cdc = true;"""
V2 = f"""CREATE TABLE app.items (id int PRIMARY KEY, name text, qty int, color text)
    WITH ID = {TABLE_ID} AND cdc = true;"""


class RawPublisher:
    """Publishes what an agent would: the table's schema record, then one raw record per update."""

    def __init__(self, bootstrap: str, server: str, security: dict[str, Any] | None = None) -> None:
        """``security``: librdkafka's settings of the connection (KafkaSecurity.librdkafka())."""
        self.server = server
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  **(security or {})})
        self.position = 0

    def schema(self, cql: str) -> Any:
        schema = parse_schema(cql)
        table = schema.table("app", "items")
        record = SchemaRecord.of(table, "node1")
        self.producer.produce(f"{self.server}.table-schemas", record.encode(), record.key)
        self.producer.flush(30)
        return schema

    def write(self, schema: Any, op: Any, copies: int = 3) -> None:
        for update in to_mutation(op, schema).updates:
            body = MutationSerializer.serialize(Mutation([update]), 7)
            update_bytes = body[1:]  # after the update count
            self.position += len(body) + 12
            for node in range(1, copies + 1):
                record = RawRecord(f"node{node}", 1000, self.position, 7, op.timestamp, update_bytes)
                self.producer.produce(f"{self.server}.raw", record.encode(), record_key(update_bytes))
        self.producer.flush(30)

    def raw(self, key: bytes, value: bytes) -> None:
        self.producer.produce(f"{self.server}.raw", value, key)
        self.producer.flush(30)

    def close(self) -> None:
        self.producer.close()


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed",
             security: dict[str, Any] | None = None) -> list[Any]:
    """The events of ``topic`` up to each partition's end as the consumer sees it (read_committed: the last
    stable offset). Not the high watermark: no record reaches it when a transaction marker comes last."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True, **(security or {})})
    try:
        metadata = consumer.list_topics(timeout=10).topics.get(topic)
        if metadata is None:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
        pending = set(metadata.partitions)
        out: list[Any] = []
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    pending.discard(message.partition())  # at its end
                elif message.value() is not None:
                    out.append(json.loads(message.value()))
        return out
    finally:
        consumer.close()


def wait_for(predicate: Any, timeout: float = 120.0) -> Any:
    """``predicate``'s first true result, or its last one at ``timeout``; a broker too slow to answer (a
    loaded machine) is a false result, not the test's failure."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except KafkaException:
            result = None
        if result or time.monotonic() > deadline:
            return result
        time.sleep(1)


def pipeline_config(broker: Any, server: str, tmp_path: Path, **overrides: Any) -> Any:
    return load_config(None, {"server": server, "checkpoint": str(tmp_path / "checkpoint"),
                              "kafka.bootstrap_servers": broker.bootstrap_servers,
                              "spark.trigger_interval": "500 milliseconds", **overrides})


def test_a_schema_change_mid_stream_never_breaks_it(broker: Any, spark: Any, tmp_path: Path) -> None:
    server = "schemachange"
    publisher = RawPublisher(broker.bootstrap_servers, server)
    v1 = publisher.schema(V1)
    now = time.time_ns() // 1000
    publisher.write(v1, Insert("app.items", {"id": 1, "name": "cup", "qty": 2}, timestamp=now))
    query = start(spark, pipeline_config(broker, server, tmp_path))
    try:
        topic = f"{server}.app.items"
        assert wait_for(lambda: len(read_all(broker.bootstrap_servers, topic)) == 1)
        v2 = publisher.schema(V2)  # ALTER TABLE app.items ADD color text
        publisher.write(v2, Update("app.items", {"id": 1}, {"color": "red"}, timestamp=now + 10))
        publisher.write(v2, Insert("app.items", {"id": 2, "name": "pot", "qty": 1, "color": "blue"},
                                   timestamp=now + 20))
        events = wait_for(lambda: (e := read_all(broker.bootstrap_servers, topic)) and len(e) == 3 and e)
        payloads = [e["payload"] for e in events]
        assert [p["op"] for p in payloads] == ["c", "u", "c"] or sorted(p["op"] for p in payloads) == ["c", "c", "u"]
        first = next(p for p in payloads if p["after"]["id"] == 1 and p["op"] == "c")
        assert "color" not in first["after"]  # written with the old definition
        update = next(p for p in payloads if p["op"] == "u")
        assert update["before"] == {"id": 1, "name": "cup", "qty": 2, "color": None}
        assert update["after"] == {"id": 1, "name": "cup", "qty": 2, "color": "red"}
        assert read_all(broker.bootstrap_servers, f"{server}.errors") == []
    finally:
        query.stop()
        publisher.close()


def test_a_damaged_record_goes_to_the_errors_topic_and_the_stream_goes_on(broker: Any, spark: Any,
                                                                         tmp_path: Path) -> None:
    server = "damaged"
    publisher = RawPublisher(broker.bootstrap_servers, server)
    schema = publisher.schema(V1)
    now = time.time_ns() // 1000
    publisher.write(schema, Insert("app.items", {"id": 1, "name": "cup", "qty": 2}, timestamp=now), copies=1)
    good = to_mutation(Insert("app.items", {"id": 9, "name": "x", "qty": 1}, timestamp=now), schema)
    update_bytes = MutationSerializer.serialize(good, 7)[1:]
    truncated = RawRecord("node1", 1000, 77, 7, now, update_bytes[:-6])
    publisher.raw(record_key(update_bytes), truncated.encode())
    publisher.raw(b"not-a-key", b"\x09garbage")
    publisher.write(schema, Insert("app.items", {"id": 2, "name": "pot", "qty": 5}, timestamp=now + 1), copies=1)
    query = start(spark, pipeline_config(broker, server, tmp_path))
    try:
        events = wait_for(lambda: (e := read_all(broker.bootstrap_servers, f"{server}.app.items")) and len(e) == 2 and e)
        assert sorted(e["payload"]["after"]["id"] for e in events) == [1, 2]
        errors = wait_for(lambda: (e := read_all(broker.bootstrap_servers, f"{server}.errors")) and len(e) == 2 and e)
        reasons = " | ".join(e["reason"] for e in errors)
        assert "cannot decode the partition update of app.items" in reasons
        assert "format version 9" in reasons or "too short" in reasons
        assert query.exception() is None
    finally:
        query.stop()
        publisher.close()


def pipeline_command(broker: Any, server: str, tmp_path: Path, kafka: dict[str, Any],
                     spark_conf: dict[str, str] | None = None, checkpoint: str | None = None) -> list[str]:
    """``cassandra-cdc pipeline`` in its own process, with a config file of these settings (the checkpoint in
    ``tmp_path`` unless given)."""
    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump({
        "server": server, "checkpoint": checkpoint or str(tmp_path / "checkpoint"),
        "kafka": {"bootstrap_servers": broker.bootstrap_servers, **kafka},
        "spark": {"trigger_interval": "200 milliseconds", "conf": spark_conf or {}}}))
    return [str(Path(sys.executable).with_name("cassandra-cdc")), "pipeline", "--config", str(config_path)]


def start_pipeline(command: list[str], log: Path | None = None) -> subprocess.Popen:
    """The pipeline's process; its output to ``log`` (appended), or dropped."""
    output = open(log, "ab") if log is not None else subprocess.DEVNULL
    # A session of its own: a kill of its process group reaches the Python workers too.
    try:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log is not None:
            output.close()


def stop_pipeline(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited, its workers too
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    require_jvm_artifacts()
    with S3Server(tmp_path_factory.mktemp("s3")) as running:
        running.create_bucket(CHECKPOINT_BUCKET)
        yield running


@pytest.mark.parametrize("store", ["local", "s3a"])
def test_kill_9_of_the_pipeline_resumes_from_its_checkpoint_with_each_event_committed_once(
        real_kafka: Any, tmp_path: Path, request: pytest.FixtureRequest, store: str) -> None:
    """The checkpoint in a local directory, or on S3 through Hadoop's S3A file system (an S3 API server here)."""
    server = f"killnine-{store}"
    publisher = RawPublisher(real_kafka.bootstrap_servers, server)
    schema = publisher.schema(V1)
    s3 = request.getfixturevalue("s3") if store == "s3a" else None
    spark_conf, checkpoint = (s3.spark_conf(), f"s3a://{CHECKPOINT_BUCKET}/{server}") if s3 else (None, None)
    command = pipeline_command(real_kafka, server, tmp_path, {"max_offsets_per_trigger": 100}, spark_conf,
                               checkpoint)
    now = time.time_ns() // 1000
    total = 300
    for i in range(total):
        publisher.write(schema, Insert("app.items", {"id": i, "name": f"n{i}", "qty": i}, timestamp=now + i))
    topic = f"{server}.app.items"
    process = start_pipeline(command)
    try:
        # Kill it while it is part-way through the backlog, maybe in the middle of a transaction.
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic, "read_uncommitted")) >= 100, 180)
        stop_pipeline(process)
        process = start_pipeline(command)
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= total, 240)
    finally:
        stop_pipeline(process)
        publisher.close()
    # Replays rewrite what the killed process left uncommitted: read_committed sees every event once.
    events = read_all(real_kafka.bootstrap_servers, topic)
    assert sorted(e["payload"]["after"]["id"] for e in events) == list(range(total))
    assert {e["payload"]["op"] for e in events} == {"c"}
    if s3 is not None:  # the checkpoint, the layout file with it, is on S3 and nowhere else
        kept = {key.split("/")[1] for key in s3.list(CHECKPOINT_BUCKET, f"{server}/")}
        assert {STATE_LAYOUT_FILE, "commits", "offsets", "state"} <= kept, kept
        assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "s3a:").exists()


def test_a_full_checkpoint_disk_fails_the_pipeline_in_one_line_and_the_restart_commits_each_event_once(
        real_kafka: Any, tmp_path: Path) -> None:
    """The checkpoint on a small filesystem of its own, filled while the pipeline runs: the query fails and
    the process exits (status 1) with one error line naming the checkpoint; once space returns, the restart
    resumes from the checkpoint and read_committed consumers see every event once."""
    server = "fullcheckpoint"
    publisher = RawPublisher(real_kafka.bootstrap_servers, server)
    schema = publisher.schema(V1)
    command = pipeline_command(real_kafka, server, tmp_path, {"max_offsets_per_trigger": 50})
    log = tmp_path / "pipeline.log"
    topic, before, total = f"{server}.app.items", 50, 150
    now = time.time_ns() // 1000

    def write(ids: range) -> None:
        for i in ids:
            row = {"id": i, "name": f"n{i}", "qty": i}
            publisher.write(schema, Insert("app.items", row, timestamp=now + i))
    write(range(before))
    with small_filesystem(tmp_path / "checkpoint", "64m") as checkpoint:
        process = start_pipeline(command, log)
        try:
            assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= before, 240), \
                log.read_text()[-3000:]
            filler = fill(checkpoint)
            write(range(before, total))
            process.wait(240)
            output = log.read_text()
            assert process.returncode == 1, output[-3000:]
            assert "Traceback" not in output, output[-5000:]
            # (Spark's JVM logs the failure too, with its stack trace, through log4j: not ours to format.)
            errors = [line for line in output.splitlines() if " ERROR cassandra_cdc" in line]
            assert len(errors) == 1, output[-5000:]
            # Whichever write meets the full disk first fails the query: the driver's offset log or a task's
            # state store commit.
            assert re.search(r"the pipeline failed: (java\.io\.IOException: No space left on device|"
                             r"\[CANNOT_WRITE_STATE_STORE\.CANNOT_COMMIT\] .*) "
                             + re.escape(f"(checkpoint {checkpoint}); once the cause is fixed, start it again: "
                                         "it resumes from its checkpoint") + "$", errors[0]), errors[0]
            filler.unlink()
            process = start_pipeline(command, log)
            assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= total, 240), \
                log.read_text()[-3000:]
        finally:
            stop_pipeline(process)
            publisher.close()
    events = read_all(real_kafka.bootstrap_servers, topic)
    assert sorted(e["payload"]["after"]["id"] for e in events) == list(range(total))


def connector_jars() -> dict[str, str]:
    """Spark settings that put the Kafka connector `make install` fetched on the classpath."""
    import pyspark

    from cassandra_cdc.localcluster import artifacts

    jars = artifacts.spark_kafka_jars(Path(pyspark.__file__).parent / "jars")
    return {"spark.jars": ",".join(map(str, jars))}


@pytest.mark.parametrize("source", ["kafka", "python"])
def test_each_kafka_source_gives_one_committed_event_per_change(real_kafka: Any, tmp_path: Path,
                                                                 source: str) -> None:
    """``kafka.source: kafka`` (Spark's connector) and ``python`` (ours), end to end on real Kafka: each
    change, published by three replicas, is one event for read_committed consumers."""
    server = f"source-{source}"
    publisher = RawPublisher(real_kafka.bootstrap_servers, server)
    schema = publisher.schema(V1)
    now = time.time_ns() // 1000
    for i in range(20):
        publisher.write(schema, Insert("app.items", {"id": i, "name": f"n{i}", "qty": i}, timestamp=now + i))
    for i in range(5):
        publisher.write(schema, Update("app.items", {"id": i}, {"qty": 100 + i}, timestamp=now + 100 + i))
    command = pipeline_command(real_kafka, server, tmp_path, {"source": source},
                               connector_jars() if source == "kafka" else None)
    topic = f"{server}.app.items"
    process = start_pipeline(command)
    try:
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= 25, 180)
    finally:
        stop_pipeline(process)
        publisher.close()
    events = [e["payload"] for e in read_all(real_kafka.bootstrap_servers, topic)]
    assert sorted((e["op"], e["after"]["id"], e["after"]["qty"]) for e in events) == sorted(
        [("c", i, i) for i in range(20)] + [("u", i, 100 + i) for i in range(5)])
    assert read_all(real_kafka.bootstrap_servers, f"{server}.errors") == []


def test_the_pipelines_of_two_servers_on_one_kafka_each_deliver_every_event_once(real_kafka: Any, spark: Any,
                                                                                  tmp_path: Path) -> None:
    """Each server's pipeline has transactional ids of its own: running side by side, in small micro-batches
    so that their transactions overlap, neither fences the other's."""
    servers = ("twin-east", "twin-west")
    total = 120
    now = time.time_ns() // 1000
    publishers = [RawPublisher(real_kafka.bootstrap_servers, server) for server in servers]
    for publisher in publishers:
        schema = publisher.schema(V1)
        for i in range(total):
            publisher.write(schema, Insert("app.items", {"id": i, "name": publisher.server, "qty": i},
                                           timestamp=now + i))
    queries = [start(spark, pipeline_config(real_kafka, server, tmp_path / server,
                                            **{"kafka.max_offsets_per_trigger": 30}))
               for server in servers]
    try:
        for topic in (f"{server}.app.items" for server in servers):
            assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= total, 240), topic
        assert all(query.exception() is None for query in queries)
    finally:
        for query in queries:
            query.stop()
        for publisher in publishers:
            publisher.close()
    for server in servers:
        events = [e["payload"] for e in read_all(real_kafka.bootstrap_servers, f"{server}.app.items")]
        assert sorted((e["op"], e["after"]["id"], e["after"]["name"]) for e in events) == [
            ("c", i, server) for i in range(total)], server
