"""The merge state of one group (a raw topic partition): its partitions in pages that split as they grow, a
wide partition's rows in leaves beside them, and the group's index.

A group's partition keys are spread over pages by a CRC-32 of the key, each page a value of a ``MapState``
mapping each of its partition keys to its next expiry, its pickled merge state (``merge.partition_state``)
and the digests of its recent updates. A batch reads and writes only the pages its records touch, and
unpickles and pickles again only the partitions it touches, so that its cost and the bytes it writes to the
checkpoint follow the batch, not the table. Each page is a read and a write of the state store, their
requests written ahead of their answers, many pages at once (``state_requests.py``).

Pages split as the group grows (linear hashing): a group starts with ``spark.state_pages`` pages, and while
its pages hold more than ``PAGE_BYTES`` on average, the next page in turn is split in two, the partitions
whose hash over twice as many pages names the new page moving there. So pages stay about that size whatever
the table's size, with nothing to size beforehand, and a key's page follows from the number of splits made.

A partition of a few rows keeps them in its pickled state; a wide one keeps them in a tree of leaves stored
apart, in a ``MapState`` of the group keyed by partition key and node id (``row_nodes.py``,
``merge.row_tree``): a write to it reads and writes its page, its tree's path and one leaf.

The group's ``ValueState`` is its index: its timer, how far its pages have split and how many bytes they
hold, the earliest expiry in each bucket of ``EXPIRY_BUCKET_PAGES`` pages (each bucket's pages' expiries are
a value of a third ``MapState``: a timer reads only the buckets and the pages due), and its truncations.
"""

from __future__ import annotations

import functools
import pickle
import zlib
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator

from pyspark.sql.types import IntegerType, StructField, StructType

from ..kafka.raw_records import TruncationRecord, is_truncation
from ..merge.clustering import Clustering
from ..merge.partition_state import Deletion
from ..merge.reconcile import PartitionState, delete_partition, next_expiry, only_deleted_by
from ..merge.table_view import table_view
from ..schema import TableMetadata
from ..storage.partition_update import PartitionUpdate
from .row_nodes import RowNodes
from .state_requests import MapStateRequests

PAGE_KEY_SCHEMA = StructType([StructField("page", IntegerType())])
EXPIRY_BUCKET_KEY_SCHEMA = StructType([StructField("bucket", IntegerType())])

DEFAULT_STATE_PAGES = 256
# The bytes a group's pages hold on average, beyond which a page is split. A write reads and writes its whole
# page, and in a large table each partition a batch writes is on a page of its own: small pages keep that
# cheap, in a backlog as in a batch of a few records. A batch that touches every page (a small table's backlog)
# pays a state call per page instead, which pages far smaller than a partition's state would multiply.
PAGE_BYTES = 1 << 10
# Pages whose next expiries are one value (bucket) of the expiries' MapState.
EXPIRY_BUCKET_PAGES = 4096
# Bytes of a group's pages a worker keeps read at once; beyond, the least recently used ones are written back.
PAGES_IN_MEMORY_BYTES = 64 << 20
# Pages read in one exchange with the state server at most; fewer while a group's pages are large (as many as
# fit in PAGES_IN_MEMORY_BYTES at the size of those read so far), and until one has been read.
READ_AHEAD_PAGES = 4096
FIRST_READ_AHEAD_PAGES = 16
# Bytes of a group's records a worker holds to merge them in the order of their pages; beyond, those held
# are merged and the next ones held anew.
RECORDS_ORDERED_BYTES = 64 << 20
# The nodes' copies of one truncation carry each node's own time: they are one truncation when this close
# to the one whose event was written. Cassandra's truncate_request_timeout (its default): every node
# truncates within it, or the TRUNCATE fails.
TRUNCATION_COPIES_WINDOW_MS = 60_000

