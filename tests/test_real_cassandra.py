"""This project's commit log reader against segments a real Cassandra 5.0 cluster writes.

Three real nodes (the ``real_cassandra`` fixture), a ``cdc = true`` table with every kind of column,
statements written at CONSISTENCY ALL with client timestamps, ``nodetool flush``; then every node's
``cdc_raw`` must hold the statements, each once, decoded by ``SegmentReader`` and ``replay`` (schema
read from the live cluster's ``system_schema``) with no damage, values equal to what was written.
"""

from __future__ import annotations

import datetime
import decimal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cassandra import ConsistencyLevel, util
from cassandra.query import SimpleStatement

from cassandra_cdc.agent.cdc_raw import bytes_missing, list_segments, read_cdc_index
from cassandra_cdc.commitlog import MutationSerializer, SegmentReader
from cassandra_cdc.storage import ComplexColumn, PartitionUpdate
from cassandra_cdc.commitlog.replay import ReplayStats, replay
from cassandra_cdc.schema import Schema, fetch_schema

KEYSPACE = "real_cdc"
TABLE = f"{KEYSPACE}.readings"
SCHEMA = f"""
CREATE TABLE {TABLE} (
    sensor int, at timestamp, region text static, name text, reading double, amount decimal, total varint,
    tags set<text>, attrs map<text, int>, samples list<int>, payload blob, ok boolean, id uuid, day date,
    address inet, location frozen<tuple<int, text>>, embedding vector<float, 3>,
    PRIMARY KEY (sensor, at)
) WITH cdc = true"""
COLLECTIONS = ("tags", "attrs", "samples")

INSERTS = 240
SENSORS = 16
BASE_TIMESTAMP = 1_700_000_000_000_000  # microseconds; each statement gets its own, above this
BASE_TIME = datetime.datetime(2024, 5, 1, 12, 0, 0)


def insert_values(i: int) -> dict[str, Any]:
    """The columns of the i-th insert: a value of every type, all different from one insert to the next."""
    return {
        "sensor": i % SENSORS, "at": BASE_TIME + datetime.timedelta(seconds=i, milliseconds=i % 1000),
        "region": f"region-{i % SENSORS}-{i}", "name": f"name {i} é✓", "reading": i * 1.5 - 100.25,
        "amount": decimal.Decimal(f"{i}.{i:03d}"), "total": (1 << 70) * (i + 1) - i,
        "tags": {f"tag-{i}", f"tag-{i + 1}"}, "attrs": {f"k{i}": i, "common": -i},
        "samples": [i, i * 2, -i], "payload": bytes([i % 256]) * (i % 40 + 1) * 500, "ok": i % 3 == 0,
        "id": uuid.UUID(int=i * 7919 + 1), "day": util.Date(19_000 + i),
        "address": f"10.0.{i // 256}.{i % 256}", "location": (i, f"place {i}"),
        "embedding": [i * 0.5, -0.25, 1.0 + i],
    }


def normalize(value: Any) -> Any:
    """A comparable form: sets and maps as sorted lists, tuples as lists."""
    if isinstance(value, (set, frozenset, util.SortedSet)):
        return sorted(value)
    if isinstance(value, (dict, util.OrderedMapSerializedKey)):
        return sorted(value.items())
    if isinstance(value, tuple):
        return list(value)
    return value


def change(sensor: int, *, static: dict[str, Any] | None = None, rows: list[dict[str, Any]] | None = None,
           partition_deletion: int | None = None) -> dict[str, Any]:
    return {"sensor": sensor, "partition_deletion": partition_deletion, "static": static or {},
            "rows": rows or []}


def row(at: datetime.datetime | None, *, marker: int | None = None, deletion: int | None = None,
        values: dict[str, Any] | None = None, timestamps: set[int] | None = None,
        ttls: set[int] | None = None, collection_deletions: dict[str, int] | None = None) -> dict[str, Any]:
    """A row as the tests compare it (``at`` None for the static row); timestamps and TTLs are those of
    its marker and cells."""
    return {"at": at, "marker": marker, "deletion": deletion,
            "values": {name: normalize(value) for name, value in (values or {}).items()},
            "timestamps": sorted(timestamps or ()), "ttls": sorted(ttls or ()),
            "collection_deletions": collection_deletions or {}}


