"""Merging random workloads against the simulator's independent CQL-level model (``TableModel``).

Each example generates statements with the simulator's ``Workload`` (distinct timestamps, a few keys
revisited, TTLs of seconds that expire while the workload runs), turns them into partition updates
(serialized and decoded as the pipeline sees them), and delivers each update three times (RF = 3) in a
random order while the processing clock advances. Then:

* the merged rows equal ``TableModel.rows`` at the final time;
* per partition, the emitted changes chain (each ``before`` is the row the previous changes left)
  and rebuild the merged rows; no change has ``before == after``;
* a copy of an update that was already merged emits nothing;
* states survive pickling at any point, and storing (``seal``, their rows in leaves as small as a row or
  two, under inner nodes of a few children, read back lazily), leaving in the store exactly the nodes of the
  partitions' trees.
"""

from __future__ import annotations

import contextlib
import pickle
import random
import uuid
from typing import Any, Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cassandra_cdc.commitlog import MutationSerializer
from cassandra_cdc.storage import PartitionUpdate
from cassandra_cdc.merge.reconcile import RowChange, apply, expire, visible_rows
from cassandra_cdc.merge import row_tree
from cassandra_cdc.merge.partition_state import PartitionState
from cassandra_cdc.schema import TableMetadata, parse_schema
from cassandra_cdc.simulator import Clock, CounterAdd, CounterLedger, TableModel, Workload, to_mutation
from row_changes import assert_chain

SCHEMA = parse_schema("""
CREATE TYPE ks.addr (street text, zip int);
CREATE TABLE ks.users (id int PRIMARY KEY, name text, age int, emails set<text>, prefs map<text, int>,
                       tags list<text>, home addr, frozen_home frozen<addr>, pair tuple<int, text>);
CREATE TABLE ks.events (pk int, ck int, v text, w blob, s int static, labels set<int> static,
                        PRIMARY KEY (pk, ck));
CREATE TABLE ks.timeline (pk int, a int, b text, v int, notes map<int, text>, PRIMARY KEY (pk, a, b))
    WITH CLUSTERING ORDER BY (a ASC, b DESC);
CREATE TABLE ks.log (pk int, region text, t timeuuid, u uuid, f double, v int,
                     PRIMARY KEY ((pk, region), t, u, f)) WITH CLUSTERING ORDER BY (t DESC, u ASC, f DESC);
CREATE TABLE ks.hits (page text, day int, n counter, m counter, PRIMARY KEY (page, day));
""")
T0 = 1_700_000_000 * 1_000_000
LEADERS = [uuid.UUID(int=i + 1) for i in range(3)]
VERSIONS = (6, 7, 8)


def workload_updates(table: TableMetadata, seed: int, count: int, keys: int = 3,
                     rows_per_partition: int = 4) -> tuple[TableModel, list[PartitionUpdate], int]:
    """``count`` statements on ``table``: the model after them, their updates, and the clock's end (s)."""
    clock = Clock(T0, step_micros=250_000)  # 4 statements a second: TTLs of 1-5 s expire meanwhile
    workload = Workload(SCHEMA, seed, tables=[table.qualified_name], keys=keys,
                        rows_per_partition=rows_per_partition, clock=clock, ttl_probability=0.2)
    rng = random.Random(seed)
    model, ledger = TableModel(table), CounterLedger()
    updates = []
    for op in workload.take(count):
        shard = ledger.advance(table, op, rng.choice(LEADERS)) if isinstance(op, CounterAdd) else None
        model.apply(op)
        version = rng.choice(VERSIONS)
        body = MutationSerializer.serialize(to_mutation(op, SCHEMA, shard), version)
        [update] = MutationSerializer.deserialize(body, SCHEMA, version).updates
        updates.append(update)
    return model, updates, clock.now_seconds


