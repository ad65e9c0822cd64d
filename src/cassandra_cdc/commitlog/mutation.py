"""Mutations: the unit of a commit log entry (commitlog-format.md §5)."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from ..schema.model import Schema
from .errors import MutationDecodeError
from .io import DataInput, DataOutput, EndOfData
from .partition import PartitionUpdate, PartitionUpdateSerializer
from .vint import read_unsigned_vint


@dataclass(slots=True)
class Mutation:
    """Changes to one partition key of one keyspace, in one or more tables."""

    updates: list[PartitionUpdate] = field(default_factory=list)

    @property
    def key(self) -> bytes:
        return self.updates[0].key

    @property
    def keyspace(self) -> str:
        return self.updates[0].table.keyspace


class MutationSerializer:
    @staticmethod
    def deserialize(body: bytes | memoryview, schema: Schema, version: int) -> Mutation:
        """Decode a whole mutation; every byte must be consumed.

        Raises UnknownTableError (the whole mutation is to be skipped, as Cassandra does) or
        MutationDecodeError naming the offset where decoding failed.
        """
        inp = DataInput(body)
        with _decoding(inp):
            count = inp.uvint()
            if count < 1:
                raise MutationDecodeError("a mutation with no partition update", 0)
            mutation = Mutation([PartitionUpdateSerializer.deserialize(inp, schema, version) for _ in range(count)])
        if inp.remaining:
            raise MutationDecodeError(f"{inp.remaining} bytes left after the last partition update", inp.pos)
        return mutation

    @staticmethod
    def serialize(mutation: Mutation, version: int) -> bytes:
        out = DataOutput()
        out.uvint(len(mutation.updates))
        for update in mutation.updates:
            PartitionUpdateSerializer.serialize(update, out, version)
        return bytes(out)


def split_partition_updates(body: bytes, schema: Schema, version: int) -> list[tuple[uuid.UUID, bytes]]:
    """The serialized partition updates of a mutation, with their table ids, without decoding rows
    when the mutation has a single update (the common case). Several updates have no length prefix,
    so finding their boundaries decodes them (and needs every table's schema, as Cassandra does).
    """
    count, start = read_unsigned_vint(body, 0)
    if count == 1:
        return [(uuid.UUID(bytes=body[start:start + 16]), body[start:])]
    inp = DataInput(body, start)
    updates = []
    with _decoding(inp):
        for _ in range(count):
            begin = inp.pos
            update = PartitionUpdateSerializer.deserialize(inp, schema, version)
            updates.append((update.table.id, body[begin:inp.pos]))
    return updates


@contextlib.contextmanager
def _decoding(inp: DataInput) -> Iterator[None]:
    """Turn any failure inside a mutation into a MutationDecodeError naming the offset."""
    try:
        yield
    except MutationDecodeError:
        raise
    except (EndOfData, ValueError, IndexError, KeyError) as error:
        raise MutationDecodeError(str(error), inp.pos) from error
