"""Debezium's schema change events on the ``<server>`` topic: the format against Debezium's schemas (as read
in its code), and on a real Kafka broker one record per table version across pipeline restarts and between
two publishers of one server. (The JsonConverter reads them back in test_connect_json, a real registry in
test_schema_registry.)"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from cassandra_cdc.kafka.schema_catalog import SchemaCatalog
from cassandra_cdc.kafka.schema_records import SchemaRecord
from cassandra_cdc.pipeline.event_sink import SinkSettings
from cassandra_cdc.pipeline.pipeline_config import PipelineConfig, load_config
from cassandra_cdc.pipeline.schema_changes import SchemaChangeEncoder, SchemaChangePublisher
from cassandra_cdc.pipeline.streaming_job import sink_settings, start
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Insert
from test_events import DEBEZIUM_SOURCE_COMMON, OUR_SOURCE_FIELDS, FakeRegistry, _shape
from test_pipeline_faults import TABLE_ID, V1, V2, RawPublisher, read_all, wait_for

SCHEMA = parse_schema("""
CREATE TYPE shop.addr (street text, number int);
CREATE TABLE shop.orders ("Id" uuid, line int, qty varint, home frozen<addr>, tags map<text, int>,
    seen set<timestamp>, PRIMARY KEY ("Id", line))
    WITH ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18 AND cdc = true AND comment = 'it''s';""")
ORDERS = SCHEMA.table("shop", "orders")
RECORD = SchemaRecord("shop", "orders", str(ORDERS.id), ORDERS.version_hash(), "CREATE TABLE …", "node2",
                      1714979289123)
# The items table of test_pipeline_faults after ALTER TABLE ADD color (V2), then DROP color, then ADD size.
V3 = V2 + "\nALTER TABLE app.items DROP color USING TIMESTAMP 1714979289123456;"
V4 = V3 + "\nALTER TABLE app.items ADD size int;"

# Debezium's SchemaFactory (schemaHistoryConnectorKeySchema, ...ValueSchema, schemaHistoryChangeSchema,
# ...TableSchema, ...ColumnSchema) as read in its code: (field, Connect type, optional).
DEBEZIUM_VALUE = [("source", "struct", False), ("ts_ms", "int64", False), ("databaseName", "string", True),
                  ("schemaName", "string", True), ("ddl", "string", True), ("tableChanges", "array", False)]
DEBEZIUM_CHANGE = [("type", "string", False), ("id", "string", False), ("table", "struct", True)]
DEBEZIUM_TABLE = [("defaultCharsetName", "string", True), ("primaryKeyColumnNames", "array", True),
                  ("columns", "array", False), ("comment", "string", True)]
DEBEZIUM_COLUMN = [("name", "string", False), ("jdbcType", "int32", False), ("nativeType", "int32", True),
                   ("typeName", "string", False), ("typeExpression", "string", True),
                   ("charsetName", "string", True), ("length", "int32", True), ("scale", "int32", True),
                   ("position", "int32", False), ("optional", "boolean", True),
                   ("autoIncremented", "boolean", True), ("generated", "boolean", True),
                   ("comment", "string", True), ("defaultValueExpression", "string", True),
                   ("enumValues", "array", True)]


def offline_config(server: str = "prod", **settings: Any) -> PipelineConfig:
    """A pipeline's configuration, for what reaches no Kafka."""
    return load_config(None, {"server": server, "checkpoint": "/unused", "kafka.bootstrap_servers": "k:9092",
                              **settings})


