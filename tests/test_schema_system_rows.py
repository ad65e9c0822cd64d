"""Schemas built from system_schema rows, as cassandra-driver returns them from a 3.x-5.0 cluster."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from cassandra.util import OrderedMap, SortedSet

from cassandra_cdc.schema import (ColumnKind, KeyspaceMetadata, Schema, SchemaError, TableMetadata,
                                  parse_schema, schema_from_system_schema_rows)
from cassandra_cdc.schema.model import system_table_id

ORDERS_ID = uuid.UUID("3b8e1a70-9f4e-11ee-8c90-0242ac120002")
VIEW_ID = uuid.UUID("7d1c9f40-9f4e-11ee-8c90-0242ac120002")


def keyspace_row(name: str, replication: dict[str, str]) -> dict[str, Any]:
    return {"keyspace_name": name, "durable_writes": True, "replication": OrderedMap(replication)}


def table_row(keyspace: str, name: str, table_id: uuid.UUID, flags: set[str] | None, **options: Any) \
        -> dict[str, Any]:
    # The driver returns an empty set or map as None.
    return {"keyspace_name": keyspace, "table_name": name, "id": table_id,
            "flags": SortedSet(flags) if flags else None, "cdc": None, "extensions": None,
            "bloom_filter_fp_chance": 0.01, "caching": OrderedMap([("keys", "ALL"), ("rows_per_partition", "NONE")]),
            "comment": "", "gc_grace_seconds": 864000, "speculative_retry": "99p", **options}


def column_row(keyspace: str, table: str, name: str, kind: str, cql_type: str, position: int = -1,
               order: str = "none") -> dict[str, Any]:
    return {"keyspace_name": keyspace, "table_name": table, "column_name": name,
            "column_name_bytes": name.encode(), "clustering_order": order, "kind": kind, "position": position,
            "type": cql_type}


def dropped_row(keyspace: str, table: str, name: str, cql_type: str, dropped_time: Any, kind: str | None) \
        -> dict[str, Any]:
    row = {"keyspace_name": keyspace, "table_name": table, "column_name": name, "dropped_time": dropped_time,
           "type": cql_type}
    if kind is not None:
        row["kind"] = kind
    return row


KEYSPACES = [keyspace_row("shop", {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3"}),
             keyspace_row("legacy", {"class": "org.apache.cassandra.locator.SimpleStrategy",
                                     "replication_factor": "1"}),
             keyspace_row("system", {"class": "org.apache.cassandra.locator.LocalStrategy"})]

# Clustered by type name: "contact" comes before the "phone" type it uses.
TYPES = [
    {"keyspace_name": "shop", "type_name": "contact", "field_names": ["email", "phones"],
     "field_types": ["text", "frozen<list<frozen<phone>>>"]},
    {"keyspace_name": "shop", "type_name": "phone", "field_names": ["country", "number"],
     "field_types": ["smallint", "text"]},
]

TABLES = [
    table_row("shop", "orders", ORDERS_ID, {"compound"}, cdc=True, comment="it's hot"),
    table_row("legacy", "item_tags", uuid.UUID("0e5f9a40-2f3c-11e7-93ae-92361f002671"), {"dense"}),
    table_row("legacy", "users", uuid.UUID("1e5f9a40-2f3c-11e7-93ae-92361f002671"), None),
    table_row("legacy", "page_views", uuid.UUID("2e5f9a40-2f3c-11e7-93ae-92361f002671"), {"counter"}),
    table_row("legacy", "events", uuid.UUID("3e5f9a40-2f3c-11e7-93ae-92361f002671"), {"compound", "dense"}),
    table_row("system", "IndexInfo", system_table_id("system", "IndexInfo"), {"dense"},
              comment="built column indexes"),
]

COLUMNS = [
    column_row("shop", "orders", "customer_id", "partition_key", "uuid", 0),
    column_row("shop", "orders", "order_day", "partition_key", "date", 1),
    column_row("shop", "orders", "order_id", "clustering", "timeuuid", 0, "desc"),
    column_row("shop", "orders", "Priority", "regular", "tinyint"),
    column_row("shop", "orders", "amount", "regular", "decimal"),
    column_row("shop", "orders", "buyer", "regular", "contact"),
    column_row("shop", "orders", "items", "regular", "map<text, int>"),
    column_row("shop", "orders", "seller", "regular", "frozen<contact>"),
    column_row("shop", "orders", "status", "regular", "text"),
    column_row("shop", "orders", "loyalty_points", "static", "bigint"),
    column_row("legacy", "item_tags", "item_id", "partition_key", "bigint", 0),
    column_row("legacy", "item_tags", "tag", "clustering", "text", 0, "asc"),
    column_row("legacy", "item_tags", "value", "regular", "empty"),
    column_row("legacy", "users", "user_id", "partition_key", "uuid", 0),
    column_row("legacy", "users", "column1", "clustering", "text", 0, "asc"),
    column_row("legacy", "users", "email", "static", "text"),
    column_row("legacy", "users", "name", "static", "text"),
    column_row("legacy", "users", "value", "regular", "blob"),
    column_row("legacy", "page_views", "page", "partition_key", "text", 0),
    column_row("legacy", "page_views", "column1", "clustering", "text", 0, "asc"),
    column_row("legacy", "page_views", "value", "regular", "counter"),
    column_row("legacy", "page_views", "views", "static", "counter"),
    column_row("legacy", "events", "day", "partition_key", "date", 0),
    column_row("legacy", "events", "ts", "clustering", "timeuuid", 1, "desc"),
    column_row("legacy", "events", "bucket", "clustering", "int", 0, "asc"),
    column_row("legacy", "events", "payload", "regular", "blob"),
    column_row("system", "IndexInfo", "table_name", "partition_key", "text", 0),
    column_row("system", "IndexInfo", "index_name", "clustering", "text", 0, "asc"),
    column_row("system", "IndexInfo", "value", "regular", "'org.apache.cassandra.db.marshal.EmptyType'"),
    column_row("shop", "orders_by_status", "status", "partition_key", "text", 0),
    column_row("shop", "orders_by_status", "customer_id", "clustering", "uuid", 0, "asc"),
    column_row("shop", "orders_by_status", "order_day", "clustering", "date", 1, "asc"),
    column_row("shop", "orders_by_status", "order_id", "clustering", "timeuuid", 2, "desc"),
    column_row("shop", "orders_by_status", "amount", "regular", "decimal"),
]

DROPPED = [
    dropped_row("shop", "orders", "coupon", "text", datetime.datetime(2023, 11, 14, 22, 13, 20, 123000), "regular"),
    dropped_row("shop", "orders", "status", "int", 1700000000456, "regular"),
    dropped_row("shop", "orders", "region", "frozen<tuple<text, int>>", 1700000000789, None),
]

VIEWS = [{"keyspace_name": "shop", "view_name": "orders_by_status", "id": VIEW_ID, "base_table_id": ORDERS_ID,
          "base_table_name": "orders", "include_all_columns": False,
          "where_clause": "status IS NOT NULL AND customer_id IS NOT NULL", "comment": "", "gc_grace_seconds": 864000}]

# The same tables as `DESCRIBE ... WITH INTERNALS` would print them.
DESCRIBED = """
CREATE TYPE shop.phone (country smallint, number text);
CREATE TYPE shop.contact (email text, phones frozen<list<frozen<phone>>>);
CREATE TABLE shop.orders (
    customer_id uuid,
    order_day date,
    order_id timeuuid,
    "Priority" tinyint,
    amount decimal,
    buyer contact,
    items map<text, int>,
    seller frozen<contact>,
    loyalty_points bigint static,
    coupon text,
    status int,
    region frozen<tuple<text, int>>,
    PRIMARY KEY ((customer_id, order_day), order_id)
) WITH ID = 3b8e1a70-9f4e-11ee-8c90-0242ac120002
    AND CLUSTERING ORDER BY (order_id DESC)
    AND bloom_filter_fp_chance = 0.01
    AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}
    AND cdc = true
    AND comment = 'it''s hot'
    AND gc_grace_seconds = 864000
    AND speculative_retry = '99p';
