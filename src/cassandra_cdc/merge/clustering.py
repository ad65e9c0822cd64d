"""Cassandra's order of values and clusterings (``AbstractType.compare``, ``ClusteringComparator``).

Range tombstones cover the clusterings between their bounds in this order, and a ``SELECT`` returns
rows, set elements and map entries in it. The rules, per ``db/marshal`` type (Cassandra 4.x/5.0):

* an empty value sorts before any other (``Boolean.compare(isEmpty(right), isEmpty(left))``);
* ``int``, ``bigint``, ``smallint``, ``tinyint``, ``varint``, ``counter``, ``timestamp``, ``time``:
  signed numbers; ``float``/``double``: ``Float.compare``/``Double.compare`` (-0.0 before 0.0, NaN last);
  ``decimal``: ``BigDecimal.compareTo`` (numeric, so 1.0 equals 1.00); ``boolean``: false, then true;
* ``uuid`` (``UUIDType``): version, then the timestamp of version 1 UUIDs (other versions: the most
  significant 8 bytes unsigned), then the least significant 8 bytes unsigned;
* ``timeuuid`` (``TimeUUIDType``): the timestamp, then the least significant 8 bytes as *signed* bytes
  (CASSANDRA-8730);
* frozen ``list``/``set``: element by element, then the shorter first; frozen ``map``: key, value, by
  entry, then size; ``tuple`` and UDTs (``TupleType``): component by component, null first, a value
  with fewer components equal to one whose extra components are all null;
* anything else (``text``, ``ascii``, ``blob``, ``inet``, ``date``, ...): unsigned bytes;
* a ``DESC`` clustering column (``ReversedType``) compares the other way round.
"""

from __future__ import annotations

import decimal
import functools
import math
import struct
from typing import Callable, Sequence

from ..schema.model import ColumnMetadata
from ..schema.types import CqlType

# A clustering or bound prefix: a value per clustering column (None for a null in legacy markers).
Clustering = tuple[bytes | None, ...]

_SIGNED_NUMBERS = frozenset({"int", "bigint", "smallint", "tinyint", "varint", "counter", "timestamp",
                             "time"})
_FLOATS = {"float": struct.Struct(">f"), "double": struct.Struct(">d")}
_INT = struct.Struct(">i")
_MASK64 = (1 << 64) - 1


def _sign(value: int) -> int:
    return (value > 0) - (value < 0)


def _cmp(left, right) -> int:  # type: ignore[no-untyped-def]
    return (left > right) - (left < right)


def compare_values(cql_type: CqlType, left: bytes | None, right: bytes | None) -> int:
    """Negative, zero or positive as ``left`` sorts before, with or after ``right`` (serialized values)."""
    if left == right:
        return 0
    left = left or b""
    right = right or b""
    if not left or not right:
        return _cmp(not right, not left)
    kind = cql_type.kind
    if kind in _SIGNED_NUMBERS:
        return _cmp(int.from_bytes(left, "big", signed=True), int.from_bytes(right, "big", signed=True))
    if kind in _FLOATS:
        unpack = _FLOATS[kind].unpack
        return _cmp(_float_order(unpack(left)[0]), _float_order(unpack(right)[0]))
    if kind == "decimal":
        return _cmp(_decimal(left), _decimal(right))
    if kind == "boolean":
        return _cmp(left[0] != 0, right[0] != 0)
    if kind == "timeuuid":
        return _compare_timeuuids(left, right)
    if kind == "uuid":
        return _compare_uuids(left, right)
    if kind in ("list", "set"):
        return _compare_sequences(cql_type.parameters[0], left, right)
    if kind == "map":
        return _compare_maps(cql_type.parameters[0], cql_type.parameters[1], left, right)
    if kind in ("tuple", "udt"):
        return _compare_tuples(cql_type.parameters, left, right)
    return _cmp(left, right)


def value_sort_key(cql_type: CqlType) -> Callable[[bytes], object]:
    """A ``sorted`` key putting serialized values of ``cql_type`` in Cassandra's order."""
    return functools.cmp_to_key(lambda a, b: compare_values(cql_type, a, b))


def _float_order(value: float) -> tuple[int, float, int]:
    # Float.compare: NaN after everything, -0.0 before 0.0.
    if math.isnan(value):
        return 1, 0.0, 0
    return 0, value, 0 if math.copysign(1.0, value) < 0 else 1


def _decimal(data: bytes) -> decimal.Decimal:
    scale = int.from_bytes(data[:4], "big", signed=True)
    return decimal.Decimal(int.from_bytes(data[4:], "big", signed=True)).scaleb(-scale)


def _reorder_timestamp(msb: int) -> int:
    """``TimeUUIDType.reorderTimestampBytes``: time_hi (with the version), time_mid, time_low, signed."""
    reordered = ((msb << 48) & _MASK64) | ((msb << 16) & 0xFFFF00000000) | (msb >> 32)
    return reordered - (1 << 64) if reordered >> 63 else reordered


def _uuid_lengths(left: bytes, right: bytes) -> int | None:
    p1, p2 = len(left) == 16, len(right) == 16
    if p1 and p2:
        return None
    return 1 if p1 else -1 if p2 else 0


