"""The whole system on the real thing: three Cassandra 5.0 nodes (RF=3, the ``real_cassandra`` fixture),
one ``cassandra-cdc agent`` process beside each node on its real ``cdc_raw`` (schema read from the node
by CQL), the ``cassandra-cdc pipeline`` process (local[2]) on the real Kafka broker (``real_kafka``).

A CQL workload at CONSISTENCY ALL (cells, rows, partitions, ranges, TTLs, out-of-order timestamps,
statics, collections, user types, tuples, counters, batches, LWT, ALTER TABLE, a table created while
running, a table without CDC, many types), written partly while an agent restarts (SIGTERM) and while
the pipeline restarts (kill -9). Then, once the TTLs have passed, each table's events (read_committed),
replayed, must equal ``SELECT *`` at CONSISTENCY ALL, with no event twice.
"""

from __future__ import annotations

import datetime
import decimal
import json
import signal
import time
import uuid
from typing import Any

import pytest
from cassandra import util

from real_system import (System, consume_events, differences_of, session_at_all, table_rows, topic_exists,
                         wait_for)

KEYSPACE = "real_e2e"
SERVER = "reale2e"
SCHEMA = [
    f"CREATE KEYSPACE {KEYSPACE} WITH replication = {{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}}",
    f"CREATE TYPE {KEYSPACE}.address (street text, number int)",
    f"""CREATE TABLE {KEYSPACE}.rows (pk int, ck int, s text static, v text, n int, gone text,
        PRIMARY KEY (pk, ck)) WITH cdc = true""",
    f"""CREATE TABLE {KEYSPACE}.collections (id int PRIMARY KEY, l list<int>, st set<text>, m map<text, int>,
        home address, frozen_home frozen<address>, pair tuple<int, text>, frozen_list frozen<list<int>>)
        WITH cdc = true""",
    f"CREATE TABLE {KEYSPACE}.counters (id int PRIMARY KEY, hits counter, misses counter) WITH cdc = true",
    f"""CREATE TABLE {KEYSPACE}.types (id int PRIMARY KEY, amount decimal, total varint, span duration,
        address inet, at time, day date, stamp timestamp, embedding vector<float, 3>, payload blob,
        small smallint, tiny tinyint, big bigint, ratio float, flag boolean, uid uuid, tid timeuuid)
        WITH cdc = true""",
    f"""CREATE TABLE {KEYSPACE}.expiring (id int PRIMARY KEY, v text)
        WITH default_time_to_live = 3 AND cdc = true""",
    f"CREATE TABLE {KEYSPACE}.plain (id int PRIMARY KEY, v text)",
]
LATE_TABLE = f"CREATE TABLE {KEYSPACE}.late (id int, ck text, v int, PRIMARY KEY (id, ck)) WITH cdc = true"
CDC_TABLES = ["rows", "collections", "counters", "types", "expiring", "late"]
SHORT_TTL = 2  # seconds: every TTL of the workload (and default_time_to_live = 3) has passed before the check
CONVERGE_TIMEOUT = 300.0  # seconds for the events to match the tables once writing has ended


