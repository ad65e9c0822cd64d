"""Cassandra's sort order of serialized values (``AbstractType.compare``), and values serialized in it.

Needed wherever the simulator must put values in the order Cassandra does: cells of a set or map column
are written sorted by their path (the element or key); a frozen set or map is stored with its elements
sorted (the coordinator rebuilds it with the type's comparator, whatever order the client sent); a
``SELECT`` returns elements in that order (so a decoded map, an ordered mapping, only equals one built in
the same order); a range deletion covers the clusterings between its bounds.
"""

from __future__ import annotations

import decimal
import struct
import uuid
from collections.abc import Mapping
from typing import Any

from ..schema import CqlType

# Types compared as signed big-endian integers (LongType.compareLongs and friends).
_SIGNED_INTEGERS = frozenset({"int", "bigint", "smallint", "tinyint", "timestamp", "time", "counter", "varint"})
_FLOATS = {"float": struct.Struct(">f"), "double": struct.Struct(">d")}
_INT = struct.Struct(">i")


def order_key(cql_type: CqlType, data: bytes) -> Any:
    """A key that sorts serialized values of ``cql_type`` the way Cassandra's comparator does.

    Text, ascii, blob, inet, date (an unsigned day count), boolean and every frozen/tuple type compare
    as unsigned bytes here; for frozen collections, tuples and UDTs Cassandra compares element by element,
    which this approximates (the simulator never sorts by them).
    """
    kind = cql_type.kind
    if kind in _SIGNED_INTEGERS:
        return int.from_bytes(data, "big", signed=True)
    if kind in _FLOATS:
        return _FLOATS[kind].unpack(data)[0]
    if kind == "decimal":
        scale = int.from_bytes(data[:4], "big", signed=True)
        return decimal.Decimal(int.from_bytes(data[4:], "big", signed=True)).scaleb(-scale)
    if kind == "timeuuid":
        # TimeUUIDType: the 60-bit timestamp, then the remaining bytes compared as *signed* bytes.
        return uuid.UUID(bytes=data).time, _signed_bytes(data[8:])
    if kind == "uuid":
        # UUIDType: the version, the timestamp of time-based UUIDs, then all bytes unsigned.
        version = data[6] >> 4
        return version, uuid.UUID(bytes=data).time if version == 1 else 0, data
    return data


def _signed_bytes(data: bytes) -> tuple[int, ...]:
    return tuple(b - 256 if b > 127 else b for b in data)


def serialize(cql_type: CqlType, value: Any) -> bytes:
    """A value's storage bytes as Cassandra keeps them: elements of (nested) sets and maps sorted and
    distinct, collections packed with int32 sizes. A UDT value may be a mapping of field names or a tuple."""
    kind = cql_type.kind
    if kind in ("list", "set", "map"):
        parameters = cql_type.parameters
        if kind == "map":
            items = {serialize(parameters[0], k): _sized(serialize(parameters[1], v)) for k, v in value.items()}
            ordered = [_sized(k) + items[k] for k in sorted(items, key=lambda k: order_key(parameters[0], k))]
        elif kind == "set":
            elements = {serialize(parameters[0], e) for e in value}
            ordered = [_sized(e) for e in sorted(elements, key=lambda e: order_key(parameters[0], e))]
        else:
            ordered = [_sized(serialize(parameters[0], e)) for e in value]
        return _INT.pack(len(ordered)) + b"".join(ordered)
    if kind in ("tuple", "udt"):
        if kind == "udt":
            value = udt_field_values(cql_type, value)
        return b"".join(_sized(None if v is None else serialize(t, v)) for t, v in zip(cql_type.parameters, value))
    return cql_type.serialize(value)


def _sized(data: bytes | None) -> bytes:
    return _INT.pack(-1) if data is None else _INT.pack(len(data)) + data


def udt_field_values(cql_type: CqlType, value: Any) -> list[Any]:
    """A UDT value's fields in declaration order, from a mapping by field name or a sequence (tuple)."""
    if isinstance(value, Mapping):
        unknown = set(value) - set(cql_type.field_names)
        if unknown:
            raise KeyError(f"{cql_type.cql} has no field(s) {', '.join(sorted(map(str, unknown)))}")
        return [value.get(name) for name in cql_type.field_names]
    values = list(value)
    return values + [None] * (len(cql_type.field_names) - len(values))
