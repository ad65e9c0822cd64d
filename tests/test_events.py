"""Event encodings: Kafka Connect JSON as the JsonConverter writes it, and Avro through a schema registry."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import math
import re
import struct
import uuid
from importlib.metadata import version
from typing import Any

import fastavro
import pytest

from cassandra.util import Date, Duration, Time
from cassandra_cdc.events.event_encoder import EventEncoder, Source
from cassandra_cdc.events.field_mapping import TypeModes
from cassandra_cdc.merge.table_view import STATIC_CLUSTERING, table_view
from cassandra_cdc.schema import TableMetadata, parse_schema

SCHEMA = parse_schema("""
CREATE TYPE shop.address (street text, number int);
CREATE TABLE shop.everything (
    id uuid, seq int, name text, big varint, price decimal, at timestamp, day date, tod time, span duration,
    ip inet, raw blob, ok boolean, small smallint, tiny tinyint, ratio float, score double, n bigint,
    tags set<text>, counts map<text, int>, ids map<int, text>, history list<bigint>, home frozen<address>,
    pair tuple<int, text>, embedding vector<float, 3>,
    PRIMARY KEY (id, seq)
) WITH cdc = true;""")
TABLE = SCHEMA.table("shop", "everything")
ROW: dict[str, Any] = {
    "id": uuid.UUID("6b1c2f0e-1d3a-4c5b-9e8f-0a1b2c3d4e5f"), "seq": 7, "name": "tea", "big": 10**30,
    "price": decimal.Decimal("12.3400"), "at": datetime.datetime(2024, 5, 6, 7, 8, 9, 123000),
    "day": Date(19000), "tod": Time(3_723_000_000_001), "span": Duration(1, 2, 3), "ip": "10.0.0.1",
    "raw": b"\x00\xff", "ok": True, "small": -3, "tiny": 5, "ratio": 0.5, "score": 2.25, "n": -(2**40),
    "tags": ["a", "b"], "counts": {"x": 1}, "ids": {2: "two"}, "history": [1, 2], "home": {"street": "Main", "number": 4},
    "pair": (1, "one"), "embedding": [0.5, 1.5, 2.5],
}
SOURCE = Source("prod", "prod-cluster", "shop", "everything", 1714979289123456, False, "node2", 1700000000000, 4242)


def test_connect_json_carries_schema_and_lossless_payload() -> None:
    encoder = EventEncoder("prod", TABLE, "json")
    assert encoder.topic == "prod.shop.everything"
    value = json.loads(encoder.value(None, ROW, "c", SOURCE, 1714979290000))
    payload = value["payload"]
    assert payload["op"] == "c" and payload["before"] is None and payload["ts_ms"] == 1714979290000
    after = payload["after"]
    assert after["id"] == "6b1c2f0e-1d3a-4c5b-9e8f-0a1b2c3d4e5f"
    # varint: a Connect Decimal of scale 0 (two's complement, big-endian); decimal: Debezium's
    # VariableScaleDecimal, which keeps the scale.
    assert int.from_bytes(base64.b64decode(after["big"]), "big", signed=True) == 10**30
    assert after["price"]["scale"] == 4
    assert int.from_bytes(base64.b64decode(after["price"]["value"]), "big", signed=True) == 123400
    assert after["at"] == 1714979289123  # milliseconds since the epoch
    assert after["day"] == 19000 and after["tod"] == 3_723_000_000_001
    assert after["span"] == "P0Y1M2DT0H0M0.000000003S"  # io.debezium.time.Interval: ISO 8601, every unit
    assert base64.b64decode(after["raw"]) == b"\x00\xff"
    assert after["counts"] == {"x": 1} and after["ids"] == [[2, "two"]]  # non-text map keys: pairs
    assert after["home"] == {"street": "Main", "number": 4} and after["pair"] == {"field1": 1, "field2": "one"}
    assert payload["source"] == {
        "version": version("cassandra-cdc"), "connector": "cassandra_cdc", "name": "prod",
        "ts_ms": 1714979289123, "snapshot": "false", "db": "shop", "sequence": None,
        "ts_us": 1714979289123456,
        "ts_ns": 1714979289123456000, "cluster": "prod-cluster", "keyspace": "shop", "table": "everything",
        "node": "node2", "segment": 1700000000000, "position": 4242}
    schema = value["schema"]
    assert schema["name"] == "prod.shop.everything.Envelope"
    fields = {f["field"]: f for f in schema["fields"][1]["fields"]}
    assert fields["at"]["name"] == "org.apache.kafka.connect.data.Timestamp"
    assert fields["day"]["name"] == "org.apache.kafka.connect.data.Date"
    assert fields["tags"]["type"] == "array" and fields["counts"]["type"] == "map"
    assert set(fields) == {c.name for c in TABLE.columns}
    key = json.loads(encoder.key(ROW))
    assert key["payload"] == {"id": "6b1c2f0e-1d3a-4c5b-9e8f-0a1b2c3d4e5f", "seq": 7}
    assert [f["field"] for f in key["schema"]["fields"]] == ["id", "seq"]


# Debezium's envelope (io.debezium.schema.SchemaFactory.datatypeEnvelopeSchema, Envelope.SCHEMA_VERSION 2) and
# source (sourceInfoSchemaBuilder, SOURCE_INFO_DEFAULT_SCHEMA_VERSION 1, SnapshotRecord) as read in its code:
# (field, Connect type, optional).
DEBEZIUM_ENVELOPE_TAIL = [("op", "string", False), ("ts_ms", "int64", True), ("ts_us", "int64", True),
                          ("ts_ns", "int64", True), ("transaction", "struct", True)]
DEBEZIUM_SOURCE_COMMON = [("version", "string", False), ("connector", "string", False), ("name", "string",
                                                                                         False),
                          ("ts_ms", "int64", False), ("snapshot", "string", True), ("db", "string", False),
                          ("sequence", "string", True), ("ts_us", "int64", True), ("ts_ns", "int64", True)]
OUR_SOURCE_FIELDS = [("cluster", "string", False), ("keyspace", "string", False), ("table", "string", False),
                     ("node", "string", True), ("segment", "int64", True), ("position", "int64", True)]
SNAPSHOT_ENUM = {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                 "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,"
                                           "last,false,incremental"},
                 "default": "false", "field": "snapshot"}


def _shape(fields: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [(f["field"], f["type"], f["optional"]) for f in fields]


def test_envelope_and_source_follow_debezium_conventions() -> None:
    encoder = EventEncoder("prod", TABLE, "json")
    schema = json.loads(encoder.value(None, ROW, "c", SOURCE, 1714979290000))["schema"]
    assert (schema["name"], schema["version"]) == ("prod.shop.everything.Envelope", 2)
    fields = {f["field"]: f for f in schema["fields"]}
    assert _shape(schema["fields"])[2:] == [("source", "struct", False)] + DEBEZIUM_ENVELOPE_TAIL
    transaction = fields["transaction"]
    assert (transaction["name"], transaction["version"]) == ("event.block", 1)
    assert _shape(transaction["fields"]) == [("id", "string", False), ("total_order", "int64", False),
                                             ("data_collection_order", "int64", False)]
    source = fields["source"]
    assert (source["name"], source["version"]) == ("io.debezium.connector.cassandra_cdc.Source", 1)
    assert _shape(source["fields"]) == DEBEZIUM_SOURCE_COMMON + OUR_SOURCE_FIELDS
    assert source["fields"][4] == SNAPSHOT_ENUM
    # The envelope's times are the processing time; the source's the write time (a TTL expiry: its time).
    payload = json.loads(encoder.value(None, ROW, "r", SOURCE._replace(snapshot=True),
                                       1714979290000))["payload"]
    assert (payload["ts_ms"], payload["ts_us"], payload["ts_ns"]) == \
        (1714979290000, 1714979290000000, 1714979290000000000)
    assert payload["transaction"] is None and payload["source"]["snapshot"] == "true"
    expiry = SOURCE._replace(ts_us=1714979300 * 1_000_000, node=None, segment=None, position=None)
    payload = json.loads(encoder.value(ROW, None, "d", expiry, 1714979301000))["payload"]
    assert {k: payload["source"][k] for k in ("ts_ms", "ts_us", "ts_ns", "node", "segment", "position")} == {
        "ts_ms": 1714979300000, "ts_us": 1714979300000000, "ts_ns": 1714979300000000000, "node": None,
        "segment": None, "position": None}


def test_connect_json_bytes_are_those_of_one_compact_document() -> None:
    # Event keys are compared as bytes (partitioning, compaction): the encoding must stay exactly this.
    encoder = EventEncoder("prod", TABLE, "json")
    for encoded in (encoder.key(ROW), encoder.value(None, ROW, "c", SOURCE, 1), encoder.value(ROW, None, "d", SOURCE, 2)):
        document = json.loads(encoded)
        assert list(document) == ["schema", "payload"]
        assert encoded == json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


class FakeRegistry:
    """Stands in for the schema registry's HTTP API: an id per distinct schema, the latest schema of each
    subject; ``read`` decodes a record of the Confluent wire format as a deserializer does, with the schema
    of its id."""

    def __init__(self) -> None:
        self.subjects: dict[str, Any] = {}
        self.schemas: list[Any] = []
        self.requests = 0

    def register(self, subject: str, schema: Any) -> int:
        self.requests += 1
        schema = json.loads(json.dumps(schema))  # what goes over HTTP is JSON text
        if schema not in self.schemas:
            self.schemas.append(schema)
        self.subjects[subject] = schema
        return self.schemas.index(schema) + 1

    def read(self, encoded: bytes) -> Any:
        magic, schema_id = struct.unpack(">bI", encoded[:5])
        assert magic == 0
        return fastavro.schemaless_reader(io.BytesIO(encoded[5:]), self.schemas[schema_id - 1])


def avro_encoder(table: TableMetadata, modes: TypeModes = TypeModes()) -> tuple[EventEncoder, FakeRegistry]:
    registry = FakeRegistry()
    return EventEncoder("prod", table, "avro", registry, modes), registry  # type: ignore[arg-type]


def test_avro_events_read_back_with_the_schemas_registered() -> None:
    encoder, registry = avro_encoder(TABLE)
    before = dict(ROW, name="coffee")
    record = registry.read(encoder.value(before, ROW, "u", SOURCE, 1))
    assert record["op"] == "u" and record["before"]["name"] == "coffee" and record["after"]["name"] == "tea"
    assert record["after"]["big"] == decimal.Decimal(10**30)  # Avro's decimal of scale 0
    assert record["after"]["price"] == {"scale": 4, "value": (123400).to_bytes(3, "big", signed=True)}
    assert record["after"]["ids"] == [{"key": 2, "value": "two"}] and record["after"]["counts"] == {"x": 1}
    assert record["after"]["id"] == str(ROW["id"])  # io.debezium.data.Uuid: a string
    assert record["after"]["at"] == datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=datetime.timezone.utc)
    assert record["source"]["node"] == "node2"
    key = registry.read(encoder.key(ROW))
    assert key == {"id": str(ROW["id"]), "seq": 7}


def test_an_avro_truncation_has_a_key_that_reads_as_null_and_no_rows() -> None:
    encoder, registry = avro_encoder(TABLE)
    encoder.key(ROW)
    assert registry.read(encoder.no_key()) is None
    record = registry.read(encoder.value(None, None, "t", SOURCE, 1))
    assert (record["op"], record["before"], record["after"]) == ("t", None, None)
    # The same subject as the rows' keys, its schema the union of null and theirs.
    assert registry.subjects["prod.shop.everything-key"][0] == "null"
    assert registry.read(encoder.key(ROW)) == {"id": str(ROW["id"]), "seq": 7}


def test_avro_needs_a_registry() -> None:
    with pytest.raises(ValueError, match="Avro events need a schema registry"):
        EventEncoder("prod", TABLE, "avro")


def test_float_values_show_the_digits_cassandra_shows() -> None:
    """A float is 32 bits: 7.62 decodes to 7.619999885559082 as a double. JSON events show it as SELECT JSON
    does (Java's Float.toString: 7.62); Avro carries the same 32 bits."""
    float_type = TABLE.column(b"ratio").type
    decoded = float_type.deserialize(struct.pack(">f", 7.62))
    row = dict(ROW, ratio=decoded, embedding=[decoded, float_type.deserialize(struct.pack(">f", 0.1)), 2.5])
    text = EventEncoder("prod", TABLE, "json").value(None, row, "c", SOURCE, 1).decode()
    assert '"ratio":7.62,' in text and '"embedding":[7.62,0.1,2.5]' in text
    encoder, registry = avro_encoder(TABLE)
    record = registry.read(encoder.value(None, row, "c", SOURCE, 1))
    assert struct.pack(">f", record["after"]["ratio"]) == struct.pack(">f", 7.62)


def test_avro_envelope_and_source_carry_the_connect_properties() -> None:
    """What Confluent's AvroConverter (AvroData.fromConnectSchema) writes for these Connect schemas."""
    encoder, registry = avro_encoder(TABLE)
    record = registry.read(encoder.value(None, ROW, "c", SOURCE, 7))
    record_schema = registry.subjects["prod.shop.everything-value"]
    assert record_schema["connect.version"] == 2
    assert record_schema["connect.name"] == "prod.shop.everything.Envelope"
    fields = {f["name"]: f for f in record_schema["fields"]}
    assert [f["name"] for f in record_schema["fields"]] == \
        ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns", "transaction"]
    assert fields["ts_us"] == {"name": "ts_us", "type": ["null", "long"], "default": None}
    source = fields["source"]["type"]
    assert (source["name"], source["namespace"], source["connect.version"], source["connect.name"]) == \
        ("Source", "io.debezium.connector.cassandra_cdc", 1, "io.debezium.connector.cassandra_cdc.Source")
    source_fields = {f["name"]: f for f in source["fields"]}
    assert source_fields["ts_ms"] == {"name": "ts_ms", "type": "long"}
    assert source_fields["snapshot"] == {"name": "snapshot", "type": [{
        "type": "string", "connect.version": 1, "connect.parameters": SNAPSHOT_ENUM["parameters"],
        "connect.default": "false", "connect.name": "io.debezium.data.Enum"}, "null"], "default": "false"}
    transaction = fields["transaction"]
    assert transaction["default"] is None and transaction["type"][0] == "null"
    assert (transaction["type"][1]["name"], transaction["type"][1]["namespace"]) == ("block", "event")
    assert record["transaction"] is None and record["ts_ns"] == 7_000_000
    assert record["source"]["db"] == "shop" and record["source"]["ts_ms"] == 1714979289123


def test_avro_with_a_registry_uses_the_confluent_wire_format() -> None:
    encoder, registry = avro_encoder(TABLE)
    value = encoder.value(ROW, None, "d", SOURCE, 1)
    magic, schema_id = struct.unpack(">bI", value[:5])
    assert magic == 0 and schema_id == 1 and list(registry.subjects) == ["prod.shop.everything-value"]
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), registry.subjects["prod.shop.everything-value"])
    assert record["op"] == "d" and record["after"] is None and record["before"]["seq"] == 7
    # The schema as declared, without fastavro's bookkeeping, registered once for any number of events.
    registered = registry.subjects["prod.shop.everything-value"]
    assert "__fastavro" not in json.dumps(registered) and registered["name"] == "Envelope"
    assert encoder.value(None, ROW, "c", SOURCE, 2)[:5] == value[:5] and registry.requests == 1


