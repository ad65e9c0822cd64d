"""How CQL values appear in change events: Kafka Connect schemas (JSON converter) and Avro.

One table, documented in ``docs/events.md``, decides every mapping: no loss (``varint`` and ``decimal``
as strings, ``timestamp`` in milliseconds as Cassandra keeps it, ``time`` in nanoseconds), uuids as
strings, collections as arrays and maps, tuples and UDTs as structs/records, or (composite handling mode
``json``) these and collections of collections as JSON text, which a JDBC sink can store.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import math
import re
import secrets
from dataclasses import dataclass
from functools import cache, cached_property, partial
from typing import Any, Callable, Literal, NamedTuple

from ..schema.types import CqlType, java_double_text, json_text, shortest_float32

_EPOCH = datetime.datetime(1970, 1, 1)

DecimalMode = Literal["precise", "double", "string"]
VarintMode = Literal["precise", "long", "string"]
IntervalMode = Literal["string", "numeric"]
CompositeMode = Literal["nested", "json"]
MapMode = Literal["map", "json"]


@dataclass(frozen=True)
class TypeModes:
    """Debezium's handling modes for the types that have no exact Connect type: ``decimal`` (precise: an
    ``io.debezium.data.VariableScaleDecimal``), ``varint`` (precise: a Connect ``Decimal`` of scale 0) and
    ``duration`` (string: an ``io.debezium.time.Interval``; numeric: an ``io.debezium.time.NanoDuration``);
    and ours for the composite types (user types, tuples, collections of those or of collections), which no
    JDBC sink has a column for: nested (structs, arrays, maps) or json (an ``io.debezium.data.Json`` text,
    as Debezium's PostgreSQL connector gives a json column, which Debezium's JDBC sink writes into one); and
    for maps, which the JDBC sink writes into an ``hstore`` whose text it does not escape: map (a Connect map)
    or json (likewise)."""

    decimal: DecimalMode = "precise"
    varint: VarintMode = "precise"
    interval: IntervalMode = "string"
    composite: CompositeMode = "nested"
    map: MapMode = "map"


class _Simple(NamedTuple):
    connect: dict[str, Any]  # the required Connect schema
    to_json: Callable[[Any], Any] | None  # a value (not None) as the JsonConverter writes it; None: itself
    to_avro: Callable[[Any], Any] | None  # as Avro holds it


def _timestamp_millis(value: datetime.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


# Marks a number the JSON encoder cannot write as Java does (``1.0E-8``, not ``1e-08``): the encoder writes
# it as a string, and ``java_numbers`` takes the quotes and the mark away. The mark starts with a NUL and a
# random nonce, so no text of a row can be taken for it.
JAVA_NUMBER_MARK = "\x00" + secrets.token_hex(8)
_JAVA_NUMBER = re.compile(rb'"\\u0000' + JAVA_NUMBER_MARK[1:].encode() + rb'([-0-9.E]+)"')


def java_numbers(encoded: bytes) -> bytes:
    """JSON text with the marked numbers (``_json_number``) written as numbers."""
    return _JAVA_NUMBER.sub(rb"\1", encoded) if b"\\u0000" in encoded else encoded


def _json_number(value: float) -> float | str | None:
    """A double (or float) as the JsonConverter writes it (Java's ``Double.toString``: ``1.0E-8``, ``1.0E7``);
    NaN and the infinities null: JSON has no such numbers, and the JsonConverter reads the text it writes for
    them (``"NaN"``) as 0.0 and refuses bare tokens, so that any other form would reach a sink as a wrong
    number. Avro holds them exactly."""
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return value  # where Python's repr and Java's agree
    if math.isfinite(value):
        return JAVA_NUMBER_MARK + java_double_text(value)
    return None


def _two_complement(number: int) -> bytes:
    """Big-endian two's complement in the fewest bytes, as Java's ``BigInteger.toByteArray``."""
    return number.to_bytes(number.bit_length() // 8 + 1, "big", signed=True)


def _unscaled_and_scale(value: decimal.Decimal) -> tuple[int, int]:
    sign, digits, exponent = value.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0")
    return (-unscaled if sign else unscaled), -int(exponent)


def _variable_scale(value: decimal.Decimal) -> dict[str, Any]:
    unscaled, scale = _unscaled_and_scale(value)
    return {"scale": scale, "value": _two_complement(unscaled)}


def plain_decimal(value: decimal.Decimal) -> str:
    """A decimal's digits without an exponent, its scale kept (Java's ``BigDecimal.toPlainString``):
    ``1E-8`` is ``0.00000001``, ``1E+3`` is ``1000``."""
    return format(value, "f")


def iso_interval(value: Any) -> str:
    """A duration as Debezium's ``io.debezium.time.Interval`` writes one: every unit, ``P1Y2M3DT4H5M6.5S``
    (Java's truncating division and remainder, so each unit has the duration's sign)."""
    months, nanoseconds = value.months, value.nanoseconds
    years, months = int(months / 12), months - 12 * int(months / 12)
    hours = int(nanoseconds / 3_600_000_000_000)
    nanoseconds -= hours * 3_600_000_000_000
    minutes = int(nanoseconds / 60_000_000_000)
    nanoseconds -= minutes * 60_000_000_000
    seconds = plain_decimal((decimal.Decimal(nanoseconds) / 1_000_000_000).normalize())
    return f"P{years}Y{months}M{value.days}DT{hours}H{minutes}M{seconds}S"


def nano_duration(value: Any) -> int:
    """A duration in nanoseconds as Debezium's ``NanoDuration`` (and its Cassandra connector) counts it: a
    month is 30 days."""
    return ((value.months * 30 + value.days) * 86_400) * 1_000_000_000 + value.nanoseconds


def _uuid_text(value: Any) -> str:
    return str(value)


def _simple(kind: str, modes: TypeModes) -> _Simple | None:
    """The mapping of a CQL type without parameters, or None for the others."""
    if kind in ("ascii", "text", "varchar"):
        return _Simple(connect_schema("string"), None, None)
    if kind in _PLAIN:
        return _Simple(connect_schema(_PLAIN[kind]), None, None)
    if kind == "float":
        return _Simple(connect_schema("float"), lambda v: _json_number(shortest_float32(v)), shortest_float32)
    if kind == "double":
        return _Simple(connect_schema("double"), _json_number, None)
    if kind in ("blob", "empty"):
        return _Simple(connect_schema("bytes"), lambda v: base64.b64encode(bytes(v)).decode(), bytes)
    if kind in ("uuid", "timeuuid"):
        return _Simple(connect_schema("string", name="io.debezium.data.Uuid", version=1), _uuid_text,
                       _uuid_text)
    if kind == "inet":
        return _Simple(connect_schema("string"), str, str)
    if kind == "date":
        return _Simple(connect_schema("int32", name="org.apache.kafka.connect.data.Date", version=1),
                       _days_from_epoch, _days_from_epoch)
    if kind == "time":
        return _Simple(connect_schema("int64", name="io.debezium.time.NanoTime", version=1), _nanosecond_time,
                       _nanosecond_time)
    if kind == "timestamp":
        return _Simple(connect_schema("int64", name="org.apache.kafka.connect.data.Timestamp", version=1),
                       _timestamp_millis, _timestamp_millis)
    if kind == "decimal":
        if modes.decimal == "precise":
            return _Simple(VARIABLE_SCALE_DECIMAL, lambda v: _base64_value(_variable_scale(v)),
                           _variable_scale)
        if modes.decimal == "double":
            return _Simple(connect_schema("double"), lambda v: _json_number(float(v)), float)
        return _Simple(connect_schema("string"), plain_decimal, plain_decimal)
    if kind == "varint":
        if modes.varint == "precise":
            return _Simple(connect_schema("bytes", name="org.apache.kafka.connect.data.Decimal", version=1,
                                          parameters={"scale": "0"}),
                           lambda v: base64.b64encode(_two_complement(v)).decode(), _two_complement)
        if modes.varint == "long":
            return _Simple(connect_schema("int64"), _as_long, _as_long)
        return _Simple(connect_schema("string"), str, str)
    if kind == "duration":
        if modes.interval == "string":
            return _Simple(connect_schema("string", name="io.debezium.time.Interval", version=1),
                           iso_interval, iso_interval)
        return _Simple(connect_schema("int64", name="io.debezium.time.NanoDuration", version=1),
                       nano_duration, nano_duration)
    return None


_PLAIN = {"boolean": "boolean", "tinyint": "int8", "smallint": "int16", "int": "int32", "bigint": "int64",
          "counter": "int64"}


def _days_from_epoch(value: Any) -> int:
    return value.days_from_epoch


def _nanosecond_time(value: Any) -> int:
    return value.nanosecond_time


def _as_long(value: int) -> int:
    """A varint as Debezium's ``long`` mode gives it: its low 64 bits (Java's ``BigInteger.longValue``)."""
    return (value + 2**63) % 2**64 - 2**63


def _base64_value(struct: dict[str, Any]) -> dict[str, Any]:
    return struct | {"value": base64.b64encode(struct["value"]).decode()}


_CONNECT_TO_AVRO = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float": "float",
                    "double": "double", "boolean": "boolean", "string": "string", "bytes": "bytes"}


def connect_schema(type_: str, *, optional: bool = False, name: str | None = None, version: int | None = None,
                   doc: str | None = None, parameters: dict[str, str] | None = None, default: Any = None,
                   field: str | None = None, **children: Any) -> dict[str, Any]:
    """A Kafka Connect schema as the JsonConverter writes it: its keys in the converter's order (``type``, the
    ``fields``/``items``/``keys``/``values``, ``optional``, ``name``, ``version``, ``doc``, ``parameters``,
    ``default``, and ``field`` when it is a struct's field)."""
    schema: dict[str, Any] = {"type": type_, **children, "optional": optional}
    for key, value in (("name", name), ("version", version), ("doc", doc), ("parameters", parameters),
                       ("default", default), ("field", field)):
        if value is not None:
            schema[key] = value
    return schema


