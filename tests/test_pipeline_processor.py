"""The stateful processor on its own, micro-batch by micro-batch: replica copies dropped before the merge,
one event per real change, the state of every partition kept across batches (touched or not).

Spark's state store is replaced by an in-memory one with the same calls; the schema comes from the
schema topic as in production. The whole pipeline under Spark is tested in test_pipeline_e2e.py.
"""

from __future__ import annotations

import gc
import hashlib
import json
import pickle
import time
from typing import Any, Iterator

import pandas as pd
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from cassandra_cdc.commitlog import Mutation, MutationSerializer, PartitionUpdateSerializer
from cassandra_cdc.commitlog.io import DataInput
from cassandra_cdc.pipeline.merge import apply
from cassandra_cdc.pipeline.processor import (ChangeProcessor, ProcessorSettings, _collector_paused,
                                              _Partitions, drop_replica_copies, with_copy_identity)
from cassandra_cdc.pipeline.state import PartitionState
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Insert, Update, to_mutation
from cassandra_cdc.topics.raw import RawRecord, record_key
from cassandra_cdc.topics.schemas import SchemaRecord

SERVER = "processor"
SCHEMA = parse_schema("""CREATE TABLE app.users (id int PRIMARY KEY, name text, age int)
    WITH ID = 7d0e7a10-0000-4000-8000-00000000000c AND cdc = true;""")
NOW = time.time_ns() // 1000


def update_bytes(op: Any) -> bytes:
    return MutationSerializer.serialize(Mutation(to_mutation(op, SCHEMA).updates), 7)[1:]


def copies(op: Any, nodes: tuple[str, ...] = ("node1", "node22", "node333")) -> list[tuple[bytes, bytes]]:
    """(key, value) of each replica's raw record of one write (node ids of different lengths)."""
    update = update_bytes(op)
    return [(record_key(update), RawRecord(node, 1, 100 + i, 7, op.timestamp, update).encode())
            for i, node in enumerate(nodes)]


def damaged(value: bytes) -> bytes:
    return value[:-1] + bytes([value[-1] ^ 0xFF])


def test_copy_identity_reads_the_digest_and_checks_it_in_the_jvm(spark: Any) -> None:
    op = Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW)
    (key, good), (_, other_node) = copies(op)[:2]
    rows = [(key, good), (key, other_node), (key, damaged(good)), (key, b"\x09" + good[1:]), (b"k", b"\x01junk")]
    frame = with_copy_identity(spark.createDataFrame(rows, "key binary, value binary"))
    got = [(bytes(r["digest"]), r["intact"]) for r in frame.collect()]
    digest = hashlib.md5(update_bytes(op)).digest()
    assert got[:4] == [(digest, True), (digest, True), (digest, False), (digest, False)]
    assert got[4][1] is False


def test_drop_replica_copies_keeps_the_first_intact_copy_of_each_write() -> None:
    batch = pd.DataFrame({"key": [b"a", b"a", b"a", b"a", b"b", b"a"],
                          "digest": [b"1", b"1", b"1", b"1", b"1", b"2"],
                          "intact": [False, True, True, False, True, True],
                          "offset": [0, 1, 2, 3, 4, 5]})
    # A damaged record never hides a good copy, and is never dropped itself: it is to be reported.
    assert drop_replica_copies(batch)["offset"].tolist() == [0, 1, 3, 4, 5]


def test_the_garbage_collector_is_paused_for_a_batch_only() -> None:
    with pytest.raises(RuntimeError):
        with _collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("a failed batch")
    assert gc.isenabled()
    gc.disable()
    try:
        with _collector_paused():
            pass
        assert not gc.isenabled()  # left as the worker had it
    finally:
        gc.enable()