def write_statements(session: Any) -> list[dict[str, Any]]:
    """Inserts, updates with a TTL, row deletions and a partition deletion, at CONSISTENCY ALL; returns
    the change each one must appear as in every node's commit log."""
    def prepared(cql: str) -> Any:
        statement = session.prepare(cql)
        statement.consistency_level = ConsistencyLevel.ALL
        return statement

    columns = list(insert_values(0))
    insert = prepared(f"INSERT INTO {TABLE} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                      "USING TIMESTAMP ?")
    update = prepared(f"UPDATE {TABLE} USING TTL 3600 AND TIMESTAMP ? SET name = ?, tags = tags + ? "
                      "WHERE sensor = ? AND at = ?")
    delete_row = prepared(f"DELETE FROM {TABLE} USING TIMESTAMP ? WHERE sensor = ? AND at = ?")
    delete_partition = prepared(f"DELETE FROM {TABLE} USING TIMESTAMP ? WHERE sensor = ?")
    expected = []
    timestamp = BASE_TIMESTAMP
    for i in range(INSERTS):
        timestamp += 1
        values = insert_values(i)
        session.execute(insert, [*values.values(), timestamp])
        regular = {k: v for k, v in values.items() if k not in ("sensor", "at", "region")}
        static = row(None, values={"region": values["region"]}, timestamps={timestamp}, ttls={0})
        # An INSERT replaces whole collections: a collection deletion just before its own timestamp.
        inserted = row(values["at"], marker=timestamp, values=regular, timestamps={timestamp}, ttls={0},
                       collection_deletions=dict.fromkeys(COLLECTIONS, timestamp - 1))
        expected.append(change(values["sensor"], static=static, rows=[inserted]))
    for i in range(0, INSERTS, 12):
        timestamp += 1
        values = insert_values(i)
        session.execute(update, [timestamp, f"renamed {i}", {"added"}, values["sensor"], values["at"]])
        expected.append(change(values["sensor"], rows=[row(values["at"], values={"name": f"renamed {i}",
                                                                                  "tags": {"added"}},
                                                           timestamps={timestamp}, ttls={3600})]))
    for i in range(5, INSERTS, 24):
        timestamp += 1
        values = insert_values(i)
        session.execute(delete_row, [timestamp, values["sensor"], values["at"]])
        expected.append(change(values["sensor"], rows=[row(values["at"], deletion=timestamp)]))
    timestamp += 1
    session.execute(delete_partition, [timestamp, SENSORS - 1])
    expected.append(change(SENSORS - 1, partition_deletion=timestamp))
    return expected


def decoded_change(update: PartitionUpdate) -> dict[str, Any]:
    """A partition update of the test table in the same form as ``write_statements``' expectations."""
    table = update.table
    (sensor,) = [column.type.deserialize(value)
                 for column, value in zip(table.partition_key, table.split_partition_key(update.key))]
    rows = [decoded_row(r, update) for r in update.rows]
    static = decoded_row(update.static_row, update) if update.static_row is not None else {}
    deletion = update.partition_deletion.marked_for_delete_at if update.partition_deletion else None
    return change(sensor, static=static, rows=rows, partition_deletion=deletion)


def decoded_row(decoded: Any, update: PartitionUpdate) -> dict[str, Any]:
    clustering = [column.type.deserialize(value)
                  for column, value in zip(update.table.clustering, decoded.clustering)]
    values: dict[str, Any] = {}
    timestamps, ttls, collection_deletions = set(), set(), {}
    if decoded.liveness is not None:
        timestamps.add(decoded.liveness.timestamp)
    for data in decoded.cells:
        column = data.column
        if isinstance(data, ComplexColumn):
            if data.deletion is not None:
                collection_deletions[column.name] = data.deletion.marked_for_delete_at
            cells = data.cells
            paths = [column.type.path_type.deserialize(cell.path) for cell in cells]
            elements = [column.type.element_type(cell.path).deserialize(cell.value) if cell.value else None
                        for cell in cells]
            kind = column.type.kind
            values[column.name] = (set(paths) if kind == "set" else dict(zip(paths, elements))
                                   if kind == "map" else elements)
        else:
            cells = [data]
            values[column.name] = column.type.deserialize(data.value) if data.value else None
        for cell in cells:
            timestamps.add(cell.timestamp)
            ttls.add(cell.ttl)
    return row(clustering[0] if clustering else None,
               marker=decoded.liveness.timestamp if decoded.liveness else None,
               deletion=decoded.deletion.marked_for_delete_at if decoded.deletion else None, values=values,
               timestamps=timestamps, ttls=ttls, collection_deletions=collection_deletions)


def read_cdc_raw(cdc_raw: Path, schema: Schema) -> tuple[list[dict[str, Any]], ReplayStats, list[Any]]:
    """The test table's changes in the segments of ``cdc_raw`` that have an idx file, each read up to the
    offset its idx file declares durable (as the agent reads them); also the replay stats and any damage.

    Each of the test table's mutations must re-encode to the bytes Cassandra wrote. The system tables'
    are only decoded: one run under heavy load wrote a system mutation whose header carried other
    encoding stats (minimum timestamp) than the writer derives from its content, which changes no value.
    """
    changes, damage, stats = [], [], ReplayStats()
    for segment in list_segments(cdc_raw):
        index = read_cdc_index(segment.index_path)
        if index is None:
            continue
        with SegmentReader(segment.path, limit=index.offset) as reader:
            assert reader.version == 8, f"{segment.path}: commit log version {reader.version}, not 5.0's 8"
            for entry, mutation in replay(reader, schema, stats):
                ours = [decoded_change(u) for u in mutation.updates if u.table.qualified_name == TABLE]
                if ours:
                    assert MutationSerializer.serialize(mutation, reader.version) == entry.body, \
                        f"{segment.path} entry at {entry.position} re-encodes differently"
                changes += ours
            damage += reader.damage
    return changes, stats, damage


def comparable(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(changes, key=repr)


@pytest.fixture(scope="module")
def written(real_cassandra: Any) -> tuple[list[dict[str, Any]], Schema]:
    """The statements written to the real cluster, flushed on every node, and the cluster's schema."""
    with real_cassandra.driver() as driver:
        session = driver.connect()
        session.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
                        "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}")
        session.execute(SCHEMA)
        assert driver.control_connection.wait_for_schema_agreement(wait_time=60)
        expected = write_statements(session)
        count = SimpleStatement(f"SELECT COUNT(*) FROM {TABLE}", consistency_level=ConsistencyLevel.ALL)
        assert session.execute(count).one()[0] > 0
        schema = fetch_schema(session)
    real_cassandra.nodetool("flush")
    return expected, schema


def test_every_node_holds_its_cdc_segments_with_idx_files(real_cassandra, written):
    """The statements (over 2 MiB of blobs) filled a 2 MiB segment on every node: a completed one and
    the one after it, both in cdc_raw with their idx files."""
    for node in real_cassandra.nodes:
        indexes = {s.path.name: read_cdc_index(s.index_path) for s in list_segments(node.cdc_raw_dir)
                   if s.index_path.is_file()}
        assert len(indexes) >= 2, f"{node.cdc_raw_dir}: {indexes}"
        assert all(name.startswith("CommitLog-8-") for name in indexes)
        assert any(index and index.completed for index in indexes.values()), indexes


def test_the_reader_decodes_every_statement_on_every_node_as_written(real_cassandra, written):
    """Each node's commit log holds each statement once (RF=3, ALL); our reader decodes every entry of
    its CDC segments (system tables too) with no damage and the values the client wrote."""
    expected, schema = written
    deadline = time.monotonic() + 30
    for node in real_cassandra.nodes:
        # Entries become readable once the periodic commit log sync has written their section's marker.
        while True:
            changes, stats, damage = read_cdc_raw(node.cdc_raw_dir, schema)
            if len(changes) >= len(expected) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert damage == [], node
        assert stats.undecodable == 0 and not stats.skipped_unknown_tables, (node, stats)
        assert comparable(changes) == comparable(expected), node


def test_a_killed_node_restarts_with_every_statement_still_in_its_cdc_raw(real_cassandra, written):
    """kill -9, then start again: the node replays its commit log, rejoins, and its cdc_raw still holds
    each statement once, readable to the end."""
    expected, schema = written
    node = real_cassandra.nodes[-1]
    pid = node.pid
    node.kill()
    assert not node.running
    real_cassandra.start()
    assert node.running and node.pid != pid
    changes, stats, damage = read_cdc_raw(node.cdc_raw_dir, schema)
    assert damage == [] and stats.undecodable == 0 and not stats.skipped_unknown_tables
    assert comparable(changes) == comparable(expected)
    # The replay rewrote the idx of the segment being written at the kill: COMPLETED at the file's length,
    # past its last sync marker. Nothing is missing from it for the agent.
    ends = {}
    for segment in list_segments(node.cdc_raw_dir):
        index = read_cdc_index(segment.index_path)
        if index is not None and index.completed:
            with SegmentReader(segment.path) as reader:
                for _ in reader.entries():
                    pass
            ends[segment.path.name] = (reader.position, index.offset, bytes_missing(reader, index.offset, True))
    assert any(position < offset for position, offset, _ in ends.values()), ends
    assert not any(missing for _, _, missing in ends.values()), ends
    with real_cassandra.driver(only=node) as driver:
        count = SimpleStatement(f"SELECT COUNT(*) FROM {TABLE}", consistency_level=ConsistencyLevel.ONE)
        assert driver.connect().execute(count).one()[0] == live_rows(expected)


def live_rows(expected: list[dict[str, Any]]) -> int:
    """Rows a SELECT shows after the statements: inserted, not deleted, not in the deleted partition."""
    deleted_partitions = {c["sensor"] for c in expected if c["partition_deletion"] is not None}
    deleted_rows = {(c["sensor"], r["at"]) for c in expected for r in c["rows"] if r["deletion"] is not None}
    inserted = {(c["sensor"], r["at"]) for c in expected for r in c["rows"] if r["marker"] is not None}
    return len({key for key in inserted - deleted_rows if key[0] not in deleted_partitions})


def test_a_node_stopped_cleanly_completes_its_cdc_segments_and_restarts(real_cassandra, written):
    """A clean stop drains the node: each CDC segment's idx file then says COMPLETED, and everything
    is still readable after the restart."""
    expected, schema = written
    node = real_cassandra.nodes[1]
    node.stop()
    indexes = [read_cdc_index(segment.index_path) for segment in list_segments(node.cdc_raw_dir)
               if segment.index_path.is_file()]
    real_cassandra.start()
    assert indexes and all(index and index.completed for index in indexes), indexes
    changes, stats, damage = read_cdc_raw(node.cdc_raw_dir, schema)
    assert damage == [] and stats.undecodable == 0
    assert comparable(changes) == comparable(expected)
