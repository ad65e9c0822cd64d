"""CQL types: parsing type text, the storage encoding of values, and their JSON rendering.

Values are encoded by the DataStax driver's ``cqltypes`` (the storage format of a value is the native
protocol's, with collections packed as protocol v3+). This module adds what a storage-level reader needs
on top: which types are written without a length (``fixed_length``), which columns are multi-cell
(non-frozen collections and UDTs, one cell per element), and how a cell path maps to an element.
"""

from __future__ import annotations

import datetime
import decimal
import ipaddress
import json
import math
import re
import struct
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Mapping

from cassandra import cqltypes, util

# The storage format of a value is the native protocol's; v4 packs collections with int32 sizes
# exactly as Cassandra stores frozen values (CollectionSerializer.pack with ProtocolVersion.V3).
PROTOCOL_VERSION = 4

_SIMPLE_TYPES: dict[str, type[cqltypes._CassandraType]] = {
    "ascii": cqltypes.AsciiType,
    "bigint": cqltypes.LongType,
    "blob": cqltypes.BytesType,
    "boolean": cqltypes.BooleanType,
    "counter": cqltypes.CounterColumnType,
    "date": cqltypes.SimpleDateType,
    "decimal": cqltypes.DecimalType,
    "double": cqltypes.DoubleType,
    "duration": cqltypes.DurationType,
    "float": cqltypes.FloatType,
    "inet": cqltypes.InetAddressType,
    "int": cqltypes.Int32Type,
    "smallint": cqltypes.ShortType,
    "text": cqltypes.UTF8Type,
    "time": cqltypes.TimeType,
    "timestamp": cqltypes.DateType,
    "timeuuid": cqltypes.TimeUUIDType,
    "tinyint": cqltypes.ByteType,
    "uuid": cqltypes.UUIDType,
    "varchar": cqltypes.UTF8Type,
    "varint": cqltypes.IntegerType,
    "empty": cqltypes.BytesType,  # Cassandra's EmptyType: hidden value column of compact tables
}

# AbstractType.valueLengthIfFixed(): these values are written raw, without a length prefix.
# (date, time, smallint, tinyint and counter are variable-length although their values are small.)
_FIXED_LENGTHS = {
    "boolean": 1, "int": 4, "bigint": 8, "float": 4, "double": 8, "timestamp": 8,
    "uuid": 16, "timeuuid": 16, "empty": 0,
}

_COLLECTIONS = ("list", "set", "map")


class CqlTypeError(ValueError):
    """A type string that cannot be parsed, or a value that does not fit its type."""


