"""A partition's rows in clustering order, in leaves of bounded size: merging a write reads and writes the
rows near it, whatever the partition's width.

A partition of a few rows keeps them in one leaf inline in its state: the ``dict`` of clustering → row that
every state had before trees. Once that leaf outgrows ``LEAF_BYTES`` (pickled), its rows are split into
leaves stored apart (each a value of the pipeline's state store, under a node id of the partition), listed
by a root inline in the state: per child, its first clustering, its node id and the earliest time something
in it expires or becomes purgeable (possibly early, never late). A root that outgrows ``FANOUT`` children is
split likewise, and the tree grows a level. So a write reads and writes the root, the inner nodes on its path
and one leaf; a range deletion the leaves its range overlaps; an expiry the leaves whose time has come. A
partition deletion or a static change still reads every row: each row's event needs it.

The tree stores nothing itself. It is given ``load`` to read a node it has not read yet, and ``seal`` hands
back the nodes to write and to remove. Its order is the table's (``order``, a sort key of clusterings),
given by the merge before it reads or changes rows. Leaves are not merged as rows go: an empty one is
dropped, and a root left with one child takes that child's place (its rows inline again when they fit).
"""

from __future__ import annotations

import pickle
from bisect import bisect_right
from typing import Any, Callable, Iterable, Iterator

from .clustering import Clustering, ClusteringComparator
from .row_state import RowState, StoredRow

# Pickled bytes of a leaf, beyond which it is split; a split fills leaves to FILL of it, so that rows
# appended at a partition's end, or inserted anywhere, do not split a leaf again at once.
LEAF_BYTES = 4 << 10
FANOUT = 128
FILL = 0.75

Entry = list[Any]  # [first clustering (a lower bound of the child's), node id, next event or None]
StoredRoot = tuple[int, int, list[tuple[Clustering, int, int | None]]]  # next node id, height, entries
SortKey = Callable[[Clustering], Any]
EventOf = Callable[[RowState], int | None]


class _Leaf:
    __slots__ = ("rows", "stored", "event")

    def __init__(self, rows: dict[Clustering, RowState], stored: bytes | None) -> None:
        self.rows = rows
        self.stored = stored  # the bytes it was read from; None: not stored yet
        self.event: int | None = None  # an event noted since it was read, not yet in its entry


class _Inner:
    __slots__ = ("entries", "children", "stored")

    def __init__(self, entries: list[Entry], stored: bytes | None) -> None:
        self.entries = entries
        self.children: dict[int, _Leaf | _Inner] = {}  # node id → the child, once read
        self.stored = stored


def _leaf(stored: dict[Clustering, StoredRow] | None, raw: bytes | None) -> _Leaf:
    return _Leaf({} if stored is None else {c: RowState(*row) for c, row in stored.items()}, raw)


def _min_event(entries: list[Entry]) -> int | None:
    return min((entry[2] for entry in entries if entry[2] is not None), default=None)


