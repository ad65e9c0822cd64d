"""Debezium's schema change events (its ``include.schema.changes``, on by default as there:
``output.include_schema_changes``): one record on the ``<server>`` topic per version of a table that the
agents publish to their catalog (``<server>.table-schemas``).

While the pipeline's query runs, a daemon thread of the driver follows the catalog (``SchemaCatalog``)
and writes a record for each table version it has not written yet: ``CREATE`` for the first version of a
table on the topic, ``ALTER`` for each later one, and ``DROP`` once for a table the agents saw dropped (each
agent publishes the drop, see ``schema_records``).

Each version (and drop) once, across restarts and between pipelines of one server: each record carries
its table's id and version in its headers, and before it writes, a publisher reads the topic
(read_committed) for what is there already, then writes what is missing in a Kafka transaction under one
transactional id per server. Registering that id (``init_transactions``) fences every other publisher of
the server and ends its open transaction; the publisher registers before it reads, so what it commits was
not on the topic, and no other publisher commits it (one that registered later fences this one's commit;
one that registered earlier is fenced). A version the catalog lost before the pipeline read it (the
catalog is compacted per table) has no record.

The format is Debezium's (``SchemaFactory``, ``ConnectTableChangeSerializer``, ``EventDispatcher``): key
``io.debezium.connector.cassandra_cdc.SchemaChangeKey`` ``{databaseName}``, value
``io.debezium.connector.cassandra_cdc.SchemaChangeValue`` with the events' ``source`` block, ``ts_ms``,
``databaseName`` (the keyspace), ``schemaName`` (null), ``ddl`` (the table's CQL as the agents publish it;
``DROP TABLE`` for a drop) and ``tableChanges`` (one ``io.debezium.connector.schema.Change`` with the
table's primary key and columns, for a drop those it had), in the events' format, on partition 0 of a
topic created as Debezium's schema history topic is (one partition, ``cleanup.policy=delete``, no
retention limit). Reference: ``docs/events.md``.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Any, Literal

from confluent_kafka import KafkaException, Message, Producer
from pyspark.sql.streaming import StreamingQuery

from ..events.event_encoder import CONNECTOR, SOURCE_SCHEMA, SchemaRegistry, Source, StructEncoder
from ..events.field_mapping import connect_schema
from ..kafka.consume import TopicFollower
from ..kafka.schema_catalog import SchemaCatalog
from ..kafka.schema_records import SchemaRecord
from ..schema import ColumnKind, ColumnMetadata, TableMetadata
from ..schema.types import quote
from .event_sink import TIMEOUT, SinkSettings, ensure_topic
from .pipeline_config import PipelineConfig

log = logging.getLogger(__name__)

KEY_SCHEMA_NAME = f"io.debezium.connector.{CONNECTOR}.SchemaChangeKey"
VALUE_SCHEMA_NAME = f"io.debezium.connector.{CONNECTOR}.SchemaChangeValue"
SCHEMA_VERSION = 1
# The headers that name the table version of a record: what a publisher reads back.
TABLE_ID_HEADER = "cassandra_cdc.table_id"
VERSION_HEADER = "cassandra_cdc.table_version"
# The topic as Debezium creates its schema history topic: records are never deleted nor compacted away.
TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
# How often the driver reads the catalog for new table versions.
INTERVAL_SECONDS = 1.0

ChangeType = Literal["CREATE", "ALTER", "DROP"]
# The version header of a table's DROP.
DROPPED_VERSION = "dropped"


def _optional(type_: str, field: str) -> dict[str, Any]:
    return connect_schema(type_, optional=True, field=field)


def _strings(field: str, optional: bool) -> dict[str, Any]:
    return connect_schema("array", items=connect_schema("string"), optional=optional, field=field)


# Debezium's SchemaFactory.schemaHistoryColumnSchema, schemaHistoryTableSchema, schemaHistoryChangeSchema,
# schemaHistoryConnectorKeySchema and schemaHistoryConnectorValueSchema, as the JsonConverter writes them.
COLUMN_SCHEMA = connect_schema("struct", name="io.debezium.connector.schema.Column", version=1, fields=[
    connect_schema("string", field="name"), connect_schema("int32", field="jdbcType"),
    _optional("int32", "nativeType"), connect_schema("string", field="typeName"),
    _optional("string", "typeExpression"), _optional("string", "charsetName"), _optional("int32", "length"),
    _optional("int32", "scale"), connect_schema("int32", field="position"), _optional("boolean", "optional"),
    _optional("boolean", "autoIncremented"), _optional("boolean", "generated"),
    _optional("string", "comment"), _optional("string", "defaultValueExpression"),
    _strings("enumValues", optional=True)])
TABLE_SCHEMA = connect_schema("struct", optional=True, name="io.debezium.connector.schema.Table", version=1,
                              field="table", fields=[
                                  _optional("string", "defaultCharsetName"),
                                  _strings("primaryKeyColumnNames", optional=True),
                                  connect_schema("array", items=COLUMN_SCHEMA, field="columns"),
                                  _optional("string", "comment")])
CHANGE_SCHEMA = connect_schema("struct", name="io.debezium.connector.schema.Change", version=1, fields=[
    connect_schema("string", field="type"), connect_schema("string", field="id"), TABLE_SCHEMA])
KEY_SCHEMA = connect_schema("struct", name=KEY_SCHEMA_NAME, version=SCHEMA_VERSION,
                            fields=[connect_schema("string", field="databaseName")])
VALUE_SCHEMA = connect_schema("struct", name=VALUE_SCHEMA_NAME, version=SCHEMA_VERSION, fields=[
    SOURCE_SCHEMA, connect_schema("int64", field="ts_ms"), _optional("string", "databaseName"),
    _optional("string", "schemaName"), _optional("string", "ddl"),
    connect_schema("array", items=CHANGE_SCHEMA, field="tableChanges")])

# java.sql.Types of the CQL types, by meaning; OTHER (1111) for those without one (uuid, timeuuid, inet,
# duration, map).
_JDBC_TYPES = {"ascii": 12, "text": 12, "varchar": 12, "tinyint": -6, "smallint": 5, "int": 4, "bigint": -5,
               "counter": -5, "float": 7, "double": 8, "decimal": 3, "varint": 2, "boolean": 16, "blob": -3,
               "date": 91, "time": 92, "timestamp": 93, "list": 2003, "set": 2003, "vector": 2003,
               "tuple": 2002, "udt": 2002}
JDBC_OTHER = 1111


def table_id_text(keyspace: str, table: str) -> str:
    """The table's id as Debezium writes one (``TableId.toDoubleQuotedString``): ``"keyspace"."table"``."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in (keyspace, table))


