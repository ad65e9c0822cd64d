"""Table metadata from the ``system_schema`` tables of a live cluster (Cassandra 3.0 to 5.0).

Example::

    from cassandra.cluster import Cluster
    schema = fetch_schema(Cluster(["127.0.0.1"]).connect())

Rows are dicts keyed by column name, as cassandra-driver returns them. ``system_schema`` stores every
column Cassandra keeps in storage, including the hidden ones of COMPACT STORAGE tables (``tables.flags``
without ``compound``, or with ``dense``): those come through as they are, so the result is the storage
layout a commit log reader needs, and ``TableMetadata.hidden_columns`` tells which ones CQL does not show.
Super column families (flag ``super``, Thrift only) are refused with a :class:`SchemaError`.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping, NamedTuple, TypeVar

from .cql import cql_literal
from .model import ColumnKind, ColumnMetadata, KeyspaceMetadata, Schema, SchemaError, TableMetadata
from .types import CqlType, CqlTypeError, parse_type, user_type

Row = Mapping[str, Any]
_Read = TypeVar("_Read")

_KINDS = {
    "partition_key": ColumnKind.PARTITION_KEY,
    "clustering": ColumnKind.CLUSTERING,
    "regular": ColumnKind.REGULAR,
    "static": ColumnKind.STATIC,
}

# Columns of system_schema.tables/views that are not table options.
_NOT_OPTIONS = {"keyspace_name", "table_name", "view_name", "id", "flags", "cdc", "base_table_id",
                "base_table_name", "include_all_columns", "where_clause"}

# A node's schema read again at most this many times while DDL keeps changing it, pausing between reads.
CONSISTENT_READ_ATTEMPTS = 50
CHANGING_SCHEMA_PAUSE_SECONDS = 0.1

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

# The queries of a schema read, by the argument of schema_from_system_schema_rows their rows are.
_QUERIES = {
    **{name: f"SELECT * FROM system_schema.{name}" for name in ("keyspaces", "tables", "columns", "views")},
    # dropped_time as milliseconds: Cassandra 4.0+ records system.local's dropped thrift_version column at
    # Long.MAX_VALUE microseconds, a timestamp the driver cannot turn into a datetime (it fails the whole
    # query).
    "dropped_columns": "SELECT keyspace_name, table_name, column_name, kind, type, "
                       "blobAsBigint(timestampAsBlob(dropped_time)) AS dropped_time "
                       "FROM system_schema.dropped_columns",
    # Every change of a table writes its whole tables row, and of a type its types row, at the change's time.
    "types": "SELECT keyspace_name, type_name, field_names, field_types, writetime(field_names) AS written "
             "FROM system_schema.types",
    "table_write_times": "SELECT keyspace_name, table_name, writetime(id) AS written "
                         "FROM system_schema.tables",
}


def fetch_schema(session: Any, node: str | None = None) -> Schema:
    """Query ``system_schema`` with a cassandra-driver ``Session`` and build the schema of every keyspace.

    Every table is read from one node: ``node`` (an address) while it is up, else the first node up. A
    schema change reaches the nodes one after the other, and writes its ``system_schema`` tables one after
    the other, so a read spread over nodes, or over a change, can see a table's column gone from ``columns``
    but not yet in ``dropped_columns``: the read is done again until the node's ``schema_version`` is the
    same after it as before.
    """
    return fetch_versioned_schema(session, node).schema


class VersionedSchema(NamedTuple):
    version: uuid.UUID  # the node's schema_version (see schema_version)
    schema: Schema
    node: str  # the address of the node read


def fetch_versioned_schema(session: Any, node: str | None = None) -> VersionedSchema:
    """As :func:`fetch_schema`, with the ``schema_version`` of the node read and its address."""
    return _from_a_node(session, node, _consistent_read)


def schema_version(session: Any, node: str | None = None) -> uuid.UUID:
    """The ``schema_version`` of ``node`` (else of the first node up): it changes with every schema change the
    node applies, so a schema read at the same version is still the node's."""
    return _from_a_node(session, node, _schema_version)


