"""Hypothesis strategies for CQL types and values, table metadata and commit log mutations.

Everything generated is something Cassandra itself could write: types obey CQL's nesting rules (only the
top level of a regular or static column may be non-frozen; no ``duration`` in keys, set elements or map
keys; counters only in counter tables), partition updates list their header columns in Cassandra's
column order, and timestamps, TTLs and local deletion times stay within what each commit log version
can hold. See ``docs/storage-format.md`` (§9-§14) for the byte format these feed.
"""

from __future__ import annotations

import decimal
import functools
import struct
import uuid
from typing import Any, Iterable, Sequence

from cassandra import util
from hypothesis import strategies as st

from cassandra_cdc.commitlog import Mutation
from cassandra_cdc.storage import BoundKind, Cell, ComplexColumn, DeletionTime, LivenessInfo, PartitionUpdate, RangeTombstoneMarker, Row
from cassandra_cdc.storage.cells import EXPIRED_LIVENESS_TTL, INT_MAX, LONG_MIN
from cassandra_cdc.storage.rows import Clustering
from cassandra_cdc.schema.model import ColumnKind, ColumnMetadata, Schema, TableMetadata
from cassandra_cdc.schema.types import (CqlType, list_type, map_type, set_type, simple_type, tuple_type,
                                        user_type, vector_type)

LONG_MAX = (1 << 63) - 1
INT_MIN = -(1 << 31)
# Cassandra 5.0's unsigned local deletion times: 2^32-1 means "none", so the largest real one is 2^32-2.
UINT_DELETION_TIME_MAX = (1 << 32) - 2

# Simple types usable anywhere, and those Cassandra forbids in keys, set elements and map keys.
KEY_KINDS = ("ascii", "text", "varchar", "blob", "boolean", "tinyint", "smallint", "int", "bigint", "varint",
             "float", "double", "decimal", "uuid", "timeuuid", "inet", "date", "time", "timestamp")
SIMPLE_KINDS = KEY_KINDS + ("duration",)
VECTOR_ELEMENT_KINDS = ("float", "int", "text")

_LETTERS = "abcdefghijklmnopqrstuvwxyz"

# Strategies are built once per type, column list or keyspace: building and validating them again for
# every draw would cost more than drawing from them.
_bounded_cache = functools.lru_cache(maxsize=4096)

# --- names --------------------------------------------------------------------------------------------


@functools.cache
def identifiers() -> st.SearchStrategy[str]:
    """CQL identifiers: mostly plain lower-case names, some starting with a non-ASCII letter (whose first
    UTF-8 byte >= 0x80 sorts them before ASCII names in Cassandra's column order), some arbitrary text
    (quoted identifiers)."""
    plain = st.builds(lambda first, rest: first + rest, st.sampled_from(_LETTERS),
                      st.text(alphabet=_LETTERS + "0123456789_", max_size=14))
    non_ascii_first = st.builds(lambda first, rest: first + rest, st.sampled_from("éüßжλ中"), plain)
    quoted = st.text(min_size=1, max_size=10)
    return st.one_of(plain, plain, non_ascii_first, quoted)


# --- types --------------------------------------------------------------------------------------------


@_bounded_cache
def cql_types(*, keyspace: str = "ks", key: bool = False, top_level: bool = True,
              depth: int = 2) -> st.SearchStrategy[CqlType]:
    """Any CQL type but ``counter`` (a property of whole tables, see :func:`tables`).

    ``key``: usable in a partition key or clustering column, a set element or a map key (frozen, no
    duration anywhere inside, no vector). ``top_level``: the type of a regular or static column itself,
    which alone may be a non-frozen (multi-cell) collection or UDT; nested types are always frozen.
    """
    simple = st.sampled_from(KEY_KINDS if key else SIMPLE_KINDS).map(simple_type)
    if depth == 0:
        return simple
    nested = cql_types(keyspace=keyspace, key=key, top_level=False, depth=depth - 1)
    keyable = cql_types(keyspace=keyspace, key=True, top_level=False, depth=depth - 1)
    frozen = st.just(True) if key or not top_level else st.booleans()
    composite = [
        st.builds(list_type, nested, frozen),
        st.builds(set_type, keyable, frozen),
        st.builds(map_type, keyable, nested, frozen),
        st.lists(nested, min_size=1, max_size=3).map(lambda elements: tuple_type(tuple(elements))),
        _user_types(keyspace, nested, frozen),
    ]
    if not key:
        composite.append(st.builds(vector_type, st.sampled_from(VECTOR_ELEMENT_KINDS).map(simple_type),
                                   st.integers(1, 6)))
    return st.one_of(simple, simple, simple, st.one_of(*composite))