def avro_from_connect(schema: dict[str, Any]) -> Any:
    """The Avro schema of a Connect schema (primitives, arrays and structs) as Confluent's AvroConverter
    writes it (``AvroData.fromConnectSchema``): ``connect.doc``, ``connect.version``, ``connect.parameters``,
    ``connect.default``, ``connect.name`` properties, Avro's logical type for Connect's, a struct a record
    named by its Connect name, an optional schema a union with null (null second when it has a default)."""
    type_ = schema["type"]
    name = schema.get("name")
    if type_ == "struct":
        namespace, _, record_name = name.rpartition(".")
        base: dict[str, Any] = {"type": "record", "name": record_name, "namespace": namespace,
                                "fields": [avro_field(field) for field in schema["fields"]]}
    elif type_ == "array":
        base = {"type": "array", "items": avro_from_connect(schema["items"])}
    else:
        base = {"type": _CONNECT_TO_AVRO[type_]}
    if name == "org.apache.kafka.connect.data.Decimal":
        base |= {"scale": int(schema["parameters"]["scale"]), "precision": _AVRO_DECIMAL_PRECISION}
    for connect_key, avro_key in (("doc", "connect.doc"), ("version", "connect.version"),
                                  ("parameters", "connect.parameters"), ("default", "connect.default"),
                                  ("name", "connect.name")):
        if connect_key in schema:
            base[avro_key] = schema[connect_key]
    if type_ in ("int8", "int16"):
        base["connect.type"] = type_
    if name in _AVRO_LOGICAL_TYPES:
        base["logicalType"] = _AVRO_LOGICAL_TYPES[name]
    avro: Any = base if len(base) > 1 else base["type"]
    if not schema["optional"]:
        return avro
    return [avro, "null"] if "default" in schema else ["null", avro]


