"""The simulated cluster: broker, nodes' commit logs and cdc_raw, statements as mutations, the table model.

Real files and a real broker: the node tests read ``cdc_raw`` back with ``SegmentReader`` as a CDC agent
would; the model tests compare with results computed by hand from CQL semantics.
"""

from __future__ import annotations

import collections
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource

from cassandra_cdc.commitlog import Mutation, MutationSerializer, SegmentReader, cdc_index_file_name, parse_segment_name
from cassandra_cdc.storage import BoundKind, Cell, ComplexColumn, DeletionTime, LivenessInfo, PartitionUpdate
from cassandra_cdc.storage.counters import CounterShard, decode_counter_context
from cassandra_cdc.schema import Schema, parse_schema
from cassandra_cdc.simulator import (AddToSet, AppendToList, Clock, Cluster, CounterAdd, CounterLedger,
                                     DeleteColumns, DeletePartition, DeleteRange, DeleteRow, EmbeddedBroker, Insert,
                                     Operation, PutInMap, RemoveFromSet, RemoveMapKeys, SetUdtFields, SimulatedNode,
                                     TableModel, Update, Workload, to_mutation)

SCHEMA = parse_schema("""
CREATE TYPE ks.addr (street text, zip int);
CREATE TABLE ks.users (id int PRIMARY KEY, name text, age int, emails set<text>, prefs map<text, int>,
                       tags list<text>, home addr) WITH cdc = true;
CREATE TABLE ks.events (pk int, ck int, v text, s int static, PRIMARY KEY (pk, ck)) WITH cdc = true;
CREATE TABLE ks.timeline (pk int, a int, b int, v int, PRIMARY KEY (pk, a, b))
    WITH CLUSTERING ORDER BY (a ASC, b DESC) AND cdc = true;
CREATE TABLE ks.hits (page text PRIMARY KEY, n counter, m counter) WITH cdc = true;
CREATE TABLE ks.audit (id int PRIMARY KEY, v text);
""")
USERS, EVENTS, TIMELINE, HITS = (SCHEMA.table("ks", n) for n in ("users", "events", "timeline", "hits"))
SECOND = 1_000_000
T0 = 1_700_000_000 * SECOND  # a write timestamp (microseconds)


def at(seconds: float) -> int:
    return T0 + round(seconds * SECOND)


def now(seconds: float) -> int:
    return T0 // SECOND + int(seconds)


def decoded(op: Operation, version: int = 7, shard: CounterShard | None = None) -> PartitionUpdate:
    """The op's mutation as a reader sees it: serialized, then decoded."""
    body = MutationSerializer.serialize(to_mutation(op, SCHEMA, shard), version)
    mutation = MutationSerializer.deserialize(body, SCHEMA, version)
    assert len(mutation.updates) == 1
    return mutation.updates[0]


def column_names(update: PartitionUpdate) -> list[str]:
    return [c.name for c in update.regular_columns]


def cells_by_name(row_cells: list[Cell | ComplexColumn]) -> dict[str, Cell | ComplexColumn]:
    return {data.column.name: data for data in row_cells}


# --- broker -------------------------------------------------------------------------------------------


def first_message(broker: EmbeddedBroker, topic: str, partition: int) -> tuple[bytes | None, bytes | None]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"test-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        for _ in range(30):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return message.key(), message.value()
        raise AssertionError(f"no message in {topic}[{partition}]")
    finally:
        consumer.close()


def test_broker_round_trip_and_restart_keeps_messages(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    with broker:
        broker.create_topic("cdc.ks.users", 3, compacted=True)
        admin = broker.admin()
        topic = admin.list_topics("cdc.ks.users", timeout=10).topics["cdc.ks.users"]
        assert len(topic.partitions) == 3
        [config] = admin.describe_configs([ConfigResource("topic", "cdc.ks.users")]).values()
        assert config.result()["cleanup.policy"].value == "compact"

        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all",
                             "enable.idempotence": True})
        producer.produce("cdc.ks.users", key=b"user-1", value=b"v1", partition=2)
        assert producer.flush(10) == 0
        producer.close()
        assert first_message(broker, "cdc.ks.users", 2) == (b"user-1", b"v1")

        broker.stop()
        assert not broker.running
        broker.stop()  # idempotent
        broker.start()
        assert first_message(broker, "cdc.ks.users", 2) == (b"user-1", b"v1")
    assert not broker.running


