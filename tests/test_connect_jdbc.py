"""The events consumed by the real consumers a Debezium user runs: a Kafka Connect 4.3 standalone worker,
Connect's JsonConverter, Debezium's JDBC sink (3.2) and its ExtractNewRecordState, writing into a real
PostgreSQL 14. Three simulated replicas' agents and the Spark pipeline produce the events on a real Kafka
broker; the PostgreSQL tables must then hold what the simulator's model of the writes says the Cassandra
tables hold (computed from the CQL operations, not from our events)."""

from __future__ import annotations

import datetime
import decimal
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from cassandra import util

from agent_harness import wait_until
from conftest import require_jvm_artifacts, start_agents
from cassandra_cdc.pipeline.pipeline_config import load_config as load_pipeline_config
from cassandra_cdc.pipeline.streaming_job import start
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Cluster, DeletePartition, DeleteRow, Insert, Update

SERVER = "sink"
SCHEMA = """
CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '3'};
CREATE TABLE shop.kinds (
    id int PRIMARY KEY, name text, small int, big bigint, flag boolean, ratio double, weight float,
    price decimal, ref uuid, made timeuuid, seen timestamp, day date, at time, data blob,
    address inet, tags list<text>, stock map<text, int>
) WITH ID = 7c3e0000-0000-4000-8000-000000000001 AND cdc = true;
CREATE TABLE shop.orders (
    id int, line int, item text, qty int, owner text static,
    PRIMARY KEY (id, line)
) WITH ID = 7c3e0000-0000-4000-8000-000000000002 AND cdc = true;
CREATE TYPE shop.address (street text, zip int);
CREATE TABLE shop.wide (id int PRIMARY KEY, v varint) WITH ID = 7c3e0000-0000-4000-8000-000000000003
    AND cdc = true;
CREATE TABLE shop.homes (id int PRIMARY KEY, v frozen<address>) WITH ID = 7c3e0000-0000-4000-8000-000000000004
    AND cdc = true;
CREATE TABLE shop.pairs (id int PRIMARY KEY, v tuple<int, text>)
    WITH ID = 7c3e0000-0000-4000-8000-000000000005 AND cdc = true;
CREATE TABLE shop.grids (id int PRIMARY KEY, v list<frozen<list<int>>>)
    WITH ID = 7c3e0000-0000-4000-8000-000000000006 AND cdc = true;
CREATE TABLE shop.idmaps (id int PRIMARY KEY, v map<int, text>) WITH ID = 7c3e0000-0000-4000-8000-000000000007
    AND cdc = true;
CREATE TABLE shop.spans (id int PRIMARY KEY, v duration) WITH ID = 7c3e0000-0000-4000-8000-000000000008
    AND cdc = true;
"""
TABLES = ("kinds", "orders")
# A table (its column v) per type the sink may not take, each with a connector of its own (a failed task
# stops every topic of its connector): the value written, and what Debezium's JDBC sink 3.2.0 did with it on
# PostgreSQL 14, as docs/events.md tells. Refused: the error its task fails with.
REFUSED: dict[str, tuple[Any, str]] = {
    "wide": (10**20 + 1, "ERROR: NUMERIC scale -1 must be between 0 and precision 38"),
    "homes": (("main", 1), "Failed to resolve column type for schema: STRUCT (shop.address)"),
    "pairs": ((1, "x"), "Failed to resolve column type for schema: STRUCT (tuple_int_text)"),
    "grids": ([[1, 2], [3]], "Unable to find server array type for provided name integer[]"),
}
# Taken: the value psycopg reads back (a map's keys as hstore's text; a duration as ISO 8601 text).
TAKEN: dict[str, tuple[Any, Any]] = {
    "idmaps": ({1: "a"}, {"1": "a"}),
    "spans": (util.Duration(1, 2, 3_000_000_000), "P0Y1M2DT0H0M3S"),
}
PROBES = {table: value for table, (value, _) in (REFUSED | TAKEN).items()}
JDBC_SINK = "io.debezium.connector.jdbc.JdbcSinkConnector"
PENDING_SEGMENTS = "cassandra_cdc_agent_segments_pending"
Rows = dict[tuple[Any, ...], dict[str, Any]]  # primary key values -> column -> value


def kinds_values(index: int) -> dict[str, Any]:
    """A row of every scalar type the sink takes, different for each index (values exact in every format:
    a float with few binary digits, times with whole microseconds)."""
    return {"id": index, "name": f"name-{index}", "small": -index, "big": 2**40 + index,
            "flag": index % 2 == 0,
            "ratio": index / 8, "weight": 1.5 * index, "price": decimal.Decimal(f"{index}.{index:02d}0"),
            "ref": uuid.UUID(int=index, version=4), "made": util.uuid_from_time(1_700_000_000 + index),
            "seen": datetime.datetime(2024, 5, 6, 7, 8, index), "day": datetime.date(2024, 1, index),
            "at": util.Time(3_600_000_000_000 + index * 1000), "data": bytes([index, 0, 255]),
            "address": f"10.0.0.{index}", "tags": [f"t{index}", "x"], "stock": {"red": index, "blue": -index}}


