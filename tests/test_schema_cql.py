"""CQL schema files (cqlsh DESCRIBE output, 3.0 to 5.0) and CQL types."""

from __future__ import annotations

import datetime
import decimal
import hashlib
import math
import uuid
from pathlib import Path

import pytest
from cassandra import util
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cassandra_cdc.schema import (ColumnKind, ColumnMetadata, CqlTypeError, KeyspaceMetadata, Schema, SchemaError,
                                  TableMetadata, load_schema_files, parse_schema, parse_type)
from cassandra_cdc.storage.partition_json import render_value
from cassandra_cdc.schema.cql import cql_literal
from cassandra_cdc.schema.model import compact_table_columns, system_table_id
from cassandra_cdc.schema.types import freeze, json_text, user_type

# --- DESCRIBE outputs, written as cqlsh prints them ------------------------------------------------

# Cassandra 4.1, `DESCRIBE KEYSPACE shop WITH INTERNALS`: ids, and dropped columns declared then dropped.
DESCRIBE_41 = """
CREATE KEYSPACE shop WITH replication = {'class': 'NetworkTopologyStrategy', 'dc1': '3', 'dc2': '2'}  AND durable_writes = true;

CREATE TYPE shop.address (
    street text,
    city text,
    zip_code int,
    phones frozen<list<text>>
);

CREATE TYPE shop.customer_info (
    name text,
    "homeAddress" frozen<address>,
    tags frozen<set<text>>
);

CREATE TABLE shop.orders (
    customer_id uuid,
    order_day date,
    order_id timeuuid,
    amount decimal,
    billing frozen<customer_info>,
    items map<text, int>,
    notes list<text>,
    shipping address,
    "Priority" tinyint,
    loyalty_points bigint static,
    coupon text,
    status int,
    PRIMARY KEY ((customer_id, order_day), order_id)
) WITH ID = 3b8e1a70-9f4e-11ee-8c90-0242ac120002
    AND CLUSTERING ORDER BY (order_id DESC)
    AND additional_write_policy = '99p'
    AND bloom_filter_fp_chance = 0.01
    AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}
    AND cdc = false
    AND comment = 'orders by customer and day; it''s hot'
    AND compaction = {'class': 'org.apache.cassandra.db.compaction.TimeWindowCompactionStrategy', 'compaction_window_size': '1', 'compaction_window_unit': 'DAYS', 'max_threshold': '32', 'min_threshold': '4'}
    AND compression = {'chunk_length_in_kb': '16', 'class': 'org.apache.cassandra.io.compress.LZ4Compressor'}
    AND memtable = 'default'
    AND crc_check_chance = 1.0
    AND default_time_to_live = 0
    AND extensions = {}
    AND gc_grace_seconds = 864000
    AND max_index_interval = 2048
    AND memtable_flush_period_in_ms = 0
    AND min_index_interval = 128
    AND read_repair = 'BLOCKING'
    AND speculative_retry = '99p';
ALTER TABLE shop.orders DROP coupon USING TIMESTAMP 1700000000123000;
ALTER TABLE shop.orders DROP status USING TIMESTAMP 1700000000456000;
ALTER TABLE shop.orders ADD status text;

CREATE INDEX orders_status_idx ON shop.orders (status);

CREATE CUSTOM INDEX orders_notes_idx ON shop.orders (values(notes)) USING 'org.apache.cassandra.index.sasi.SASIIndex' WITH OPTIONS = {'mode': 'CONTAINS'};

CREATE MATERIALIZED VIEW shop.orders_by_status AS
    SELECT customer_id, order_day, order_id, status, amount
    FROM shop.orders
    WHERE status IS NOT NULL AND customer_id IS NOT NULL AND order_day IS NOT NULL AND order_id IS NOT NULL
    PRIMARY KEY (status, customer_id, order_day, order_id)
 WITH ID = 7d1c9f40-9f4e-11ee-8c90-0242ac120002
    AND CLUSTERING ORDER BY (customer_id ASC, order_day ASC, order_id DESC)
    AND additional_write_policy = '99p'
    AND bloom_filter_fp_chance = 0.01
    AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}
    AND comment = ''
    AND gc_grace_seconds = 864000
    AND read_repair = 'BLOCKING'
    AND speculative_retry = '99p';

CREATE FUNCTION shop.add_amounts(a decimal, b decimal)
    CALLED ON NULL INPUT
    RETURNS decimal
    LANGUAGE java
    AS $$ if (a == null) return b; return a.add(b); $$;

CREATE AGGREGATE shop.sum_amounts(decimal)
    SFUNC add_amounts
    STYPE decimal
    INITCOND 0;
"""

# Cassandra 3.11 `DESCRIBE KEYSPACE legacy` (the driver's rendering: no ids, hidden columns left out).
DESCRIBE_311 = """
CREATE KEYSPACE legacy WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '1'}  AND durable_writes = true;

CREATE TABLE legacy.sensor_readings (
    sensor_id text,
    ts timestamp,
    reading double,
    PRIMARY KEY (sensor_id, ts)
) WITH COMPACT STORAGE
    AND CLUSTERING ORDER BY (ts DESC)
    AND bloom_filter_fp_chance = 0.01
    AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}
    AND comment = ''
    AND compaction = {'class': 'org.apache.cassandra.db.compaction.SizeTieredCompactionStrategy', 'max_threshold': '32', 'min_threshold': '4'}
    AND compression = {'chunk_length_in_kb': '64', 'class': 'org.apache.cassandra.io.compress.LZ4Compressor'}
    AND crc_check_chance = 1.0
    AND dclocal_read_repair_chance = 0.1
    AND default_time_to_live = 0
    AND gc_grace_seconds = 864000
    AND max_index_interval = 2048
    AND memtable_flush_period_in_ms = 0
    AND min_index_interval = 128
    AND read_repair_chance = 0.0
    AND speculative_retry = '99PERCENTILE';

CREATE TABLE legacy.item_tags (
    item_id bigint,
    tag text,
    PRIMARY KEY (item_id, tag)
) WITH COMPACT STORAGE
    AND CLUSTERING ORDER BY (tag ASC)
    AND comment = 'a set of tags, Thrift style';

CREATE TABLE legacy.users (
    user_id uuid PRIMARY KEY,
    email text,
    name text,
    value int
) WITH COMPACT STORAGE
    AND comment = 'a Thrift static column family';

CREATE TABLE legacy.page_views (
    page text PRIMARY KEY,
    views counter
) WITH COMPACT STORAGE;

CREATE TABLE legacy.events (
    day date,
    bucket int,
    ts timeuuid,
    payload blob,
    PRIMARY KEY (day, bucket, ts)
) WITH COMPACT STORAGE
    AND CLUSTERING ORDER BY (bucket ASC, ts DESC);
"""