def _from_a_node(session: Any, node: str | None, read: Callable[[Any, Any], _Read]) -> _Read:
    from cassandra import DriverException
    from cassandra.cluster import NoHostAvailable

    hosts = sorted((host for host in session.cluster.metadata.all_hosts() if host.is_up is not False),
                   key=lambda host: (host.endpoint.address != node, str(host.endpoint)))
    failures: dict[str, Exception] = {}
    for host in hosts:  # a node that is down, times out or is overloaded leaves the read to the next one
        try:
            return read(session, host)
        except (NoHostAvailable, DriverException, OSError) as error:
            failures.update(getattr(error, "errors", None) or {str(host.endpoint): error})
    raise NoHostAvailable("no node answered the system_schema read", failures)


def _consistent_read(session: Any, host: Any) -> VersionedSchema:
    for _ in range(CONSISTENT_READ_ATTEMPTS):
        version = _schema_version(session, host)
        rows = {name: [_as_dict(row) for row in session.execute(query, host=host)]
                for name, query in _QUERIES.items()}
        if _schema_version(session, host) == version:
            return VersionedSchema(version, schema_from_system_schema_rows(**rows), host.endpoint.address)
        time.sleep(CHANGING_SCHEMA_PAUSE_SECONDS)
    raise SchemaError(f"the schema of node {host.endpoint} changed during each of {CONSISTENT_READ_ATTEMPTS} "
                      "reads", "system_schema")


def _schema_version(session: Any, host: Any) -> uuid.UUID:
    row = session.execute("SELECT schema_version FROM system.local", host=host).one()
    return _as_dict(row)["schema_version"]


def schema_from_system_schema_rows(keyspaces: Iterable[Row], tables: Iterable[Row], columns: Iterable[Row],
                                   dropped_columns: Iterable[Row], types: Iterable[Row],
                                   views: Iterable[Row] = (),
                                   table_write_times: Iterable[Row] = ()) -> Schema:
    """A schema from the rows of ``system_schema.{keyspaces,tables,columns,dropped_columns,types,views}``.

    ``dropped_columns.dropped_time`` is a ``timestamp`` (a datetime from the driver, or an integer of
    milliseconds): Cassandra keeps drop times with millisecond precision there. A table's ``defined_at``
    is set when ``table_write_times`` has its row (``keyspace_name``, ``table_name``, ``written``: the
    write time of its tables row), from that and the ``written`` of the ``types`` rows of the types it uses.
    """
    types = list(types)
    schema = Schema()
    for row in keyspaces:
        schema.add_keyspace(KeyspaceMetadata(row["keyspace_name"], dict(row.get("replication") or {}),
                                             bool(row.get("durable_writes", True))))
    _add_user_types(schema, types)
    columns_of = _by_table(columns)
    dropped_of = _by_table(dropped_columns)
    table_written = {(row["keyspace_name"], row["table_name"]): row["written"] for row in table_write_times}
    type_written = {(row["keyspace_name"], row["type_name"]): row.get("written") for row in types}
    for row in tables:
        key = (row["keyspace_name"], row["table_name"])
        table = _table(schema, row, "tables", columns_of[key], dropped_of[key])
        if key in table_written:
            table.defined_at = _defined_at(table, table_written[key], type_written)
        schema.add_table(table)
    for row in views:
        key = (row["keyspace_name"], row["view_name"])
        schema.add_table(_table(schema, row, "views", columns_of[key], dropped_of[key]))
    return schema


def _defined_at(table: TableMetadata, written: int,
                type_written: Mapping[tuple[str, str], int | None]) -> int:
    """The latest of the table's row's write time and those of the user types it uses."""
    used = (type_written.get((udt.udt_keyspace or table.keyspace, udt.udt_name or ""))
            for column in table.columns for udt in column.type.user_types())
    return max([written, *(time for time in used if time is not None)])


def _as_dict(row: Any) -> dict[str, Any]:
    if isinstance(row, Mapping):
        return dict(row)
    if hasattr(row, "_asdict"):
        return row._asdict()
    raise TypeError(f"system_schema rows must be dicts or named tuples (driver row_factory), got {type(row)}")


def _by_table(rows: Iterable[Row]) -> dict[tuple[str, str], list[Row]]:
    grouped: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        grouped[(row["keyspace_name"], row["table_name"])].append(row)
    return grouped


def _add_user_types(schema: Schema, rows: Iterable[Row]) -> None:
    """Resolve UDTs in dependency order (a UDT's fields may use other UDTs; the rows come by name)."""
    pending = list(rows)
    while pending:
        unresolved = []
        for row in pending:
            try:
                udt = _user_type(schema, row)
            except CqlTypeError:
                unresolved.append(row)
                continue
            schema.keyspace(row["keyspace_name"]).user_types[row["type_name"]] = udt
        if len(unresolved) == len(pending):
            row = unresolved[0]
            try:
                _user_type(schema, row)
            except CqlTypeError as e:
                raise SchemaError(str(e), f"system_schema.types {row['keyspace_name']}.{row['type_name']}") \
                    from None
        pending = unresolved