@st.composite
def _user_types(draw: st.DrawFn, keyspace: str, field_types: st.SearchStrategy[CqlType],
                frozen: st.SearchStrategy[bool]) -> CqlType:
    names = draw(st.lists(identifiers(), min_size=1, max_size=4, unique=True))
    fields = {name: draw(field_types) for name in names}
    name = "udt_" + draw(st.text(alphabet=_LETTERS, min_size=1, max_size=6))
    return user_type(keyspace, name, fields, draw(frozen))


# --- values -------------------------------------------------------------------------------------------


@functools.cache
def _durations() -> st.SearchStrategy[util.Duration]:
    # Cassandra requires months, days and nanoseconds to share one sign.
    def build(negative: bool, months: int, days: int, nanos: int) -> util.Duration:
        sign = -1 if negative else 1
        return util.Duration(sign * months, sign * days, sign * nanos)
    magnitudes = (st.integers(0, INT_MAX), st.integers(0, INT_MAX), st.integers(0, LONG_MAX))
    return st.builds(build, st.booleans(), *magnitudes)


@functools.cache
def _decimals() -> st.SearchStrategy[decimal.Decimal]:
    # Built from text so that no context rounding applies: unscaled value and scale are kept exactly.
    return st.builds(lambda unscaled, scale: decimal.Decimal(f"{unscaled}E{-scale}"),
                     st.integers(-(10 ** 40), 10 ** 40), st.integers(-60, 60))


_SIMPLE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "ascii": st.text(alphabet=st.characters(max_codepoint=127), max_size=16),
    "text": st.text(max_size=16),
    "varchar": st.text(max_size=16),
    "blob": st.binary(max_size=24),
    "boolean": st.booleans(),
    "tinyint": st.integers(-(1 << 7), (1 << 7) - 1),
    "smallint": st.integers(-(1 << 15), (1 << 15) - 1),
    "int": st.integers(INT_MIN, INT_MAX),
    "bigint": st.integers(LONG_MIN, LONG_MAX),
    "counter": st.integers(LONG_MIN, LONG_MAX),
    "varint": st.integers(-(1 << 200), 1 << 200),
    "float": st.floats(width=32),
    "double": st.floats(),
    "decimal": _decimals(),
    "uuid": st.uuids(),
    "timeuuid": st.uuids(version=1),
    "inet": st.ip_addresses().map(str),
    "date": st.one_of(st.dates(), st.integers(INT_MIN, INT_MAX).map(util.Date)),
    "time": st.one_of(st.times(), st.integers(0, 86_399_999_999_999).map(util.Time)),
    "timestamp": st.one_of(st.datetimes(), st.integers(LONG_MIN, LONG_MAX)),
    "duration": _durations(),
}


@_bounded_cache
def values(cql_type: CqlType) -> st.SearchStrategy[Any]:
    """Python values of ``cql_type`` as the driver serializes them (``CqlType.serialize``).

    Sets are lists of distinct elements and maps ``util.OrderedMap`` (both admit unhashable frozen
    collections as elements); tuple and UDT values are tuples whose fields may be None (null).
    """
    kind, parameters = cql_type.kind, cql_type.parameters
    if kind in _SIMPLE_VALUES:
        return _SIMPLE_VALUES[kind]
    if kind == "list":
        return st.lists(values(parameters[0]), max_size=4)
    if kind == "set":
        return st.lists(values(parameters[0]), max_size=4, unique_by=parameters[0].serialize)
    if kind == "map":
        key_type, value_type = parameters
        pairs = st.lists(st.tuples(values(key_type), values(value_type)), max_size=4,
                         unique_by=lambda pair: key_type.serialize(pair[0]))
        return pairs.map(util.OrderedMap)
    if kind in ("tuple", "udt"):
        return st.tuples(*(st.none() | values(p) for p in parameters))
    if kind == "vector":
        return st.lists(values(parameters[0]), min_size=cql_type.dimension, max_size=cql_type.dimension)
    raise ValueError(f"no value strategy for {cql_type.cql}")


