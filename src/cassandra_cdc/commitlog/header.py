"""Per-partition-update context: encoding stats, the column lists, and the delta codings they drive.

Mirrors Cassandra's ``SerializationHeader``: every nested serializer (row, cell, deletion time) reads
its timestamps, TTLs and local deletion times as deltas from the partition update's minimums, and
finds columns through the header's lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schema.model import ColumnMetadata, TableMetadata
from .io import DataInput, DataOutput
from .vint import s32, s64

TIMESTAMP_EPOCH = 1442880000000000  # 2015-09-22T00:00:00Z in microseconds
DELETION_TIME_EPOCH = 1442880000  # the same instant in seconds

# Cassandra 5.0 (commit log version 8) keeps local deletion times as unsigned 32-bit seconds.
VERSION_UNSIGNED_DELETION_TIMES = 8


@dataclass(slots=True)
class EncodingStats:
    min_timestamp: int = TIMESTAMP_EPOCH
    min_local_deletion_time: int = DELETION_TIME_EPOCH
    min_ttl: int = 0

    @staticmethod
    def deserialize(inp: DataInput) -> "EncodingStats":
        min_timestamp = s64(inp.uvint() + TIMESTAMP_EPOCH)
        min_ldt = s32(s32(inp.uvint()) + DELETION_TIME_EPOCH)  # int arithmetic in every version
        min_ttl = s32(inp.uvint())
        return EncodingStats(min_timestamp, min_ldt, min_ttl)

    def serialize(self, out: DataOutput) -> None:
        out.uvint(self.min_timestamp - TIMESTAMP_EPOCH)
        out.uvint(s32(self.min_local_deletion_time - DELETION_TIME_EPOCH))
        out.uvint(self.min_ttl)


class StatsCollector:
    """Collects the minimums of a partition update's data, as ``EncodingStats.Collector`` does."""

    __slots__ = ("timestamp", "ldt", "ttl")

    def __init__(self) -> None:
        self.timestamp: int | None = None
        self.ldt: int | None = None
        self.ttl: int | None = None

    def timestamp_seen(self, value: int) -> None:
        if self.timestamp is None or value < self.timestamp:
            self.timestamp = value

    def ldt_seen(self, value: int) -> None:
        if self.ldt is None or value < self.ldt:
            self.ldt = value

    def ttl_seen(self, value: int) -> None:
        if self.ttl is None or value < self.ttl:
            self.ttl = value

    def stats(self) -> EncodingStats:
        return EncodingStats(
            TIMESTAMP_EPOCH if self.timestamp is None else self.timestamp,
            DELETION_TIME_EPOCH if self.ldt is None else self.ldt,
            0 if self.ttl is None else self.ttl,
        )


class SerializationHeader:
    """What the serializers of one partition update share."""

    __slots__ = ("table", "version", "stats", "regulars", "statics", "clustering_types", "_unsigned_ldt")

    def __init__(self, table: TableMetadata, version: int, stats: EncodingStats,
                 regulars: tuple[ColumnMetadata, ...], statics: tuple[ColumnMetadata, ...]) -> None:
        self.table = table
        self.version = version
        self.stats = stats
        self.regulars = regulars
        self.statics = statics
        self.clustering_types = table.clustering_types
        self._unsigned_ldt = version >= VERSION_UNSIGNED_DELETION_TIMES

    def columns(self, is_static: bool) -> tuple[ColumnMetadata, ...]:
        return self.statics if is_static else self.regulars

    # Deltas: the writer subtracts the minimum with Java int/long arithmetic (a negative delta is a
    # sign-extended 9-byte vint); the reader adds it back with the same wrap-around. ``timestamp``, ``ttl``
    # and ``ldt`` turn a delta into the value, for serializers that read the vint themselves.

    def timestamp(self, delta: int) -> int:
        return s64(delta + self.stats.min_timestamp)

    def read_timestamp(self, inp: DataInput) -> int:
        return self.timestamp(inp.uvint())

    def write_timestamp(self, out: DataOutput, timestamp: int) -> None:
        out.uvint(timestamp - self.stats.min_timestamp)

    def ttl(self, delta: int) -> int:
        return s32(delta + self.stats.min_ttl)

    def read_ttl(self, inp: DataInput) -> int:
        return self.ttl(inp.uvint())

    def write_ttl(self, out: DataOutput, ttl: int) -> None:
        out.uvint(s32(ttl - self.stats.min_ttl))

    def ldt(self, delta: int) -> int:
        value = s32(delta) + self.stats.min_local_deletion_time
        return value & 0xFFFFFFFF if self._unsigned_ldt else s32(value)

    def read_ldt(self, inp: DataInput) -> int:
        return self.ldt(inp.uvint())

    def write_ldt(self, out: DataOutput, ldt: int) -> None:
        out.uvint(s32(ldt - self.stats.min_local_deletion_time))
