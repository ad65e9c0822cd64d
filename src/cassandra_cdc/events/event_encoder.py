"""Debezium change events: key and envelope (``before``, ``after``, ``source``, ``op``, ``ts_ms``, ``ts_us``,
``ts_ns``, ``transaction``), with Debezium's envelope and source conventions (``io.debezium.data.Envelope``,
``AbstractSourceInfoStructMaker``).

Two encodings: Kafka Connect JSON (``{"schema": …, "payload": …}``, as the JsonConverter writes it
with schemas enabled) and Avro in the Confluent wire format, its schemas registered with a schema registry
(the one form of Avro that Kafka's deserializers read). Reference: ``docs/events.md``.
"""

from __future__ import annotations

import io
import json
import struct
from importlib.metadata import version
from typing import Any, Callable, Literal, Mapping, NamedTuple

import fastavro
import orjson

from ..kafka import event_topic
from ..schema import ColumnKind, TableMetadata
from .column_rules import ColumnRules
from .field_mapping import (FieldMapping, TypeModes, avro_field, avro_from_connect, avro_names,
                            connect_schema, java_numbers)

_CONNECTOR_VERSION = version("cassandra-cdc")

CONNECTOR = "cassandra_cdc"
# Debezium's versions of the envelope and source schemas, whose layout these follow.
ENVELOPE_SCHEMA_VERSION = 2
SOURCE_SCHEMA_VERSION = 1
# Debezium names a connector's source schema io.debezium.connector.<connector>.Source.
SOURCE_SCHEMA_NAME = f"io.debezium.connector.{CONNECTOR}.Source"
# Debezium's SnapshotRecord values, in its order: the allowed values of the source's ``snapshot`` enum.
SNAPSHOT_VALUES = ("true", "first", "first_in_data_collection", "last_in_data_collection", "last", "false",
                   "incremental")

Format = Literal["json", "avro"]
Op = Literal["c", "u", "d", "r", "t"]  # t: a truncation (before and after null)
Converter = Callable[[Any], Any]


def _source_schema() -> dict[str, Any]:
    """The ``source`` struct: Debezium's common fields (``sourceInfoSchemaBuilder``), then ours."""
    snapshot = connect_schema("string", optional=True, name="io.debezium.data.Enum", version=1,
                              parameters={"allowed": ",".join(SNAPSHOT_VALUES)}, default="false")
    fields = [connect_schema("string", field="version"), connect_schema("string", field="connector"),
              connect_schema("string", field="name"), connect_schema("int64", field="ts_ms"),
              snapshot | {"field": "snapshot"}, connect_schema("string", field="db"),
              connect_schema("string", optional=True, field="sequence"),
              connect_schema("int64", optional=True, field="ts_us"),
              connect_schema("int64", optional=True, field="ts_ns"),
              connect_schema("string", field="cluster"), connect_schema("string", field="keyspace"),
              connect_schema("string", field="table"), connect_schema("string", optional=True, field="node"),
              connect_schema("int64", optional=True, field="segment"),
              connect_schema("int64", optional=True, field="position")]
    return connect_schema("struct", fields=fields, name=SOURCE_SCHEMA_NAME, version=SOURCE_SCHEMA_VERSION,
                          field="source")


def _envelope_tail_schemas() -> list[dict[str, Any]]:
    """The envelope's fields after ``source``, as Debezium's ``Envelope`` builder adds them."""
    transaction = connect_schema("struct", optional=True, name="event.block", version=1, field="transaction",
                                 fields=[connect_schema("string", field="id"),
                                         connect_schema("int64", field="total_order"),
                                         connect_schema("int64", field="data_collection_order")])
    return [connect_schema("string", field="op"), connect_schema("int64", optional=True, field="ts_ms"),
            connect_schema("int64", optional=True, field="ts_us"),
            connect_schema("int64", optional=True, field="ts_ns"), transaction]


SOURCE_SCHEMA = _source_schema()
ENVELOPE_TAIL_SCHEMAS = _envelope_tail_schemas()


