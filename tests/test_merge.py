"""Merging partition updates: one test per Cassandra reconciliation rule, each in every arrival order.

Every rule test delivers its updates in every order (``itertools.permutations``), each update twice
(replayed after the whole sequence, and doubled in place), and checks:

* the final rows are the ones written down in the test (what Cassandra returns for those writes);
* replaying the emitted ``RowChange``s from an empty table rebuilds them, each ``before`` being the
  row as the previous changes left it, and no change has ``before == after``;
* as many changes are emitted as there are real changes: rows whose view differs between consecutive
  prefixes of the order, each prefix merged into a fresh state (so copies add nothing).
"""

from __future__ import annotations

import decimal
import functools
import itertools
import math
import pickle
import struct
import uuid
from typing import Any, Sequence

import pytest

from cassandra_cdc.commitlog import MutationSerializer
from cassandra_cdc.storage import BoundKind, DeletionTime, LivenessInfo, PartitionUpdate, RangeTombstoneMarker, Row
from cassandra_cdc.storage.cells import EXPIRED_LIVENESS_TTL
from cassandra_cdc.storage.counters import CounterShard
from cassandra_cdc.merge.clustering import ClusteringComparator, compare_values
from cassandra_cdc.merge.reconcile import RowChange, apply, expire, next_expiry, visible_rows
from cassandra_cdc.merge.partition_state import PartitionState
from cassandra_cdc.schema import Schema, TableMetadata, parse_schema, parse_type
from cassandra_cdc.simulator import (AddToSet, AppendToList, CounterAdd, CounterLedger, DeleteColumns,
                                     DeletePartition, DeleteRange, DeleteRow, Insert, Operation, PutInMap,
                                     RemoveFromSet, RemoveMapKeys, SetUdtFields, Update, to_mutation)
from row_changes import assert_chain

SCHEMA = parse_schema("""
CREATE TYPE ks.addr (street text, zip int);
CREATE TABLE ks.users (id int PRIMARY KEY, name text, age int, data blob, emails set<text>,
                       prefs map<text, int>, tags list<text>, home addr, frozen_prefs frozen<map<text, int>>);
CREATE TABLE ks.events (pk int, ck int, v text, s int static, PRIMARY KEY (pk, ck));
CREATE TABLE ks.timeline (pk int, a int, b text, v int, PRIMARY KEY (pk, a, b))
    WITH CLUSTERING ORDER BY (a ASC, b DESC);
CREATE TABLE ks.hits (page text PRIMARY KEY, n counter);
CREATE TABLE ks.short (id int PRIMARY KEY, v int, d int) WITH gc_grace_seconds = 10;
""")
USERS, EVENTS, TIMELINE, HITS, SHORT = (SCHEMA.table("ks", n)
                                        for n in ("users", "events", "timeline", "hits", "short"))
SECOND = 1_000_000
T0 = 1_700_000_000 * SECOND
NOW = T0 // SECOND + 1


def at(seconds: float) -> int:
    return T0 + round(seconds * SECOND)


def update_of(op: Operation, shard: CounterShard | None = None) -> PartitionUpdate:
    """The op's partition update as the pipeline sees it: serialized, then decoded."""
    body = MutationSerializer.serialize(to_mutation(op, SCHEMA, shard), 7)
    [update] = MutationSerializer.deserialize(body, SCHEMA, 7).updates
    return update


def updates_of(*ops: Operation) -> list[PartitionUpdate]:
    return [update_of(op) for op in ops]


def merged(updates: Sequence[PartitionUpdate], table: TableMetadata, now: int = NOW) \
        -> tuple[PartitionState, list[RowChange]]:
    state = PartitionState()
    changes: list[RowChange] = []
    for update in updates:
        changes += apply(state, update, table, now)
    return state, changes


def rows(state: PartitionState, table: TableMetadata, now: int = NOW) -> list[dict[str, Any]]:
    return list(visible_rows(state, table, now).values())


