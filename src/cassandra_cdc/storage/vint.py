"""Cassandra's variable-length integers (``VIntCoding``) and Java integer wrap-around.

An unsigned vint's first byte has as many leading 1-bits as extra bytes follow (0 to 8); the rest of
the first byte and the extra bytes hold the value, big-endian. Values are Java longs: a negative number
(a sign-extended int delta, for instance) is a 9-byte vint.
"""

from __future__ import annotations

_UINT64 = (1 << 64) - 1
# Java's Integer and Long limits
INT_MIN = -(1 << 31)
INT_MAX = (1 << 31) - 1
LONG_MIN = -(1 << 63)
LONG_MAX = (1 << 63) - 1


def s32(value: int) -> int:
    """Java ``(int)`` cast: the low 32 bits as a signed int."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def s64(value: int) -> int:
    """Java ``(long)`` cast: the low 64 bits as a signed long."""
    value &= _UINT64
    return value - (1 << 64) if value >> 63 else value


# By first byte: how many bytes the vint has (its leading 1-bits, plus one).
_VINT_SIZES = tuple(9 - (first ^ 0xFF).bit_length() for first in range(256))
# By vint size: the mask that clears the leading 1-bits of the big-endian number the vint's bytes make
# (7 value bits a byte, and all 64 bits of a 9-byte vint).
_VINT_VALUE_MASKS = tuple((1 << (64 if size == 9 else 7 * size)) - 1 for size in range(10))


def read_unsigned_vint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode the vint at ``pos``; return (value as unsigned 64-bit, position after it)."""
    first = buf[pos]
    if first < 0x80:
        return first, pos + 1
    size = _VINT_SIZES[first]
    end = pos + size
    if end > len(buf):
        raise IndexError("vint runs past the end of the buffer")
    return int.from_bytes(buf[pos:end], "big") & _VINT_VALUE_MASKS[size], end


def write_unsigned_vint(value: int) -> bytes:
    """Encode a Java long (negative values are written as their unsigned 64-bit pattern)."""
    value &= _UINT64
    if value < 0x80:
        return bytes((value,))
    extra = (value.bit_length() - 1) // 7
    if extra >= 8:
        return b"\xff" + value.to_bytes(8, "big")
    first_marker = (0xFF << (8 - extra)) & 0xFF
    encoded = value.to_bytes(extra + 1, "big")
    return bytes((encoded[0] | first_marker,)) + encoded[1:]


def read_signed_vint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Zig-zag encoded vint (used inside ``duration`` values)."""
    raw, pos = read_unsigned_vint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def write_signed_vint(value: int) -> bytes:
    return write_unsigned_vint((value << 1) ^ (value >> 63))