def operations(first_timestamp: int) -> list[Any]:
    """Inserts, updates, a row delete and a partition delete on both tables, a static-only partition, a row
    of each probe table; each statement a millisecond after the one before."""
    timestamps = iter(range(first_timestamp, first_timestamp + 10**9, 1000))

    def at() -> int:
        return next(timestamps)
    statements: list[Any] = [Insert("shop.kinds", values=kinds_values(index), timestamp=at())
                             for index in range(1, 6)]
    return statements + [
        Update("shop.kinds", key={"id": 2}, set={"name": "renamed", "price": decimal.Decimal("-0.001")},
               timestamp=at()),
        Update("shop.kinds", key={"id": 3}, set={"tags": None, "weight": None, "stock": {"green": 7}},
               timestamp=at()),
        DeleteRow("shop.kinds", key={"id": 4}, timestamp=at()),
        Insert("shop.kinds", values={"id": 6}, timestamp=at()),
        Insert("shop.orders", values={"id": 1, "line": 1, "item": "tea", "qty": 2, "owner": "ann"},
               timestamp=at()),
        Insert("shop.orders", values={"id": 1, "line": 2, "item": "cake", "qty": 1}, timestamp=at()),
        Update("shop.orders", key={"id": 1}, set={"owner": "bob"}, timestamp=at()),
        Insert("shop.orders", values={"id": 2, "line": 1, "item": "jam", "qty": 5}, timestamp=at()),
        DeletePartition("shop.orders", key={"id": 2}, timestamp=at()),
        Update("shop.orders", key={"id": 3}, set={"owner": "static only"}, timestamp=at()),
        Update("shop.orders", key={"id": 1, "line": 2}, set={"qty": 4}, timestamp=at()),
        *[Insert(f"shop.{table}", values={"id": 1, "v": value}, timestamp=at())
          for table, value in PROBES.items()]]