@dataclass(frozen=True, eq=False)
class CqlType:
    """One CQL type, e.g. ``int``, ``frozen<map<text, int>>``, ``set<text>`` or a UDT.

    ``kind`` is the type's family: the simple type name, or ``list``, ``set``, ``map``, ``tuple``,
    ``udt`` or ``vector``. ``multi_cell`` is true for non-frozen collections and UDTs, which Cassandra
    stores as one cell per element (complex columns).
    """

    kind: str
    parameters: tuple["CqlType", ...] = ()
    frozen: bool = False
    udt_keyspace: str | None = None
    udt_name: str | None = None
    field_names: tuple[str, ...] = ()
    dimension: int = 0
    driver_type: Any = field(default=None, compare=False, repr=False)

    # Cached (in the instance dict, which a frozen dataclass still has): decoders read these per value.

    @cached_property
    def multi_cell(self) -> bool:
        return not self.frozen and self.kind in ("list", "set", "map", "udt")

    @cached_property
    def is_counter(self) -> bool:
        return self.kind == "counter"

    @cached_property
    def fixed_length(self) -> int | None:
        """Length of every value of this type, or None if values carry their own length."""
        if self.kind == "vector":
            element = self.parameters[0].fixed_length
            return None if element is None else element * self.dimension
        return _FIXED_LENGTHS.get(self.kind)

    # --- element access for multi-cell columns -------------------------------------------------

    @property
    def path_type(self) -> "CqlType":
        """Type of a cell path in a multi-cell column (list: timeuuid, set/map: key, udt: field index)."""
        if self.kind == "list":
            return TIMEUUID
        if self.kind in ("set", "map"):
            return self.parameters[0]
        if self.kind == "udt":
            return SMALLINT
        raise CqlTypeError(f"{self.cql} has no cell paths")

    def element_type(self, path: bytes) -> "CqlType":
        """Type of the value stored in the cell at ``path`` of a multi-cell column."""
        if self.kind == "list":
            return self.parameters[0]
        if self.kind == "set":
            return EMPTY
        if self.kind == "map":
            return self.parameters[1]
        if self.kind == "udt":
            return self.parameters[int.from_bytes(path, "big")]
        raise CqlTypeError(f"{self.cql} has no cell paths")

    # --- values ---------------------------------------------------------------------------------

    def deserialize(self, data: bytes) -> Any:
        """Decode a value's storage bytes (never empty: empty values are flagged, not encoded)."""
        if self.kind == "empty":
            return None
        return self.driver_type.deserialize(bytes(data), PROTOCOL_VERSION)

    def serialize(self, value: Any) -> bytes:
        if self.kind == "empty":
            return b""
        return self.driver_type.serialize(value, PROTOCOL_VERSION)

    def to_json(self, value: Any) -> Any:
        """Render a decoded value as JSON the way CQL's ``SELECT JSON`` shows it."""
        return _to_json(self, value)

    @property
    def cql(self) -> str:
        if self.kind == "udt":
            text = quote(self.udt_name or "")
        elif self.kind == "vector":
            text = f"vector<{self.parameters[0].cql}, {self.dimension}>"
        elif self.parameters:
            text = f"{self.kind}<{', '.join(p.cql for p in self.parameters)}>"
        else:
            text = self.kind
        wrap = self.frozen and self.kind in ("list", "set", "map", "udt", "tuple")
        return f"frozen<{text}>" if wrap and not self._implicitly_frozen else text

    @property
    def _implicitly_frozen(self) -> bool:
        return self.kind == "tuple"

    def user_types(self) -> Iterator["CqlType"]:
        """The user types this type uses, each one after those its fields use (repeats included)."""
        for parameter in self.parameters:
            yield from parameter.user_types()
        if self.kind == "udt":
            yield self

    def _identity(self) -> tuple:
        # Structural, so that two UDTs of the same name but different fields differ.
        return (self.kind, self.parameters, self.frozen, self.udt_keyspace, self.udt_name, self.field_names,
                self.dimension)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CqlType) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __str__(self) -> str:
        return self.cql


def quote(name: str) -> str:
    """A CQL identifier, double-quoted when it is not a plain lower-case name or is reserved."""
    if re.fullmatch(r"[a-z][a-z0-9_]*", name) and name not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


# Cassandra's reserved keywords (cql3/ReservedKeywords), plus unreserved ones quoted for readability.
_RESERVED = {
    "add", "allow", "alter", "and", "apply", "asc", "authorize", "batch", "begin", "by", "columnfamily",
    "create", "default", "delete", "desc", "describe", "drop", "entries", "execute", "from", "full", "grant",
    "if", "in", "index", "infinity", "insert", "into", "is", "keyspace", "limit", "materialized", "mbean",
    "mbeans", "modify", "nan", "norecursive", "not", "null", "of", "on", "or", "order", "primary", "rename",
    "replace", "revoke", "schema", "select", "set", "table", "to", "token", "truncate", "unlogged", "unset",
    "update", "use", "using", "view", "where", "with",
    "key", "static", "frozen", "list", "map", "tuple", "type", "ttl", "timestamp",
}


def simple_type(kind: str) -> CqlType:
    if kind not in _SIMPLE_TYPES:
        raise CqlTypeError(f"unknown CQL type {kind!r}")
    return CqlType(kind=kind, driver_type=_SIMPLE_TYPES[kind])


def list_type(element: CqlType, frozen: bool = False) -> CqlType:
    return CqlType("list", (element,), frozen, driver_type=cqltypes.ListType.apply_parameters([element.driver_type]))


def set_type(element: CqlType, frozen: bool = False) -> CqlType:
    return CqlType("set", (element,), frozen, driver_type=cqltypes.SetType.apply_parameters([element.driver_type]))


def map_type(key: CqlType, value: CqlType, frozen: bool = False) -> CqlType:
    driver = cqltypes.MapType.apply_parameters([key.driver_type, value.driver_type])
    return CqlType("map", (key, value), frozen, driver_type=driver)


def tuple_type(elements: tuple[CqlType, ...]) -> CqlType:
    driver = cqltypes.TupleType.apply_parameters([e.driver_type for e in elements])
    return CqlType("tuple", elements, True, driver_type=driver)


def vector_type(element: CqlType, dimension: int) -> CqlType:
    driver = cqltypes.VectorType.apply_parameters([element.driver_type, dimension], [])
    return CqlType("vector", (element,), True, dimension=dimension, driver_type=driver)