def real_changes(order: Sequence[PartitionUpdate], table: TableMetadata, now: int, later: int | None) -> int:
    """Rows whose view differs between consecutive prefixes of ``order`` (each merged afresh)."""
    count, previous = 0, {}
    for k in range(1, len(order) + 1):
        current = visible_rows(merged(order[:k], table, now)[0], table, now)
        count += sum(previous.get(c) != current.get(c) for c in previous.keys() | current.keys())
        previous = current
    if later is not None:
        state = merged(order, table, now)[0]
        expire(state, table, later)
        current = visible_rows(state, table, later)
        count += sum(previous.get(c) != current.get(c) for c in previous.keys() | current.keys())
    return count


def check_every_order(updates: Sequence[PartitionUpdate], table: TableMetadata,
                      expected: list[dict[str, Any]], now: int = NOW, later: int | None = None) -> None:
    """Merge ``updates`` in every order, each twice; at ``later`` (if given) after expiring to it."""
    for permutation in itertools.permutations(updates):
        order = list(permutation)
        count = real_changes(order, table, now, later)
        for sequence in (order + order, [u for u in order for _ in range(2)]):
            state, changes = merged(sequence, table, now)
            if later is not None:
                changes += expire(state, table, later)
            final = visible_rows(state, table, later or now)
            assert list(final.values()) == expected
            assert_chain(changes, final)
            assert len(changes) == count
            # The state survives the state store.
            assert rows(pickle.loads(pickle.dumps(state)), table, later or now) == expected


# --- cells ------------------------------------------------------------------------------------------------

def test_higher_timestamp_wins() -> None:
    updates = updates_of(Update("ks.users", {"id": 1}, {"name": "first"}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"name": "third", "age": 3}, timestamp=at(3)),
                         Update("ks.users", {"id": 1}, {"name": "second", "age": 2}, timestamp=at(2)))
    check_every_order(updates, USERS, [user(name="third", age=3)])


def test_equal_timestamps_tombstone_beats_value() -> None:
    updates = updates_of(Update("ks.users", {"id": 1}, {"name": "zzz", "age": 1}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"name": None}, timestamp=at(1)))
    check_every_order(updates, USERS, [user(age=1)])


def test_equal_timestamps_greater_value_wins_as_unsigned_bytes() -> None:
    # 0x80 > 0x7f unsigned (Java's signed ByteBuffer.compareTo, used by 3.x, would pick 0x7f).
    updates = updates_of(Update("ks.users", {"id": 1}, {"data": b"\x7f\xff", "name": "abc"}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"data": b"\x80", "name": "abd"}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"data": b"\x7f", "name": "ab"}, timestamp=at(1)))
    check_every_order(updates, USERS, [user(data=b"\x80", name="abd")])


def test_equal_timestamps_expiring_beats_live_whatever_the_value() -> None:
    # CASSANDRA-14592: a cell with a local deletion time wins a timestamp tie, before values are compared;
    # so once it expires the column is null, not the other value.
    updates = updates_of(Update("ks.users", {"id": 1}, {"name": "zzz", "age": 7}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"name": "aaa"}, ttl=100, timestamp=at(1)))
    check_every_order(updates, USERS, [user(name="aaa", age=7)])
    check_every_order(updates, USERS, [user(age=7)], later=NOW + 200)


def test_equal_timestamps_later_expiry_wins_then_tombstone_beats_expiring() -> None:
    longer = updates_of(Update("ks.users", {"id": 1}, {"name": "zzz", "age": 1}, ttl=10, timestamp=at(1)),
                        Update("ks.users", {"id": 1}, {"name": "aaa"}, ttl=50, timestamp=at(1)))
    check_every_order(longer, USERS, [user(name="aaa")], later=NOW + 20)
    tombstone = longer + updates_of(Update("ks.users", {"id": 1}, {"name": None}, timestamp=at(1)))
    check_every_order(tombstone, USERS, [user(age=1)])


# --- rows -------------------------------------------------------------------------------------------------

def test_insert_creates_a_row_that_survives_with_null_columns() -> None:
    updates = updates_of(Insert("ks.users", {"id": 1, "name": "a"}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"name": None}, timestamp=at(2)))
    check_every_order(updates, USERS, [user()])


