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

import base64
import datetime
import decimal
import json
import signal
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from cassandra import ConsistencyLevel, util
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from cassandra_cdc.demo.processes import ChildProcess
from cassandra_cdc.demo.table_check import compare_rows, replay

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


def event_shape(value: Any) -> Any:
    """A value as the driver decodes it, in the shape a JSON event carries it (docs/events.md)."""
    if value is None or isinstance(value, (bool, int, str, float)):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):  # io.debezium.data.VariableScaleDecimal
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
        return {"scale": -exponent, "value": base64.b64encode(_java_bytes(unscaled)).decode()}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.datetime):
        return round(value.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)
    if isinstance(value, util.Date):
        return value.days_from_epoch
    if isinstance(value, util.Time):
        return value.nanosecond_time
    if isinstance(value, util.Duration):  # io.debezium.time.Interval, for the positive durations written here
        minutes, nanoseconds = divmod(value.nanoseconds, 60 * 10**9)
        hours, minutes = divmod(minutes, 60)
        seconds = f"{nanoseconds // 10**9}.{nanoseconds % 10**9:09d}".rstrip("0").rstrip(".")
        return f"P{value.months // 12}Y{value.months % 12}M{value.days}DT{hours}H{minutes}M{seconds}S"
    if hasattr(value, "_fields"):  # a user type
        return {name: event_shape(getattr(value, name)) for name in value._fields}
    if isinstance(value, tuple):
        return {f"field{i + 1}": event_shape(v) for i, v in enumerate(value)}
    if hasattr(value, "items"):
        return {k: event_shape(v) for k, v in value.items()}
    return [event_shape(v) for v in value]


def _java_bytes(number: int) -> bytes:
    """Java's BigInteger.toByteArray: big-endian two's complement with one sign bit, no more bytes."""
    length = 1
    while not -(1 << (8 * length - 1)) <= number < (1 << (8 * length - 1)):
        length += 1
    return number.to_bytes(length, "big", signed=True)


def float32_shape(value: float) -> float:
    """A ``float`` column's value with the fewest digits that give back the same 32-bit float, as Java's
    ``Float.toString`` prints it (the driver widens it to the nearest double)."""
    single = struct.pack(">f", value)
    for digits in range(1, 10):
        shortest = float(f"{value:.{digits}g}")
        if struct.pack(">f", shortest) == single:
            return shortest
    return value


def column_shape(cql_type: str, value: Any) -> Any:
    """``event_shape`` for a column of ``cql_type``, where the driver's value alone does not say it."""
    if value is None:
        return None
    if cql_type == "varint":  # a Connect Decimal of scale 0
        return base64.b64encode(_java_bytes(value)).decode()
    if cql_type == "float":
        return float32_shape(value)
    if cql_type.startswith("vector<float"):
        return [float32_shape(v) for v in value]
    return event_shape(value)


def table_rows(session: Any, table: str) -> tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]:
    """``SELECT *`` at CONSISTENCY ALL in event shapes, by primary key; also the columns."""
    metadata = session.cluster.metadata.keyspaces[KEYSPACE].tables[table]
    key_columns = [c.name for c in metadata.primary_key]
    result = session.execute(f"SELECT * FROM {KEYSPACE}.{table}")
    rows = {}
    for row in result:
        shaped = {name: column_shape(metadata.columns[name].cql_type, v) for name, v in row._asdict().items()}
        rows[tuple(shaped[c] for c in key_columns)] = shaped
    return list(result.column_names), rows