def _user_type(schema: Schema, row: Row) -> CqlType:
    keyspace = row["keyspace_name"]
    udts = schema.keyspace(keyspace).user_types
    fields = {name: parse_type(text, keyspace, udts)
              for name, text in zip(row["field_names"], row["field_types"], strict=True)}
    return user_type(keyspace, row["type_name"], fields)


def _table(schema: Schema, row: Row, kind: str, column_rows: list[Row], dropped_rows: list[Row]) \
        -> TableMetadata:
    keyspace, name = row["keyspace_name"], row["view_name" if kind == "views" else "table_name"]
    source = f"system_schema.{kind} {keyspace}.{name}"
    flags = {"compound"} if kind == "views" else set(row.get("flags") or ())
    if "super" in flags:
        raise SchemaError("super column families (created through Thrift) are not supported", source)
    udts = schema.keyspace(keyspace).user_types
    columns = [_column(r, keyspace, udts, source) for r in column_rows]
    partition_key = _key_columns(columns, ColumnKind.PARTITION_KEY)
    if not partition_key:
        raise SchemaError("no partition key column in system_schema.columns", source)
    options = {k: cql_literal(v) for k, v in row.items() if k not in _NOT_OPTIONS and v is not None}
    return TableMetadata(
        keyspace, name, uuid.UUID(str(row["id"])), partition_key,
        clustering=_key_columns(columns, ColumnKind.CLUSTERING),
        regular_and_static=tuple(c for c in columns if c.kind in (ColumnKind.REGULAR, ColumnKind.STATIC)),
        dropped=tuple(_dropped_column(r, keyspace, udts, source) for r in dropped_rows),
        cdc=bool(row.get("cdc")),
        compact_storage="dense" in flags or "compound" not in flags,
        options=options)


def _key_columns(columns: list[ColumnMetadata], kind: ColumnKind) -> tuple[ColumnMetadata, ...]:
    return tuple(sorted((c for c in columns if c.kind is kind), key=lambda c: c.position))


def _column(row: Row, keyspace: str, udts: Mapping[str, CqlType], source: str) -> ColumnMetadata:
    name = _column_name(row, source)
    kind = _KINDS.get(row["kind"])
    if kind is None:
        raise SchemaError(f"column {name!r} has unknown kind {row['kind']!r}", source)
    keyed = kind in (ColumnKind.PARTITION_KEY, ColumnKind.CLUSTERING)
    return ColumnMetadata(name, _type(row, keyspace, udts, source), kind,
                          position=row["position"] if keyed else -1,
                          reversed=(row.get("clustering_order") or "").lower() == "desc")


def _dropped_column(row: Row, keyspace: str, udts: Mapping[str, CqlType], source: str) -> ColumnMetadata:
    name = _column_name(row, source)
    # Rows of older versions have no kind: those drops are of regular columns.
    kind = ColumnKind.STATIC if row.get("kind") == "static" else ColumnKind.REGULAR
    return ColumnMetadata(name, _type(row, keyspace, udts, source), kind,
                          dropped_time=_microseconds(row["dropped_time"]))


def _column_name(row: Row, source: str) -> str:
    # column_name_bytes is the exact name (column_name is its text rendering).
    raw = row.get("column_name_bytes")
    if raw is None:
        return row["column_name"]
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise SchemaError(f"column name {bytes(raw).hex()} is not UTF-8 (not supported)", source) from None


def _type(row: Row, keyspace: str, udts: Mapping[str, CqlType], source: str) -> CqlType:
    try:
        return parse_type(row["type"], keyspace, udts)
    except CqlTypeError as e:
        raise SchemaError(f"column {row['column_name']!r}: {e}", source) from None


def _microseconds(dropped_time: datetime.datetime | int) -> int:
    if isinstance(dropped_time, int):
        return dropped_time * 1000
    if dropped_time.tzinfo is None:  # the driver returns naive datetimes in UTC
        dropped_time = dropped_time.replace(tzinfo=datetime.timezone.utc)
    return (dropped_time - _EPOCH) // datetime.timedelta(microseconds=1)
