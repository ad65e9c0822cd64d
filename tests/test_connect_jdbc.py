"""The events consumed by the real consumers a Debezium user runs: a Kafka Connect 4.3 standalone worker,
Connect's JsonConverter, Debezium's JDBC sink (3.2) and its ExtractNewRecordState, writing into a real
PostgreSQL 14, configured as docs/events.md's recipe says (its blocks read from the file: ``sink_recipe``);
and the same changes in Avro, registered in a real schema registry (Apicurio 2.4, through its Confluent API)
and read by Apicurio's AvroConverter. Three simulated replicas' agents and the Spark pipeline produce the
events on a real Kafka broker (the JSON events first, then, from the same raw topic, the Avro ones: one
pipeline query at a time); the PostgreSQL tables must then hold what the simulator's model of the writes says
the Cassandra tables hold (computed from the CQL operations, not from our events), counters and vectors
included, after a TRUNCATE (one applied from each format) and after TTL expiries too."""

from __future__ import annotations

import datetime
import decimal
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from cassandra import util

from agent_harness import NodeTruncations, TopicReader, wait_until
from conftest import require_jvm_artifacts, start_agents
from sink_recipe import SinkRecipe, sink_recipe
from cassandra_cdc.pipeline.pipeline_config import SchemaRegistrySettings, load_config as load_pipeline_config
from cassandra_cdc.pipeline.streaming_job import start
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Cluster, CounterAdd, DeletePartition, DeleteRow, Insert, Update

SERVER = "sink"
AVRO_SERVER = "sinkavro"  # the Avro events' topics: sinkavro.shop.<table>
REGISTRY_USER, REGISTRY_PASSWORD = "cdc", "registry secret"
APICURIO_AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
SCHEMA = """
CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '3'};
CREATE TABLE shop.kinds (
    id int PRIMARY KEY, name text, small int, big bigint, flag boolean, ratio double, weight float,
    price decimal, ref uuid, made timeuuid, seen timestamp, day date, at time, data blob,
    address inet, tags list<text>, stock map<text, int>, tiny tinyint, short smallint, marks set<int>
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
CREATE TABLE shop.notes (id int PRIMARY KEY, body text) WITH ID = 7c3e0000-0000-4000-8000-000000000009
    AND cdc = true;
CREATE TABLE shop.expiring (id int PRIMARY KEY, v text, n int)
    WITH ID = 7c3e0000-0000-4000-8000-00000000000a AND cdc = true;
CREATE TABLE shop.drafts (id int PRIMARY KEY, body text) WITH ID = 7c3e0000-0000-4000-8000-00000000000b
    AND cdc = true;
CREATE TABLE shop.vectors (id int PRIMARY KEY, v vector<float, 3>)
    WITH ID = 7c3e0000-0000-4000-8000-00000000000c AND cdc = true;
CREATE TABLE shop.tallies (id int PRIMARY KEY, hits counter, misses counter)
    WITH ID = 7c3e0000-0000-4000-8000-00000000000d AND cdc = true;
"""
TABLES = ("kinds", "orders")  # also behind ExtractNewRecordState
COUNTERS = "tallies"  # counter columns: their summed values, incremented in several statements
# Truncated once their rows are in PostgreSQL: notes from the JSON events (then written again), drafts from
# the Avro ones (the Avro pipeline starts after the truncation of notes and replays it with the rows written
# before and after it, all in Kafka before the sink reads them, on different partitions: the sink, which
# applies them in the order it reads them, would then keep or drop rows by that order, see docs/events.md).
TRUNCATED = "notes"
AVRO_TRUNCATED = "drafts"
EXPIRING = "expiring"
# Seconds after the test's start when the TTLs of shop.expiring run out: after its rows have reached
# PostgreSQL (the pipeline, the registry and the worker start within it), so that the expiries are changes
# the sink applies.
EXPIRY_DELAY = 150
# A table (its column v) per type the sink takes only with the recipe's handling modes: the value written, and
# what psycopg reads back (a varint as text; a map, a user type, a tuple, a list of lists as their CQL JSON in
# a json column, keys as text; a duration as ISO 8601 text).
TAKEN: dict[str, tuple[Any, Any]] = {
    "wide": (10**20 + 1, "100000000000000000001"),
    "idmaps": ({1: "a"}, {"1": "a"}),
    "spans": (util.Duration(1, 2, 3_000_000_000), "P0Y1M2DT0H0M3S"),
    "homes": (("main", 1), {"street": "main", "zip": 1}),
    "pairs": ((1, "x"), [1, "x"]),
    "grids": ([[1, 2], [3]], [[1, 2], [3]]),
    "vectors": ([1.5, -2.0, 0.25], [1.5, -2.0, 0.25]),
}
PROBES = {table: value for table, (value, _) in TAKEN.items()}
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
            "address": f"10.0.0.{index}", "tags": [f"t{index}", "x"], "stock": {"red": index, "blue": -index},
            "tiny": -index, "short": 300 * index, "marks": {index, -index, 100}}


