"""A CQL workload for a real Cassandra cluster, and its tables read back as change events carry them.

Shared by the real end-to-end test (tests/test_real_e2e.py) and ``cassandra-cdc demo`` on real nodes.
The workload (through cassandra-driver, at the session's consistency level) covers cells, rows, partitions
and clustering ranges, TTLs, out-of-order timestamps, static columns, collections (nested ones too), user
types, tuples, counters, batches, LWT, a TRUNCATE and many CQL types; ``table_rows`` reads a table with
``SELECT *`` in the shapes of the JSON events (docs/events.md), so that events replayed into rows compare
with it.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import struct
import time
import uuid
from typing import Any, Mapping

from cassandra import util

SHORT_TTL = 2  # seconds: the TTL of the workload's expiring writes
DEFAULT_TTL = 3  # seconds: default_time_to_live of the table ``expiring``


def has_vectors(cassandra_version: str) -> bool:
    """Whether a Cassandra version has the ``vector`` type (5.0 and later)."""
    return int(cassandra_version.split(".")[0]) >= 5


def replication(replicas: int | Mapping[str, int]) -> str:
    """A keyspace's ``replication`` (``NetworkTopologyStrategy``): ``replicas`` in ``datacenter1``, or
    replicas by datacenter."""
    by_datacenter = {"datacenter1": replicas} if isinstance(replicas, int) else replicas
    placement = "".join(f", '{datacenter}': {count}" for datacenter, count in by_datacenter.items())
    return f"{{'class': 'NetworkTopologyStrategy'{placement}}}"


def schema_statements(keyspace: str, cassandra_version: str = "5.0",
                      replicas: int | Mapping[str, int] = 3) -> list[str]:
    """The keyspace (``replicas`` in ``datacenter1``, or replicas by datacenter), its user type and tables
    (``types`` with a vector column on a version that has them); ``plain`` has no CDC."""
    embedding = "embedding vector<float, 3>, " if has_vectors(cassandra_version) else ""
    return [
        f"CREATE KEYSPACE {keyspace} WITH replication = {replication(replicas)}",
        f"CREATE TYPE {keyspace}.address (street text, number int)",
        f"CREATE TYPE {keyspace}.tagged (name text, tags frozen<set<text>>, scores frozen<map<int, text>>)",
        f"""CREATE TABLE {keyspace}.rows (pk int, ck int, s text static, v text, n int, gone text,
            PRIMARY KEY (pk, ck)) WITH cdc = true""",
        f"""CREATE TABLE {keyspace}.collections (id int PRIMARY KEY, l list<int>, st set<text>,
            m map<text, int>, home address, frozen_home frozen<address>, pair tuple<int, text>,
            frozen_list frozen<list<int>>, nested_map map<text, frozen<list<int>>>,
            nested_list list<frozen<set<text>>>, nested_set set<frozen<map<int, text>>>, label tagged)
            WITH cdc = true""",
        f"CREATE TABLE {keyspace}.counters (id int PRIMARY KEY, hits counter, misses counter) "
        "WITH cdc = true",
        f"""CREATE TABLE {keyspace}.types (id int PRIMARY KEY, amount decimal, total varint, span duration,
            address inet, at time, day date, stamp timestamp, {embedding}payload blob,
            small smallint, tiny tinyint, big bigint, ratio float, flag boolean, uid uuid, tid timeuuid)
            WITH cdc = true""",
        f"""CREATE TABLE {keyspace}.expiring (id int PRIMARY KEY, v text)
            WITH default_time_to_live = {DEFAULT_TTL} AND cdc = true""",
        f"CREATE TABLE {keyspace}.plain (id int PRIMARY KEY, v text)",
    ]


CDC_TABLES = ["rows", "collections", "counters", "types", "expiring"]
NON_CDC_TABLE = "plain"


def late_table_statement(keyspace: str) -> str:
    """A table created while the system runs (``Workload.late`` writes it)."""
    return f"CREATE TABLE {keyspace}.late (id int, ck text, v int, PRIMARY KEY (id, ck)) WITH cdc = true"


class Workload:
    """Statements at CONSISTENCY ALL; ``ts`` hands out explicit write timestamps for out-of-order writes."""

    def __init__(self, session: Any, keyspace: str, cassandra_version: str = "5.0") -> None:
        self.session = session
        self.keyspace = keyspace
        self.vectors = has_vectors(cassandra_version)
        self.base_ts = int(time.time() * 1_000_000)

    def __call__(self, cql: str, *values: Any, timeout: float | None = None) -> Any:
        if timeout is None:
            return self.session.execute(cql, values or None)
        return self.session.execute(cql, values or None, timeout=timeout)

    def rows_table(self, start: int, count: int) -> None:
        t = f"{self.keyspace}.rows"
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
        t, ts = f"{self.keyspace}.rows", self.base_ts
        self(f"INSERT INTO {t} (pk, ck, v, n) VALUES (%s, 0, 'newest', 1) USING TIMESTAMP {ts + 30}", pk)
        self(f"INSERT INTO {t} (pk, ck, v, n) VALUES (%s, 0, 'older', 2) USING TIMESTAMP {ts + 10}", pk)
        self(f"UPDATE {t} USING TIMESTAMP {ts + 40} SET n = 3 WHERE pk = %s AND ck = 0", pk)
        # Older than the insert: the row stays.
        self(f"DELETE FROM {t} USING TIMESTAMP {ts + 20} WHERE pk = %s AND ck = 0", pk)
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 1, 'deleted later') USING TIMESTAMP {ts + 5}", pk)
        self(f"DELETE FROM {t} USING TIMESTAMP {ts + 50} WHERE pk = %s AND ck = 1", pk)
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 1, 'too old') USING TIMESTAMP {ts + 45}", pk)

    def collections(self, start: int, count: int) -> None:
        t = f"{self.keyspace}.collections"
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

    def nested(self, start: int, count: int) -> None:
        """Collections in collections, a user type holding collections; elements of the non-frozen outer ones
        updated, one operation on a column per statement."""
        t = f"{self.keyspace}.collections"
        for i in range(start, start + count):
            self(f"UPDATE {t} SET nested_map = {{'a': [1, 2], 'b': [3]}}, "
                 "nested_list = [{'x', 'y'}, {'z'}], "
                 "nested_set = {{1: 'one'}, {1: 'one', 2: 'two'}, {0: 'zero'}}, "
                 "label = {name: 'first', tags: {'p', 'q'}, scores: {3: 'three', 1: 'one'}} WHERE id = %s", i)
            for change in ("nested_map['c'] = [4, 5]", "nested_map['a'] = [6]",
                           "nested_list = nested_list + [{'w'}]", "nested_list[0] = {'v'}",
                           "nested_set = nested_set + {{5: 'five'}}",
                           "nested_set = nested_set - {{0: 'zero'}}",
                           "label.tags = {'r'}, label.scores = {2: 'two'}"):
                self(f"UPDATE {t} SET {change} WHERE id = %s", i)
            self(f"DELETE nested_map['b'] FROM {t} WHERE id = %s", i)
            if i % 2:
                self(f"DELETE nested_list FROM {t} WHERE id = %s", i)
                self(f"UPDATE {t} SET label.name = null WHERE id = %s", i)

    def truncate_collections(self, reinserted: int) -> None:
        """TRUNCATE ``collections`` (a few seconds: each node flushes and snapshots the table), then write
        again, ``reinserted`` a key it had before."""
        self(f"TRUNCATE {self.keyspace}.collections", timeout=120)
        self.collections(reinserted, 1)
        self.nested(reinserted, 1)
        self(f"UPDATE {self.keyspace}.collections SET m['after'] = 1 WHERE id = %s", reinserted + 1)

    def counters(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            for step in (1, 5, -2):
                self(f"UPDATE {self.keyspace}.counters SET hits = hits + %s WHERE id = %s", step, i)
            self(f"UPDATE {self.keyspace}.counters SET misses = misses + 1 WHERE id = %s", i)
        self(f"DELETE FROM {self.keyspace}.counters WHERE id = %s", start)

    def types(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            row = {"id": i, "amount": decimal.Decimal(f"{i}.0100"), "total": -(10 ** 30) * (i + 1),
                   "span": util.Duration(i, 2, 3_000_000_000 + i),
                   "address": f"10.1.{i}.7" if i % 2 else f"2001:db8::{i:x}",
                   "at": util.Time(3_600_000_000_123 + i), "day": util.Date(19_000 + i),
                   "stamp": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000) + datetime.timedelta(days=i),
                   "embedding": [i * 0.5, -1.25, 7.62], "payload": bytes([i, 0, 255]), "small": -i,
                   "tiny": i % 100, "big": 1 << 40, "ratio": 7.62, "flag": i % 2 == 0,
                   "uid": uuid.UUID(int=i + 1)}
            if not self.vectors:
                del row["embedding"]
            self(f"INSERT INTO {self.keyspace}.types ({', '.join(row)}, tid) "
                 f"VALUES ({', '.join(['%s'] * len(row))}, now())", *row.values())

    def batches_and_lwt(self, start: int) -> None:
        t = f"{self.keyspace}.rows"
        self(f"BEGIN BATCH INSERT INTO {t} (pk, ck, v) VALUES ({start}, 0, 'logged'); "
             f"UPDATE {self.keyspace}.collections SET st = st + {{'batched'}} WHERE id = {start}; "
             f"DELETE FROM {t} WHERE pk = {start} AND ck = 1; APPLY BATCH")
        self(f"BEGIN UNLOGGED BATCH INSERT INTO {t} (pk, ck, v) VALUES ({start + 1}, 0, 'unlogged'); "
             f"INSERT INTO {t} (pk, ck, v) VALUES ({start + 1}, 1, 'unlogged too'); APPLY BATCH")
        self(f"BEGIN COUNTER BATCH UPDATE {self.keyspace}.counters SET hits = hits + 100 WHERE id = {start}; "
             "APPLY BATCH")
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 0, 'lwt') IF NOT EXISTS", start + 2)
        self(f"INSERT INTO {t} (pk, ck, v) VALUES (%s, 0, 'lwt lost') IF NOT EXISTS", start + 2)
        self(f"UPDATE {t} SET v = 'lwt updated' WHERE pk = %s AND ck = 0 IF v = 'lwt'", start + 2)
        self(f"UPDATE {t} SET v = 'lwt not applied' WHERE pk = %s AND ck = 0 IF v = 'other'", start + 2)

    def others(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            self(f"INSERT INTO {self.keyspace}.expiring (id, v) VALUES (%s, 'default ttl')", i)
            self(f"INSERT INTO {self.keyspace}.expiring (id, v) VALUES (%s, 'own ttl') USING TTL 3600",
                 i + 1000)
            self(f"INSERT INTO {self.keyspace}.plain (id, v) VALUES (%s, 'no cdc')", i)

    def late(self, start: int, count: int) -> None:
        for i in range(start, start + count):
            self(f"INSERT INTO {self.keyspace}.late (id, ck, v) VALUES (%s, 'a', %s)", i, i)
            self(f"UPDATE {self.keyspace}.late SET v = %s WHERE id = %s AND ck = 'b'", -i, i)


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
    if hasattr(value, "items"):  # text keys: an object; others: [key, value] pairs
        if all(isinstance(k, str) for k in value):
            return {k: event_shape(v) for k, v in value.items()}
        return [[event_shape(k), event_shape(v)] for k, v in value.items()]
    shaped = [event_shape(v) for v in value]
    if isinstance(value, util.SortedSet):
        # The driver orders a set's elements as Python compares them (or not at all, for collections), events
        # in Cassandra's order: the same for the types of the workload (text, numbers, collections of those).
        with contextlib.suppress(TypeError):
            shaped.sort()
    return shaped


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


def key_columns(session: Any, keyspace: str, table: str) -> list[str]:
    return [c.name for c in session.cluster.metadata.keyspaces[keyspace].tables[table].primary_key]


def table_rows(session: Any, keyspace: str,
               table: str) -> tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]:
    """``SELECT *`` in event shapes, by primary key, and the columns; at the session's consistency level
    (a check sets CONSISTENCY ALL: every replica answers)."""
    metadata = session.cluster.metadata.keyspaces[keyspace].tables[table]
    keys = key_columns(session, keyspace, table)
    result = session.execute(f"SELECT * FROM {keyspace}.{table}")
    rows = {}
    for row in result:
        shaped = {name: column_shape(metadata.columns[name].cql_type, v) for name, v in row._asdict().items()}
        rows[tuple(shaped[c] for c in keys)] = shaped
    return list(result.column_names), rows