# Cassandra 3.11 snapshot schema.cql (ColumnFamilyStoreCQLHelper): tabs, spaced maps, dropped columns.
SNAPSHOT_311 = """
CREATE TYPE IF NOT EXISTS legacy.point(x double, y double);
CREATE TABLE IF NOT EXISTS legacy.places (
\tid int PRIMARY KEY,
\tname text,
\tlocation frozen<point>,
\told_rating float)
\tWITH ID = 8e6b2a10-2f3c-11e7-93ae-92361f002671
\tAND bloom_filter_fp_chance = 0.01
\tAND dclocal_read_repair_chance = 0.1
\tAND crc_check_chance = 1.0
\tAND default_time_to_live = 0
\tAND gc_grace_seconds = 864000
\tAND min_index_interval = 128
\tAND max_index_interval = 2048
\tAND memtable_flush_period_in_ms = 0
\tAND read_repair_chance = 0.0
\tAND speculative_retry = '99PERCENTILE'
\tAND comment = ''
\tAND caching = { 'keys': 'ALL', 'rows_per_partition': 'NONE' }
\tAND compaction = { 'max_threshold': '32', 'min_threshold': '4', 'class': 'org.apache.cassandra.db.compaction.SizeTieredCompactionStrategy' }
\tAND compression = { 'chunk_length_in_kb': '64', 'class': 'org.apache.cassandra.io.compress.LZ4Compressor' }
\tAND cdc = true
\tAND extensions = {  };
ALTER TABLE legacy.places DROP old_rating USING TIMESTAMP 1493201920111000;
"""

# Cassandra 5.0 `DESCRIBE TABLE vectors.documents`: vector, masks, storage-attached indexes, no id.
DESCRIBE_50 = """
CREATE KEYSPACE vectors WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '1'}  AND durable_writes = true;

CREATE TABLE vectors.documents (
    doc_id uuid PRIMARY KEY,
    body text MASKED WITH system.mask_inner(2, null),
    embedding vector<float, 3>,
    labels vector<text, 2>,
    tags set<text>,
    title text MASKED WITH DEFAULT,
    retention duration,
    version int
) WITH additional_write_policy = '99p'
    AND allow_auto_snapshot = true
    AND bloom_filter_fp_chance = 0.01
    AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}
    AND cdc = true
    AND comment = ''
    AND compaction = {'class': 'org.apache.cassandra.db.compaction.UnifiedCompactionStrategy', 'scaling_parameters': 'T4', 'target_sstable_size': '1GiB'}
    AND compression = {'chunk_length_in_kb': '16', 'class': 'org.apache.cassandra.io.compress.LZ4Compressor'}
    AND memtable = 'default'
    AND crc_check_chance = 1.0
    AND default_time_to_live = 0
    AND extensions = {}
    AND gc_grace_seconds = 864000
    AND incremental_backups = true
    AND max_index_interval = 2048
    AND memtable_flush_period_in_ms = 0
    AND min_index_interval = 128
    AND read_repair = 'BLOCKING'
    AND speculative_retry = '99p';

CREATE CUSTOM INDEX documents_embedding_idx ON vectors.documents (embedding) USING 'StorageAttachedIndex' WITH OPTIONS = {'similarity_function': 'cosine'};

CREATE INDEX documents_tags_idx ON vectors.documents (values(tags)) USING 'sai';
"""


def kinds(table: TableMetadata) -> dict[str, tuple[ColumnKind, str]]:
    return {c.name: (c.kind, c.type.cql) for c in table.columns}


# --- Cassandra 4.1 ------------------------------------------------------------------------------

def test_41_keyspace_and_user_types() -> None:
    schema = parse_schema(DESCRIBE_41)
    keyspace = schema.keyspaces["shop"]
    assert keyspace.replication == {"class": "NetworkTopologyStrategy", "dc1": "3", "dc2": "2"}
    assert keyspace.durable_writes is True
    info = keyspace.user_types["customer_info"]
    assert info.field_names == ("name", "homeAddress", "tags")
    assert [p.cql for p in info.parameters] == ["text", "frozen<address>", "frozen<set<text>>"]
    assert info.parameters[1] == freeze(keyspace.user_types["address"])


def test_41_table_columns() -> None:
    orders = parse_schema(DESCRIBE_41).table("shop", "orders")
    assert orders.id == uuid.UUID("3b8e1a70-9f4e-11ee-8c90-0242ac120002")
    assert [(c.name, c.position) for c in orders.partition_key] == [("customer_id", 0), ("order_day", 1)]
    assert [(c.name, c.type.cql, c.reversed) for c in orders.clustering] == [("order_id", "timeuuid", True)]
    assert kinds(orders) == {
        "customer_id": (ColumnKind.PARTITION_KEY, "uuid"),
        "order_day": (ColumnKind.PARTITION_KEY, "date"),
        "order_id": (ColumnKind.CLUSTERING, "timeuuid"),
        "amount": (ColumnKind.REGULAR, "decimal"),
        "billing": (ColumnKind.REGULAR, "frozen<customer_info>"),
        "items": (ColumnKind.REGULAR, "map<text, int>"),
        "notes": (ColumnKind.REGULAR, "list<text>"),
        "shipping": (ColumnKind.REGULAR, "address"),
        "Priority": (ColumnKind.REGULAR, "tinyint"),
        "status": (ColumnKind.REGULAR, "text"),
        "loyalty_points": (ColumnKind.STATIC, "bigint"),
    }
    # Cassandra's order: regular before static, simple before complex, then by name.
    assert [c.name for c in orders.regular_and_static] == [
        "Priority", "amount", "billing", "status", "items", "notes", "shipping", "loyalty_points"]
    complex_columns = {c.name for c in orders.regular_and_static if c.is_complex}
    assert complex_columns == {"items", "notes", "shipping"}
    assert orders.column(b"loyalty_points").is_static
    assert orders.cdc is False and orders.compact_storage is False and orders.hidden_columns == ()


