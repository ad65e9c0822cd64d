"""The events and schema changes as Kafka Connect's own JsonConverter (4.3, schemas enabled) reads them:
accepted, and written back byte for byte, so that ``json`` records are exactly what the converter itself
would write."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

from conftest import require_jvm_artifacts
import decimal

from cassandra.util import Duration
from test_events import (COMPOSITE_VALUES, COMPOSITES, NAMED, NAMED_VALUES, NUMBERS, ROW, SOURCE,
                         STATIC_SCHEMA, TABLE, _driver_row, _static_only_row)
from test_schema_changes import ORDERS, RECORD, offline_config

from cassandra_cdc.events.event_encoder import EventEncoder
from cassandra_cdc.events.field_mapping import TypeModes
from cassandra_cdc.pipeline.schema_changes import SchemaChangeEncoder

ROUND_TRIP_PROGRAM = Path(__file__).parent / "jvm" / "JsonConverterRoundTrip.java"


def json_converter_round_trip(messages: list[bytes]) -> list[bytes | str]:
    """Each message read by the JsonConverter and written back by it (bytes), or its error (text)."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster.artifacts import CONNECT, classpath, java_executable

    lines = "".join(base64.b64encode(message).decode() + "\n" for message in messages)
    done = subprocess.run([java_executable(), "-cp", classpath(CONNECT), str(ROUND_TRIP_PROGRAM)],
                          input=lines,
                          capture_output=True, text=True, timeout=300, check=True)
    return [line if line.startswith("ERROR") else base64.b64decode(line) for line in done.stdout.splitlines()]


def test_the_json_converter_writes_our_events_and_schema_changes_back_unchanged() -> None:
    everything = EventEncoder("prod", TABLE, "json")
    expiry = SOURCE._replace(node=None, segment=None, position=None)
    messages = [everything.key(ROW), everything.value(None, ROW, "c", SOURCE, 1714979290000),
                everything.value(ROW, dict(ROW, name="coffee"), "u", SOURCE, 1714979290001),
                everything.value(ROW, None, "d", expiry, 1714979290002),
                everything.value(None, ROW, "r", SOURCE._replace(snapshot=True), 1714979290003),
                everything.value(None, {"id": ROW["id"], "seq": 1}, "c", SOURCE, 1714979290004),
                everything.no_key(), everything.value(None, None, "t", SOURCE, 1714979290007)]  # a truncation
    assert NAMED is not None
    named_row = _driver_row(NAMED, NAMED_VALUES)
    named = EventEncoder("prod", NAMED, "json")
    messages += [named.key(named_row), named.value(None, named_row, "c", SOURCE, 1714979290005)]
    carts = STATIC_SCHEMA.table("shop", "carts")
    assert carts is not None
    static_only = _static_only_row(carts, {"user": 1}, {"owner": "ann"})
    static = EventEncoder("prod", carts, "json")
    messages += [static.key(static_only), static.value(None, static_only, "c", SOURCE, 1714979290006)]
    assert NUMBERS is not None
    numbers = {"k": 1, "d": decimal.Decimal("-1E-8"), "v": -(10**20), "span": Duration(14, 3,
                                                                                       3_723_500_000_000),
               "x": 1.5e300, "f": 1e-8}
    for modes in (TypeModes(), TypeModes("double", "long", "numeric"), TypeModes("string", "string",
                                                                                 "string")):
        messages.append(EventEncoder("prod", NUMBERS, "json", modes=modes).value(None, numbers, "c", SOURCE,
                                                                                 1))
    assert COMPOSITES is not None
    composites = _driver_row(COMPOSITES, {"k": 1, "tags": ["a"], "ids": {2: "two"},
                                          **{name: value for name, (value, _) in COMPOSITE_VALUES.items()}})
    messages.append(EventEncoder("prod", COMPOSITES, "json", modes=TypeModes(composite="json")).value(
        None, composites, "c", SOURCE, 1))
    schema_changes = SchemaChangeEncoder(offline_config())
    messages += [schema_changes.key("shop"), schema_changes.value(RECORD, ORDERS, "CREATE", 1714979290008),
                 schema_changes.value(RECORD, ORDERS, "ALTER", 1714979290009)]
    written = json_converter_round_trip(messages)
    assert len(written) == len(messages)
    for message, back in zip(messages, written):
        assert back == message, back


def test_non_finite_numbers_reach_the_json_converter_as_null_where_their_text_would_be_zero() -> None:
    """NaN and the infinities are null in Connect JSON: read back unchanged. The JsonConverter writes them as
    text ("NaN", "Infinity") but reads that text in a float64 field as 0.0 (and refuses bare tokens), so
    that any form JSON has for them would reach a sink as a wrong number."""
    assert NUMBERS is not None
    encoder = EventEncoder("prod", NUMBERS, "json")
    events = [encoder.value(None, {"k": 1, "x": value, "f": value}, "c", SOURCE, 1)
              for value in (float("nan"), float("inf"), float("-inf"))]
    as_text = [event.replace(b'"x":null', b'"x":"' + text + b'"')
               for event, text in zip(events, (b"NaN", b"Infinity", b"-Infinity"))]
    bare = events[0].replace(b'"x":null', b'"x":NaN')
    written = json_converter_round_trip(events + as_text + [bare])
    assert written[:3] == events
    assert [json.loads(back)["payload"]["after"]["x"] for back in written[3:6]] == [0.0, 0.0, 0.0]
    assert str(written[6]).startswith("ERROR org.apache.kafka.connect.errors.DataException")