# What the AvroConverter gives Connect's logical types in Avro, and its precision of a Connect Decimal.
_AVRO_LOGICAL_TYPES = {"org.apache.kafka.connect.data.Decimal": "decimal",
                       "org.apache.kafka.connect.data.Date": "date",
                       "org.apache.kafka.connect.data.Time": "time-millis",
                       "org.apache.kafka.connect.data.Timestamp": "timestamp-millis"}
_AVRO_DECIMAL_PRECISION = 64


def avro_field(schema: dict[str, Any]) -> dict[str, Any]:
    """The Avro field of a Connect struct's field: its default the Connect default, else null if optional."""
    field = {"name": schema["field"], "type": avro_from_connect(schema)}
    if "default" in schema:
        field["default"] = schema["default"]
    elif schema["optional"]:
        field["default"] = None
    return field


VARIABLE_SCALE_DECIMAL = connect_schema("struct", fields=[connect_schema("int32", field="scale"),
                                                        connect_schema("bytes", field="value")],
                                        name="io.debezium.data.VariableScaleDecimal", version=1,
                                        doc="Variable scaled decimal")


_NESTING = ("list", "set", "map", "vector", "tuple", "udt")


def _composite(t: CqlType) -> bool:
    """Whether the type is one that composite handling mode ``json`` makes a JSON text: a user type, a tuple,
    or a collection holding one of those or a collection."""
    return t.kind in ("tuple", "udt") or (t.kind in _NESTING
                                          and any(p.kind in _NESTING for p in t.parameters))