class NodeStore:
    """The nodes of the partitions' rows stored apart, as the pipeline's state store keeps them."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[bytes, int], bytes] = {}

    def stored_again(self, state: PartitionState) -> PartitionState:
        """``state`` sealed, its nodes written and removed here, and read back (its nodes as they are needed)."""
        assert state.key is not None
        key = state.key
        stored, written, removed = state.seal()
        for node in removed:
            del self.nodes[(key, node)]
        self.nodes.update({(key, node): value for node, value in written.items()})
        return PartitionState.from_stored(pickle.loads(stored), state.digests,
                                          lambda node: self.nodes[(key, node)])


@contextlib.contextmanager
def tiny_leaves() -> Iterator[None]:
    """Leaves of a row or two, inner nodes of three children: every partition of a few rows a tree."""
    saved = row_tree.LEAF_BYTES, row_tree.FANOUT
    row_tree.LEAF_BYTES, row_tree.FANOUT = 160, 3
    try:
        yield
    finally:
        row_tree.LEAF_BYTES, row_tree.FANOUT = saved


def merge_and_compare(table: TableMetadata, seed: int, count: int, overtime: int, rng: random.Random,
                      store: NodeStore | None = None, rows_per_partition: int = 4) -> None:
    model, updates, end = workload_updates(table, seed, count, keys=2 if store else 3,
                                           rows_per_partition=rows_per_partition)
    deliveries = [(i, update) for i, update in enumerate(updates) for _ in range(3)]
    rng.shuffle(deliveries)
    start = T0 // 1_000_000
    states: dict[bytes, PartitionState] = {}
    changes: dict[bytes, list[RowChange]] = {}
    merged: set[int] = set()
    for n, (index, update) in enumerate(deliveries):
        now = start + (end - start) * n // len(deliveries)
        key = bytes(update.key)
        state = states.setdefault(key, PartitionState())
        changes.setdefault(key, []).extend(expire(state, table, now))
        emitted = apply(state, update, table, now)
        if index in merged:
            assert emitted == [], "a copy of a merged update changed rows"
        merged.add(index)
        changes[key].extend(emitted)
        if store is not None:
            if rng.random() < 0.5:
                states[key] = store.stored_again(state)
        elif rng.random() < 0.1:
            states[key] = pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))

    final = end + overtime
    primary_key = [c.name for c in table.primary_key]
    merged_rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, state in states.items():
        changes[key].extend(expire(state, table, final))
        rows = visible_rows(state, table, final)
        assert_chain(changes[key], rows)
        for row in rows.values():
            merged_rows[tuple(row[name] for name in primary_key)] = row
    assert merged_rows == model.rows(final)
    if store is not None:
        kept = {(key, node) for key, state in states.items() for node in store.stored_again(state).rows.node_ids()}
        assert kept == set(store.nodes), "the store holds nodes no tree has, or lacks some a tree has"


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=False, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# (workload seed, statements, seconds past the last statement to look at the rows, delivery order)
examples = st.tuples(st.integers(0, 2**32 - 1), st.integers(5, 70), st.sampled_from([0, 2, 10]), st.randoms())
Example = tuple[int, int, int, random.Random]


@_settings(40)
@given(examples)
def test_users_merge_like_the_model(example: Example) -> None:
    merge_and_compare(SCHEMA.table("ks", "users"), *example)  # type: ignore[arg-type]


@_settings(40)
@given(examples)
def test_static_rows_merge_like_the_model(example: Example) -> None:
    merge_and_compare(SCHEMA.table("ks", "events"), *example)  # type: ignore[arg-type]


@_settings(40)
@given(examples)
def test_range_deletions_in_desc_order_merge_like_the_model(example: Example) -> None:
    merge_and_compare(SCHEMA.table("ks", "timeline"), *example)  # type: ignore[arg-type]


@_settings(30)
@given(examples)
def test_uuid_and_double_clusterings_merge_like_the_model(example: Example) -> None:
    merge_and_compare(SCHEMA.table("ks", "log"), *example)  # type: ignore[arg-type]


@_settings(30)
@given(examples)
def test_counters_merge_like_the_model(example: Example) -> None:
    merge_and_compare(SCHEMA.table("ks", "hits"), *example)  # type: ignore[arg-type]


@_settings(40)
@given(examples, st.sampled_from(["events", "timeline", "log"]))
def test_rows_stored_in_leaves_merge_like_the_model(example: Example, table: str) -> None:
    with tiny_leaves():
        merge_and_compare(SCHEMA.table("ks", table), *example, store=NodeStore(),  # type: ignore[misc]
                          rows_per_partition=25)