ALTER TABLE shop.orders DROP coupon USING TIMESTAMP 1700000000123000;
ALTER TABLE shop.orders DROP status USING TIMESTAMP 1700000000456000;
ALTER TABLE shop.orders DROP region USING TIMESTAMP 1700000000789000;
ALTER TABLE shop.orders ADD status text;

CREATE TABLE legacy.users (
    user_id uuid PRIMARY KEY,
    email text,
    name text
) WITH COMPACT STORAGE
    AND ID = 1e5f9a40-2f3c-11e7-93ae-92361f002671
    AND bloom_filter_fp_chance = 0.01
    AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}
    AND comment = ''
    AND gc_grace_seconds = 864000
    AND speculative_retry = '99p';

CREATE TABLE system."IndexInfo" (
    table_name text,
    index_name text,
    PRIMARY KEY (table_name, index_name)
) WITH COMPACT STORAGE
    AND ID = 9f5c6374-d485-3229-9a0a-5094af9ad1e3
    AND CLUSTERING ORDER BY (index_name ASC)
    AND bloom_filter_fp_chance = 0.01
    AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}
    AND comment = 'built column indexes'
    AND gc_grace_seconds = 864000
    AND speculative_retry = '99p';
"""


def build(**changes: Any) -> Schema:
    rows = {"keyspaces": KEYSPACES, "tables": TABLES, "columns": COLUMNS, "dropped_columns": DROPPED,
            "types": TYPES, "views": VIEWS}
    return schema_from_system_schema_rows(**{**rows, **changes})


def test_keyspaces_and_user_types_resolved_in_dependency_order() -> None:
    schema = build()
    assert schema.keyspaces["shop"].replication == {
        "class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3"}
    contact = schema.keyspaces["shop"].user_types["contact"]
    assert contact.field_names == ("email", "phones")
    assert contact.parameters[1].cql == "frozen<list<frozen<phone>>>"
    assert contact.parameters[1].parameters[0].field_names == ("country", "number")


def test_regular_table() -> None:
    orders = build().table("shop", "orders")
    assert orders.id == ORDERS_ID and orders.cdc is True and not orders.compact_storage
    assert [(c.name, c.position) for c in orders.partition_key] == [("customer_id", 0), ("order_day", 1)]
    assert [(c.name, c.reversed) for c in orders.clustering] == [("order_id", True)]
    assert orders.column(b"Priority").type.cql == "tinyint"
    assert orders.column(b"buyer").is_complex and not orders.column(b"seller").is_complex
    assert orders.column(b"loyalty_points").kind is ColumnKind.STATIC
    assert orders.options == {"bloom_filter_fp_chance": "0.01",
                              "caching": "{'keys': 'ALL', 'rows_per_partition': 'NONE'}",
                              "comment": "'it''s hot'", "gc_grace_seconds": "864000", "speculative_retry": "'99p'"}


def test_dropped_columns_times_kinds_and_types() -> None:
    orders = build().table("shop", "orders")
    assert [(c.name, c.type.cql, c.kind, c.dropped_time) for c in orders.dropped] == [
        ("coupon", "text", ColumnKind.REGULAR, 1700000000123000),
        ("region", "tuple<text, int>", ColumnKind.REGULAR, 1700000000789000),
        ("status", "int", ColumnKind.REGULAR, 1700000000456000)]
    # A re-added column resolves to its current definition.
    assert orders.column(b"status").type.cql == "text" and orders.column(b"region").dropped_time is not None


def test_a_table_is_defined_when_its_row_or_a_type_it_uses_was_last_written() -> None:
    """orders uses contact, whose field uses phone; the users table uses no type; "label" is used by none."""
    def defined_at(phone: int, table: int) -> tuple[int | None, int | None]:
        written = {"contact": 1_000, "phone": phone, "label": 9_000}
        types = [*({**row, "written": written[row["type_name"]]} for row in TYPES),
                 {"keyspace_name": "shop", "type_name": "label", "field_names": ["text"], "field_types": ["text"],
                  "written": written["label"]}]
        table_write_times = [{"keyspace_name": row["keyspace_name"], "table_name": row["table_name"],
                              "written": table} for row in TABLES]
        schema = build(types=types, table_write_times=table_write_times)
        return schema.table("shop", "orders").defined_at, schema.table("legacy", "users").defined_at

    assert defined_at(phone=2_000, table=3_000) == (3_000, 3_000)
    assert defined_at(phone=4_000, table=3_000) == (4_000, 3_000)  # a field's type changed after the table
    assert build().table("shop", "orders").defined_at is None  # no write times read
    assert build().table("shop", "orders") == build(table_write_times=[
        {"keyspace_name": "shop", "table_name": "orders", "written": 5}]).table("shop", "orders")


def test_rows_give_the_table_describe_prints() -> None:
    described = parse_schema(DESCRIBED)
    built = build()
    for keyspace, name in [("shop", "orders"), ("legacy", "users"), ("system", "IndexInfo")]:
        assert built.table(keyspace, name) == described.table(keyspace, name), name


def test_dense_table_hides_its_empty_value_column() -> None:
    schema = build()
    for keyspace, name in [("legacy", "item_tags"), ("system", "IndexInfo")]:
        table = schema.table(keyspace, name)
        assert table.compact_storage and not table.is_static_compact
        value = table.column(b"value")
        assert (value.type.cql, value.type.fixed_length, value.kind) == ("empty", 0, ColumnKind.REGULAR)
        assert table.hidden_columns == (value,)
    assert schema.table_by_id(uuid.UUID("9f5c6374-d485-3229-9a0a-5094af9ad1e3")).name == "IndexInfo"


def test_static_compact_tables() -> None:
    schema = build()
    users = schema.table("legacy", "users")
    assert users.compact_storage and users.is_static_compact
    assert [c.name for c in users.hidden_columns] == ["column1", "value"]
    assert {c.name: c.kind for c in users.regular_and_static} == {
        "value": ColumnKind.REGULAR, "email": ColumnKind.STATIC, "name": ColumnKind.STATIC}
    page_views = schema.table("legacy", "page_views")
    assert page_views.is_static_compact and page_views.is_counter
    assert page_views.column(b"value").type.cql == "counter"


def test_compound_dense_table_orders_clustering_by_position() -> None:
    events = build().table("legacy", "events")
    assert events.compact_storage and events.hidden_columns == ()
    assert [(c.name, c.reversed) for c in events.clustering] == [("bucket", False), ("ts", True)]


def test_materialized_view() -> None:
    view = build().table("shop", "orders_by_status")
    assert view.id == VIEW_ID and not view.compact_storage
    assert [c.name for c in view.primary_key] == ["status", "customer_id", "order_day", "order_id"]
    assert view.options == {"comment": "''", "gc_grace_seconds": "864000"}


def test_every_table_round_trips_through_to_cql() -> None:
    schema = build()
    assert len(schema) == 7
    for table in schema:
        again = Schema()
        again.add_keyspace(KeyspaceMetadata("shop", user_types=dict(schema.keyspaces["shop"].user_types)))
        assert parse_schema(table.to_cql(), again).table(table.keyspace, table.name) == table, table.to_cql()


def test_column_name_bytes_are_the_name() -> None:
    columns = [dict(row) for row in COLUMNS]
    columns[3] = {**columns[3], "column_name": "priority", "column_name_bytes": "Prioritä".encode()}
    assert build(columns=columns).table("shop", "orders").column("Prioritä".encode()) is not None


@pytest.mark.parametrize("changes, message", [
    ({"tables": [table_row("legacy", "sc", uuid.uuid4(), {"super", "dense"})]},
     "system_schema.tables legacy.sc: super column families"),
    ({"columns": COLUMNS + [column_row("shop", "bad", "k", "partition_key", "nosuch", 0)],
      "tables": [table_row("shop", "bad", uuid.uuid4(), {"compound"})]},
     "system_schema.tables shop.bad: column 'k': unknown type 'nosuch'"),
    ({"columns": [], "tables": [table_row("shop", "bad", uuid.uuid4(), {"compound"})]},
     "system_schema.tables shop.bad: no partition key column"),
    ({"columns": [column_row("shop", "bad", "k", "partition_key", "int", 0),
                  column_row("shop", "bad", "v", "hidden", "int")],
      "tables": [table_row("shop", "bad", uuid.uuid4(), {"compound"})]},
     "column 'v' has unknown kind 'hidden'"),
    ({"types": TYPES[:1]}, "system_schema.types shop.contact: unknown type 'phone'"),
    ({"columns": [{**column_row("shop", "bad", "k", "partition_key", "int", 0), "column_name_bytes": b"\xff"}],
      "tables": [table_row("shop", "bad", uuid.uuid4(), {"compound"})]}, "column name ff is not UTF-8"),
])
def test_errors_name_the_row(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        build(**changes)


def test_table_metadata_is_sorted_the_same_whatever_the_row_order() -> None:
    reordered = build(columns=list(reversed(COLUMNS)), dropped_columns=list(reversed(DROPPED)))
    original = build()
    tables: list[TableMetadata] = list(original)
    assert all(reordered.table(t.keyspace, t.name) == t for t in tables)
