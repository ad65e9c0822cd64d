"""Table metadata for decoding commit logs: from CQL schema files or from a live cluster's system_schema."""

from .cql import load_schema_files, parse_schema
from .model import ColumnKind, ColumnMetadata, KeyspaceMetadata, Schema, SchemaError, TableMetadata
from .system_schema import fetch_schema, schema_from_system_schema_rows
from .types import CqlType, CqlTypeError, parse_type

__all__ = [
    "ColumnKind", "ColumnMetadata", "CqlType", "CqlTypeError", "KeyspaceMetadata", "Schema", "SchemaError",
    "TableMetadata", "fetch_schema", "load_schema_files", "parse_schema", "parse_type",
    "schema_from_system_schema_rows",
]