@_bounded_cache
def value_bytes(cql_type: CqlType) -> st.SearchStrategy[bytes]:
    """Storage bytes of values of ``cql_type``; for ``counter`` columns the stored counter context."""
    if cql_type.is_counter:
        return counter_contexts()
    return values(cql_type).map(cql_type.serialize)


@st.composite
def counter_contexts(draw: st.DrawFn) -> bytes:
    """A counter cell's value (CounterContext, docs/storage-format.md §14.1): ``int16`` header count,
    that many ``int16`` shard indexes (global shards as ``index + Short.MIN_VALUE``), then shards of
    16-byte counter id, int64 clock, int64 count."""
    shard_count = draw(st.integers(1, 3))
    indexed = draw(st.lists(st.integers(0, shard_count - 1), unique=True).map(sorted))
    header = [index + (-(1 << 15) if draw(st.booleans()) else 0) for index in indexed]
    shards = [draw(st.uuids()).bytes + struct.pack(">qq", draw(st.integers(0, LONG_MAX)),
                                                   draw(st.integers(LONG_MIN, LONG_MAX)))
              for _ in range(shard_count)]
    return struct.pack(f">h{len(header)}h", len(header), *header) + b"".join(shards)


# --- tables -------------------------------------------------------------------------------------------

FEW_COLUMNS = st.integers(0, 6)
# Wide enough for the column subset encoding of >= 64 columns (when most columns are in the header).
MANY_COLUMNS = st.integers(56, 70)
REGULAR_COUNTS = st.integers(1, 8).flatmap(lambda roll: MANY_COLUMNS if roll == 8 else FEW_COLUMNS)


@st.composite
def tables(draw: st.DrawFn, *, keyspace: str | None = None, name: str | None = None,
           table_id: uuid.UUID | None = None, partition_key: Sequence[ColumnMetadata] | None = None,
           counter: bool | None = None,
           regular_counts: st.SearchStrategy[int] = REGULAR_COUNTS) -> TableMetadata:
    """A random table: 1-3 partition key columns, 0-3 clustering columns (some DESC), ``regular_counts``
    regular columns (by default 0-70, mostly few), 0-3 static columns (only with clustering columns, as
    CQL requires).

    A counter table has only counter regular and static columns. ``partition_key`` reuses another
    table's key columns (tables written by one mutation share the partition key).
    """
    keyspace = keyspace if keyspace is not None else draw(identifiers())
    name = name if name is not None else draw(identifiers())
    table_id = table_id if table_id is not None else draw(st.uuids())
    counter = counter if counter is not None else draw(st.integers(0, 5)) == 0
    key_types = cql_types(keyspace=keyspace, key=True)
    new_key_count = 0 if partition_key is not None else draw(st.integers(1, 3))
    clustering_count = draw(st.integers(0, 3))
    regular_count = draw(regular_counts)
    if counter:
        regular_count = max(regular_count, 1)
    static_count = draw(st.integers(0, 3)) if clustering_count else 0
    taken = [c.name for c in partition_key or ()]
    count = new_key_count + clustering_count + regular_count + static_count
    size = count + len(taken)
    drawn = draw(st.lists(identifiers(), unique=True, min_size=size, max_size=size))
    names = [n for n in drawn if n not in taken]
    if partition_key is None:
        partition_key = tuple(ColumnMetadata(names.pop(), draw(key_types), ColumnKind.PARTITION_KEY, i)
                              for i in range(new_key_count))
    clustering = tuple(
        ColumnMetadata(names.pop(), draw(key_types), ColumnKind.CLUSTERING, i, reversed=draw(st.booleans()))
        for i in range(clustering_count))
    column_types = st.just(simple_type("counter")) if counter else cql_types(keyspace=keyspace)
    statics = [ColumnMetadata(names.pop(), draw(column_types), ColumnKind.STATIC)
               for _ in range(static_count)]
    regulars = [ColumnMetadata(names.pop(), draw(column_types), ColumnKind.REGULAR)
                for _ in range(regular_count)]
    return TableMetadata(keyspace, name, table_id, tuple(partition_key), clustering,
                         tuple(regulars + statics))