# --- nodes: commit log and cdc_raw ------------------------------------------------------------------------

def cdc_mutation(i: int) -> Mutation:
    return to_mutation(Insert("ks.events", {"pk": i, "ck": 0, "v": "x" * 100}, timestamp=at(i)), SCHEMA)


def plain_mutation(i: int) -> Mutation:
    return to_mutation(Insert("ks.audit", {"id": i, "v": "y" * 100}, timestamp=at(i)), SCHEMA)


def read_segment(path: Path, limit: int | None, schema: Schema = SCHEMA) -> list[bytes]:
    """The entries of a segment up to ``limit``, each checked to decode and re-encode identically."""
    with SegmentReader(path, limit=limit) as reader:
        bodies = [entry.body for entry in reader.entries()]
        assert not reader.damage, reader.damage
        for body in bodies:
            mutation = MutationSerializer.deserialize(body, schema, reader.version)
            assert MutationSerializer.serialize(mutation, reader.version) == body
    return bodies


def idx_text(node: SimulatedNode, segment_id: int) -> str | None:
    path = node.cdc_raw_dir / cdc_index_file_name(node.version, segment_id)
    return path.read_text() if path.exists() else None


def idx_offset(node: SimulatedNode, segment_id: int) -> int:
    text = idx_text(node, segment_id)
    assert text is not None, f"no _cdc.idx for segment {segment_id}"
    return int(text.split("\n")[0])


