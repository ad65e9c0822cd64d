"""Table metadata for reading an SSTable: from its Statistics.db header alone, or a schema bound to it.

The header records the type every column was *written* with, which is what decoding needs: a schema
that changed since (columns added, dropped, a UDT given more fields) still reads older SSTables, because
values are decoded with the recorded types and only names and kinds come from the schema.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from ..storage.serialization_header import SerializationHeader
from ..schema.model import ColumnKind, ColumnMetadata, TableMetadata, system_table_id
from ..schema.types import (is_reversed_class_name, type_from_class_name,
                            types_from_composite_class_name)
from .sstable_descriptor import Version
from .metadata import HeaderComponent


def table_from_header(header: HeaderComponent, keyspace: str, name: str,
                      table_id: uuid.UUID | None = None) -> TableMetadata:
    """A TableMetadata from Statistics.db alone.

    Regular and static columns keep their stored names; the names of the partition key and clustering
    columns are not recorded, so they are named as Cassandra names those of tables without CQL metadata:
    ``key`` (``key``, ``key2``, ... for a composite key) and ``column1``, ``column2``, ...
    """
    key_types = types_from_composite_class_name(header.key_type)
    partition_key = tuple(ColumnMetadata("key" if i == 0 else f"key{i + 1}", t, ColumnKind.PARTITION_KEY, i)
                          for i, t in enumerate(key_types))
    clustering = tuple(ColumnMetadata(f"column{i + 1}", type_from_class_name(t), ColumnKind.CLUSTERING, i,
                                      is_reversed_class_name(t))
                       for i, t in enumerate(header.clustering_types))
    columns = [ColumnMetadata(_name(n), type_from_class_name(t), ColumnKind.STATIC)
               for n, t in header.static_columns.items()]
    columns += [ColumnMetadata(_name(n), type_from_class_name(t), ColumnKind.REGULAR)
                for n, t in header.regular_columns.items()]
    return TableMetadata(keyspace, name, table_id or system_table_id(keyspace, name), partition_key, clustering,
                         tuple(columns))


def serialization_header(header: HeaderComponent, table: TableMetadata, version: Version) -> SerializationHeader:
    """The header Data.db's rows are decoded with: the stored column lists and types, named by ``table``.

    A column the table knows (or knows as dropped) keeps its metadata but takes the stored type; a column
    it does not know at all is read under its stored name and type. Rows list their columns in Cassandra's
    column order (that of ``Columns``: simple before complex, then by name), whatever order Statistics.db
    stores them in.
    """
    statics = table.sorted_columns(_bound_column(table, n, t, ColumnKind.STATIC)
                                   for n, t in header.static_columns.items())
    regulars = table.sorted_columns(_bound_column(table, n, t, ColumnKind.REGULAR)
                                    for n, t in header.regular_columns.items())
    if len(header.clustering_types) != len(table.clustering):
        raise ValueError(f"Statistics.db records {len(header.clustering_types)} clustering columns, "
                         f"{table.qualified_name} has {len(table.clustering)}: not this table's SSTable?")
    stored_key = types_from_composite_class_name(header.key_type)
    if len(stored_key) != len(table.partition_key):
        raise ValueError(f"Statistics.db records a partition key of {len(stored_key)} columns, "
                         f"{table.qualified_name} has {len(table.partition_key)}: not this table's SSTable?")
    result = SerializationHeader(table, version.header_version, header.stats, regulars, statics)
    result.clustering_types = tuple(type_from_class_name(t) for t in header.clustering_types)
    return result


def _bound_column(table: TableMetadata, name: bytes, class_name: str, kind: ColumnKind) -> ColumnMetadata:
    stored = type_from_class_name(class_name)
    column = table.column(name)
    if column is None:
        return ColumnMetadata(_name(name), stored, kind)
    if column.type != stored or column.kind is not kind:
        return replace(column, type=stored, kind=kind)
    return column


def _name(name: bytes) -> str:
    return name.decode("utf-8", "replace")


__all__ = ["serialization_header", "table_from_header"]