def test_41_dropped_and_readded_columns() -> None:
    orders = parse_schema(DESCRIBE_41).table("shop", "orders")
    dropped = {c.name: (c.type.cql, c.kind, c.dropped_time) for c in orders.dropped}
    assert dropped == {"coupon": ("text", ColumnKind.REGULAR, 1700000000123000),
                       "status": ("int", ColumnKind.REGULAR, 1700000000456000)}
    # A header naming a dropped column resolves to the dropped definition; a re-added one to the new.
    assert orders.column(b"coupon").dropped_time == 1700000000123000
    assert orders.column(b"status").type.cql == "text"
    assert orders.column(b"status").dropped_time is None


def test_41_options_kept_as_cql_text() -> None:
    orders = parse_schema(DESCRIBE_41).table("shop", "orders")
    assert orders.options["comment"] == "'orders by customer and day; it''s hot'"
    assert orders.options["caching"] == "{'keys': 'ALL', 'rows_per_partition': 'NONE'}"
    assert orders.options["speculative_retry"] == "'99p'"
    assert orders.options["bloom_filter_fp_chance"] == "0.01"
    assert orders.options["extensions"] == "{}"
    assert orders.options["memtable"] == "'default'"
    assert "cdc" not in orders.options and "id" not in orders.options
    assert len(orders.options) == 16


def test_41_materialized_view_is_a_table_with_base_types() -> None:
    schema = parse_schema(DESCRIBE_41)
    view = schema.table("shop", "orders_by_status")
    assert schema.table_by_id(uuid.UUID("7d1c9f40-9f4e-11ee-8c90-0242ac120002")) is view
    assert [c.name for c in view.partition_key] == ["status"]
    assert [(c.name, c.type.cql, c.reversed) for c in view.clustering] == [
        ("customer_id", "uuid", False), ("order_day", "date", False), ("order_id", "timeuuid", True)]
    assert [(c.name, c.type.cql, c.kind) for c in view.regular_and_static] == [
        ("amount", "decimal", ColumnKind.REGULAR)]
    # Indexes, functions and aggregates are skipped: two tables in all.
    assert len(schema) == 2


# --- Cassandra 3.11 COMPACT STORAGE ---------------------------------------------------------------

def test_311_dense_table_with_value() -> None:
    readings = parse_schema(DESCRIBE_311).table("legacy", "sensor_readings")
    assert readings.compact_storage and not readings.is_static_compact
    assert kinds(readings) == {"sensor_id": (ColumnKind.PARTITION_KEY, "text"),
                               "ts": (ColumnKind.CLUSTERING, "timestamp"),
                               "reading": (ColumnKind.REGULAR, "double")}
    assert readings.hidden_columns == ()
    assert readings.clustering[0].reversed
    assert readings.options["speculative_retry"] == "'99PERCENTILE'"
    assert readings.id == system_table_id("legacy", "sensor_readings")


def test_311_dense_table_without_value_has_hidden_empty_column() -> None:
    tags = parse_schema(DESCRIBE_311).table("legacy", "item_tags")
    value = tags.column(b"value")
    assert (value.kind, value.type.cql, value.type.fixed_length) == (ColumnKind.REGULAR, "empty", 0)
    assert tags.hidden_columns == (value,)
    assert "value" not in tags.to_cql()


def test_311_static_compact_table() -> None:
    users = parse_schema(DESCRIBE_311).table("legacy", "users")
    assert users.is_static_compact
    # The declared columns are static; "value" is taken, so the hidden value column is "value1".
    assert kinds(users) == {
        "user_id": (ColumnKind.PARTITION_KEY, "uuid"),
        "column1": (ColumnKind.CLUSTERING, "text"),
        "email": (ColumnKind.STATIC, "text"),
        "name": (ColumnKind.STATIC, "text"),
        "value": (ColumnKind.STATIC, "int"),
        "value1": (ColumnKind.REGULAR, "blob"),
    }
    assert [c.name for c in users.hidden_columns] == ["column1", "value1"]
    cql = users.to_cql()
    assert " static" not in cql.replace("Thrift static", "") and "column1" not in cql and "value1" not in cql


def test_311_counter_static_compact_table_has_counter_value() -> None:
    views = parse_schema(DESCRIBE_311).table("legacy", "page_views")
    assert views.column(b"value").type.cql == "counter"
    assert views.column(b"views").kind is ColumnKind.STATIC
    assert views.is_counter


def test_311_compound_dense_table() -> None:
    events = parse_schema(DESCRIBE_311).table("legacy", "events")
    assert [(c.name, c.position, c.reversed) for c in events.clustering] == [("bucket", 0, False), ("ts", 1, True)]
    assert [c.name for c in events.regular_and_static] == ["payload"] and events.hidden_columns == ()


def test_311_snapshot_schema_with_dropped_column() -> None:
    places = parse_schema(SNAPSHOT_311).table("legacy", "places")
    assert places.id == uuid.UUID("8e6b2a10-2f3c-11e7-93ae-92361f002671")
    assert places.cdc is True
    assert places.options["caching"] == "{'keys': 'ALL', 'rows_per_partition': 'NONE'}"
    assert places.options["extensions"] == "{}"
    assert places.column(b"location").type.cql == "frozen<point>"
    assert [(c.name, c.type.cql, c.dropped_time) for c in places.dropped] == [
        ("old_rating", "float", 1493201920111000)]
    assert [c.name for c in places.regular_and_static] == ["location", "name"]