def _comment(table: TableMetadata) -> str | None:
    """The table's comment option (CQL text, a quoted string); None when it has none or an empty one."""
    text = table.options.get("comment", "")
    if len(text) >= 2 and text[0] == text[-1] == "'":
        text = text[1:-1].replace("''", "'")
    return text or None


def _column(column: ColumnMetadata, position: int) -> dict[str, Any]:
    """A column as ``io.debezium.connector.schema.Column``: its CQL type's family as ``typeName``, the whole
    type as ``typeExpression``, optional unless it is in the primary key."""
    cql_type = column.type
    return {"name": column.name, "jdbcType": _JDBC_TYPES.get(cql_type.kind, JDBC_OTHER), "nativeType": None,
            "typeName": cql_type.udt_name if cql_type.kind == "udt" else cql_type.kind,
            "typeExpression": cql_type.cql, "charsetName": None, "length": None, "scale": None,
            "position": position, "optional": column.kind >= ColumnKind.REGULAR, "autoIncremented": False,
            "generated": False, "comment": None, "defaultValueExpression": None, "enumValues": None}


def table_change(table: TableMetadata, change: ChangeType) -> dict[str, Any]:
    """The ``io.debezium.connector.schema.Change`` of ``table`` (its columns those of its events)."""
    return {"type": change, "id": table_id_text(table.keyspace, table.name),
            "table": {"defaultCharsetName": None,
                      "primaryKeyColumnNames": [c.name for c in table.primary_key],
                      "columns": [_column(c, position) for position, c in enumerate(table.columns, 1)],
                      "comment": _comment(table)}}


class SchemaChangeEncoder:
    """A schema change record's key and value in the events' format."""

    def __init__(self, config: PipelineConfig) -> None:
        self.topic = config.server
        self._server, self._cluster = config.server, config.cluster_name
        self._columns = config.output.column_rules
        fmt = config.output.format
        registry = None if fmt == "json" else SchemaRegistry(config.output.registry_client_settings())
        self._key = StructEncoder(KEY_SCHEMA, fmt, f"{self.topic}-key", registry)
        self._value = StructEncoder(VALUE_SCHEMA, fmt, f"{self.topic}-value", registry)

    def key(self, keyspace: str) -> bytes:
        return self._key.encode({"databaseName": keyspace})

    def value(self, record: SchemaRecord, table: TableMetadata, change: ChangeType, ts_ms: int) -> bytes:
        """The value of ``change`` to ``table`` (``record`` as the catalog holds it), written at ``ts_ms``;
        its source's time is when an agent first published the version, its node that agent's. The columns
        the events leave out (``output.column_exclude_list``) are left out of its columns and its CQL."""
        source = Source(self._server, self._cluster, table.keyspace, table.name, record.ts_ms * 1000, False,
                        record.node, None, None)
        shown = self._columns.project(table)
        if change == "DROP":
            ddl = f"DROP TABLE {quote(table.keyspace)}.{quote(table.name)};"
        else:
            ddl = record.cql if shown is table else shown.ddl()
        return self._value.encode({"source": source.as_dict(), "ts_ms": ts_ms, "databaseName": table.keyspace,
                                   "schemaName": None, "ddl": ddl,
                                   "tableChanges": [table_change(shown, change)]})