_JSON_TEXT = connect_schema("string", name="io.debezium.data.Json", version=1)


def _cql_json(t: CqlType, value: Any) -> str:
    """A value as the text of CQL's ``toJson`` (what ``SELECT JSON`` shows of it): a user type an object by
    field name, a tuple an array, a map an object whose keys are text (a key of another type as its JSON
    text), numbers exact, NaN and the infinities null."""
    return json_text(t.to_json(value))


@dataclass(frozen=True)
class FieldMapping:
    """The event representation of one CQL type."""

    cql_type: CqlType
    modes: TypeModes = TypeModes()

    @cached_property
    def _simple(self) -> _Simple | None:
        """The mapping of a type that is one value in the event, or None for a nested one."""
        t = self.cql_type
        if self.modes.composite == "json" and _composite(t) or self.modes.map == "json" and t.kind == "map":
            text = partial(_cql_json, t)
            return _Simple(_JSON_TEXT, text, text)
        return _simple(t.kind, self.modes)

    def _of(self, parameter: CqlType) -> FieldMapping:
        return FieldMapping(parameter, self.modes)

    # --- Kafka Connect --------------------------------------------------------------------------

    def connect_schema(self, optional: bool = True, field: str | None = None) -> dict[str, Any]:
        t = self.cql_type
        kind = t.kind
        extra = {"field": field} if field is not None else {}
        if self._simple is not None:
            return self._simple.connect | {"optional": optional} | extra
        if kind in ("list", "set", "vector"):
            return connect_schema("array", items=self._of(t.parameters[0]).connect_schema(optional=False),
                                  optional=optional, field=field)
        if kind == "map":
            return connect_schema("map", keys=self._of(t.parameters[0]).connect_schema(optional=False),
                                  values=self._of(t.parameters[1]).connect_schema(), optional=optional,
                                  field=field)
        if kind in ("tuple", "udt"):
            fields = [self._of(p).connect_schema(field=n) for n, p in zip(_field_names(t), t.parameters)]
            return connect_schema("struct", fields=fields, optional=optional, name=_struct_name(t),
                                  field=field)
        raise ValueError(f"no event mapping for CQL type {t.cql}")

    def to_connect(self, value: Any) -> Any:
        """The value as the JSON converter writes it (bytes as base64 text)."""
        return _convert(self, value, for_json=True)

    @cached_property
    def connect_converter(self) -> Callable[[Any], Any] | None:
        """``to_connect`` of a value that is not None, its dispatch done once: None when that is the value
        itself (integers, text, booleans), which is most columns of most events."""
        if self._simple is not None:
            return self._simple.to_json
        return self.to_connect

    # --- Avro -----------------------------------------------------------------------------------

    def avro_schema(self, namespace: str, defined: dict[str, str] | None = None) -> Any:
        """The Avro schema of the type, its records in ``namespace`` except Debezium's (in theirs).

        Avro allows one definition of a name per schema: ``defined`` holds those of the schema being built
        (full name -> definition), and a record defined there already is given by its full name. Without
        it, every record is defined in place.
        """
        t = self.cql_type
        kind = t.kind
        if self._simple is not None:
            avro = avro_from_connect(self._simple.connect)
            if not isinstance(avro, dict) or avro["type"] != "record":
                return avro
            return _avro_record(avro["name"], avro["namespace"], defined, lambda records: avro["fields"],
                                {k: v for k, v in avro.items() if k.startswith("connect.")})
        if kind in ("list", "set", "vector"):
            return {"type": "array", "items": self._of(t.parameters[0]).avro_schema(namespace, defined)}
        if kind == "map":
            key, value = (self._of(p) for p in t.parameters)
            if t.parameters[0].kind in ("text", "varchar", "ascii"):
                return {"type": "map", "values": ["null", value.avro_schema(namespace, defined)]}
            # Avro maps have string keys only: other keys become an array of entries.
            return {"type": "array", "items": _avro_record(
                _avro_name(f"{t.cql}_entry"), namespace, defined,
                lambda records: [{"name": "key", "type": key.avro_schema(namespace, records)},
                                 {"name": "value", "type": ["null", value.avro_schema(namespace, records)]}])}
        if kind in ("tuple", "udt"):
            fields = list(zip(avro_names(_field_names(t)), (self._of(p) for p in t.parameters)))
            return _avro_record(_avro_name(_struct_name(t)), namespace, defined, lambda records: [
                {"name": n, "type": ["null", m.avro_schema(namespace, records)], "default": None}
                for n, m in fields])
        raise ValueError(f"no event mapping for CQL type {t.cql}")

    def to_avro(self, value: Any) -> Any:
        return _convert(self, value, for_json=False)