# --- Cassandra 5.0 ------------------------------------------------------------------------------

def test_50_vector_duration_cdc_and_masks() -> None:
    schema = parse_schema(DESCRIBE_50)
    documents = schema.table("vectors", "documents")
    assert documents.cdc is True
    assert documents.id == system_table_id("vectors", "documents")
    embedding = documents.column(b"embedding").type
    assert (embedding.cql, embedding.fixed_length, embedding.multi_cell) == ("vector<float, 3>", 12, False)
    labels = documents.column(b"labels").type
    assert (labels.cql, labels.fixed_length) == ("vector<text, 2>", None)
    assert documents.column(b"retention").type.fixed_length is None
    assert documents.column(b"tags").is_complex
    assert documents.column(b"body").type.cql == "text"
    assert documents.options["allow_auto_snapshot"] == "true"
    assert len(schema) == 1


# --- statements and syntax --------------------------------------------------------------------------

def test_use_comments_case_and_quoted_identifiers() -> None:
    schema = parse_schema('''
        /* a block comment ; with a semicolon
           over lines */
        use "MyKs";   -- sets the keyspace
        create table if not exists "Weird ""Table""" (   // C++-style comment
            "Key" TEXT,
            "select" Int,
            "MixedCase" FROZEN<Map<Text, BigInt>>,
            plain text,
            primary key ("Key", "select")
        ) with clustering order by ("select" desc) and Comment = 'x';
    ''')
    table = schema.table("MyKs", 'Weird "Table"')
    assert table is not None
    assert kinds(table) == {"Key": (ColumnKind.PARTITION_KEY, "text"),
                            "select": (ColumnKind.CLUSTERING, "int"),
                            "MixedCase": (ColumnKind.REGULAR, "frozen<map<text, bigint>>"),
                            "plain": (ColumnKind.REGULAR, "text")}
    assert table.clustering[0].reversed
    assert table.options == {"comment": "'x'"}
    assert 'CREATE TABLE "MyKs"."Weird ""Table""" (' in table.to_cql()


def test_inline_primary_key_and_quoted_id_string() -> None:
    table = parse_schema("CREATE TABLE ks.t (k int PRIMARY KEY, v text) "
                         "WITH ID = '5a1c395e-b41f-11e5-9f22-ba0be0483c18';").table("ks", "t")
    assert table.id == uuid.UUID("5a1c395e-b41f-11e5-9f22-ba0be0483c18")
    assert [c.name for c in table.partition_key] == ["k"] and table.clustering == ()


def test_user_type_qualified_and_nested_in_earlier_type() -> None:
    schema = parse_schema("""
        CREATE TYPE ks.inner (a int);
        CREATE TYPE ks.outer (i frozen<ks.inner>, l frozen<list<frozen<inner>>>);
        CREATE TABLE ks.t (k int PRIMARY KEY, o ks.outer, f frozen<outer>, t tuple<int, frozen<inner>>);
    """)
    table = schema.table("ks", "t")
    assert table.column(b"o").type.multi_cell and table.column(b"o").type.cql == "outer"
    assert not table.column(b"f").type.multi_cell
    assert table.column(b"t").type.cql == "tuple<int, frozen<inner>>"
    assert table.column(b"o").type.parameters[1].cql == "frozen<list<frozen<inner>>>"


def test_alter_table_evolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time_ns", lambda: 1_234_567_890_123_456_789)
    schema = parse_schema("""
        CREATE TABLE ks.t (k int, c int, v text, w int, PRIMARY KEY (k, c)) WITH ID = 11111111-2222-3333-4444-555555555555;
        ALTER TABLE ks.t ADD s set<int> static;
        ALTER TABLE ks.t ADD (x int, y frozen<list<int>>);
        ALTER TABLE ks.t WITH cdc = true AND comment = 'now with cdc';
        ALTER TABLE ks.t DROP w;
        ALTER TABLE ks.t DROP (x, y) USING TIMESTAMP 42;
        ALTER TABLE ks.t RENAME c TO c2;
        ALTER TABLE IF EXISTS ks.missing ADD z int;
    """)
    table = schema.table("ks", "t")
    assert table.cdc and table.options == {"comment": "'now with cdc'"}
    assert table.column(b"s").kind is ColumnKind.STATIC and table.column(b"s").is_complex
    assert [c.name for c in table.clustering] == ["c2"]
    assert [(c.name, c.dropped_time) for c in table.dropped] == [
        ("w", 1_234_567_890_123_456), ("x", 42), ("y", 42)]
    assert [c.name for c in table.regular_and_static] == ["v", "s"]
    assert table.id == uuid.UUID("11111111-2222-3333-4444-555555555555") and len(schema) == 1


def test_alter_changes_version_hash() -> None:
    schema = parse_schema("CREATE TABLE ks.t (k int PRIMARY KEY, v int);")
    before = schema.table("ks", "t").version_hash()
    parse_schema("ALTER TABLE ks.t ADD w int;", schema)
    assert schema.table("ks", "t").version_hash() != before


def test_a_changed_user_type_changes_the_version_of_the_tables_using_it() -> None:
    """ALTER TYPE ADD changes how a table's values decode: a new version, published before the records that
    need it. A table without user types keeps the version earlier releases gave it (its CREATE TABLE's hash)."""
    types = "CREATE TYPE ks.inner_type (a int); CREATE TYPE ks.outer_type (i frozen<inner_type>);"
    table = "CREATE TABLE ks.t (k int PRIMARY KEY, v frozen<outer_type>);"
    altered = types.replace("(a int)", "(a int, b text)")
    before, after = (parse_schema(cql + table).table("ks", "t") for cql in (types, altered))
    assert before.to_cql() == after.to_cql() and before.version_hash() != after.version_hash()
    assert after.ddl().splitlines()[:2] == ["CREATE TYPE ks.inner_type (a int, b text);",
                                           "CREATE TYPE ks.outer_type (i frozen<inner_type>);"]
    plain = parse_schema("CREATE TABLE ks.p (k int PRIMARY KEY, v int);").table("ks", "p")
    assert plain.version_hash() == hashlib.sha256(plain.to_cql().encode()).hexdigest()[:16]