class Source(NamedTuple):
    """Where a change came from: the node, segment and position of the raw record that caused it.

    A named tuple: the processor makes one per record, and a frozen dataclass costs several times more.
    """

    name: str
    cluster: str
    keyspace: str
    table: str
    ts_us: int
    snapshot: bool
    node: str | None
    segment: int | None
    position: int | None

    def as_dict(self) -> dict[str, Any]:
        """The ``source`` block: ``ts_ms``/``ts_us``/``ts_ns`` the write time, ``db`` the keyspace."""
        return {"version": _CONNECTOR_VERSION, "connector": CONNECTOR, "name": self.name,
                "ts_ms": self.ts_us // 1000, "snapshot": "true" if self.snapshot else "false",
                "db": self.keyspace, "sequence": None, "ts_us": self.ts_us, "ts_ns": self.ts_us * 1000,
                "cluster": self.cluster, "keyspace": self.keyspace, "table": self.table, "node": self.node,
                "segment": self.segment, "position": self.position}


class _Column(NamedTuple):
    name: str  # its key in a row
    field: str  # its field in the event: the name, but in Avro a valid Avro name
    mapping: FieldMapping
    optional: bool


class EventEncoder:
    """Encodes the events of one table (one schema version) in one format."""

    def __init__(self, server: str, table: TableMetadata, fmt: Format = "json",
                 schema_registry: "SchemaRegistry | None" = None, modes: TypeModes = TypeModes(),
                 columns: ColumnRules = ColumnRules()) -> None:
        """``schema_registry``: where the Avro schemas are registered (Avro only, and required there);
        ``columns``: the columns left out and the values masked (raises ``ColumnRuleError`` for a rule the
        table's columns refuse)."""
        self.table = table
        self.topic = event_topic(server, table.qualified_name)
        self.format = fmt
        self._name = f"{server}.{table.keyspace}.{table.name}"
        names = tuple(c.name for c in table.columns)
        fields = dict(zip(names, names if fmt == "json" else avro_names(names)))
        # A partition with static values and no rows is one row with null clustering columns, as is each row
        # of a static COMPACT STORAGE table (its clustering column is hidden). Clustering columns are optional
        # in every table's key: adding a static column must not change the key schema, nor the key bytes.
        self._key_columns = [_Column(c.name, fields[c.name], FieldMapping(c.type, modes),
                                     optional=c.kind is ColumnKind.CLUSTERING) for c in table.primary_key]
        excluded = columns.excluded(table)
        self._value_columns = [_Column(c.name, fields[c.name], FieldMapping(c.type, modes), optional=True)
                               for c in table.columns if c.name not in excluded]
        rewrites = columns.rewrites(table)
        self._rewrites = tuple(rewrites.items())
        self._key_rewritten = any(c.name in rewrites for c in table.primary_key)
        self._key_fields = self._fields(self._key_columns)
        self._value_fields = self._fields(self._value_columns)
        if fmt == "json":
            key_schema = self._connect_struct(f"{self._name}.Key", self._key_columns, optional=False)
            row = self._connect_struct(f"{self._name}.Value", self._value_columns, optional=True)
            value_schema = connect_schema(
                "struct", fields=[row | {"field": "before"}, row | {"field": "after"}, SOURCE_SCHEMA,
                                  *ENVELOPE_TAIL_SCHEMAS],
                name=f"{self._name}.Envelope", version=ENVELOPE_SCHEMA_VERSION)
            # The schema is most of an event's JSON and never changes: encoded once, not per event.
            self._key_document = ConnectDocument(key_schema)
            self._no_key_document = ConnectDocument(key_schema | {"optional": True})
            self._value_document = ConnectDocument(value_schema)
        else:
            if schema_registry is None:
                raise ValueError("Avro events need a schema registry")
            namespace = _avro_namespace(self._name)
            key_schema = self._avro_columns("Key", namespace, self._key_columns)
            row = self._avro_columns("Value", namespace, self._value_columns)
            value_schema = {
                "type": "record", "name": "Envelope", "namespace": namespace,
                "fields": [{"name": "before", "type": ["null", row], "default": None},
                           {"name": "after", "type": ["null", f"{namespace}.Value"], "default": None},
                           *(avro_field(schema) for schema in (SOURCE_SCHEMA, *ENVELOPE_TAIL_SCHEMAS))],
                "connect.version": ENVELOPE_SCHEMA_VERSION, "connect.name": f"{self._name}.Envelope"}
            no_key_schema = ["null", key_schema]
            self._avro_key = fastavro.parse_schema(key_schema)
            self._avro_no_key = fastavro.parse_schema(no_key_schema)
            self._avro_value = fastavro.parse_schema(value_schema)
            # What a registry is sent (subject, schema), by use: the schemas as declared (a parsed one holds
            # fastavro's own keys).
            self._declared = {"key": (f"{self.topic}-key", key_schema),
                              "no key": (f"{self.topic}-key", no_key_schema),
                              "value": (f"{self.topic}-value", value_schema)}
            self._registry = schema_registry
            self._schema_ids: dict[str, int] = {}

    # --- public -----------------------------------------------------------------------------------

    def static_only(self, row: dict[str, Any]) -> bool:
        """Whether ``row`` is the row of a partition with static values and no rows: its clustering columns
        null (a key a JDBC sink's NOT NULL primary key refuses)."""
        clustering = [c.name for c in self._key_columns if c.optional]
        return bool(clustering) and all(row.get(name) is None for name in clustering)

    def key(self, row: dict[str, Any]) -> bytes:
        payload = self._row(self._rewritten(row) if self._key_rewritten else row, self._key_fields)
        if self.format == "json":
            return self._key_document.encode(payload)
        return self._avro(self._avro_key, payload, "key")

    def no_key(self) -> bytes:
        """The key of an event about no row (a truncation's): one that converters read as null. A record
        without a key would be Debezium's, but a compacted topic refuses it."""
        if self.format == "json":
            return self._no_key_document.encode(None)
        return self._avro(self._avro_no_key, None, "no key")

    def value(self, before: dict[str, Any] | None, after: dict[str, Any] | None, op: Op, source: Source,
              ts_ms: int) -> bytes:
        """The envelope of a change; ``ts_ms`` is when the pipeline processed it (its ``ts_us``, ``ts_ns``
        the same instant), and ``transaction`` is null: Cassandra has no transactions to report."""
        if self._rewrites:
            before = None if before is None else self._rewritten(before)
            after = None if after is None else self._rewritten(after)
        payload = {"before": None if before is None else self._row(before, self._value_fields),
                   "after": None if after is None else self._row(after, self._value_fields),
                   "source": source.as_dict(), "op": op, "ts_ms": ts_ms, "ts_us": ts_ms * 1000,
                   "ts_ns": ts_ms * 1_000_000, "transaction": None}
        if self.format == "json":
            return self._value_document.encode(payload)
        return self._avro(self._avro_value, payload, "value")

    # --- helpers ----------------------------------------------------------------------------------

    def _rewritten(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with its masked or truncated columns' values rewritten (a mask replaces a null too)."""
        return {**row, **{name: rewrite(row.get(name)) for name, rewrite in self._rewrites}}

    def _fields(self, columns: list[_Column]) -> list[tuple[str, str, Converter | None]]:
        """Per column: its name, its field, and how its values (not None) convert to the format (None: they
        do not)."""
        if self.format == "json":
            return [(c.name, c.field, c.mapping.connect_converter) for c in columns]
        return [(c.name, c.field, c.mapping.to_avro) for c in columns]

    @staticmethod
    def _row(row: dict[str, Any], fields: list[tuple[str, str, Converter | None]]) -> dict[str, Any]:
        converted = {}
        for name, field, convert in fields:
            value = row.get(name)
            converted[field] = value if convert is None or value is None else convert(value)
        return converted

    @staticmethod
    def _connect_struct(name: str, columns: list[_Column], optional: bool) -> dict[str, Any]:
        return connect_schema("struct", fields=[c.mapping.connect_schema(optional=c.optional, field=c.field)
                                                for c in columns], optional=optional, name=name)

    @staticmethod
    def _avro_columns(name: str, namespace: str, columns: list[_Column]) -> dict:
        """The record of a key's or a row's columns (``types._avro_record`` makes those of the CQL types)."""
        defined: dict[str, str] = {}  # the key and the value are separate schemas: each defines its records
        fields = []
        for column in columns:
            avro_type = column.mapping.avro_schema(namespace, defined)
            fields.append({"name": column.field, "type": ["null", avro_type], "default": None}
                          if column.optional else {"name": column.field, "type": avro_type})
        return {"type": "record", "name": name, "namespace": namespace, "fields": fields}

    def _avro(self, schema: Any, record: dict[str, Any] | None, use: str) -> bytes:
        schema_id = self._schema_ids.get(use)
        if schema_id is None:  # registered once per encoder, not per event
            schema_id = self._schema_ids[use] = self._registry.register(*self._declared[use])
        return avro_bytes(schema, record, schema_id)


def avro_bytes(schema: Any, record: Any, schema_id: int) -> bytes:
    """``record`` in the Confluent wire format, with the registry's ``schema_id`` of the (parsed)
    ``schema``."""
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))  # magic 0, schema id
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