def test_update_creates_no_row_liveness() -> None:
    updates = updates_of(Update("ks.users", {"id": 1}, {"name": "a", "emails": {"x"}}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"name": None}, timestamp=at(2)),
                         RemoveFromSet("ks.users", {"id": 1}, "emails", ["x"], timestamp=at(3)))
    check_every_order(updates, USERS, [])


def test_row_deletion_hides_older_writes_whenever_they_arrive() -> None:
    updates = updates_of(Insert("ks.events", {"pk": 1, "ck": 1, "v": "old"}, timestamp=at(1)),
                         DeleteRow("ks.events", {"pk": 1, "ck": 1}, timestamp=at(2)),
                         Update("ks.events", {"pk": 1, "ck": 2}, {"v": "other row"}, timestamp=at(1)),
                         Update("ks.events", {"pk": 1, "ck": 1}, {"v": "new"}, timestamp=at(3)))
    check_every_order(updates, EVENTS, [event(1, "new"), event(2, "other row")])


def test_partition_deletion_deletes_rows_and_statics_written_before_it() -> None:
    updates = updates_of(Insert("ks.events", {"pk": 1, "ck": 1, "v": "a", "s": 5}, timestamp=at(1)),
                         Insert("ks.events", {"pk": 1, "ck": 2, "v": "b"}, timestamp=at(3)),
                         DeletePartition("ks.events", {"pk": 1}, timestamp=at(2)),
                         Update("ks.events", {"pk": 1, "ck": 1}, {"v": "c"}, timestamp=at(1.5)))
    check_every_order(updates, EVENTS, [event(2, "b")])
    # In order, the deletion changes every row it deletes (each gets its own change).
    state, changes = merged(updates[:2] + updates[3:] + updates[2:3], EVENTS)
    assert [(c.clustering, c.after) for c in changes[-2:]] == [(ck(1), None), (ck(2), event(2, "b"))]


def test_range_deletion_covers_rows_between_its_bounds_in_clustering_order() -> None:
    # b is DESC: the slice b >= "b" AND b < "d" starts at "d" (exclusive) and ends at "b" (inclusive).
    writes = [Insert("ks.timeline", {"pk": 1, "a": a, "b": b, "v": i}, timestamp=at(1))
              for i, (a, b) in enumerate([(1, "a"), (1, "b"), (1, "c"), (1, "d"), (2, "b")])]
    deletion = DeleteRange("ks.timeline", {"pk": 1, "a": 1}, "b", "d", True, False, timestamp=at(2))
    [marker_start, marker_end] = update_of(deletion).markers
    assert (marker_start.clustering, marker_start.kind) == (ck(1) + (b"d",), BoundKind.EXCL_START_BOUND)
    assert (marker_end.clustering, marker_end.kind) == (ck(1) + (b"b",), BoundKind.INCL_END_BOUND)
    # Older than the deletion: stays deleted whenever it arrives.
    late = Insert("ks.timeline", {"pk": 1, "a": 1, "b": "c", "v": 9}, timestamp=at(1.5))
    updates = [update_of(deletion), update_of(late), _batch(writes)]
    check_every_order(updates, TIMELINE, [timeline(1, "d", 3), timeline(1, "a", 0), timeline(2, "b", 4)])


def test_range_deleted_again_later_deletes_what_was_written_in_between() -> None:
    updates = updates_of(DeleteRange("ks.events", {"pk": 1}, 1, 3, timestamp=at(2)),
                         Insert("ks.events", {"pk": 1, "ck": 2, "v": "between"}, timestamp=at(3)),
                         Insert("ks.events", {"pk": 1, "ck": 4, "v": "outside"}, timestamp=at(3)),
                         DeleteRange("ks.events", {"pk": 1}, 1, 3, timestamp=at(4)))
    check_every_order(updates, EVENTS, [event(4, "outside")])


