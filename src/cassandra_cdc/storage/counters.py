"""Counter contexts: the value of a counter cell (``CounterContext``, docs/storage-format.md §14).

A context is ``int16 header count``, that many ``int16`` shard indexes (global shards are stored as
``index + Short.MIN_VALUE``), then the shards: ``16-byte counter id, int64 clock, int64 count``.
Each replica that led an increment owns a shard with its running total; the counter's value is
the sum of the shards, and two contexts merge per counter id, the higher clock winning.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Iterable

_SHORT = struct.Struct(">h")
_SHARD = struct.Struct(">16sqq")
SHORT_MIN = -(1 << 15)


@dataclass(frozen=True, slots=True)
class CounterShard:
    counter_id: uuid.UUID
    clock: int
    count: int
    is_global: bool = True


def decode_counter_context(context: bytes) -> list[CounterShard]:
    if len(context) < 2:
        raise ValueError(f"counter context of {len(context)} bytes is too short")
    (header_count,) = _SHORT.unpack_from(context, 0)
    header_end = 2 + 2 * header_count
    global_shards = set()
    for i in range(header_count):
        (index,) = _SHORT.unpack_from(context, 2 + 2 * i)
        if index < 0:
            global_shards.add(index - SHORT_MIN)
    body = len(context) - header_end
    if header_count < 0 or body < 0 or body % _SHARD.size:
        raise ValueError(f"malformed counter context of {len(context)} bytes ({header_count} header entries)")
    shards = []
    for i in range(body // _SHARD.size):
        counter_id, clock, count = _SHARD.unpack_from(context, header_end + i * _SHARD.size)
        shards.append(CounterShard(uuid.UUID(bytes=counter_id), clock, count, i in global_shards))
    return shards


def encode_counter_context(shards: Iterable[CounterShard]) -> bytes:
    """A context with the shards sorted by counter id, as Cassandra keeps them."""
    ordered = sorted(shards, key=lambda s: s.counter_id.bytes)
    globals_ = [i for i, s in enumerate(ordered) if s.is_global]
    header = _SHORT.pack(len(globals_)) + b"".join(_SHORT.pack(i + SHORT_MIN) for i in globals_)
    return header + b"".join(_SHARD.pack(s.counter_id.bytes, s.clock, s.count) for s in ordered)


def counter_value(context: bytes) -> int:
    return sum(shard.count for shard in decode_counter_context(context))


def merge_counter_contexts(left: bytes, right: bytes) -> bytes:
    """The context Cassandra's reconciliation keeps: per counter id, the shard with the higher clock."""
    merged: dict[uuid.UUID, CounterShard] = {}
    for shard in decode_counter_context(left) + decode_counter_context(right):
        current = merged.get(shard.counter_id)
        if current is None or shard.clock > current.clock or (shard.clock == current.clock and shard.count > current.count):
            merged[shard.counter_id] = shard
    return encode_counter_context(merged.values())
