"""A ``DataInput`` over a stream of chunks: the commit log serializers read Data.db through it unchanged.

Only a window of the file (about one chunk) is in memory; ``position`` is the offset in the uncompressed
Data.db.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from ..storage.binary_io import DataInput, EndOfData

_MAX_VINT = 9


class StreamInput(DataInput):
    __slots__ = ("_chunks", "_base")

    def __init__(self, chunks: Iterable[bytes], base: int = 0) -> None:
        super().__init__(b"", 0, 0)
        self._chunks: Iterator[bytes] = iter(chunks)
        self._base = base  # file offset of buf[0]

    @property
    def position(self) -> int:
        return self._base + self.pos

    def _fill(self, size: int) -> bool:
        """Make ``size`` bytes from ``pos`` available; False if the stream ends first."""
        have = self.end - self.pos
        parts = [self.buf[self.pos:self.end]] if have else []
        while have < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            parts.append(chunk)
            have += len(chunk)
        self._base += self.pos
        self.buf = parts[0] if len(parts) == 1 else b"".join(parts)
        self.pos, self.end = 0, len(self.buf)
        return have >= size

    def require(self, size: int) -> None:
        if self.pos + size > self.end and not self._fill(size):
            raise EndOfData(f"needed {size} bytes at offset {self.position}, the data ends "
                            f"{self.end - self.pos} bytes later")

    def _take(self, size: int) -> int:
        self.require(size)
        return super()._take(size)

    def byte(self) -> int:
        self.require(1)
        return super().byte()

    def raw(self, size: int) -> bytes:
        self.require(size)
        return super().raw(size)

    def uvint(self) -> int:
        if self.end - self.pos < _MAX_VINT:
            self._fill(_MAX_VINT)
        return super().uvint()

    def skip(self, size: int) -> None:
        while size > 0:
            if self.pos >= self.end and not self._fill(1):
                raise EndOfData(f"cannot skip {size} bytes at offset {self.position}: the data ends")
            step = min(size, self.end - self.pos)
            self.pos += step
            size -= step

    def skip_to(self, position: int) -> None:
        """Move forward to a file offset (which must not be behind the current one)."""
        if position < self.position:
            raise ValueError(f"cannot move back from offset {self.position} to {position}")
        self.skip(position - self.position)

    def at_end(self) -> bool:
        return self.pos >= self.end and not self._fill(1)