# The timer of a group stored before groups recorded theirs: Spark is asked.
TIMER_NOT_RECORDED = -1
# The first item of a group's index: pages that split (and expiries in buckets); before, a fixed number of
# pages (and each one's expiry in the index); the value of a group stored whole is a dict or a tuple whose
# first item is its timer.
_SPLIT_PAGES = "split pages"
_PAGED = "pages"

Record = tuple[int | None, bytes, bytes]  # (page, key, value); page None: a truncation record


def page_of(partition_key: bytes, pages: int) -> int:
    """The page of a partition key among ``pages`` (a group that has not split): the same in every process
    (``hash`` of bytes is salted per process)."""
    return zlib.crc32(partition_key) % pages


def in_page_order(records: Iterable[tuple[bytes, bytes]],
                  page_number: Callable[[bytes], int]) -> Iterator[list[Record]]:
    """A group's ``(key, value)`` records in runs of ``(page, key, value)``, those of each page of a run
    together, pages in ascending order, so that a batch reads and writes each page once, however many pages
    its records touch: read in offset order, a group whose pages exceed ``PAGES_IN_MEMORY_BYTES`` would write
    back and read again a page for most of its records.

    Only the order across partition keys changes (events of different keys have no order): the records of
    each key keep theirs (the sort is stable, and a key is on one page). A truncation record stays where it
    was, a run of its own (its page None): the records before it are merged before it, those after it
    after it. A run holds at most ``RECORDS_ORDERED_BYTES`` of records: beyond, the held ones are merged
    first.
    """
    held: list[Record] = []
    held_bytes = 0
    for key, value in records:
        truncation = is_truncation(value)
        if not truncation:
            held.append((page_number(key), key, value))
            held_bytes += len(key) + len(value)
        if (truncation or held_bytes >= RECORDS_ORDERED_BYTES) and held:
            held.sort(key=_page_number)
            yield held
            held, held_bytes = [], 0
        if truncation:
            yield [(None, key, value)]
    if held:
        held.sort(key=_page_number)
        yield held


def _page_number(record: Record) -> int | None:
    return record[0]


def truncation_deletion(truncated_at_ms: int) -> Deletion:
    """The partition deletion a truncation amounts to: every write up to the end of the truncation's
    millisecond (its time has no finer grain; a write after the TRUNCATE returned is later), deleted then."""
    return truncated_at_ms * 1000 + 999, truncated_at_ms // 1000


def new_partition_state(partition_key: bytes, table: TableMetadata, truncation: Deletion | None,
                        now_seconds: int) -> PartitionState:
    """The state of a partition the group does not hold: empty, or deleted by its table's ``truncation``."""
    if truncation is None:
        return PartitionState()
    state = PartitionState(bytes(partition_key))
    delete_partition(state, table, truncation, now_seconds)
    return state


