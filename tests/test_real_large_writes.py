"""Writes as large as a real Cassandra 5.0 node accepts, and raw records deleted before the pipeline read them.

One node of its own with 32 MiB commit log segments, so that it accepts mutations up to 16 MiB
(``max_mutation_size`` 16384KiB), on the real Kafka broker (``real_kafka``, its default ``message.max.bytes``
of about 1 MB). Among small writes: a 3 MB cell, an unlogged batch of 5,000 rows into one partition (1.5 MB),
a 15 MB mutation (an unlogged batch of 30 rows of 500,000 bytes into one partition), and a 1.5 MB batch that
deletes a range of a partition's rows and writes others, some into the range.

- An agent configured as the docs say raises the raw topic's limit to what the node's mutations need, says
  so in one line, and publishes each write whole; the pipeline's events, replayed, equal ``SELECT *`` at
  CONSISTENCY ALL.
- A second agent on the same ``cdc_raw`` (``cleanup.mode: keep``) whose producer keeps a 1,000,000-byte
  limit cuts the batches into records by rows; its pipeline's events equal the first's, event for event.
  The 3 MB cell, a single row, cannot be cut: that agent stops with one line naming the segment, position,
  table, partition key, record size, the limits and the remedy (no traceback).

And a gap, on each of the pipeline's Kafka read paths: with the pipeline stopped, the records of two raw
partitions are deleted (``DeleteRecords``, which moves the log start offset as retention does). The pipeline
refuses to start with one line naming each partition's missing offsets and the remedy (exit status 2), warns
that the topic's retention is shorter than the docs recommend, and with ``kafka.accept_gap`` starts, counts
the records in its metric and reads on: its events then lack exactly the rows whose records were deleted.
The same gap made while the pipeline runs (frozen meanwhile) stops it with the same line (exit status 1).
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

import pytest
import yaml
from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import BatchStatement, BatchType
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cassandra_cdc.simulator.broker import free_port
from conftest import require_jvm_artifacts
from test_pipeline_faults import connector_jars
from real_system import (System, consume_events, messages, raw_records, replayed_tables, table_id, wait_for,
                         write_yaml)

KEYSPACE = "large_writes"
TABLE = "big"
CELL_BYTES = 3_000_000
BATCH_ROWS, BATCH_ROW_BYTES = 5_000, 300
MUTATION_ROWS, MUTATION_ROW_BYTES = 30, 500_000
RANGE_ROWS = 2_000
CUT_PRODUCER_LIMIT = 1_000_000
CONVERGE_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real node whose commit log segments are 32 MiB: its max_mutation_size is 16 MiB; it takes a CQL
    request of that size."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import CassandraCluster

    # A client's request as large as the largest mutation (the default takes a share of the heap).
    config = {"commitlog_segment_size": "32MiB", "native_transport_max_message_size": "16MiB",
              "native_transport_max_request_data_in_flight_per_ip": "64MiB",
              "native_transport_max_request_data_in_flight": "64MiB"}
    with CassandraCluster(tmp_path_factory.mktemp("large-writes"), nodes=1, heap="512m", config=config) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def session(node: Any) -> Iterator[Any]:
    """A session at CONSISTENCY ALL, the test keyspace (one replica) created."""
    with node.driver() as driver:
        session = driver.connect()
        profile = session.get_execution_profile(EXEC_PROFILE_DEFAULT)
        profile.consistency_level = ConsistencyLevel.ALL
        profile.request_timeout = 120
        session.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        yield session


def kafka_settings(kafka: Any, **more: Any) -> dict[str, Any]:
    return {"bootstrap_servers": kafka.bootstrap_servers, "raw_topic_partitions": 3, **more}


def set_pipeline(system: System, **kafka: Any) -> None:
    """The pipeline's configuration with more ``kafka`` settings (and its metrics on a port of its own); with
    ``source: kafka``, Spark's connector on the classpath."""
    settings = yaml.safe_load(system.pipeline_config.read_text())
    settings["kafka"].update(kafka)
    if kafka.get("source") == "kafka":
        settings["spark"]["conf"] = connector_jars()
    settings["metrics"] = {"port": free_port(), "host": "127.0.0.1"}
    write_yaml(system.pipeline_config, settings)


