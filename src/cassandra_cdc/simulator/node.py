"""One simulated Cassandra node: its commit log and ``cdc_raw`` directories, kept as the real node does.

What a CDC consumer sees depends on the Cassandra version (docs/storage-format.md §7):

* 4.0 / 4.1 / 5.0: every new segment is hard-linked into ``cdc_raw`` when it is created. Once the segment
  contains data of a ``cdc = true`` table, each sync rewrites ``<segment>_cdc.idx`` with the synced
  (logical) offset, and closing it appends ``COMPLETED``. A segment that never held CDC data loses its
  link when it is discarded.
* 3.0 / 3.11: nothing appears in ``cdc_raw`` until a segment is discarded; then it is moved there if
  it contained CDC data, deleted otherwise.

The simulation discards a segment as soon as it is closed, as if every memtable were flushed at once: so
``commitlog/`` only ever holds the active segment, and ``cdc_raw`` holds exactly what a consumer must read.

With ``cdc_total_space`` and ``cdc_block_writes=False`` (4.1+), a new segment that takes ``cdc_raw`` over
``cdc_total_space`` makes the node delete the oldest segments there (and their idx files), published or not,
as Cassandra's ``CommitLogSegmentManagerCDC`` does; the segment being written is never deleted.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from ..commitlog import Mutation, MutationSerializer, SegmentFull, SegmentWriter, cdc_index_file_name, write_cdc_index
from ..commitlog.segment_descriptor import parse_segment_name, segment_file_name
from ..commitlog.segment_writer import DEFAULT_SEGMENT_SIZE
from ..schema import Schema

# Cassandra version (as configured) -> commit log version it writes (docs/storage-format.md §2.2).
COMMITLOG_VERSIONS = {
    "3.0": 6, "3.11": 6,
    "4.0": 7, "4.1": 7,
    "5.0": 7,  # storage_compatibility_mode: CASSANDRA_4, the 5.0 default
    "5.0-nocompat": 8,  # storage_compatibility_mode: NONE
}
# Commit log versions whose segments are hard-linked into cdc_raw with a _cdc.idx (CASSANDRA-12148).
FIRST_LINKING_VERSION = 7
# Namespace of the simulated nodes' counter ids (any fixed UUID: ids only need to differ per node).
_COUNTER_ID_NAMESPACE = uuid.UUID("6f1d8a4e-2f53-4c55-9d1c-7a0c8f3e5b21")


class SimulatedNode:
    """Writes mutations to commit log segments and maintains ``cdc_raw`` as a Cassandra node would.

    ``root/commitlog`` holds the active segment, ``root/cdc_raw`` what a CDC consumer reads. Segment ids
    start at ``first_segment_id`` (default: the current time in milliseconds, as Cassandra does) and grow by
    one per segment. Not thread-safe: drive it from one thread.
    """

    def __init__(self, root: str | Path, node_id: str, schema: Schema, cassandra_version: str = "4.1", *,
                 segment_size: int = DEFAULT_SEGMENT_SIZE, compression: str | None = None,
                 encryption: tuple[str, bytes] | None = None, first_segment_id: int | None = None,
                 cdc_total_space: int | None = None, cdc_block_writes: bool = True) -> None:
        if cassandra_version not in COMMITLOG_VERSIONS:
            raise ValueError(f"unknown Cassandra version {cassandra_version!r}; "
                             f"one of {', '.join(COMMITLOG_VERSIONS)}")
        self.root = Path(root)
        self.node_id = node_id
        self.schema = schema
        self.cassandra_version = cassandra_version
        self.version = COMMITLOG_VERSIONS[cassandra_version]
        self.segment_size = segment_size
        self.compression = compression
        self.encryption = encryption
        self.cdc_total_space = cdc_total_space
        self.cdc_block_writes = cdc_block_writes
        # segment files deleted from cdc_raw to free space, oldest first
        self.deleted_for_space: list[str] = []
        # CounterId.getLocalId(): the shard this node owns in the counters it leads.
        self.counter_id = uuid.uuid5(_COUNTER_ID_NAMESPACE, node_id)
        self.commitlog_dir = self.root / "commitlog"
        self.cdc_raw_dir = self.root / "cdc_raw"
        self.commitlog_dir.mkdir(parents=True, exist_ok=True)
        self.cdc_raw_dir.mkdir(parents=True, exist_ok=True)
        self._next_segment_id = first_segment_id if first_segment_id is not None else int(time.time() * 1000)
        self._segment: SegmentWriter | None = None
        self._contains_cdc = False  # Cassandra's CDCState.CONTAINS for the active segment
        self._indexed_position: int | None = None  # what the active segment's _cdc.idx says
        self.segments_opened = 0  # segments this node has started (rollovers + 1)
        # A node always has an active segment (and in 4.0+ its cdc_raw link) before the first write.
        self._open_segment()

    @property
    def links_segments(self) -> bool:
        """True for 4.0+ (hard links and _cdc.idx), False for 3.x (segments moved on discard)."""
        return self.version >= FIRST_LINKING_VERSION

    @property
    def active_segment(self) -> SegmentWriter | None:
        """The segment being written; None after ``close()`` until the next write."""
        return self._segment

    def write(self, mutation: Mutation) -> tuple[int, int]:
        """Append a mutation; return (segment id, position just past the entry), as ``CommitLog.add`` does.

        A full segment is closed and the write goes to the next one. Writing after ``close()`` starts a
        new segment, as a restarted node does.
        """
        body = MutationSerializer.serialize(mutation, self.version)
        if len(body) > self.segment_size // 2:
            # Cassandra's max_mutation_size defaults to half a segment (MutationExceededMaxSizeException).
            raise ValueError(f"a mutation of {len(body)} bytes exceeds the maximum of half a "
                             f"{self.segment_size}-byte segment")
        segment = self._segment or self._open_segment()
        try:
            position = segment.add(body)
        except SegmentFull:
            self._close_segment()
            segment = self._open_segment()
            position = segment.add(body)
        if any(update.table.cdc for update in mutation.updates):
            self._contains_cdc = True
        return segment.descriptor.segment_id, position

    def sync(self) -> None:
        """A periodic commit log sync: the data written so far becomes a synced section.

        In 4.0+ a segment containing CDC data gets its ``_cdc.idx`` rewritten when the synced position moved.
        A segment left without room for another sync marker is closed, and the next one opened.
        """
        segment = self._segment
        if segment is None:
            return
        position = segment.sync()
        if segment.closed:
            self._close_segment()
            self._open_segment()
        elif self.links_segments and self._contains_cdc and position != self._indexed_position:
            self._write_index(segment, position, completed=False)

    def close(self) -> None:
        """Node shutdown: close the active segment (and discard it, see the module docstring)."""
        if self._segment is not None:
            self._close_segment()

    def cdc_raw_bytes(self) -> int:
        """Total size of the files in ``cdc_raw`` (what Cassandra weighs against ``cdc_total_space``)."""
        return sum(entry.stat().st_size for entry in self.cdc_raw_dir.iterdir() if entry.is_file())

    def _open_segment(self) -> SegmentWriter:
        segment = SegmentWriter(self.commitlog_dir, self._next_segment_id, self.version,
                                segment_size=self.segment_size, compression=self.compression,
                                encryption=self.encryption)
        self._next_segment_id += 1
        self.segments_opened += 1
        if self.links_segments:
            os.link(segment.path, self.cdc_raw_dir / segment.path.name)
            if self.cdc_total_space is not None and not self.cdc_block_writes:
                self._delete_oldest_segments(keep=segment.path.name)
        self._segment = segment
        self._contains_cdc = False
        self._indexed_position = None
        return segment

    def _close_segment(self) -> None:
        """Close the active segment and discard it the way its Cassandra version does."""
        segment = self._segment
        assert segment is not None
        position = segment.close()
        in_cdc_raw = self.cdc_raw_dir / segment.path.name
        if self.links_segments:
            if self._contains_cdc:
                self._write_index(segment, position, completed=True)
            else:
                # Never held CDC data: no consumer needs it (no _cdc.idx was ever written for it).
                in_cdc_raw.unlink()
            segment.path.unlink()
        elif self._contains_cdc:
            os.rename(segment.path, in_cdc_raw)
        else:
            segment.path.unlink()
        self._segment = None

    def _delete_oldest_segments(self, keep: str) -> None:
        """Delete the oldest segments in cdc_raw (with their idx files) until it fits in cdc_total_space."""
        assert self.cdc_total_space is not None
        linked = sorted(named[1] for named in map(parse_segment_name, os.listdir(self.cdc_raw_dir)) if named)
        for segment_id in linked:
            name = segment_file_name(self.version, segment_id)
            if self.cdc_raw_bytes() <= self.cdc_total_space or name == keep:
                return
            (self.cdc_raw_dir / name).unlink()
            (self.cdc_raw_dir / cdc_index_file_name(self.version, segment_id)).unlink(missing_ok=True)
            self.deleted_for_space.append(name)

    def _write_index(self, segment: SegmentWriter, position: int, completed: bool) -> None:
        # Written here rather than by the SegmentWriter, which would write it at every sync even before
        # the segment holds CDC data; Cassandra writes it only for CONTAINS segments.
        descriptor = segment.descriptor
        write_cdc_index(self.cdc_raw_dir / cdc_index_file_name(descriptor.version, descriptor.segment_id),
                        position, completed)
        self._indexed_position = position

    def __repr__(self) -> str:
        return f"SimulatedNode({self.node_id!r}, Cassandra {self.cassandra_version}, {self.root})"
