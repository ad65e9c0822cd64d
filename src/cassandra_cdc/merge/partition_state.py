"""The merged state of one partition, and Cassandra's reconciliation rules for each of its parts.

The state is what the pipeline keeps per partition in Spark's state store (pickled, in a map per raw
topic partition), so it is made of tuples, dicts, bytes and ints only, without schema objects (columns are named
by their ``str`` name); the two classes pickle as bare tuples, and ``PartitionState.seal`` gives the
builtins alone, as the pipeline stores them.

Every part merges with a rule that is commutative, associative and idempotent: the winner of two
values is the greater of their *order keys* below. So the state after any set of updates is the same
whatever their order and however many times each arrives, as in Cassandra, where reconciliation is
the same function (``Cells.reconcile``, ``LivenessInfo.supersedes``, ``DeletionTime.supersedes``,
``CounterContext.merge``). What the state keeps:

* ``Deletion``: ``(marked_for_delete_at, local_deletion_time)``; the greater tuple supersedes
  (``DeletionTime.supersedes``). Anything written at or before ``marked_for_delete_at`` is deleted.
* ``CellState``: ``(timestamp, ttl, local_deletion_time, value)``; ``value`` None for a tombstone,
  ``local_deletion_time`` None for a live, non-expiring cell, else the expiry (``ttl`` > 0) or the
  deletion time. Tombstones stay, so that an older write arriving later stays deleted.
* ``Liveness``: ``(timestamp, ttl, local_expiration_time)`` (the INSERT row marker).
* a complex column: ``[deletion or None, {cell path: CellState}]``.
* a counter column: ``[tombstone deletion or None, {counter id: (clock, count, timestamp)}]``.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

from ..storage.cells import EXPIRED_LIVENESS_TTL, Cell, DeletionTime, LivenessInfo
from ..storage.counters import decode_counter_context
from .clustering import Clustering
from .row_state import CellState, Deletion, Liveness, RowState
from .row_tree import RowTree

NO_TIMESTAMP = -(1 << 63)

Shard = tuple[int, int, int]
Range = tuple[Clustering, bool, Clustering, bool, Deletion]  # start, inclusive, end, inclusive, deletion

# ``PartitionState.seal()``'s state as builtins, in its constructor's order (without the digests).
StoredState = tuple[Any, ...]

RECENT_DIGESTS = 4  # RF copies arrive close together; a missed copy merges to no change anyway


# --- reconciliation rules ---------------------------------------------------------------------------

def deletion_of(deletion: DeletionTime | None) -> Deletion | None:
    if deletion is None or deletion.is_live:
        return None
    return deletion.marked_for_delete_at, deletion.local_deletion_time


def max_deletion(current: Deletion | None, other: Deletion | None) -> Deletion | None:
    if current is None:
        return other
    if other is None:
        return current
    return other if other > current else current


def deleted_at(deletion: Deletion | None) -> int:
    return NO_TIMESTAMP if deletion is None else deletion[0]


def cell_state(cell: Cell) -> CellState:
    if cell.is_tombstone:
        return cell.timestamp, 0, cell.local_deletion_time, None
    if cell.is_expiring:
        return cell.timestamp, cell.ttl, cell.local_deletion_time, bytes(cell.value)
    return cell.timestamp, 0, None, bytes(cell.value)


def cell_order(cell: CellState) -> tuple[int, int, int, bytes]:
    """``Cells.resolveRegular`` (Cassandra 4.0+, CASSANDRA-14592) as a sort key: the greater cell wins.

    Higher timestamp first. On a tie, a cell with a local deletion time (tombstone or expiring) beats
    a plain live cell; a tombstone beats an expiring cell; between two tombstones or two expiring
    cells, the later local deletion time wins; last, the greater value as unsigned bytes
    (``ValueAccessor.compare``).
    """
    timestamp, _, ldt, value = cell
    if value is None:
        return timestamp, 2, ldt or 0, b""
    if ldt is not None:
        return timestamp, 1, ldt, value
    return timestamp, 0, 0, value


def reconcile(current: CellState | None, cell: CellState) -> CellState:
    if current is None or cell_order(cell) > cell_order(current):
        return cell
    return current


def cell_is_live(cell: CellState, deleted: int, now: int) -> bool:
    """A value (not a tombstone), not deleted (written after ``deleted``), not expired at ``now``."""
    timestamp, _, ldt, value = cell
    return value is not None and timestamp > deleted and (ldt is None or now < ldt)


def liveness_of(info: LivenessInfo) -> Liveness:
    if info.is_expiring:
        return info.timestamp, info.ttl, info.local_expiration_time
    return info.timestamp, 0, None


def liveness_order(liveness: Liveness) -> tuple[int, bool, bool, int]:
    """``LivenessInfo.supersedes`` as a sort key: timestamp; then an expired (materialized view) liveness;
    then, both expiring or both not, the later expiration; else the expiring one."""
    timestamp, ttl, expiration = liveness
    return timestamp, ttl == EXPIRED_LIVENESS_TTL, expiration is not None, expiration or 0


def merge_liveness(current: Liveness | None, other: Liveness) -> Liveness:
    if current is None or liveness_order(other) > liveness_order(current):
        return other
    return current


def liveness_is_live(liveness: Liveness | None, deleted: int, now: int) -> bool:
    if liveness is None or liveness[0] <= deleted:
        return False
    ttl, expiration = liveness[1], liveness[2]
    if ttl == EXPIRED_LIVENESS_TTL:
        return False
    return expiration is None or now < expiration


def merge_counter(column: list[Any], cell: Cell) -> bool:
    """Merge a counter cell into ``[tombstone, shards]``; whether it changed anything.

    ``Cells.resolveCounter``: a tombstone beats live counter cells whatever their timestamps
    (CASSANDRA-7346). Live contexts merge per counter id, the higher clock winning
    (``CounterContext.merge``; equal clocks: the greater count). Each shard keeps the timestamp of the
    cell that brought it, so that row, range and partition deletions delete the shards written at or
    before them, as a read deletes each source's cell before merging.
    """
    if cell.is_tombstone:
        tombstone = max_deletion(column[0], (cell.timestamp, cell.local_deletion_time or 0))
        changed = tombstone != column[0]
        column[0] = tombstone
        return changed
    shards: dict[bytes, Shard] = column[1]
    changed = False
    for shard in decode_counter_context(bytes(cell.value)):
        key = shard.counter_id.bytes
        candidate = (shard.clock, shard.count, cell.timestamp)
        current = shards.get(key)
        if current is None or candidate > current:
            shards[key] = candidate
            changed = True
    return changed


def counter_value(column: list[Any], deleted: int) -> int | None:
    tombstone = column[0]
    if tombstone is not None and tombstone[0] > deleted:
        return None
    counts = [count for _, count, timestamp in column[1].values() if timestamp > deleted]
    return sum(counts) if counts else None


# --- state ------------------------------------------------------------------------------------------

class PartitionState:
    """Everything merged so far for one partition of one table.

    ``clock`` is the latest time (seconds) the state was viewed at: events describe the view at that
    time, and time never goes back for a partition. ``next_event`` caches when something next expires
    or becomes purgeable (see ``merge.next_expiry``). ``digests`` are the last updates applied, to skip
    exact copies cheaply (merging a copy again would change nothing anyway).
    """

    __slots__ = ("key", "deletion", "ranges", "static", "rows", "clock", "next_event", "digests")

    def __init__(self, key: bytes | None = None, deletion: Deletion | None = None,
                 ranges: list[Range] | None = None, static: RowState | None = None,
                 rows: dict[Clustering, RowState] | RowTree | None = None, clock: int | None = None,
                 next_event: int | None = None, digests: tuple[bytes, ...] = ()) -> None:
        self.key = key
        self.deletion = deletion
        self.ranges: list[Range] = ranges or []
        self.static = static
        self.rows = rows if isinstance(rows, RowTree) else RowTree.of(rows or {})
        self.clock = clock
        self.next_event = next_event
        self.digests = digests

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled whole, every row read (the pipeline stores it with ``seal``, its rows in leaves)."""
        return PartitionState, (self.key, self.deletion, self.ranges or None, self.static,
                                dict(self.rows.items()) or None, self.clock, self.next_event, self.digests)

    def seal(self) -> tuple[bytes, dict[int, bytes], list[int]]:
        """The state pickled as the pipeline keeps it: as builtins only (``StoredState``: pickled and unpickled
        in two thirds of the time the objects take), without the digests, which the pipeline keeps beside it
        (a replica's copy is then found merged without unpickling the state), its rows' root in place of its
        rows once they are in leaves; and the nodes of its rows to write (node id → bytes) and to remove (``RowTree.seal``).
        Rows inline are measured as the state is pickled: only a state grown past a leaf's size has its rows
        looked at again, to be split."""
        root, written, removed = self.rows.seal(self.next_event, split_inline=False)
        pickled = pickle.dumps(self._stored(root), protocol=pickle.HIGHEST_PROTOCOL)
        # A tree may have come back inline as it was sealed: its removals stand, whatever a split writes.
        if self.rows.outgrown(len(pickled)):
            root, split, _ = self.rows.seal(self.next_event)
            written.update(split)
            pickled = pickle.dumps(self._stored(root), protocol=pickle.HIGHEST_PROTOCOL)
        return pickled, written, removed

    def _stored(self, rows: Any) -> StoredState:
        static = None if self.static is None else self.static.stored()
        return self.key, self.deletion, self.ranges or None, static, rows, self.clock, self.next_event

    @staticmethod
    def from_stored(stored: StoredState, digests: tuple[bytes, ...] = (),
                    load: Callable[[int], bytes] | None = None) -> "PartitionState":
        """The state ``seal`` gave (unpickled), with its ``digests`` (in ``stored`` itself when it was stored
        with them, as before they were kept apart); ``load`` reads its rows' nodes stored apart."""
        key, deletion, ranges, static, rows, clock, next_event = stored[:7]
        return PartitionState(key, deletion, ranges, None if static is None else RowState(*static),
                              RowTree(rows, load), clock, next_event, stored[7] if len(stored) > 7 else digests)

    def seen(self, digest: bytes | None) -> bool:
        """Whether an update with this digest was applied recently (an RF copy or a replay)."""
        return digest is not None and digest in self.digests

    def remember(self, digest: bytes | None) -> None:
        if digest is not None and digest not in self.digests:
            self.digests = (self.digests + (digest,))[-RECENT_DIGESTS:]

    def is_empty(self) -> bool:
        """Nothing left, not even a tombstone: the state can be dropped."""
        return self.deletion is None and not self.ranges and self.static is None and not self.rows

    def note_event(self, when: int | None) -> None:
        if when is not None and (self.next_event is None or when < self.next_event):
            self.next_event = when

    def __repr__(self) -> str:
        return (f"PartitionState(key={self.key!r}, deletion={self.deletion}, ranges={self.ranges}, "
                f"static={self.static}, rows={self.rows}, clock={self.clock})")
