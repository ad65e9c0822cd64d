"""Typed errors of the row and partition format: what failed to decode, and at which byte."""

from __future__ import annotations

import uuid


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
