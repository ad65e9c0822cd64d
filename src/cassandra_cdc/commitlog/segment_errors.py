"""Typed errors of the commit log reader: each says what failed and where."""

from __future__ import annotations


class CommitLogError(Exception):
    """A segment (or part of one) that cannot be read. ``path`` and ``offset`` say where."""

    def __init__(self, reason: str, path: str = "", offset: int | None = None) -> None:
        self.reason = reason
        self.path = path
        self.offset = offset
        where = path + (f" at offset {offset}" if offset is not None else "")
        super().__init__(f"{where}: {reason}" if where else reason)


class DescriptorError(CommitLogError):
    """The segment header is unreadable: bad CRC, unsupported version, bad parameters."""