def run_pipeline_until_equal(system: System, kafka: Any, session: Any, tables: list[str],
                             server: str) -> dict[str, list[dict[str, Any]]]:
    """Start the pipeline, wait until the tables' events replay to SELECT *, stop it; the events."""
    system.pipeline.start()
    try:
        wait_for(lambda: system.pipeline.ready, "the pipeline", 240, [system.pipeline])
        replayed = replayed_tables(kafka.bootstrap_servers, session, KEYSPACE, server, tables, CONVERGE_TIMEOUT,
                                   [system.pipeline])
    finally:
        assert system.pipeline.stop() == 0, system.pipeline.log_tail(30)
    assert replayed.differences == {table: [] for table in tables}, replayed.differences
    return replayed.events


def records_per_partition_key(kafka: Any, topic: str, table: bytes) -> dict[int, int]:
    """How many raw records each partition key (an int) of ``table`` has on ``topic``."""
    counts: dict[int, int] = {}
    for _, key, _ in messages(kafka.bootstrap_servers, topic):
        if key.startswith(table):
            k = int.from_bytes(key[16:], "big", signed=True)
            counts[k] = counts.get(k, 0) + 1
    return counts


def row_of(event: dict[str, Any]) -> tuple[int, int]:
    row = event["after"] or event["before"]
    return row["k"], row["c"]


def by_row(events: Iterable[dict[str, Any]]) -> dict[tuple[int, int], list[tuple[Any, ...]]]:
    """Per primary key, its events as what they say of the row (op, before, after), in order, without when they
    were made (the events of different rows have no order among them)."""
    rows: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for event in events:
        rows.setdefault(row_of(event), []).append((event["op"], event["before"], event["after"]))
    return rows