@st.composite
def related_tables(draw: st.DrawFn, max_tables: int = 3,
                   regular_counts: st.SearchStrategy[int] = REGULAR_COUNTS) -> list[TableMetadata]:
    """1 to ``max_tables`` tables of one keyspace with the same partition key columns (what one mutation
    may touch), all counter tables or none (``regular_counts``: as in :func:`tables`)."""
    count = draw(st.integers(1, max_tables))
    names = draw(st.lists(identifiers(), min_size=count, max_size=count, unique=True))
    ids = draw(st.lists(st.uuids(), min_size=count, max_size=count, unique=True))
    first = draw(tables(name=names[0], table_id=ids[0], regular_counts=regular_counts))
    others = [draw(tables(keyspace=first.keyspace, name=name, table_id=table_id,
                          partition_key=first.partition_key, counter=first.is_counter,
                          regular_counts=regular_counts))
              for name, table_id in zip(names[1:], ids[1:])]
    return [first, *others]


def schema_of(tables: Iterable[TableMetadata]) -> Schema:
    schema = Schema()
    for table in tables:
        schema.add_table(table)
    return schema


# --- timestamps, TTLs, deletion times -----------------------------------------------------------------


@functools.cache
def timestamps() -> st.SearchStrategy[int]:
    """Write timestamps: mostly realistic microseconds since the epoch, sometimes any int64."""
    realistic = st.integers(1_400_000_000_000_000, 2_100_000_000_000_000)
    return st.one_of(realistic, realistic, st.integers(LONG_MIN, LONG_MAX))


@functools.cache
def local_deletion_times(version: int) -> st.SearchStrategy[int]:
    """Seconds: int32 for commit log versions 6/7, unsigned 32-bit (< 2^32-1) for version 8."""
    realistic = st.integers(1_400_000_000, 2_100_000_000)
    if version >= 8:
        return st.one_of(realistic, realistic, st.integers(0, UINT_DELETION_TIME_MAX))
    return st.one_of(realistic, realistic, st.integers(INT_MIN, INT_MAX))


@functools.cache
def ttls() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(1, 20 * 365 * 86400), st.integers(1, INT_MAX - 1))


@functools.cache
def deletion_times(version: int) -> st.SearchStrategy[DeletionTime]:
    # Long.MIN_VALUE marks DeletionTime.LIVE (no deletion): never a real deletion's timestamp.
    return st.builds(DeletionTime, timestamps().filter(lambda ts: ts != LONG_MIN),
                     local_deletion_times(version))


@functools.cache
def optional_deletion_times(version: int) -> st.SearchStrategy[DeletionTime | None]:
    return st.none() | deletion_times(version)


@functools.cache
def optional_liveness_infos(version: int) -> st.SearchStrategy[LivenessInfo | None]:
    return st.none() | liveness_infos(version)


@functools.cache
def liveness_infos(version: int) -> st.SearchStrategy[LivenessInfo]:
    """Row markers: plain, expiring, or the materialized-view "expired liveness" (TTL Integer.MAX_VALUE)."""
    return st.one_of(
        st.builds(LivenessInfo, timestamps()),
        st.builds(LivenessInfo, timestamps(), ttls(), local_deletion_times(version)),
        st.builds(LivenessInfo, timestamps(), st.just(EXPIRED_LIVENESS_TTL), local_deletion_times(version)),
    )


# --- rows, cells, markers -----------------------------------------------------------------------------


@_bounded_cache
def values_or_empty(cql_type: CqlType) -> st.SearchStrategy[bytes]:
    """Value bytes of ``cql_type``, sometimes the empty value (b"")."""
    return st.one_of(value_bytes(cql_type), value_bytes(cql_type), st.just(b""))


@_bounded_cache
def clusterings(columns: tuple[ColumnMetadata, ...], *,
                allow_null: bool = False) -> st.SearchStrategy[Clustering]:
    """Clustering values (or a marker's prefix): value bytes, sometimes empty (b"") or null (None)."""
    return st.tuples(*(values_or_empty(c.type) | st.none() if allow_null else values_or_empty(c.type)
                       for c in columns))


