"""How CQL values appear in change events: Kafka Connect schemas (JSON converter) and Avro.

One table, documented in ``docs/events.md``, decides every mapping: no loss (``varint`` and ``decimal``
as strings, ``timestamp`` in milliseconds as Cassandra keeps it, ``time`` in nanoseconds), uuids as
strings, collections as arrays and maps, tuples and UDTs as structs/records.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import re
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, Callable

from ..schema.types import CqlType, shortest_float32

_EPOCH = datetime.datetime(1970, 1, 1)

# CQL kind -> (Connect type, Connect logical name or None, Avro schema)
_SIMPLE: dict[str, tuple[str, str | None, Any]] = {
    "ascii": ("string", None, "string"),
    "text": ("string", None, "string"),
    "varchar": ("string", None, "string"),
    "boolean": ("boolean", None, "boolean"),
    "tinyint": ("int8", None, "int"),
    "smallint": ("int16", None, "int"),
    "int": ("int32", None, "int"),
    "bigint": ("int64", None, "long"),
    "counter": ("int64", None, "long"),
    "float": ("float", None, "float"),
    "double": ("double", None, "double"),
    "varint": ("string", "cassandra_cdc.Varint", "string"),
    "decimal": ("string", "cassandra_cdc.Decimal", "string"),
    "blob": ("bytes", None, "bytes"),
    "empty": ("bytes", None, "bytes"),
    "uuid": ("string", "io.debezium.data.Uuid", {"type": "string", "logicalType": "uuid"}),
    "timeuuid": ("string", "io.debezium.data.Uuid", {"type": "string", "logicalType": "uuid"}),
    "inet": ("string", "cassandra_cdc.Inet", "string"),
    "date": ("int32", "org.apache.kafka.connect.data.Date", {"type": "int", "logicalType": "date"}),
    "time": ("int64", "io.debezium.time.NanoTime", "long"),
    "timestamp": ("int64", "org.apache.kafka.connect.data.Timestamp",
                  {"type": "long", "logicalType": "timestamp-millis"}),
}


def _timestamp_millis(value: datetime.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


_SIMPLE_VALUES: dict[str, Callable[[Any], Any]] = {
    "varint": str,
    "decimal": str,
    "uuid": str,
    "timeuuid": str,
    "inet": str,
    "date": lambda v: v.days_from_epoch,
    "time": lambda v: v.nanosecond_time,
    "timestamp": _timestamp_millis,
    "blob": bytes,
    "float": shortest_float32,
}


_CONNECT_TO_AVRO = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float": "float",
                    "double": "double", "boolean": "boolean", "string": "string", "bytes": "bytes"}


def connect_schema(type_: str, *, optional: bool = False, name: str | None = None, version: int | None = None,
                   parameters: dict[str, str] | None = None, default: Any = None, field: str | None = None,
                   **children: Any) -> dict[str, Any]:
    """A Kafka Connect schema as the JsonConverter writes it: its keys in the converter's order (``type``, the
    ``fields``/``items``/``keys``/``values``, ``optional``, ``name``, ``version``, ``parameters``,
    ``default``, and ``field`` when it is a struct's field)."""
    schema: dict[str, Any] = {"type": type_, **children, "optional": optional}
    for key, value in (("name", name), ("version", version), ("parameters", parameters), ("default", default),
                       ("field", field)):
        if value is not None:
            schema[key] = value
    return schema


def avro_from_connect(schema: dict[str, Any]) -> Any:
    """The Avro schema of a Connect schema (primitives and structs) as Confluent's AvroConverter writes it:
    ``connect.version``, ``connect.parameters``, ``connect.default``, ``connect.name`` properties, a struct a
    record named by its Connect name, an optional schema a union with null (null second when it has a
    default)."""
    type_ = schema["type"]
    if type_ == "struct":
        namespace, _, name = schema["name"].rpartition(".")
        base: dict[str, Any] = {"type": "record", "name": name, "namespace": namespace,
                                "fields": [avro_field(field) for field in schema["fields"]]}
    else:
        base = {"type": _CONNECT_TO_AVRO[type_]}
    for connect_key, avro_key in (("version", "connect.version"), ("parameters", "connect.parameters"),
                                  ("default", "connect.default"), ("name", "connect.name")):
        if connect_key in schema:
            base[avro_key] = schema[connect_key]
    if type_ in ("int8", "int16"):
        base["connect.type"] = type_
    avro: Any = base if len(base) > 1 else base["type"]
    if not schema["optional"]:
        return avro
    return [avro, "null"] if "default" in schema else ["null", avro]


def avro_field(schema: dict[str, Any]) -> dict[str, Any]:
    """The Avro field of a Connect struct's field: its default the Connect default, else null if optional."""
    field = {"name": schema["field"], "type": avro_from_connect(schema)}
    if "default" in schema:
        field["default"] = schema["default"]
    elif schema["optional"]:
        field["default"] = None
    return field