def test_range_tombstone_boundaries() -> None:
    # [1, 3) deleted at 5 then [3, 6] at 7: a boundary marker at 3 closes one and opens the other.
    markers = [RangeTombstoneMarker(BoundKind.INCL_START_BOUND, ck(1),
                                    open_deletion=DeletionTime(at(5), NOW)),
               RangeTombstoneMarker(BoundKind.EXCL_END_INCL_START_BOUNDARY, ck(3), DeletionTime(at(7), NOW),
                                    DeletionTime(at(5), NOW)),
               RangeTombstoneMarker(BoundKind.INCL_END_BOUND, ck(6), close_deletion=DeletionTime(at(7), NOW))]
    deletion = PartitionUpdate(EVENTS, struct.pack(">i", 1), list(markers))
    writes = _batch([Insert("ks.events", {"pk": 1, "ck": ck, "v": f"v{ck}"}, timestamp=at(t))
                     for ck, t in [(0, 1), (1, 1), (2, 6), (3, 6), (6, 6), (7, 1)]])
    check_every_order([deletion, writes], EVENTS, [event(0, "v0"), event(2, "v2"), event(7, "v7")])


def test_static_change_updates_every_row_and_static_only_partition_shows_one_row() -> None:
    updates = updates_of(Update("ks.events", {"pk": 1}, {"s": 1}, timestamp=at(1)),
                         Insert("ks.events", {"pk": 1, "ck": 1, "v": "a"}, timestamp=at(2)),
                         Insert("ks.events", {"pk": 1, "ck": 2, "v": "b"}, timestamp=at(2)),
                         Update("ks.events", {"pk": 1}, {"s": 2}, timestamp=at(3)))
    check_every_order(updates, EVENTS, [event(1, "a", 2), event(2, "b", 2)])
    _, changes = merged(updates, EVENTS)
    static_only = {"pk": 1, "ck": None, "v": None, "s": 1}
    assert [(c.clustering, c.after) for c in changes] == [
        ((), static_only),
        ((), None), (ck(1), event(1, "a", 1)),  # the first row replaces the static-only one
        (ck(2), event(2, "b", 1)), (ck(1), event(1, "a", 2)), (ck(2), event(2, "b", 2))]
    # Deleting the rows brings the static-only row back.
    deleted = updates + updates_of(DeleteRange("ks.events", {"pk": 1}, 0, 5, timestamp=at(4)))
    check_every_order(deleted, EVENTS, [{"pk": 1, "ck": None, "v": None, "s": 2}])


# --- collections ------------------------------------------------------------------------------------------

def test_set_and_map_elements_merge_one_by_one() -> None:
    updates = updates_of(AddToSet("ks.users", {"id": 1}, "emails", ["a", "b"], timestamp=at(1)),
                         AddToSet("ks.users", {"id": 1}, "emails", ["c"], timestamp=at(2)),
                         RemoveFromSet("ks.users", {"id": 1}, "emails", ["a"], timestamp=at(3)),
                         PutInMap("ks.users", {"id": 1}, "prefs", {"x": 1, "y": 2}, timestamp=at(1)),
                         RemoveMapKeys("ks.users", {"id": 1}, "prefs", ["x"], timestamp=at(2)))
    check_every_order(updates, USERS, [user(emails={"b", "c"}, prefs={"y": 2})])


def test_collection_overwrite_deletes_older_elements_only() -> None:
    # SET emails = {...} at 2 is a complex deletion at 2 - 1 µs plus the new elements.
    updates = updates_of(AddToSet("ks.users", {"id": 1}, "emails", ["old"], timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"emails": {"x", "y"}}, timestamp=at(2)),
                         AddToSet("ks.users", {"id": 1}, "emails", ["later"], timestamp=at(3)),
                         AppendToList("ks.users", {"id": 1}, "tags", ["t2"], timestamp=at(2)))
    check_every_order(updates, USERS, [user(emails={"later", "x", "y"}, tags=["t2"])])
    deleted = updates + updates_of(DeleteColumns("ks.users", {"id": 1}, ["emails"], timestamp=at(3)))
    check_every_order(deleted, USERS, [user(tags=["t2"])])