def user_type(keyspace: str, name: str, fields: Mapping[str, CqlType], frozen: bool = False) -> CqlType:
    names, types = tuple(fields), tuple(fields.values())
    driver = cqltypes.UserType.make_udt_class(keyspace, name, names, [t.driver_type for t in types])
    return CqlType("udt", types, frozen, udt_keyspace=keyspace, udt_name=name, field_names=names,
                   driver_type=driver)


def freeze(t: CqlType) -> CqlType:
    if t.frozen or t.kind not in ("list", "set", "map", "udt"):
        return t
    return CqlType(t.kind, t.parameters, True, t.udt_keyspace, t.udt_name, t.field_names, t.dimension,
                   t.driver_type)


TIMEUUID = simple_type("timeuuid")
SMALLINT = simple_type("smallint")
EMPTY = simple_type("empty")
BLOB = simple_type("blob")

_TOKEN = re.compile(r"""\s*("(?:[^"]|"")*"|'(?:[^']|'')*'|[A-Za-z0-9_]+|[<>,.])""")

# Custom types appear as quoted class names; EmptyType is the only one a CQL schema contains (the hidden
# value column of compact tables, written so by some 3.x versions).
_CUSTOM_TYPES = {"org.apache.cassandra.db.marshal.EmptyType": "empty", "EmptyType": "empty"}


def parse_type(text: str, keyspace: str = "", user_types: Mapping[str, CqlType] | None = None) -> CqlType:
    """Parse a CQL type as ``DESCRIBE`` or ``system_schema.columns.type`` writes it.

    ``user_types`` maps the UDT names of ``keyspace`` to their (non-frozen) types; a UDT may be named
    bare or qualified with ``keyspace`` (UDTs never cross keyspaces).
    """
    tokens = _tokenize(text)
    parsed, rest = _parse(tokens, keyspace, user_types or {}, text)
    if rest:
        raise CqlTypeError(f"unexpected {' '.join(rest)!r} at the end of type {text!r}")
    return parsed


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise CqlTypeError(f"cannot parse type {text!r} at character {pos}")
        tokens.append(match.group(1))
        pos = match.end()
    return tokens


def _parse(tokens: list[str], keyspace: str, udts: Mapping[str, CqlType], text: str) -> tuple[CqlType, list[str]]:
    if not tokens:
        raise CqlTypeError(f"incomplete type {text!r}")
    head, rest = tokens[0], tokens[1:]
    if head.startswith("'"):
        return _custom_type(head, text), rest
    qualifier = None
    if rest[:1] == ["."] and len(rest) > 1:
        qualifier, head, rest = _identifier(head), rest[1], rest[2:]
    name = _identifier(head)
    args: list[str | CqlType] = []
    if rest and rest[0] == "<":
        args, rest = _parse_arguments(rest[1:], keyspace, udts, text)
    if qualifier is None:
        built = _builtin_type(name, args, text)
        if built is not None:
            return built, rest
    if args:
        raise CqlTypeError(f"wrong parameters for {name} in type {text!r}")
    if qualifier is not None and qualifier != keyspace:
        raise CqlTypeError(f"type {qualifier}.{name} in {text!r} is not a type of keyspace {keyspace!r}")
    return _user_type(head, name, udts, keyspace, text), rest


def _identifier(token: str) -> str:
    # Unquoted identifiers are case-insensitive (lower-cased); quoted ones are exact.
    return token[1:-1].replace('""', '"') if token.startswith('"') else token.lower()


def _parse_arguments(tokens: list[str], keyspace: str, udts: Mapping[str, CqlType], text: str) \
        -> tuple[list[str | CqlType], list[str]]:
    """The comma-separated parameters after a '<', up to and including the matching '>'."""
    args: list[str | CqlType] = []
    rest = tokens
    while True:
        if rest and rest[0].isdigit():
            args.append(rest[0])
            rest = rest[1:]
        else:
            arg, rest = _parse(rest, keyspace, udts, text)
            args.append(arg)
        if not rest:
            raise CqlTypeError(f"unclosed '<' in type {text!r}")
        if rest[0] == ">":
            return args, rest[1:]
        if rest[0] != ",":
            raise CqlTypeError(f"expected ',' or '>' in type {text!r}, got {rest[0]!r}")
        rest = rest[1:]


