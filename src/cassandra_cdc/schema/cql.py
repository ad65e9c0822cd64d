"""Table metadata from CQL text: what cqlsh ``DESCRIBE KEYSPACE`` / ``DESCRIBE SCHEMA`` prints, 3.0 to 5.0.

Example::

    schema = load_schema_files(["schema.cql"])
    table = schema.table("shop", "orders")

Statements read:

* ``CREATE KEYSPACE``, ``ALTER KEYSPACE`` (replication, durable_writes), ``USE``;
* ``CREATE TYPE`` (fields may use types declared before);
* ``CREATE TABLE`` with every column type and ``WITH`` option: ``ID``, ``CLUSTERING ORDER BY``, ``COMPACT
  STORAGE``, ``cdc``, DataStax's ``DROPPED COLUMN RECORD``; any other option is kept as CQL text in
  ``TableMetadata.options``. Column masks (``MASKED WITH``, 5.0) are ignored;
* ``CREATE MATERIALIZED VIEW ... AS SELECT ... FROM base ... PRIMARY KEY (...)``: a table of its own, with
  the column types of its base table (which must be declared before);
* ``ALTER TABLE`` ``ADD``, ``DROP [USING TIMESTAMP]``, ``RENAME``, ``WITH``, ``DROP COMPACT STORAGE``,
  applied to the table declared before (``DESCRIBE ... WITH INTERNALS`` records dropped columns so);
* indexes, functions, aggregates, triggers, roles, users and permissions are skipped.

Anything else (``DROP TABLE``, ``ALTER TYPE``, DML) is a :class:`SchemaError`, as is any statement that
Cassandra would reject in a way that changes the table's layout.

A table without ``ID =`` (plain ``DESCRIBE`` prints none) gets the name-based id
:func:`~.model.system_table_id` gives. That matches the ids of system tables only: the id of a table created
by CQL is random, so mutations of such a table are found only through ``DESCRIBE ... WITH INTERNALS``
output or :func:`~.system_schema.fetch_schema`. A ``CREATE TABLE`` of a table already known replaces it
(``IF NOT EXISTS`` keeps the known one); an ``ALTER TABLE ... DROP`` without ``USING TIMESTAMP`` records the
drop at the current time, as Cassandra would.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Iterable, NamedTuple

from .model import (ColumnKind, ColumnMetadata, KeyspaceMetadata, Schema, SchemaError, TableMetadata,
                    compact_table_columns, system_table_id)
from .types import CqlType, CqlTypeError, parse_type, quote, user_type

# --- tokens ---------------------------------------------------------------------------------------


class _Token(NamedTuple):
    kind: str  # ident, qident, string, number, uuid, hex, punct, eof
    text: str  # as written
    line: int

    @property
    def keyword(self) -> str | None:
        """The lower-cased word if this is an unquoted identifier (keywords are case-insensitive)."""
        return self.text.lower() if self.kind == "ident" else None


_LEXEMES = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>(?:--|//)[^\n]*|/\*.*?\*/)
  | (?P<qident>"(?:[^"]|"")*")
  | (?P<string>'(?:[^']|'')*'|\$\$.*?\$\$)
  | (?P<uuid>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![\w-]))
  | (?P<hex>0[xX][0-9a-fA-F]*)
  | (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<punct>\S)
""", re.VERBOSE | re.DOTALL)

_UNTERMINATED = {"'": "string", '"': "quoted identifier", "$$": "$$ string", "/*": "comment"}


