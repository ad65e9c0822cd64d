"""Typed errors of the SSTable reader: each says what failed, in which file and where."""

from __future__ import annotations

import os


class SSTableError(Exception):
    """An SSTable (or one of its components) that cannot be read. ``path`` and ``offset`` say where."""

    def __init__(self, reason: str, path: str | os.PathLike[str] = "", offset: int | None = None) -> None:
        self.reason = reason
        self.path = str(path)
        self.offset = offset
        where = self.path + (f" at offset {offset}" if offset is not None else "")
        super().__init__(f"{where}: {reason}" if where else reason)


class UnsupportedSSTableError(SSTableError):
    """A format, version or component this reader does not handle (e.g. pre-3.0 ``ka``/``la`` files)."""


class ChecksumError(SSTableError):
    """Stored and computed checksums differ: a chunk's CRC32, a ``CRC.db`` block, ``Digest.crc32`` or metadata.

    ``chunk`` is the index of the damaged chunk (None for whole-file and metadata checksums); ``offset`` is
    where the chunk starts in the file named by ``path``.
    """

    def __init__(self, reason: str, path: str | os.PathLike[str], offset: int | None = None,
                 chunk: int | None = None) -> None:
        self.chunk = chunk
        super().__init__(reason, path, offset)
