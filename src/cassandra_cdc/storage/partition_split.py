"""A partition update as several smaller ones that the merge takes for the same change.

The pipeline merges partition updates in any order, so pieces of one update are independent updates: the
partition deletion and the static row go with the first; pieces are cut only before a row, and a range
deletion open across a cut (then cut only right after a row) is closed at that row in one piece and opened
again just after it in the next (``INCL_END_BOUND`` then ``EXCL_START_BOUND`` at the same clustering: the same
range). Each clustering's row and the range deletion covering it are in the same piece.

The bootstrap cuts large SSTable partitions so; the agent cuts a partition update larger than the raw topic
takes (agent/record_size.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cells import ComplexColumn, DeletionTime
from .partition_update import PartitionUpdate
from .rows import BoundKind, RangeTombstoneMarker, Row, Unfiltered

_ROW_OVERHEAD = 12  # flags, size of the timestamp and column bitmap: rough, for cutting pieces
_CELL_OVERHEAD = 6


@dataclass(frozen=True)
class RecordLimits:
    """How large one record's partition update may get before the partition is split."""

    rows: int = 1000
    bytes: int = 512 * 1024


def split_partition(update: PartitionUpdate, limits: RecordLimits) -> list[PartitionUpdate]:
    """``update`` as pieces of at most ``limits.rows`` rows and about ``limits.bytes`` bytes (see above)."""
    pieces: list[PartitionUpdate] = []
    current: list[Unfiltered] = []
    rows = size = 0
    open_deletion: DeletionTime | None = None
    previous: Unfiltered | None = None
    for unfiltered in update.unfiltereds:
        is_row = isinstance(unfiltered, Row)
        # Cut before a row, once the piece is full, where no range deletion is open or it can be
        # closed at the row just before.
        if is_row and (rows >= limits.rows or size >= limits.bytes) and rows \
                and (open_deletion is None or isinstance(previous, Row)):
            if open_deletion is not None:
                assert isinstance(previous, Row)
                current.append(RangeTombstoneMarker(BoundKind.INCL_END_BOUND, previous.clustering,
                                                    close_deletion=open_deletion))
            pieces.append(_piece(update, current, first=not pieces))
            current = []
            rows = size = 0
            if open_deletion is not None:
                assert isinstance(previous, Row)
                current.append(RangeTombstoneMarker(BoundKind.EXCL_START_BOUND, previous.clustering,
                                                    open_deletion=open_deletion))
        current.append(unfiltered)
        size += unfiltered_size(unfiltered)
        if is_row:
            rows += 1
        else:
            open_deletion = unfiltered.open_deletion if unfiltered.kind.opens else None  # type: ignore[union-attr]
        previous = unfiltered
    pieces.append(_piece(update, current, first=not pieces))
    return pieces


def _piece(update: PartitionUpdate, unfiltereds: list[Unfiltered], first: bool) -> PartitionUpdate:
    return PartitionUpdate(update.table, update.key, unfiltereds, update.static_row if first else None,
                           update.partition_deletion if first else None, update.regular_columns,
                           update.static_columns)


def unfiltered_size(unfiltered: Unfiltered) -> int:
    """About the serialized size of a row or marker (for cutting pieces, not exact)."""
    size = _ROW_OVERHEAD + sum(len(v) for v in unfiltered.clustering if v)
    if isinstance(unfiltered, Row):
        for data in unfiltered.cells:
            if isinstance(data, ComplexColumn):
                size += _CELL_OVERHEAD + sum(_CELL_OVERHEAD + len(c.value) + len(c.path or b"")
                                             for c in data.cells)
            else:
                size += _CELL_OVERHEAD + len(data.value)
    return size


__all__ = ["RecordLimits", "split_partition", "unfiltered_size"]