def test_large_writes_are_published_whole_and_cut_when_the_limit_stays_low(
        node: Any, session: Any, real_kafka: Any, tmp_path: Path) -> None:
    session.execute(f"CREATE TABLE {KEYSPACE}.{TABLE} (k int, c int, v blob, PRIMARY KEY (k, c)) WITH cdc = true")
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.{TABLE} (k, c, v) VALUES (?, ?, ?)")
    insert_at = session.prepare(f"INSERT INTO {KEYSPACE}.{TABLE} (k, c, v) VALUES (?, ?, ?) USING TIMESTAMP ?")
    delete_range = session.prepare(f"DELETE FROM {KEYSPACE}.{TABLE} USING TIMESTAMP ? WHERE k = ? AND c >= ? "
                                   "AND c < ?")
    (tmp_path / "whole").mkdir()
    (tmp_path / "cut").mkdir()
    whole = System(tmp_path / "whole", node, real_kafka, "largewhole", tables=[f"{KEYSPACE}.{TABLE}"],
                   agent_settings={"cleanup": {"mode": "keep"}})
    cut = System(tmp_path / "cut", node, real_kafka, "largecut", tables=[f"{KEYSPACE}.{TABLE}"],
                 agent_settings={"cleanup": {"mode": "keep"}, "kafka": kafka_settings(
                     real_kafka, producer={"message.max.bytes": CUT_PRODUCER_LIMIT})})
    try:
        whole.start_agents()
        cut.start_agents()
        start_line = next(line for line in whole.agents[0].log_path.read_text().splitlines()
                          if "record size:" in line)
        assert ("the node's max_mutation_size is 16,777,216 bytes (node 127.0.0.1)"
                in start_line)
        assert "every mutation goes whole in one record" in start_line
        cut_line = next(line for line in cut.agents[0].log_path.read_text().splitlines() if "record size:" in line)
        assert "producer up to 1,000,000 (message.max.bytes): partition updates larger than" in cut_line

        def batch(k: int, rows: int, size: int) -> None:
            statement = BatchStatement(batch_type=BatchType.UNLOGGED)
            for c in range(rows):
                statement.add(insert, (k, c, os.urandom(size)))
            session.execute(statement)

        for c in range(10):
            session.execute(insert, (0, c, os.urandom(10)))
        batch(1, BATCH_ROWS, BATCH_ROW_BYTES)
        batch(2, MUTATION_ROWS, MUTATION_ROW_BYTES)
        batch(4, RANGE_ROWS, 100)
        # One update deleting a range of rows and writing others (some into the range, later): cut, the range
        # deletion spans pieces.
        replace = BatchStatement(batch_type=BatchType.UNLOGGED)
        written_at = int(time.time() * 1_000_000)
        replace.add(delete_range, (written_at, 4, RANGE_ROWS // 4, RANGE_ROWS * 3 // 4))
        for c in range(0, 2 * RANGE_ROWS, 2):  # 1.5 MB
            replace.add(insert_at, (4, c, os.urandom(750), written_at + 1))
        session.execute(replace)
        for c in range(10, 20):
            session.execute(insert, (0, c, os.urandom(10)))
        session.execute(insert, (3, 0, os.urandom(CELL_BYTES)))  # last: the cutting agent stops at it

        whole_events = run_pipeline_until_equal(whole, real_kafka, session, [TABLE], "largewhole")[TABLE]
        table = table_id(session, KEYSPACE, TABLE)
        assert records_per_partition_key(real_kafka, "largewhole.raw", table) == {0: 20, 1: 1, 2: 1, 3: 1, 4: 2}

        stopping = cut.agents[0]
        wait_for(lambda: stopping.exit_code is not None, "the cutting agent to stop at the 3 MB cell", 120, [])
        assert stopping.exit_code == 1
        log = stopping.log_path.read_text()
        assert "Traceback" not in log
        [line] = [line for line in log.splitlines() if "agent stopped:" in line]
        assert re.search(r"the update of CommitLog-8-\d+\.log offset \d+ position \d+ \(table large_writes\.big, "
                         r"partition key \{\"k\": 3\}\) makes a record of 3,000,\d{3} bytes, more than Kafka takes "
                         r"\(largecut\.raw max\.message\.bytes 17,825,792, producer message\.max\.bytes 1,000,000\), "
                         r"and cannot be cut: it is a single row", line), line
        assert line.endswith("raise message.max.bytes in kafka.producer to 17825792 (or leave it out), then start "
                             "the agent again")
        cut_counts = records_per_partition_key(real_kafka, "largecut.raw", table)
        assert cut_counts[0] == 20 and cut_counts[1] >= 2 and cut_counts[2] == MUTATION_ROWS
        assert 3 not in cut_counts
        assert cut_counts[4] >= 3, cut_counts

        cut_events = consume_events(real_kafka.bootstrap_servers, [f"largecut.{KEYSPACE}.{TABLE}"])
        cut.pipeline.start()
        try:
            wanted = len(whole_events) - 1  # all but the 3 MB cell's
            wait_for(lambda: len(consume_events(real_kafka.bootstrap_servers, [f"largecut.{KEYSPACE}.{TABLE}"])
                                 [f"largecut.{KEYSPACE}.{TABLE}"]) >= wanted, "the cut records' events", 300,
                     [cut.pipeline])
            cut_events = consume_events(real_kafka.bootstrap_servers, [f"largecut.{KEYSPACE}.{TABLE}"])
        finally:
            assert cut.pipeline.stop() == 0, cut.pipeline.log_tail(30)
        whole_but_the_cell = (event for event in whole_events if row_of(event)[0] != 3)
        assert by_row(cut_events[f"largecut.{KEYSPACE}.{TABLE}"]) == by_row(whole_but_the_cell)
    finally:
        whole.stop()
        cut.stop()


class GapSetup(NamedTuple):
    system: System
    insert: Any  # the prepared INSERT of (id, v)
    table: bytes  # its table id
    raw_topic: str


def gap_setup(node: Any, session: Any, kafka: Any, root: Path, server: str, source: str) -> GapSetup:
    """A table of its own, its raw topic created by hand with a one-hour retention, and the agent and the
    pipeline (reading with ``source``) of ``server``, not started."""
    table_name = f"{server}_rows"
    session.execute(f"CREATE TABLE {KEYSPACE}.{table_name} (id int PRIMARY KEY, v text) WITH cdc = true")
    raw_topic = f"{server}.raw"
    with AdminClient({"bootstrap.servers": kafka.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(raw_topic, 3, config={"retention.ms": "3600000"})])[raw_topic].result()
    system = System(root, node, kafka, server, tables=[f"{KEYSPACE}.{table_name}"])
    set_pipeline(system, source=source)
    return GapSetup(system, session.prepare(f"INSERT INTO {KEYSPACE}.{table_name} (id, v) VALUES (?, ?)"),
                    table_id(session, KEYSPACE, table_name), raw_topic)


def delete_unread(setup: GapSetup, session: Any, kafka: Any,
                  read_to: dict[int, int]) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """Rows 30-59 written and published, then every record of raw partitions 0 and 1 past ``read_to``
    deleted (DeleteRecords: the log start moves, as retention moves it). Per partition the offsets deleted
    ``(first, end)``, and the rows whose records they were."""
    for row in range(30, 60):
        session.execute(setup.insert, (row, "after"))
    wait_for(lambda: len(raw_records(kafka.bootstrap_servers, setup.raw_topic, setup.table)) == 60,
             "the agent to publish the later rows", 60, setup.system.agents)
    ends = end_offsets(kafka, setup.raw_topic)
    deleted = {partition: (read_to[partition], ends[partition]) for partition in (0, 1)}
    assert all(end > first for first, end in deleted.values()), deleted
    lost_rows = {int.from_bytes(key[16:], "big", signed=True)
                 for partition, key, _ in messages(kafka.bootstrap_servers, setup.raw_topic)
                 if partition in deleted and key.startswith(setup.table)} - set(range(30))
    with AdminClient({"bootstrap.servers": kafka.bootstrap_servers}) as admin:
        futures = admin.delete_records([TopicPartition(setup.raw_topic, partition, end)
                                        for partition, (_, end) in deleted.items()])
        for future in futures.values():
            future.result()
    return deleted, lost_rows


def gap_text(raw_topic: str, deleted: dict[int, tuple[int, int]]) -> str:
    """What the gap's line says of the records lost and where."""
    records = sum(end - first for first, end in deleted.values())
    ranges = ", ".join(f"partition {p}: offsets {first}..{end - 1}" for p, (first, end) in sorted(deleted.items()))
    return (f"the raw topic {raw_topic} lost {records:,} records before the pipeline read them (deleted by its "
            f"retention, or the topic recreated): {ranges}.")


@pytest.mark.parametrize("source", ["kafka", "python"])
def test_a_gap_in_the_raw_topic_is_one_line_a_metric_and_accepted_only_by_setting(
        node: Any, session: Any, real_kafka: Any, tmp_path: Path, source: str) -> None:
    setup = gap_setup(node, session, real_kafka, tmp_path, f"gap{source}", source)
    system, table_name = setup.system, f"gap{source}_rows"
    try:
        system.start_agents()
        for row in range(30):
            session.execute(setup.insert, (row, "before"))
        run_pipeline_until_equal(system, real_kafka, session, [table_name], f"gap{source}")
        deleted, lost_rows = delete_unread(setup, session, real_kafka, end_offsets(real_kafka, setup.raw_topic))

        # The run that meets the gap, in the log after the first run's (whose stop can leave PySpark's Python
        # source runner's traceback of its closed socket there).
        first_run = len(system.pipeline.log_path.read_text())
        system.pipeline.start()
        wait_for(lambda: system.pipeline.exit_code is not None, "the pipeline to refuse the gap", 240, [])
        assert system.pipeline.exit_code == 2
        log = system.pipeline.log_path.read_text()[first_run:]
        assert "Traceback" not in log
        [line] = [line for line in log.splitlines() if line.startswith("error:")]
        assert gap_text(setup.raw_topic, deleted) in line
        assert "run cassandra-cdc bootstrap" in line and "kafka.accept_gap: true" in line
        assert (f"the raw topic {setup.raw_topic} deletes records sooner than docs/operations.md recommends "
                "(retention.ms 3600000 (1 h)") in log

        set_pipeline(system, accept_gap=True)
        port = yaml.safe_load(system.pipeline_config.read_text())["metrics"]["port"]
        system.pipeline.start()
        try:
            wait_for(lambda: system.pipeline.ready, "the pipeline accepting the gap", 240, [system.pipeline])
            records = sum(end - first for first, end in deleted.values())
            assert scrape(port, "cassandra_cdc_pipeline_raw_records_deleted_total") == records
            topic = f"gap{source}.{KEYSPACE}.{table_name}"
            wanted = set(range(60)) - lost_rows
            wait_for(lambda: {event["after"]["id"]
                              for event in consume_events(real_kafka.bootstrap_servers, [topic])[topic]} == wanted,
                     "the events of the rows not lost", 300, [system.pipeline])
        finally:
            assert system.pipeline.stop() == 0, system.pipeline.log_tail(30)
        assert "reading on past it (kafka.accept_gap)" in system.pipeline.log_path.read_text()
    finally:
        system.stop()


@pytest.mark.parametrize("source", ["kafka", "python"])
def test_a_gap_while_the_pipeline_runs_stops_it_with_the_same_line(
        node: Any, session: Any, real_kafka: Any, tmp_path: Path, source: str) -> None:
    """The running pipeline frozen (SIGSTOP, its whole process group) while records it has not read are
    deleted: let go, its query fails on them, and the pipeline stops (exit status 1) with the gap's line."""
    setup = gap_setup(node, session, real_kafka, tmp_path, f"gaprun{source}", source)
    system = setup.system
    try:
        system.start_agents()
        for row in range(30):
            session.execute(setup.insert, (row, "before"))
        system.pipeline.start()
        wait_for(lambda: system.pipeline.ready, "the pipeline", 240, [system.pipeline])
        replayed = replayed_tables(real_kafka.bootstrap_servers, session, KEYSPACE, f"gaprun{source}",
                                   [f"gaprun{source}_rows"], CONVERGE_TIMEOUT, [system.pipeline])
        assert not any(replayed.differences.values()), replayed.differences
        assert system.pipeline.process is not None
        group = system.pipeline.process.pid
        os.killpg(group, signal.SIGSTOP)
        try:
            deleted, _ = delete_unread(setup, session, real_kafka, end_offsets(real_kafka, setup.raw_topic))
        finally:
            os.killpg(group, signal.SIGCONT)
        wait_for(lambda: system.pipeline.exit_code is not None, "the pipeline to stop at the gap", 600, [])
        assert system.pipeline.exit_code == 1, system.pipeline.log_tail(30)
        [line] = [line for line in system.pipeline.log_path.read_text().splitlines()
                  if "the pipeline stopped: " in line]
        assert gap_text(setup.raw_topic, deleted) in line and "kafka.accept_gap: true" in line
    finally:
        system.stop()


def end_offsets(kafka: Any, topic: str) -> dict[int, int]:
    """Where each partition of ``topic`` ends (its high watermark)."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "unused"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def scrape(port: int, name: str) -> float:
    """A metric's value from an endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    [value] = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)