def test_null_columns_stay_null() -> None:
    sparse = {"id": ROW["id"], "seq": 1}
    encoder, registry = avro_encoder(TABLE)
    in_json = json.loads(EventEncoder("prod", TABLE).value(None, sparse, "c", SOURCE, 1))["payload"]
    for after in (in_json["after"], registry.read(encoder.value(None, sparse, "c", SOURCE, 1))["after"]):
        assert after["seq"] == 1 and after["name"] is None and after["tags"] is None


STATIC_SCHEMA = parse_schema("""
CREATE TABLE shop.carts (user int, item text, qty int, owner text static, PRIMARY KEY (user, item));
CREATE TABLE shop.legacy (k int PRIMARY KEY, v text)
    WITH COMPACT STORAGE AND ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18;
""")


def _static_only_row(table: TableMetadata, key: dict[str, Any], statics: dict[str, Any]) -> dict[str, Any]:
    """The row the pipeline shows for a partition with static values and no live row (see ``merge``)."""
    view = table_view(table)
    raw = tuple(c.type.serialize(statics[c.name]) for c in view.statics)
    row = view.decode_row(key, STATIC_CLUSTERING, (None, raw))
    assert row is not None
    return row


def _avro_round_trip(table: TableMetadata, row: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The key and the ``after`` of an insert of ``row``, encoded in Avro and read back."""
    encoder, registry = avro_encoder(table)
    return registry.read(encoder.key(row)), registry.read(encoder.value(None, row, "c", SOURCE, 1))["after"]


@pytest.mark.parametrize(("table_name", "key", "statics", "expected_key", "expected_after"), [
    ("carts", {"user": 1}, {"owner": "ann"}, {"user": 1, "item": None},
     {"user": 1, "item": None, "qty": None, "owner": "ann"}),
    # Static COMPACT STORAGE: the declared columns are static, next to a hidden clustering column1 and value.
    ("legacy", {"k": 1}, {"v": "x"}, {"k": 1, "column1": None},
     {"k": 1, "column1": None, "value": None, "v": "x"}),
])
def test_a_static_only_row_has_null_clustering_columns_in_its_key(
        table_name: str, key: dict[str, Any], statics: dict[str, Any], expected_key: dict[str, Any],
        expected_after: dict[str, Any]) -> None:
    table = STATIC_SCHEMA.table("shop", table_name)
    assert table is not None
    row = _static_only_row(table, key, statics)
    assert _avro_round_trip(table, row) == (expected_key, expected_after)
    encoder = EventEncoder("prod", table, "json")
    document = json.loads(encoder.key(row))
    assert document["payload"] == expected_key
    # The partition key column is required, the clustering column optional (the JsonConverter checks).
    assert [(f["field"], f["optional"]) for f in document["schema"]["fields"]] == \
        [(name, optional) for name, optional in zip(expected_key, (False, True))]
    assert json.loads(encoder.value(None, row, "c", SOURCE, 1))["payload"]["after"] == expected_after


NAMED_SCHEMA = parse_schema("""
CREATE TYPE shop.addr ("Street-Name" text, "2nd" int, "Street_Name" text);
CREATE TABLE shop.named (
    "Order-Id" int, "1st" int, spot frozen<addr>, spot2 frozen<addr>, home frozen<addr>, work addr,
    past list<frozen<addr>>, by_floor map<int, frozen<addr>>, took duration, waited duration,
    a map<int, text>, b map<int, text>, p tuple<int, text>, q tuple<int, text>,
    ints tuple<int, frozen<list<int>>>, texts tuple<int, frozen<list<text>>>,
    "Weird-Name" text, "Weird_Name" text,
    PRIMARY KEY (("Order-Id", "1st"), spot, spot2));""")
NAMED = NAMED_SCHEMA.table("shop", "named")
NAMED_VALUES: dict[str, Any] = {
    "Order-Id": 1, "1st": 2, "spot": ("Main", 4, "M"), "spot2": ("High", 5, "H"), "home": ("Elm", 6, None),
    "work": ("Oak", 7, "O"), "past": [("Ash", 8, "A")], "by_floor": {3: ("Fir", 9, "F")},
    "took": Duration(1, 2, 3), "waited": Duration(4, 5, 6), "a": {1: "one"}, "b": {2: "two"},
    "p": (1, "one"), "q": (2, "two"),
    "ints": (3, [1, 2]), "texts": (4, ["x"]), "Weird-Name": "dash", "Weird_Name": "underscore",
}
_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _driver_row(table: TableMetadata, values: dict[str, Any]) -> dict[str, Any]:
    """The row as the pipeline decodes it, with the driver's types (UDTs as named tuples)."""
    return {c.name: c.type.deserialize(c.type.serialize(values[c.name])) for c in table.columns}


def _check_avro_names(schema: Any, namespace: str, defined: set[str]) -> None:
    """Fails unless the schema's names are valid and each named type is defined once (Avro spec, "Names")."""
    if isinstance(schema, list):
        for branch in schema:
            _check_avro_names(branch, namespace, defined)
    elif isinstance(schema, dict) and schema["type"] == "record":
        name = schema["name"]
        if "." not in name:
            name = f"{schema.get('namespace', namespace)}.{name}"
        assert all(_AVRO_NAME.fullmatch(part) for part in name.split(".")) and name not in defined, name
        defined.add(name)
        fields = [f["name"] for f in schema["fields"]]
        assert all(_AVRO_NAME.fullmatch(f) for f in fields) and len(set(fields)) == len(fields), fields
        for field in schema["fields"]:
            _check_avro_names(field["type"], name.rpartition(".")[0], defined)
    elif isinstance(schema, dict) and schema["type"] in ("array", "map"):
        _check_avro_names(schema.get("items", schema.get("values")), namespace, defined)


def test_avro_defines_each_named_type_once_and_names_fields_validly() -> None:
    assert NAMED is not None
    row = _driver_row(NAMED, NAMED_VALUES)
    encoder, registry = avro_encoder(NAMED)
    encoder.key(row), encoder.value(None, row, "c", SOURCE, 1)
    for schema in registry.subjects.values():
        _check_avro_names(schema, "", set())
    # Invalid characters become "_", and a name that another field has then gets a suffix.
    expected_key = {"Order_Id": 1, "_1st": 2,
                    "spot": {"Street_Name_2": "Main", "_2nd": 4, "Street_Name": "M"},
                    "spot2": {"Street_Name_2": "High", "_2nd": 5, "Street_Name": "H"}}
    expected_after = expected_key | {
        "home": {"Street_Name_2": "Elm", "_2nd": 6, "Street_Name": None},
        "work": {"Street_Name_2": "Oak", "_2nd": 7, "Street_Name": "O"},
        "past": [{"Street_Name_2": "Ash", "_2nd": 8, "Street_Name": "A"}],
        "by_floor": [{"key": 3, "value": {"Street_Name_2": "Fir", "_2nd": 9, "Street_Name": "F"}}],
        "took": "P0Y1M2DT0H0M0.000000003S", "waited": "P0Y4M5DT0H0M0.000000006S",
        "a": [{"key": 1, "value": "one"}], "b": [{"key": 2, "value": "two"}],
        "p": {"field1": 1, "field2": "one"}, "q": {"field1": 2, "field2": "two"},
        # One name for both tuple types (their elements' kinds): the second is renamed, not taken for
        # the first.
        "ints": {"field1": 3, "field2": [1, 2]}, "texts": {"field1": 4, "field2": ["x"]},
        "Weird_Name_2": "dash", "Weird_Name": "underscore"}
    assert _avro_round_trip(NAMED, row) == (expected_key, expected_after)


def test_connect_json_keeps_the_cql_names() -> None:
    assert NAMED is not None
    row = _driver_row(NAMED, NAMED_VALUES)
    encoder = EventEncoder("prod", NAMED, "json")
    assert json.loads(encoder.key(row))["payload"] == {
        "Order-Id": 1, "1st": 2, "spot": {"Street-Name": "Main", "2nd": 4, "Street_Name": "M"},
        "spot2": {"Street-Name": "High", "2nd": 5, "Street_Name": "H"}}
    after = json.loads(encoder.value(None, row, "c", SOURCE, 1))["payload"]["after"]
    assert after["Weird-Name"] == "dash" and after["Weird_Name"] == "underscore"
    assert after["past"] == [{"Street-Name": "Ash", "2nd": 8, "Street_Name": "A"}]
    assert after["by_floor"] == [[3, {"Street-Name": "Fir", "2nd": 9, "Street_Name": "F"}]]


DECIMALS = parse_schema("""
CREATE TABLE shop.numbers (k int PRIMARY KEY, d decimal, v varint, span duration, x double, f float);""")
NUMBERS = DECIMALS.table("shop", "numbers")


def _after(modes: TypeModes, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``after`` of an insert in Connect JSON, and the schemas of its fields."""
    assert NUMBERS is not None
    document = json.loads(EventEncoder("prod", NUMBERS, "json", modes=modes).value(None, row, "c", SOURCE, 1))
    value_fields = {f["field"]: f for f in document["schema"]["fields"][1]["fields"]}
    return document["payload"]["after"], value_fields


@pytest.mark.parametrize(("value", "text", "scale", "unscaled"), [
    ("1E-8", "0.00000001", 8, 1), ("1E+3", "1000", -3, 1), ("-12.3400", "-12.3400", 4, -123400),
    ("0", "0", 0, 0), ("-128", "-128", 0, -128)])
def test_decimal_handling_modes(value: str, text: str, scale: int, unscaled: int) -> None:
    row = {"k": 1, "d": decimal.Decimal(value)}
    after, fields = _after(TypeModes(decimal="precise"), row)
    assert fields["d"] == {"type": "struct", "fields": [{"type": "int32", "optional": False,
                                                         "field": "scale"},
                                                        {"type": "bytes", "optional": False,
                                                         "field": "value"}],
                           "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
                           "doc": "Variable scaled decimal", "field": "d"}
    assert after["d"]["scale"] == scale
    raw = base64.b64decode(after["d"]["value"])
    assert int.from_bytes(raw, "big", signed=True) == unscaled
    assert len(raw) == (unscaled.bit_length() // 8) + 1  # Java's BigInteger.toByteArray: the fewest bytes
    after, fields = _after(TypeModes(decimal="string"), row)
    assert after["d"] == text and fields["d"]["type"] == "string" and "name" not in fields["d"]
    after, fields = _after(TypeModes(decimal="double"), row)
    assert after["d"] == float(value) and fields["d"]["type"] == "double"


def test_varint_handling_modes() -> None:
    row = {"k": 1, "v": -(10**20)}
    after, fields = _after(TypeModes(varint="precise"), row)
    assert {k: fields["v"][k] for k in ("type", "name", "version", "parameters")} == {
        "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
        "parameters": {"scale": "0"}}
    assert int.from_bytes(base64.b64decode(after["v"]), "big", signed=True) == -(10**20)
    assert _after(TypeModes(varint="string"), row)[0]["v"] == "-100000000000000000000"
    # long: Java's BigInteger.longValue, the low 64 bits: -10**20 mod 2**64, as a signed 64-bit number
    assert _after(TypeModes(varint="long"), row)[0]["v"] == -7766279631452241920


@pytest.mark.parametrize(("duration", "iso", "nanoseconds"), [
    (Duration(14, 3, 3_723_500_000_000), "P1Y2M3DT1H2M3.5S",
     ((14 * 30 + 3) * 86_400) * 10**9 + 3_723_500_000_000),
    (Duration(-1, -2, -60_000_000_000), "P0Y-1M-2DT0H-1M0S", -((30 + 2) * 86_400) * 10**9 - 60_000_000_000),
    (Duration(0, 0, 0), "P0Y0M0DT0H0M0S", 0)])
def test_duration_as_debezium_interval_or_nano_duration(duration: Duration, iso: str,
                                                        nanoseconds: int) -> None:
    after, fields = _after(TypeModes(interval="string"), {"k": 1, "span": duration})
    assert after["span"] == iso and (fields["span"]["name"], fields["span"]["version"]) == \
        ("io.debezium.time.Interval", 1)
    after, fields = _after(TypeModes(interval="numeric"), {"k": 1, "span": duration})
    assert after["span"] == nanoseconds and (fields["span"]["name"], fields["span"]["type"]) == \
        ("io.debezium.time.NanoDuration", "int64")


def test_nan_and_infinity_are_null_in_json_and_exact_in_avro() -> None:
    """JSON has no NaN nor infinities, and Kafka's JsonConverter reads the text it writes for them as 0.0
    (test_connect_json.py): in Connect JSON they are null; Avro's doubles and floats hold them."""
    assert NUMBERS is not None
    row = {"k": 1, "x": float("nan"), "f": float("-inf")}
    encoded = EventEncoder("prod", NUMBERS, "json").value(None, row, "c", SOURCE, 1)

    def reject(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    after = json.loads(encoded, parse_constant=reject)["payload"]["after"]
    assert after["x"] is None and after["f"] is None
    row = {"k": 1, "x": float("inf"), "f": float("nan")}
    assert json.loads(EventEncoder("prod", NUMBERS, "json").value(None, row, "c", SOURCE,
                                                                  1))["payload"]["after"]["x"] is None
    encoder, registry = avro_encoder(NUMBERS)
    read = registry.read(encoder.value(None, row, "c", SOURCE, 1))["after"]
    assert read["x"] == float("inf") and math.isnan(read["f"])


def test_logical_types_carry_their_versions() -> None:
    document = json.loads(EventEncoder("prod", TABLE, "json").value(None, ROW, "c", SOURCE, 1))
    fields = {f["field"]: f for f in document["schema"]["fields"][1]["fields"]}
    assert {name: (fields[name]["name"], fields[name]["version"]) for name in ("id", "at", "day", "tod")} == {
        "id": ("io.debezium.data.Uuid", 1), "at": ("org.apache.kafka.connect.data.Timestamp", 1),
        "day": ("org.apache.kafka.connect.data.Date", 1), "tod": ("io.debezium.time.NanoTime", 1)}


def test_avro_types_carry_the_avro_converters_properties() -> None:
    encoder, registry = avro_encoder(TABLE)
    encoder.value(None, ROW, "c", SOURCE, 1)
    envelope = registry.subjects["prod.shop.everything-value"]
    row = {f["name"]: f["type"][1] for f in envelope["fields"][0]["type"][1]["fields"]}
    assert row["at"] == {"type": "long", "connect.version": 1,
                         "connect.name": "org.apache.kafka.connect.data.Timestamp",
                         "logicalType": "timestamp-millis"}
    assert row["id"] == {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Uuid"}
    assert row["tiny"] == {"type": "int", "connect.type": "int8"}
    assert row["big"] == {"type": "bytes", "scale": 0, "precision": 64, "connect.version": 1,
                          "connect.parameters": {"scale": "0"},
                          "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal"}
    assert row["price"] == {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
                            "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                            "connect.doc": "Variable scaled decimal", "connect.version": 1,
                            "connect.name": "io.debezium.data.VariableScaleDecimal"}


def test_doubles_are_written_as_java_writes_them() -> None:
    """The JsonConverter writes a double with Java's Double.toString (1.0E300, 1.0E-8, 1.0E7, 100.0), a float
    with Float.toString; a text that merely looks like a number stays text."""
    assert NUMBERS is not None
    encoder = EventEncoder("prod", NUMBERS, "json", modes=TypeModes(decimal="double"))
    for x, f, x_text, f_text in ((1e300, 1e-8, "1.0E300", "1.0E-8"), (1e7, 100.0, "1.0E7", "100.0"),
                                 (-0.0001, 1234567.0, "-1.0E-4", "1234567.0")):
        row = {"k": 1, "d": decimal.Decimal("2.5E-9"), "x": x, "f": f, "span": None, "v": None}
        text = encoder.value(None, row, "c", SOURCE, 1).decode()
        assert f'"after":{{"k":1,"d":2.5E-9,"f":{f_text},"span":null,"v":null,"x":{x_text}}}' in text
    row = {"k": 1, "d": None, "x": None, "f": None, "span": None, "v": None}
    assert '"d":null' in encoder.value(None, row, "c", SOURCE, 1).decode()


COMPOSITES = parse_schema("""
CREATE TYPE shop.address (street text, number int);
CREATE TABLE shop.homes (
    k int PRIMARY KEY, home frozen<address>, pair tuple<int, text>, grid list<frozen<list<int>>>,
    by_floor map<int, frozen<address>>, prices map<timestamp, frozen<list<decimal>>>,
    scans set<frozen<tuple<double, blob>>>, tags set<text>, ids map<int, text>);""").table("shop", "homes")
# Each composite column's text, as Cassandra's SELECT JSON writes the value (its toJson): numbers exact and as
# Java writes doubles, a timestamp key as its text, a blob as 0x-hex.
COMPOSITE_VALUES: dict[str, tuple[Any, str]] = {
    "home": (("Main", 4), '{"street": "Main", "number": 4}'),
    "pair": ((1, "one"), '[1, "one"]'),
    "grid": ([[1, 2], [3]], "[[1, 2], [3]]"),
    "by_floor": ({3: ("Fir", None)}, '{"3": {"street": "Fir", "number": null}}'),
    "prices": ({datetime.datetime(2024, 5, 6, 7, 8, 9, 123000): [decimal.Decimal("12.3400"),
                                                                 decimal.Decimal("-1E-8")]},
               '{"2024-05-06 07:08:09.123Z": [12.3400, -1E-8]}'),
    "scans": ({(1e300, b"\x00\xff")}, '[[1.0E300, "0x00ff"]]'),
}
JSON_TEXT_SCHEMA = {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1}


def test_composite_handling_mode_json_gives_the_cql_json_text() -> None:
    """User types, tuples and collections of those or of collections are io.debezium.data.Json texts, in
    Connect JSON and in Avro; the other columns stay as they are, and null stays null."""
    assert COMPOSITES is not None
    row = _driver_row(COMPOSITES, {"k": 1, "tags": ["a"], "ids": {2: "two"},
                                   **{name: value for name, (value, _) in COMPOSITE_VALUES.items()}})
    texts = {name: text for name, (_, text) in COMPOSITE_VALUES.items()}
    modes = TypeModes(composite="json")
    encoded = EventEncoder("prod", COMPOSITES, "json", modes=modes).value(None, row, "c", SOURCE, 1)
    document = json.loads(encoded)
    fields = {f["field"]: f for f in document["schema"]["fields"][1]["fields"]}
    assert {name: fields[name] for name in texts} == {name: JSON_TEXT_SCHEMA | {"field": name}
                                                      for name in texts}
    assert (fields["tags"]["type"], fields["ids"]["type"]) == ("array", "map")
    assert document["payload"]["after"] == {"k": 1, "tags": ["a"], "ids": [[2, "two"]], **texts}
    registry = FakeRegistry()
    encoder = EventEncoder("prod", COMPOSITES, "avro", registry, modes)  # type: ignore[arg-type]
    value = encoder.value(None, row, "c", SOURCE, 1)
    envelope = registry.subjects["prod.shop.homes-value"]
    avro_fields = {f["name"]: f["type"] for f in envelope["fields"][0]["type"][1]["fields"]}
    assert {name: avro_fields[name] for name in texts} == {name: ["null", {
        "type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Json"}] for name in texts}
    after = fastavro.schemaless_reader(io.BytesIO(value[5:]), envelope)["after"]
    assert after == {"k": 1, "tags": ["a"], "ids": [{"key": 2, "value": "two"}], **texts}
    sparse = json.loads(EventEncoder("prod", COMPOSITES, "json", modes=modes).value(None, {"k": 2}, "c",
                                                                                   SOURCE, 1))
    assert sparse["payload"]["after"]["home"] is None and sparse["payload"]["after"]["grid"] is None


def test_map_handling_mode_json_gives_every_map_as_its_cql_json_text() -> None:
    """map_handling_mode json (for Debezium's JDBC sink, whose hstore text breaks on a quote): every map
    column, whatever its keys and values, is an io.debezium.data.Json text with the map's CQL JSON, its
    keys as JSON strings; the other columns stay nested."""
    assert COMPOSITES is not None
    awkward = 'a "quote", a back\\slash, => {braces} \t'
    row = _driver_row(COMPOSITES, {"k": 1, "tags": ["a"], "ids": {-1: "", 2: awkward},
                                   **{name: value for name, (value, _) in COMPOSITE_VALUES.items()}})
    document = json.loads(EventEncoder("prod", COMPOSITES, "json", modes=TypeModes(map="json")).value(
        None, row, "c", SOURCE, 1))
    fields = {f["field"]: f for f in document["schema"]["fields"][1]["fields"]}
    maps = ("by_floor", "prices", "ids")
    assert {name: fields[name] for name in maps} == {name: JSON_TEXT_SCHEMA | {"field": name}
                                                     for name in maps}
    assert {fields[name]["type"] for name in ("home", "pair", "grid", "scans", "tags")} == {"struct", "array"}
    after = document["payload"]["after"]
    assert after["ids"] == '{"-1": "", "2": "a \\"quote\\", a back\\\\slash, => {braces} \\t"}'
    assert json.loads(after["ids"]) == {"-1": "", "2": awkward}
    assert (after["by_floor"], after["prices"]) == (COMPOSITE_VALUES["by_floor"][1],
                                                    COMPOSITE_VALUES["prices"][1])