def _builtin_type(name: str, args: list[str | CqlType], text: str) -> CqlType | None:
    types = [a for a in args if isinstance(a, CqlType)]
    # Types nested in a collection, tuple or vector are always frozen in storage.
    nested = [freeze(t) for t in types]
    if name == "frozen":
        if len(args) != 1 or len(types) != 1:
            raise CqlTypeError(f"frozen<> takes one type in {text!r}")
        return freeze(types[0])
    if name in ("list", "set") and len(args) == 1 == len(nested):
        return (list_type if name == "list" else set_type)(nested[0])
    if name == "map" and len(args) == 2 == len(nested):
        return map_type(nested[0], nested[1])
    if name == "tuple" and nested and len(args) == len(nested):
        return tuple_type(tuple(nested))
    if name == "vector" and len(args) == 2 and nested and isinstance(args[1], str) and int(args[1]) > 0:
        return vector_type(nested[0], int(args[1]))
    if name in _SIMPLE_TYPES and not args:
        return simple_type(name)
    return None


def _user_type(token: str, name: str, udts: Mapping[str, CqlType], keyspace: str, text: str) -> CqlType:
    # Some Cassandra versions write mixed-case UDT names unquoted in system_schema: try them verbatim too.
    for candidate in (name, token):
        if candidate in udts:
            return udts[candidate]
    raise CqlTypeError(f"unknown type {token!r} in {text!r} "
                       f"(not a CQL type nor a UDT of keyspace {keyspace!r})")


def _custom_type(token: str, text: str) -> CqlType:
    class_name = token[1:-1].replace("''", "'")
    if class_name in _CUSTOM_TYPES:
        return simple_type(_CUSTOM_TYPES[class_name])
    raise CqlTypeError(f"custom type {class_name!r} in {text!r} is not supported")


# --- JSON rendering -------------------------------------------------------------------------------

def _to_json(t: CqlType, value: Any) -> Any:
    if value is None:
        return None
    kind = t.kind
    if kind in ("text", "varchar", "ascii", "boolean", "int", "bigint", "smallint", "tinyint", "counter"):
        return value
    if kind in ("float", "double"):
        # JSON has no NaN or infinities: SELECT JSON shows them as null.
        if not math.isfinite(value):
            return None
        return shortest_float32(value) if kind == "float" else value
    if kind == "varint":
        return int(value)
    if kind == "decimal":
        return value  # a decimal.Decimal: json_text writes it as the number it is, digits and scale kept
    if kind == "blob":
        return "0x" + bytes(value).hex()
    if kind in ("uuid", "timeuuid"):
        return str(value)
    if kind == "inet":
        return inet_text(value)
    if kind == "timestamp":
        return _timestamp_text(value)
    if kind == "date":
        return str(value)
    if kind == "time":
        return str(value)
    if kind == "duration":
        return duration_text(value)
    if kind in ("list", "set", "vector"):
        return [_to_json(t.parameters[0], v) for v in value]
    if kind == "map":
        return {_map_key(t.parameters[0], k): _to_json(t.parameters[1], v) for k, v in value.items()}
    if kind == "tuple":
        return [_to_json(p, v) for p, v in zip(t.parameters, value)]
    if kind == "udt":
        # A field name with upper-case letters is quoted, as CQL writes it (so that fromJson reads it back).
        return {n if n == n.lower() else f'"{n}"':
                _to_json(p, getattr(value, n, None) if not isinstance(value, tuple) or hasattr(value, n)
                         else value[i])
                for i, (n, p) in enumerate(zip(t.field_names, t.parameters))}
    return str(value)


def shortest_float32(value: float) -> float:
    """A float column's value (a double holding its 32 bits exactly, 7.619999885559082 for 7.62) as the double
    of the fewest digits that still read back as the same 32 bits: what Java's Float.toString and SELECT JSON
    show (7.62).

    Java writes a number below 1e-3 or from 1e7 up as ``d.dddE±n``, with at least one digit after the point:
    there the fewest is two digits, the two closest to the value (Float.MIN_VALUE is 1.4E-45, not 1E-45)."""
    exact = _FLOAT32.pack(value)
    scientific = value != 0 and not 1e-3 <= abs(value) < 1e7
    for digits in range(2 if scientific else 1, 10):  # nine significant digits tell every float32 apart
        candidate = float(f"{value:.{digits}g}")
        try:
            if _FLOAT32.pack(candidate) == exact:
                return candidate
        except OverflowError:  # rounded past the largest float32
            continue
    return value


_FLOAT32 = struct.Struct(">f")