def test_drop_compact_storage_exposes_hidden_columns() -> None:
    schema = parse_schema(DESCRIBE_311 + "ALTER TABLE legacy.item_tags DROP COMPACT STORAGE;")
    tags = schema.table("legacy", "item_tags")
    assert not tags.compact_storage and tags.hidden_columns == ()
    assert "    value empty" in tags.to_cql()
    assert parse_schema(tags.to_cql()).table("legacy", "item_tags") == tags


def test_datastax_dropped_column_record() -> None:
    table = parse_schema("""
        CREATE TABLE ks.t (pk int, ck int, PRIMARY KEY (pk, ck))
            WITH ID = 513f2627-9356-41c4-a379-7ad42be97432
            AND CLUSTERING ORDER BY (ck ASC)
            AND DROPPED COLUMN RECORD b frozen<tuple<int, text>> USING TIMESTAMP 1717503192249000
            AND DROPPED COLUMN RECORD st1 varint static USING TIMESTAMP 5000
            AND comment = '';
    """).table("ks", "t")
    assert [(c.name, c.type.cql, c.kind, c.dropped_time) for c in table.dropped] == [
        ("b", "tuple<int, text>", ColumnKind.REGULAR, 1717503192249000),
        ("st1", "varint", ColumnKind.STATIC, 5000)]


def test_create_if_not_exists_keeps_known_table_and_plain_create_replaces_it() -> None:
    schema = parse_schema("CREATE TABLE ks.t (k int PRIMARY KEY, a int);")
    parse_schema("CREATE TABLE IF NOT EXISTS ks.t (k int PRIMARY KEY, b int);", schema)
    assert schema.table("ks", "t").column(b"a") is not None
    parse_schema("CREATE TABLE ks.t (k int PRIMARY KEY, b int) WITH ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18;",
                 schema)
    assert schema.table("ks", "t").column(b"a") is None and len(schema) == 1
    assert schema.table_by_id(system_table_id("ks", "t")) is None


def test_load_schema_files_in_order(tmp_path: Path) -> None:
    (tmp_path / "1-types.cql").write_text("CREATE TYPE ks.point (x int, y int);\n")
    (tmp_path / "2-tables.cql").write_text("USE ks;\nCREATE TABLE t (k int PRIMARY KEY, p frozen<point>);\n")
    schema = load_schema_files(sorted(tmp_path.glob("*.cql")))
    assert schema.table("ks", "t").column(b"p").type.field_names == ("x", "y")
    # USE does not carry over from one file to the next.
    (tmp_path / "3-more.cql").write_text("\n\nCREATE TABLE u (k int PRIMARY KEY);\n")
    with pytest.raises(SchemaError, match=r"3-more\.cql, line 3: u is not qualified by a keyspace"):
        load_schema_files(sorted(tmp_path.glob("*.cql")))


# --- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("CREATE TABLE ks.t (\n  k int PRIMARY KEY,\n  v adress\n);", "line 3: unknown type 'adress'"),
    ("CREATE TABLE ks.t (\n  k int,\n  v int,\n  PRIMARY KEY (k, c)\n);", "line 1: PRIMARY KEY column c of t is not declared"),
    ("CREATE TABLE ks.a (k int PRIMARY KEY)\nCREATE TABLE ks.b (k int PRIMARY KEY);", "line 2: expected ';', found 'CREATE'"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY) WITH comment = 'oops;\n", "line 1: unterminated string"),
    ("\n/* never closed", "line 2: unterminated comment"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY);\n\nDROP TABLE ks.t;", "line 3: unsupported statement DROP TABLE KS"),
    ("INSERT INTO ks.t (k) VALUES (1);", "line 1: unsupported statement INSERT INTO KS"),
    ("CREATE TABLE t (k int PRIMARY KEY);", "line 1: t is not qualified by a keyspace and no USE statement"),
    ("CREATE TABLE ks.t (\n k int PRIMARY KEY,\n k text);", "line 3: column k is declared twice"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY, v int PRIMARY KEY);", "line 1: t has more than one PRIMARY KEY"),
    ("CREATE TABLE ks.t (k int, PRIMARY KEY (k));\nALTER TABLE ks.u ADD v int;", "line 2: table ks.u is not declared before"),
    ("CREATE TABLE ks.t (k int, c int, d int, PRIMARY KEY (k, c, d)) WITH CLUSTERING ORDER BY (d DESC);",
     "line 1: CLUSTERING ORDER BY of t must list clustering columns in their PRIMARY KEY order; found d"),
    ("CREATE TABLE ks.t (k int, c int,\n s int static, PRIMARY KEY (k, c)) WITH COMPACT STORAGE;",
     "line 2: static columns are not supported in COMPACT STORAGE tables"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY,\n s int static);", "line 2: static column s needs clustering columns"),
    ("CREATE TABLE ks.t (k int, c int, a int, b int, PRIMARY KEY (k, c)) WITH COMPACT STORAGE;",
     "allows at most one other column"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY, n counter, v int);", "line 1: t mixes counter and non-counter columns"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY, v int);\nALTER TABLE ks.t DROP k USING TIMESTAMP 1;",
     "line 2: cannot drop PRIMARY KEY column k of ks.t"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY, v int);\nALTER TABLE ks.t DROP w;", "line 2: ks.t has no column w to drop"),
    ("CREATE TABLE ks.t (k int, c int, PRIMARY KEY (k, c)) WITH COMPACT STORAGE;\nALTER TABLE ks.t ADD v int;",
     "line 2: cannot add columns to COMPACT STORAGE table ks.t"),
    ("CREATE MATERIALIZED VIEW ks.v AS SELECT * FROM ks.base WHERE k IS NOT NULL PRIMARY KEY (k);",
     "line 1: base table ks.base of view v is not declared before it"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY) WITH ID = 12;", "line 1: invalid table ID 12"),
    ("CREATE TABLE ks.t (\n k map<int, int PRIMARY KEY);", "line 2: unclosed '<' in a type"),
    ("CREATE TABLE ks.t (k map<int, int> int PRIMARY KEY);", "line 1: expected ')', found 'int'"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY, v 'org.example.MyType');", "custom type 'org.example.MyType'"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY, v frozen<other.udt>);", "type other.udt in"),
    ("CREATE TABLE ks.t (k int PRIMARY KEY) WITH cdc = yes;", "line 1: expected true or false, found 'yes'"),
    ("CREATE TYPE ks.p (x int, x int);", "line 1: field x of type p is declared twice"),
])
def test_errors_name_source_line_and_problem(text: str, message: str) -> None:
    with pytest.raises(SchemaError) as raised:
        parse_schema(text, source="bad.cql")
    assert str(raised.value).startswith("bad.cql, line ")
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError) and raised.value.source == "bad.cql"


