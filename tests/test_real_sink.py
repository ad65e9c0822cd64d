"""Debezium's JDBC sink into PostgreSQL, configured as docs/events.md's recipe says (its blocks read from the
file: ``sink_recipe``), on the real thing: three Cassandra 5.0 nodes (``real_cassandra``, RF 3), an agent
process beside each (schema read from its node by CQL), the pipeline on the real Kafka broker, a Kafka
Connect 4.3 standalone worker with Debezium's JDBC sink 3.2 (and its ExtractNewRecordState) writing into
PostgreSQL 14, from Connect JSON and from Avro through Apicurio's registry (2.4, its Confluent API over
HTTPS with a login).

The tables are ones a user could have, adversarial where the sink could break: reserved words and mixed-case
quoted names as table and column names; quotes, backslashes, ``=>``, commas, braces, unicode and empty
strings in text, in lists and in map keys and values; NaN and the infinities; 38-digit decimals; the
extremes of every integer type; IPv6; durations; empty collections; a composite partition key, a static
column, a frozen user type, a tuple, nested collections, a vector, counters. Written through
cassandra-driver at CONSISTENCY ALL: inserts, updates of cells and collection elements, row, range and
partition deletes, TTLs, an LWT, a logged batch, an ``ALTER TABLE ADD`` and a ``TRUNCATE`` while the sink
runs. Every PostgreSQL table must equal ``SELECT *`` at CONSISTENCY ALL as the recipe's type table says the
sink stores each type (maps, user types, tuples and nested collections as the node's own ``toJson``), in
both formats, before and after TTL expiries; one table through Debezium's column options (excluded,
truncated, masked and hashed columns), and the Avro events with ``skipped.operations`` of truncations."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import hashlib
import json
import math
import struct
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from cassandra import util
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import dict_factory
from psycopg import sql

from conftest import require_jvm_artifacts
from real_system import (System, messages, session_at_all, table_id, topic_exists, truncations_by_node,
                         wait_for)
from sink_recipe import SinkRecipe, sink_recipe
from cassandra_cdc.schema.types import quote
from cassandra_cdc.pipeline.pipeline_config import SchemaRegistrySettings, load_config as load_pipeline_config
from cassandra_cdc.pipeline.streaming_job import start

KEYSPACE = "Shop"
SERVER = "sink"
AVRO_SERVER = "sinkavro"  # the Avro events' topics: sinkavro.Shop.<table>
REGISTRY_USER, REGISTRY_PASSWORD = "cdc", "registry secret"
APICURIO_AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
JDBC_SINK = "io.debezium.connector.jdbc.JdbcSinkConnector"

SCHEMA = [
    f'CREATE KEYSPACE "{KEYSPACE}" WITH replication = '
    "{'class': 'SimpleStrategy', 'replication_factor': 3}",
    f'''CREATE TYPE "{KEYSPACE}"."Address" ("Street" text, "zip code" int)''',
    f'''CREATE TABLE "{KEYSPACE}"."Order" (
        "user" text, "group" int, "time" timestamp, "Static Note" text static,
        "order" text, "select" ascii, "Mixed Case" varchar, "a,b=>c" text,
        tiny tinyint, small smallint, "int" int, big bigint, huge varint, price decimal,
        ratio double, weight float, flag boolean, ref uuid, made timeuuid, day date, "at" time,
        data blob, address inet, span duration, tags list<text>, marks set<int>, attrs map<text, text>,
        "byId" map<int, text>, home frozen<"Address">, pair tuple<int, text>, grid list<frozen<list<int>>>,
        embedding vector<float, 3>,
        PRIMARY KEY (("user", "group"), "time")) WITH cdc = true''',
    f'''CREATE TABLE "{KEYSPACE}"."user" (id int PRIMARY KEY, "timestamp" timestamp, "Value" text)
        WITH cdc = true''',
    f'''CREATE TABLE "{KEYSPACE}".orders (id int, line int, item text, qty int, owner text static,
        PRIMARY KEY (id, line)) WITH cdc = true''',
    f'CREATE TABLE "{KEYSPACE}".tallies (id int PRIMARY KEY, hits counter, misses counter) WITH cdc = true',
    f'CREATE TABLE "{KEYSPACE}".notes (id int PRIMARY KEY, body text) WITH cdc = true',
    f'CREATE TABLE "{KEYSPACE}".drafts (id int PRIMARY KEY, body text) WITH cdc = true',
    f'CREATE TABLE "{KEYSPACE}".expiring (id int PRIMARY KEY, v text, n int) WITH cdc = true',
    f'''CREATE TABLE "{KEYSPACE}".accounts (
        id int PRIMARY KEY, email text, password text, card text, bio text) WITH cdc = true''',
]
# The primary key columns of each table, and its columns that the recipe's handling modes make json (the
# node's toJson is what the sink must store there).
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Order": (("user", "group", "time"), ("attrs", "byId", "home", "pair", "grid")),
    "user": (("id",), ()),
    "orders": (("id", "line"), ()),
    "tallies": (("id",), ()),
    "notes": (("id",), ()),
    "drafts": (("id",), ()),
    "expiring": (("id",), ()),
    "accounts": (("id",), ()),
}
UNWRAPPED = "orders"  # also behind ExtractNewRecordState
# Truncated once their rows are in PostgreSQL: one while the JSON events' sink runs, one while the Avro
# events' sink runs (their pipeline skips truncations).
TRUNCATED, AVRO_TRUNCATED = "notes", "drafts"
# Avro's names of the columns whose CQL names are not Avro names (docs/events.md: Avro field names).
AVRO_NAMES = {"Static Note": "Static_Note", "Mixed Case": "Mixed_Case", "a,b=>c": "a_b__c",
              "Added Later": "Added_Later"}
# Seconds after the writes when the TTLs of "expiring" run out: after its rows have reached PostgreSQL (the
# pipeline starts within it), so that the expiries are changes the sink applies.
EXPIRY_DELAY = 90

AWKWARD_TEXTS = ["", "plain", 'a "quote"', "back\\slash", "a => b", "a, b", "{braces}",
                 "é ü ß € 漢字 🎉", "'single'", "new\nline", "tab\t", '\\"', "NULL", "[1, 2]", "$1 ${topic}"]
# Durations with the text Debezium's io.debezium.time.Interval gives them (docs/events.md's type table).
DURATIONS = [(util.Duration(0, 0, 0), "P0Y0M0DT0H0M0S"),
             (util.Duration(14, 3, 3_723_500_000_000), "P1Y2M3DT1H2M3.5S"),
             (util.Duration(-1, -2, -60_000_000_000), "P0Y-1M-2DT0H-1M0S"),
             (util.Duration(0, 0, 1), "P0Y0M0DT0H0M0.000000001S")]
COLUMN_RULES = {
    "column_exclude_list": [rf"{KEYSPACE}\.accounts\.password"],
    "column_truncate_to_chars": {5: [r"shop\.ACCOUNTS\.bio"]},  # matched case-insensitively
    "column_mask_with_chars": {4: [rf"{KEYSPACE}\.accounts\.card"]},
    "column_mask_hash": [{"algorithm": "SHA-256", "salt": "pepper", "version": 2,
                          "columns": [rf"{KEYSPACE}\.accounts\.email"]}],
}
Rows = dict[tuple[Any, ...], dict[str, Any]]  # primary key values -> column -> value


# --- the writes -------------------------------------------------------------------------------------------

def order_row(index: int) -> dict[str, Any]:
    """A row of "Order", each index with other awkward values (three partitions: three of each extreme)."""
    texts = AWKWARD_TEXTS
    pick = index % 3
    return {
        "user": ["ann", 'Bob "the" builder', ""][pick], "group": [1, -2**31, 2**31 - 1][pick],
        "time": datetime.datetime(1969, 12, 31, 23, 59, 59) + datetime.timedelta(seconds=index),
        "Static Note": texts[index % len(texts)], "order": texts[(index + 1) % len(texts)],
        "select": "ascii \\ \" ' , => {} \x01", "Mixed Case": texts[(index + 2) % len(texts)],
        "a,b=>c": texts[(index + 3) % len(texts)],
        "tiny": [-128, 127, 0][pick], "small": [-32768, 32767, 0][pick], "int": [-2**31, 2**31 - 1, 0][pick],
        "big": [-2**63, 2**63 - 1, 0][pick], "huge": [-(10**40), 10**40 + 1, 0][pick],
        "price": [decimal.Decimal("12345678901234567890123456789012345678"),
                  decimal.Decimal("-0.00000000000000000000000000000000000001"), decimal.Decimal("1.010"),
                  decimal.Decimal("1E+5")][index % 4],
        "ratio": [math.nan, math.inf, -math.inf, 1e300, -0.0, 5e-324][index % 6],
        "weight": [math.nan, -math.inf, math.inf, 3.4028234663852886e38, 1.5][index % 5],
        "flag": index % 2 == 0, "ref": uuid.UUID(int=index, version=4),
        "made": util.uuid_from_time(1_700_000_000 + index),
        "day": [datetime.date(1969, 12, 31), datetime.date(2262, 4, 11), datetime.date(2024, 2, 29)][pick],
        "at": util.Time([0, 86_399_999_999_000, 3_600_000_001_000][pick]),
        "data": [b"", b"\x00\xff", bytes(range(256))][pick],
        "address": ["::1", "2001:db8::ff00:42:8329", "10.0.0.1", "::ffff:1.2.3.4"][index % 4],
        "span": DURATIONS[index % len(DURATIONS)][0],
        "tags": [texts[(index + k) % len(texts)] for k in range(index % 4)],  # the empty one is null
        "marks": [set(), {-2**31, 0, 2**31 - 1}, {index}][pick],
        "attrs": {texts[(index + k) % len(texts)]: texts[(index + k + 5) % len(texts)]
                  for k in range(index % 5)},
        "byId": {-1: texts[index % len(texts)], 2**31 - 1: "\\"} if index % 2 else {},
        "home": (texts[index % len(texts)], None if pick else index),  # ("Street", "zip code")
        "pair": [(1, "x"), (None, ""), (-2**31, 'a "quote"')][pick],
        "grid": [[[1, 2], []], [[]], []][pick],
        "embedding": [1.5, -2.0, 0.25 * index],
    }


def write_first(session: Any, expiry: int, orders_written_at: int) -> None:
    """Every table's first writes: "Order"'s rows and its updates of cells and collection elements, a row,
    a range and a partition delete, a static-only partition; an LWT and a logged batch; counters; the rows
    to truncate; "orders" at known write times (``orders_written_at``, microseconds, and after), for
    ExtractNewRecordState; rows of "expiring" whose TTLs run out before the pipeline starts or at ``expiry``
    (seconds); rows of "accounts"."""
    order = f'"{KEYSPACE}"."Order"'
    columns = list(order_row(0))
    insert = session.prepare(f"INSERT INTO {order} ({', '.join(map(quote, columns))}) "
                             f"VALUES ({', '.join('?' * len(columns))})")
    for index in range(24):
        session.execute(insert, order_row(index))
    ann = {"user": "ann", "group": 1}
    where_ann = '"user" = %(user)s AND "group" = %(group)s'
    session.execute(f'UPDATE {order} SET "order" = null, tags = tags + [%(tag)s], marks = marks - {{0}}, '
                    f'attrs[%(key)s] = %(value)s, "byId" = "byId" - {{-1}}, "Static Note" = %(note)s '
                    f'WHERE {where_ann} AND "time" = %(time)s',
                    {**ann, "tag": 'appended "x"', "key": 'new "key" =>', "value": "v\\", "note": "noted",
                     "time": order_row(3)["time"]})
    session.execute(f'DELETE FROM {order} WHERE {where_ann} AND "time" = %(time)s',
                    {**ann, "time": order_row(6)["time"]})
    session.execute(f'DELETE FROM {order} WHERE {where_ann} AND "time" > %(after)s AND "time" <= %(until)s',
                    {**ann, "after": order_row(9)["time"], "until": order_row(15)["time"]})
    session.execute(insert, {**order_row(1), "user": "gone", "group": 0})
    session.execute(f'DELETE FROM {order} WHERE "user" = %s AND "group" = %s', ("gone", 0))
    session.execute(f'UPDATE {order} SET "Static Note" = %s WHERE "user" = %s AND "group" = %s',
                    ("static only", "static", 9))

    user = f'"{KEYSPACE}"."user"'
    session.execute(f'INSERT INTO {user} (id, "timestamp", "Value") VALUES (1, %s, %s)',
                    (datetime.datetime(2024, 5, 6, 7, 8, 9, 123000), "first"))
    assert session.execute(f'INSERT INTO {user} (id, "Value") VALUES (1, %s) IF NOT EXISTS',
                           ("not applied",)).was_applied is False
    assert session.execute(f'UPDATE {user} SET "Value" = %s WHERE id = 1 IF "Value" = %s',
                           ("by LWT \"'\\", "first")).was_applied
    session.execute(f'BEGIN BATCH INSERT INTO {user} (id, "Value") VALUES (2, %s); '
                    f'UPDATE {order} SET "Static Note" = %s WHERE "user" = %s AND "group" = %s; APPLY BATCH',
                    ("in a batch", "batched", 'Bob "the" builder', -2**31))

    orders = f'"{KEYSPACE}".orders'
    for offset, statement in enumerate([
            "INSERT INTO {t} (id, line, item, qty, owner) VALUES (1, 1, 'tea', 2, 'a') USING TIMESTAMP {at}",
            "INSERT INTO {t} (id, line, item, qty) VALUES (1, 2, 'cake', 1) USING TIMESTAMP {at}",
            "UPDATE {t} USING TIMESTAMP {at} SET owner = 'bob' WHERE id = 1",
            "INSERT INTO {t} (id, line, item, qty) VALUES (2, 1, 'jam', 5) USING TIMESTAMP {at}",
            "DELETE FROM {t} USING TIMESTAMP {at} WHERE id = 2",
            "UPDATE {t} USING TIMESTAMP {at} SET owner = 'static only' WHERE id = 3",
            "INSERT INTO {t} (id, line, item, qty) VALUES (4, 1, 'tea', 1) USING TIMESTAMP {at}",
            "UPDATE {t} USING TIMESTAMP {at} SET qty = 4 WHERE id = 1 AND line = 2"]):
        session.execute(statement.format(t=orders, at=orders_written_at + offset * 1000))

    tallies = f'"{KEYSPACE}".tallies'
    for key, column, delta in ((1, "hits", 5), (1, "hits", 3), (1, "misses", -2), (2, "hits", 1)):
        session.execute(f"UPDATE {tallies} SET {column} = {column} + %s WHERE id = %s", (delta, key))
    for table in (TRUNCATED, AVRO_TRUNCATED):
        for index in range(1, 4):
            session.execute(f'INSERT INTO "{KEYSPACE}".{table} (id, body) VALUES (%s, %s)',
                            (index, f"before {index}"))

    expiring = f'"{KEYSPACE}".expiring'
    ttl = expiry - int(time.time())  # a TTL counts from when the node takes the write
    session.execute(f"INSERT INTO {expiring} (id, v, n) VALUES (1, 'gone before', 1) USING TTL 1")
    session.execute(f"INSERT INTO {expiring} (id, v, n) VALUES (2, 'cell expires', 2)")
    session.execute(f"UPDATE {expiring} USING TTL {ttl} SET n = 20 WHERE id = 2")
    session.execute(f"INSERT INTO {expiring} (id, v, n) VALUES (3, 'row expires', 3) USING TTL {ttl}")
    session.execute(f"INSERT INTO {expiring} (id, v, n) VALUES (4, 'stays', 4)")

    accounts = f'"{KEYSPACE}".accounts'
    session.execute(f"INSERT INTO {accounts} (id, email, password, card, bio) VALUES (%s, %s, %s, %s, %s)",
                    (1, "ann@example.com", "hunter2", "4111 1111 1111 1111", "a long biography"))
    session.execute(f"INSERT INTO {accounts} (id, password, bio) VALUES (%s, %s, %s)", (2, "x", "short"))
    session.execute(f"UPDATE {accounts} SET bio = %s WHERE id = 2", ("é ü ß € 漢字 🎉",))


# What ExtractNewRecordState adds to each row of "orders" after ``write_first``: its last change's ``__op``
# and write time (an offset, in milliseconds, from ``orders_written_at``); a change of the static column is
# a change of every row of its partition.
UNWRAPPED_CHANGES = {(1, 1): ("u", 2), (1, 2): ("u", 7), (4, 1): ("c", 6)}


# --- what PostgreSQL must hold -----------------------------------------------------------------------------

def in_postgresql(cql_type: str, value: Any, avro: bool) -> Any:
    """A value as the driver gives it, as psycopg reads back the column the sink made for it with the
    recipe's handling modes (docs/events.md's type table): decimal and varint as their digits, duration as
    ISO 8601 text, a set as an array in Cassandra's order, NaN and the infinities null from JSON events."""
    if value is None:
        return None
    if cql_type == "decimal":
        return format(value, "f")
    if cql_type == "varint":
        return str(value)
    if cql_type == "duration":
        return next(text for duration, text in DURATIONS if duration == value)
    if cql_type in ("double", "float") and not math.isfinite(value):
        return value if avro else None
    if cql_type == "date":
        return value.date()
    if cql_type == "time":
        return datetime.time(value.hour, value.minute, value.second, value.nanosecond // 1000)
    if cql_type.startswith(("set<", "list<", "vector<")):
        return list(value)
    return value


def selected_rows(session: Any, table: str, avro: bool) -> Rows:
    """``SELECT *`` of the table as the sink must have written it: json columns as the node's ``toJson``
    of them, columns named as the format names them, less the rows of static-only partitions (the recipe
    skips them: their clustering columns are null) and the columns that column rules leave out."""
    key, json_columns = TABLES[table]
    metadata = session.cluster.metadata.keyspaces[KEYSPACE].tables[table]
    name = f'"{KEYSPACE}".{quote(table)}'
    rows = session.execute(f"SELECT * FROM {name}").all()
    if json_columns:
        texts = session.execute(f"SELECT {', '.join(f'toJson({quote(c)})' for c in json_columns)} "
                                f"FROM {name}").all()
        for row, json_texts in zip(rows, texts, strict=True):
            row.update({column: json.loads(text) for column, text in zip(json_columns, json_texts.values())})
    renamed = AVRO_NAMES if avro else {}
    expected = {}
    for row in rows:
        if any(row[column] is None for column in key):
            continue
        expected[tuple(row[column] for column in key)] = {
            renamed.get(column, column): value if column in json_columns else
            in_postgresql(metadata.columns[column].cql_type, value, avro) for column, value in row.items()}
    return expected if table != "accounts" else {k: with_column_rules(row) for k, row in expected.items()}


def with_column_rules(row: dict[str, Any]) -> dict[str, Any]:
    """A row of "accounts" as ``COLUMN_RULES`` make it: no password; bio cut to 5 characters; card masked
    with 4 asterisks (null too); email the SHA-256 of the salt and its UTF-8 bytes (Debezium's hash v2)."""
    email = row["email"]
    return {"id": row["id"], "bio": row["bio"] and row["bio"][:5], "card": "****",
            "email": email and hashlib.sha256(b"pepper" + email.encode()).hexdigest()}


def comparable(value: Any) -> Any:
    """A value NaN-proof for ``==`` (NaN equals nothing, itself included)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [comparable(element) for element in value]
    if isinstance(value, dict):
        return {key: comparable(element) for key, element in value.items()}
    return value


def postgresql_rows(connection: Any, table: str, key_columns: tuple[str, ...]) -> Rows:
    """The table's rows by primary key; none before the sink has created it. A ``real`` as the 32 bits it
    is (psycopg reads PostgreSQL's shortest text of it, ``3.4028235e+38``, as the nearest double)."""
    import psycopg

    try:
        cursor = connection.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
    except psycopg.errors.UndefinedTable:
        return {}
    reals = [column.name for column in cursor.description if column.type_code in REAL_TYPES]
    rows = {}
    for row in cursor.fetchall():
        rows[tuple(row[column] for column in key_columns)] = {
            **row, **{column: float32(row[column]) for column in reals}}
    return rows


REAL_TYPES = (700, 1021)  # the oids of PostgreSQL's real and real[]


def float32(value: Any) -> Any:
    """A float (or list of them) rounded to the float32 nearest it."""
    if isinstance(value, list):
        return [float32(element) for element in value]
    return value if value is None else struct.unpack("f", struct.pack("f", value))[0]


def differences(found: Rows, expected: Rows) -> dict[tuple[Any, ...], Any]:
    """Each row that differs: ``(found, expected)`` of each differing column, or of the whole row."""
    return {key: {column: (found[key].get(column), value) for column, value in expected[key].items()
                  if found[key].get(column) != value} or (found[key], expected[key])
            if key in found and key in expected else (found.get(key), expected.get(key))
            for key in found.keys() | expected.keys() if found.get(key) != expected.get(key)}


# --- the recipe's connectors ----------------------------------------------------------------------------

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
    for ``UNWRAPPED``, and the same for the Avro events with the ``avro`` converters; into this database."""
    sink = {key: value for key, value in recipe.sink.items() if key not in ("name", "topics.regex")}
    assert sink["connector.class"] == JDBC_SINK
    sink.update({"connection.url": jdbc_url, "connection.username": "postgres", "connection.password": ""})
    return {"tables": {**sink, "topics.regex": recipe.topics_regex(SERVER, KEYSPACE)},
            "unwrapped": {**sink, **recipe.unwrap, "topics": f"{SERVER}.{KEYSPACE}.{UNWRAPPED}",
                          "collection.name.format": "unwrapped_${topic}"},
            "avro": {**sink, **avro, "topics.regex": recipe.topics_regex(AVRO_SERVER, KEYSPACE)}}


def avro_messages(bootstrap_servers: str, topic: str,
                  registry_settings: dict[str, str]) -> list[tuple[Any, Any]]:
    """Every message of ``topic``, its key and value decoded with the schemas the registry gives for their
    ids (a tombstone's value None)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    decode = AvroDeserializer(SchemaRegistryClient(registry_settings))
    return [(decode(key, SerializationContext(topic, MessageField.KEY)),
             decode(value, SerializationContext(topic, MessageField.VALUE)))
            for _, key, value in messages(bootstrap_servers, topic)]


# --- the test ---------------------------------------------------------------------------------------------

def test_the_recipe_writes_every_table_into_postgresql_as_select_shows_it(
        real_cassandra: Any, real_kafka: Any, spark: Any, tmp_path: Path) -> None:
    """Debezium's JDBC sink as docs/events.md's recipe sets it up (upsert, deletes, truncates, record keys,
    basic schema evolution, quoted identifiers, every table's topic by a regex) makes of the events of every
    table the table itself, from Connect JSON and from Avro through the registry, after an ``ALTER TABLE
    ADD``, a ``TRUNCATE`` and TTL expiries too; ExtractNewRecordState's ``source.ts_ms`` is each row's write
    time; the column options keep what they match out of PostgreSQL."""
    from cassandra_cdc.localcluster import ConnectWorker, PostgresServer, SchemaRegistryServer
    from cassandra_cdc.localcluster.artifacts import connect_plugin_path, postgres_home, registry_application
    from cassandra_cdc.localcluster.certificates import CertificateAuthority

    require_jvm_artifacts(connect_plugin_path, postgres_home, registry_application)
    import psycopg
    from psycopg.rows import dict_row

    recipe = sink_recipe()
    authority = CertificateAuthority.create(tmp_path / "tls")
    certificate = authority.issue(tmp_path / "tls", "registry", hosts=["localhost", "127.0.0.1"])
    system = System(tmp_path, real_cassandra, real_kafka, SERVER, tables=[f"{KEYSPACE}.*"])
    pipeline = None
    # Written an hour ago: the write time cannot be mistaken for the time the events were processed.
    orders_written_at = time.time_ns() // 1000 - 3600 * 10**6
    try:
        with contextlib.ExitStack() as stack:
            # The sink first: the rows whose TTLs run out reach it soon after they are written.
            registry = stack.enter_context(SchemaRegistryServer(tmp_path / "registry", certificate,
                                                                users={REGISTRY_USER: REGISTRY_PASSWORD}))
            postgres = stack.enter_context(PostgresServer(tmp_path / "postgres"))
            connection = stack.enter_context(psycopg.connect(postgres.connection_string, autocommit=True,
                                                             row_factory=dict_row))
            sinks = connectors(recipe, postgres.jdbc_url,
                               avro_converters(recipe, registry.core_url, authority.certificate))
            worker_settings = {key: value for key, value in recipe.worker.items()
                               if key not in WORKER_SETTINGS_SET_HERE}
            worker = stack.enter_context(ConnectWorker(tmp_path / "connect", real_kafka.bootstrap_servers,
                                                       sinks, heap="512m", worker_settings=worker_settings))
            session = stack.enter_context(session_at_all(real_cassandra, SCHEMA))
            session.get_execution_profile(EXEC_PROFILE_DEFAULT).row_factory = dict_factory
            system.start_agents()
            expiry = int(time.time()) + EXPIRY_DELAY
            write_first(session, expiry, orders_written_at)
            pipeline_settings = {
                "server": SERVER, "checkpoint": str(tmp_path / "checkpoint"),
                "kafka.bootstrap_servers": real_kafka.bootstrap_servers, **recipe.pipeline_settings(),
                **{f"output.{key}": value for key, value in COLUMN_RULES.items()},
                "spark.trigger_interval": "500 milliseconds"}
            pipeline = start(spark, load_pipeline_config(None, pipeline_settings))

            def still_working() -> None:
                assert pipeline is not None and pipeline.exception() is None, pipeline.exception()
                for agent in system.agents:
                    assert agent.exit_code is None, f"{agent.name} exited: {agent.log_tail(30)}"
                failed = {task for task in worker.failures()
                          if task.split("/")[0] in ("tables", "unwrapped", "avro")}
                assert not failed, worker.failure("a task failed")

            def assert_equal(sunk: str, key: tuple[str, ...], expected: Callable[[], Rows],
                             timeout: float = 120.0) -> None:
                """PostgreSQL's table ``sunk`` equals ``expected()`` (taken again each second)
                within ``timeout`` seconds."""
                deadline = time.monotonic() + timeout
                while True:
                    rows = comparable(expected())
                    found = comparable(postgresql_rows(connection, sunk, key))
                    if found == rows:
                        return
                    assert time.monotonic() < deadline, f"{sunk}: {differences(found, rows)}"
                    still_working()
                    time.sleep(1)

            def assert_tables(server: str, tables: list[str], avro: bool = False) -> None:
                for table in tables:
                    assert_equal(f"{server}_{KEYSPACE}_{table}", TABLES[table][0],
                                 lambda: selected_rows(session, table, avro))

            assert_tables(SERVER, list(TABLES))
            assert time.time() < expiry, "the rows whose TTLs run out reached PostgreSQL too late"
            assert_equal(f"unwrapped_{SERVER}_{KEYSPACE}_{UNWRAPPED}", TABLES[UNWRAPPED][0], lambda: {
                key: {**row, "__op": UNWRAPPED_CHANGES[key][0],
                      "__source_ts_ms": orders_written_at // 1000 + UNWRAPPED_CHANGES[key][1]}
                for key, row in selected_rows(session, UNWRAPPED, avro=False).items()})

            # While the sink runs: a column added (the sink adds it), a TRUNCATE (the table
            # emptied) and what is written after it.
            session.execute(f'ALTER TABLE "{KEYSPACE}"."user" ADD "Added Later" text')
            session.execute(f'UPDATE "{KEYSPACE}"."user" SET "Added Later" = %s WHERE id = 2',
                            ('later "\\',))
            assert_tables(SERVER, ["user"])
            truncate(session, TRUNCATED)
            assert_equal(f"{SERVER}_{KEYSPACE}_{TRUNCATED}", ("id",), dict)
            for index in (1, 4):
                session.execute(f'INSERT INTO "{KEYSPACE}".{TRUNCATED} (id, body) VALUES (%s, %s)',
                                (index, f"after {index}"))
            assert_tables(SERVER, [TRUNCATED])

            # TTLs: the expired cell and row are gone (the row whose TTL ran out before the
            # pipeline started never came).
            time.sleep(max(0.0, expiry + 1 - time.time()))
            assert sorted(selected_rows(session, "expiring", avro=False)) == [(2,), (4,)]
            assert_tables(SERVER, ["expiring"])

            # Avro through the registry: the same raw records again, through a second pipeline
            # (one query runs at a time).
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
                "output.heartbeat_interval_ms": 1000, "output.skipped_operations": "t"}))
            assert_tables(AVRO_SERVER, [table for table in TABLES if table != TRUNCATED], avro=True)

            # skipped.operations=t: a TRUNCATE has no event, and the sink keeps the rows; what is
            # written after it comes as usual.
            kept = selected_rows(session, AVRO_TRUNCATED, avro=True)
            truncate(session, AVRO_TRUNCATED)
            drafts_id = table_id(session, KEYSPACE, AVRO_TRUNCATED)
            nodes = {node.address for node in real_cassandra.nodes}
            wait_for(lambda: {node for node, _ in truncations_by_node(
                real_kafka.bootstrap_servers, f"{SERVER}.raw", drafts_id)} == nodes,
                "every agent to publish the truncation", 120, system.agents)
            session.execute(f'INSERT INTO "{KEYSPACE}".{AVRO_TRUNCATED} (id, body) VALUES (4, %s)',
                            ("after 4",))
            assert_equal(f"{AVRO_SERVER}_{KEYSPACE}_{AVRO_TRUNCATED}", ("id",),
                         lambda: {**kept, (4,): {"id": 4, "body": "after 4"}})
            registry_settings = SchemaRegistrySettings(
                url=registry.url, username=REGISTRY_USER, password=REGISTRY_PASSWORD,
                ca_file=authority.certificate).client_settings()
            written = {(value["op"], value["after"]["id"]) for _, value in avro_messages(
                real_kafka.bootstrap_servers, f"{AVRO_SERVER}.{KEYSPACE}.{AVRO_TRUNCATED}",
                registry_settings)}
            assert written == {("c", index) for index in range(1, 5)}, written

            # The heartbeats in Avro, registered there too.
            heartbeats = f"__debezium-heartbeat.{AVRO_SERVER}"
            wait_for(lambda: topic_exists(real_kafka.bootstrap_servers, heartbeats),
                     "an Avro heartbeat", 60, system.agents)
            [(key, value), *_] = avro_messages(real_kafka.bootstrap_servers, heartbeats,
                                               registry_settings)
            assert key == {"serverName": AVRO_SERVER}, key
            assert avro_started_ms <= value["ts_ms"] <= time.time_ns() // 10**6, value
    finally:
        if pipeline is not None:
            pipeline.stop()
        system.stop()


def truncate(session: Any, table: str) -> None:
    session.execute(f'TRUNCATE "{KEYSPACE}".{table}')
