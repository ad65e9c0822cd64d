"""Debezium's column options: the columns events leave out, and the values they carry masked.

Debezium's names and semantics (``column.exclude.list``, ``column.truncate.to.N.chars``,
``column.mask.with.N.chars``, ``column.mask.hash[.v2].<algorithm>.with.salt.<salt>``): each rule is a list of
regular expressions matched, whole and case-insensitively, against a column's fully-qualified name
``<keyspace>.<table>.<column>``.

- An excluded column is left out of the events' ``before`` and ``after`` and of their schema; a primary key
  column stays in the key.
- A truncated column's values longer than N characters are cut to N; a masked one's values (null included)
  are N asterisks; a hashed one's values (not null) are the lowercase hexadecimal digest of the salt's UTF-8
  bytes followed by the value's bytes: its UTF-8 bytes (``v2``), or the value serialized as Java serializes
  a string (version 1, Debezium's first and default form). They apply to the key as to the rows.
- A column matched by several of those gets one: a truncation first, then a mask, then a hash (version 1
  before version 2), each kind in the order given, as Debezium's mappers do.
- They apply to the character types (``text``, ``varchar``, ``ascii``). Where Debezium passes the values of
  another type through unmasked, a rule that matches one is refused (``ColumnRuleError``): a mask that
  silently does nothing would put the data it was meant to hide into Kafka.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from ..schema import ColumnMetadata, TableMetadata

__all__ = ["ColumnRuleError", "ColumnRules", "HashMask", "Rewrite", "checked_patterns", "hash_algorithm",
           "java_serialized_string"]

CHARACTER_TYPES = frozenset({"text", "varchar", "ascii"})
# Java's standard MessageDigest names (looked up case-insensitively, as Java does) and hashlib's.
HASH_ALGORITHMS = {"MD5": "md5", "SHA": "sha1", "SHA-1": "sha1", "SHA-224": "sha224", "SHA-256": "sha256",
                   "SHA-384": "sha384", "SHA-512": "sha512", "SHA-512/224": "sha512_224",
                   "SHA-512/256": "sha512_256", "SHA3-224": "sha3_224", "SHA3-256": "sha3_256",
                   "SHA3-384": "sha3_384", "SHA3-512": "sha3_512"}

Rewrite = Callable[[Any], Any]


class ColumnRuleError(ValueError):
    """A column rule that cannot be applied to a table's column (the message names both)."""


@dataclass(frozen=True)
class HashMask:
    """``column.mask.hash.<algorithm>.with.salt.<salt>`` (``version`` 1) or its ``v2`` form."""
    algorithm: str
    salt: str
    columns: tuple[str, ...]
    version: Literal[1, 2] = 1

    def rewrite(self) -> Rewrite:
        name, salt = hash_algorithm(self.algorithm), self.salt.encode()
        serialized: Callable[[str], bytes] = str.encode if self.version == 2 else java_serialized_string

        def hashed(value: str | None) -> str | None:
            return None if value is None else hashlib.new(name, salt + serialized(value)).hexdigest()

        return hashed


@dataclass(frozen=True)
class ColumnRules:
    """The column options of a pipeline (``output`` in its configuration), applied per table."""
    exclude: tuple[str, ...] = ()
    truncate: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (characters kept, columns)
    mask: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (asterisks, columns)
    hashes: tuple[HashMask, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.exclude or self.truncate or self.mask or self.hashes)

    def excluded(self, table: TableMetadata) -> frozenset[str]:
        """The names of the columns of ``table`` its events' rows leave out (primary key ones included:
        they stay in the key)."""
        return frozenset(c.name for c in table.columns if _matches(self.exclude, table, c))

    def rewrites(self, table: TableMetadata) -> dict[str, Rewrite]:
        """How the values of each rewritten column of ``table`` are rewritten, by column name; raises
        ``ColumnRuleError`` for a rule that matches a column of a type it does not apply to."""
        rules = [*((columns, _truncation(n)) for n, columns in self.truncate),
                 *((columns, _mask(n)) for n, columns in self.mask),
                 *((h.columns, h.rewrite()) for h in sorted(self.hashes, key=lambda h: h.version))]
        rewrites: dict[str, Rewrite] = {}
        for column in table.columns:
            rewrite = next((make for patterns, make in rules if _matches(patterns, table, column)), None)
            if rewrite is None:
                continue
            if column.type.kind not in CHARACTER_TYPES:
                raise ColumnRuleError(
                    f"{_qualified(table, column)} is a {column.type.cql} column: a column truncation, mask "
                    f"or hash applies to text, varchar and ascii columns only (leave it out with "
                    f"column_exclude_list instead)")
            rewrites[column.name] = rewrite
        return rewrites

    def project(self, table: TableMetadata) -> TableMetadata:
        """``table`` without its excluded columns (but those of the primary key), as its events show it."""
        excluded = self.excluded(table)
        if not excluded:
            return table
        kept = tuple(c for c in table.regular_and_static if c.name not in excluded)
        return dataclasses.replace(table, regular_and_static=kept,
                                   dropped=tuple(c for c in table.dropped if c.name not in excluded))


def hash_algorithm(name: str) -> str:
    """hashlib's name of a Java MessageDigest algorithm (``SHA-256``: ``sha256``); ValueError if unknown."""
    found = HASH_ALGORITHMS.get(name.upper())
    if found is None:
        raise ValueError(f"unknown hash algorithm {name!r}: one of {', '.join(HASH_ALGORITHMS)} (Java's "
                         "MessageDigest names)")
    return found


def checked_patterns(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """``patterns``, each a valid regular expression (ValueError naming the first that is not)."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{pattern!r} is not a regular expression: {error}") from None
    return patterns


def _matches(patterns: Iterable[str], table: TableMetadata, column: ColumnMetadata) -> bool:
    name = _qualified(table, column)
    return any(re.fullmatch(pattern, name, re.IGNORECASE) for pattern in patterns)


def _qualified(table: TableMetadata, column: ColumnMetadata) -> str:
    return f"{table.keyspace}.{table.name}.{column.name}"


def _truncation(length: int) -> Rewrite:
    return lambda value: value if value is None else value[:length]


def _mask(length: int) -> Rewrite:
    masked = "*" * length
    return lambda value: masked


def java_serialized_string(text: str) -> bytes:
    """``text`` as Java's ``ObjectOutputStream.writeObject`` writes a String: the stream header, then
    ``TC_STRING`` and a 2-byte length (``TC_LONGSTRING`` and 8 bytes beyond 65,535 bytes) of its modified
    UTF-8: each UTF-16 code unit in 1 to 3 bytes, NUL in 2."""
    units = text.encode("utf-16-be", "surrogatepass")
    encoded = bytearray()
    for i in range(0, len(units), 2):
        unit = (units[i] << 8) | units[i + 1]
        if 0 < unit < 0x80:
            encoded.append(unit)
        elif unit < 0x800:
            encoded += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            encoded += bytes((0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F))
    header = b"\xac\xed\x00\x05"  # STREAM_MAGIC, STREAM_VERSION
    if len(encoded) <= 0xFFFF:
        return header + b"\x74" + len(encoded).to_bytes(2, "big") + bytes(encoded)
    return header + b"\x7c" + len(encoded).to_bytes(8, "big") + bytes(encoded)