def test_list_elements_keep_their_append_order_and_udt_fields_merge() -> None:
    updates = updates_of(AppendToList("ks.users", {"id": 1}, "tags", ["c", "d"], timestamp=at(2)),
                         AppendToList("ks.users", {"id": 1}, "tags", ["z", "a"], timestamp=at(1)),
                         SetUdtFields("ks.users", {"id": 1}, "home", {"street": "Main"}, timestamp=at(1)),
                         SetUdtFields("ks.users", {"id": 1}, "home", {"zip": 75}, timestamp=at(2)))
    check_every_order(updates, USERS, [user(tags=["z", "a", "c", "d"], home=("Main", 75))])
    state, _ = merged(updates, USERS)
    assert rows(state, USERS)[0]["home"].street == "Main"


def test_frozen_values_are_replaced_whole() -> None:
    updates = updates_of(Update("ks.users", {"id": 1}, {"frozen_prefs": {"a": 1, "b": 2}}, timestamp=at(1)),
                         Update("ks.users", {"id": 1}, {"frozen_prefs": {"c": 3}}, timestamp=at(2)))
    check_every_order(updates, USERS, [user(frozen_prefs={"c": 3})])


# --- TTL --------------------------------------------------------------------------------------------------

def test_ttl_rows_and_cells_expire_at_their_expiry() -> None:
    updates = updates_of(Insert("ks.events", {"pk": 1, "ck": 1, "v": "a"}, ttl=10, timestamp=at(0)),
                         Update("ks.events", {"pk": 1, "ck": 2}, {"v": "b"}, ttl=20, timestamp=at(0)),
                         Insert("ks.events", {"pk": 1, "ck": 3, "v": "c"}, timestamp=at(0)),
                         Update("ks.events", {"pk": 1, "ck": 3}, {"v": "d"}, ttl=5, timestamp=at(1)))
    start = T0 // SECOND
    check_every_order(updates, EVENTS, [event(1, "a"), event(2, "b"), event(3, "d")], now=start)
    check_every_order(updates, EVENTS, [event(2, "b"), event(3, None)], now=start, later=start + 10)
    check_every_order(updates, EVENTS, [event(3, None)], now=start, later=start + 20)

    state, changes = merged(updates, EVENTS, start)
    assert next_expiry(state) == start + 6
    assert expire(state, EVENTS, start + 5) == [] and next_expiry(state) == start + 6
    [change] = expire(state, EVENTS, start + 6)
    assert (change.before, change.after) == (event(3, "d"), event(3, None))
    assert next_expiry(state) == start + 10
    # An update at a later time first emits what expired meanwhile, then its own change.
    write = update_of(Update("ks.events", {"pk": 1, "ck": 2}, {"v": "e"}, timestamp=at(2)))
    later = apply(state, write, EVENTS, start + 15)
    assert [(c.before, c.after) for c in later] == [(event(1, "a"), None), (event(2, "b"), event(2, "e"))]
    assert expire(state, EVENTS, start + 14) == []  # time does not go back


def test_expired_data_still_shadows_older_writes() -> None:
    start = T0 // SECOND
    updates = updates_of(Update("ks.users", {"id": 1}, {"name": "old", "age": 1}, timestamp=at(0)),
                         Update("ks.users", {"id": 1}, {"name": "ttl"}, ttl=5, timestamp=at(1)))
    check_every_order(updates, USERS, [user(age=1)], now=start, later=start + 10)
    # Arriving after the expiry, the TTL'd write is already invisible but still hides the older value.
    state, _ = merged(updates[:1], USERS, start)
    [change] = apply(state, updates[1], USERS, start + 10)
    assert (change.before, change.after) == (user(name="old", age=1), user(age=1))
    assert apply(state, updates[0], USERS, start + 11) == []
    assert rows(state, USERS, start + 11) == [user(age=1)]


# --- counters ---------------------------------------------------------------------------------------------

def test_counter_shards_merge_by_clock_and_sum() -> None:
    # A leader's clock counts its increments: the last one wins even with an older client timestamp.
    ledger, first, second = CounterLedger(), uuid.uuid4(), uuid.uuid4()
    updates = []
    for leader, delta, seconds in [(first, 5, 5), (second, 10, 1), (first, -2, 2)]:
        op = CounterAdd("ks.hits", {"page": "home"}, "n", delta, timestamp=at(seconds))
        updates.append(update_of(op, ledger.advance(HITS, op, leader)))
    check_every_order(updates, HITS, [{"page": "home", "n": 13}])