class SchemaChangePublisher:
    """Writes the schema change records of the table versions in the catalog that ``<server>`` lacks (see
    the module's docstring)."""

    def __init__(self, config: PipelineConfig, sink: SinkSettings) -> None:
        self.topic = config.server
        self._encoder = SchemaChangeEncoder(config)
        self._sink = sink
        kafka = config.kafka
        consumer = kafka.librdkafka(kafka.consumer)
        self._catalog = SchemaCatalog(kafka.bootstrap_servers, config.schema_topics_read, consumer,
                                      on_record=self._read_version)
        self._written = TopicFollower({**consumer, "group.id": "cassandra-cdc-schema-changes",
                                       "enable.auto.commit": False, "enable.partition.eof": True,
                                       "isolation.level": "read_committed"}, TIMEOUT)
        # The versions read from the catalog and not (known to be) written, by (table id, version), in the
        # catalog's order; the versions on the topic, and the ids of their tables.
        self._pending: dict[tuple[str, str], tuple[SchemaRecord, TableMetadata]] = {}
        self._versions: set[tuple[str, str]] = set()
        self._tables: set[str] = set()
        self._producer: Producer | None = None

    def publish(self) -> int:
        """Read the catalog, write the records of its versions that are not on the topic; return how many
        were written. Raises ``KafkaException`` (or the schema registry's error) when that fails: the
        versions are tried again at the next call."""
        self._catalog.refresh()
        if not self._pending:
            return 0
        producer = self._registered()
        self._written.read(self.topic, self._read_record)
        self._pending = {key: read for key, read in self._pending.items() if key not in self._versions}
        if not self._pending:
            return 0
        tables = set(self._tables)
        now_ms = time.time_ns() // 1_000_000
        try:
            producer.begin_transaction()
            for (table_id, version), (record, table) in self._pending.items():
                change: ChangeType = ("DROP" if record.dropped else "ALTER" if table_id in tables
                                      else "CREATE")
                tables.add(table_id)
                producer.produce(self.topic, self._encoder.value(record, table, change, now_ms),
                                 self._encoder.key(table.keyspace), partition=0,
                                 headers=[(TABLE_ID_HEADER, table_id.encode()),
                                          (VERSION_HEADER, version.encode())])
            producer.commit_transaction(TIMEOUT)
        except Exception:
            self._drop_producer()  # fenced, or in a state unknown: the next call registers a new one
            raise
        written = len(self._pending)
        self._versions.update(self._pending)
        self._tables = tables
        self._pending = {}
        log.info("wrote %d schema change(s) to %s", written, self.topic)
        return written

    def close(self) -> None:
        self._drop_producer()
        self._catalog.close()
        self._written.close()

    def _read_version(self, record: SchemaRecord, table: TableMetadata) -> None:
        key = (record.table_id, DROPPED_VERSION if record.dropped else record.version)
        if key not in self._versions:
            self._pending.setdefault(key, (record, table))

    def _read_record(self, message: Message) -> None:
        headers = dict(message.headers() or ())
        if TABLE_ID_HEADER in headers and VERSION_HEADER in headers:  # others: an earlier version's catalog
            table_id = headers[TABLE_ID_HEADER].decode()
            self._versions.add((table_id, headers[VERSION_HEADER].decode()))
            self._tables.add(table_id)

    def _registered(self) -> Producer:
        """The producer under the server's transactional id, registered (fencing any other) before the topic
        is read for what it holds."""
        if self._producer is None:
            ensure_topic(self._sink.admin_settings(), self.topic, partitions=1, config=TOPIC_CONFIG)
            self._producer = Producer(self._sink.producer_settings(**{
                "transactional.id": f"{self._sink.query_name}-schema-changes", "enable.idempotence": True,
                "acks": "all"}))
            try:
                # The metadata first, as TransactionalProducer asks it: then the coordinator lookup finds
                # a broker.
                self._producer.list_topics(timeout=TIMEOUT)
                self._producer.init_transactions(TIMEOUT)
            except KafkaException:
                self._drop_producer()
                raise
        return self._producer

    def _drop_producer(self) -> None:
        """Close the producer, which aborts its open transaction."""
        if self._producer is not None:
            with warnings.catch_warnings():
                # A fenced producer cannot abort (registering the id again ends its transaction): close()
                # warns that it could not.
                warnings.simplefilter("ignore", RuntimeWarning)
                self._producer.close()
            self._producer = None


class SchemaChanges:
    """Writes the schema changes from a daemon thread while ``query`` is active, every
    ``INTERVAL_SECONDS``; a failure is logged and the versions tried again."""

    def __init__(self, config: PipelineConfig, sink: SinkSettings, query: StreamingQuery) -> None:
        self._publisher = SchemaChangePublisher(config, sink)
        self._query = query
        self._thread = threading.Thread(target=self._run, name="schema-changes", daemon=True)

    def start(self) -> "SchemaChanges":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while self._query.isActive:
                try:
                    self._publisher.publish()
                except Exception as error:  # Kafka or the registry away: the query goes on without them
                    log.warning("schema changes not written to %s yet (tried again): %s",
                                self._publisher.topic, error)
                time.sleep(INTERVAL_SECONDS)
        finally:
            self._publisher.close()


__all__ = ["SchemaChangeEncoder", "SchemaChangePublisher", "SchemaChanges", "table_change"]