def _tokenize(text: str, source: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, line = 0, 1
    while pos < len(text):
        match = _LEXEMES.match(text, pos)
        assert match is not None  # the punct alternative matches any non-space character
        kind, lexeme = match.lastgroup or "", match.group()
        if kind == "punct":
            opening = next((o for o in _UNTERMINATED if text.startswith(o, pos)), None)
            if opening:
                raise SchemaError(f"unterminated {_UNTERMINATED[opening]}", source, line)
        if kind not in ("space", "comment"):
            tokens.append(_Token(kind, lexeme, line))
        line += lexeme.count("\n")
        pos = match.end()
    tokens.append(_Token("eof", "", line))
    return tokens


# --- parser ---------------------------------------------------------------------------------------

@dataclass
class _ColumnDef:
    name: str
    type: CqlType
    static: bool
    line: int


@dataclass
class _TableDef:
    """A parsed ``CREATE TABLE``/``MATERIALIZED VIEW`` before it becomes a :class:`TableMetadata`."""

    keyspace: str
    name: str
    line: int
    columns: dict[str, _ColumnDef]
    partition_key: list[str]
    clustering: list[str]
    order: list[tuple[str, bool]]  # CLUSTERING ORDER BY: name, descending
    table_id: uuid.UUID | None = None
    compact: bool = False
    cdc: bool = False
    dropped: tuple[ColumnMetadata, ...] = ()
    options: dict[str, str] = field(default_factory=dict)


class _Parser:
    def __init__(self, text: str, schema: Schema, source: str) -> None:
        self.source = source
        self.schema = schema
        self.tokens = _tokenize(text, source)
        self.pos = 0
        self.statement_start = 0
        self.default_keyspace: str | None = None

    # --- token helpers ----------------------------------------------------------------------------

    @property
    def token(self) -> _Token:
        return self.tokens[self.pos]

    def advance(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def error(self, message: str, token: _Token | None = None) -> SchemaError:
        return SchemaError(message, self.source, (token or self.token).line)

    def at(self, *words: str) -> bool:
        tokens = self.tokens[self.pos:self.pos + len(words)]
        return len(tokens) == len(words) and all(t.keyword == w for t, w in zip(tokens, words))

    def accept(self, *words: str) -> bool:
        if self.at(*words):
            self.pos += len(words)
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            raise self.error(f"expected {' '.join(words).upper()}, found {self._describe(self.token)}")

    def accept_punct(self, char: str) -> bool:
        if self.token.kind == "punct" and self.token.text == char:
            self.pos += 1
            return True
        return False

    def expect_punct(self, char: str) -> None:
        if not self.accept_punct(char):
            raise self.error(f"expected '{char}', found {self._describe(self.token)}")

    @staticmethod
    def _describe(token: _Token) -> str:
        return "end of input" if token.kind == "eof" else repr(token.text)

    def identifier(self) -> str:
        token = self.advance()
        if token.kind == "ident":
            return token.text.lower()
        if token.kind == "qident":
            return token.text[1:-1].replace('""', '"')
        raise self.error(f"expected a name, found {self._describe(token)}", token)

    def qualified_name(self) -> tuple[str, str]:
        token = self.token
        first = self.identifier()
        if self.accept_punct("."):
            return first, self.identifier()
        if self.default_keyspace is None:
            raise self.error(f"{quote(first)} is not qualified by a keyspace and no USE statement came "
                             "before", token)
        return self.default_keyspace, first

    def integer(self) -> int:
        negative = self.accept_punct("-")
        token = self.advance()
        if token.kind != "number" or not token.text.isdigit():
            raise self.error(f"expected an integer, found {self._describe(token)}", token)
        return -int(token.text) if negative else int(token.text)

    def boolean(self) -> bool:
        token = self.advance()
        if token.keyword not in ("true", "false"):
            raise self.error(f"expected true or false, found {self._describe(token)}", token)
        return token.keyword == "true"

    def string(self) -> str:
        token = self.advance()
        if token.kind != "string" or token.text.startswith("$$"):
            raise self.error(f"expected a string, found {self._describe(token)}", token)
        return token.text[1:-1].replace("''", "'")

    # --- terms (option values) ----------------------------------------------------------------------

    def term(self) -> str:
        """An option value as canonical CQL text (so equal values compare equal whatever their spacing)."""
        token = self.token
        if self.accept_punct("{"):
            return "{" + ", ".join(self._items("}", map_entries=True)) + "}"
        if self.accept_punct("["):
            return "[" + ", ".join(self._items("]", map_entries=False)) + "]"
        if self.accept_punct("("):
            return "(" + ", ".join(self._items(")", map_entries=False)) + ")"
        if self.accept_punct("-"):
            number = self.advance()
            if number.kind != "number" and number.keyword not in ("nan", "infinity"):
                raise self.error(f"expected a number after '-', found {self._describe(number)}", number)
            return "-" + number.text.lower()
        self.advance()
        if token.kind == "string":
            if token.text.startswith("$$"):
                return token.text
            return cql_literal(token.text[1:-1].replace("''", "'"))
        if token.kind == "ident":
            return token.text.lower()
        if token.kind in ("number", "uuid", "qident"):
            return token.text
        if token.kind == "hex":
            return token.text.lower()
        raise self.error(f"expected a value, found {self._describe(token)}", token)

    def _items(self, closing: str, map_entries: bool) -> list[str]:
        items: list[str] = []
        while not self.accept_punct(closing):
            if items:
                self.expect_punct(",")
            item = self.term()
            if map_entries and self.accept_punct(":"):
                item += ": " + self.term()
            items.append(item)
        return items

    def string_map(self) -> dict[str, str]:
        """A map of strings (numbers allowed as values), e.g. a keyspace's replication."""
        self.expect_punct("{")
        result: dict[str, str] = {}
        while not self.accept_punct("}"):
            if result:
                self.expect_punct(",")
            key = self.string()
            self.expect_punct(":")
            result[key] = self.string() if self.token.kind == "string" else self.term()
        return result

    # --- types ------------------------------------------------------------------------------------

    def cql_type(self, keyspace: str) -> CqlType:
        """A type expression, handed to :func:`parse_type` with the keyspace's user types."""
        first = self.token
        parts = [self.advance().text]
        if self.token.kind == "punct" and self.token.text == ".":
            parts += [self.advance().text, self.advance().text]
        if self.token.kind == "punct" and self.token.text == "<":
            depth = 0
            while True:
                token = self.advance()
                if token.kind == "eof":
                    raise self.error("unclosed '<' in a type", first)
                parts.append(token.text)
                depth += (token.text == "<") - (token.text == ">") if token.kind == "punct" else 0
                if depth == 0:
                    break
        text = " ".join(parts)
        try:
            return parse_type(text, keyspace, self.schema.keyspace(keyspace).user_types)
        except CqlTypeError as e:
            raise self.error(str(e), first) from None

    # --- statements -------------------------------------------------------------------------------

    def parse(self) -> None:
        while self.token.kind != "eof":
            if self.accept_punct(";"):
                continue
            self.statement()
            if self.token.kind != "eof":
                self.expect_punct(";")

    def statement(self) -> None:
        self.statement_start = self.pos
        if self.accept("create"):
            self.create()
        elif self.accept("alter"):
            self.alter()
        elif self.accept("use"):
            self.default_keyspace = self.identifier()
        elif self.token.keyword in ("grant", "revoke", "list") or self._at_skipped_drop():
            self.skip()
        else:
            raise self.unsupported()

    @property
    def statement_line(self) -> int:
        return self.tokens[self.statement_start].line

    def _at_skipped_drop(self) -> bool:
        skipped = ("index", "function", "aggregate", "trigger", "role", "user")
        return any(self.at("drop", what) for what in skipped)

    def unsupported(self) -> SchemaError:
        head = self.tokens[self.statement_start:self.statement_start + 3]
        words = " ".join(t.text for t in head if t.kind == "ident").upper() or repr(head[0].text)
        return SchemaError(f"unsupported statement {words}", self.source, self.statement_line)

    def skip(self) -> None:
        """Skip a statement that does not shape tables (strings and $$ bodies are single tokens)."""
        while self.token.kind != "eof" and not (self.token.kind == "punct" and self.token.text == ";"):
            self.advance()

    def create(self) -> None:
        if self.accept("keyspace") or self.accept("schema"):
            self.create_keyspace()
        elif self.accept("type"):
            self.create_type()
        elif self.accept("table") or self.accept("columnfamily"):
            self.create_table()
        elif self.accept("materialized", "view"):
            self.create_view()
        elif self.token.keyword in ("index", "custom", "function", "aggregate", "or", "trigger", "role",
                                    "user"):
            self.skip()  # [CUSTOM] INDEX, [OR REPLACE] FUNCTION / AGGREGATE, ...
        else:
            raise self.unsupported()

    def alter(self) -> None:
        if self.accept("table") or self.accept("columnfamily"):
            self.alter_table()
        elif self.accept("keyspace") or self.accept("schema"):
            self.alter_keyspace()
        elif self.accept("materialized", "view"):
            self.alter_view()
        elif self.token.keyword in ("role", "user"):
            self.skip()
        else:
            raise self.unsupported()

    # --- keyspaces and types -----------------------------------------------------------------------

    def create_keyspace(self) -> None:
        if_not_exists = self.accept("if", "not", "exists")
        name = self.identifier()
        keyspace = KeyspaceMetadata(name)
        self.expect("with")
        self.keyspace_options(keyspace)
        if not (if_not_exists and name in self.schema.keyspaces):
            self.schema.add_keyspace(keyspace)

    def alter_keyspace(self) -> None:
        self.accept("if", "exists")
        name = self.identifier()
        self.expect("with")
        self.keyspace_options(self.schema.keyspace(name))

    def keyspace_options(self, keyspace: KeyspaceMetadata) -> None:
        while True:
            option = self.identifier()
            self.expect_punct("=")
            if option == "replication":
                keyspace.replication = self.string_map()
            elif option == "durable_writes":
                keyspace.durable_writes = self.boolean()
            else:
                self.term()  # e.g. DataStax's graph_engine: no bearing on tables
            if not self.accept("and"):
                return

    def create_type(self) -> None:
        if_not_exists = self.accept("if", "not", "exists")
        keyspace, name = self.qualified_name()
        self.expect_punct("(")
        fields: dict[str, CqlType] = {}
        while True:
            field_token = self.token
            field_name = self.identifier()
            if field_name in fields:
                raise self.error(f"field {quote(field_name)} of type {quote(name)} is declared twice",
                                 field_token)
            fields[field_name] = self.cql_type(keyspace)
            if not self.accept_punct(","):
                break
        self.expect_punct(")")
        user_types = self.schema.keyspace(keyspace).user_types
        if not (if_not_exists and name in user_types):
            user_types[name] = user_type(keyspace, name, fields)

    # --- tables -----------------------------------------------------------------------------------

    def create_table(self) -> None:
        if_not_exists = self.accept("if", "not", "exists")
        keyspace, name = self.qualified_name()
        definition = _TableDef(keyspace, name, self.statement_line, {}, [], [], [])
        self.expect_punct("(")
        while True:
            if self.accept("primary", "key"):
                self.primary_key(definition)
            else:
                self.column_definition(definition)
            if not self.accept_punct(","):
                break
        self.expect_punct(")")
        if self.accept("with"):
            self.table_properties(definition)
        if if_not_exists and self.schema.table(keyspace, name) is not None:
            return
        self.schema.add_table(self.build_table(definition))

    def column_definition(self, definition: _TableDef) -> None:
        token = self.token
        name = self.identifier()
        if name in definition.columns:
            raise self.error(f"column {quote(name)} is declared twice", token)
        column = _ColumnDef(name, self.cql_type(definition.keyspace), False, token.line)
        definition.columns[name] = column
        while True:
            if self.accept("static"):
                column.static = True
            elif self.accept("primary", "key"):
                self._set_primary_key(definition, [name], [], token)
            elif self.accept("masked", "with"):
                self.skip_mask()
            else:
                return

    def skip_mask(self) -> None:
        """A 5.0 column mask: ``MASKED WITH DEFAULT`` or ``MASKED WITH [ks.]function(args)``."""
        if self.accept("default"):
            return
        self.identifier()
        if self.accept_punct("."):
            self.identifier()
        self.expect_punct("(")
        self._items(")", map_entries=False)

    def primary_key(self, definition: _TableDef) -> None:
        token = self.token
        self.expect_punct("(")
        if self.accept_punct("("):
            partition_key = self.name_list()
        else:
            partition_key = [self.identifier()]
        clustering = []
        while self.accept_punct(","):
            clustering.append(self.identifier())
        self.expect_punct(")")
        self._set_primary_key(definition, partition_key, clustering, token)

    def _set_primary_key(self, definition: _TableDef, partition_key: list[str], clustering: list[str],
                         token: _Token) -> None:
        if definition.partition_key:
            raise self.error(f"{definition.name} has more than one PRIMARY KEY", token)
        definition.partition_key, definition.clustering = partition_key, clustering

    def names(self) -> list[str]:
        """Comma-separated names."""
        names = [self.identifier()]
        while self.accept_punct(","):
            names.append(self.identifier())
        return names

    def name_list(self) -> list[str]:
        """Names up to and including a ')'."""
        names = self.names()
        self.expect_punct(")")
        return names

    def table_properties(self, definition: _TableDef) -> None:
        while True:
            if self.accept("compact", "storage"):
                definition.compact = True
            elif self.accept("clustering", "order", "by"):
                definition.order = self.clustering_order()
            elif self.accept("dropped", "column", "record"):
                definition.dropped += (self.dropped_column_record(definition.keyspace),)
            else:
                option = self.identifier()
                self.expect_punct("=")
                self.table_option(definition, option)
            if not self.accept("and"):
                return

    def table_option(self, definition: _TableDef, option: str) -> None:
        if option == "id":
            definition.table_id = self.table_id()
        elif option == "cdc":
            definition.cdc = self.boolean()
        else:
            definition.options[option] = self.term()

    def table_id(self) -> uuid.UUID:
        token = self.advance()
        text = token.text[1:-1] if token.kind == "string" else token.text
        try:
            return uuid.UUID(text)
        except ValueError:
            raise self.error(f"invalid table ID {token.text}", token) from None

    def clustering_order(self) -> list[tuple[str, bool]]:
        self.expect_punct("(")
        order = []
        while True:
            name = self.identifier()
            descending = self.accept("desc")
            if not descending:
                self.accept("asc")
            order.append((name, descending))
            if not self.accept_punct(","):
                break
        self.expect_punct(")")
        return order

    def dropped_column_record(self, keyspace: str) -> ColumnMetadata:
        """DataStax's ``DROPPED COLUMN RECORD name type [static] USING TIMESTAMP t``."""
        name = self.identifier()
        column_type = self.cql_type(keyspace)
        kind = ColumnKind.STATIC if self.accept("static") else ColumnKind.REGULAR
        self.expect("using", "timestamp")
        return ColumnMetadata(name, column_type, kind, dropped_time=self.integer())

    def build_table(self, d: _TableDef) -> TableMetadata:
        key_names = d.partition_key + d.clustering
        self._check_key(d, key_names)
        descending = self._descending(d)
        partition_key = tuple(ColumnMetadata(n, d.columns[n].type, ColumnKind.PARTITION_KEY, i)
                              for i, n in enumerate(d.partition_key))
        clustering = tuple(ColumnMetadata(n, d.columns[n].type, ColumnKind.CLUSTERING, i, n in descending)
                           for i, n in enumerate(d.clustering))
        others = [c for n, c in d.columns.items() if n not in key_names]
        self._check_columns(d, others)
        regular = [ColumnMetadata(c.name, c.type, ColumnKind.STATIC if c.static else ColumnKind.REGULAR)
                   for c in others]
        if d.compact:
            clustering, regular = compact_table_columns(clustering, regular, reserved_names=d.partition_key)
        return TableMetadata(d.keyspace, d.name, d.table_id or system_table_id(d.keyspace, d.name),
                             partition_key, clustering, tuple(regular), d.dropped, d.cdc, d.compact,
                             d.options)

    def _check_key(self, d: _TableDef, key_names: list[str]) -> None:
        if not d.partition_key:
            raise SchemaError(f"{d.name} has no PRIMARY KEY", self.source, d.line)
        for key in key_names:
            if key not in d.columns:
                raise SchemaError(f"PRIMARY KEY column {quote(key)} of {d.name} is not declared",
                                  self.source, d.line)
            if key_names.count(key) > 1:
                raise SchemaError(f"{quote(key)} appears twice in the PRIMARY KEY of {d.name}",
                                  self.source, d.line)
            if d.columns[key].static:
                raise SchemaError(f"static column {quote(key)} cannot be part of the PRIMARY KEY",
                                  self.source, d.columns[key].line)
            if d.columns[key].type.is_counter:
                raise SchemaError(f"counter column {quote(key)} cannot be part of the PRIMARY KEY",
                                  self.source, d.columns[key].line)

    def _descending(self, d: _TableDef) -> set[str]:
        for index, (name, _) in enumerate(d.order):
            if index >= len(d.clustering) or d.clustering[index] != name:
                raise SchemaError(f"CLUSTERING ORDER BY of {d.name} must list clustering columns in their "
                                  f"PRIMARY KEY order; found {quote(name)}", self.source, d.line)
        return {name for name, desc in d.order if desc}

    def _check_columns(self, d: _TableDef, others: list[_ColumnDef]) -> None:
        """Reject what Cassandra rejects where it would change the storage layout."""
        counters = [c.type.is_counter for c in others]
        if any(counters) and not all(counters):
            raise SchemaError(f"{d.name} mixes counter and non-counter columns", self.source, d.line)
        statics = [c for c in others if c.static]
        if d.compact and statics:
            raise SchemaError("static columns are not supported in COMPACT STORAGE tables", self.source,
                              statics[0].line)
        if statics and not d.clustering:
            raise SchemaError(f"static column {quote(statics[0].name)} needs clustering columns in the table",
                              self.source, statics[0].line)
        if d.compact and d.clustering and len(others) > 1:
            raise SchemaError(f"COMPACT STORAGE table {d.name} with clustering columns allows at most one "
                              "other column", self.source, d.line)
        if d.compact and not d.clustering and not others:
            raise SchemaError(f"COMPACT STORAGE table {d.name} without clustering columns needs a column "
                              "outside the PRIMARY KEY", self.source, d.line)

    # --- materialized views -------------------------------------------------------------------------

    def create_view(self) -> None:
        if_not_exists = self.accept("if", "not", "exists")
        keyspace, name = self.qualified_name()
        self.expect("as", "select")
        selected = None if self.accept_punct("*") else self.names()
        self.expect("from")
        base_token = self.token
        base_keyspace, base_name = self.qualified_name()
        base = self.schema.table(base_keyspace, base_name)
        if base is None:
            raise self.error(f"base table {base_keyspace}.{quote(base_name)} of view {quote(name)} is not "
                             "declared before it", base_token)
        if self.accept("where"):
            while not self.at("primary", "key"):
                if self.token.kind == "eof" or self.token == _Token("punct", ";", self.token.line):
                    raise self.error(f"view {quote(name)} has no PRIMARY KEY")
                self.advance()
        definition = _TableDef(keyspace, name, self.statement_line, {}, [], [], [])
        self.expect("primary", "key")
        self.primary_key(definition)
        if self.accept("with"):
            self.table_properties(definition)
        # A view's columns are those of its base table: selected ones, and its primary key.
        base_columns = {c.name: c for c in base.columns if c not in base.hidden_columns}
        wanted = list(base_columns) if selected is None else selected
        for column_name in dict.fromkeys(definition.partition_key + definition.clustering + wanted):
            if column_name not in base_columns:
                raise SchemaError(f"view {quote(name)} uses {quote(column_name)}, not a column of "
                                  f"{base.qualified_name}", self.source, self.statement_line)
            definition.columns[column_name] = _ColumnDef(column_name, base_columns[column_name].type, False,
                                                         self.statement_line)
        if if_not_exists and self.schema.table(keyspace, name) is not None:
            return
        self.schema.add_table(self.build_table(definition))

    def alter_view(self) -> None:
        self.accept("if", "exists")
        token = self.token
        table = self.existing_table(*self.qualified_name(), token)
        self.expect("with")
        self.alter_properties(table, token)

    # --- ALTER TABLE ------------------------------------------------------------------------------

    def alter_table(self) -> None:
        if_exists = self.accept("if", "exists")
        token = self.token
        keyspace, name = self.qualified_name()
        if if_exists and self.schema.table(keyspace, name) is None:
            self.skip()
            return
        table = self.existing_table(keyspace, name, token)
        action = self.token
        if self.accept("add"):
            self.alter_add(table)
        elif self.accept("drop", "compact", "storage"):
            self.schema.add_table(replace(table, compact_storage=False))
        elif self.accept("drop"):
            self.alter_drop(table)
        elif self.accept("rename"):
            self.alter_rename(table)
        elif self.accept("with"):
            self.alter_properties(table, action)
        else:
            raise self.error(f"unsupported ALTER TABLE {self._describe(action)}", action)

    def existing_table(self, keyspace: str, name: str, token: _Token) -> TableMetadata:
        table = self.schema.table(keyspace, name)
        if table is None:
            raise self.error(f"table {keyspace}.{quote(name)} is not declared before", token)
        return table

    def alter_add(self, table: TableMetadata) -> None:
        if_not_exists = self.accept("if", "not", "exists")
        parenthesized = self.accept_punct("(")
        added = list(table.regular_and_static)
        while True:
            token = self.token
            name = self.identifier()
            column_type = self.cql_type(table.keyspace)
            static = self.accept("static") or table.is_static_compact
            exists = any(c.name == name for c in table.columns)
            if exists and not if_not_exists:
                raise self.error(f"{table.qualified_name} already has a column {quote(name)}", token)
            if table.compact_storage and not table.is_static_compact:
                raise self.error(f"cannot add columns to COMPACT STORAGE table {table.qualified_name}", token)
            if static and not table.clustering:
                raise self.error(f"static column {quote(name)} needs clustering columns in the table", token)
            if not exists:
                kind = ColumnKind.STATIC if static else ColumnKind.REGULAR
                added.append(ColumnMetadata(name, column_type, kind))
            if not (parenthesized and self.accept_punct(",")):
                break
        if parenthesized:
            self.expect_punct(")")
        self.schema.add_table(replace(table, regular_and_static=tuple(added)))

    def alter_drop(self, table: TableMetadata) -> None:
        if_exists = self.accept("if", "exists")
        token = self.token
        names = self.name_list() if self.accept_punct("(") else [self.identifier()]
        dropped_time = self.integer() if self.accept("using", "timestamp") else time.time_ns() // 1000
        if table.compact_storage:
            raise self.error(f"cannot drop columns of COMPACT STORAGE table {table.qualified_name}", token)
        current = {c.name: c for c in table.regular_and_static}
        for name in names:
            if any(c.name == name for c in table.primary_key):
                raise self.error(f"cannot drop PRIMARY KEY column {quote(name)} of {table.qualified_name}",
                                 token)
            if name not in current and not if_exists:
                raise self.error(f"{table.qualified_name} has no column {quote(name)} to drop", token)
        gone = [current[n] for n in names if n in current]
        # Cassandra keeps one record per name: the latest drop.
        dropped = [c for c in table.dropped if c.name not in names]
        dropped += [replace(c, dropped_time=dropped_time) for c in gone]
        self.schema.add_table(replace(table, dropped=tuple(dropped),
                                      regular_and_static=tuple(c for c in table.regular_and_static
                                                               if c.name not in names)))

    def alter_rename(self, table: TableMetadata) -> None:
        self.accept("if", "exists")
        renames: dict[str, str] = {}
        while True:
            token = self.token
            old = self.identifier()
            self.expect("to")
            renames[old] = self.identifier()
            if not any(c.name == old for c in table.primary_key):
                raise self.error(f"only PRIMARY KEY columns can be renamed; {quote(old)} is not one of "
                                 f"{table.qualified_name}", token)
            if not self.accept("and"):
                break
        self.schema.add_table(replace(
            table,
            partition_key=tuple(replace(c, name=renames.get(c.name, c.name)) for c in table.partition_key),
            clustering=tuple(replace(c, name=renames.get(c.name, c.name)) for c in table.clustering)))

    def alter_properties(self, table: TableMetadata, token: _Token) -> None:
        definition = _TableDef(table.keyspace, table.name, token.line, {}, [], [], [], cdc=table.cdc,
                               options=dict(table.options))
        while True:
            option_token = self.token
            option = self.identifier()
            if option in ("id", "compact", "clustering", "dropped"):
                raise self.error(f"{option.upper()} cannot be changed by ALTER", option_token)
            self.expect_punct("=")
            self.table_option(definition, option)
            if not self.accept("and"):
                break
        self.schema.add_table(replace(table, cdc=definition.cdc, options=definition.options))


# --- public API -----------------------------------------------------------------------------------

def parse_schema(text: str, schema: Schema | None = None, source: str = "<string>") -> Schema:
    """Read CQL schema statements into ``schema`` (a new one if None) and return it.

    ``source`` names the text in errors. On a :class:`SchemaError`, the statements before the faulty one
    have been applied to ``schema``.
    """
    schema = schema if schema is not None else Schema()
    _Parser(text, schema, source).parse()
    return schema


def load_schema_files(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> Schema:
    """One schema from CQL files, read in the given order (user types before the tables that use them)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    schema = Schema()
    for path in paths:
        with open(path, encoding="utf-8") as file:
            parse_schema(file.read(), schema, source=os.fspath(path))
    return schema


def cql_literal(value: object) -> str:
    """A Python value (as the driver returns ``system_schema`` rows) as CQL text, as :meth:`_Parser.term`
    writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (int, uuid.UUID)):
        return str(value)
    if hasattr(value, "items"):
        return "{" + ", ".join(f"{cql_literal(k)}: {cql_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(cql_literal(v) for v in value) + "]"
    if isinstance(value, (set, frozenset)) or hasattr(value, "isdisjoint"):
        return "{" + ", ".join(cql_literal(v) for v in value) + "}"
    raise TypeError(f"no CQL literal for {value!r}")
