"""Decoding the mutations of a segment, as Cassandra's replay does: unknown tables skipped and counted."""

from __future__ import annotations

import collections
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from ..schema.model import Schema
from .segment_descriptor import MUTATION_VERSIONS
from ..storage.decode_errors import MutationDecodeError, UnknownTableError
from .segment_errors import CommitLogError
from .mutation import Mutation, MutationSerializer
from .segment_reader import DamageKind, Entry, SegmentReader


@dataclass
class ReplayStats:
    entries: int = 0
    mutations: int = 0
    partition_updates: int = 0
    skipped_unknown_tables: collections.Counter[uuid.UUID] = field(default_factory=collections.Counter)
    undecodable: int = 0


def replay(segment: SegmentReader, schema: Schema, stats: ReplayStats | None = None) -> Iterator[tuple[Entry, Mutation]]:
    """The decoded mutations of a segment's intact entries.

    A mutation touching a table the schema does not know is skipped whole (as Cassandra does) and
    counted by table id; one that fails to decode is reported as damage on the segment, with its bytes.
    """
    if segment.version not in MUTATION_VERSIONS:
        raise CommitLogError(f"commit log version {segment.version} holds pre-3.0 mutations, which cannot be "
                             "decoded (its framing can still be checked)", segment.path)
    stats = stats if stats is not None else ReplayStats()
    for entry in segment.entries():
        stats.entries += 1
        try:
            mutation = MutationSerializer.deserialize(entry.body, schema, segment.version)
        except UnknownTableError as error:
            stats.skipped_unknown_tables[error.table_id] += 1
            continue
        except MutationDecodeError as error:
            stats.undecodable += 1
            segment.report(DamageKind.UNDECODABLE_MUTATION, str(error), entry.section_offset, entry.start, entry.body)
            continue
        stats.mutations += 1
        stats.partition_updates += len(mutation.updates)
        yield entry, mutation
