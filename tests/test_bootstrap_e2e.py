"""End to end: a bootstrap of a real table's SSTables (three replicas' snapshots of ``legacy_nb_clust``)
runs while three agents stream live changes to the same keys, some newer and some older than the
SSTable data, into the Spark pipeline (local[2], RocksDB state). The events, replayed into a table,
must equal the table's final state, computed independently: the SSTable content (the fixtures'
README, as the INSERTs that wrote it) and the live statements, merged by the simulator's CQL-level
model; and no row is read (``op = r``) twice, nor at all when CDC had already brought a newer state.
"""

from __future__ import annotations

import collections
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from conftest import start_agents
from cassandra_cdc.bootstrap import BootstrapReport, run_bootstrap
from cassandra_cdc.pipeline.pipeline_config import load_config as load_pipeline_config
from cassandra_cdc.pipeline.streaming_job import start
from cassandra_cdc.schema import TableMetadata, parse_schema
from cassandra_cdc.simulator import Cluster, DeletePartition, DeleteRow, EmbeddedBroker, Insert, TableModel, Update
from cassandra_cdc.sstable import SSTable
from test_bootstrap import FIXTURE, NODES, SCHEMA_CQL, TABLE, replica_snapshots
from test_sstable import LONG, assert_readme_content

SERVER = "bse2e"
EVENTS_TOPIC = f"{SERVER}.{TABLE}"
KEY_COLUMNS = ("pk", "ck")


def ck(i: int | str) -> str:
    return f"{i}{LONG}"


def key(pk: str, i: int | str) -> dict[str, str]:
    return {"pk": pk, "ck": ck(i)}


def topic_ends(broker: EmbeddedBroker, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"check-{uuid.uuid4()}"})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return {}
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in metadata.partitions}
    finally:
        consumer.close()


def wait_until(condition: Any, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def consumed_offsets(query: Any) -> dict[int, int]:
    """The raw topic offsets up to which the pipeline has processed (and committed) micro-batches."""
    done: dict[int, int] = {}
    for progress in query.recentProgress:
        for source in progress.get("sources", []) if isinstance(progress, dict) else progress.sources:
            end = source["endOffset"] if isinstance(source, dict) else source.endOffset
            end = json.loads(end) if isinstance(end, str) else end
            if end and all(isinstance(v, dict) for v in end.values()):  # Spark's {"topic": {"0": n}}
                end = {k: v for inner in end.values() for k, v in inner.items()}
            for partition, offset in (end or {}).items():
                done[int(partition)] = max(done.get(int(partition), 0), int(offset))
    return done


def consume_events(broker: EmbeddedBroker) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"check-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(timeout=10).topics
        if EVENTS_TOPIC not in metadata:
            return []
        assignments = [TopicPartition(EVENTS_TOPIC, p, 0) for p in metadata[EVENTS_TOPIC].partitions]
        consumer.assign(assignments)
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in assignments}
        pending = {p for p, end in ends.items() if end > 0}
        events: list[tuple[int, int, dict[str, Any]]] = []
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    continue
                if message.value() is not None:
                    events.append((message.partition(), message.offset(), json.loads(message.value())["payload"]))
                if message.offset() + 1 >= ends[message.partition()]:
                    pending.discard(message.partition())
        # one row's events are in one partition, in order
        return [payload for _, _, payload in sorted(events, key=lambda e: (e[0], e[1]))]
    finally:
        consumer.close()


def row_key(payload: dict[str, Any]) -> tuple:
    row = payload["after"] if payload["op"] != "d" else payload["before"]
    return tuple(row[c] for c in KEY_COLUMNS)