def test_partitions_pickled_as_objects_are_read_and_stored_as_builtins() -> None:
    """States stored before ``PartitionState.stored`` (pickled objects) are read; all are stored anew."""
    insert = update_bytes(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW))
    state = PartitionState()
    update = PartitionUpdateSerializer.deserialize(DataInput(insert), SCHEMA, 7)
    apply(state, update, SCHEMA.table("app", "users"), NOW // 1_000_000)
    old, new = pickle.dumps(state), pickle.dumps(state.stored())
    partitions = _Partitions({b"old": (None, old), b"new": (None, new)})
    assert partitions.get(b"old").__reduce__() == partitions.get(b"new").__reduce__() == state.__reduce__()
    stored = pickle.loads(partitions.dump())  # type: ignore[arg-type]
    assert {key: pickle.loads(value) for key, (_, value) in stored.items()} == {b"old": state.stored(),
                                                                                 b"new": state.stored()}


class _MemoryState:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _MemoryHandle:
    """The processor's state calls, kept per grouping key like Spark's store (``current`` is the key)."""

    def __init__(self) -> None:
        self.current: Any = None
        self.values: dict[Any, _MemoryState] = {}
        self.timers: dict[Any, list[int]] = {}

    def getValueState(self, name: str, schema: Any) -> Any:
        handle = self

        class Current:
            def __getattr__(self, attribute: str) -> Any:
                return getattr(handle.values.setdefault(handle.current, _MemoryState()), attribute)
        return Current()

    def listTimers(self) -> Iterator[int]:
        return iter(list(self.timers.get(self.current, [])))

    def registerTimer(self, expiry: int) -> None:
        self.timers.setdefault(self.current, []).append(expiry)

    def deleteTimer(self, expiry: int) -> None:
        self.timers[self.current].remove(expiry)


class _Clock:
    def __init__(self, now_ms: int = NOW // 1000) -> None:
        self.now_ms = now_ms

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.now_ms


@pytest.fixture
def processor(broker: Any, spark: Any) -> Iterator[tuple[ChangeProcessor, _MemoryHandle]]:
    record = SchemaRecord.of(SCHEMA.table("app", "users"), "node1")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(SERVER, record.encode(), record.key)
    producer.flush(30)
    processor = ChangeProcessor(ProcessorSettings(SERVER, SERVER, broker.bootstrap_servers, SERVER, f"{SERVER}.errors"))
    handle = _MemoryHandle()
    processor.init(handle)  # type: ignore[arg-type]
    yield processor, handle
    processor.close()


def run_batch(processor: ChangeProcessor, handle: _MemoryHandle,
              records: list[tuple[bytes, bytes]], bucket: int = 0) -> list[dict[str, Any]]:
    """One micro-batch of one bucket, its columns made by Spark as in the job: the events' payloads."""
    rows = [(key, value, 0, offset) for offset, (key, value) in enumerate(records)]
    raw = SparkSession.getActiveSession().createDataFrame(rows, "key binary, value binary, partition int, offset long")
    frame = with_copy_identity(raw).toPandas()
    handle.current = (bucket,)
    out = pd.concat(processor.handleInputRows((bucket,), iter([frame]), _Clock()))  # type: ignore[arg-type]
    return [json.loads(value)["payload"] for value in out["value"]]


def test_replica_copies_give_one_event_whether_in_one_batch_or_several(processor: Any) -> None:
    first = Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW)
    second = Update("app.users", {"id": 1}, {"age": 31}, timestamp=NOW + 1)
    one, two, three = copies(first)
    events = run_batch(*processor, [one, two] + copies(second) + [three])
    assert [(e["op"], e["after"]["age"]) for e in events] == [("c", 30), ("u", 31)]
    assert events[0]["source"]["node"] == "node1"  # the first copy in offset order is the one merged
    assert run_batch(*processor, copies(second)[1:]) == []  # late copies, next batch


def test_the_state_of_partitions_a_batch_does_not_touch_is_kept(processor: Any) -> None:
    run_batch(*processor, copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW))
              + copies(Insert("app.users", {"id": 2, "name": "bob", "age": 40}, timestamp=NOW)))
    run_batch(*processor, copies(Update("app.users", {"id": 2}, {"age": 41}, timestamp=NOW + 1)))
    events = run_batch(*processor, copies(Update("app.users", {"id": 1}, {"age": 31}, timestamp=NOW + 2))
                       + copies(Update("app.users", {"id": 2}, {"age": 42}, timestamp=NOW + 2)))
    assert sorted((e["before"]["id"], e["before"]["name"], e["before"]["age"], e["after"]["age"]) for e in events) == [
        (1, "ann", 30, 31), (2, "bob", 41, 42)]


def test_a_timer_expires_its_partitions_and_keeps_the_others(processor: Any) -> None:
    run_batch(*processor, copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW, ttl=5))
              + copies(Insert("app.users", {"id": 2, "name": "bob", "age": 40}, timestamp=NOW)))
    owner, handle = processor
    [timer] = handle.timers[(0,)]
    assert NOW // 1000 < timer <= NOW // 1000 + 6000
    handle.timers[(0,)].remove(timer)  # Spark drops a timer as it fires
    expired = pd.concat(owner.handleExpiredTimer((0,), _Clock(timer), None))
    events = [json.loads(value)["payload"] for value in expired["value"]]
    assert [(e["op"], e["before"]["id"]) for e in events] == [("d", 1)]
    [purge] = handle.timers[(0,)]  # what the expired row left goes after gc_grace_seconds (10 days)
    assert purge > timer + 9 * 86_400_000
    events = run_batch(*processor, copies(Update("app.users", {"id": 2}, {"age": 41}, timestamp=NOW + 1)))
    assert [(e["op"], e["before"]["name"], e["after"]["age"]) for e in events] == [("u", "bob", 41)]


def test_a_table_without_a_definition_costs_one_schema_read_per_batch(processor: Any, broker: Any,
                                                                       monkeypatch: Any) -> None:
    """Records of a table the schema topic does not define go to the errors topic, and a run of them reads
    the topic again once, not once per record; the next batch finds a definition published meanwhile."""
    late = parse_schema("""CREATE TABLE app.late (id int PRIMARY KEY, v text)
        WITH ID = 7d0e7a10-0000-4000-8000-00000000000d AND cdc = true;""")
    records = []
    for i in range(3):
        update = MutationSerializer.serialize(
            Mutation(to_mutation(Insert("app.late", {"id": i, "v": "x"}, timestamp=NOW), late).updates), 7)[1:]
        records.append((record_key(update), RawRecord("node1", 1, i, 7, NOW, update).encode()))
    change_processor, handle = processor
    reads = []
    refresh = change_processor.catalog.refresh
    monkeypatch.setattr(change_processor.catalog, "refresh", lambda: reads.append(1) or refresh())

    def topics() -> list[str]:
        rows = [(key, value, 0, offset) for offset, (key, value) in enumerate(records)]
        raw = SparkSession.getActiveSession().createDataFrame(rows, "key binary, value binary, partition int, offset long")
        handle.current = (0,)
        out = pd.concat(change_processor.handleInputRows((0,), iter([with_copy_identity(raw).toPandas()]), _Clock()))
        return list(out["topic"])

    assert topics() == [f"{SERVER}.errors"] * 3
    assert len(reads) == 1
    record = SchemaRecord.of(late.table("app", "late"), "node1")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(SERVER, record.encode(), record.key)
    producer.flush(30)
    change_processor.init(handle)  # the next micro-batch
    assert topics() == [f"{SERVER}.app.late"] * 3
