"""Per-partition-update context: encoding stats, the column lists, and the delta codings they drive.

Mirrors Cassandra's ``SerializationHeader``: every nested serializer (row, cell, deletion time) reads
its timestamps, TTLs and local deletion times as deltas from the partition update's minimums, and
finds columns through the header's lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schema.model import ColumnMetadata, TableMetadata
from .binary_io import DataInput, DataOutput
from .vint import INT_MAX, INT_MIN, LONG_MAX, read_unsigned_vint, s32, s64

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
        buf = inp.buf  # local cursor: read for every partition update, two of the three vints multi-byte
        timestamp_delta, pos = read_unsigned_vint(buf, inp.pos)
        ldt_delta, pos = read_unsigned_vint(buf, pos)
        ttl, pos = read_unsigned_vint(buf, pos)
        inp.move_to(pos)
        # int arithmetic for the deletion time in every version
        return EncodingStats(s64(timestamp_delta + TIMESTAMP_EPOCH), s32(s32(ldt_delta) + DELETION_TIME_EPOCH),
                             s32(ttl))

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

    __slots__ = ("table", "version", "stats", "regulars", "statics", "clustering_types", "_unsigned_ldt",
                 "_min_timestamp", "_min_ttl", "_min_ldt")

    def __init__(self, table: TableMetadata, version: int, stats: EncodingStats,
                 regulars: tuple[ColumnMetadata, ...], statics: tuple[ColumnMetadata, ...]) -> None:
        self.table = table
        self.version = version
        self.stats = stats
        self.regulars = regulars
        self.statics = statics
        self.clustering_types = table.clustering_types
        self._unsigned_ldt = version >= VERSION_UNSIGNED_DELETION_TIMES
        # The stats' minimums, one attribute lookup away: every timestamp, TTL and deletion time adds one.
        self._min_timestamp = stats.min_timestamp
        self._min_ttl = stats.min_ttl
        self._min_ldt = stats.min_local_deletion_time

    def columns(self, is_static: bool) -> tuple[ColumnMetadata, ...]:
        return self.statics if is_static else self.regulars

    # Deltas: the writer subtracts the minimum with Java int/long arithmetic (a negative delta is a
    # sign-extended 9-byte vint); the reader adds it back with the same wrap-around, which is called only
    # when the sum is out of range. ``timestamp``, ``ttl`` and ``ldt`` turn a delta into the value, for
    # serializers that read the vint themselves.

    def timestamp(self, delta: int) -> int:
        value = delta + self._min_timestamp  # never below Long.MIN_VALUE: the delta is unsigned
        return value if value <= LONG_MAX else s64(value)

    def read_timestamp(self, inp: DataInput) -> int:
        return self.timestamp(inp.uvint())

    def write_timestamp(self, out: DataOutput, timestamp: int) -> None:
        out.uvint(timestamp - self.stats.min_timestamp)

    def ttl(self, delta: int) -> int:
        value = delta + self._min_ttl
        return value if INT_MIN <= value <= INT_MAX else s32(value)

    def read_ttl(self, inp: DataInput) -> int:
        return self.ttl(inp.uvint())

    def write_ttl(self, out: DataOutput, ttl: int) -> None:
        out.uvint(s32(ttl - self.stats.min_ttl))

    def ldt(self, delta: int) -> int:
        value = (delta if delta <= INT_MAX else s32(delta)) + self._min_ldt
        if self._unsigned_ldt:
            return value & 0xFFFFFFFF
        return value if INT_MIN <= value <= INT_MAX else s32(value)

    def read_ldt(self, inp: DataInput) -> int:
        return self.ldt(inp.uvint())

    def write_ldt(self, out: DataOutput, ldt: int) -> None:
        out.uvint(s32(ldt - self.stats.min_local_deletion_time))