def replay(events: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    rows: dict[tuple, dict[str, Any]] = {}
    for payload in events:
        if payload["op"] == "d":
            rows.pop(row_key(payload), None)
        else:
            rows[row_key(payload)] = payload["after"]
    return rows


def snapshot_model(sstable: SSTable, table: TableMetadata) -> TableModel:
    """The fixture's table as the SSTable holds it, checked against its README, built from the INSERTs
    that wrote it."""
    content = list(sstable.partitions(table))
    assert_readme_content(sstable, content, "clust", "val")
    model = TableModel(table)
    for partition in content:
        for row in partition.rows:
            (cell,) = row.cells
            assert row.liveness is not None and cell.timestamp == row.liveness.timestamp
            model.apply(Insert(TABLE, timestamp=cell.timestamp, values={
                "pk": partition.key.decode(), "ck": row.clustering[0].decode(), "val": cell.value.decode()}))
    return model


def test_bootstrap_while_agents_stream_gives_the_final_table_state_each_row_once(
        broker: EmbeddedBroker, spark: Any, tmp_path: Path) -> None:
    (tmp_path / "schema.cql").write_text(SCHEMA_CQL)
    schema = parse_schema(SCHEMA_CQL)
    table = schema.table("legacy_tables", "legacy_nb_clust")
    snapshots = replica_snapshots(tmp_path / "snapshots")

    sstable = SSTable(FIXTURE)
    expected = snapshot_model(sstable, table)
    stats = sstable.metadata.stats
    old = stats.min_timestamp - 3600 * 1_000_000  # older than every SSTable cell
    clock = iter(range(time.time_ns() // 1000, 1 << 62, 1000))  # newer than every SSTable cell

    # Streamed and merged before the bootstrap starts.
    before = [
        *[Update(TABLE, timestamp=next(clock), key=key("0", i), set={"val": f"new-0-{i}"}) for i in range(10)],
        *[Insert(TABLE, timestamp=old, values={**key("1", i), "val": f"old-1-{i}"}) for i in range(10)],
        DeletePartition(TABLE, timestamp=next(clock), key={"pk": "3"}),
        *[Insert(TABLE, timestamp=next(clock), values={**key("5", f"x{i}"), "val": f"fresh-{i}"}) for i in range(5)],
    ]
    # Streamed while the bootstrap runs.
    during = [
        *[DeleteRow(TABLE, timestamp=next(clock), key=key("2", i)) for i in range(5)],
        *[DeleteRow(TABLE, timestamp=old, key=key("2", i)) for i in range(5, 10)],
        *[Update(TABLE, timestamp=next(clock) + 10_000_000, key=key("4", i), set={"val": f"newest-4-{i}"})
          for i in range(10)],
        *[Update(TABLE, timestamp=next(clock), key=key("4", i), set={"val": f"newer-4-{i}"}) for i in range(5)],
        Insert(TABLE, timestamp=next(clock), values={**key("3", "back"), "val": "after the partition deletion"}),
        *[Insert(TABLE, timestamp=old + i, values={**key("6", f"y{i}"), "val": f"ancient-{i}"}) for i in range(5)],
        *[Update(TABLE, timestamp=old, key=key("0", i), set={"val": "too old"}) for i in range(10, 15)],
    ]
    for op in (*before, *during):
        expected.apply(op)

    cluster = Cluster(tmp_path / "cluster", schema, nodes=3, rf=3, cassandra_version="4.1", seed=11, shuffle=True,
                      segment_size=256 * 1024)
    agents = start_agents(cluster, broker, SERVER, tmp_path)
    config = load_pipeline_config(None, {
        "server": SERVER, "checkpoint": str(tmp_path / "checkpoint"),
        "kafka.bootstrap_servers": broker.bootstrap_servers, "spark.trigger_interval": "500 milliseconds"})
    query = start(spark, config)
    try:
        cluster.run(before, sync_every=10)
        cluster.sync_all()
        # every replica's copy of every change published, then merged by the pipeline
        wait_until(lambda: sum(topic_ends(broker, config.raw_topic).values()) >= 3 * len(before),
                   "the agents to publish the first changes")
        published = topic_ends(broker, config.raw_topic)
        wait_until(lambda: query.exception() is not None
                   or all(consumed_offsets(query).get(p, 0) >= end for p, end in published.items()),
                   "the pipeline to merge the first changes")
        assert query.exception() is None, f"the pipeline failed: {query.exception()}"
        seen_before = {k for k in replay(consume_events(broker))}
        assert {("0", ck(i)) for i in range(10)} <= seen_before

        reports: list[BootstrapReport] = []
        failures: list[BaseException] = []

        def bootstrap() -> None:
            try:
                reports.append(run_bootstrap(spark, config, TABLE, [str(s) for s in snapshots],
                                             tmp_path / "schema.cql", progress=False))
            except BaseException as error:  # reported by the test thread
                failures.append(error)

        thread = threading.Thread(target=bootstrap)
        thread.start()
        for start_index in range(0, len(during), 6):
            cluster.run(during[start_index:start_index + 6], sync_every=6)
            cluster.sync_all()
            time.sleep(0.3)
        thread.join(timeout=180)
        assert not thread.is_alive() and not failures, failures
        (report,) = reports
        assert report.rows == 3 * 250 and report.tasks == 3 and not report.schema_published  # the agents' schema

        cluster.close_all()
        want = {k: v for k, v in expected.rows(int(time.time())).items()}
        deadline = time.monotonic() + 120
        while True:
            events = consume_events(broker)
            got = replay(events)
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert got == want
        assert query.exception() is None
    finally:
        query.stop()
        for agent, agent_thread in agents:
            agent.stop()
            agent_thread.join(timeout=30)

    # The shape of the final state: what each group of statements left.
    assert all(got[("0", ck(i))]["val"] == f"new-0-{i}" for i in range(10))
    assert all(got[("1", ck(i))]["val"] != f"old-1-{i}" for i in range(10))
    assert ("2", ck(0)) not in got and ("2", ck(5)) in got
    assert [k for k in got if k[0] == "3"] == [("3", ck("back"))]
    assert all(got[("4", ck(i))]["val"] == f"newest-4-{i}" for i in range(10))
    assert len([k for k in got if k[0] in "56"]) == 10 and len(got) == 250 - 50 - 5 + 1 + 10

    reads = collections.Counter(row_key(e) for e in events if e["op"] == "r")
    assert reads and max(reads.values()) == 1, "a row read twice"
    assert all(e["source"]["snapshot"] == "true" for e in events if e["op"] == "r")
    assert {e["source"]["node"] for e in events if e["op"] == "r"} <= set(NODES)
    # rows CDC had already brought in a newer state, or deleted, are not read again
    assert not set(reads) & ({("0", ck(i)) for i in range(10)} | {k for k in reads if k[0] == "3"})
    # rows only the snapshot has are read (pk 1 rows were created by older CDC writes: updated instead)
    assert {("0", ck(i)) for i in range(15, 50)} <= set(reads)