class Workload:
    """Statements at CONSISTENCY ALL; ``ts`` hands out explicit write timestamps for out-of-order writes."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.base_ts = int(time.time() * 1_000_000)

    def __call__(self, cql: str, *values: Any) -> Any:
        return self.session.execute(cql, values or None)

    def rows_table(self, start: int, count: int) -> None:
        t = f"{KEYSPACE}.rows"
        for pk in range(start, start + count):
            for ck in range(4):
                self(f"INSERT INTO {t} (pk, ck, v, n, gone) VALUES (%s, %s, %s, %s, 'x')",
                     pk, ck, f"v{ck}", ck)
            self(f"UPDATE {t} SET s = %s WHERE pk = %s", f"static {pk}", pk)
            self(f"UPDATE {t} SET v = 'updated' WHERE pk = %s AND ck = 0", pk)  # a cell
            self(f"DELETE n FROM {t} WHERE pk = %s AND ck = 1", pk)  # a cell deletion
            self(f"DELETE FROM {t} WHERE pk = %s AND ck = 2", pk)  # a row
            # A cell's TTL, a row's TTL.
            self(f"UPDATE {t} USING TTL {SHORT_TTL} SET v = 'short' WHERE pk = %s AND ck = 3", pk)
            self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 10, 'row ttl') USING TTL {SHORT_TTL}", pk)
            self(f"UPDATE {t} SET v = 'update only' WHERE pk = %s AND ck = 11", pk)  # no row marker
            self(f"UPDATE {t} USING TTL {SHORT_TTL} SET v = 'update only ttl' WHERE pk = %s AND ck = 12", pk)
        # A partition deletion, a range deletion, a static-only partition, a partition emptied by cells.
        self(f"DELETE FROM {t} WHERE pk = %s", start)
        self(f"DELETE FROM {t} WHERE pk = %s AND ck >= 1 AND ck < 11", start + 1)
        self(f"INSERT INTO {t} (pk, s) VALUES (%s, 'static only')", start + 100)
        self(f"UPDATE {t} SET s = 'static then gone' WHERE pk = %s", start + 101)
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 0, 'beside a static')", start + 101)
        self(f"DELETE s FROM {t} WHERE pk = %s", start + 101)

    def out_of_order(self, pk: int) -> None:
        """Writes whose explicit timestamps arrive out of order: the newest timestamp wins, not the last."""
        t, ts = f"{KEYSPACE}.rows", self.base_ts
        self(f"INSERT INTO {t} (pk, ck, v, n) VALUES (%s, 0, 'newest', 1) USING TIMESTAMP {ts + 30}", pk)
        self(f"INSERT INTO {t} (pk, ck, v, n) VALUES (%s, 0, 'older', 2) USING TIMESTAMP {ts + 10}", pk)
        self(f"UPDATE {t} USING TIMESTAMP {ts + 40} SET n = 3 WHERE pk = %s AND ck = 0", pk)
        # Older than the insert: the row stays.
        self(f"DELETE FROM {t} USING TIMESTAMP {ts + 20} WHERE pk = %s AND ck = 0", pk)
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 1, 'deleted later') USING TIMESTAMP {ts + 5}", pk)
        self(f"DELETE FROM {t} USING TIMESTAMP {ts + 50} WHERE pk = %s AND ck = 1", pk)
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 1, 'too old') USING TIMESTAMP {ts + 45}", pk)

    def collections(self, start: int, count: int) -> None:
        t = f"{KEYSPACE}.collections"
        for i in range(start, start + count):
            self(f"INSERT INTO {t} (id, l, st, m, home, frozen_home, pair, frozen_list) VALUES "
                 "(%s, [1, 2], {'a', 'b'}, {'x': 1, 'y': 2}, {street: 'main', number: 1}, "
                 "{street: 'frozen', number: 2}, (3, 'three'), [7, 8])", i)
            self(f"UPDATE {t} SET l = l + [3], st = st + {{'c'}}, m = m + {{'z': 3}} WHERE id = %s", i)
            self(f"UPDATE {t} SET l = [0] + l WHERE id = %s", i)  # prepend
            self(f"UPDATE {t} SET l[1] = 10, m['x'] = 11 WHERE id = %s", i)  # element set
            self(f"DELETE l[2], m['y'] FROM {t} WHERE id = %s", i)  # element delete
            self(f"UPDATE {t} SET st = st - {{'a'}}, home.number = 5 WHERE id = %s", i)  # a UDT field too
            self(f"UPDATE {t} USING TTL {SHORT_TTL} SET m['ttl'] = 9, st = st + {{'ttl'}} WHERE id = %s", i)
            if i % 2:
                self(f"UPDATE {t} SET l = [42], st = {{'over'}}, m = {{'o': 1}}, pair = (4, 'four'), "
                     "frozen_home = {street: 'moved', number: 3}, home = {street: 'new'} WHERE id = %s", i)
            if i % 3 == 0:
                self(f"DELETE st, home FROM {t} WHERE id = %s", i)

    def counters(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            for step in (1, 5, -2):
                self(f"UPDATE {KEYSPACE}.counters SET hits = hits + %s WHERE id = %s", step, i)
            self(f"UPDATE {KEYSPACE}.counters SET misses = misses + 1 WHERE id = %s", i)
        self(f"DELETE FROM {KEYSPACE}.counters WHERE id = %s", start)

    def types(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            self(f"INSERT INTO {KEYSPACE}.types (id, amount, total, span, address, at, day, stamp, "
                 "embedding, "
                 "payload, small, tiny, big, ratio, flag, uid, tid) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, "
                 "%s, %s, %s, %s, %s, %s, %s, %s, now())",
                 i, decimal.Decimal(f"{i}.0100"), -(10 ** 30) * (i + 1),
                 util.Duration(i, 2, 3_000_000_000 + i),
                 f"10.1.{i}.7" if i % 2 else f"2001:db8::{i:x}", util.Time(3_600_000_000_123 + i),
                 util.Date(19_000 + i), datetime.datetime(2024, 1, 2, 3, 4, 5, 678000) + datetime.timedelta(
                     days=i), [i * 0.5, -1.25, 7.62], bytes([i, 0, 255]), -i, i % 100, 1 << 40, 7.62,
                 i % 2 == 0, uuid.UUID(int=i + 1))

    def batches_and_lwt(self, start: int) -> None:
        t = f"{KEYSPACE}.rows"
        self(f"BEGIN BATCH INSERT INTO {t} (pk, ck, v) VALUES ({start}, 0, 'logged'); "
             f"UPDATE {KEYSPACE}.collections SET st = st + {{'batched'}} WHERE id = {start}; "
             f"DELETE FROM {t} WHERE pk = {start} AND ck = 1; APPLY BATCH")
        self(f"BEGIN UNLOGGED BATCH INSERT INTO {t} (pk, ck, v) VALUES ({start + 1}, 0, 'unlogged'); "
             f"INSERT INTO {t} (pk, ck, v) VALUES ({start + 1}, 1, 'unlogged too'); APPLY BATCH")
        self(f"BEGIN COUNTER BATCH UPDATE {KEYSPACE}.counters SET hits = hits + 100 WHERE id = {start}; "
             "APPLY BATCH")
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 0, 'lwt') IF NOT EXISTS", start + 2)
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 0, 'lwt lost') IF NOT EXISTS", start + 2)
        self(f"UPDATE {t} SET v = 'lwt updated' WHERE pk = %s AND ck = 0 IF v = 'lwt'", start + 2)
        self(f"UPDATE {t} SET v = 'lwt not applied' WHERE pk = %s AND ck = 0 IF v = 'other'", start + 2)

    def others(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            self(f"INSERT INTO {KEYSPACE}.expiring (id, v) VALUES (%s, 'default ttl')", i)
            self(f"INSERT INTO {KEYSPACE}.expiring (id, v) VALUES (%s, 'own ttl') USING TTL 3600", i + 1000)
            self(f"INSERT INTO {KEYSPACE}.plain (id, v) VALUES (%s, 'no cdc')", i)

    def late(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            self(f"INSERT INTO {KEYSPACE}.late (id, ck, v) VALUES (%s, 'a', %s)", i, i)
            self(f"UPDATE {KEYSPACE}.late SET v = %s WHERE id = %s AND ck = 'b'", -i, i)


@pytest.fixture(scope="module")
def outcome(real_cassandra: Any, real_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the system through the workload and restarts; the events per topic and the tables' rows."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    system = System(tmp_path_factory.mktemp("real-e2e"), real_cassandra, real_kafka, SERVER)
    with session_at_all(real_cassandra, SCHEMA) as session:
        write = Workload(session)
        try:
            system.start_agents()
            write.rows_table(0, 6)
            wait_for(lambda: topic_exists(real_kafka.bootstrap_servers, f"{SERVER}.raw"), "the raw topic", 60,
                     system.children)
            system.pipeline.start()
            wait_for(lambda: system.pipeline.ready, "the pipeline", 180, system.children)
            timings["started"] = time.monotonic() - started
            write.out_of_order(50)
            write.collections(0, 6)
            write.counters(0, 4)
            write.types(0, 6)
            write.batches_and_lwt(200)
            write.others(0, 4)
            # An agent stopped cleanly (SIGTERM) while writes go on, then started again.
            agent = system.agents[0]
            assert agent.stop(signal.SIGTERM) == 0, agent.log_tail(30)
            write.rows_table(300, 3)
            write.collections(300, 3)
            agent.start()
            # The pipeline killed (-9, Spark's JVM with it) while writes go on, then started again.
            system.pipeline.kill()
            write.rows_table(400, 3)
            write.counters(400, 2)
            system.pipeline.start()
            # Schema changes while running.
            session.execute(f"ALTER TABLE {KEYSPACE}.rows ADD added int")
            session.execute(f"ALTER TABLE {KEYSPACE}.rows DROP gone")
            session.execute(LATE_TABLE)
            assert session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)
            write(f"UPDATE {KEYSPACE}.rows SET added = 7 WHERE pk = 3 AND ck = 0")
            write(f"INSERT INTO {KEYSPACE}.rows (pk, ck, v, added) VALUES (500, 0, 'after alter', 8)")
            write.late(0, 5)
            write.types(100, 2)
            wait_for(lambda: system.pipeline.ready, "the restarted pipeline", 180, system.children)
            timings["written"] = time.monotonic() - started
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            topics = {table: f"{SERVER}.{KEYSPACE}.{table}" for table in [*CDC_TABLES, "plain"]}
            tables = {table: table_rows(session, KEYSPACE, table) for table in CDC_TABLES}
            deadline = time.monotonic() + CONVERGE_TIMEOUT
            while True:
                events = consume_events(real_kafka.bootstrap_servers, list(topics.values()))
                differences = {
                    table: differences_of(events[topics[table]], session, KEYSPACE, table, tables[table])
                    for table in CDC_TABLES}
                if not any(differences.values()) or time.monotonic() > deadline:
                    break
                for child in system.children:
                    assert child.exit_code is None, f"{child.name} exited: {child.log_tail(30)}"
                time.sleep(3)
            timings["converged"] = time.monotonic() - started
            plain_exists = topic_exists(real_kafka.bootstrap_servers, topics["plain"])
        finally:
            system.stop()
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
    return {"events": {table: events[topic] for table, topic in topics.items()}, "differences": differences,
            "tables": tables, "plain_topic": plain_exists, "logs": system.logs()}


@pytest.mark.parametrize("table", CDC_TABLES)
def test_each_tables_events_replay_to_what_select_returns(outcome, table):
    """Writes made while an agent was stopped and while the pipeline was down are among the rows."""
    differences = outcome["differences"][table]
    assert outcome["tables"][table][1], f"{table}: the workload left rows"
    assert differences == [], (f"{table}: {len(differences)} differences, first {differences[:10]}\n"
                               f"{outcome['logs']}")


def test_no_event_is_read_twice(outcome):
    for table, events in outcome["events"].items():
        seen = [json.dumps(e, sort_keys=True) for e in events]
        duplicates = [e for e in set(seen) if seen.count(e) > 1]
        assert duplicates == [], f"{table}: {len(duplicates)} events twice, first {duplicates[:3]}"


def test_a_table_without_cdc_has_no_topic(outcome):
    assert not outcome["plain_topic"]
    assert outcome["events"]["plain"] == []