def test_counter_tombstone_beats_increments_whatever_their_timestamp() -> None:
    op = CounterAdd("ks.hits", {"page": "home"}, "n", 5, timestamp=at(2))
    increment = update_of(op, CounterLedger().advance(HITS, op, uuid.uuid4()))
    deletion = update_of(DeleteColumns("ks.hits", {"page": "home"}, ["n"], timestamp=at(1)))
    check_every_order([increment, deletion], HITS, [])


# --- more of Cassandra's rules ----------------------------------------------------------------------------

def test_expired_liveness_of_materialized_views_hides_the_row_marker() -> None:
    key = struct.pack(">i", 1)
    marker = PartitionUpdate(USERS, key, [Row((), liveness=LivenessInfo(at(1)))])
    longer = PartitionUpdate(USERS, key, [Row((), liveness=LivenessInfo(at(1), 1000, NOW + 1000))])
    expired = PartitionUpdate(USERS, key, [Row((), liveness=LivenessInfo(at(1), EXPIRED_LIVENESS_TTL, NOW))])
    check_every_order([marker, longer], USERS, [user()], later=NOW + 999)  # the expiring one wins the tie
    check_every_order([marker, longer], USERS, [], later=NOW + 1000)
    check_every_order([marker, longer, expired], USERS, [])  # the expired one beats both


def test_cells_of_dropped_columns_are_ignored() -> None:
    schema = parse_schema("""
        CREATE TABLE ks.t (id int PRIMARY KEY, v int, gone int);
        ALTER TABLE ks.t DROP gone USING TIMESTAMP %d;
        ALTER TABLE ks.t ADD gone int;
    """ % at(2))
    table = schema.table("ks", "t")
    assert table is not None
    old_update = updates_of(Update("ks.users", {"id": 1}, {"age": 1}, timestamp=at(1)))[0]
    column = table.column(b"gone")
    assert column is not None
    cells = [c for c in old_update.rows[0].cells]
    cells[0].column = column
    newer = update_of(Update("ks.users", {"id": 1}, {"age": 3}, timestamp=at(3)))
    newer.rows[0].cells[0].column = column
    old_update.table = newer.table = table
    check_every_order([old_update], table, [])
    check_every_order([old_update, newer], table, [{"id": 1, "gone": 3, "v": None}])


def test_a_new_definition_of_the_table_shows_in_the_rows_merged_under_the_old_one() -> None:
    """What merging and viewing need of a table is built once per definition: a new one takes effect."""
    table_id = "ID = 7d0e7a10-0000-4000-8000-0000000000aa"
    old_schema = parse_schema(f"CREATE TABLE ks.t (id int PRIMARY KEY, v int, gone int) WITH {table_id};")
    new_schema = parse_schema(f"CREATE TABLE ks.t (id int PRIMARY KEY, v int, gone int, w text) "
                              f"WITH {table_id}; ALTER TABLE ks.t DROP gone USING TIMESTAMP {at(2)};")
    old, new = old_schema.table("ks", "t"), new_schema.table("ks", "t")
    assert old is not None and new is not None

    def update(op: Operation, schema: Schema) -> PartitionUpdate:
        body = MutationSerializer.serialize(to_mutation(op, schema), 7)
        return MutationSerializer.deserialize(body, schema, 7).updates[0]

    state = PartitionState()
    apply(state, update(Insert("ks.t", {"id": 1, "v": 1, "gone": 1}, timestamp=at(1)), old_schema), old, NOW)
    written = update(Update("ks.t", {"id": 1}, {"w": "new"}, timestamp=at(3)), new_schema)
    [change] = apply(state, written, new, NOW)
    assert change.before == {"id": 1, "v": 1, "w": None} and change.after == {"id": 1, "v": 1, "w": "new"}