class Recorder:
    """Writes mutations to a node, remembering each segment's serialized entries."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.written: dict[int, list[bytes]] = collections.defaultdict(list)

    def write(self, mutation: Mutation) -> int:
        segment_id, _ = self.node.write(mutation)
        self.written[segment_id].append(MutationSerializer.serialize(mutation, self.node.version))
        return segment_id


@pytest.mark.parametrize("compression", [None, "LZ4Compressor"])
def test_cassandra_4_links_segments_and_indexes_cdc_ones(tmp_path: Path, compression: str | None) -> None:
    node = SimulatedNode(tmp_path, "n1", SCHEMA, "4.1", segment_size=16 * 1024, compression=compression,
                         first_segment_id=1000)
    first = node.active_segment
    assert first is not None
    link = node.cdc_raw_dir / first.path.name
    # Linked at creation: the same inode as the commit log file.
    assert link.exists() and link.stat().st_ino == first.path.stat().st_ino
    recorder = Recorder(node)

    recorder.write(plain_mutation(0))
    node.sync()
    assert idx_text(node, 1000) is None  # no CDC data yet: no index
    recorder.write(cdc_mutation(1))
    assert idx_text(node, 1000) is None  # CDC data, but not synced yet
    node.sync()
    offsets = [idx_offset(node, 1000)]
    assert read_segment(link, offsets[0]) == recorder.written[1000]

    for i in range(2, 5):
        recorder.write(cdc_mutation(i))
        node.sync()
        offsets.append(idx_offset(node, 1000))
        assert read_segment(link, offsets[-1]) == recorder.written[1000]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    # Fill up with non-CDC data: 1000 completes, 1001 only ever holds non-CDC data.
    i = 5
    while recorder.write(plain_mutation(i)) == 1000:
        i += 1
    completed = idx_text(node, 1000)
    assert completed is not None and completed.endswith("\nCOMPLETED")
    assert not first.path.exists()  # discarded from commitlog/, kept in cdc_raw
    assert read_segment(link, idx_offset(node, 1000)) == recorder.written[1000]
    assert (node.cdc_raw_dir / "CommitLog-7-1001.log").exists()
    node.sync()
    node.close()
    assert sorted(p.name for p in node.cdc_raw_dir.iterdir()) == ["CommitLog-7-1000.log", "CommitLog-7-1000_cdc.idx"]
    assert list(node.commitlog_dir.iterdir()) == []
    assert node.cdc_raw_bytes() == sum(p.stat().st_size for p in node.cdc_raw_dir.iterdir())


def test_cassandra_4_close_completes_the_active_segment(tmp_path: Path) -> None:
    node = SimulatedNode(tmp_path, "n1", SCHEMA, "5.0-nocompat", segment_size=64 * 1024, first_segment_id=7)
    recorder = Recorder(node)
    recorder.write(cdc_mutation(1))
    node.close()
    assert idx_text(node, 7) == f"{idx_offset(node, 7)}\nCOMPLETED"
    assert read_segment(node.cdc_raw_dir / "CommitLog-8-7.log", idx_offset(node, 7)) == recorder.written[7]
    # Writing after shutdown is a restarted node: a new segment.
    assert node.write(cdc_mutation(2))[0] == 8


def test_cassandra_3_moves_only_cdc_segments_on_discard(tmp_path: Path) -> None:
    node = SimulatedNode(tmp_path, "n1", SCHEMA, "3.11", segment_size=8 * 1024, first_segment_id=1)
    recorder = Recorder(node)
    recorder.write(cdc_mutation(0))
    node.sync()
    assert list(node.cdc_raw_dir.iterdir()) == []  # nothing until the segment is discarded
    i = 1
    while recorder.write(plain_mutation(i)) == 1:
        i += 1
    assert sorted(p.name for p in node.cdc_raw_dir.iterdir()) == ["CommitLog-6-1.log"]  # moved, no idx
    assert not (node.commitlog_dir / "CommitLog-6-1.log").exists()
    assert read_segment(node.cdc_raw_dir / "CommitLog-6-1.log", None) == recorder.written[1]
    node.close()  # segment 2: only non-CDC data, deleted
    assert sorted(p.name for p in node.cdc_raw_dir.iterdir()) == ["CommitLog-6-1.log"]
    assert list(node.commitlog_dir.iterdir()) == []


@pytest.mark.parametrize("version, expected", [("3.0", 6), ("4.0", 7), ("5.0", 7), ("5.0-nocompat", 8)])
def test_commit_log_version_per_cassandra_version(tmp_path: Path, version: str, expected: int) -> None:
    node = SimulatedNode(tmp_path, "n1", SCHEMA, version, segment_size=64 * 1024, first_segment_id=3)
    node.write(cdc_mutation(1))
    assert node.active_segment is not None
    assert parse_segment_name(node.active_segment.path.name) == (expected, 3)
    node.close()


# --- statements as mutations ------------------------------------------------------------------------------


def test_insert_writes_liveness_and_cells() -> None:
    update = decoded(Insert("ks.users", {"id": 1, "name": "ann", "age": None}, timestamp=at(0)))
    assert update.key == (1).to_bytes(4, "big")
    assert column_names(update) == ["age", "name"]  # Cassandra's column order, not the statement's
    [row] = update.rows
    assert row.liveness == LivenessInfo(at(0))
    cells = cells_by_name(row.cells)
    assert cells["name"] == Cell(USERS.column(b"name"), at(0), b"ann")
    assert cells["age"].is_tombstone and cells["age"].local_deletion_time == now(0)  # type: ignore[union-attr]


@pytest.mark.parametrize("version", [6, 7, 8])
def test_ttl_makes_liveness_and_cells_expire(version: int) -> None:
    update = decoded(Insert("ks.users", {"id": 1, "name": "ann", "emails": {"a@x"}}, ttl=30, timestamp=at(0.5)),
                     version)
    [row] = update.rows
    expires = at(0.5) // SECOND + 30
    assert row.liveness == LivenessInfo(at(0.5), 30, expires)
    cells = cells_by_name(row.cells)
    assert cells["name"].ttl == 30 and cells["name"].local_deletion_time == expires  # type: ignore[union-attr]
    emails = cells["emails"]
    assert isinstance(emails, ComplexColumn)
    assert [(c.ttl, c.local_deletion_time) for c in emails.cells] == [(30, expires)]
    assert emails.deletion == DeletionTime(at(0.5) - 1, now(0))  # the overwrite's deletion does not expire


def test_update_overwrites_collections_without_liveness() -> None:
    update = decoded(Update("ks.users", {"id": 1}, {"emails": {"b@x", "a@x"}, "prefs": {"z": 1, "k": 2}},
                            timestamp=at(1)))
    [row] = update.rows
    assert row.liveness is None
    emails, prefs = (cells_by_name(row.cells)[n] for n in ("emails", "prefs"))
    assert isinstance(emails, ComplexColumn) and isinstance(prefs, ComplexColumn)
    assert emails.deletion == prefs.deletion == DeletionTime(at(1) - 1, now(1))
    assert [(c.path, c.value) for c in emails.cells] == [(b"a@x", b""), (b"b@x", b"")]
    assert [(c.path, c.value) for c in prefs.cells] == [(b"k", (2).to_bytes(4, "big")), (b"z", (1).to_bytes(4, "big"))]
    # Emptying a collection is only its deletion.
    [row] = decoded(Update("ks.users", {"id": 1}, {"tags": []}, timestamp=at(2))).rows
    assert row.cells == [ComplexColumn(USERS.column(b"tags"), [], DeletionTime(at(2) - 1, now(2)))]


def test_element_operations() -> None:
    key = {"id": 1}
    [row] = decoded(AppendToList("ks.users", key, "tags", ["x", "y"], timestamp=at(1))).rows
    [tags] = row.cells
    assert isinstance(tags, ComplexColumn) and tags.deletion is None
    paths = [uuid.UUID(bytes=c.path) for c in tags.cells]  # type: ignore[arg-type]
    assert [p.version for p in paths] == [1, 1] and paths[0].time < paths[1].time
    assert [c.value for c in tags.cells] == [b"x", b"y"]

    [row] = decoded(RemoveFromSet("ks.users", key, "emails", ["a@x"], timestamp=at(2))).rows
    [cell] = row.cells[0].cells  # type: ignore[union-attr]
    assert cell.path == b"a@x" and cell.is_tombstone and cell.local_deletion_time == now(2)

    [row] = decoded(AddToSet("ks.users", key, "emails", ["c@x"], ttl=5, timestamp=at(3))).rows
    [cell] = row.cells[0].cells  # type: ignore[union-attr]
    assert (cell.path, cell.value, cell.ttl, cell.local_deletion_time) == (b"c@x", b"", 5, now(3) + 5)

    [row] = decoded(PutInMap("ks.users", key, "prefs", {"k": 7}, timestamp=at(4))).rows
    [cell] = row.cells[0].cells  # type: ignore[union-attr]
    assert (cell.path, cell.value) == (b"k", (7).to_bytes(4, "big"))

    [row] = decoded(RemoveMapKeys("ks.users", key, "prefs", ["k"], timestamp=at(5))).rows
    [cell] = row.cells[0].cells  # type: ignore[union-attr]
    assert cell.path == b"k" and cell.is_tombstone

    [row] = decoded(SetUdtFields("ks.users", key, "home", {"zip": 75001, "street": None}, timestamp=at(6))).rows
    street, zip_code = row.cells[0].cells  # type: ignore[union-attr]
    assert street.path == b"\x00\x00" and street.is_tombstone
    assert (zip_code.path, zip_code.value) == (b"\x00\x01", (75001).to_bytes(4, "big"))


def test_deletions() -> None:
    update = decoded(DeleteColumns("ks.users", {"id": 1}, ["name", "emails"], timestamp=at(1)))
    [row] = update.rows
    cells = cells_by_name(row.cells)
    assert cells["name"].is_tombstone  # type: ignore[union-attr]
    assert cells["emails"] == ComplexColumn(USERS.column(b"emails"), [], DeletionTime(at(1), now(1)))  # at ts

    update = decoded(DeleteRow("ks.events", {"pk": 1, "ck": 2}, timestamp=at(2)))
    [row] = update.rows
    assert row.deletion == DeletionTime(at(2), now(2)) and row.cells == [] and update.regular_columns == ()
    # Without clustering columns, deleting "the row" deletes the partition.
    update = decoded(DeleteRow("ks.users", {"id": 1}, timestamp=at(3)))
    assert update.partition_deletion == DeletionTime(at(3), now(3)) and update.unfiltereds == []
    update = decoded(DeletePartition("ks.events", {"pk": 1}, timestamp=at(4)))
    assert update.partition_deletion == DeletionTime(at(4), now(4)) and update.unfiltereds == []


def test_range_deletions_are_bound_markers() -> None:
    deletion = DeletionTime(at(1), now(1))
    one, two, five = ((v).to_bytes(4, "big") for v in (1, 2, 5))
    markers = decoded(DeleteRange("ks.events", {"pk": 1}, 1, 5, start_inclusive=False, timestamp=at(1))).markers
    assert [(m.kind, m.clustering) for m in markers] == [(BoundKind.EXCL_START_BOUND, (one,)),
                                                         (BoundKind.INCL_END_BOUND, (five,))]
    assert markers[0].open_deletion == markers[1].close_deletion == deletion
    # A prefix: everything under a = 1.
    markers = decoded(DeleteRange("ks.timeline", {"pk": 1, "a": 1}, timestamp=at(1))).markers
    assert [(m.kind, m.clustering) for m in markers] == [(BoundKind.INCL_START_BOUND, (one,)),
                                                         (BoundKind.INCL_END_BOUND, (one,))]
    # b is DESC: "b > 2" runs from the top of a = 1 down to (1, 2), exclusive.
    markers = decoded(DeleteRange("ks.timeline", {"pk": 1, "a": 1}, start=2, start_inclusive=False,
                                  timestamp=at(1))).markers
    assert [(m.kind, m.clustering) for m in markers] == [(BoundKind.INCL_START_BOUND, (one,)),
                                                         (BoundKind.EXCL_END_BOUND, (one, two))]


def test_static_update_writes_only_the_static_row() -> None:
    update = decoded(Update("ks.events", {"pk": 1}, {"s": 5}, timestamp=at(1)))
    assert update.unfiltereds == [] and [c.name for c in update.static_columns] == ["s"]
    assert update.static_row is not None and update.static_row.cells == [Cell(EVENTS.column(b"s"), at(1),
                                                                              (5).to_bytes(4, "big"))]


def test_counter_contexts_carry_the_leaders_running_total() -> None:
    ledger = CounterLedger()
    leader, other = uuid.uuid4(), uuid.uuid4()
    shards = []
    for i, (node, delta) in enumerate([(leader, 5), (leader, -2), (other, 10)]):
        op = CounterAdd("ks.hits", {"page": "home"}, "n", delta, timestamp=at(i))
        shard = ledger.advance(HITS, op, node)
        [row] = decoded(op, shard=shard).rows
        [cell] = row.cells
        assert row.liveness is None and isinstance(cell, Cell) and cell.timestamp == at(i)
        assert decode_counter_context(cell.value) == [shard]
        shards.append(shard)
    assert [(s.counter_id, s.count) for s in shards] == [(leader, 5), (leader, 3), (other, 10)]
    assert shards[1].clock > shards[0].clock
    with pytest.raises(ValueError):
        to_mutation(CounterAdd("ks.hits", {"page": "home"}, "n", 1, timestamp=at(9)), SCHEMA)


# --- the table model --------------------------------------------------------------------------------------

def model(table: str, *ops: Operation) -> TableModel:
    result = TableModel(SCHEMA.table("ks", table))  # type: ignore[arg-type]
    for op in ops:
        result.apply(op)
    return result


NO_USER_VALUES = {"name": None, "age": None, "emails": None, "prefs": None, "tags": None, "home": None}


def test_model_insert_update_delete_column() -> None:
    users = model("users",
                  Insert("ks.users", {"id": 1, "name": "ann", "age": 30}, timestamp=at(1)),
                  Update("ks.users", {"id": 1}, {"age": 31}, timestamp=at(2)),
                  DeleteColumns("ks.users", {"id": 1}, ["name"], timestamp=at(3)),
                  Update("ks.users", {"id": 2}, {"name": "bob"}, timestamp=at(4)))
    assert users.rows(now(10)) == {(1,): {**NO_USER_VALUES, "id": 1, "age": 31},
                                   (2,): {**NO_USER_VALUES, "id": 2, "name": "bob"}}
    users.apply(DeleteColumns("ks.users", {"id": 1}, ["age"], timestamp=at(5)))
    users.apply(Update("ks.users", {"id": 2}, {"name": None}, timestamp=at(6)))
    # The INSERTed row stays (row marker) with all-null columns; the UPDATEd one disappears.
    assert users.rows(now(10)) == {(1,): {**NO_USER_VALUES, "id": 1}}


def test_model_ttl_expiry() -> None:
    users = model("users",
                  Insert("ks.users", {"id": 1, "name": "ann"}, ttl=10, timestamp=at(100)),
                  Insert("ks.users", {"id": 2, "name": "bob"}, timestamp=at(100)),
                  Update("ks.users", {"id": 2}, {"name": "cid"}, ttl=5, timestamp=at(101)))
    assert {k: v["name"] for k, v in users.rows(now(104)).items()} == {(1,): "ann", (2,): "cid"}
    # At 106 the TTL'd "cid" is gone and hides the older "bob"; row 2 lives on through its marker.
    assert {k: v["name"] for k, v in users.rows(now(106)).items()} == {(1,): "ann", (2,): None}
    assert {k: v["name"] for k, v in users.rows(now(110)).items()} == {(2,): None}


def test_model_partition_delete_then_reinsert() -> None:
    events = model("events",
                   Insert("ks.events", {"pk": 1, "ck": 1, "v": "a"}, timestamp=at(10)),
                   Insert("ks.events", {"pk": 1, "ck": 2, "v": "b", "s": 7}, timestamp=at(11)),
                   DeletePartition("ks.events", {"pk": 1}, timestamp=at(20)),
                   Insert("ks.events", {"pk": 1, "ck": 3, "v": "c"}, timestamp=at(30)),
                   Insert("ks.events", {"pk": 1, "ck": 4, "v": "late"}, timestamp=at(15)))  # older than the delete
    assert events.rows(now(40)) == {(1, 3): {"pk": 1, "ck": 3, "v": "c", "s": None}}


def test_model_out_of_order_timestamps() -> None:
    users = model("users",
                  Update("ks.users", {"id": 1}, {"name": "new"}, timestamp=at(200)),
                  Insert("ks.users", {"id": 1, "name": "old", "age": 5}, timestamp=at(100)),
                  DeleteRow("ks.users", {"id": 1}, timestamp=at(150)))
    # The delete (a partition deletion here) hides the INSERT at 100, not the UPDATE at 200.
    assert users.rows(now(300)) == {(1,): {**NO_USER_VALUES, "id": 1, "name": "new"}}


def test_model_collections() -> None:
    users = model("users",
                  AddToSet("ks.users", {"id": 1}, "emails", ["b", "a"], timestamp=at(1)),
                  RemoveFromSet("ks.users", {"id": 1}, "emails", ["a"], timestamp=at(2)),
                  AddToSet("ks.users", {"id": 1}, "emails", ["a"], timestamp=at(1.5)),  # older than the removal
                  AddToSet("ks.users", {"id": 1}, "emails", ["c"], timestamp=at(3)),
                  PutInMap("ks.users", {"id": 1}, "prefs", {"z": 1, "k": 2, "m": 3}, timestamp=at(1)),
                  RemoveMapKeys("ks.users", {"id": 1}, "prefs", ["m"], timestamp=at(2)),
                  AppendToList("ks.users", {"id": 1}, "tags", ["y"], timestamp=at(2)),
                  AppendToList("ks.users", {"id": 1}, "tags", ["w", "x"], timestamp=at(1)),
                  SetUdtFields("ks.users", {"id": 1}, "home", {"zip": 75001}, timestamp=at(1)))
    row = users.rows(now(10))[(1,)]
    assert row["emails"] == {"b", "c"}
    assert list(row["prefs"].items()) == [("k", 2), ("z", 1)]  # in key order, as SELECT returns it
    assert row["tags"] == ["w", "x", "y"]  # appends in timestamp order
    assert row["home"] == (None, 75001) and row["home"].zip == 75001
    # Overwriting the set hides every element written before it, even one arriving later.
    users.apply(Update("ks.users", {"id": 1}, {"emails": {"z"}}, timestamp=at(5)))
    users.apply(AddToSet("ks.users", {"id": 1}, "emails", ["y"], timestamp=at(4.5)))
    assert users.rows(now(10))[(1,)]["emails"] == {"z"}


def test_model_counters_sum_deltas() -> None:
    hits = model("hits", *(CounterAdd("ks.hits", {"page": "home"}, "n", d, timestamp=at(i))
                           for i, d in enumerate([5, -2, 10])))
    assert hits.rows(now(10)) == {("home",): {"page": "home", "n": 13, "m": None}}


def test_model_range_deletions_and_statics() -> None:
    inserts = [Insert("ks.timeline", {"pk": 1, "a": a, "b": b, "v": 10 * a + b}, timestamp=at(1))
               for a in range(3) for b in range(4)]
    timeline = model("timeline", *inserts,
                     DeleteRange("ks.timeline", {"pk": 1, "a": 1}, start=2, timestamp=at(2)),  # b >= 2
                     DeleteRange("ks.timeline", {"pk": 1, "a": 2}, timestamp=at(2)),
                     Insert("ks.timeline", {"pk": 1, "a": 1, "b": 3, "v": 99}, timestamp=at(3)))
    rows = timeline.rows(now(10))
    assert sorted(rows) == [(1, 0, 0), (1, 0, 1), (1, 0, 2), (1, 0, 3), (1, 1, 0), (1, 1, 1), (1, 1, 3)]
    assert rows[(1, 1, 3)]["v"] == 99
    # A partition with static values but no rows shows one row with null clustering columns.
    events = model("events", Update("ks.events", {"pk": 5}, {"s": 1}, timestamp=at(1)))
    assert events.rows(now(10)) == {(5, None): {"pk": 5, "ck": None, "v": None, "s": 1}}


# --- workload and cluster ---------------------------------------------------------------------------------

def test_workload_is_seeded_varied_and_strictly_increasing() -> None:
    first = Workload(SCHEMA, seed=7, keys=10, clock=Clock(T0)).take(2000)
    assert first == Workload(SCHEMA, seed=7, keys=10, clock=Clock(T0)).take(2000)
    timestamps = [op.timestamp for op in first]
    assert all(a < b for a, b in zip(timestamps, timestamps[1:]))
    kinds = collections.Counter(type(op).__name__ for op in first)
    assert set(kinds) == {"Insert", "Update", "DeleteColumns", "DeleteRow", "DeletePartition", "DeleteRange",
                          "AppendToList", "AddToSet", "RemoveFromSet", "PutInMap", "RemoveMapKeys", "SetUdtFields",
                          "CounterAdd"}
    assert kinds["Insert"] + kinds["Update"] > len(first) / 2
    assert any(getattr(op, "ttl", None) for op in first)
    for op in first[:300]:
        shard = CounterShard(uuid.uuid4(), op.timestamp, 1) if isinstance(op, CounterAdd) else None
        for version in (6, 7, 8):
            decoded(op, version, shard)  # encodes and decodes


def node_entries(node: SimulatedNode) -> list[bytes]:
    """Every entry a CDC consumer finds in a closed node's cdc_raw, in segment order."""
    entries = []
    for log in sorted(node.cdc_raw_dir.glob("*.log"), key=lambda p: parse_segment_name(p.name)[1]):  # type: ignore[index]
        entries += read_segment(log, idx_offset(node, parse_segment_name(log.name)[1]))  # type: ignore[index]
    return entries


