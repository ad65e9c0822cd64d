"""A seeded, realistic CQL workload over a bounded key space, with strictly increasing write timestamps.

The mix resembles an application's: mostly inserts and updates of a few columns, collection changes,
some static column updates, a few TTLs of a few seconds, occasional column, row, range and partition
deletions; counter tables only get increments. Keys come from a fixed set per table (``keys``
partitions, ``rows_per_partition`` values per clustering column), so rows are written, overwritten and
deleted again. The same schema, seed and clock start give the same operations.

Operations, ``to_mutation``, ``TableModel`` and ``Cluster`` live in their own modules and are re-exported
here and from the package.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Iterator, Sequence

from ..schema import ColumnMetadata, Schema, TableMetadata
from .cluster import Cluster
from .model import TableModel
from .operations import (AddToSet, AppendToList, CounterAdd, DeleteColumns, DeletePartition, DeleteRange, DeleteRow,
                         Insert, Operation, PutInMap, RemoveFromSet, RemoveMapKeys, SetUdtFields, Update,
                         table_of, to_mutation)
from .ordering import order_key, serialize
from .values import ELEMENT_DOMAIN, key_value, random_value

DEFAULT_STEP_MICROS = 1000


class Clock:
    """The coordinators' clock: write timestamps in microseconds, strictly increasing.

    Each ``tick()`` returns the current time and moves it ``step_micros`` on; ``set``/``advance`` move it
    further (never back), e.g. to let TTLs expire between two writes.
    """

    def __init__(self, start_micros: int | None = None, step_micros: int = DEFAULT_STEP_MICROS) -> None:
        if step_micros < 1:
            raise ValueError("the clock must advance at every tick")
        self._now = start_micros if start_micros is not None else time.time_ns() // 1000
        self.step_micros = step_micros

    @property
    def now_micros(self) -> int:
        """The timestamp the next write gets."""
        return self._now

    @property
    def now_seconds(self) -> int:
        return self._now // 1_000_000

    def tick(self) -> int:
        timestamp = self._now
        self._now += self.step_micros
        return timestamp

    def set(self, micros: int) -> None:
        if micros < self._now:
            raise ValueError(f"the clock cannot go back from {self._now} to {micros}: timestamps would repeat")
        self._now = micros

    def advance(self, seconds: float) -> None:
        self.set(self._now + round(seconds * 1_000_000))


Generator = Callable[[TableMetadata], Operation]


class Workload:
    """An endless stream of operations on ``tables`` (qualified names; default: every table of the schema)."""

    def __init__(self, schema: Schema, seed: int, tables: Sequence[str] | None = None, keys: int = 100, *,
                 rows_per_partition: int = 5, clock: Clock | None = None, ttl_probability: float = 0.08,
                 ttl_seconds: tuple[int, int] = (1, 5)) -> None:
        self.schema = schema
        self.tables = ([table_of(schema, name) for name in tables] if tables is not None
                       else sorted(schema, key=lambda t: t.qualified_name))
        if not self.tables:
            raise ValueError("a workload needs at least one table")
        self.keys = keys
        self.rows_per_partition = rows_per_partition
        self.clock = clock if clock is not None else Clock()
        self.ttl_probability = ttl_probability
        self.ttl_seconds = ttl_seconds
        self.rng = random.Random(seed)
        self._mixes = {t.qualified_name: self._mix(t) for t in self.tables}

    def alter_schema(self, schema: Schema) -> None:
        """Write by the new definitions of the tables from now on (after ``Cluster.alter_schema``)."""
        self.schema = schema
        self.tables = [table_of(schema, t.qualified_name) for t in self.tables]
        self._mixes = {t.qualified_name: self._mix(t) for t in self.tables}

    def __iter__(self) -> Iterator[Operation]:
        while True:
            yield self.next()

    def next(self) -> Operation:
        table = self.rng.choice(self.tables)
        generators, weights = self._mixes[table.qualified_name]
        return self.rng.choices(generators, weights)[0](table)

    def take(self, count: int) -> list[Operation]:
        return [self.next() for _ in range(count)]

    def _mix(self, table: TableMetadata) -> tuple[list[Generator], list[float]]:
        """The statement kinds that make sense for the table, with their relative frequencies."""
        if table.is_counter:
            return [self._counter_add], [1.0]
        mix: list[tuple[Generator, float]] = [(self._insert, 40), (self._update, 25), (self._delete_columns, 3),
                                              (self._delete_row, 4), (self._delete_partition, 1)]
        if table.clustering:
            mix.append((self._delete_range, 2))
        if any(c.is_static for c in table.regular_and_static):
            mix.append((self._static_update, 5))
        if any(c.is_complex for c in table.regular_and_static):
            mix.append((self._collection_change, 15))
        return [g for g, _ in mix], [w for _, w in mix]

    # --- keys and values --------------------------------------------------------------------------

    def _partition_key(self, table: TableMetadata) -> dict[str, object]:
        index = self.rng.randrange(self.keys)
        return {c.name: key_value(c.type, index) for c in table.partition_key}

    def _row_key(self, table: TableMetadata) -> dict[str, object]:
        key = self._partition_key(table)
        key.update((c.name, key_value(c.type, self.rng.randrange(self.rows_per_partition))) for c in table.clustering)
        return key

    def _key_for(self, table: TableMetadata, column: ColumnMetadata) -> dict[str, object]:
        return self._partition_key(table) if column.is_static else self._row_key(table)

    def _value(self, column: ColumnMetadata) -> object:
        return None if self.rng.random() < 0.05 else random_value(column.type, self.rng)

    def _ttl(self) -> int | None:
        return self.rng.randint(*self.ttl_seconds) if self.rng.random() < self.ttl_probability else None

    def _pick(self, columns: Sequence[ColumnMetadata], most: int) -> list[ColumnMetadata]:
        return self.rng.sample(list(columns), self.rng.randint(1, min(most, len(columns))))

    @staticmethod
    def _regulars(table: TableMetadata) -> list[ColumnMetadata]:
        return [c for c in table.regular_and_static if not c.is_static]

    # --- statements -------------------------------------------------------------------------------

    def _insert(self, table: TableMetadata) -> Operation:
        values = self._row_key(table)
        for column in table.regular_and_static:
            if self.rng.random() < (0.3 if column.is_static else 0.8):
                values[column.name] = self._value(column)
        return Insert(table.qualified_name, values, ttl=self._ttl(), timestamp=self.clock.tick())

    def _update(self, table: TableMetadata) -> Operation:
        regulars = self._regulars(table)
        if not regulars:
            return self._insert(table)
        assignments = {c.name: self._value(c) for c in self._pick(regulars, 3)}
        return Update(table.qualified_name, self._row_key(table), assignments, ttl=self._ttl(),
                      timestamp=self.clock.tick())

    def _static_update(self, table: TableMetadata) -> Operation:
        statics = [c for c in table.regular_and_static if c.is_static]
        assignments = {c.name: self._value(c) for c in self._pick(statics, 2)}
        return Update(table.qualified_name, self._partition_key(table), assignments, ttl=self._ttl(),
                      timestamp=self.clock.tick())

    def _delete_columns(self, table: TableMetadata) -> Operation:
        regulars = self._regulars(table)
        if not regulars:
            return self._delete_row(table)
        columns = tuple(c.name for c in self._pick(regulars, 2))
        return DeleteColumns(table.qualified_name, self._row_key(table), columns, timestamp=self.clock.tick())

    def _delete_row(self, table: TableMetadata) -> Operation:
        return DeleteRow(table.qualified_name, self._row_key(table), timestamp=self.clock.tick())

    def _delete_partition(self, table: TableMetadata) -> Operation:
        return DeletePartition(table.qualified_name, self._partition_key(table), timestamp=self.clock.tick())

    def _delete_range(self, table: TableMetadata) -> Operation:
        """A prefix deletion, or a slice of the clustering column after a (possibly empty) prefix."""
        row_key = self._row_key(table)
        size = self.rng.randrange(len(table.clustering))
        key = {c.name: row_key[c.name] for c in (*table.partition_key, *table.clustering[:size])}
        if size and self.rng.random() < 0.4:
            return DeleteRange(table.qualified_name, key, timestamp=self.clock.tick())
        column = table.clustering[size]
        bounds = [key_value(column.type, self.rng.randrange(self.rows_per_partition)) for _ in range(2)]
        low, high = sorted(bounds, key=lambda v: order_key(column.type, serialize(column.type, v)))
        shape = self.rng.choice(("between", "between", "from", "up to"))
        start = None if shape == "up to" else low
        end = None if shape == "from" else high
        return DeleteRange(table.qualified_name, key, start, end, self.rng.random() < 0.7, self.rng.random() < 0.7,
                           timestamp=self.clock.tick())

    def _collection_change(self, table: TableMetadata) -> Operation:
        column = self.rng.choice([c for c in table.regular_and_static if c.is_complex])
        key = self._key_for(table, column)
        name, kind, rng = column.name, column.type.kind, self.rng
        timestamp = self.clock.tick()
        if rng.random() < 0.2:  # overwrite the whole collection / UDT
            return Update(table.qualified_name, key, {name: self._value(column)}, ttl=self._ttl(), timestamp=timestamp)
        removal = rng.random() < 0.3
        if kind == "list":
            element_type = column.type.parameters[0]
            values = tuple(random_value(element_type, rng) for _ in range(rng.randint(1, 3)))
            return AppendToList(table.qualified_name, key, name, values, ttl=self._ttl(), timestamp=timestamp)
        if kind in ("set", "map"):
            key_type = column.type.parameters[0]
            # Distinct, in a reproducible order (a set's iteration order changes with the hash seed).
            elements = tuple(dict.fromkeys(key_value(key_type, rng.randrange(ELEMENT_DOMAIN))
                                           for _ in range(rng.randint(1, 3))))
            if kind == "set":
                if removal:
                    return RemoveFromSet(table.qualified_name, key, name, elements, timestamp=timestamp)
                return AddToSet(table.qualified_name, key, name, elements, ttl=self._ttl(), timestamp=timestamp)
            if removal:
                return RemoveMapKeys(table.qualified_name, key, name, elements, timestamp=timestamp)
            entries = {k: random_value(column.type.parameters[1], rng) for k in elements}
            return PutInMap(table.qualified_name, key, name, entries, ttl=self._ttl(), timestamp=timestamp)
        fields = {f: (None if removal else random_value(t, rng))
                  for f, t in zip(column.type.field_names, column.type.parameters) if rng.random() < 0.5}
        if not fields:
            fields = {column.type.field_names[0]: random_value(column.type.parameters[0], rng)}
        return SetUdtFields(table.qualified_name, key, name, fields, ttl=self._ttl(), timestamp=timestamp)

    def _counter_add(self, table: TableMetadata) -> Operation:
        column = self.rng.choice([c for c in table.regular_and_static if c.type.is_counter])
        delta = self.rng.choice([-3, -1, 1, 1, 2, 5, 10])
        return CounterAdd(table.qualified_name, self._key_for(table, column), column.name, delta,
                          timestamp=self.clock.tick())


__all__ = [
    "AddToSet", "AppendToList", "Clock", "Cluster", "CounterAdd", "DeleteColumns", "DeletePartition", "DeleteRange",
    "DeleteRow", "Insert", "Operation", "PutInMap", "RemoveFromSet", "RemoveMapKeys", "SetUdtFields", "TableModel",
    "Update", "Workload", "to_mutation",
]
