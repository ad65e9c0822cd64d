"""Typed errors of the commit log reader: each says what failed and where."""

from __future__ import annotations

import uuid


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


class MutationDecodeError(ValueError):
    """A mutation's bytes do not decode with the schema given (``offset`` within the mutation)."""

    def __init__(self, reason: str, offset: int) -> None:
        self.reason = reason
        self.offset = offset
        super().__init__(f"{reason} (at byte {offset} of the mutation)")


class UnknownTableError(MutationDecodeError):
    """A partition update of a table the schema does not know: Cassandra skips the whole mutation."""

    def __init__(self, table_id: uuid.UUID, offset: int) -> None:
        self.table_id = table_id
        super().__init__(f"unknown table id {table_id}", offset)