def test_error_line_counts_lines_inside_strings_and_comments() -> None:
    with pytest.raises(SchemaError) as raised:
        parse_schema("CREATE TABLE ks.t (k int PRIMARY KEY) WITH comment = 'a\nb';\n/*\n\n*/ BOGUS;")
    assert raised.value.line == 5


# --- to_cql round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", [DESCRIBE_41, DESCRIBE_311, SNAPSHOT_311, DESCRIBE_50])
def test_every_parsed_table_round_trips_through_to_cql(text: str) -> None:
    schema = parse_schema(text)
    for table in schema:
        again = Schema()
        for keyspace in schema.keyspaces.values():
            again.add_keyspace(KeyspaceMetadata(keyspace.name, user_types=dict(keyspace.user_types)))
        assert parse_schema(table.to_cql(), again).table(table.keyspace, table.name) == table, table.to_cql()


def test_to_cql_records_dropped_columns_as_describe_with_internals() -> None:
    orders = parse_schema(DESCRIBE_41).table("shop", "orders")
    cql = orders.to_cql()
    assert "    coupon text,\n" in cql and "    status int,\n" in cql
    assert cql.endswith(";\nALTER TABLE shop.orders DROP coupon USING TIMESTAMP 1700000000123000;\n"
                        "ALTER TABLE shop.orders DROP status USING TIMESTAMP 1700000000456000;\n"
                        "ALTER TABLE shop.orders ADD status text;")


SIMPLE_TYPES = ["ascii", "bigint", "blob", "boolean", "date", "decimal", "double", "float", "inet", "int",
                "smallint", "text", "time", "timestamp", "timeuuid", "tinyint", "uuid", "varint"]

frozen_types = st.recursive(
    st.sampled_from(SIMPLE_TYPES),
    lambda inner: st.one_of(
        inner.map(lambda t: f"frozen<list<{t}>>"),
        inner.map(lambda t: f"frozen<set<{t}>>"),
        st.tuples(inner, inner).map(lambda kv: f"frozen<map<{kv[0]}, {kv[1]}>>"),
        st.lists(inner, min_size=1, max_size=3).map(lambda ts: f"tuple<{', '.join(ts)}>"),
        st.just("frozen<address>"),
    ),
    max_leaves=4)

column_types = st.one_of(
    frozen_types, st.sampled_from(["duration", "address"]),
    frozen_types.map(lambda t: f"list<{t}>"), frozen_types.map(lambda t: f"set<{t}>"),
    st.tuples(frozen_types, frozen_types).map(lambda kv: f"map<{kv[0]}, {kv[1]}>"),
    st.tuples(st.sampled_from(["float", "int", "text", "frozen<address>"]), st.integers(1, 4))
    .map(lambda td: f"vector<{td[0]}, {td[1]}>"))

names = st.one_of(st.sampled_from(["k", "value", "column1", "select", "key", "Mixed", 'q"uote', "a b", "_x", "é"]),
                  st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=6))

options = st.dictionaries(
    st.sampled_from(["comment", "gc_grace_seconds", "caching", "speculative_retry", "extensions"]),
    st.one_of(st.text(max_size=10).map(cql_literal), st.integers(0, 10**6).map(str),
              st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2).map(cql_literal)),
    max_size=3)


def address_type(keyspace: str):
    return user_type(keyspace, "address", {"street": parse_type("text"), "zip": parse_type("int")})


@st.composite
def tables(draw: st.DrawFn) -> TableMetadata:
    keyspace = draw(st.sampled_from(["ks", "Other KS"]))
    udts = {"address": address_type(keyspace)}
    pool = iter(draw(st.lists(names, min_size=11, max_size=11, unique=True)))

    def columns(count: int, kind: ColumnKind, types: st.SearchStrategy[str]) -> list[ColumnMetadata]:
        keyed = kind in (ColumnKind.PARTITION_KEY, ColumnKind.CLUSTERING)
        return [ColumnMetadata(next(pool), parse_type(draw(types), keyspace, udts), kind,
                               i if keyed else -1, kind is ColumnKind.CLUSTERING and draw(st.booleans()))
                for i in range(count)]

    partition_key = tuple(columns(draw(st.integers(1, 2)), ColumnKind.PARTITION_KEY, frozen_types))
    clustering = tuple(columns(draw(st.integers(0, 2)), ColumnKind.CLUSTERING, frozen_types))
    regular = columns(draw(st.integers(0, 3)), ColumnKind.REGULAR, column_types)
    static = columns(draw(st.integers(0, 2)) if clustering else 0, ColumnKind.STATIC, column_types)
    can_compact = not static and not any(c.is_complex for c in regular) and \
        (len(regular) <= 1 if clustering else len(regular) >= 1)
    compact = can_compact and draw(st.booleans())
    dropped: list[ColumnMetadata] = []
    if compact:
        clustering, regular = compact_table_columns(clustering, regular,
                                                    reserved_names=[c.name for c in partition_key])
    else:
        readded = [c.name for c in regular + static if draw(st.booleans())]  # dropped, then added again
        dropped_kinds = [ColumnKind.REGULAR, ColumnKind.STATIC] if clustering else [ColumnKind.REGULAR]
        for name in readded + [next(pool) for _ in range(draw(st.integers(0, 2)))]:
            dropped.append(ColumnMetadata(name, parse_type(draw(column_types), keyspace, udts),
                                          draw(st.sampled_from(dropped_kinds)),
                                          dropped_time=draw(st.integers(0, 2**62))))
    return TableMetadata(keyspace, draw(names), draw(st.uuids()), partition_key, clustering,
                         tuple(regular + static), tuple(dropped), draw(st.booleans()), compact, draw(options))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_random_tables_round_trip_through_to_cql(table: TableMetadata) -> None:
    schema = Schema()
    schema.add_keyspace(KeyspaceMetadata(table.keyspace, user_types={"address": address_type(table.keyspace)}))
    parsed = parse_schema(table.to_cql(), schema).table(table.keyspace, table.name)
    assert parsed == table