def operations(first_timestamp: int, expiry: int) -> list[Any]:
    """Inserts, updates, a row delete and a partition delete on both tables, a static-only partition, a row
    of each probe table, rows of each table to truncate, and TTLs: a row whose TTL ran out before the
    pipeline started, a row and a cell whose TTLs run out at ``expiry`` (seconds); each statement a
    millisecond after the one before."""
    timestamps = iter(range(first_timestamp, first_timestamp + 10**9, 1000))

    def at() -> int:
        return next(timestamps)
    statements: list[Any] = [Insert("shop.kinds", values=kinds_values(index), timestamp=at())
                             for index in range(1, 6)]
    expiring = f"shop.{EXPIRING}"
    statements += [Insert(expiring, values={"id": 1, "v": "gone before", "n": 1}, ttl=60, timestamp=at()),
                   Insert(expiring, values={"id": 2, "v": "cell expires", "n": 2}, timestamp=at())]
    written = at()  # a TTL counts from the write's own time
    statements.append(Update(expiring, key={"id": 2}, set={"n": 20}, ttl=expiry - written // 10**6,
                             timestamp=written))
    written = at()
    statements += [Insert(expiring, values={"id": 3, "v": "row expires", "n": 3},
                          ttl=expiry - written // 10**6, timestamp=written),
                   Insert(expiring, values={"id": 4, "v": "stays", "n": 4}, timestamp=at())]
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
          for table, value in PROBES.items()],
        *[CounterAdd(f"shop.{COUNTERS}", key={"id": key}, column=column, delta=delta, timestamp=at())
          for key, column, delta in ((1, "hits", 5), (1, "hits", 3), (1, "misses", -2), (2, "hits", 1))],
        *[Insert(f"shop.{table}", values={"id": index, "body": f"before {index}"}, timestamp=at())
          for table in (TRUNCATED, AVRO_TRUNCATED) for index in range(1, 4)]]


def plain_decimal(value: decimal.Decimal) -> str:
    """A decimal as ``decimal_handling_mode: string`` writes it (Java's ``toPlainString``)."""
    return format(value, "f")


def in_postgresql(value: Any) -> Any:
    """A CQL value (as the DataStax driver gives it) as psycopg reads it back from the column the sink made
    with the recipe's handling modes: a decimal as its digits in a text column, time in a time column
    (microseconds), a set in an array (in Cassandra's order), a map in a json column (keys as text)."""
    if isinstance(value, decimal.Decimal):
        return plain_decimal(value)
    if isinstance(value, util.SortedSet):
        return list(value)
    if isinstance(value, util.Date):
        return value.date()
    if isinstance(value, util.Time):
        return datetime.time(value.hour, value.minute, value.second, value.nanosecond // 1000)
    if isinstance(value, Mapping):
        return {str(key): element for key, element in value.items()}
    return value


def expected_rows(cluster: Cluster, table: str) -> Rows:
    """``SELECT *`` of the simulator's model of the table now, less the rows of partitions with only static
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


# What a deployment names, in the recipe's worker settings: the worker here sets its own.
WORKER_SETTINGS_SET_HERE = ("bootstrap.servers", "offset.storage.file.filename", "plugin.path")


def avro_converters(recipe: SinkRecipe, registry_url: str, ca_file: Path) -> dict[str, str]:
    """The converters of docs/events.md's Avro recipe (Apicurio's AvroConverter for keys and values, reading
    the Confluent wire format), with this registry's URL (Apicurio's own API), login and CA."""
    ours = {"apicurio.registry.url": registry_url, "apicurio.auth.username": REGISTRY_USER,
            "apicurio.auth.password": REGISTRY_PASSWORD,
            "apicurio.rest.request.ssl.ca-bundle.location": str(ca_file)}
    converters = dict(recipe.avro_converters)
    for side in ("key", "value"):
        assert converters[f"{side}.converter"] == APICURIO_AVRO_CONVERTER
        converters.update({f"{side}.converter.{name}": value for name, value in ours.items()})
    return converters


def connectors(recipe: SinkRecipe, jdbc_url: str, avro: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """docs/events.md's JDBC sink for every table of the JSON events, the same behind ExtractNewRecordState
    for ``TABLES``, and the same for the Avro events with the ``avro`` converters; into this database."""
    sink = {key: value for key, value in recipe.sink.items() if key not in ("name", "topics.regex")}
    assert sink["connector.class"] == JDBC_SINK
    sink.update({"connection.url": jdbc_url, "connection.username": "postgres", "connection.password": ""})
    return {"tables": {**sink, "topics.regex": recipe.topics_regex(SERVER)},
            "unwrapped": {**sink, **recipe.unwrap, "topics": ",".join(f"{SERVER}.shop.{t}" for t in TABLES),
                          "collection.name.format": "unwrapped_${topic}"},
            "avro": {**sink, **avro, "topics.regex": recipe.topics_regex(AVRO_SERVER)}}


def avro_heartbeat(broker: Any, registry_settings: dict[str, str]) -> tuple[Any, Any]:
    """The key and value of the Avro pipeline's first heartbeat, decoded with the schemas the registry
    gives for their ids."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"__debezium-heartbeat.{AVRO_SERVER}"
    reader = TopicReader(broker, topic)
    try:
        wait_until(lambda: reader.poll() >= 0 and reader.messages, "an Avro heartbeat", timeout=60)
    finally:
        reader.consumer.close()
    decode = AvroDeserializer(SchemaRegistryClient(registry_settings))
    message = reader.messages[0]
    return (decode(message.key(), SerializationContext(topic, MessageField.KEY)),
            decode(message.value(), SerializationContext(topic, MessageField.VALUE)))




