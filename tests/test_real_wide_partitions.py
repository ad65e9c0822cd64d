"""Wide partitions on the real thing: three Cassandra 5.0 nodes (RF=3, ``real_cassandra``), one
``cassandra-cdc agent`` process beside each node on its real ``cdc_raw``, the ``cassandra-cdc pipeline``
process on the real Kafka broker (``real_kafka``).

Two CDC tables written through cassandra-driver at CONSISTENCY ALL, prepared statements run many at a time:
``readings`` (one clustering column, a static column), whose two widest partitions end with more than
``ROWS_PER_PARTITION`` live rows each, and ``series`` (two clustering columns, the first DESC), one partition
of half that width. Rows written in random order; single-row deletes scattered through the wide partitions;
range deletes at both ends and in the middle (``<``, ``<=``, ``>``, ``>=``, bounded on both sides, a prefix of
the clustering, a multi-column slice across two days), rows written again inside a deleted range; a whole
partition of thousands of rows deleted, then a few of its rows written again; rows, cells and a static cell
with a short TTL, all expired before the comparison; updates and cell deletions in the middle of a
partition; rows only ``UPDATE`` made (half of them losing their last cell); a static-only partition; a static
set before a wide partition's rows and one set over a full wide partition (a ``u`` for each of its rows).

Once the wide partitions are full (before any delete or TTL), and again once every TTL has passed, each
table's events (read_committed), replayed, must equal ``SELECT *`` at CONSISTENCY ALL, with no event read
twice; the expiries are events of their own. ``SELECT *`` itself must equal what the statements alone make
(so the workload did what it says, wide partitions included), and the comparison is shown to catch an
event dropped or changed.
"""

from __future__ import annotations

import collections
import copy
import random
import time
from typing import Any, Callable, Iterable, Sequence

import pytest
from cassandra.concurrent import execute_concurrent_with_args
from confluent_kafka import Consumer, TopicPartition

from cassandra_cdc.demo.cql_workload import key_columns
from cassandra_cdc.demo.table_check import compare_rows, replay
from real_system import System, assert_no_event_twice, replayed_tables, session_at_all

KEYSPACE = "real_wide"
SERVER = "realwide"
TABLES = ["readings", "series"]
ROWS_PER_PARTITION = 10_000  # live rows each wide partition of ``readings`` has at least, at the end
CONVERGE_TIMEOUT = 300.0  # seconds for the events to match the tables once writing has ended
TTL = 20  # seconds: the short TTL of the expiring rows and cells
CONCURRENCY = 64  # statements in flight at once

READINGS = f"{KEYSPACE}.readings"
SERIES = f"{KEYSPACE}.series"
SCHEMA = [
    f"CREATE KEYSPACE {KEYSPACE} WITH replication = {{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}}",
    f"""CREATE TABLE {READINGS} (sensor int, ts int, v text, n int, note text static,
        PRIMARY KEY (sensor, ts)) WITH cdc = true""",
    f"""CREATE TABLE {SERIES} (site text, day int, seq int, value double, label text,
        PRIMARY KEY (site, day, seq)) WITH CLUSTERING ORDER BY (day DESC, seq ASC) AND cdc = true""",
]