def _field_names(t: CqlType) -> tuple[str, ...]:
    if t.kind == "udt":
        return t.field_names
    return tuple(f"field{i + 1}" for i in range(len(t.parameters)))


def _struct_name(t: CqlType) -> str:
    if t.kind == "udt":
        return f"{t.udt_keyspace}.{t.udt_name}"
    return "tuple_" + "_".join(p.kind for p in t.parameters)


def _avro_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if name and not name[0].isdigit() else "_" + name


_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@cache  # a record's field names, asked for each of its values
def avro_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """Distinct Avro names for the fields of a record (CQL quoted names can have any character).

    A valid name stays as it is; another becomes a valid one, with a suffix if that is taken. So the
    valid names of a table never change, whatever names are added next to them.
    """
    used = {name for name in names if _AVRO_NAME.fullmatch(name)}
    result = []
    for name in names:
        if not _AVRO_NAME.fullmatch(name):
            base = name = _avro_name(name)
            suffix = 1
            while name in used:
                suffix += 1
                name = f"{base}_{suffix}"
            used.add(name)
        result.append(name)
    return tuple(result)


def _avro_record(name: str, namespace: str, defined: dict[str, str] | None,
                 fields: Callable[[dict[str, str] | None], list[dict[str, Any]]],
                 properties: dict[str, Any] | None = None) -> Any:
    """A record, or its full name when ``defined`` (see ``FieldMapping.avro_schema``) has it already.

    ``fields`` gives the record's fields, defining the records they use in the dict it is passed;
    ``properties`` are the record's other properties (``connect.*``).
    """
    record = {"type": "record", "name": name, "namespace": namespace, "fields": fields(None),
              **(properties or {})}
    if defined is None:
        return record
    definition = json.dumps(record, sort_keys=True)
    if defined.get(f"{namespace}.{name}", definition) != definition:
        # Another record has the name: tuples are named by the kinds of their elements only (one name for
        # tuple<frozen<list<int>>> and tuple<frozen<list<text>>>), and names lose their invalid characters.
        name = f"{name}_{hashlib.sha256(definition.encode()).hexdigest()[:8]}"
    full_name = f"{namespace}.{name}"
    if full_name in defined:
        return full_name
    defined[full_name] = definition
    return record | {"name": name, "fields": fields(defined)}


def _convert(mapping: FieldMapping, value: Any, for_json: bool) -> Any:
    if value is None:
        return None
    simple = mapping._simple
    if simple is not None:
        convert = simple.to_json if for_json else simple.to_avro
        return value if convert is None else convert(value)
    t = mapping.cql_type
    kind = t.kind
    if kind in ("list", "set", "vector"):
        element = mapping._of(t.parameters[0])
        return [_convert(element, v, for_json) for v in value]
    if kind == "map":
        key_mapping, value_mapping = (mapping._of(p) for p in t.parameters)
        entries = [(_convert(key_mapping, k, for_json), _convert(value_mapping, v, for_json))
                   for k, v in value.items()]
        string_keys = t.parameters[0].kind in ("text", "varchar", "ascii")
        if string_keys:
            return dict(entries)
        if for_json:
            return [[k, v] for k, v in entries]  # the JSON converter's form for non-string keys
        return [{"key": k, "value": v} for k, v in entries]
    if kind in ("tuple", "udt"):
        names = _field_names(t)
        # The driver's UDT values are (named) tuples in field order, their attribute names not the CQL names
        # when those are not Python identifiers.
        values = [value.get(n) for n in names] if isinstance(value, dict) else list(value)
        return {n: _convert(mapping._of(p), v, for_json)
                for n, p, v in zip(names if for_json else avro_names(names), t.parameters, values)}
    raise ValueError(f"no event mapping for CQL type {t.cql}")
