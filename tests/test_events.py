"""Event encodings: Kafka Connect JSON as the JsonConverter writes it, and Avro (container or registry)."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import struct
import uuid
from typing import Any

import fastavro
import pytest

from cassandra.util import Date, Duration, Time
from cassandra_cdc.pipeline.events import EventEncoder, Source
from cassandra_cdc.schema import parse_schema

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
    assert after["big"] == "1000000000000000000000000000000"  # varint as text: no loss
    assert after["price"] == "12.3400"  # decimal keeps its scale
    assert after["at"] == 1714979289123  # milliseconds since the epoch
    assert after["day"] == 19000 and after["tod"] == 3_723_000_000_001
    assert after["span"] == {"months": 1, "days": 2, "nanoseconds": 3}
    assert base64.b64decode(after["raw"]) == b"\x00\xff"
    assert after["counts"] == {"x": 1} and after["ids"] == [[2, "two"]]  # non-text map keys: pairs
    assert after["home"] == {"street": "Main", "number": 4} and after["pair"] == {"field1": 1, "field2": "one"}
    assert payload["source"] == {"version": "1", "connector": "cassandra", "name": "prod", "cluster": "prod-cluster",
                                 "keyspace": "shop", "table": "everything", "ts_us": 1714979289123456,
                                 "snapshot": "false", "node": "node2", "segment": 1700000000000, "position": 4242}
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


def test_connect_json_bytes_are_those_of_one_compact_document() -> None:
    # Event keys are compared as bytes (partitioning, compaction): the encoding must stay exactly this.
    encoder = EventEncoder("prod", TABLE, "json")
    for encoded in (encoder.key(ROW), encoder.value(None, ROW, "c", SOURCE, 1), encoder.value(ROW, None, "d", SOURCE, 2)):
        document = json.loads(encoded)
        assert list(document) == ["schema", "payload"]
        assert encoded == json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def test_avro_container_is_self_describing() -> None:
    encoder = EventEncoder("prod", TABLE, "avro")
    before = dict(ROW, name="coffee")
    record = next(fastavro.reader(io.BytesIO(encoder.value(before, ROW, "u", SOURCE, 1))))
    assert record["op"] == "u" and record["before"]["name"] == "coffee" and record["after"]["name"] == "tea"
    assert record["after"]["big"] == "1000000000000000000000000000000"
    assert record["after"]["ids"] == [{"key": 2, "value": "two"}] and record["after"]["counts"] == {"x": 1}
    assert record["after"]["id"] == ROW["id"]
    assert record["after"]["at"] == datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=datetime.timezone.utc)
    assert record["source"]["node"] == "node2"
    key = next(fastavro.reader(io.BytesIO(encoder.key(ROW))))
    assert key == {"id": ROW["id"], "seq": 7}


class FakeRegistry:
    """Stands in for the schema registry's HTTP API: hands out ids per subject."""

    def __init__(self) -> None:
        self.subjects: dict[str, Any] = {}

    def register(self, subject: str, schema: Any) -> int:
        self.subjects.setdefault(subject, schema)
        return list(self.subjects).index(subject) + 1


def test_avro_with_a_registry_uses_the_confluent_wire_format() -> None:
    registry = FakeRegistry()
    encoder = EventEncoder("prod", TABLE, "avro", registry)  # type: ignore[arg-type]
    value = encoder.value(ROW, None, "d", SOURCE, 1)
    magic, schema_id = struct.unpack(">bI", value[:5])
    assert magic == 0 and schema_id == 1 and list(registry.subjects) == ["prod.shop.everything-value"]
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), registry.subjects["prod.shop.everything-value"])
    assert record["op"] == "d" and record["after"] is None and record["before"]["seq"] == 7


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_null_columns_stay_null(fmt: str) -> None:
    encoder = EventEncoder("prod", TABLE, fmt)  # type: ignore[arg-type]
    sparse = {"id": ROW["id"], "seq": 1}
    value = encoder.value(None, sparse, "c", SOURCE, 1)
    after = (json.loads(value)["payload"] if fmt == "json" else next(fastavro.reader(io.BytesIO(value))))["after"]
    assert after["seq"] == 1 and after["name"] is None and after["tags"] is None