def _compare_timeuuids(left: bytes, right: bytes) -> int:
    lengths = _uuid_lengths(left, right)
    if lengths is not None:
        return lengths
    c = _cmp(_reorder_timestamp(int.from_bytes(left[:8], "big")),
             _reorder_timestamp(int.from_bytes(right[:8], "big")))
    if c:
        return c
    return _cmp(_signed_bytes(left[8:]), _signed_bytes(right[8:]))


def _signed_bytes(data: bytes) -> tuple[int, ...]:
    return tuple(b - 256 if b > 127 else b for b in data)


def _compare_uuids(left: bytes, right: bytes) -> int:
    lengths = _uuid_lengths(left, right)
    if lengths is not None:
        return lengths
    msb1, msb2 = int.from_bytes(left[:8], "big"), int.from_bytes(right[:8], "big")
    version1, version2 = (msb1 >> 12) & 0xF, (msb2 >> 12) & 0xF
    if version1 != version2:
        return _sign(version1 - version2)
    if version1 == 1:
        c = _cmp(_reorder_timestamp(msb1), _reorder_timestamp(msb2))
    else:
        c = _cmp(msb1, msb2)
    return c or _cmp(left[8:], right[8:])


def _elements(data: bytes) -> tuple[int, list[bytes]]:
    """The size and the values of a collection packed with int32 sizes (protocol v3+)."""
    (count,) = _INT.unpack_from(data, 0)
    values, pos = [], 4
    for _ in range(max(count, 0)):
        (size,) = _INT.unpack_from(data, pos)
        pos += 4
        values.append(data[pos:pos + max(size, 0)])
        pos += max(size, 0)
    return count, values


def _compare_sequences(element: CqlType, left: bytes, right: bytes) -> int:
    size_l, values_l = _elements(left)
    size_r, values_r = _elements(right)
    for a, b in zip(values_l, values_r):
        c = compare_values(element, a, b)
        if c:
            return c
    return _cmp(size_l, size_r)


def _compare_maps(key: CqlType, value: CqlType, left: bytes, right: bytes) -> int:
    # The packed entries alternate key and value: read them as a sequence of twice the size.
    size_l, _ = _elements(left)
    size_r, _ = _elements(right)
    flat_l = _elements(_INT.pack(2 * size_l) + left[4:])[1]
    flat_r = _elements(_INT.pack(2 * size_r) + right[4:])[1]
    for i in range(min(size_l, size_r)):
        c = compare_values(key, flat_l[2 * i], flat_r[2 * i]) or compare_values(value, flat_l[2 * i + 1],
                                                                                 flat_r[2 * i + 1])
        if c:
            return c
    return _cmp(size_l, size_r)


def _components(data: bytes) -> list[bytes | None]:
    values: list[bytes | None] = []
    pos = 0
    while pos < len(data):
        (size,) = _INT.unpack_from(data, pos)
        pos += 4
        if size < 0:
            values.append(None)
        else:
            values.append(data[pos:pos + size])
            pos += size
    return values


def _compare_tuples(types: Sequence[CqlType], left: bytes, right: bytes) -> int:
    comps_l, comps_r = _components(left), _components(right)
    count = min(len(comps_l), len(comps_r), len(types))
    for i in range(count):
        a, b = comps_l[i], comps_r[i]
        if a is None or b is None:
            if a is None and b is None:
                continue
            return -1 if a is None else 1
        c = compare_values(types[i], a, b)
        if c:
            return c
    rest_l = all(v is None for v in comps_l[count:])
    rest_r = all(v is None for v in comps_r[count:])
    if rest_l and rest_r:
        return 0
    return -1 if rest_l else 1


class ClusteringComparator:
    """Compares clusterings and bound prefixes of one table, and tells which rows a range covers."""

    __slots__ = ("types", "reversed")

    def __init__(self, columns: Sequence[ColumnMetadata]) -> None:
        self.types = tuple(c.type for c in columns)
        self.reversed = tuple(c.reversed for c in columns)

    def compare(self, left: Clustering, right: Clustering) -> int:
        """Compares the common prefix of two clusterings (0 when one is a prefix of the other)."""
        for value_type, descending, a, b in zip(self.types, self.reversed, left, right):
            c = compare_values(value_type, a, b)
            if c:
                return -c if descending else c
        return 0

    def sort_key(self) -> Callable[[Clustering], object]:
        """A ``sorted`` key for full clusterings (the empty clustering of a static row first)."""
        return functools.cmp_to_key(lambda a, b: self.compare(a, b) or _cmp(len(a), len(b)))

    def covers(self, start: Clustering, start_inclusive: bool, end: Clustering, end_inclusive: bool,
               clustering: Clustering) -> bool:
        """Whether ``clustering`` lies between a start and an end bound (empty bounds: no limit).

        A bound is a prefix: an inclusive start sorts before every clustering it prefixes, an exclusive
        one after them; likewise for ends.
        """
        c = self.compare(clustering, start)
        if c < 0 or (c == 0 and not start_inclusive):
            return False
        c = self.compare(clustering, end)
        return c < 0 or (c == 0 and end_inclusive)