class PagedGroup:
    """The merge state of one group (raw topic partition), its partition keys spread over pages.

    Pages are read ahead of the records that need them (``read_ahead``), many in one exchange with the state
    server, and kept as ``PartitionPage``s until the batch's end, or until the pages read exceed
    ``PAGES_IN_MEMORY_BYTES``: then the least recently used ones are written back (a later record may read
    them again), so that a worker's memory does not follow the size of the state. Pages split when the batch
    ends (``write_pages``).

    Per truncated table (its id), the index keeps the deletion of its newest truncation, which every
    partition of the table the group holds or meets later is given, and, for the group that writes the
    truncation events, the time of the last one written. A truncation is applied at once to the pages read,
    and to each other page when it is next read (a page records the truncations applied to it): a batch
    with a truncation writes only the pages it touches, like any other.

    A group stored whole, as before pages, is read from the index value it was, and its partitions are
    written to their pages, once, the first time the group is saved; a group of the index before pages split
    has its pages' expiries put in buckets the first time it is saved.
    """

    def __init__(self, pages_state: MapStateRequests, expiries_state: MapStateRequests, nodes: RowNodes,
                 pages: int, stored_index: bytes | None,
                 definition: Callable[[bytes], TableMetadata | None]) -> None:
        self._pages_state = pages_state
        self._expiries_state = expiries_state
        self._nodes = nodes
        self._base_pages = pages
        self._definition = definition  # a table's definition by id, to apply its truncation to a page read
        self._read: OrderedDict[int, tuple[PartitionPage, int]] = OrderedDict()  # page → (page, bytes read)
        self._read_bytes = 0
        self._pages_loaded = 0
        self._bytes_loaded = 0
        self.stored_index = stored_index
        self.timer: int | None = None  # registered with Spark (ms), or None, or TIMER_NOT_RECORDED
        self._level = 0  # the pages split in full rounds: (pages << level) pages before this round's splits
        self._split = 0  # the pages split in this round: the next page to split
        self._stored_bytes: int | None = 0  # the bytes of the group's pages as last written (None: not known)
        self._bucket_expiries: dict[int, int] = {}  # bucket → the earliest next expiry of its pages (seconds)
        self._buckets: dict[int, dict[int, int]] = {}  # bucket → page → next expiry, for the buckets read
        self._buckets_changed: set[int] = set()
        self.truncations: dict[bytes, Deletion] = {}
        self.truncation_events: dict[bytes, int] = {}  # table id → the truncation time (ms) of its last event
        if stored_index is None:
            return
        stored = pickle.loads(stored_index)
        if isinstance(stored, tuple) and stored[0] == _SPLIT_PAGES:
            (_, self.timer, self._level, self._split, self._stored_bytes, self._bucket_expiries,
             self.truncations, self.truncation_events) = stored
            return
        if isinstance(stored, tuple) and stored[0] == _PAGED:
            _, self.timer, expiries, self.truncations, self.truncation_events = stored
            self._stored_bytes = None  # estimated from the pages the first batch reads
            for page, expiry in expiries.items():
                self._buckets.setdefault(page // EXPIRY_BUCKET_PAGES, {})[page] = expiry
            self._buckets_changed.update(self._buckets)
            self._bucket_expiries = {bucket: min(pages.values()) for bucket, pages in self._buckets.items()}
            return
        # A group stored whole: a dict of its partitions before groups recorded their timer, then a tuple
        # (timer, partitions), then with the group's truncations and truncation events after them.
        if isinstance(stored, dict):
            stored = (TIMER_NOT_RECORDED, stored)
        self.timer, partitions, self.truncations, self.truncation_events = (*stored, {}, {})[:4]
        for key, value in partitions.items():  # each already deleted by the group's truncations
            page = self.page_number(key)
            if page not in self._read:
                self._read[page] = (PartitionPage({}, dict(self.truncations), changed=True, nodes=nodes), 0)
            self._read[page][0].stored[key] = value

    # --- where a partition is -----------------------------------------------------------------------

    def page_number(self, key: bytes) -> int:
        """The page of a partition key: by its hash over the pages of this round, or over twice as many once
        its page has split in this round."""
        hashed = zlib.crc32(key)
        page = hashed % (self._base_pages << self._level)
        if page < self._split:
            page = hashed % (self._base_pages << (self._level + 1))
        return page

    @property
    def pages(self) -> int:
        return (self._base_pages << self._level) + self._split

    # --- reading pages ------------------------------------------------------------------------------

    def read_ahead(self, records: list[Record]) -> Iterator[list[Record]]:
        """A run of ``in_page_order`` in windows, the pages of each read before it is yielded, in one exchange:
        as many pages as fit in ``PAGES_IN_MEMORY_BYTES`` at the size of the pages read so far."""
        start = 0
        while start < len(records):
            fit = self._pages_that_fit()
            wanted: set[int] = set()
            end = start
            while end < len(records):
                page = records[end][0]
                if page is not None and page not in wanted and page not in self._read:
                    if len(wanted) == fit:
                        break
                    wanted.add(page)
                end += 1
            self.read(wanted)
            yield records[start:end]
            start = end

    def _pages_that_fit(self) -> int:
        if not self._pages_loaded:
            return FIRST_READ_AHEAD_PAGES
        page_bytes = max(1, self._bytes_loaded // self._pages_loaded)
        return max(1, min(READ_AHEAD_PAGES, PAGES_IN_MEMORY_BYTES // page_bytes))

    def read(self, pages: Iterable[int]) -> None:
        """Read those of ``pages`` not read yet, in one exchange with the state server, then write back the
        least recently used of the others while the pages read exceed ``PAGES_IN_MEMORY_BYTES`` (those just
        read are kept: ``read_ahead`` asks for as many as fit)."""
        wanted = sorted(page for page in set(pages) if page not in self._read)
        if not wanted:
            return
        for page, stored in zip(wanted, self._pages_state.get_all([(page,) for page in wanted])):
            partitions = PartitionPage.load(None if stored is None else stored[0], self._nodes)
            self._apply_truncations(partitions)
            size = 0 if stored is None else len(stored[0])
            self._read[page] = (partitions, size)
            self._read_bytes += size
            self._pages_loaded += 1
            self._bytes_loaded += size
        written_back = []
        while self._read_bytes > PAGES_IN_MEMORY_BYTES and len(self._read) > len(wanted):
            page, (partitions, size) = self._read.popitem(last=False)
            self._read_bytes -= size
            written_back.append((page, partitions, size))
        self._write_back(written_back)

    def _page(self, page: int) -> PartitionPage:
        if page not in self._read:
            self.read((page,))
        self._read.move_to_end(page)
        return self._read[page][0]

    def page(self, key: bytes) -> "PartitionPage":
        """The page of a partition key, read if it is not yet."""
        return self._page(self.page_number(key))

    def _apply_truncations(self, page: PartitionPage) -> None:
        """Apply to a page just read the group's truncations it has not had yet."""
        for table_id, deletion in self.truncations.items():
            if page.truncations.get(table_id) == deletion:
                continue
            table = self._definition(table_id)
            # Unknown: its partitions cannot be merged either; applied once it is known.
            if table is not None:
                page.truncate(table_id, deletion, table)

    def read_leaves(self, updates: Iterable[tuple[bytes, TableMetadata, PartitionUpdate]]) -> None:
        """Read, in one exchange per level of their trees, the nodes of wide partitions the rows of
        ``(partition key, table, update)``s are in."""
        wanted: dict[bytes, tuple[PartitionState, list[Clustering]]] = {}
        for key, table, update in updates:
            if not update.rows:
                continue
            state = self.page(key).get(key)
            if state is None or state.rows.inline:
                continue
            state.rows.order = table_view(table).clustering_sort_key
            wanted.setdefault(key, (state, []))[1].extend(row.clustering for row in update.rows)
        while wanted:
            unread = {key: state.rows.unread(clusterings, functools.partial(self._nodes.available, key))
                      for key, (state, clusterings) in wanted.items()}
            self._nodes.read_ahead((key, node) for key, nodes in unread.items() for node in sorted(nodes))
            wanted = {key: wanted[key] for key, nodes in unread.items() if nodes}

    # --- writing pages ------------------------------------------------------------------------------

    def _write_back(self, pages: list[tuple[int, PartitionPage, int]]) -> None:
        """Write ``(page number, page, bytes it was read from)``s back, in one exchange with the state server
        (two when some have no partitions left), with their expiries' buckets."""
        updated: list[tuple[tuple[int], tuple[bytes]]] = []
        removed: list[tuple[int]] = []
        expiries: dict[int, int | None] = {}
        for page, partitions, size in pages:
            if not partitions.changed:
                continue  # as it was read (its expiry unchanged)
            stored = partitions.dump()
            expiries[page] = partitions.earliest_expiry()
            if self._stored_bytes is not None:
                self._stored_bytes += (0 if stored is None else len(stored)) - size
            if stored is None:
                removed.append((page,))
            else:
                updated.append(((page,), (stored,)))
        if updated:
            self._pages_state.update_all(updated)
        if removed:
            self._pages_state.remove_all(removed)
        self._nodes.flush()  # the wide partitions' leaves the pages sealed
        self._note_expiries(expiries)

    def _note_expiries(self, expiries: dict[int, int | None]) -> None:
        """Record pages' next expiries (None: none) in their buckets, the buckets not read yet read first."""
        self._read_buckets({page // EXPIRY_BUCKET_PAGES for page in expiries})
        for page, expiry in expiries.items():
            bucket = self._buckets[page // EXPIRY_BUCKET_PAGES]
            if bucket.get(page) == expiry:
                continue
            if expiry is None:
                del bucket[page]
            else:
                bucket[page] = expiry
            self._buckets_changed.add(page // EXPIRY_BUCKET_PAGES)

    def _read_buckets(self, buckets: Iterable[int]) -> None:
        """Read the buckets of expiries not read yet (those that have expiries), in one exchange."""
        wanted = sorted(bucket for bucket in buckets if bucket not in self._buckets)
        stored = [b for b in wanted if b in self._bucket_expiries]
        for bucket in wanted:
            self._buckets[bucket] = {}
        for bucket, value in zip(stored, self._expiries_state.get_all([(bucket,) for bucket in stored])):
            if value is not None:
                self._buckets[bucket] = pickle.loads(value[0])

    def _write_buckets(self) -> None:
        updated, removed = [], []
        for bucket in sorted(self._buckets_changed):
            pages = self._buckets[bucket]
            if pages:
                self._bucket_expiries[bucket] = min(pages.values())
                updated.append(((bucket,), (pickle.dumps(pages, protocol=pickle.HIGHEST_PROTOCOL),)))
            else:
                self._bucket_expiries.pop(bucket, None)
                removed.append((bucket,))
        if updated:
            self._expiries_state.update_all(updated)
        if removed:
            self._expiries_state.remove_all(removed)
        self._buckets_changed.clear()

    def write_pages(self) -> None:
        """Write back every page read (the partitions opened pickled again), split pages while they hold more
        than ``PAGE_BYTES`` on average, and write the expiries' buckets changed."""
        self._write_back([(page, partitions, size) for page, (partitions, size) in self._read.items()])
        self._read.clear()
        self._read_bytes = 0
        if self._stored_bytes is None and self._pages_loaded:
            self._stored_bytes = self._bytes_loaded * self.pages // self._pages_loaded
        while self._stored_bytes is not None and self._stored_bytes > PAGE_BYTES * self.pages:
            self._split_pages(max(1, min(self._pages_that_fit() // 2,
                                         self._stored_bytes // PAGE_BYTES - self.pages)))  # type: ignore
        self._write_buckets()

    def _split_pages(self, count: int) -> None:
        """Split the next ``count`` pages in turn (within the round): each read, its partitions that the
        hash over twice the round's pages places on the new page moved there, both written back."""
        round_pages = self._base_pages << self._level
        splitting = list(range(self._split, min(self._split + count, round_pages)))
        self.read(splitting)
        self._split += len(splitting)
        if self._split == round_pages:
            self._level, self._split = self._level + 1, 0
        for page in splitting:
            partitions, _ = self._read[page]
            new = PartitionPage({}, dict(partitions.truncations), changed=True, nodes=self._nodes)
            for key in [key for key in partitions.keys() if zlib.crc32(key) % (round_pages << 1) != page]:
                partitions.move(key, new)
            self._read[page + round_pages] = (new, 0)
        self._write_back([(page, partitions, size) for page, (partitions, size) in self._read.items()])
        self._read.clear()
        self._read_bytes = 0

    # --- partitions, truncations, expiries ----------------------------------------------------------

    def remove(self, key: bytes) -> None:
        self.page(key).remove(key)

    def truncate(self, table_id: bytes, deletion: Deletion, table: TableMetadata) -> None:
        """Keep a truncation of a table, the table's newest, for its partitions held and to come, and apply
        it to the pages read (the others have it applied when read)."""
        newest = max(deletion, self.truncations.get(table_id, deletion))
        self.truncations[table_id] = newest
        for partitions, _ in self._read.values():
            partitions.truncate(table_id, newest, table)

    def new_truncation(self, record: TruncationRecord) -> bool:
        """Whether a truncation record is of a truncation whose event is not written yet (noting that it is
        now): not a node's copy of the last one."""
        last = self.truncation_events.get(record.table_id)
        if last is not None and record.truncated_at_ms <= last + TRUNCATION_COPIES_WINDOW_MS:
            return False
        self.truncation_events[record.table_id] = record.truncated_at_ms
        return True

    def due(self, now_seconds: int) -> Iterator[tuple[bytes, PartitionState]]:
        """The partitions whose stored expiry has come, opened: only the buckets and the pages due are read."""
        due_buckets = [bucket for bucket, expiry in self._bucket_expiries.items() if expiry <= now_seconds]
        self._read_buckets(due_buckets)
        due_pages = {page for bucket in due_buckets for page, expiry in self._buckets[bucket].items()
                     if expiry <= now_seconds}
        pages = sorted(due_pages.union(self._read))
        start = 0
        while start < len(pages):
            window = pages[start:start + self._pages_that_fit()]
            self.read(window)
            for page in window:
                partitions = self._page(page)
                for key in partitions.due_keys(now_seconds):
                    yield key, partitions.get(key)  # type: ignore[misc]
            start += len(window)

    def earliest_expiry(self) -> int | None:
        """The earliest expiry of the group's pages, once written back."""
        return min(self._bucket_expiries.values(), default=None)

    def index(self) -> bytes | None:
        """The group's index value; None when there is nothing to record."""
        if (self.timer is None and not self._bucket_expiries and not self.truncations
                and not self.truncation_events and not (self._level or self._split or self._stored_bytes)):
            return None
        return pickle.dumps((_SPLIT_PAGES, self.timer, self._level, self._split, self._stored_bytes,
                             self._bucket_expiries, self.truncations, self.truncation_events),
                            protocol=pickle.HIGHEST_PROTOCOL)


class PartitionPage:
    """The merge states of a page of a group's partitions, each pickled on its own with its next expiry and its
    recent digests beside it, and the truncations applied to them (table id → deletion).

    A micro-batch touches some of them: only those are unpickled and pickled again, the others stay bytes
    (copied, never decoded). A partition whose digests show a record merged already is not even unpickled;
    a page none of whose partitions was opened, added, removed or truncated is not ``changed``: it need not be
    written back.
    """

    def __init__(self, stored: dict[bytes, tuple[Any, ...]], truncations: dict[bytes, Deletion] | None = None,
                 changed: bool = False, nodes: RowNodes | None = None) -> None:
        # partition key → (next expiry, PartitionState.seal(), its digests); pages written before the
        # digests were kept apart hold (next expiry, pickled state with its digests).
        self.stored = stored
        self._opened: dict[bytes, PartitionState] = {}
        self.truncations = truncations or {}
        self._changed = changed
        self._nodes = nodes  # where the rows of its wide partitions are (their trees' nodes)

    @classmethod
    def load(cls, value: bytes | None, nodes: RowNodes | None = None) -> "PartitionPage":
        """A page's value as ``dump`` made it (None: no state)."""
        if value is None:
            return cls({}, nodes=nodes)
        return cls(*pickle.loads(value), nodes=nodes)

    @property
    def changed(self) -> bool:
        """Whether the page differs from the value it was read from."""
        return self._changed or bool(self._opened)

    def get(self, key: bytes) -> PartitionState | None:
        """The partition's state, opened to be merged into (the page is then ``changed``)."""
        state = self._opened.get(key)
        if state is None and key in self.stored:
            entry = self.stored[key]
            stored = pickle.loads(entry[1])
            # A checkpoint may hold states pickled as objects, as before they were stored as builtins.
            if isinstance(stored, PartitionState):
                state = stored
            else:
                state = PartitionState.from_stored(stored, entry[2] if len(entry) > 2 else (), self._loader(key))
            self._opened[key] = state
        return state

    def seen(self, key: bytes, digest: bytes | None) -> bool:
        """Whether the partition has merged the update of this digest recently, from the digests stored beside
        its state when they are (else from the state, opened)."""
        if digest is None:
            return False
        state = self._opened.get(key)
        if state is None:
            entry = self.stored.get(key)
            if entry is None:
                return False
            if len(entry) > 2:
                return digest in entry[2]
            state = self.get(key)
            assert state is not None
        return state.seen(digest)

    def _loader(self, key: bytes) -> Callable[[int], bytes] | None:
        nodes = self._nodes
        if nodes is None:
            return None
        return lambda node: nodes.read(key, node)

    def add(self, key: bytes, state: PartitionState) -> None:
        self._opened[key] = state

    def keys(self) -> list[bytes]:
        return list(self.stored.keys() | self._opened.keys())

    def move(self, key: bytes, other: "PartitionPage") -> None:
        """Move a partition to another page of the group (a page split): as stored, or as opened."""
        if key in self.stored:
            other.stored[key] = self.stored.pop(key)
        if key in self._opened:
            other._opened[key] = self._opened.pop(key)
        self._changed = other._changed = True

    def truncate(self, table_id: bytes, deletion: Deletion, table: TableMetadata) -> None:
        """Apply a truncation of a table to its partitions here (those left with nothing else are dropped).

        Each partition is deleted at its own clock: a page read later than the truncation must not move its
        partitions' clocks on, or what expired in between (written after the truncation) would have no event.
        """
        self.truncations[table_id] = deletion
        self._changed = True
        for key in [key for key in self.keys() if key[:16] == table_id]:
            state = self.get(key)
            assert state is not None and state.clock is not None  # every state stored was merged at a time
            delete_partition(state, table, deletion, state.clock)
            if only_deleted_by(state, deletion):
                self.remove(key)

    def remove(self, key: bytes) -> None:
        """Drop a partition, and the leaves of its rows."""
        state = self.get(key)
        if state is not None and not state.rows.inline:
            self._row_nodes().remove(key, state.rows.node_ids())
        self._opened.pop(key, None)
        self.stored.pop(key, None)
        self._changed = True

    def _row_nodes(self) -> RowNodes:
        if self._nodes is None:
            raise RuntimeError("this page has nowhere to keep the leaves of its partitions' rows")
        return self._nodes

    def due_keys(self, now_seconds: int) -> list[bytes]:
        """The partitions whose stored expiry has come (the opened ones sealed first)."""
        self.seal()
        return [key for key, (expiry, *_) in self.stored.items()
                if expiry is not None and expiry <= now_seconds]

    def seal(self) -> None:
        """Pickle the opened partitions again (and note their next expiries and digests)."""
        for key, state in self._opened.items():
            stored, written, removed = state.seal()
            if written or removed:
                nodes = self._row_nodes()
                nodes.write(key, written)
                nodes.remove(key, removed)
            self.stored[key] = (next_expiry(state), stored, state.digests)
        if self._opened:
            self._changed = True
        self._opened.clear()

    def dump(self) -> bytes | None:
        """The page's value, sealed first; None when it has no partitions."""
        self.seal()
        if not self.stored:
            return None
        return pickle.dumps((self.stored, self.truncations), protocol=pickle.HIGHEST_PROTOCOL)

    def earliest_expiry(self) -> int | None:
        self.seal()
        return min((entry[0] for entry in self.stored.values() if entry[0] is not None), default=None)


__all__ = ["DEFAULT_STATE_PAGES", "EXPIRY_BUCKET_KEY_SCHEMA", "PAGE_KEY_SCHEMA", "PagedGroup", "PartitionPage",
           "TIMER_NOT_RECORDED", "in_page_order", "new_partition_state", "page_of", "truncation_deletion"]