class StructEncoder:
    """Records of one Connect struct schema in an events' format: Connect JSON as the JsonConverter writes
    it, or Avro as Confluent's AvroConverter does (``avro_from_connect``), registered under ``subject`` at
    the first record. For records besides the events: heartbeats, schema changes."""

    def __init__(self, schema: dict[str, Any], fmt: Format, subject: str,
                 schema_registry: "SchemaRegistry | None") -> None:
        self._document: ConnectDocument | None = None
        if fmt == "json":
            self._document = ConnectDocument(schema)
            return
        if schema_registry is None:
            raise ValueError("Avro records need a schema registry")
        self._registry = schema_registry
        self._subject = subject
        self._declared = avro_from_connect(schema)
        self._parsed = fastavro.parse_schema(self._declared)
        self._schema_id: int | None = None

    def encode(self, payload: dict[str, Any]) -> bytes:
        if self._document is not None:
            return self._document.encode(payload)
        if self._schema_id is None:
            self._schema_id = self._registry.register(self._subject, self._declared)
        return avro_bytes(self._parsed, payload, self._schema_id)


class ConnectDocument:
    """``{"schema": …, "payload": …}`` as the JsonConverter writes it, with the schema part encoded once.

    The bytes are those of ``_json({"schema": schema, "payload": payload})``.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        self._head = b'{"schema":' + _json(schema) + b',"payload":'

    def encode(self, payload: dict[str, Any]) -> bytes:
        return b"".join((self._head, _json(payload), b"}"))  # one copy of the (large) head, not two


class SchemaRegistry:
    """Registers Avro schemas with a Confluent-compatible schema registry through confluent-kafka's client
    (which caches the ids), with its login and TLS settings (``SchemaRegistrySettings.client_settings``)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self._client = SchemaRegistryClient(dict(settings))

    def register(self, subject: str, schema: Any) -> int:
        from confluent_kafka.schema_registry import Schema

        return self._client.register_schema(subject, Schema(json.dumps(schema, sort_keys=True), "AVRO"))


def _avro_namespace(name: str) -> str:
    return ".".join(part if part and part[0].isalpha() else f"_{part}" for part in
                    ("".join(c if c.isalnum() or c == "_" else "_" for c in p) for p in name.split(".")))


# The same bytes as ``json.dumps(document, separators=(",", ":"), ensure_ascii=False)``: orjson writes them
# several times faster, on the per-event path, but not integers beyond 64 bits, which this encoder writes.
# NaN and the infinities are null by then (``field_mapping``): JSON has no such numbers.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False,
                                 allow_nan=False)


def _json(document: Any) -> bytes:
    try:
        encoded = orjson.dumps(document)
    except orjson.JSONEncodeError:
        encoded = _JSON_ENCODER.encode(document).encode()
    return java_numbers(encoded)