def consume_events(bootstrap_servers: str, topics: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every event payload of ``topics`` (read_committed), by topic, in each partition's order."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"check-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    events: dict[str, list[dict[str, Any]]] = {topic: [] for topic in topics}
    try:
        metadata = consumer.list_topics(timeout=10).topics
        assignments = [TopicPartition(topic, p, 0) for topic in topics if topic in metadata
                       for p in metadata[topic].partitions]
        if not assignments:
            return events
        consumer.assign(assignments)
        # Under read_committed, the end of a partition (EOF) is its last stable offset.
        pending = {(tp.topic, tp.partition) for tp in assignments}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is not None:
                    assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                    pending.discard((message.topic(), message.partition()))
                elif message.value() is not None:
                    events[message.topic()].append(json.loads(message.value())["payload"])
        assert not pending, f"not read to their end: {pending}"
        return events
    finally:
        consumer.close()


def topic_exists(bootstrap_servers: str, topic: str) -> bool:
    return topic in AdminClient({"bootstrap.servers": bootstrap_servers}).list_topics(timeout=10).topics


def write_yaml(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


def wait_for(condition: Any, what: str, timeout: float, children: list[ChildProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for child in children:
            assert child.exit_code is None, f"{child.name} exited: {child.log_tail(30)}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.3)


class System:
    """The agents and the pipeline, as processes, and how to restart them."""

    def __init__(self, root: Path, cluster: Any, kafka: Any) -> None:
        self.agents = []
        for node in cluster.nodes:
            config = write_yaml(root / f"agent-{node.address}.yaml", {
                "server": SERVER, "node_id": node.address, "cdc_raw": str(node.cdc_raw_dir),
                "state_dir": str(root / f"agent-state-{node.address}"),
                "schema": {"cassandra": {"contact_points": [node.address], "port": node.native_port}},
                "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "raw_topic_partitions": 3},
                "metrics": {"port": 0}, "poll_interval_ms": 200})
            self.agents.append(ChildProcess(f"agent {node.address}", ["agent", "--config", str(config)],
                                            root / f"agent-{node.address}.log", ready_marker="tailing"))
        config = write_yaml(root / "pipeline.yaml", {
            "server": SERVER, "checkpoint": str(root / "checkpoint"),
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "max_offsets_per_trigger": 5000,
                      "events_topic_partitions": 2},
            "spark": {"master": "local[2]", "shuffle_partitions": 2, "trigger_interval": "500 milliseconds"}})
        self.pipeline = ChildProcess("pipeline", ["pipeline", "--config", str(config)], root / "pipeline.log",
                                     ready_marker="pipeline running")

    @property
    def children(self) -> list[ChildProcess]:
        return [*self.agents, self.pipeline]

    def logs(self) -> str:
        return "\n".join(f"--- {child.name}\n{child.log_tail(15)}" for child in self.children)

    def stop(self) -> None:
        for child in self.children:
            child.stop()


@pytest.fixture(scope="module")
def outcome(real_cassandra: Any, real_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the system through the workload and restarts; the events per topic and the tables' rows."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    system = System(tmp_path_factory.mktemp("real-e2e"), real_cassandra, real_kafka)
    with real_cassandra.driver() as driver:
        session = driver.connect()
        session.get_execution_profile(EXEC_PROFILE_DEFAULT).consistency_level = ConsistencyLevel.ALL
        for cql in SCHEMA:
            session.execute(cql)
        assert driver.control_connection.wait_for_schema_agreement(wait_time=60)
        write = Workload(session)
        try:
            for agent in system.agents:
                agent.start()
            wait_for(lambda: all(a.ready for a in system.agents), "the agents", 120, system.children)
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
            assert driver.control_connection.wait_for_schema_agreement(wait_time=60)
            write(f"UPDATE {KEYSPACE}.rows SET added = 7 WHERE pk = 3 AND ck = 0")
            write(f"INSERT INTO {KEYSPACE}.rows (pk, ck, v, added) VALUES (500, 0, 'after alter', 8)")
            write.late(0, 5)
            write.types(100, 2)
            wait_for(lambda: system.pipeline.ready, "the restarted pipeline", 180, system.children)
            timings["written"] = time.monotonic() - started
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            topics = {table: f"{SERVER}.{KEYSPACE}.{table}" for table in [*CDC_TABLES, "plain"]}
            tables = {table: table_rows(session, table) for table in CDC_TABLES}
            deadline = time.monotonic() + CONVERGE_TIMEOUT
            while True:
                events = consume_events(real_kafka.bootstrap_servers, list(topics.values()))
                differences = {table: differences_of(events[topics[table]], session, table, tables[table])
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


def differences_of(events: list[dict[str, Any]], session: Any, table: str,
                   selected: tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]) -> list[str]:
    columns, expected = selected
    key_columns = [c.name for c in session.cluster.metadata.keyspaces[KEYSPACE].tables[table].primary_key]
    got = replay((("t", e) for e in events), "t", key_columns)
    return compare_rows(got, expected, columns)


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