def _dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class RowTree:
    """The rows of one partition: a mapping of clustering → ``RowState`` read and stored in leaves."""

    __slots__ = ("_root", "_height", "_next_id", "load", "order", "_leaves_of")

    def __init__(self, stored: dict[Clustering, StoredRow] | StoredRoot | None = None,
                 load: Callable[[int], bytes] | None = None) -> None:
        self.load = load  # a stored node's bytes, by its id
        self.order: SortKey | None = None
        self._leaves_of: dict[Clustering, _Leaf] = {}  # rows of the leaves read, and clusterings looked up
        if stored is None or isinstance(stored, dict):
            self._root: _Leaf | _Inner = _leaf(stored, None)
            self._height = 0
            self._next_id = 0
        else:
            self._next_id, self._height, entries = stored
            self._root = _Inner([list(entry) for entry in entries], None)

    @classmethod
    def of(cls, rows: dict[Clustering, RowState]) -> "RowTree":
        tree = cls()
        tree._root.rows.update(rows)  # type: ignore[union-attr]
        return tree

    @property
    def inline(self) -> bool:
        """Whether the rows are all in the partition's state (one leaf, no node stored apart)."""
        return self._height == 0

    def outgrown(self, state_bytes: int) -> bool:
        """Whether rows inline in a state of this many bytes (pickled) may have outgrown a leaf."""
        return self._height == 0 and state_bytes > LEAF_BYTES

    # --- reading the nodes --------------------------------------------------------------------------

    def _child(self, node: _Inner, index: int, height: int) -> _Leaf | _Inner:
        node_id = node.entries[index][1]
        child = node.children.get(node_id)
        if child is None:
            if self.load is None:
                raise RuntimeError(f"node {node_id} of a partition's rows is not read and nothing can read it")
            raw = self.load(node_id)
            if height == 0:
                child = _leaf(pickle.loads(raw), raw)
                self._leaves_of.update(dict.fromkeys(child.rows, child))
            else:
                child = _Inner([list(entry) for entry in pickle.loads(raw)], raw)
            node.children[node_id] = child
        return child

    def _index(self, node: _Inner, clustering: Clustering) -> int:
        order = self.order
        if order is None:
            raise RuntimeError("the rows' order is not known: the merge gives it before reading rows")
        key, entries = order(clustering), node.entries
        last = len(entries) - 1
        if last > 0 and not key < order(entries[last][0]):
            return last  # appends, a series' usual write, go to the last child: one comparison, not a search
        return bisect_right(entries, key, lo=1, hi=last, key=lambda entry: order(entry[0])) - 1

    def _leaf_of(self, clustering: Clustering) -> _Leaf:
        """The leaf a clustering belongs in, found from the root once: a row is looked up several times in a
        merge, and leaves keep their clusterings until the tree is sealed (which forgets them)."""
        leaf = self._leaves_of.get(clustering)
        if leaf is not None:
            return leaf
        node = self._root
        for height in range(self._height - 1, -1, -1):
            assert isinstance(node, _Inner)
            node = self._child(node, self._index(node, clustering), height)
        assert isinstance(node, _Leaf)
        if self._height:
            self._leaves_of[clustering] = node
        return node

    def _leaves(self, wanted: Callable[[Entry], bool] = lambda entry: True) -> Iterator[_Leaf]:
        """The leaves in clustering order, only under the entries ``wanted`` accepts."""
        def walk(node: _Leaf | _Inner, height: int) -> Iterator[_Leaf]:
            if isinstance(node, _Leaf):
                yield node
                return
            for index, entry in enumerate(node.entries):
                if wanted(entry):
                    yield from walk(self._child(node, index, height - 1), height - 1)
        return walk(self._root, self._height)

    def unread(self, clusterings: Iterable[Clustering], available: Callable[[int], bool]) -> set[int]:
        """The nodes on the paths to ``clusterings`` that are not read yet, as far down as the nodes already
        read, or ``available`` ones (read then), lead: what to read ahead, a level at a time, before merging
        writes to those rows."""
        wanted: set[int] = set()
        for clustering in clusterings:
            node = self._root
            for height in range(self._height - 1, -1, -1):
                assert isinstance(node, _Inner)
                index = self._index(node, clustering)
                node_id = node.entries[index][1]
                if node_id not in node.children and not available(node_id):
                    wanted.add(node_id)
                    break
                node = self._child(node, index, height)
        return wanted

    # --- the mapping --------------------------------------------------------------------------------

    def get(self, clustering: Clustering) -> RowState | None:
        if not self._height:
            return self._root.rows.get(clustering)  # type: ignore[union-attr]
        return self._leaf_of(clustering).rows.get(clustering)

    def __getitem__(self, clustering: Clustering) -> RowState:
        return self._leaf_of(clustering).rows[clustering]

    def __setitem__(self, clustering: Clustering, row: RowState) -> None:
        self._leaf_of(clustering).rows[clustering] = row

    def __delitem__(self, clustering: Clustering) -> None:
        del self._leaf_of(clustering).rows[clustering]

    def __contains__(self, clustering: object) -> bool:
        return self.get(clustering) is not None  # type: ignore[arg-type]

    def __bool__(self) -> bool:
        """Whether any row is left: an unread leaf has rows (an emptied one is dropped when sealed)."""
        def any_rows(node: _Leaf | _Inner) -> bool:
            if isinstance(node, _Leaf):
                return bool(node.rows)
            return any(child is None or any_rows(child)
                       for child in (node.children.get(entry[1]) for entry in node.entries))
        return any_rows(self._root)

    def __iter__(self) -> Iterator[Clustering]:
        for leaf in self._leaves():
            yield from list(leaf.rows)

    def keys(self) -> Iterator[Clustering]:
        return iter(self)

    def items(self) -> Iterator[tuple[Clustering, RowState]]:
        for leaf in self._leaves():
            yield from list(leaf.rows.items())

    def values(self) -> Iterator[RowState]:
        for leaf in self._leaves():
            yield from list(leaf.rows.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowTree) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"RowTree({dict(self.items())!r})"

    # --- ranges and time ----------------------------------------------------------------------------

    def covered(self, comparator: ClusteringComparator, start: Clustering, start_inclusive: bool,
                end: Clustering, end_inclusive: bool) -> list[Clustering]:
        """The clusterings of the rows a range covers, from the leaves it overlaps only."""
        compare = comparator.compare

        def overlapped(node: _Leaf | _Inner, height: int) -> Iterator[_Leaf]:
            if isinstance(node, _Leaf):
                yield node
                return
            entries = node.entries
            for index, entry in enumerate(entries):
                # A child's rows lie from its first clustering to the next child's first, excluded.
                if index and compare(entry[0], end) > 0:
                    break
                if index + 1 < len(entries) and compare(entries[index + 1][0], start) < 0:
                    continue
                yield from overlapped(self._child(node, index, height - 1), height - 1)

        covers = comparator.covers
        return [c for leaf in overlapped(self._root, self._height) for c in leaf.rows
                if covers(start, start_inclusive, end, end_inclusive, c)]

    def note_event(self, clustering: Clustering, when: int | None) -> None:
        """Something in the row of ``clustering`` expires or becomes purgeable at ``when`` (its leaf's entry,
        and those above, lowered by ``_settle_events``)."""
        if when is not None and self._height:
            leaf = self._leaf_of(clustering)
            if leaf.event is None or when < leaf.event:
                leaf.event = when

    def _settle_events(self) -> None:
        """Lower the entries of the leaves read, and of the nodes above them, to the events noted since."""
        def settle(node: _Leaf | _Inner) -> int | None:
            if isinstance(node, _Leaf):
                event, node.event = node.event, None
                return event
            for entry in node.entries:
                child = node.children.get(entry[1])
                event = None if child is None else settle(child)
                if event is not None and (entry[2] is None or event < entry[2]):
                    entry[2] = event
            return _min_event(node.entries)
        if self._height:
            settle(self._root)

    def due(self, now: int) -> list[Clustering]:
        """The clusterings of the leaves whose next event has come (every row, when inline)."""
        self._settle_events()
        return [c for leaf in self._leaves(lambda entry: entry[2] is not None and entry[2] <= now)
                for c in leaf.rows]

    def next_event(self, now: int, event_of: EventOf) -> int | None:
        """The rows' next event after ``now``, those of the leaves ``due`` named worked out again by
        ``event_of`` (the time it gives a row: its next one after ``now``, or None)."""
        def refresh(node: _Leaf | _Inner, height: int) -> int | None:
            if isinstance(node, _Leaf):
                return min((t for t in map(event_of, node.rows.values()) if t is not None), default=None)
            for index, entry in enumerate(node.entries):
                if entry[2] is not None and entry[2] <= now:
                    entry[2] = refresh(self._child(node, index, height - 1), height - 1)
            return _min_event(node.entries)
        self._settle_events()
        return refresh(self._root, self._height)

    # --- storing ------------------------------------------------------------------------------------

    def node_ids(self) -> list[int]:
        """Every node stored apart (the inner ones read as needed): what removing the partition removes."""
        ids: list[int] = []

        def walk(node: _Inner, height: int) -> None:
            for index, entry in enumerate(node.entries):
                ids.append(entry[1])
                if height > 1:
                    walk(self._child(node, index, height - 1), height - 1)  # type: ignore[arg-type]
        if isinstance(self._root, _Inner):
            walk(self._root, self._height)
        return ids

    def seal(self, next_event: int | None, split_inline: bool = True
             ) -> tuple[dict[Clustering, StoredRow] | StoredRoot | None, dict[int, bytes], list[int]]:
        """The root as the partition's state keeps it (None: no rows), the nodes to write (id → bytes) and the
        ids of those to remove. ``next_event``: the partition's, a lower bound for leaves made of inline rows;
        ``split_inline`` False: rows inline stay so, unmeasured (the state measures them as it is pickled)."""
        self._settle_events()
        sealed = self._sealed(next_event, split_inline)
        # The nodes read are dropped: the tree reads them again (as written) if it is used after.
        self._leaves_of.clear()
        if isinstance(self._root, _Inner):
            self._root.children.clear()
        return sealed

    def _sealed(self, next_event: int | None, split_inline: bool
                ) -> tuple[dict[Clustering, StoredRow] | StoredRoot | None, dict[int, bytes], list[int]]:
        written: dict[int, bytes] = {}
        removed: list[int] = []
        root = self._root
        if isinstance(root, _Leaf):
            stored = {c: row.stored() for c, row in root.rows.items()}
            if not split_inline or len(stored) <= 1 or self.order is None:
                return stored or None, written, removed
            raw = _dumps(stored)
            if len(raw) <= LEAF_BYTES:
                return stored, written, removed
            root = self._root = _Inner(self._split_leaf(root, [None, -1, next_event], raw, written), None)
            self._height = 1
        else:
            self._seal_children(root, self._height, written, removed)
        while len(root.entries) > FANOUT:
            root = self._root = _Inner(self._split_inner(root.entries, [None, -1, None], None, written), None)
            self._height += 1
        # A root of one child read: the child takes its place (inline again when a leaf that fits).
        while len(root.entries) == 1 and root.entries[0][1] in root.children:
            node_id = root.entries[0][1]
            child = root.children[node_id]
            if isinstance(child, _Leaf):
                stored = {c: row.stored() for c, row in child.rows.items()}
                if len(_dumps(stored)) > LEAF_BYTES:
                    break
                self._root, self._height = _Leaf(child.rows, None), 0
                written.pop(node_id, None)
                removed.append(node_id)
                return stored, written, removed
            root = self._root = child
            self._height -= 1
            written.pop(node_id, None)
            removed.append(node_id)
        if not root.entries:
            self._root, self._height = _Leaf({}, None), 0
            return None, written, removed
        stored_root = (self._next_id, self._height, [tuple(entry) for entry in root.entries])
        return stored_root, written, removed  # type: ignore[return-value]

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _seal_children(self, node: _Inner, height: int, written: dict[int, bytes], removed: list[int]) -> None:
        """Seal a node's children read: each leaf and inner node written when changed, split when too big,
        dropped when empty (``node.entries`` then lists them as they are stored)."""
        entries: list[Entry] = []
        for entry in node.entries:
            child = node.children.get(entry[1])
            if child is None:
                entries.append(entry)
            elif isinstance(child, _Leaf):
                entries.extend(self._sealed_leaf(child, entry, written, removed))
            else:
                self._seal_children(child, height - 1, written, removed)
                if not child.entries:
                    removed.append(entry[1])
                elif len(child.entries) > FANOUT:
                    entries.extend(self._split_inner(child.entries, entry, child.stored, written))
                else:
                    entries.append(self._stored_inner(child.entries, entry, child.stored, written))
        node.entries = entries

    def _sealed_leaf(self, leaf: _Leaf, entry: Entry, written: dict[int, bytes],
                     removed: list[int]) -> list[Entry]:
        if not leaf.rows:
            removed.append(entry[1])
            return []
        raw = _dumps({c: row.stored() for c, row in leaf.rows.items()})
        if len(raw) > LEAF_BYTES and len(leaf.rows) > 1 and self.order is not None:
            return self._split_leaf(leaf, entry, raw, written)
        if raw != leaf.stored:
            written[entry[1]] = raw
        return [entry]

    def _split_leaf(self, leaf: _Leaf, entry: Entry, raw: bytes, written: dict[int, bytes]) -> list[Entry]:
        """A leaf's rows in leaves filled to ``FILL`` of ``LEAF_BYTES``; the first keeps the leaf's id (-1:
        none, the rows were inline) and its entry's first clustering."""
        ordered = sorted(leaf.rows, key=self.order)
        per_leaf = max(1, int(len(ordered) * LEAF_BYTES * FILL / len(raw)))
        entries: list[Entry] = []
        for start in range(0, len(ordered), per_leaf):
            part = ordered[start:start + per_leaf]
            node_id = entry[1] if start == 0 and entry[1] >= 0 else self._new_id()
            first = entry[0] if start == 0 and entry[1] >= 0 else part[0]
            written[node_id] = _dumps({c: leaf.rows[c].stored() for c in part})
            entries.append([first, node_id, entry[2]])
        return entries

    def _split_inner(self, entries: list[Entry], entry: Entry, stored: bytes | None,
                     written: dict[int, bytes]) -> list[Entry]:
        per_node = max(1, int(FANOUT * FILL))
        parts = []
        for start in range(0, len(entries), per_node):
            keep = start == 0 and entry[1] >= 0
            part_entry = [entry[0] if keep else entries[start][0], entry[1] if keep else self._new_id(), None]
            parts.append(self._stored_inner(entries[start:start + per_node], part_entry,
                                            stored if keep else None, written))
        return parts

    def _stored_inner(self, entries: list[Entry], entry: Entry, stored: bytes | None,
                      written: dict[int, bytes]) -> Entry:
        raw = _dumps([tuple(e) for e in entries])
        if raw != stored:
            written[entry[1]] = raw
        return [entry[0], entry[1], _min_event(entries)]


__all__ = ["FANOUT", "LEAF_BYTES", "RowTree"]