# --- CQL types ----------------------------------------------------------------------------------

ADDRESS = user_type("ks", "address", {"street": parse_type("text"), "zip": parse_type("int")})
# Field names as CQL quotes them: toJson quotes a name with upper-case letters (which fromJson then reads).
PLACE = user_type("ks", "Place", {"Street": parse_type("text"), "zip code": parse_type("int")})
UDTS = {"address": ADDRESS, "Place": PLACE}
A_UUID = uuid.UUID("6ab09bec-e68e-48d9-a5f8-97e6fb4c9b47")
A_TIMEUUID = uuid.UUID("5a1c395e-b41f-11e5-9f22-ba0be0483c18")

# type text, value, JSON rendering, fixed length, multi-cell
TYPE_CASES = [
    ("ascii", "abc", "abc", None, False),
    ("bigint", -2**63, -2**63, 8, False),
    ("blob", b"\x00\xff", "0x00ff", None, False),
    ("boolean", True, True, 1, False),
    ("counter", 42, 42, None, False),
    ("date", util.Date(datetime.date(2024, 2, 29)), "2024-02-29", None, False),
    # varint and decimal are JSON numbers, every digit kept (json_text writes the Decimal as it is)
    ("decimal", decimal.Decimal("-12.340"), decimal.Decimal("-12.340"), None, False),
    ("double", 2.5, 2.5, 8, False),
    ("duration", util.Duration(14, 2, 3_000_004_000), "1y2mo2d3s4us", None, False),
    ("float", -0.5, -0.5, 4, False),
    # a float decodes to the double nearest its 32 bits (7.619999885559082): shown with Java's Float.toString
    # digits, as SELECT JSON shows it
    ("float", 7.62, 7.62, 4, False),
    ("float", 3.4028235e38, 3.4028235e38, 4, False),
    # Java writes d.dE-n with at least two digits: Float.MIN_VALUE is 1.4E-45, though 1E-45 reads back the same
    ("float", 1.4e-45, 1.4e-45, 4, False),
    # JSON has no NaN or infinities: SELECT JSON shows null
    ("float", math.nan, None, 4, False),
    ("double", -math.inf, None, 8, False),
    ("list<double>", [math.inf, 1.5], [None, 1.5], None, True),
    ("list<float>", [0.1, 123456.79], [0.1, 123456.79], None, True),
    ("map<float, text>", {0.3: "x"}, {"0.3": "x"}, None, True),
    # as Java's InetAddress writes them: IPv6 without "::" compression, IPv4-mapped as IPv4
    ("inet", "2001:db8::1", "2001:db8:0:0:0:0:0:1", None, False),
    ("inet", "::ffff:10.1.2.3", "10.1.2.3", None, False),
    ("inet", "10.0.0.1", "10.0.0.1", None, False),
    ("int", -7, -7, 4, False),
    ("smallint", 300, 300, None, False),
    ("text", "héllo", "héllo", None, False),
    ("time", util.Time(datetime.time(13, 14, 15, 123456)), "13:14:15.123456000", None, False),
    ("timestamp", datetime.datetime(2024, 1, 2, 3, 4, 5, 678000), "2024-01-02 03:04:05.678Z", 8, False),
    ("timeuuid", A_TIMEUUID, str(A_TIMEUUID), 16, False),
    ("tinyint", -128, -128, None, False),
    ("uuid", A_UUID, str(A_UUID), 16, False),
    ("varchar", "x", "x", None, False),
    ("varint", -10**30, -10**30, None, False),
    ("list<int>", [3, 1, 3], [3, 1, 3], None, True),
    ("frozen<list<int>>", [3, 1], [3, 1], None, False),
    ("set<text>", util.SortedSet(["b", "a"]), ["a", "b"], None, True),
    ("map<text, int>", {"b": 2, "a": 1}, {"a": 1, "b": 2}, None, True),
    ("map<int, boolean>", {2: True}, {"2": True}, None, True),
    ("frozen<map<frozen<tuple<int, text>>, frozen<list<frozen<set<bigint>>>>>>",
     {(1, "x"): [util.SortedSet([5, 4])]}, {"[1,\"x\"]": [[4, 5]]}, None, False),
    ("tuple<int, text, frozen<list<double>>>", (1, "a", [0.5]), [1, "a", [0.5]], None, False),
    ("address", ("Main St", 12345), {"street": "Main St", "zip": 12345}, None, True),
    ("list<frozen<address>>", [("a", 1)], [{"street": "a", "zip": 1}], None, True),
    ('frozen<"Place">', ("Main St", None), {'"Street"': "Main St", "zip code": None}, None, False),
    ("vector<float, 3>", [1.0, -2.0, 0.25], [1.0, -2.0, 0.25], 12, False),
    ("vector<float, 2>", [7.62, -0.01], [7.62, -0.01], 8, False),
    ("vector<bigint, 2>", [1, 2], [1, 2], 16, False),
    ("vector<text, 2>", ["a", "bc"], ["a", "bc"], None, False),
]