def test_cluster_replicates_by_token_and_shuffles(tmp_path: Path) -> None:
    ops = Workload(SCHEMA, seed=3, tables=["ks.users", "ks.events", "ks.timeline"], keys=30,
                   clock=Clock(T0)).take(600)
    ordered = Cluster(tmp_path / "ordered", SCHEMA, nodes=3, rf=2, segment_size=32 * 1024)
    shuffled = Cluster(tmp_path / "shuffled", SCHEMA, nodes=3, rf=2, segment_size=32 * 1024, shuffle=True, seed=1)
    for op in ops:
        ordered.execute(op)
        shuffled.execute(op)
    for cluster in (ordered, shuffled):
        cluster.close_all()
    holders: dict[tuple[str, bytes], set[str]] = collections.defaultdict(set)
    total = 0
    for ordered_node, shuffled_node in zip(ordered.nodes, shuffled.nodes):
        entries = node_entries(ordered_node)
        assert sorted(entries) == sorted(node_entries(shuffled_node))  # same mutations, maybe reordered
        total += len(entries)
        for body in entries:
            update = MutationSerializer.deserialize(body, SCHEMA, ordered_node.version).updates[0]
            holders[(update.table.name, update.key)].add(ordered_node.node_id)
    assert total == 2 * len(ops)  # every table here has CDC: each mutation once per replica
    assert all(len(nodes) == 2 for nodes in holders.values())  # a partition always on the same two nodes
    assert len({frozenset(nodes) for nodes in holders.values()}) == 3  # and the token ring spreads them
    assert any(node_entries(a) != node_entries(b) for a, b in zip(ordered.nodes, shuffled.nodes))
    assert ordered.rows("ks.users", now(3600)) == shuffled.rows("ks.users", now(3600))