def test_tombstones_are_purged_after_gc_grace_seconds() -> None:
    start = T0 // SECOND
    state, _ = merged(updates_of(Insert("ks.short", {"id": 1, "v": 1}, timestamp=at(0)),
                                 DeleteRow("ks.short", {"id": 1}, timestamp=at(1))), SHORT, start)
    assert rows(state, SHORT, start) == [] and not state.is_empty()
    assert next_expiry(state) == start + 12  # deleted at start + 1, purgeable 10 s later
    assert expire(state, SHORT, start + 11) == [] and not state.is_empty()
    assert expire(state, SHORT, start + 12) == [] and state.is_empty() and next_expiry(state) is None
    # An expired TTL is purgeable gc_grace_seconds after the write.
    state, _ = merged(updates_of(Update("ks.short", {"id": 2}, {"v": 1}, ttl=5, timestamp=at(0))), SHORT,
                      start)
    assert next_expiry(state) == start + 5
    [change] = expire(state, SHORT, start + 5)
    assert change.after is None and not state.is_empty() and next_expiry(state) == start + 11
    assert expire(state, SHORT, start + 11) == [] and state.is_empty()


def test_digests_skip_exact_copies_and_keys_must_match() -> None:
    update = update_of(Insert("ks.users", {"id": 1, "name": "a"}, timestamp=at(1)))
    state = PartitionState()
    assert len(apply(state, update, USERS, NOW, b"d1")) == 1
    assert state.seen(b"d1") and apply(state, update, USERS, NOW, b"d1") == []
    other = update_of(Insert("ks.users", {"id": 2, "name": "a"}, timestamp=at(1)))
    with pytest.raises(ValueError, match="applied to the state of"):
        apply(state, other, USERS, NOW)


def test_state_pickles_small() -> None:
    updates = updates_of(*(Insert("ks.events", {"pk": 1, "ck": ck, "v": "value"}, timestamp=at(ck))
                           for ck in range(50)))
    state, _ = merged(updates, EVENTS)
    data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) < 50 * 70  # about 63 bytes a row: key, marker and one cell
    restored = pickle.loads(data)
    assert visible_rows(restored, EVENTS, NOW) == visible_rows(state, EVENTS, NOW)
    assert restored.rows == state.rows
    # The pipeline's form: builtins only, smaller still.
    stored, _, _ = state.seal()
    assert len(stored) < len(data)
    assert PartitionState.from_stored(pickle.loads(stored), state.digests).__reduce__() == state.__reduce__()


# --- clustering order -------------------------------------------------------------------------------------

def _sorted(type_text: str, values: list[Any]) -> list[Any]:
    cql_type = parse_type(type_text)
    encoded = {cql_type.serialize(v) if v is not None else b"": v for v in values}
    order = sorted(encoded, key=functools.cmp_to_key(lambda a, b: compare_values(cql_type, a, b)))
    return [encoded[e] for e in order]


def test_values_compare_as_cassandra_types_do() -> None:
    assert _sorted("int", [3, -1, None, 0]) == [None, -1, 0, 3]
    assert _sorted("varint", [10**20, -(10**20), 5]) == [-(10**20), 5, 10**20]
    assert _sorted("blob", [b"\x80", b"\x7f", b"\x7f\x00"]) == [b"\x7f", b"\x7f\x00", b"\x80"]
    assert _sorted("boolean", [True, False]) == [False, True]
    floats = _sorted("double", [float("nan"), 0.0, -0.0, -math.inf, 1.5])
    assert floats[:2] == [-math.inf, -0.0] and math.copysign(1, floats[1]) < 0 and floats[3] == 1.5
    assert math.isnan(floats[4])
    decimal_type = parse_type("decimal")
    assert compare_values(decimal_type, decimal_type.serialize(decimal.Decimal("1.0")),
                          decimal_type.serialize(decimal.Decimal("1.00"))) == 0
    assert _sorted("decimal", [decimal.Decimal("10"), decimal.Decimal("9.99")]) == [decimal.Decimal("9.99"),
                                                                                   decimal.Decimal("10")]
    # timeuuid: by time, even when the bytes say otherwise; uuid: by version first.
    early = uuid.UUID("ffffffff-0000-1000-8000-000000000000")  # time_low high, time_hi low
    late = uuid.UUID("00000000-0000-1001-8000-000000000000")
    assert _sorted("timeuuid", [late, early]) == [early, late]
    random_v4 = uuid.UUID("00000000-0000-4000-8000-000000000000")
    assert _sorted("uuid", [random_v4, late, early]) == [early, late, random_v4]
    # timeuuid's last 8 bytes compare signed, uuid's unsigned (CASSANDRA-8730).
    low, high = (uuid.UUID(f"00000000-0000-1000-{s}-000000000000") for s in ("0000", "8000"))
    assert _sorted("timeuuid", [low, high]) == [high, low]
    assert _sorted("uuid", [high, low]) == [low, high]
    assert _sorted("frozen<list<int>>", [[2], [1, 2], [1], [-1, 5]]) == [[-1, 5], [1], [1, 2], [2]]
    assert _sorted("frozen<map<int, text>>", [{1: "b"}, {1: "a", 2: "a"}, {0: "z"}]) == \
        [{0: "z"}, {1: "a", 2: "a"}, {1: "b"}]
    assert _sorted("tuple<int, text>", [(1, "b"), (1, None), (-5, "a")]) == [(-5, "a"), (1, None), (1, "b")]