WIDE = (1, 2)  # the wide partitions of ``readings``
BASE = ROWS_PER_PARTITION + ROWS_PER_PARTITION // 10  # rows written to each (ts = 2 * i), some deleted later
DOOMED = 3  # a partition of thousands of rows, deleted whole, then a few rows written again
DOOMED_ROWS = ROWS_PER_PARTITION // 4
REWRITTEN = (0, 2, 4, 6, 8)  # the rows of the doomed partition written again after its deletion
SMALL = 4  # a small partition whose static cell expires
SMALL_ROWS = 30
STATIC_ONLY = 5  # a partition with a static value and no rows
SITE = "north"  # the partition of ``series``
DAYS = 20
SEQS = max(10, ROWS_PER_PARTITION // (2 * DAYS))  # rows of a day: the partition has half the width

EXPIRING_ROWS = [(sensor, 4 * k + 1) for sensor in WIDE for k in range(0, BASE // 2, 15)]  # USING TTL
MARKER = "__marker__"  # in a row of ``Expected``: whether an INSERT gave it a row marker


class Expected:
    """What ``SELECT *`` of a table must return, from the statements alone: per partition its rows (by their
    clustering values: whether an INSERT gave it a row marker, its regular cells) and its static cells. A row
    lives while it has a marker or a cell; a partition with static values and no live row is one row with
    null clustering columns. Writes with a TTL are left out (or leave the cell null): the comparison comes
    once every TTL has passed."""

    def __init__(self, partition: str, clustering: Sequence[str], regular: Sequence[str],
                 static: Sequence[str] = ()) -> None:
        self.partition, self.clustering = partition, tuple(clustering)
        self.regular, self.static = tuple(regular), tuple(static)
        self.rows: dict[Any, dict[tuple[Any, ...], dict[str, Any]]] = collections.defaultdict(dict)
        self.statics: dict[Any, dict[str, Any]] = collections.defaultdict(dict)

    def write(self, pk: Any, ck: tuple[Any, ...], marker: bool, **cells: Any) -> None:
        """An INSERT (``marker``) or UPDATE of the row ``ck`` of partition ``pk``; a None cell is deleted."""
        row = self.rows[pk].setdefault(ck, {MARKER: False})
        row[MARKER] = row[MARKER] or marker
        row.update(cells)

    def delete_cells(self, pk: Any, ck: tuple[Any, ...], *columns: str) -> None:
        if ck in self.rows[pk]:
            self.rows[pk][ck].update(dict.fromkeys(columns))

    def delete_rows(self, pk: Any, selected: Callable[[tuple[Any, ...]], bool]) -> int:
        """A row or range deletion: the rows of ``pk`` whose clustering values are ``selected``; how many."""
        doomed = [ck for ck in self.rows[pk] if selected(ck)]
        for ck in doomed:
            del self.rows[pk][ck]
        return len(doomed)

    def delete_partition(self, pk: Any) -> None:
        self.rows[pk].clear()
        self.statics[pk].clear()

    def set_static(self, pk: Any, **cells: Any) -> None:
        self.statics[pk].update(cells)

    def live(self, pk: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {ck: row for ck, row in self.rows[pk].items()
                if row[MARKER] or any(row.get(c) is not None for c in self.regular)}

    def selected(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The rows ``SELECT *`` returns, by primary key, every column."""
        selected = {}
        for pk in {*self.rows, *self.statics}:
            statics = {c: self.statics[pk].get(c) for c in self.static}
            live = self.live(pk)
            if not live and any(v is not None for v in statics.values()):
                live = {(None,) * len(self.clustering): {}}
            for ck, row in live.items():
                selected[(pk, *ck)] = {self.partition: pk, **dict(zip(self.clustering, ck)),
                                       **{c: row.get(c) for c in self.regular}, **statics}
        return selected


class WideWorkload:
    """The statements, run through cassandra-driver at the session's CONSISTENCY ALL (each prepared once, run
    ``CONCURRENCY`` at a time, one phase after the other: the driver's timestamps follow the phases), and
    what they make of each table (``expected``)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.prepared: dict[str, Any] = {}
        self.statements = 0
        self.random = random.Random(20_000)
        self.readings = Expected("sensor", ["ts"], ["v", "n"], ["note"])
        self.series = Expected("site", ["day", "seq"], ["value", "label"])
        self.expired_at = 0.0  # time.monotonic() once every TTL written has passed

    def run(self, cql: str, values: Iterable[tuple[Any, ...]]) -> None:
        values = list(values)
        if cql not in self.prepared:
            self.prepared[cql] = self.session.prepare(cql)
        execute_concurrent_with_args(self.session, self.prepared[cql], values, concurrency=CONCURRENCY,
                                     raise_on_first_error=True)
        self.statements += len(values)

    def small_partitions(self) -> None:
        """A static set before its wide partition has rows, a static-only partition."""
        self.run(f"UPDATE {READINGS} SET note = ? WHERE sensor = ?",
                 [("set before the rows", 2), ("a static and no rows", STATIC_ONLY)])
        self.readings.set_static(2, note="set before the rows")
        self.readings.set_static(STATIC_ONLY, note="a static and no rows")

    def wide_rows(self) -> None:
        """Every partition's rows, in random order; the doomed partition's static."""
        rows = [(sensor, 2 * i, f"r{sensor}-{2 * i}", i) for sensor in WIDE for i in range(BASE)]
        rows += [(DOOMED, 2 * i, f"doomed {i}", i) for i in range(DOOMED_ROWS)]
        rows += [(SMALL, i, f"small {i}", i) for i in range(SMALL_ROWS)]
        self.random.shuffle(rows)
        self.run(f"INSERT INTO {READINGS} (sensor, ts, v, n) VALUES (?, ?, ?, ?)", rows)
        for sensor, ts, v, n in rows:
            self.readings.write(sensor, (ts,), True, v=v, n=n)
        self.run(f"UPDATE {READINGS} SET note = ? WHERE sensor = ?", [("doomed static", DOOMED)])
        self.readings.set_static(DOOMED, note="doomed static")
        days = [(SITE, day, seq, day * 1000 + seq + 0.5, f"day {day}") for day in range(DAYS)
                for seq in range(SEQS)]
        self.random.shuffle(days)
        self.run(f"INSERT INTO {SERIES} (site, day, seq, value, label) VALUES (?, ?, ?, ?, ?)", days)
        for site, day, seq, value, label in days:
            self.series.write(site, (day, seq), True, value=value, label=label)

    def expiring(self) -> None:
        """Rows between the wide partitions' rows, cells of their rows, a static cell and rows and cells of
        ``series``, all with a ``TTL`` of seconds: none is left once it has passed."""
        self.run(f"INSERT INTO {READINGS} (sensor, ts, v, n) VALUES (?, ?, ?, ?) USING TTL {TTL}",
                 [(sensor, ts, "expiring row", ts) for sensor, ts in EXPIRING_ROWS])
        cells = [(sensor, 2 * i) for sensor in WIDE for i in range(5, BASE, 50)]
        self.run(f"UPDATE {READINGS} USING TTL {TTL} SET v = 'expiring cell' WHERE sensor = ? AND ts = ?",
                 cells)
        for sensor, ts in cells:
            self.readings.write(sensor, (ts,), False, v=None)
        self.run(f"UPDATE {READINGS} USING TTL {TTL} SET note = 'expiring static' WHERE sensor = ?",
                 [(SMALL,)])
        self.run(f"INSERT INTO {SERIES} (site, day, seq, value) VALUES (?, ?, ?, ?) USING TTL {TTL}",
                 [(SITE, day, SEQS + day, -1.0) for day in range(DAYS)])
        labels = [(SITE, 8, seq) for seq in range(SEQS)]
        self.run(f"UPDATE {SERIES} USING TTL {TTL} SET label = 'expiring' "
                 "WHERE site = ? AND day = ? AND seq = ?", labels)
        for site, day, seq in labels:
            self.series.write(site, (day, seq), False, label=None)
        self.expired_at = time.monotonic() + TTL + 2

    def updates(self) -> None:
        """Rows and cells changed in the middle of the partitions; rows only an UPDATE makes (no marker)."""
        middle = range(BASE // 3, BASE // 3 + BASE // 20)
        changed = [(f"updated {i}", -i, sensor, 2 * i) for sensor in WIDE for i in middle]
        self.run(f"UPDATE {READINGS} SET v = ?, n = ? WHERE sensor = ? AND ts = ?", changed)
        for v, n, sensor, ts in changed:
            self.readings.write(sensor, (ts,), False, v=v, n=n)
        cleared = [(sensor, 2 * i) for sensor in WIDE for i in range(middle.stop, middle.stop + 300, 3)]
        self.run(f"DELETE v FROM {READINGS} WHERE sensor = ? AND ts = ?", cleared)
        for sensor, ts in cleared:
            self.readings.delete_cells(sensor, (ts,), "v")
        unmarked = [(k, sensor, 4 * k + 3) for sensor in WIDE for k in range(BASE // 8, BASE // 8 + 60)]
        self.run(f"UPDATE {READINGS} SET n = ? WHERE sensor = ? AND ts = ?", unmarked)
        for n, sensor, ts in unmarked:
            self.readings.write(sensor, (ts,), False, n=n)
        self.run(f"UPDATE {SERIES} SET value = ? WHERE site = ? AND day = ? AND seq = ?",
                 [(-seq - 0.25, SITE, 7, seq) for seq in range(SEQS)])
        for seq in range(SEQS):
            self.series.write(SITE, (7, seq), False, value=-seq - 0.25)

    def row_deletes(self) -> None:
        """Single rows deleted all through the wide partitions; half the UPDATE-only rows lose their cell."""
        rows = [(sensor, 2 * i) for sensor in WIDE for i in range(7, BASE, 97)]
        self.run(f"DELETE FROM {READINGS} WHERE sensor = ? AND ts = ?", rows)
        for sensor, ts in rows:
            self.readings.delete_rows(sensor, lambda ck, ts=ts: ck == (ts,))
        emptied = [(sensor, 4 * k + 3) for sensor in WIDE for k in range(BASE // 8, BASE // 8 + 60, 2)]
        self.run(f"DELETE n FROM {READINGS} WHERE sensor = ? AND ts = ?", emptied)
        for sensor, ts in emptied:
            self.readings.delete_cells(sensor, (ts,), "n")
        seqs = [(SITE, 5, seq) for seq in range(0, SEQS, 13)]
        self.run(f"DELETE FROM {SERIES} WHERE site = ? AND day = ? AND seq = ?", seqs)
        for _, day, seq in seqs:
            self.series.delete_rows(SITE, lambda ck, key=(day, seq): ck == key)

    def range_deletes(self) -> None:
        """Clustering ranges deleted at both ends and in the middle; rows written again inside one."""
        low, middle = 2 * (ROWS_PER_PARTITION // 100), 2 * (BASE // 2)
        high = 2 * (BASE - ROWS_PER_PARTITION // 100)
        width = 2 * (ROWS_PER_PARTITION // 50)
        ranges: list[tuple[str, int, tuple[int, ...], Callable[[int], bool]]] = [
            ("ts < ?", 1, (low,), lambda ts: ts < low),
            ("ts >= ? AND ts < ?", 1, (middle, middle + width), lambda ts: middle <= ts < middle + width),
            ("ts > ?", 1, (high,), lambda ts: ts > high),
            ("ts <= ?", 2, (low // 2,), lambda ts: ts <= low // 2),
            ("ts > ? AND ts <= ?", 2, (2 * middle // 3, 2 * middle // 3 + width),
             lambda ts: 2 * middle // 3 < ts <= 2 * middle // 3 + width),
            ("ts >= ?", 2, (high + low // 2,), lambda ts: ts >= high + low // 2),
        ]
        for condition, sensor, bounds, selected in ranges:
            self.run(f"DELETE FROM {READINGS} WHERE sensor = ? AND {condition}", [(sensor, *bounds)])
            assert self.readings.delete_rows(sensor, lambda ck, selected=selected: selected(ck[0])) > 0
        again = [(1, middle + 2 * j, "written again after the range delete", j) for j in range(0, 10, 2)]
        self.run(f"INSERT INTO {READINGS} (sensor, ts, v, n) VALUES (?, ?, ?, ?)", again)
        for sensor, ts, v, n in again:
            self.readings.write(sensor, (ts,), True, v=v, n=n)
        tail = max(1, SEQS // 10)
        series: list[tuple[str, tuple[int, ...], Callable[[tuple[int, ...]], bool]]] = [
            ("day = ?", (3,), lambda ck: ck[0] == 3),
            ("day > ?", (DAYS - 3,), lambda ck: ck[0] > DAYS - 3),  # the partition's first rows (DESC)
            ("day < ?", (1,), lambda ck: ck[0] < 1),  # its last ones
            ("day = ? AND seq >= ? AND seq < ?", (10, SEQS // 4, SEQS // 2),
             lambda ck: ck[0] == 10 and SEQS // 4 <= ck[1] < SEQS // 2),
            ("(day, seq) >= (?, ?) AND (day, seq) < (?, ?)", (12, SEQS - tail, 13, tail),
             lambda ck: (12, SEQS - tail) <= ck < (13, tail)),
        ]
        for condition, bounds, chosen in series:
            self.run(f"DELETE FROM {SERIES} WHERE site = ? AND {condition}", [(SITE, *bounds)])
            assert self.series.delete_rows(SITE, chosen) > 0, condition

    def static_over_a_wide_partition(self) -> None:
        """A static set once the first wide partition is full: every one of its rows changes."""
        self.run(f"UPDATE {READINGS} SET note = ? WHERE sensor = ?", [("set over the full width", 1)])
        self.readings.set_static(1, note="set over the full width")

    def partition_delete(self) -> None:
        """The doomed partition deleted whole, then a few of its rows written again."""
        self.run(f"DELETE FROM {READINGS} WHERE sensor = ?", [(DOOMED,)])
        self.readings.delete_partition(DOOMED)
        again = [(DOOMED, ts, "written again after the partition delete", ts) for ts in REWRITTEN]
        self.run(f"INSERT INTO {READINGS} (sensor, ts, v, n) VALUES (?, ?, ?, ?)", again)
        for sensor, ts, v, n in again:
            self.readings.write(sensor, (ts,), True, v=v, n=n)


def records_in(bootstrap_servers: str, topics: list[str]) -> int:
    """How many records ``topics`` hold (events, tombstones, transaction markers): at least their events."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "unused"})
    try:
        metadata = consumer.list_topics(timeout=10).topics
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for topic in topics if topic in metadata for p in metadata[topic].partitions)
    finally:
        consumer.close()


def wait_for_records(bootstrap_servers: str, least: int, system: System) -> None:
    """Until the event topics hold at least ``least`` records, or ``CONVERGE_TIMEOUT`` seconds have passed
    (the comparison that follows then says what is missing): a cheap wait before the events are read whole."""
    topics = [f"{SERVER}.{KEYSPACE}.{table}" for table in TABLES]
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while records_in(bootstrap_servers, topics) < least and time.monotonic() < deadline:
        for child in system.children:
            assert child.exit_code is None, f"{child.name} exited: {child.log_tail(30)}"
        time.sleep(1)


@pytest.fixture(scope="module")
def outcome(real_cassandra: Any, real_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the system through the wide workload; the events per table, the tables' rows and what the
    statements alone make of them."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    system = System(tmp_path_factory.mktemp("real-wide"), real_cassandra, real_kafka, SERVER)
    with session_at_all(real_cassandra, SCHEMA) as session:
        workload = WideWorkload(session)
        try:
            system.start_agents()
            workload.small_partitions()
            system.start_pipeline()
            # The small partitions' events: the merge's Python workers started before the busiest writes.
            wait_for_records(real_kafka.bootstrap_servers, 2, system)
            timings["started"] = time.monotonic() - started
            workload.wide_rows()
            timings["wide rows written"] = time.monotonic() - started
            # Caught up before the expiring writes, the pipeline reads them before they expire.
            rows = len(workload.readings.selected()) + len(workload.series.selected())
            wait_for_records(real_kafka.bootstrap_servers, rows, system)  # each row's ``c`` at least
            full = replayed_tables(real_kafka.bootstrap_servers, session, KEYSPACE, SERVER, TABLES,
                                   CONVERGE_TIMEOUT, system.children).differences
            timings["wide rows replayed"] = time.monotonic() - started
            workload.expiring()
            workload.updates()
            workload.row_deletes()
            workload.range_deletes()
            workload.static_over_a_wide_partition()
            workload.partition_delete()
            timings["written"] = time.monotonic() - started
            time.sleep(max(0.0, workload.expired_at - time.monotonic()))  # every TTL has passed
            events, selected, differences = replayed_tables(real_kafka.bootstrap_servers, session, KEYSPACE,
                                                            SERVER, TABLES, CONVERGE_TIMEOUT, system.children)
            timings["converged"] = time.monotonic() - started
            keys = {table: key_columns(session, KEYSPACE, table) for table in TABLES}
        finally:
            system.stop()
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()}, "statements:", workload.statements,
          "events:", {table: len(events[table]) for table in TABLES})
    return {"events": events, "selected": selected, "differences": differences, "keys": keys, "full": full,
            "expected": {"readings": workload.readings.selected(), "series": workload.series.selected()},
            "logs": system.logs()}


def differences(outcome: dict[str, Any], table: str, events: list[dict[str, Any]]) -> list[str]:
    """How ``events`` of ``table``, replayed, differ from its ``SELECT *``."""
    columns, rows = outcome["selected"][table]
    return compare_rows(replay((("t", e) for e in events), "t", outcome["keys"][table]), rows, columns)


@pytest.mark.parametrize("table", TABLES)
def test_each_tables_events_replay_to_what_select_returns(outcome: dict[str, Any], table: str) -> None:
    found = outcome["differences"][table]
    assert found == [], f"{table}: {len(found)} differences, first {found[:10]}\n{outcome['logs']}"


@pytest.mark.parametrize("table", TABLES)
def test_the_full_partitions_replay_to_what_select_returns(outcome: dict[str, Any], table: str) -> None:
    """Before any delete: every row of the wide partitions, written in random order, is in the events."""
    found = outcome["full"][table]
    assert found == [], f"{table}: {len(found)} differences, first {found[:10]}\n{outcome['logs']}"


@pytest.mark.parametrize("table", TABLES)
def test_select_returns_what_the_statements_make(outcome: dict[str, Any], table: str) -> None:
    """The workload did what it says: wide partitions of at least ``ROWS_PER_PARTITION`` live rows, the TTLs
    expired, the deleted partition holding only the rows written after its deletion."""
    columns, rows = outcome["selected"][table]
    assert compare_rows(rows, outcome["expected"][table], columns) == []
    if table == "readings":
        width = collections.Counter(key[0] for key in rows)
        assert all(width[sensor] >= ROWS_PER_PARTITION for sensor in WIDE), width
        assert sorted(key[1] for key in rows if key[0] == DOOMED) == list(REWRITTEN)
        assert rows[(STATIC_ONLY, None)]["note"] == "a static and no rows"
        assert {row["note"] for key, row in rows.items() if key[0] == 1} == {"set over the full width"}
        assert not any(row["note"] is not None for key, row in rows.items() if key[0] == SMALL)
        assert not any(row["v"] in ("expiring row", "expiring cell") for row in rows.values())
    else:
        assert len(rows) >= DAYS * SEQS // 2
        assert not any(row["label"] == "expiring" or row["value"] == -1.0 for row in rows.values())


def test_no_event_is_read_twice(outcome: dict[str, Any]) -> None:
    assert_no_event_twice(outcome["events"])


@pytest.mark.parametrize("table", TABLES)
def test_each_event_is_a_change(outcome: dict[str, Any], table: str) -> None:
    """A ``c`` has no row before, a ``d`` none after, a ``u`` changes a column of its row."""
    for event in outcome["events"][table]:
        op, before, after = event["op"], event["before"], event["after"]
        assert op in ("c", "u", "d"), event
        assert (before is None) == (op == "c") and (after is None) == (op == "d"), event
        assert op != "u" or before != after, event


def test_expiries_are_events(outcome: dict[str, Any]) -> None:
    """Read before they expired, the expiring writes' expiries are events without a replica: a ``u`` of each
    row of the partition whose static cell expired, a ``u`` of rows whose cell expired; each expiring row was
    created and then deleted once (by its expiry, or by a range delete before it)."""
    events = outcome["events"]["readings"]
    expiries = [e for e in events if e["source"]["node"] is None]
    assert {e["op"] for e in expiries} == {"u", "d"}
    static = [e for e in expiries if e["before"]["sensor"] == SMALL]
    assert len(static) == SMALL_ROWS and all(e["after"]["note"] is None for e in static), static[:3]
    assert any(e["op"] == "u" and e["before"]["v"] == "expiring cell" and e["after"]["v"] is None
               for e in expiries)
    ops: dict[tuple[int, int], list[str]] = collections.defaultdict(list)
    for event in events:
        row = event["after"] or event["before"]
        ops[(row["sensor"], row["ts"])].append(event["op"])
    for key in EXPIRING_ROWS:
        assert ops[key][0] == "c" and ops[key].count("d") == 1 and ops[key][-1] == "d", (key, ops[key])
    assert any(e["op"] == "d" and (e["before"]["sensor"], e["before"]["ts"]) in EXPIRING_ROWS
               for e in expiries)
    series = collections.Counter(e["op"] for e in outcome["events"]["series"] if e["source"]["node"] is None)
    assert series["d"] > 0 and series["u"] >= SEQS, series


def test_the_comparison_sees_an_event_dropped_or_changed(outcome: dict[str, Any]) -> None:
    """The events of ``readings``, replayed, equal its rows; with any of these changes they no longer do: a
    wide row's last event (the static set over the partition) dropped, every event of a row dropped, a value
    changed, the ``d`` of a row of the deleted partition dropped."""
    events = outcome["events"]["readings"]
    assert differences(outcome, "readings", events) == []
    key = ("sensor", "ts")

    def row_of(event: dict[str, Any]) -> tuple[Any, ...]:
        return tuple((event["after"] or event["before"])[c] for c in key)

    rows = outcome["selected"]["readings"][1]
    untouched = sorted(k for k, row in rows.items() if k[0] == 1 and row["v"] == f"r1-{k[1]}")
    wide_row = untouched[len(untouched) // 2]  # inserted, then changed by the static only
    last = max(i for i, e in enumerate(events) if row_of(e) == wide_row)
    assert events[last]["op"] == "u" and events[last]["after"]["note"] == "set over the full width"
    changed = copy.deepcopy(events[last])
    changed["after"]["n"] += 1
    doomed = next(i for i, e in enumerate(events) if e["op"] == "d" and row_of(e) == (DOOMED, 10))
    for mutated in ([*events[:last], *events[last + 1:]],
                    [e for e in events if row_of(e) != wide_row],
                    [*events[:last], changed, *events[last + 1:]],
                    [*events[:doomed], *events[doomed + 1:]]):
        assert differences(outcome, "readings", mutated) != []
