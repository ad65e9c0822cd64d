"""Merging partition updates into per-partition state, and the CQL row changes each merge makes.

::

    state = PartitionState()
    for update in updates:                      # RF copies, replays, any order
        for change in apply(state, update, table, now_seconds):
            emit(change.before, change.after)   # only rows whose visible content changed
    expire(state, table, now_seconds)           # when next_expiry(state) has passed: TTL'd data goes

The merged state is what a Cassandra read at CL=ALL returns after the same writes: cells, row
liveness, row/range/partition deletions, static rows, collections element by element and counters
reconcile with Cassandra's own rules (see :mod:`.state`), so the order and the number of copies of
the updates do not matter. Each ``RowChange`` is the transition of one CQL row from the previous view
of the partition to the new one; replaying them in order rebuilds the view.

Time: a partition's view is taken at its ``clock``, the latest ``now_seconds`` it was given (it never
goes back). ``apply`` first moves the clock to ``now_seconds``, emitting what expired meanwhile, so
events always chain; ``expire`` does only that, for the pipeline's timers. Tombstones are kept, so that
older data arriving late stays deleted, until ``gc_grace_seconds`` (the table option, 10 days by
default) after their deletion time, when Cassandra's compaction would purge them too.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from ..storage.cells import EXPIRED_LIVENESS_TTL, Cell, ComplexColumn, DeletionTime
from ..storage.partition_update import PartitionUpdate
from ..storage.rows import Row
from ..schema.model import TableMetadata
from .clustering import Clustering
from .table_view import STATIC_CLUSTERING, RawRow, RawValues, TableView, table_view
from .row_state import CellState, Deletion, RowState
from .partition_state import (NO_TIMESTAMP, PartitionState, Range, cell_state,
                    deleted_at, deletion_of, liveness_of, max_deletion, merge_counter, merge_liveness,
                    reconcile)


class RowChange(NamedTuple):
    """One CQL row before and after a change (None: the row did not exist / no longer exists).

    ``clustering`` is the row's clustering as stored, ``()`` for the row a partition with only static
    values shows. Rows are dicts of every column (partition key and clustering included) to its value.
    A named tuple: one is made per event, and a frozen dataclass costs several times as much to make.
    """

    clustering: Clustering
    before: dict[str, Any] | None
    after: dict[str, Any] | None


def apply(state: PartitionState, update: PartitionUpdate, table: TableMetadata, now_seconds: int,
          digest: bytes | None = None) -> list[RowChange]:
    """Merge ``update`` into ``state``; the row changes, in clustering order, after any expiry changes.

    ``digest`` identifies the update's bytes: a digest applied recently is skipped at once. An update that
    cannot be merged (another partition's, a range tombstone never closed) raises ``ValueError`` before the
    state changes.
    """
    if state.seen(digest):
        return []
    if state.key is not None and state.key != update.key:
        raise ValueError(f"an update of partition {bytes(update.key).hex()} applied to the state of "
                         f"{state.key.hex()} ({table.qualified_name})")
    ranges = _ranges_of(update)
    state.key = bytes(update.key)
    view = _view_of(state, table)
    changes = _advance(state, view, now_seconds)
    changes += _Merge(state, view, update, ranges).run()
    state.remember(digest)
    return changes



def delete_partition(state: PartitionState, table: TableMetadata, deletion: Deletion,
                     now_seconds: int) -> None:
    """Merge a deletion of the whole partition ``state`` holds (its key set), as a partition update deleting
    it would be merged, without the row changes: a truncation (the pipeline says it once, for the table)."""
    assert state.key is not None
    update = PartitionUpdate(table, state.key, partition_deletion=DeletionTime(*deletion))
    apply(state, update, table, now_seconds)


def only_deleted_by(state: PartitionState, deletion: Deletion) -> bool:
    """Whether ``state`` holds nothing but a partition deletion no newer than ``deletion``: dropping it loses
    nothing while ``deletion`` is applied to the partition again when it comes back."""
    return (not state.rows and state.static is None and not state.ranges
            and (state.deletion is None or state.deletion <= deletion))


def expire(state: PartitionState, table: TableMetadata, now_seconds: int) -> list[RowChange]:
    """Move the state's clock to ``now_seconds``: the changes of the data that expired meanwhile.

    Also purges tombstones older than ``gc_grace_seconds``; the state may then be empty.
    """
    return _advance(state, _view_of(state, table), now_seconds)


def next_expiry(state: PartitionState) -> int | None:
    """When (seconds) ``expire`` next has something to do: a TTL ends or a tombstone becomes purgeable.

    It may come early (what it was computed for was deleted since); ``expire`` then does nothing.
    """
    return state.next_event


def visible_rows(state: PartitionState, table: TableMetadata,
                 now_seconds: int) -> dict[Clustering, dict[str, Any]]:
    """The partition's rows as ``SELECT`` shows them at ``now_seconds`` (not before the state's clock)."""
    view = _view_of(state, table)
    if state.key is None:
        return {}
    now = now_seconds if state.clock is None else max(now_seconds, state.clock)
    raw = _raw_rows(state, view, state.rows.keys(), now)
    key_values = view.partition_key_values(state.key)
    ordered = sorted(raw, key=view.clustering_sort_key)
    return {c: view.decode_row(key_values, c, raw[c]) for c in ordered}  # type: ignore[misc]


def _view_of(state: PartitionState, table: TableMetadata) -> TableView:
    """The table's view, its clustering order given to the state's rows (to find a row's leaf)."""
    view = table_view(table)
    state.rows.order = view.clustering_sort_key
    return view


# --- transitions --------------------------------------------------------------------------------------

def _raw_rows(state: PartitionState, view: TableView, clusterings: Iterable[Clustering],
              now: int) -> dict[Clustering, RawRow]:
    """The visible raw rows of a whole partition."""
    static_live, static_values = view.static_values(state, now)
    rows: dict[Clustering, RawRow] = {}
    for clustering in clusterings:
        row_values = view.row_values(state, clustering, now)
        if row_values is not None:
            rows[clustering] = (row_values, static_values)
    if static_live and not rows:
        rows[STATIC_CLUSTERING] = (None, static_values)
    return rows


class _Snapshot:
    """The raw view of some rows of a partition at one moment, to compare with another moment's."""

    def __init__(self, state: PartitionState, view: TableView, scope: Iterable[Clustering], now: int) -> None:
        self.static_live, self.static_values = view.static_values(state, now)
        self.values = {c: view.row_values(state, c, now) for c in scope}


def _transitions(state: PartitionState, view: TableView, before: _Snapshot, after: _Snapshot,
                 now: int) -> list[RowChange]:
    """The row changes between two snapshots of the same rows.

    Rows outside the snapshots' scope are the same in both, except for their static values: when those
    changed, every live row changed.
    """
    scope = set(before.values) | set(after.values)
    static_changed = before.static_values != after.static_values
    others: dict[Clustering, RawValues | None] = {}
    others_live: bool | None = None
    if static_changed:
        others = {c: view.row_values(state, c, now) for c in state.rows if c not in scope}
        others_live = any(v is not None for v in others.values())

    def any_other_live() -> bool:
        nonlocal others_live
        if others_live is None:
            others_live = any(view.row_is_live(state, c, row, now)
                              for c, row in state.rows.items() if c not in scope)
        return others_live

    raw_before: dict[Clustering, RawRow | None] = {}
    raw_after: dict[Clustering, RawRow | None] = {}
    for snapshot, raw in ((before, raw_before), (after, raw_after)):
        for clustering in scope:
            values = snapshot.values.get(clustering)
            raw[clustering] = None if values is None else (values, snapshot.static_values)
        for clustering, values in others.items():
            if values is not None:
                raw[clustering] = (values, snapshot.static_values)

    for snapshot, raw in ((before, raw_before), (after, raw_after)):
        if snapshot.static_live:
            alone = not any(v is not None for v in raw.values()) and not any_other_live()
            raw[STATIC_CLUSTERING] = (None, snapshot.static_values) if alone else None

    changed = [c for c in set(raw_before) | set(raw_after) if raw_before.get(c) != raw_after.get(c)]
    if not changed:
        return []
    assert state.key is not None
    key_values = view.partition_key_values(state.key)
    return [RowChange(c, *view.decode_change(key_values, c, raw_before.get(c), raw_after.get(c)))
            for c in sorted(changed, key=view.clustering_sort_key)]


def _advance(state: PartitionState, view: TableView, now: int) -> list[RowChange]:
    """Move the clock to ``now``: what expired in between, then purge what is shadowed or too old."""
    then = state.clock
    if then is not None and now <= then:
        return []
    state.clock = now
    if then is None or state.next_event is None or state.next_event > now:
        return []

    def expires_between(row: RowState | None) -> bool:
        return row is not None and any(then < expiry <= now for _, expiry in row.expiring())

    # Static values that expire change every row: ``_transitions`` sees that from the static values.
    due = state.rows.due(now)  # the rows of the leaves whose next event has come
    scope = [c for c in due if expires_between(state.rows.get(c))]
    before, after = _Snapshot(state, view, scope, then), _Snapshot(state, view, scope, now)
    changes = _transitions(state, view, before, after, now)
    _purge(state, view, due, now, gc=True)
    state.next_event = _next_event(state, view, now)
    return changes


# --- merging ------------------------------------------------------------------------------------------

class _Merge:
    """Applies one partition update: which rows it can change, their views before and after."""

    def __init__(self, state: PartitionState, view: TableView, update: PartitionUpdate,
                 ranges: list[Range]) -> None:
        self.state = state
        self.view = view
        self.update = update
        self.ranges = ranges
        self.now: int = state.clock  # type: ignore[assignment]
        self._row: Clustering | None = None  # the clustering of the row being merged (None: the static row)

    def run(self) -> list[RowChange]:
        state, view, update, now = self.state, self.view, self.update, self.now
        partition_deletion = deletion_of(update.partition_deletion)
        if max_deletion(state.deletion, partition_deletion) == state.deletion:
            partition_deletion = None  # none, or not newer than the partition's
        ranges = [r for r in self.ranges if self._range_changes(r)]
        rows = [u for u in update.unfiltereds if isinstance(u, Row)]

        if partition_deletion is not None:
            scope: set[Clustering] = set(state.rows)
        else:
            scope = set()
            for start, start_inclusive, end, end_inclusive, _ in ranges:
                scope.update(state.rows.covered(view.comparator, start, start_inclusive, end, end_inclusive))
        scope.update(row.clustering for row in rows)

        before = _Snapshot(state, view, scope, now)
        if partition_deletion is not None:
            state.deletion = partition_deletion
            state.note_event(self._purgeable_at(partition_deletion))
        for new in ranges:
            self._add_range(new)
        if update.static_row is not None:
            self._row = None
            state.static = self._merge_row(state.static, update.static_row)
        for row in rows:
            self._row = row.clustering
            state.rows[row.clustering] = self._merge_row(state.rows.get(row.clustering), row)
        after = _Snapshot(state, view, scope, now)
        changes = _transitions(state, view, before, after, now)
        _purge(state, view, scope, now, header=partition_deletion is not None or bool(ranges))
        return changes

    # --- range tombstones -------------------------------------------------------------------------

    def _range_changes(self, new: Range) -> bool:
        deletion = new[4]
        if deletion[0] <= deleted_at(self.state.deletion):
            return False
        return not any(r[:4] == new[:4] and r[4] >= deletion for r in self.state.ranges)

    def _add_range(self, new: Range) -> None:
        ranges = self.state.ranges
        for i, existing in enumerate(ranges):
            if existing[:4] == new[:4]:
                ranges[i] = new
                break
        else:
            ranges.append(new)
        self.state.note_event(self._purgeable_at(new[4]))

    # --- rows -------------------------------------------------------------------------------------

    def _merge_row(self, target: RowState | None, row: Row) -> RowState:
        state, view = self.state, self.view
        if target is None:
            target = RowState()
        if row.liveness is not None:
            liveness = liveness_of(row.liveness)
            target.liveness = merge_liveness(target.liveness, liveness)
            if liveness[2] is not None:
                self._note(self._expiry_event(liveness[2], liveness[2]))
        deletion = deletion_of(row.deletion)
        if deletion is not None:
            target.deletion = max_deletion(target.deletion, deletion)
            self._note(self._purgeable_at(deletion))
        for data in row.cells:
            name = data.column.name
            if isinstance(data, ComplexColumn):
                self._merge_complex(target, name, data)
            elif not view.accepts(name, data.timestamp):
                continue
            elif data.column.type.is_counter:
                merge_counter(target.counters.setdefault(name, [None, {}]), data)
                if data.is_tombstone:
                    self._note(self._purgeable_at((data.timestamp, data.local_deletion_time or 0)))
            else:
                target.cells[name] = self._reconciled(target.cells.get(name), data)
        return target

    def _merge_complex(self, target: RowState, name: str, data: ComplexColumn) -> None:
        view = self.view
        deletion = deletion_of(data.deletion)
        if deletion is not None and not view.accepts(name, deletion[0]):
            deletion = None
        cells = [c for c in data.cells if view.accepts(name, c.timestamp)]
        if deletion is None and not cells:
            return
        entry = target.complex.setdefault(name, [None, {}])
        if deletion is not None:
            entry[0] = max_deletion(entry[0], deletion)
            self._note(self._purgeable_at(deletion))
        elements = entry[1]
        for cell in cells:
            path = bytes(cell.path or b"")
            elements[path] = self._reconciled(elements.get(path), cell)

    def _reconciled(self, current: Any, cell: Cell) -> Any:
        new = cell_state(cell)
        winner = reconcile(current, new)
        if winner is new and new[2] is not None:
            if new[3] is None:
                self._note(self._purgeable_at((new[0], new[2])))
            else:
                self._note(self._expiry_event(new[2], new[2] - new[1]))
        return winner

    def _note(self, when: int) -> None:
        """Something of the row being merged expires or becomes purgeable at ``when``."""
        self.state.note_event(when)
        if self._row is not None:
            self.state.rows.note_event(self._row, when)

    def _expiry_event(self, expiry: int, written: int) -> int:
        """When an expiring part next matters: at its expiry, or when it becomes purgeable after it."""
        if expiry > self.now:
            return expiry
        return written + self.view.gc_grace + 1

    def _purgeable_at(self, deletion: Deletion) -> int:
        return deletion[1] + self.view.gc_grace + 1


def _ranges_of(update: PartitionUpdate) -> list[Range]:
    """The update's range tombstones, from its bound and boundary markers (in clustering order)."""
    ranges: list[Range] = []
    opened: tuple[Clustering, bool, Deletion] | None = None
    for marker in update.markers:
        kind = marker.kind
        if kind.closes:
            if opened is None:
                raise ValueError(f"range tombstone marker {kind.name} at {marker.clustering} "
                                 "closes no open range")
            start, start_inclusive, deletion = opened
            ranges.append((start, start_inclusive, tuple(marker.clustering), kind.closes_inclusive, deletion))
            opened = None
        if kind.opens:
            deletion = deletion_of(marker.open_deletion)
            if deletion is None:
                raise ValueError(f"range tombstone marker {kind.name} at {marker.clustering} "
                                 "lacks its deletion")
            opened = (tuple(marker.clustering), kind.opens_inclusive, deletion)
    if opened is not None:
        raise ValueError(f"range tombstone opened at {opened[0]} is never closed")
    return ranges


# --- purging ------------------------------------------------------------------------------------------

def _purge(state: PartitionState, view: TableView, scope: Iterable[Clustering], now: int, gc: bool = False,
           header: bool = False) -> None:
    """Drop what no read can see any more: data shadowed by a deletion; with ``gc``, also tombstones and
    expired data older than ``gc_grace_seconds``, as compaction does (after the data they shadow, in the
    same pass). Only ``scope``'s rows (those a merge may have shadowed, or those whose next event has come:
    nothing else can go), the static row, and with ``header`` or ``gc`` the partition's and ranges' deletions."""
    gc_before = now - view.gc_grace if gc else NO_TIMESTAMP
    partition_deleted = deleted_at(state.deletion)
    if state.static is not None and _purge_row(state.static, partition_deleted, now, gc_before):
        state.static = None
    rows = state.rows
    for clustering in scope:
        row = rows.get(clustering)
        if row is not None and _purge_row(row, view.row_deletion(state, clustering, None), now, gc_before):
            del rows[clustering]
    if header or gc:
        state.ranges = [r for r in state.ranges if r[4][0] > partition_deleted and r[4][1] >= gc_before]
        if state.deletion is not None and state.deletion[1] < gc_before:
            state.deletion = None


def _purge_row(row: RowState, deleted: int, now: int, gc_before: int) -> bool:
    """Purge one row under the deletion of its partition and ranges; whether nothing is left of it."""
    if row.deletion is not None:
        if row.deletion[0] <= deleted:
            row.deletion = None
        else:
            deleted = row.deletion[0]
            if row.deletion[1] < gc_before:
                row.deletion = None
    liveness = row.liveness
    if liveness is not None:
        expired = liveness[1] == EXPIRED_LIVENESS_TTL or (liveness[2] is not None and now >= liveness[2])
        if liveness[0] <= deleted or (expired and liveness[2] < gc_before):  # type: ignore[operator]
            row.liveness = None
    _purge_cells(row.cells, deleted, now, gc_before)
    for name, (deletion, elements) in list(row.complex.items()):
        column_deleted = deleted
        if deletion is not None:
            if deletion[0] <= deleted:
                deletion = None
            else:
                column_deleted = deletion[0]
                if deletion[1] < gc_before:
                    deletion = None
        _purge_cells(elements, column_deleted, now, gc_before)
        if deletion is None and not elements:
            del row.complex[name]
        else:
            row.complex[name] = [deletion, elements]
    for name, counter in list(row.counters.items()):
        tombstone, shards = counter
        if tombstone is not None and tombstone[0] <= deleted:
            tombstone = counter[0] = None
        if tombstone is not None and tombstone[1] < gc_before:
            # Compaction reconciles the tombstone with the shards first: it wins, then goes.
            counter[0] = None
            shards.clear()
        for counter_id in [i for i, shard in shards.items() if shard[2] <= deleted]:
            del shards[counter_id]
        if counter[0] is None and not shards:
            del row.counters[name]
    return row.is_empty()


def _purge_cells(cells: dict[Any, CellState], deleted: int, now: int, gc_before: int) -> None:
    for key, cell in list(cells.items()):
        purged = _purge_cell(cell, deleted, now, gc_before)
        if purged is None:
            del cells[key]
        elif purged is not cell:
            cells[key] = purged


def _purge_cell(cell: CellState, deleted: int, now: int, gc_before: int) -> CellState | None:
    """The cell, None to drop it, or a smaller equivalent: an expired value is never read again, and a
    cell reconciles the same without it (two expired cells tie on the value only when they expired at
    the same time)."""
    timestamp, ttl, ldt, value = cell
    if timestamp <= deleted:
        return None
    if ldt is None:
        return cell
    if value is None:
        return None if ldt < gc_before else cell
    if now < ldt:
        return cell
    # Expired: compaction turns it into a tombstone deleted at its write time (expiry - ttl).
    if ldt - ttl < gc_before:
        return None
    return cell if not value else (timestamp, ttl, ldt, b"")


def _next_event(state: PartitionState, view: TableView, now: int) -> int | None:
    """When something next expires or becomes purgeable: the partition's deletions and static row, and its
    rows' (those of the leaves whose time had come worked out again, from their rows)."""
    grace = view.gc_grace
    times = [deletion[1] + grace + 1 for deletion in [state.deletion] + [r[4] for r in state.ranges]
             if deletion is not None]
    if state.static is not None:
        times.append(_row_next_event(state.static, grace, now))
    times.append(state.rows.next_event(now, lambda row: _row_next_event(row, grace, now)))
    future = [t for t in times if t is not None and t > now]
    return min(future) if future else None


def _row_next_event(row: RowState, grace: int, now: int) -> int | None:
    """When something of a row next expires or becomes purgeable, after ``now``."""
    times: list[int] = []
    if row.deletion is not None:
        times.append(row.deletion[1] + grace + 1)
    liveness = row.liveness
    if liveness is not None and liveness[2] is not None:
        times.append(liveness[2] if liveness[2] > now else liveness[2] + grace + 1)
    cells = list(row.cells.values())
    for deletion, elements in row.complex.values():
        if deletion is not None:
            times.append(deletion[1] + grace + 1)
        cells.extend(elements.values())
    for _, ttl, ldt, value in cells:
        if ldt is None:
            continue
        if value is None:
            times.append(ldt + grace + 1)
        else:
            times.append(ldt if ldt > now else ldt - ttl + grace + 1)
    for tombstone, _ in row.counters.values():
        if tombstone is not None:
            times.append(tombstone[1] + grace + 1)
    return min((t for t in times if t > now), default=None)


__all__ = ["PartitionState", "RowChange", "apply", "delete_partition", "expire", "next_expiry",
           "only_deleted_by", "visible_rows"]