def in_postgresql(value: Any) -> Any:
    """A CQL value (as the DataStax driver gives it) as psycopg reads it back from the column the sink made:
    decimal in a double precision column, time in a time column (microseconds), a map in an hstore (text)."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, util.Date):
        return value.date()
    if isinstance(value, util.Time):
        return datetime.time(value.hour, value.minute, value.second, value.nanosecond // 1000)
    if isinstance(value, Mapping):
        return {str(key): str(element) for key, element in value.items()}
    return value


def expected_rows(cluster: Cluster, table: str) -> Rows:
    """``SELECT *`` of the simulator's model of the table, less the rows of partitions with only static
    values (their clustering columns are null: the pipeline skips them for JDBC sinks)."""
    rows = cluster.rows(f"shop.{table}", int(time.time()))
    return {key: {column: in_postgresql(value) for column, value in row.items()}
            for key, row in rows.items() if None not in key}


def last_changes(statements: list[Any], table: str, key_columns: list[str],
                 rows: Rows) -> dict[tuple[Any, ...], tuple[str, int]]:
    """For each row, ExtractNewRecordState's ``__op`` and ``__source_ts_ms`` after the statements: ``c`` if
    only its insert changed it, else ``u``; the write time (ms) of the last statement on it (a statement on a
    partition's static column changes each of its rows)."""
    changes = {}
    for key in rows:
        row_key = dict(zip(key_columns, key))
        touching = [op.timestamp for op in statements if op.table == f"shop.{table}"
                    and all(row_key[column] == value
                            for column, value in op.key.items() if column in row_key)]
        changes[key] = ("c" if len(touching) == 1 else "u", max(touching) // 1000)
    return changes


def postgresql_rows(connection: Any, table: str, key_columns: list[str]) -> Rows:
    """The table's rows by primary key; none before the sink has created it."""
    import psycopg

    try:
        rows = connection.execute(f"SELECT * FROM {table}").fetchall()
    except psycopg.errors.UndefinedTable:
        return {}
    return {tuple(row[column] for column in key_columns): row for row in rows}


def differences(found: Rows,
                expected: Rows) -> dict[tuple[Any, ...], Any]:
    """Each row that differs: ``(found, expected)`` of each differing column, or of the whole row."""
    return {key: {column: (found[key].get(column), value) for column, value in expected[key].items()
                  if found[key].get(column) != value} or (found[key], expected[key])
            if key in found and key in expected else (found.get(key), expected.get(key))
            for key in found.keys() | expected.keys() if found.get(key) != expected.get(key)}


def wait_for_rows(connection: Any, table: str, key_columns: list[str], rows: Rows,
                  still_working: Callable[[], None], timeout: float = 120.0) -> Rows:
    """The table's rows once they equal ``rows``, or as they are after ``timeout`` seconds; each second
    ``still_working`` raises if what fills the table has failed."""
    deadline = time.monotonic() + timeout
    while (found := postgresql_rows(connection, table, key_columns)) != rows and time.monotonic() < deadline:
        still_working()
        time.sleep(1)
    return found


# The recipe's worker settings (docs/events.md), and sink consumers that find the event topics within a
# second of their creation (the worker may subscribe before the pipeline has created them).
WORKER_SETTINGS = {"consumer.isolation.level": "read_committed", "consumer.metadata.max.age.ms": 1000}


def connectors(jdbc_url: str) -> dict[str, dict[str, str]]:
    """The JDBC sink of docs/events.md's recipe for the tables, the same behind ExtractNewRecordState, and
    one for each probe table."""
    sink = {"connector.class": JDBC_SINK, "connection.url": jdbc_url, "connection.username": "postgres",
            "connection.password": "", "insert.mode": "upsert", "delete.enabled": "true",
            "primary.key.mode": "record_key", "schema.evolution": "basic", "tasks.max": "1"}
    topics = ",".join(f"{SERVER}.shop.{table}" for table in TABLES)
    return {"tables": {**sink, "topics": topics},
            "unwrapped": {**sink, "topics": topics, "collection.name.format": "unwrapped_${topic}",
                          "transforms": "unwrap",
                          "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
                          "transforms.unwrap.add.fields": "op,source.ts_ms"},
            **{table: {**sink, "topics": f"{SERVER}.shop.{table}"} for table in PROBES}}


def test_debezium_jdbc_sink_writes_the_tables_into_postgresql(real_kafka: Any, spark: Any,
                                                              tmp_path: Path) -> None:
    """Debezium's JDBC sink (upsert, deletes, record keys, basic schema evolution) makes of the events of
    every table the table itself, and ExtractNewRecordState's ``source.ts_ms`` is each row's write time; the
    types it cannot take fail its task with the error docs/events.md quotes."""
    from cassandra_cdc.localcluster import ConnectWorker, PostgresServer
    from cassandra_cdc.localcluster.artifacts import connect_plugin_path, postgres_home

    require_jvm_artifacts(connect_plugin_path, postgres_home)
    import psycopg
    from psycopg.rows import dict_row
    from psycopg.types import TypeInfo
    from psycopg.types.hstore import register_hstore

    (tmp_path / "schema.cql").write_text(SCHEMA)
    schema = parse_schema(SCHEMA)
    cluster = Cluster(tmp_path / "cluster", schema, nodes=3, rf=3, cassandra_version="4.1")
    # Written an hour ago: the write time cannot be mistaken for the time the events were processed.
    statements = operations(time.time_ns() // 1000 - 3600 * 10**6)
    agents = start_agents(cluster, real_kafka, SERVER, tmp_path)
    pipeline = None
    try:
        cluster.run(statements, sync_every=5)
        cluster.close_all()
        wait_until(lambda: all(agent.metrics.registry.get_sample_value(PENDING_SEGMENTS) == 0
                               for agent, _ in agents), "the agents to publish every segment", timeout=120)
        pipeline = start(spark, load_pipeline_config(None, {
            "server": SERVER, "checkpoint": str(tmp_path / "checkpoint"),
            "kafka.bootstrap_servers": real_kafka.bootstrap_servers, "output.static_only_rows": "skip",
            "spark.trigger_interval": "500 milliseconds"}))
        with PostgresServer(tmp_path / "postgres") as postgres, \
                psycopg.connect(postgres.connection_string, autocommit=True,
                                row_factory=dict_row) as connection:
            connection.execute("CREATE EXTENSION hstore")  # where the sink puts a map
            register_hstore(TypeInfo.fetch(connection, "hstore"), connection)
            with ConnectWorker(tmp_path / "connect", real_kafka.bootstrap_servers,
                               connectors(postgres.jdbc_url), heap="512m",
                               worker_settings=WORKER_SETTINGS) as worker:
                def still_working() -> None:
                    assert pipeline is not None and pipeline.exception() is None, pipeline.exception()
                    failed = {task for task in worker.failures()
                              if task.split("/")[0] in ("tables", "unwrapped")}
                    assert not failed, worker.failure("a task failed")

                for table in TABLES:
                    key_columns = [c.name for c in schema.table("shop", table).primary_key]
                    expected = expected_rows(cluster, table)
                    changes = last_changes(statements, table, key_columns, expected)
                    unwrapped = {key: {**row, "__op": changes[key][0], "__source_ts_ms": changes[key][1]}
                                 for key, row in expected.items()}
                    for name, rows in ((f"{SERVER}_shop_{table}", expected),
                                       (f"unwrapped_{SERVER}_shop_{table}", unwrapped)):
                        found = wait_for_rows(connection, name, key_columns, rows, still_working)
                        assert found == rows, f"{name}: {differences(found, rows)}"
                for table, (_, stored) in TAKEN.items():
                    rows = {(1,): {"id": 1, "v": stored}}
                    name = f"{SERVER}_shop_{table}"
                    assert wait_for_rows(connection, name, ["id"], rows, still_working) == rows, name
                for table, (_, error) in REFUSED.items():
                    trace = wait_until(lambda: worker.failures().get(f"{table}/0"),
                                       f"the task of {table} to fail", timeout=60, step=0.5)
                    assert error in trace, trace
    finally:
        if pipeline is not None:
            pipeline.stop()
        for agent, thread in agents:
            agent.stop()
            thread.join(timeout=30)