@pytest.mark.parametrize("text, value, rendered, fixed_length, multi_cell", TYPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TYPE_CASES)])
def test_type_round_trips(text: str, value: object, rendered: object, fixed_length: int | None,
                          multi_cell: bool) -> None:
    cql_type = parse_type(text, "ks", UDTS)
    assert parse_type(cql_type.cql, "ks", UDTS) == cql_type
    assert (cql_type.fixed_length, cql_type.multi_cell) == (fixed_length, multi_cell)
    data = cql_type.serialize(value)
    if fixed_length is not None:
        assert len(data) == fixed_length
    decoded = cql_type.deserialize(data)
    assert cql_type.serialize(decoded) == data
    assert cql_type.to_json(decoded) == rendered


@pytest.mark.parametrize("text, value, written", [
    ("decimal", decimal.Decimal("-12.340"), "-12.340"),
    ("decimal", decimal.Decimal("-0.000000000000000001234"), "-1.234E-18"),
    ("decimal", decimal.Decimal("5E+3"), "5E+3"),
    ("varint", -10**30, "-1000000000000000000000000000000"),
    ("map<decimal, frozen<list<decimal>>>", {decimal.Decimal("1.50"): [decimal.Decimal("-0.10")]},
     '{"1.50": [-0.10]}'),
    ("frozen<map<frozen<tuple<decimal, int>>, text>>", {(decimal.Decimal("2.0"), 1): "x"}, '{"[2.0,1]": "x"}'),
    ("tuple<varint, text>", (2**70, "é"), '[1180591620717411303424, "é"]'),
    ("double", 1e300, "1.0E300"),
    ("double", -1.5e-7, "-1.5E-7"),
    ("double", 12345678.9, "1.23456789E7"),
    ("double", 1e7, "1.0E7"),
    ("double", -25000000.0, "-2.5E7"),
    ("double", 100.0, "100.0"),
    ("double", 0.001, "0.001"),
    ("list<double>", [1e-5, -0.0], "[1.0E-5, -0.0]"),
    ("float", 1.4e-45, "1.4E-45"),
    ("float", 3.4028234663852886e38, "3.4028235E38"),
])
def test_values_are_written_as_select_json_writes_them(text: str, value: object, written: str) -> None:
    """The text of decimals, varints and floating-point numbers as Cassandra 5.0's SELECT JSON writes it
    (Java's BigDecimal.toString, Double.toString, Float.toString)."""
    cql_type = parse_type(text, "ks", UDTS)
    assert json_text(cql_type.to_json(cql_type.deserialize(cql_type.serialize(value)))) == written


@pytest.mark.parametrize("text", ["int", "bigint", "varint", "decimal", "uuid", "inet", "double", "timestamp",
                                  "boolean", "text", "ascii"])
def test_an_empty_value_renders_as_select_json_shows_it(text: str) -> None:
    """``blobAsInt(0x)`` and the like store an empty value: SELECT JSON shows "" (a blob's: "0x")."""
    assert render_value(parse_type(text), b"") == ""
    assert render_value(parse_type("blob"), b"") == "0x"


@pytest.mark.parametrize("text, canonical", [
    ("FROZEN<Map<Text, INT>>", "frozen<map<text, int>>"),
    ("frozen<tuple<int, text>>", "tuple<int, text>"),
    ("list<frozen<list<int>>>", "list<frozen<list<int>>>"),
    ("set<frozen<address>>", "set<frozen<address>>"),
    ("ks.address", "address"),
    ("frozen<ks.address>", "frozen<address>"),
    ("'org.apache.cassandra.db.marshal.EmptyType'", "empty"),
    ("vector<frozen<address>, 2>", "vector<frozen<address>, 2>"),
])
def test_type_text_is_normalised(text: str, canonical: str) -> None:
    assert parse_type(text, "ks", UDTS).cql == canonical


def test_nested_types_are_frozen_and_cell_paths_follow_the_type() -> None:
    column = parse_type("map<text, frozen<list<int>>>")
    assert column.multi_cell and not column.parameters[1].multi_cell
    assert column.path_type.cql == "text" and column.element_type(b"k").cql == "frozen<list<int>>"
    assert parse_type("set<int>").element_type(b"\0\0\0\1").cql == "empty"
    assert parse_type("list<text>").path_type.cql == "timeuuid"
    udt = parse_type("address", "ks", UDTS)
    assert udt.path_type.cql == "smallint" and udt.element_type(b"\x00\x01").cql == "int"


def test_user_types_compare_by_structure() -> None:
    other = user_type("ks", "address", {"street": parse_type("text")})
    assert other != ADDRESS and other.cql == ADDRESS.cql
    assert user_type("ks", "address", {"street": parse_type("text"), "zip": parse_type("int")}) == ADDRESS


@pytest.mark.parametrize("text, message", [
    ("map<int>", "wrong parameters for map"),
    ("list<int", "unclosed '<'"),
    ("frozen<int, int>", "frozen<> takes one type"),
    ("vector<float, 0>", "wrong parameters for vector"),
    ("int int", "unexpected"),
    ("nosuch", "unknown type 'nosuch'"),
])
def test_bad_type_text(text: str, message: str) -> None:
    with pytest.raises(CqlTypeError, match=message):
        parse_type(text, "ks", UDTS)


def test_cql_literal_matches_parsed_option_text() -> None:
    parsed = parse_schema("CREATE TABLE ks.t (k int PRIMARY KEY) WITH caching = { 'keys' : 'ALL' } "
                          "AND comment = 'it''s' AND crc_check_chance = 0.5 AND extensions = {'e': 0xCAFE};")
    options = parsed.table("ks", "t").options
    assert options == {"caching": cql_literal({"keys": "ALL"}), "comment": cql_literal("it's"),
                       "crc_check_chance": cql_literal(0.5), "extensions": cql_literal({"e": b"\xca\xfe"})}