def test_debezium_jdbc_sink_writes_the_tables_into_postgresql(real_kafka: Any, spark: Any,
                                                              tmp_path: Path) -> None:
    """Debezium's JDBC sink as docs/events.md's recipe sets it up (upsert, deletes, truncates, record keys,
    basic schema evolution, every table's topic by a regex) makes of the events of every table the table
    itself, from Connect JSON and from Avro through the registry, with the recipe's handling modes (decimals
    and varints as text; maps, user types, tuples and nested collections as CQL JSON), after a TRUNCATE and
    after TTL expiries too; ExtractNewRecordState's ``source.ts_ms`` is each row's write time."""
    from cassandra_cdc.agent.truncations import Truncation, TruncationWatch
    from cassandra_cdc.localcluster import ConnectWorker, PostgresServer, SchemaRegistryServer
    from cassandra_cdc.localcluster.artifacts import connect_plugin_path, postgres_home, registry_application
    from cassandra_cdc.localcluster.certificates import CertificateAuthority

    require_jvm_artifacts(connect_plugin_path, postgres_home, registry_application)
    import psycopg
    from psycopg.rows import dict_row

    (tmp_path / "schema.cql").write_text(SCHEMA)
    schema = parse_schema(SCHEMA)
    cluster = Cluster(tmp_path / "cluster", schema, nodes=3, rf=3, cassandra_version="4.1")
    expiry = int(time.time()) + EXPIRY_DELAY
    # Written an hour ago: the write time cannot be mistaken for the time the events were processed.
    statements = operations(time.time_ns() // 1000 - 3600 * 10**6, expiry)
    authority = CertificateAuthority.create(tmp_path / "tls")
    certificate = authority.issue(tmp_path / "tls", "registry", hosts=["localhost", "127.0.0.1"])
    agents = start_agents(cluster, real_kafka, SERVER, tmp_path)
    # Each node's system.local.truncated_at, which the agents read by CQL from a real node: set by the test.
    truncated_at = [NodeTruncations(node=agent.config.node_id) for agent, _ in agents]
    for (agent, _), node in zip(agents, truncated_at):
        agent.truncations = TruncationWatch(agent.config, agent.positions, node)  # type: ignore[arg-type]
    pipeline = None

    def published() -> None:
        cluster.close_all()
        wait_until(lambda: all(agent.metrics.registry.get_sample_value(PENDING_SEGMENTS) == 0
                               for agent, _ in agents), "the agents to publish every segment", timeout=120)
    try:
        cluster.run(statements, sync_every=5)
        published()
        recipe = sink_recipe()
        pipeline_settings = {
            "server": SERVER, "checkpoint": str(tmp_path / "checkpoint"),
            "kafka.bootstrap_servers": real_kafka.bootstrap_servers, **recipe.pipeline_settings(),
            "spark.trigger_interval": "500 milliseconds"}
        pipeline = start(spark, load_pipeline_config(None, pipeline_settings))
        with SchemaRegistryServer(tmp_path / "registry", certificate,
                                  users={REGISTRY_USER: REGISTRY_PASSWORD}) as registry, \
                PostgresServer(tmp_path / "postgres") as postgres, \
                psycopg.connect(postgres.connection_string, autocommit=True,
                                row_factory=dict_row) as connection:
            sinks = connectors(recipe, postgres.jdbc_url,
                               avro_converters(recipe, registry.core_url, authority.certificate))
            worker_settings = {key: value for key, value in recipe.worker.items()
                               if key not in WORKER_SETTINGS_SET_HERE}
            with ConnectWorker(tmp_path / "connect", real_kafka.bootstrap_servers, sinks, heap="512m",
                               worker_settings=worker_settings) as worker:
                def still_working() -> None:
                    assert pipeline is not None and pipeline.exception() is None, pipeline.exception()
                    failed = {task for task in worker.failures()
                              if task.split("/")[0] in ("tables", "unwrapped", "avro")}
                    assert not failed, worker.failure("a task failed")

                def assert_rows(name: str, key_columns: list[str], rows: Rows) -> None:
                    found = wait_for_rows(connection, name, key_columns, rows, still_working)
                    assert found == rows, f"{name}: {differences(found, rows)}"

                def truncate(server: str, table: str) -> int:
                    """The table's rows are in PostgreSQL, then a TRUNCATE empties it: its time (ms)."""
                    sunk = f"{server}_shop_{table}"
                    assert_rows(sunk, ["id"], expected_rows(cluster, table))
                    truncation_ms = time.time_ns() // 10**6
                    for node in truncated_at:
                        # Covering every write so far: a segment id no node has reached (ids are start
                        # times); the truncations before stay in the node's list, as in system.local.
                        node.truncations = [*node.truncations, Truncation(schema.table("shop", table).id,
                                                                          truncation_ms, 0, truncation_ms)]
                    assert_rows(sunk, ["id"], {})
                    return truncation_ms

                for table in TABLES:
                    key_columns = [c.name for c in schema.table("shop", table).primary_key]
                    expected = expected_rows(cluster, table)
                    changes = last_changes(statements, table, key_columns, expected)
                    assert_rows(f"{SERVER}_shop_{table}", key_columns, expected)
                    assert_rows(f"unwrapped_{SERVER}_shop_{table}", key_columns,
                                {key: {**row, "__op": changes[key][0], "__source_ts_ms": changes[key][1]}
                                 for key, row in expected.items()})
                for table, (_, stored) in TAKEN.items():
                    assert_rows(f"{SERVER}_shop_{table}", ["id"], {(1,): {"id": 1, "v": stored}})
                assert_rows(f"{SERVER}_shop_{COUNTERS}", ["id"], expected_rows(cluster, COUNTERS))

                # TRUNCATE, and what is written after it lands.
                truncation_ms = truncate(SERVER, TRUNCATED)
                later = [Insert(f"shop.{TRUNCATED}", values={"id": index, "body": f"after {index}"},
                                timestamp=(truncation_ms + 1000 + index) * 1000) for index in (1, 4)]
                cluster.run(later, sync_every=5)
                published()
                assert_rows(f"{SERVER}_shop_{TRUNCATED}", ["id"],
                            {(index,): {"id": index, "body": f"after {index}"} for index in (1, 4)})

                # TTLs: the expired cell and row are gone (and the row whose TTL ran out before the
                # pipeline started never came).
                time.sleep(max(0.0, expiry + 1 - time.time()))
                expired = expected_rows(cluster, EXPIRING)
                assert 3 not in {key[0] for key in expired} and expired[(2,)]["n"] is None, expired
                assert_rows(f"{SERVER}_shop_{EXPIRING}", ["id"], expired)

                # Avro through the registry: the same raw records again, through a second pipeline (one query
                # runs at a time).
                pipeline.stop()
                avro_started_ms = time.time_ns() // 10**6
                pipeline = start(spark, load_pipeline_config(None, {
                    **pipeline_settings, "server": AVRO_SERVER,
                    "checkpoint": str(tmp_path / "avro-checkpoint"), "kafka.raw_topic": f"{SERVER}.raw",
                    "kafka.schema_topic": f"{SERVER}.table-schemas", "output.format": "avro",
                    "output.schema_registry.url": registry.url,
                    "output.schema_registry.ca_file": str(authority.certificate),
                    "output.schema_registry.username": REGISTRY_USER,
                    "output.schema_registry.password": REGISTRY_PASSWORD,
                    "output.heartbeat_interval_ms": 1000}))
                for table in (*TABLES, EXPIRING, COUNTERS):
                    key_columns = [c.name for c in schema.table("shop", table).primary_key]
                    assert_rows(f"{AVRO_SERVER}_shop_{table}", key_columns, expected_rows(cluster, table))
                for table, (_, stored) in TAKEN.items():
                    assert_rows(f"{AVRO_SERVER}_shop_{table}", ["id"], {(1,): {"id": 1, "v": stored}})
                truncate(AVRO_SERVER, AVRO_TRUNCATED)

                # The heartbeats in Avro, registered there too.
                key, value = avro_heartbeat(real_kafka, SchemaRegistrySettings(
                    url=registry.url, username=REGISTRY_USER, password=REGISTRY_PASSWORD,
                    ca_file=authority.certificate).client_settings())
                assert key == {"serverName": AVRO_SERVER}, key
                assert avro_started_ms <= value["ts_ms"] <= time.time_ns() // 10**6, value
    finally:
        if pipeline is not None:
            pipeline.stop()
        for agent, thread in agents:
            agent.stop()
            thread.join(timeout=30)