_CELL_KINDS = st.sampled_from(("live", "expiring", "tombstone"))
_COUNTER_CELL_KINDS = st.sampled_from(("live", "tombstone"))


@st.composite
def cells(draw: st.DrawFn, column: ColumnMetadata, liveness: LivenessInfo | None, version: int,
          value: st.SearchStrategy[bytes], path: bytes | None = None) -> Cell:
    """A live, expiring or deleted cell; it often shares the row's timestamp (USE_ROW_TIMESTAMP) and, when
    both expire, sometimes the row's TTL and expiry (USE_ROW_TTL). Counter cells never expire."""
    kind = draw(_COUNTER_CELL_KINDS if column.type.is_counter else _CELL_KINDS)
    if liveness is not None and draw(st.booleans()):
        timestamp = liveness.timestamp
    else:
        timestamp = draw(timestamps())
    if kind == "tombstone":
        deleted_at = draw(local_deletion_times(version))
        return Cell(column, timestamp, b"", local_deletion_time=deleted_at, path=path)
    data = draw(value)
    if kind == "live":
        return Cell(column, timestamp, data, path=path)
    if liveness is not None and liveness.is_expiring and draw(st.booleans()):
        ttl, expiry = liveness.ttl, liveness.local_expiration_time
    else:
        ttl, expiry = draw(ttls()), draw(local_deletion_times(version))
    return Cell(column, timestamp, data, ttl, expiry, path)


@_bounded_cache
def _cell_paths_and_values(cql_type: CqlType) \
        -> st.SearchStrategy[tuple[bytes, st.SearchStrategy[bytes]]]:
    """(cell path, strategy for the cell's value) of one element of a multi-cell column
    (docs/storage-format.md §11.3)."""
    kind, parameters = cql_type.kind, cql_type.parameters
    if kind == "list":
        return st.tuples(st.uuids(version=1).map(lambda u: u.bytes), st.just(values_or_empty(parameters[0])))
    if kind == "set":
        return st.tuples(value_bytes(parameters[0]), st.just(st.just(b"")))
    if kind == "map":
        return st.tuples(value_bytes(parameters[0]), st.just(values_or_empty(parameters[1])))
    if kind == "udt":
        return st.integers(0, len(parameters) - 1).map(
            lambda index: (index.to_bytes(2, "big"), values_or_empty(parameters[index])))
    raise ValueError(f"{cql_type.cql} is not a multi-cell type")


@st.composite
def complex_columns(draw: st.DrawFn, column: ColumnMetadata, liveness: LivenessInfo | None,
                    version: int) -> ComplexColumn:
    """Cells of a non-frozen collection or UDT (distinct paths), and/or its complex deletion."""
    elements = draw(st.lists(_cell_paths_and_values(column.type), max_size=4, unique_by=lambda pv: pv[0]))
    column_cells = [draw(cells(column, liveness, version, value, path)) for path, value in elements]
    deletion = draw(optional_deletion_times(version) if column_cells else deletion_times(version))
    return ComplexColumn(column, column_cells, deletion)


def column_data(column: ColumnMetadata, liveness: LivenessInfo | None,
                version: int) -> st.SearchStrategy[Cell | ComplexColumn]:
    if column.is_complex:
        return complex_columns(column, liveness, version)
    return cells(column, liveness, version, values_or_empty(column.type))


@_bounded_cache
def ordered_subsets(columns: tuple[ColumnMetadata, ...]) -> st.SearchStrategy[list[ColumnMetadata]]:
    """A subset of ``columns`` in their order; any size (so both large-subset encodings occur)."""
    if not columns:
        return st.just([])
    indexes = st.integers(0, len(columns)).flatmap(
        lambda size: st.lists(st.integers(0, len(columns) - 1), min_size=size, max_size=size, unique=True))
    return st.one_of(st.just(list(columns)), indexes.map(lambda chosen: [columns[i] for i in sorted(chosen)]))