def test_key_and_value_have_debeziums_schemas() -> None:
    encoder = SchemaChangeEncoder(offline_config())
    key = json.loads(encoder.key("shop"))
    fields = [{"type": "string", "optional": False, "field": "databaseName"}]
    assert key == {"schema": {"type": "struct", "fields": fields, "optional": False,
                              "name": "io.debezium.connector.cassandra_cdc.SchemaChangeKey", "version": 1},
                   "payload": {"databaseName": "shop"}}
    schema = json.loads(encoder.value(RECORD, ORDERS, "CREATE", 1714979290000))["schema"]
    assert (schema["name"], schema["version"]) == ("io.debezium.connector.cassandra_cdc.SchemaChangeValue", 1)
    assert _shape(schema["fields"]) == DEBEZIUM_VALUE
    assert _shape(schema["fields"][0]["fields"]) == DEBEZIUM_SOURCE_COMMON + OUR_SOURCE_FIELDS
    change = schema["fields"][5]["items"]
    assert (change["name"], change["version"], change["optional"]) == (
        "io.debezium.connector.schema.Change", 1, False)
    assert _shape(change["fields"]) == DEBEZIUM_CHANGE
    table = change["fields"][2]
    assert (table["name"], table["version"]) == ("io.debezium.connector.schema.Table", 1)
    assert _shape(table["fields"]) == DEBEZIUM_TABLE
    assert table["fields"][1]["items"] == {"type": "string", "optional": False}
    column = table["fields"][2]["items"]
    assert (column["name"], column["version"], column["optional"]) == (
        "io.debezium.connector.schema.Column", 1, False)
    assert _shape(column["fields"]) == DEBEZIUM_COLUMN


def test_value_describes_the_table_version() -> None:
    encoder = SchemaChangeEncoder(offline_config(cluster="main"))
    payload = json.loads(encoder.value(RECORD, ORDERS, "ALTER", 1714979290000))["payload"]
    assert {k: payload["source"][k] for k in ("connector", "name", "ts_ms", "db", "cluster", "keyspace",
                                              "table", "node", "segment", "position")} == {
        "connector": "cassandra_cdc", "name": "prod", "ts_ms": 1714979289123, "db": "shop", "cluster": "main",
        "keyspace": "shop", "table": "orders", "node": "node2", "segment": None, "position": None}
    assert (payload["ts_ms"], payload["databaseName"], payload["schemaName"], payload["ddl"]) == (
        1714979290000, "shop", None, "CREATE TABLE …")
    [change] = payload["tableChanges"]
    assert (change["type"], change["id"]) == ("ALTER", '"shop"."orders"')
    table = change["table"]
    assert (table["defaultCharsetName"], table["primaryKeyColumnNames"], table["comment"]) == (
        None, ["Id", "line"], "it's")
    # The columns in the events' order (Cassandra's: the primary key, then simple before multi-cell columns).
    assert [(c["name"], c["jdbcType"], c["typeName"], c["typeExpression"], c["position"], c["optional"])
            for c in table["columns"]] == [
        ("Id", 1111, "uuid", "uuid", 1, False), ("line", 4, "int", "int", 2, False),
        ("home", 2002, "addr", "frozen<addr>", 3, True), ("qty", 2, "varint", "varint", 4, True),
        ("seen", 2003, "set", "set<timestamp>", 5, True), ("tags", 1111, "map", "map<text, int>", 6, True)]
    assert {(c["nativeType"], c["charsetName"], c["length"], c["scale"], c["autoIncremented"], c["generated"],
             c["comment"], c["defaultValueExpression"], c["enumValues"]) for c in table["columns"]} == {
        (None, None, None, None, False, False, None, None, None)}


def test_excluded_columns_are_left_out_of_the_columns_and_the_cql_but_the_primary_keys() -> None:
    excluded = {"output.column_exclude_list": r"shop\.orders\.(id|qty|seen)"}
    encoder = SchemaChangeEncoder(offline_config(**excluded))
    payload = json.loads(encoder.value(RECORD, ORDERS, "CREATE", 1714979290000))["payload"]
    table = payload["tableChanges"][0]["table"]
    assert [c["name"] for c in table["columns"]] == ["Id", "line", "home", "tags"]
    assert table["primaryKeyColumnNames"] == ["Id", "line"]
    assert parse_schema(payload["ddl"]).table("shop", "orders") == dataclasses.replace(
        ORDERS, regular_and_static=tuple(c for c in ORDERS.regular_and_static if c.name in ("home", "tags")))