def _map_key(t: CqlType, key: Any) -> str:
    rendered = _to_json(t, key)
    return rendered if isinstance(rendered, str) else json_text(rendered, separators=(",", ":"))


def json_text(value: Any, *, separators: tuple[str, str] = (", ", ": "), ensure_ascii: bool = False) -> str:
    """``json.dumps`` of rendered values, writing a ``decimal.Decimal`` as the JSON number it is (as
    SELECT JSON does: ``12.3400``, ``1.234E-18``), which ``json`` cannot, and floating-point numbers as
    Java writes them (``1.0E300``, not ``1e+300``)."""
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return java_double_text(value)
    item, key = separators
    if isinstance(value, dict):
        return "{" + item.join(json.dumps(str(k), ensure_ascii=ensure_ascii) + key
                               + json_text(v, separators=separators, ensure_ascii=ensure_ascii)
                               for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + item.join(json_text(v, separators=separators, ensure_ascii=ensure_ascii)
                               for v in value) + "]"
    return json.dumps(value, ensure_ascii=ensure_ascii)


def java_double_text(value: float) -> str:
    """A finite double as Java's ``Double.toString`` writes it, which SELECT JSON shows: the shortest digits
    that read back as the value, in plain notation from 1e-3 up to 1e7 (``100.0``, ``0.001``), else as
    ``d.dddE±n`` with at least one digit after the point (``1.0E300``, ``1.5E-7``)."""
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)  # Python's repr is plain with a ".0" in that range, as Java's
    # normalize: repr writes 1e7 up to 1e16 plainly (10000000.0), its zeros not significant digits
    sign, digits, exponent = decimal.Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    power = len(text) - 1 + int(exponent)
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{power}"


def inet_text(value: str) -> str:
    """An address as Java's ``InetAddress.getHostAddress`` writes it, which SELECT JSON shows: IPv6 as eight
    groups without leading zeros and without ``::`` (``2001:db8:0:0:0:ff00:42:8329``), an IPv4-mapped IPv6
    address as the IPv4 address it maps (Java reads those 16 bytes as an Inet4Address)."""
    address = ipaddress.ip_address(value)
    if address.version == 4:
        return str(address)
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return ":".join(f"{int(group, 16):x}" for group in address.exploded.split(":"))