@st.composite
def rows(draw: st.DrawFn, table: TableMetadata, header: tuple[ColumnMetadata, ...], version: int, *,
         static: bool = False) -> Row:
    """A row with cells for a subset of ``header`` (in header order). Regular rows may carry a row
    marker (liveness) and a row deletion, possibly shadowable; counter tables write no row markers."""
    if static:
        columns = draw(ordered_subsets(header).filter(bool))
        return Row((), [draw(column_data(c, None, version)) for c in columns], is_static=True)
    clustering = draw(clusterings(table.clustering, allow_null=True))
    liveness = None if table.is_counter else draw(optional_liveness_infos(version))
    deletion = draw(optional_deletion_times(version))
    shadowable = deletion is not None and not table.is_counter and draw(st.booleans())
    columns = draw(ordered_subsets(header))
    return Row(clustering, [draw(column_data(c, liveness, version)) for c in columns], liveness, deletion,
               shadowable)


@st.composite
def range_tombstone_markers(draw: st.DrawFn, table: TableMetadata, version: int) -> RangeTombstoneMarker:
    """A bound (incl./excl. start/end; the bottom and top bounds have no values) or a boundary, whose
    clustering is a prefix of the table's clustering columns."""
    kind = draw(st.sampled_from(list(BoundKind)))
    smallest = 0 if kind in (BoundKind.INCL_START_BOUND, BoundKind.INCL_END_BOUND) else 1
    size = draw(st.integers(smallest, len(table.clustering)))
    clustering = draw(clusterings(table.clustering[:size]))
    open_deletion = draw(deletion_times(version)) if kind.opens else None
    close_deletion = draw(deletion_times(version)) if kind.closes else None
    return RangeTombstoneMarker(kind, clustering, open_deletion, close_deletion)


@_bounded_cache
def header_columns(columns: tuple[ColumnMetadata, ...], *, min_size: int = 0) \
        -> st.SearchStrategy[tuple[ColumnMetadata, ...]]:
    """A partition update's column list: all or some of ``columns``, in Cassandra's column order."""
    chosen = ordered_subsets(columns).filter(lambda subset: len(subset) >= min_size)
    return chosen.map(lambda subset: tuple(sorted(subset, key=ColumnMetadata.sort_key)))


@st.composite
def partition_updates(draw: st.DrawFn, table: TableMetadata, key: bytes, version: int) -> PartitionUpdate:
    """One table's update of partition ``key``: maybe a partition deletion, maybe a static row, and rows
    and (with clustering columns) range tombstone markers."""
    regulars = tuple(c for c in table.regular_and_static if not c.is_static)
    statics = tuple(c for c in table.regular_and_static if c.is_static)
    regular_header = draw(header_columns(regulars))
    static_header: tuple[ColumnMetadata, ...] = ()
    static_row = None
    if statics and draw(st.booleans()):
        static_header = draw(header_columns(statics, min_size=1))
        static_row = draw(rows(table, static_header, version, static=True))
    partition_deletion = draw(optional_deletion_times(version))
    row = rows(table, regular_header, version)
    if table.clustering:
        unfiltereds = draw(st.lists(st.one_of(row, range_tombstone_markers(table, version)), max_size=4))
    else:
        unfiltereds = draw(st.lists(row, max_size=1))
    update = PartitionUpdate(table, key, unfiltereds, static_row, partition_deletion, regular_header,
                             static_header)
    if update.is_empty:
        update.regular_columns = ()  # an empty update is written as a bare IS_EMPTY flag, without columns
    return update


def partition_keys(table: TableMetadata) -> st.SearchStrategy[bytes]:
    """Partition key bytes: the value of a single key column (never empty), or a composite key."""
    if len(table.partition_key) == 1:
        return value_bytes(table.partition_key[0].type).filter(bool)
    components = st.tuples(*(st.one_of(value_bytes(c.type), st.just(b"")) for c in table.partition_key))
    return components.map(lambda parts: table.compose_partition_key(list(parts)))


@st.composite
def mutations(draw: st.DrawFn, tables: TableMetadata | Sequence[TableMetadata], version: int) -> Mutation:
    """A mutation of one partition key: one partition update per chosen table (one or several of
    ``tables``, which must share keyspace and partition key columns, e.g. from :func:`related_tables`)."""
    candidates = [tables] if isinstance(tables, TableMetadata) else list(tables)
    chosen = draw(st.permutations(candidates).flatmap(
        lambda shuffled: st.integers(1, len(shuffled)).map(lambda count: shuffled[:count])))
    key = draw(partition_keys(chosen[0]))
    return Mutation([draw(partition_updates(table, key, version)) for table in chosen])