def test_avro_records_read_back_with_the_schemas_registered(monkeypatch: Any) -> None:
    registry = FakeRegistry()
    monkeypatch.setattr("cassandra_cdc.pipeline.schema_changes.SchemaRegistry", lambda settings: registry)
    encoder = SchemaChangeEncoder(offline_config(**{"output.format": "avro",
                                                    "output.schema_registry_url": "http://r"}))
    assert registry.read(encoder.key("shop")) == {"databaseName": "shop"}
    value = registry.read(encoder.value(RECORD, ORDERS, "CREATE", 1714979290000))
    json_value = SchemaChangeEncoder(offline_config()).value(RECORD, ORDERS, "CREATE", 1714979290000)
    assert value == json.loads(json_value)["payload"]
    assert list(registry.subjects) == ["prod-key", "prod-value"]
    record = registry.subjects["prod-value"]
    assert (record["namespace"], record["name"], record["connect.name"]) == (
        "io.debezium.connector.cassandra_cdc", "SchemaChangeValue",
        "io.debezium.connector.cassandra_cdc.SchemaChangeValue")
    changes = record["fields"][5]
    assert changes["type"]["type"] == "array" and changes["type"]["items"]["connect.name"] == \
        "io.debezium.connector.schema.Change"


def publish_version(publisher: RawPublisher, cql: str, node: str, dropped: bool = False) -> None:
    """``cql``'s app.items, published to the catalog as the agent on ``node`` does (``dropped``: its drop)."""
    record = SchemaRecord.of(parse_schema(cql).table("app", "items"), node, dropped)
    publisher.producer.produce(f"{publisher.server}.table-schemas", record.encode(), record.key)
    publisher.producer.flush(30)


def changes(bootstrap: str, server: str) -> list[tuple[str, list[str]]]:
    """Each committed record of ``<server>``: its change type and its table's columns."""
    return [(change["type"], [c["name"] for c in change["table"]["columns"]])
            for value in read_all(bootstrap, server) for change in value["payload"]["tableChanges"]]


def columns(cql: str) -> list[str]:
    """The columns of ``cql``'s app.items, in the order of its events."""
    return [c.name for c in parse_schema(cql).table("app", "items").columns]


def test_each_table_version_once_across_pipeline_restarts(real_kafka: Any, spark: Any,
                                                          tmp_path: Path) -> None:
    server = "ddl"
    bootstrap = real_kafka.bootstrap_servers
    publisher = RawPublisher(bootstrap, server)
    settings = {"server": server, "checkpoint": str(tmp_path / "checkpoint"),
                "kafka.bootstrap_servers": bootstrap, "spark.trigger_interval": "500 milliseconds"}
    try:
        v1 = publisher.schema(V1)  # each version from two nodes, as their agents publish it
        publish_version(publisher, V1, "node2")
        publisher.write(v1, Insert("app.items", {"id": 1, "name": "cup", "qty": 2},
                                   timestamp=time.time_ns() // 1000))
        query = start(spark, load_config(None, settings))
        try:
            assert wait_for(lambda: changes(bootstrap, server) == [("CREATE", columns(V1))])
            for cql in (V2, V3):  # ALTER TABLE ADD color, then DROP color
                publish_version(publisher, cql, "node1")
                publish_version(publisher, cql, "node2")
            assert wait_for(lambda: len(changes(bootstrap, server)) == 3)
        finally:
            query.stop()
        # After the restart: an agent publishes its version again at its start, another one the first version
        # (it lags behind); then ALTER TABLE ADD size. The pipeline writes the versions it lacks in the
        # catalog's order, so a duplicate of those before would come before the record of the last one.
        publish_version(publisher, V3, "node3")
        publish_version(publisher, V1, "node4")
        query = start(spark, load_config(None, settings))
        try:
            publish_version(publisher, V4, "node1")
            assert wait_for(lambda: ("ALTER", columns(V4)) in changes(bootstrap, server))
        finally:
            query.stop()
        assert changes(bootstrap, server) == [("CREATE", columns(V1)), ("ALTER", columns(V2)),
                                              ("ALTER", columns(V3)), ("ALTER", columns(V4))]
        assert columns(V2) == ["id", "color", "name", "qty"] and columns(V3) == columns(V1)
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the future is done
        [topic] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, server)]).values()
        described = topic.result()
        assert {name: described[name].value for name in ("cleanup.policy", "retention.ms")} == {
            "cleanup.policy": "delete", "retention.ms": "-1"}
        assert [v["payload"]["ddl"] for v in read_all(bootstrap, server)] == [
            parse_schema(cql).table("app", "items").ddl() for cql in (V1, V2, V3, V4)]
    finally:
        publisher.close()


