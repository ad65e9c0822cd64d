"""Byte cursors shared by every serializer: ``DataInput`` reads, ``DataOutput`` writes.

Big-endian fixed-width integers as java.io.DataInput/DataOutput, plus Cassandra's vints.
"""

from __future__ import annotations

import struct

from .vint import read_unsigned_vint, write_unsigned_vint

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_USHORT = struct.Struct(">H")


class EndOfData(ValueError):
    """A read ran past the end of the bytes being decoded."""


class DataInput:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def _take(self, size: int) -> int:
        start = self.pos
        if start + size > self.end:
            raise EndOfData(f"needed {size} bytes at offset {start}, only {self.end - start} left")
        self.pos = start + size
        return start

    def byte(self) -> int:
        start = self._take(1)
        return self.buf[start]

    def uvint(self) -> int:
        if self.pos >= self.end:
            raise EndOfData(f"needed a vint at offset {self.pos}, no bytes left")
        value, pos = read_unsigned_vint(self.buf, self.pos)
        if pos > self.end:
            raise EndOfData(f"vint at offset {self.pos} runs past the end")
        self.pos = pos
        return value

    def int32(self) -> int:
        return _INT.unpack_from(self.buf, self._take(4))[0]

    def int64(self) -> int:
        return _LONG.unpack_from(self.buf, self._take(8))[0]

    def uint16(self) -> int:
        return _USHORT.unpack_from(self.buf, self._take(2))[0]

    def raw(self, size: int) -> bytes:
        start = self._take(size)
        return bytes(self.buf[start:start + size])

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
