"""Mutations: the unit of a commit log entry (docs/storage-format.md §8)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schema.model import Schema
from ..storage.decode_errors import MutationDecodeError
from ..storage.binary_io import DataInput, DataOutput, EndOfData
from ..storage.partition_update import PartitionUpdate, PartitionUpdateSerializer
from ..storage.vint import read_unsigned_vint


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
        mutation = Mutation([update for _, update in _read_updates(inp, schema, version)])
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


def split_partition_updates(body: bytes, schema: Schema, version: int) -> list[bytes]:
    """The serialized partition updates of a mutation (each starts with its 16-byte table id), without
    decoding rows when the mutation has a single update (the common case). Several updates have no
    length prefix, so finding their boundaries decodes them (and needs every table's schema, as
    Cassandra does).
    """
    count, start = read_unsigned_vint(body, 0)
    if count == 1:
        return [body[start:]]
    inp = DataInput(body)
    starts = [begin for begin, _ in _read_updates(inp, schema, version)]
    return [body[begin:end] for begin, end in zip(starts, starts[1:] + [inp.pos])]


def _read_updates(inp: DataInput, schema: Schema, version: int) -> list[tuple[int, PartitionUpdate]]:
    """The count, then the partition updates of a mutation with their start offsets.

    Any failure becomes a MutationDecodeError naming the offset where decoding stopped.
    """
    updates = []
    try:
        count = inp.uvint()
        if count < 1:
            raise MutationDecodeError("a mutation with no partition update", 0)
        for _ in range(count):
            begin = inp.pos
            updates.append((begin, PartitionUpdateSerializer.deserialize(inp, schema, version)))
    except MutationDecodeError:
        raise
    except (EndOfData, ValueError, IndexError, KeyError) as error:
        raise MutationDecodeError(str(error), inp.pos) from error
    return updates