@contextlib.contextmanager
def catalog_and_two_publishers(bootstrap: str,
                               server: str) -> Iterator[tuple[RawPublisher, SchemaChangePublisher,
                                                              SchemaChangePublisher]]:
    """A publisher of the server's catalog, as its agents, and two schema change publishers of the server, as
    two of its pipelines."""
    pipeline_config = load_config(None, {"server": server, "checkpoint": "/unused",
                                         "kafka.bootstrap_servers": bootstrap})
    sink: SinkSettings = sink_settings(pipeline_config)
    catalog = RawPublisher(bootstrap, server)
    first, second = (SchemaChangePublisher(pipeline_config, sink) for _ in range(2))
    try:
        yield catalog, first, second
    finally:
        first.close()
        second.close()
        catalog.close()


def test_two_publishers_of_one_server_write_each_version_once(real_kafka: Any) -> None:
    """Each publisher registers the server's transactional id before it reads what the topic holds: the one
    that registered last writes; the other, fenced, registers again, reads again, and writes what is left."""
    server = "twice"
    bootstrap = real_kafka.bootstrap_servers
    with catalog_and_two_publishers(bootstrap, server) as (catalog, first, second):
        publish_version(catalog, V1, "node1")
        assert first.publish() == 1
        publish_version(catalog, V2, "node1")
        assert second.publish() == 1  # registered: the first is fenced
        publish_version(catalog, V3, "node1")
        with pytest.raises(KafkaException):  # it reads V2 on the topic, writes V3: fenced
            first.publish()
        assert first.publish() == 1  # registered again, it reads again and writes V3
        # A commit returns before its markers reach the topic: until then a read_committed reader sees V2 last.
        assert wait_for(lambda: len(changes(bootstrap, server)) == 3)
        assert second.publish() == 0  # V3 is on the topic now
        assert first.publish() == 0 and second.publish() == 0
    assert changes(bootstrap, server) == [("CREATE", columns(V1)), ("ALTER", columns(V2)),
                                          ("ALTER", columns(V3))]


def test_a_dropped_table_is_one_drop_after_its_versions(real_kafka: Any) -> None:
    """Each agent publishes the drop with the last definition it had, one of them an older one (its node had
    not applied the ALTER): one ``DROP``, of the table as the catalog held it, once across publishers; the
    catalog still decodes the table's records (those published before the drop, read late) until a table of
    its name is created again, another table (another id): ``CREATE``."""
    server = "dropped"
    bootstrap = real_kafka.bootstrap_servers
    created_again = V1.replace(TABLE_ID, "5c0e7a10-0000-4000-8000-00000000000b")
    with catalog_and_two_publishers(bootstrap, server) as (catalog, first, second):
        publish_version(catalog, V1, "node1")
        publish_version(catalog, V2, "node1")
        assert first.publish() == 2
        publish_version(catalog, V1, "node3", dropped=True)
        publish_version(catalog, V2, "node1", dropped=True)
        assert first.publish() == 1
        assert wait_for(lambda: len(changes(bootstrap, server)) == 3)
        assert second.publish() == 0
        items = parse_schema(V2).table("app", "items")
        read_back = SchemaCatalog(bootstrap, (f"{server}.table-schemas",))
        try:
            held = read_back.table(items.id)
        finally:
            read_back.close()
        assert held is not None and held[0].to_cql() == items.to_cql()
        publish_version(catalog, created_again, "node2")
        assert second.publish() == 1
    assert changes(bootstrap, server) == [("CREATE", columns(V1)), ("ALTER", columns(V2)),
                                          ("DROP", columns(V2)), ("CREATE", columns(V1))]
    drop = read_all(bootstrap, server)[2]["payload"]
    assert (drop["ddl"], drop["databaseName"], drop["source"]["node"]) == (
        "DROP TABLE app.items;", "app", "node3")