@dataclass(frozen=True)
class FieldMapping:
    """The event representation of one CQL type."""

    cql_type: CqlType

    # --- Kafka Connect --------------------------------------------------------------------------

    def connect_schema(self, optional: bool = True, field: str | None = None) -> dict[str, Any]:
        t = self.cql_type
        kind = t.kind
        if kind in _SIMPLE:
            connect_type, name, _ = _SIMPLE[kind]
            return connect_schema(connect_type, optional=optional, name=name, field=field)
        if kind in ("list", "set", "vector"):
            return connect_schema("array", items=FieldMapping(t.parameters[0]).connect_schema(optional=False),
                                  optional=optional, field=field)
        if kind == "map":
            return connect_schema("map", keys=FieldMapping(t.parameters[0]).connect_schema(optional=False),
                                  values=FieldMapping(t.parameters[1]).connect_schema(), optional=optional,
                                  field=field)
        if kind in ("tuple", "udt"):
            fields = [FieldMapping(p).connect_schema(field=n) for n, p in zip(_field_names(t), t.parameters)]
            return connect_schema("struct", fields=fields, optional=optional, name=_struct_name(t), field=field)
        if kind == "duration":
            return connect_schema("struct", fields=[connect_schema("int32", field="months"),
                                                    connect_schema("int32", field="days"),
                                                    connect_schema("int64", field="nanoseconds")],
                                  optional=optional, name="cassandra_cdc.Duration", field=field)
        raise ValueError(f"no event mapping for CQL type {t.cql}")

    def to_connect(self, value: Any) -> Any:
        """The value as the JSON converter writes it (bytes as base64 text)."""
        return _convert(self.cql_type, value, bytes_as_base64=True, map_as_object=True)

    @cached_property
    def connect_converter(self) -> Callable[[Any], Any] | None:
        """``to_connect`` of a value that is not None, its dispatch done once: None when that is the value
        itself (numbers, text, booleans), which is most columns of most events."""
        kind = self.cql_type.kind
        if kind == "blob":
            return lambda value: base64.b64encode(bytes(value)).decode()
        if kind in _SIMPLE and kind != "empty":
            return _SIMPLE_VALUES.get(kind)
        return self.to_connect

    # --- Avro -----------------------------------------------------------------------------------

    def avro_schema(self, namespace: str, defined: dict[str, str] | None = None) -> Any:
        """The Avro schema of the type, its records in ``namespace`` except ``cassandra_cdc.Duration``.

        Avro allows one definition of a name per schema: ``defined`` holds those of the schema being built
        (full name -> definition), and a record defined there already is given by its full name. Without
        it, every record is defined in place.
        """
        t = self.cql_type
        kind = t.kind
        if kind in _SIMPLE:
            return _SIMPLE[kind][2]
        if kind in ("list", "set", "vector"):
            return {"type": "array", "items": FieldMapping(t.parameters[0]).avro_schema(namespace, defined)}
        if kind == "map":
            key, value = (FieldMapping(p) for p in t.parameters)
            if t.parameters[0].kind in ("text", "varchar", "ascii"):
                return {"type": "map", "values": ["null", value.avro_schema(namespace, defined)]}
            # Avro maps have string keys only: other keys become an array of entries.
            return {"type": "array", "items": _avro_record(
                _avro_name(f"{t.cql}_entry"), namespace, defined,
                lambda records: [{"name": "key", "type": key.avro_schema(namespace, records)},
                                 {"name": "value", "type": ["null", value.avro_schema(namespace, records)]}])}
        if kind in ("tuple", "udt"):
            fields = list(zip(avro_names(_field_names(t)), (FieldMapping(p) for p in t.parameters)))
            return _avro_record(_avro_name(_struct_name(t)), namespace, defined, lambda records: [
                {"name": n, "type": ["null", m.avro_schema(namespace, records)], "default": None}
                for n, m in fields])
        if kind == "duration":
            return _avro_record("Duration", "cassandra_cdc", defined, lambda records: [
                {"name": "months", "type": "int"}, {"name": "days", "type": "int"},
                {"name": "nanoseconds", "type": "long"}])
        raise ValueError(f"no event mapping for CQL type {t.cql}")

    def to_avro(self, value: Any) -> Any:
        return _convert(self.cql_type, value, bytes_as_base64=False, map_as_object=False)


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
                 fields: Callable[[dict[str, str] | None], list[dict[str, Any]]]) -> Any:
    """A record, or its full name when ``defined`` (see ``FieldMapping.avro_schema``) has it already.

    ``fields`` gives the record's fields, defining the records they use in the dict it is passed.
    """
    record = {"type": "record", "name": name, "namespace": namespace, "fields": fields(None)}
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


def _convert(t: CqlType, value: Any, bytes_as_base64: bool, map_as_object: bool) -> Any:
    if value is None:
        return None
    kind = t.kind
    if kind in _SIMPLE:
        converted = _SIMPLE_VALUES.get(kind, lambda v: v)(value)
        if bytes_as_base64 and isinstance(converted, bytes):
            return base64.b64encode(converted).decode()
        return converted
    if kind in ("list", "set", "vector"):
        return [_convert(t.parameters[0], v, bytes_as_base64, map_as_object) for v in value]
    if kind == "map":
        key_type, value_type = t.parameters
        entries = [(_convert(key_type, k, bytes_as_base64, map_as_object),
                    _convert(value_type, v, bytes_as_base64, map_as_object)) for k, v in value.items()]
        string_keys = key_type.kind in ("text", "varchar", "ascii")
        if map_as_object and string_keys:
            return dict(entries)
        if map_as_object:
            return [[k, v] for k, v in entries]  # the JSON converter's form for non-string keys
        return dict(entries) if string_keys else [{"key": k, "value": v} for k, v in entries]
    if kind in ("tuple", "udt"):
        names = _field_names(t)
        # The driver's UDT values are (named) tuples in field order, their attribute names not the CQL names
        # when those are not Python identifiers.
        values = [value.get(n) for n in names] if isinstance(value, dict) else list(value)
        return {n: _convert(p, v, bytes_as_base64, map_as_object)
                for n, p, v in zip(names if map_as_object else avro_names(names), t.parameters, values)}
    if kind == "duration":
        return {"months": value.months, "days": value.days, "nanoseconds": value.nanoseconds}
    raise ValueError(f"no event mapping for CQL type {t.cql}")