def _timestamp_text(value: datetime.datetime) -> str:
    # CQL shows timestamps as "2024-01-02 03:04:05.678Z" (millisecond precision, UTC).
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def duration_text(value: util.Duration) -> str:
    """A duration as CQL writes it, e.g. ``1mo2d3h4m5s6ms7us8ns`` (``0s`` when zero)."""
    months, days, nanos = value.months, value.days, value.nanoseconds
    negative = months < 0 or days < 0 or nanos < 0
    months, days, nanos = abs(months), abs(days), abs(nanos)
    parts = []
    if months:
        years, months = divmod(months, 12)
        parts += [f"{years}y"] if years else []
        parts += [f"{months}mo"] if months else []
    if days:
        parts.append(f"{days}d")
    for unit, size in (("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 1_000_000_000),
                       ("ms", 1_000_000), ("us", 1_000), ("ns", 1)):
        count, nanos = divmod(nanos, size)
        if count:
            parts.append(f"{count}{unit}")
    return ("-" if negative else "") + ("".join(parts) or "0s")


# --- Java class names (``AbstractType.toString()``), as SSTable headers and old schemas write types -----

# org.apache.cassandra.db.marshal classes of the CQL types (DateType is the pre-2.0 name of timestamp).
_MARSHAL_CLASSES = {
    "AsciiType": "ascii", "LongType": "bigint", "BytesType": "blob", "BooleanType": "boolean",
    "CounterColumnType": "counter", "SimpleDateType": "date", "DecimalType": "decimal", "DoubleType": "double",
    "DurationType": "duration", "FloatType": "float", "InetAddressType": "inet", "Int32Type": "int",
    "ShortType": "smallint", "UTF8Type": "text", "TimeType": "time", "TimestampType": "timestamp",
    "DateType": "timestamp", "TimeUUIDType": "timeuuid", "ByteType": "tinyint", "UUIDType": "uuid",
    "LexicalUUIDType": "uuid", "IntegerType": "varint", "EmptyType": "empty",
}

_CLASS_TOKEN = re.compile(r"\s*([^(),:\s]+|[(),:])")


@dataclass(frozen=True)
class _ClassNode:
    name: str
    args: tuple["_ClassNode", ...] = ()
    label: str | None = None  # "hexname:" before a UDT field's type

    @property
    def short(self) -> str:
        return self.name.rsplit(".", 1)[-1]


def _parse_class_name(text: str) -> _ClassNode:
    tokens = [m.group(1) for m in _CLASS_TOKEN.finditer(text)]
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise CqlTypeError(f"cannot parse type class name {text!r}")
    node, rest = _class_node(tokens, text)
    if rest:
        raise CqlTypeError(f"unexpected {''.join(rest)!r} at the end of type class name {text!r}")
    return node


def _class_node(tokens: list[str], text: str) -> tuple[_ClassNode, list[str]]:
    if not tokens or tokens[0] in "(),:":
        raise CqlTypeError(f"incomplete type class name {text!r}")
    name, rest = tokens[0], tokens[1:]
    label = None
    if rest[:1] == [":"]:
        label, (node, rest) = name, _class_node(rest[1:], text)
        return _ClassNode(node.name, node.args, label), rest
    args: list[_ClassNode] = []
    if rest[:1] == ["("]:
        rest = rest[1:]
        while rest[:1] != [")"]:
            arg, rest = _class_node(rest, text)
            args.append(arg)
            if rest[:1] == [","]:
                rest = rest[1:]
            elif rest[:1] != [")"]:
                raise CqlTypeError(f"expected ',' or ')' in type class name {text!r}")
        rest = rest[1:]
    return _ClassNode(name, tuple(args), label), rest


def is_reversed_class_name(text: str) -> bool:
    """Whether a clustering type class name is ``ReversedType(...)`` (a DESC clustering column)."""
    return _parse_class_name(text).short == "ReversedType"


def type_from_class_name(text: str) -> CqlType:
    """A CQL type from its Java class name, e.g. ``org.apache.cassandra.db.marshal.MapType(UTF8Type,Int32Type)``.

    This is how SSTable headers (``Statistics.db``) and pre-3.0 schemas name types. ``ReversedType`` (the
    type of a DESC clustering column) gives the type it wraps; a ``CompositeType`` (a composite partition
    key) is not a single type: see :func:`types_from_composite_class_name`.
    """
    return _from_class_node(_parse_class_name(text), text)


def types_from_composite_class_name(text: str) -> list[CqlType]:
    """The component types of a partition key type: several for ``CompositeType(...)``, else one."""
    node = _parse_class_name(text)
    if node.short == "CompositeType":
        return [_from_class_node(arg, text) for arg in node.args]
    return [_from_class_node(node, text)]


def _from_class_node(node: _ClassNode, text: str) -> CqlType:
    short, args = node.short, node.args
    if short in _MARSHAL_CLASSES and not args:
        return simple_type(_MARSHAL_CLASSES[short])
    if short == "ReversedType" and len(args) == 1:
        return _from_class_node(args[0], text)
    if short == "FrozenType" and len(args) == 1:
        return freeze(_from_class_node(args[0], text))
    nested = [freeze(_from_class_node(a, text)) for a in args] if short not in ("UserType", "VectorType") else []
    if short in ("ListType", "SetType") and len(nested) == 1:
        return (list_type if short == "ListType" else set_type)(nested[0])
    if short == "MapType" and len(nested) == 2:
        return map_type(nested[0], nested[1])
    if short == "TupleType" and nested:
        return tuple_type(tuple(nested))
    if short == "VectorType" and len(args) == 2 and args[1].name.isdigit() and not args[1].args:
        return vector_type(freeze(_from_class_node(args[0], text)), int(args[1].name))
    if short == "UserType" and len(args) >= 2 and all(a.label is not None for a in args[2:]):
        try:
            name = bytes.fromhex(args[1].name).decode("utf-8")
            fields = {bytes.fromhex(a.label or "").decode("utf-8"): freeze(_from_class_node(a, text))
                      for a in args[2:]}
        except ValueError as error:
            raise CqlTypeError(f"malformed UserType in type class name {text!r}: {error}") from None
        return user_type(args[0].name, name, fields)
    raise CqlTypeError(f"unsupported type class {node.name!r} in {text!r}")


__all__ = [
    "CqlType", "CqlTypeError", "parse_type", "simple_type", "list_type", "set_type", "map_type",
    "tuple_type", "vector_type", "user_type", "freeze", "duration_text", "quote", "type_from_class_name",
    "types_from_composite_class_name", "is_reversed_class_name", "shortest_float32",
]
