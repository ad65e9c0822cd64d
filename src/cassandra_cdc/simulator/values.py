"""Python values of any CQL type, for generated workloads: random ones, and deterministic ones by index.

Values are in the forms the DataStax driver serializes: ints, str, bytes, floats, ``Decimal``, ``UUID``,
naive UTC ``datetime``, ``date``, ``cassandra.util.Time`` and ``Duration``, lists, sets, dicts and tuples
(also for UDTs).
"""

from __future__ import annotations

import datetime
import decimal
import random
import uuid
from typing import Any

from cassandra import util

from ..schema import CqlType

_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett",
          "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")
_EPOCH = datetime.datetime(1970, 1, 1)
_BASE_DAY = datetime.date(2020, 1, 1)
_NANOS_PER_DAY = 86_400 * 10**9
_INTEGER_RANGES = {"tinyint": 7, "smallint": 15, "int": 31, "bigint": 63}
# Domain of indexes random elements of sets and map keys are drawn from: small, so removals find them.
ELEMENT_DOMAIN = 8


def key_value(cql_type: CqlType, index: int) -> Any:
    """The ``index``-th value of a type: distinct for distinct indexes (within the type's range), the same
    every run. Used for primary keys and collection elements, so that a bounded key space is revisited."""
    kind = cql_type.kind
    if kind in _INTEGER_RANGES:
        return index % (1 << _INTEGER_RANGES[kind])
    if kind in ("varint", "counter"):
        return index
    if kind in ("text", "varchar", "ascii"):
        return f"{_WORDS[index % len(_WORDS)]}-{index}"
    if kind == "blob":
        return index.to_bytes(4, "big")
    if kind == "boolean":
        return bool(index % 2)
    if kind in ("float", "double"):
        return float(index) / 4
    if kind == "decimal":
        return decimal.Decimal(index).scaleb(-2)
    if kind == "uuid":
        return uuid.UUID(int=index, version=4)
    if kind == "timeuuid":
        return _timeuuid(1_600_000_000_000_000 + index * 1000, index)
    if kind == "timestamp":
        return _EPOCH + datetime.timedelta(seconds=1_600_000_000 + index)
    if kind == "date":
        return _BASE_DAY + datetime.timedelta(days=index)
    if kind == "time":
        return util.Time(index * 10**9 % _NANOS_PER_DAY)
    if kind == "inet":
        return f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}"
    if kind == "duration":
        return util.Duration(0, index, 0)
    if kind in ("tuple", "udt"):
        return tuple(key_value(t, index) for t in cql_type.parameters)
    if kind in ("list", "set"):
        return _collection(kind, [key_value(cql_type.parameters[0], index)])
    if kind == "map":
        return {key_value(cql_type.parameters[0], index): key_value(cql_type.parameters[1], index)}
    if kind == "vector":
        return [key_value(cql_type.parameters[0], index + i) for i in range(cql_type.dimension)]
    raise TypeError(f"no values for type {cql_type.cql}")


def random_value(cql_type: CqlType, rng: random.Random) -> Any:
    """A random value of the type, of a realistic size (short strings, collections of 1-3 elements)."""
    kind = cql_type.kind
    if kind in _INTEGER_RANGES:
        bits = _INTEGER_RANGES[kind]
        return rng.randint(-(1 << bits), (1 << bits) - 1) if rng.random() < 0.2 else rng.randint(-100, 10_000)
    if kind in ("text", "varchar", "ascii"):
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
    if kind == "blob":
        return rng.randbytes(rng.randint(1, 24))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind in ("float", "double"):
        return round(rng.uniform(-1e4, 1e4), 3)
    if kind == "decimal":
        return decimal.Decimal(rng.randint(-10**8, 10**8)).scaleb(-rng.randint(0, 4))
    if kind == "varint":
        return rng.randint(-10**20, 10**20)
    if kind == "uuid":
        return uuid.UUID(int=rng.getrandbits(128), version=4)
    if kind == "timeuuid":
        return _timeuuid(rng.randint(1_500_000_000, 1_800_000_000) * 10**6, rng.getrandbits(14))
    if kind == "timestamp":
        return _EPOCH + datetime.timedelta(milliseconds=rng.randint(1_500_000_000_000, 1_800_000_000_000))
    if kind == "date":
        return _BASE_DAY + datetime.timedelta(days=rng.randint(-5000, 5000))
    if kind == "time":
        return util.Time(rng.randrange(_NANOS_PER_DAY))
    if kind == "inet":
        return ".".join(str(rng.randint(0, 255)) for _ in range(4))
    if kind == "duration":
        return util.Duration(rng.randint(0, 12), rng.randint(0, 30), rng.randint(0, 10**12))
    if kind == "tuple":
        return tuple(random_value(t, rng) for t in cql_type.parameters)
    if kind == "udt":
        # Some fields left null, as real rows have.
        return tuple(None if rng.random() < 0.2 else random_value(t, rng) for t in cql_type.parameters)
    if kind in ("list", "set"):
        element_type = cql_type.parameters[0]
        count = rng.randint(1, 3)
        if kind == "list":
            return [random_value(element_type, rng) for _ in range(count)]
        return _collection(kind, [key_value(element_type, rng.randrange(ELEMENT_DOMAIN)) for _ in range(count)])
    if kind == "map":
        key_type, value_type = cql_type.parameters
        return {key_value(key_type, rng.randrange(ELEMENT_DOMAIN)): random_value(value_type, rng)
                for _ in range(rng.randint(1, 3))}
    if kind == "vector":
        return [random_value(cql_type.parameters[0], rng) for _ in range(cql_type.dimension)]
    raise TypeError(f"no values for type {cql_type.cql}")


def _collection(kind: str, elements: list[Any]) -> Any:
    return set(elements) if kind == "set" else elements


def _timeuuid(micros: int, clock_seq: int) -> uuid.UUID:
    return util.uuid_from_time(micros / 1e6, node=0x5CA1AB1E0002, clock_seq=clock_seq & 0x3FFF)