def test_clustering_comparator_reverses_desc_columns_and_bounds_cover_prefixes() -> None:
    comparator = ClusteringComparator(TIMELINE.clustering)
    one = struct.pack(">i", 1)
    assert comparator.compare((one, b"b"), (one, b"a")) < 0  # b DESC
    assert comparator.compare((one, b"a"), (struct.pack(">i", 2), b"z")) < 0
    # DELETE ... WHERE a = 1: [ (1) .. (1) ] covers every row with a = 1.
    assert comparator.covers((one,), True, (one,), True, (one, b"x"))
    assert not comparator.covers((one,), False, (one,), True, (one, b"x"))
    assert comparator.covers((), True, (), True, (one, b"x"))


# --- helpers ----------------------------------------------------------------------------------------------

def _batch(ops: list[Operation]) -> PartitionUpdate:
    """Several row writes of one partition as one update (as a batch or a replica's merged copy)."""
    updates = updates_of(*ops)
    first = updates[0]
    unfiltereds = sorted((u for update in updates for u in update.unfiltereds),
                         key=lambda u: ClusteringComparator(first.table.clustering).sort_key()(u.clustering))
    regulars = first.table.sorted_columns({c for update in updates for c in update.regular_columns})
    return PartitionUpdate(first.table, first.key, unfiltereds, regular_columns=regulars)


def ck(value: int) -> tuple[bytes]:
    return (struct.pack(">i", value),)


def user(**values: Any) -> dict[str, Any]:
    row = {c.name: None for c in USERS.columns}
    row.update(id=1, **values)
    return row


def event(ck: int, v: str | None, s: int | None = None) -> dict[str, Any]:
    return {"pk": 1, "ck": ck, "v": v, "s": s}


def timeline(a: int, b: str, v: int) -> dict[str, Any]:
    return {"pk": 1, "a": a, "b": b, "v": v}


def test_an_update_that_cannot_be_merged_leaves_the_state_as_it_was() -> None:
    """A range deletion never closed, or another partition's update, is refused before anything changes:
    the state neither merges part of it nor runs its expiries."""
    state, _ = merged(updates_of(Insert("ks.events", {"pk": 1, "ck": 2, "v": "a"}, ttl=5, timestamp=at(0))), EVENTS)
    before = state.seal()[0]
    unclosed = update_of(DeleteRange("ks.events", {"pk": 1}, 1, 3, timestamp=at(2)))
    unclosed.unfiltereds.pop()
    with pytest.raises(ValueError, match="never closed"):
        apply(state, unclosed, EVENTS, NOW + 60)
    other = update_of(Insert("ks.events", {"pk": 2, "ck": 1, "v": "b"}, timestamp=at(3)))
    with pytest.raises(ValueError, match="applied to the state of"):
        apply(state, other, EVENTS, NOW + 60)
    assert state.seal()[0] == before
