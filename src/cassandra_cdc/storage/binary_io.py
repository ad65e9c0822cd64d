"""Byte cursors shared by every serializer: ``DataInput`` reads, ``DataOutput`` writes.

Big-endian fixed-width integers as java.io.DataInput/DataOutput, plus Cassandra's vints.
"""

from __future__ import annotations

import mmap
import struct

from .vint import read_unsigned_vint, write_unsigned_vint

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_USHORT = struct.Struct(">H")


class EndOfData(ValueError):
    """A read ran past the end of the bytes being decoded."""


def read_bytes_vint(buf: bytes, pos: int) -> tuple[bytes, int]:
    """The value at ``pos`` preceded by its length as an unsigned vint, and the position after it.

    For local-cursor serializers, which check the final position against their end themselves.
    """
    size = buf[pos]
    if size < 0x80:  # most lengths are one byte: skip the call
        pos += 1
    else:
        size, pos = read_unsigned_vint(buf, pos)
    return buf[pos:pos + size], pos + size


class DataInput:
    """A cursor over bytes: ``buf[pos:end]`` is what is left to read.

    Serializers on hot paths read ``buf`` at ``pos`` directly and store ``pos`` back (a "local cursor":
    attribute and method lookups per field cost more than the decoding); they call ``require`` first when
    their input may not all be in ``buf`` yet (see ``StreamInput``).
    """

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | bytearray | memoryview | mmap.mmap, pos: int = 0, end: int | None = None) -> None:
        # Slices of bytes (and of an mmap) are bytes, so every value read is bytes, as the row and cell
        # objects hold; a memoryview or bytearray is copied once rather than per value.
        self.buf = bytes(buf) if isinstance(buf, (memoryview, bytearray)) else buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def _take(self, size: int) -> int:
        start = self.pos
        if start + size > self.end:
            raise EndOfData(f"needed {size} bytes at offset {start}, only {self.end - start} left")
        self.pos = start + size
        return start

    def require(self, size: int) -> None:
        """Fail unless the next ``size`` bytes are in ``buf`` (a subclass streaming its input loads them)."""
        if self.pos + size > self.end:
            raise EndOfData(f"needed {size} bytes at offset {self.pos}, only {self.end - self.pos} left")

    def move_to(self, pos: int) -> None:
        """Continue at ``pos``, where a local-cursor serializer stopped; fail if that is past the end."""
        if pos > self.end:
            raise EndOfData(f"data at offset {self.pos} runs {pos - self.end} bytes past the end")
        self.pos = pos

    def byte(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise EndOfData(f"needed 1 byte at offset {pos}, no bytes left")
        self.pos = pos + 1
        return self.buf[pos]

    def uvint(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise EndOfData(f"needed a vint at offset {pos}, no bytes left")
        first = self.buf[pos]
        if first < 0x80:  # most vints are one byte: skip the call
            self.pos = pos + 1
            return first
        value, after = read_unsigned_vint(self.buf, pos)
        if after > self.end:
            raise EndOfData(f"vint at offset {pos} runs past the end")
        self.pos = after
        return value

    # ``_take`` before reading ``self.buf``: a streaming subclass replaces the buffer when it loads more
    # (``self.buf`` as the first argument would be the buffer from before the load).

    def int32(self) -> int:
        start = self._take(4)
        return _INT.unpack_from(self.buf, start)[0]

    def int64(self) -> int:
        start = self._take(8)
        return _LONG.unpack_from(self.buf, start)[0]

    def uint16(self) -> int:
        start = self._take(2)
        return _USHORT.unpack_from(self.buf, start)[0]

    def raw(self, size: int) -> bytes:
        start = self.pos
        stop = start + size
        if stop > self.end:
            raise EndOfData(f"needed {size} bytes at offset {start}, only {self.end - start} left")
        self.pos = stop
        return self.buf[start:stop]

    def bytes_vint(self) -> bytes:
        """A value preceded by its length as an unsigned vint."""
        return self.raw(self.uvint())

    @property
    def remaining(self) -> int:
        return self.end - self.pos


class DataOutput(bytearray):
    def byte(self, value: int) -> None:
        self.append(value)

    def uvint(self, value: int) -> None:
        self += write_unsigned_vint(value)

    def int32(self, value: int) -> None:
        self += _INT.pack(value)

    def int64(self, value: int) -> None:
        self += _LONG.pack(value)

    def uint16(self, value: int) -> None:
        self += _USHORT.pack(value)

    def bytes_vint(self, value: bytes) -> None:
        self += write_unsigned_vint(len(value))
        self += value
