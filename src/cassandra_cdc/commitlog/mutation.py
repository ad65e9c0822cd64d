"""Mutations: the unit of a commit log entry (commitlog-format.md §5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schema.model import Schema
from .errors import MutationDecodeError, UnknownTableError
from .io import DataInput, DataOutput, EndOfData
from .partition import PartitionUpdate, PartitionUpdateSerializer


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
        try:
            count = inp.uvint()
            if count < 1:
                raise MutationDecodeError("a mutation with no partition update", 0)
            mutation = Mutation([PartitionUpdateSerializer.deserialize(inp, schema, version) for _ in range(count)])
        except (UnknownTableError, MutationDecodeError):
            raise
        except (EndOfData, ValueError, IndexError, KeyError) as error:
            raise MutationDecodeError(str(error), inp.pos) from error
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
