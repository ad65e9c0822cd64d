"""The stateful processor on its own, micro-batch by micro-batch: replica copies merged once, one event
per real change, the state of every partition kept across batches (touched or not), records given in
the rows or read from the offset ranges the rows name, events written to Kafka by the task.

Spark's state store is replaced by an in-memory one with the same calls, and Spark's task by the batch
ids the tests give; the schema comes from the schema topic and the events go to the broker, as in
production. The whole pipeline under Spark is tested in test_pipeline_e2e.py.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import gc
import itertools
import json
import pickle
import time
import uuid
from typing import Any, Iterator, NamedTuple

import pandas as pd
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cassandra_cdc.commitlog import Mutation, MutationSerializer
from cassandra_cdc.storage import PartitionUpdateSerializer
from cassandra_cdc.storage.binary_io import DataInput, DataOutput
from cassandra_cdc.merge.reconcile import apply
from cassandra_cdc.events.column_rules import ColumnRules
from cassandra_cdc.pipeline import change_processor, group_state
from cassandra_cdc.pipeline.change_processor import ChangeProcessor, ProcessorSettings, collector_paused
from cassandra_cdc.pipeline.group_state import PartitionPage
from cassandra_cdc.pipeline.event_sink import SinkSettings, MicroBatchTask, TaskSink
from cassandra_cdc.pipeline.kafka_source import SourceOptions
from cassandra_cdc.merge.partition_state import PartitionState
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import DeleteRange, DeleteRow, Insert, Update, to_mutation
from cassandra_cdc.kafka.raw_records import RawRecord, TruncationRecord, record_key
from cassandra_cdc.kafka.schema_records import SchemaRecord

SERVER = "processor"
SCHEMA_TOPIC = f"{SERVER}.table-schemas"
SCHEMA = parse_schema("""CREATE TABLE app.users (id int PRIMARY KEY, name text, age int)
    WITH ID = 7d0e7a10-0000-4000-8000-00000000000c AND cdc = true;""")
NOW = time.time_ns() // 1000


def update_bytes(op: Any, schema: Any = SCHEMA) -> bytes:
    return MutationSerializer.serialize(Mutation(to_mutation(op, schema).updates), 7)[1:]


def copies(op: Any, nodes: tuple[str, ...] = ("node1", "node22", "node333"),
           schema: Any = SCHEMA) -> list[tuple[bytes, bytes]]:
    """(key, value) of each replica's raw record of one write (node ids of different lengths)."""
    update = update_bytes(op, schema)
    return [(record_key(update), RawRecord(node, 1, 100 + i, 7, op.timestamp, update).encode())
            for i, node in enumerate(nodes)]


def damaged(value: bytes) -> bytes:
    return value[:-1] + bytes([value[-1] ^ 0xFF])


def test_the_garbage_collector_is_paused_for_a_batch_only() -> None:
    with pytest.raises(RuntimeError):
        with collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("a failed batch")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # left as the worker had it
    finally:
        gc.enable()


def test_partitions_pickled_as_objects_are_read_and_stored_as_builtins() -> None:
    """States stored as pickled objects (before builtins) are read; all are stored anew."""
    insert = update_bytes(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW))
    state = PartitionState()
    update = PartitionUpdateSerializer.deserialize(DataInput(insert), SCHEMA, 7)
    apply(state, update, SCHEMA.table("app", "users"), NOW // 1_000_000)
    old, new = pickle.dumps(state), state.seal()[0]
    partitions = PartitionPage({b"old": (None, old), b"new": (None, new)})
    assert partitions.get(b"old").__reduce__() == partitions.get(b"new").__reduce__() == state.__reduce__()
    stored, _ = pickle.loads(partitions.dump())  # type: ignore[arg-type]
    assert {key: value for key, (_, value, _) in stored.items()} == {b"old": new, b"new": new}


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


class _MemoryMap:
    """A ``MapState`` of one grouping key; counts its calls."""

    def __init__(self) -> None:
        self.values: dict[Any, tuple[Any, ...]] = {}
        self.calls = 0

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.calls += 1
        return self.values.get(key)

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.calls += 1
        self.values[key] = value

    def removeKey(self, key: tuple[Any, ...]) -> None:
        self.calls += 1
        self.values.pop(key, None)


class _MemoryHandle:
    """The processor's state calls, kept per grouping key like Spark's store (``current`` is the key)."""

    def __init__(self) -> None:
        self.current: Any = None
        self.values: dict[Any, _MemoryState] = {}
        self.maps: dict[Any, _MemoryMap] = {}  # the pages of each group
        self.other_maps: dict[str, dict[Any, _MemoryMap]] = {}  # the other map states by name, of each group
        self.timers: dict[Any, list[int]] = {}
        self.timer_listings = 0

    def getMapState(self, name: str, key_schema: Any, value_schema: Any) -> Any:
        handle = self

        class Current:
            def __getattr__(self, attribute: str) -> Any:
                maps = handle.maps if name == "pages" else handle.other_maps.setdefault(name, {})
                return getattr(maps.setdefault(handle.current, _MemoryMap()), attribute)
        return Current()

    def getValueState(self, name: str, schema: Any) -> Any:
        handle = self

        class Current:
            def __getattr__(self, attribute: str) -> Any:
                return getattr(handle.values.setdefault(handle.current, _MemoryState()), attribute)
        return Current()

    def listTimers(self) -> Iterator[int]:
        self.timer_listings += 1
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


class _Events:
    """The events and dead letters the processor commits, read (read_committed) as they come."""

    def __init__(self, broker: Any, topics: list[str]) -> None:
        self._consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "processor-test",
                                   "isolation.level": "read_committed", "enable.partition.eof": True})
        self._assigned: set[str] = set()
        self._next: dict[str, int] = {}  # the next offset of each topic read
        existing = self._consumer.list_topics(timeout=10).topics
        # Earlier tests wrote to the same topics: only what this one writes counts.
        self._start = {topic: self._consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
                       for topic in topics if topic in existing}

    def close(self) -> None:
        self._consumer.close()

    def read(self, topic: str) -> list[bytes]:
        """The records of ``topic`` (one partition) committed since the last read: up to its last stable
        offset, which a read_committed consumer's position passes once the transaction's marker is read (a
        partition's end is reported only once after each record read, so waiting for it can wait in vain)."""
        partition = TopicPartition(topic, 0)
        if topic not in self._assigned:
            if topic not in self._consumer.list_topics(timeout=10).topics:
                return []
            self._assigned.add(topic)
            self._next[topic] = self._start.get(topic, 0)
            self._consumer.incremental_assign([TopicPartition(topic, 0, self._next[topic])])
        _, stable_end = self._consumer.get_watermark_offsets(partition, timeout=10)
        values, self.keys = [], []
        deadline = time.monotonic() + 30
        while self._next[topic] < stable_end:
            assert time.monotonic() < deadline, f"{topic} not read to its last stable offset {stable_end}"
            message = self._consumer.poll(0.2)
            if message is not None and not message.error() and message.topic() == topic:
                values.append(message.value())
                self.keys.append(message.key())
            position = self._consumer.position([partition])[0].offset
            self._next[topic] = max(self._next[topic], position)
        return values


def started_processor(broker: Any, monkeypatch: Any, tables: list[Any],
                      **settings: Any) -> tuple[ChangeProcessor, _MemoryHandle]:
    """A processor writing JSON events, the definitions of ``tables`` on its schema topic; ``settings``
    other ``ProcessorSettings``."""
    with Producer({"bootstrap.servers": broker.bootstrap_servers}) as producer:
        for table in tables:
            record = SchemaRecord.of(table, "node1")
            producer.produce(SCHEMA_TOPIC, record.encode(), record.key)
    query = uuid.uuid4().hex  # each test writes as a query of its own: its markers are its own
    sink = SinkSettings(broker.bootstrap_servers, f"{SERVER}.commits", f"test-{query}", topic_partitions=1)
    processor_settings = ProcessorSettings(SERVER, SERVER, broker.bootstrap_servers, (SCHEMA_TOPIC,),
                                           f"{SERVER}.errors", sink=sink,
                                           **settings)  # type: ignore[arg-type]
    processor = ChangeProcessor(processor_settings)
    batch_ids = itertools.count()
    monkeypatch.setattr(MicroBatchTask, "current",
                        classmethod(lambda cls: MicroBatchTask(processor.batch_id, 0, query)))
    processor.batch_id = next(batch_ids)  # type: ignore[attr-defined]
    processor.next_batch = lambda: setattr(processor, "batch_id", next(batch_ids))  # type: ignore[attr-defined]
    names = [table.qualified_name for table in tables] + ["app.late", "errors"]
    topics = [f"{SERVER}.{name}" for name in names]
    processor.events = _Events(broker, topics)  # type: ignore[attr-defined]
    handle = _MemoryHandle()
    processor.init(handle)  # type: ignore[arg-type]
    return processor, handle


@pytest.fixture
def processor(broker: Any, spark: Any, monkeypatch: Any) -> Iterator[tuple[ChangeProcessor, _MemoryHandle]]:
    started = started_processor(broker, monkeypatch, [SCHEMA.table("app", "users")])
    yield started
    started[0].close()
    started[0].events.close()  # type: ignore[attr-defined]


def run_task(processor: ChangeProcessor, call: Any, topic: str = f"{SERVER}.app.users") -> list[dict[str, Any]]:
    """One task of one micro-batch: ``call``, then the task's end; the payloads of the events it committed."""
    processor.init(processor.handle)
    call()
    processor.close()
    processor.next_batch()  # type: ignore[attr-defined]
    values = processor.events.read(topic)  # type: ignore[attr-defined]
    payloads = []
    for value, following in zip(values, values[1:] + [b""]):
        if value is not None:
            payload = json.loads(value)["payload"]
            # output.tombstones, on by default: a d, and only a d, is followed by a tombstone (null value)
            assert (payload["op"] == "d") == (following is None), payload
            payloads.append(payload)
    return payloads


def kafka_rows(records: list[tuple[bytes, bytes]], partition: int = 0) -> pd.DataFrame:
    """``(key, value)`` records as the rows Spark's ``kafka`` format gives them: one raw partition, in offset
    order."""
    return pd.DataFrame({"key": [key for key, _ in records], "value": [value for _, value in records],
                         "partition": [partition] * len(records), "offset": list(range(len(records)))})


def run_batch(processor: ChangeProcessor, handle: _MemoryHandle, records: list[tuple[bytes, bytes]], group: int = 0,
              topic: str = f"{SERVER}.app.users") -> list[dict[str, Any]]:
    """One micro-batch of one group (the group of raw partition ``group``), its records in the rows as Spark's
    ``kafka`` format gives them."""
    frame = kafka_rows(records, group)
    handle.current = (group,)
    return run_task(processor, lambda: list(processor.handleInputRows((group,), iter([frame]), _Clock())), topic)


def test_replica_copies_give_one_event_whether_in_one_batch_or_several(processor: Any) -> None:
    first = Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW)
    second = Update("app.users", {"id": 1}, {"age": 31}, timestamp=NOW + 1)
    one, two, three = copies(first)
    events = run_batch(*processor, [one, two] + copies(second) + [three])
    assert [(e["op"], e["after"]["age"]) for e in events] == [("c", 30), ("u", 31)]
    assert events[0]["source"]["node"] == "node1"  # the first copy in offset order is the one merged
    assert run_batch(*processor, copies(second)[1:]) == []  # late copies, next batch


def test_copies_in_a_later_batch_read_their_page_and_write_nothing(processor: Any) -> None:
    """Agents lag apart: a write's copies reach later micro-batches than the write. Their page is read, their
    digests found beside the partitions' states, and nothing is written back."""
    owner, handle = processor
    insert = Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW)
    first, *late = copies(insert)
    assert [e["op"] for e in run_batch(*processor, [first])] == ["c"]
    pages = handle.maps[(0,)]
    written, pages.calls = dict(pages.values), 0
    assert run_batch(*processor, late) == []
    assert pages.calls == 1  # the page read; nothing written
    assert pages.values == written


def test_a_page_stored_with_the_digests_inside_the_states_still_knows_its_copies() -> None:
    """Pages written before the digests were kept beside the states: a copy is recognized from the state,
    opened, and the page is stored anew in the current form."""
    insert = update_bytes(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW))
    state = PartitionState()
    update = PartitionUpdateSerializer.deserialize(DataInput(insert), SCHEMA, 7)
    apply(state, update, SCHEMA.table("app", "users"), NOW // 1_000_000, digest=b"d" * 16)
    sealed = state.seal()[0]
    older = PartitionPage({b"key": (None, pickle.dumps(pickle.loads(sealed) + (state.digests,)))})
    assert older.seen(b"key", b"d" * 16) and not older.seen(b"key", b"e" * 16)
    assert older.changed
    stored, _ = pickle.loads(older.dump())  # type: ignore[arg-type]
    assert stored[b"key"] == (None, sealed, (b"d" * 16,))
    current = PartitionPage(stored)
    assert current.seen(b"key", b"d" * 16) and not current.changed


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
    events = run_task(owner, lambda: list(owner.handleExpiredTimer((0,), _Clock(timer), None)))
    assert [(e["op"], e["before"]["id"]) for e in events] == [("d", 1)]
    [purge] = handle.timers[(0,)]  # what the expired row left goes after gc_grace_seconds (10 days)
    assert purge > timer + 9 * 86_400_000
    events = run_batch(*processor, copies(Update("app.users", {"id": 2}, {"age": 41}, timestamp=NOW + 1)))
    assert [(e["op"], e["before"]["name"], e["after"]["age"]) for e in events] == [("u", "bob", 41)]


def test_a_group_records_its_timer_and_never_asks_spark_for_it(processor: Any) -> None:
    owner, handle = processor
    ann = Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW, ttl=5)
    run_batch(*processor, copies(ann))
    [timer] = handle.timers[(0,)]
    bob = Insert("app.users", {"id": 2, "name": "bob", "age": 40}, timestamp=NOW, ttl=60)
    run_batch(*processor, copies(bob))
    assert handle.timers[(0,)] == [timer]  # the earliest expiry is still the first row's
    handle.timers[(0,)].remove(timer)  # Spark drops a timer as it fires
    run_task(owner, lambda: list(owner.handleExpiredTimer((0,), _Clock(timer), None)))
    [later] = handle.timers[(0,)]  # the second row's expiry, registered after the first one's fired
    assert timer + 50_000 < later <= timer + 61_000
    assert handle.timer_listings == 0


def whole_group_value(handle: _MemoryHandle, group: Any, timer: int | None | str) -> tuple[bytes]:
    """The group's partitions as one value, as the layout before pages stored them: ``(timer, partitions)``,
    or the partitions alone (``timer`` "unrecorded": before groups recorded their timer)."""
    partitions: dict[bytes, tuple[int | None, bytes]] = {}
    for value in handle.maps[group].values.values():
        partitions.update(pickle.loads(value[0])[0])
    return (pickle.dumps(partitions if timer == "unrecorded" else (timer, partitions)),)


def test_a_group_stored_before_timers_were_recorded_asks_spark_once(processor: Any) -> None:
    owner, handle = processor
    ann = Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW, ttl=5)
    run_batch(*processor, copies(ann))
    [timer] = handle.timers[(0,)]
    handle.values[(0,)].value = whole_group_value(handle, (0,), "unrecorded")
    handle.maps.pop((0,))
    bob = Insert("app.users", {"id": 2, "name": "bob", "age": 40}, timestamp=NOW)
    events = run_batch(*processor, copies(bob))
    assert [e["after"]["id"] for e in events] == [2] and handle.timers[(0,)] == [timer]
    run_batch(*processor, copies(Update("app.users", {"id": 2}, {"age": 41}, timestamp=NOW + 1)))
    assert handle.timer_listings == 1 and handle.timers[(0,)] == [timer]


def test_a_group_stored_whole_is_paged_as_it_is_written_and_its_partitions_merge_on(processor: Any) -> None:
    """A checkpoint of the layout before pages: each group one value; the processor reads it and pages it."""
    owner, handle = processor
    ann = Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW, ttl=5)
    keys = range(2, 40)
    run_batch(*processor, copies(ann) + [copy for key in keys for copy in copies(
        Insert("app.users", {"id": key, "name": f"user{key}", "age": key}, timestamp=NOW))])
    [timer] = handle.timers[(0,)]
    handle.values[(0,)].value = whole_group_value(handle, (0,), timer)
    handle.maps.pop((0,))
    events = run_batch(*processor, copies(Update("app.users", {"id": 7}, {"age": 70}, timestamp=NOW + 1)))
    assert [(e["before"]["name"], e["before"]["age"], e["after"]["age"]) for e in events] == [
        ("user7", 7, 70)]
    pages = handle.maps[(0,)].values
    assert len(pages) > 1 and sum(len(pickle.loads(value[0])[0]) for value in pages.values()) == len(keys) + 1
    assert handle.timers[(0,)] == [timer] and handle.timer_listings == 0
    index = handle.values[(0,)].value[0]
    assert pickle.loads(index)[0] == "split pages"  # the group's value is now the index of its pages
    handle.timers[(0,)].remove(timer)
    events = run_task(owner, lambda: list(owner.handleExpiredTimer((0,), _Clock(timer), None)))
    assert [(e["op"], e["before"]["id"]) for e in events] == [("d", 1)]


def test_a_batch_reads_and_writes_only_the_pages_of_the_partitions_it_touches(processor: Any) -> None:
    owner, handle = processor
    keys = range(1, 1001)  # on every page, and too few for the pages to split
    run_batch(*processor, [copy for key in keys for copy in copies(
        Insert("app.users", {"id": key, "name": f"user{key}", "age": 1}, timestamp=NOW))])
    pages = handle.maps[(0,)]
    assert len(pages.values) == owner.settings.state_pages
    before = dict(pages.values)
    pages.calls = 0
    events = run_batch(*processor, copies(Update("app.users", {"id": 5}, {"age": 2}, timestamp=NOW + 1))
                       + copies(Update("app.users", {"id": 900}, {"age": 2}, timestamp=NOW + 1)))
    assert sorted((e["before"]["name"], e["after"]["age"]) for e in events) == [("user5", 2), ("user900", 2)]
    assert pages.calls == 4  # two pages, each read once and written once
    assert sum(before[page] != pages.values[page] for page in pages.values) == 2
    assert index_of(handle).stored_bytes == sum(len(value[0]) for value in pages.values.values())
    assert index_of(handle).expiries == {}  # no timer, no expiry


class Index(NamedTuple):
    """A group's index as ``PagedGroup.index`` stores it."""
    kind: str
    timer: int | None
    level: int
    split: int
    stored_bytes: int
    expiries: dict[int, int]
    truncations: dict[bytes, Any]
    truncation_events: dict[bytes, int]


def index_of(handle: _MemoryHandle, group: Any = (0,)) -> Index:
    return Index(*pickle.loads(handle.values[group].value[0]))


def test_pages_split_as_the_group_grows_and_every_partition_is_found_merged_and_expired(
        processor: Any, monkeypatch: Any) -> None:
    """A group that starts with 4 pages of at most 2 KB on average splits its pages, one after the other, as
    its partitions come: each key is then on its page for the number of splits made, with its state and
    its expiry (the pages' expiries in buckets of 8 pages)."""
    owner, handle = processor
    monkeypatch.setattr(group_state, "PAGE_BYTES", 2048)
    monkeypatch.setattr(group_state, "EXPIRY_BUCKET_PAGES", 8)
    owner.settings = dataclasses.replace(owner.settings, state_pages=4)
    keys = range(1, 601)
    for first in range(1, 601, 100):  # batches of 100 new keys
        run_batch(*processor, [copy for key in range(first, first + 100) for copy in copies(
            Insert("app.users", {"id": key, "name": f"user{key}", "age": 1}, timestamp=NOW, ttl=60 if key % 7 else 5))])
    pages = handle.maps[(0,)].values
    index = index_of(handle)
    assert len(pages) == (4 << index.level) + index.split and index.level >= 3  # rounds of splits, and more
    assert index.stored_bytes == sum(len(value[0]) for value in pages.values())
    assert 2048 * (len(pages) - 1) < index.stored_bytes <= 2048 * len(pages)  # as many pages as that needs
    assert sorted(index.expiries) == list(range((len(pages) + 7) // 8))  # every bucket has a page with a TTL
    placed = {key: page for (page,), value in pages.items() for key in pickle.loads(value[0])[0]}
    assert len(placed) == len(keys)
    assert all(placed[key] == group_state.PagedGroup(None, None, None, 4, handle.values[(0,)].value[0],  # type: ignore
                                                     lambda table: None).page_number(key) for key in placed)
    events = run_batch(*processor, [copy for key in keys for copy in copies(
        Update("app.users", {"id": key}, {"age": 2}, timestamp=NOW + 1))])
    assert sorted((e["before"]["id"], e["before"]["age"], e["after"]["age"]) for e in events) == [
        (key, 1, 2) for key in keys]
    [timer] = handle.timers[(0,)]
    handle.timers[(0,)].remove(timer)  # Spark drops a timer as it fires
    events = run_task(owner, lambda: list(owner.handleExpiredTimer((0,), _Clock(timer), None)))
    assert sorted(e["before"]["id"] for e in events) == [key for key in keys if key % 7 == 0]


def test_a_batch_whose_keys_alternate_between_pages_reads_and_writes_each_page_once(
        processor: Any, monkeypatch: Any) -> None:
    """Pages read beyond the memory bound are written back; merged in the order of their pages, a batch's
    records never need one written back again, however the keys of its records alternate."""
    owner, handle = processor
    monkeypatch.setattr(group_state, "PAGES_IN_MEMORY_BYTES", 1)  # one page read at a time
    keys = (1, 2, 4, 5)  # one page each of the 256
    run_batch(*processor, [copy for key in keys for copy in copies(
        Insert("app.users", {"id": key, "name": f"user{key}", "age": 1}, timestamp=NOW))])
    updates = [Update("app.users", {"id": key}, {"age": age}, timestamp=NOW + age)
               for age in (2, 3, 4) for key in keys]
    pages = handle.maps[(0,)]
    pages.calls = 0
    events = run_batch(*processor, [copy for update in updates for copy in copies(update)])
    assert pages.calls == 2 * len(keys)  # each page read once and written once
    assert sorted((e["after"]["id"], e["before"]["age"], e["after"]["age"]) for e in events) == [
        (key, age - 1, age) for key in keys for age in (2, 3, 4)]
    assert [(e["before"]["age"], e["after"]["age"]) for e in events if e["after"]["id"] == 1] == [
        (1, 2), (2, 3), (3, 4)]  # each key's records in their order
    events = run_batch(*processor, [copy for key in keys for copy in copies(
        Update("app.users", {"id": key}, {"age": 5}, timestamp=NOW + 5))])
    assert sorted((e["after"]["id"], e["before"]["age"]) for e in events) == [(key, 4) for key in keys]


CARTS = parse_schema("""CREATE TABLE app.carts (id int, line int, owner text static, qty int,
    PRIMARY KEY (id, line)) WITH ID = 7d0e7a10-0000-4000-8000-00000000000e AND cdc = true;""")


@pytest.mark.parametrize("static_only_rows", ["skip", "emit"])
def test_skipped_static_only_rows_leave_no_key_with_a_null_clustering_column(
        broker: Any, spark: Any, monkeypatch: Any, static_only_rows: str) -> None:
    """output.static_only_rows=skip, for JDBC sinks (a NOT NULL primary key): a partition with static values
    and no rows gives no event; its static values come with its real rows."""
    owner, handle = started_processor(broker, monkeypatch, [CARTS.table("app", "carts")],
                                      static_only_rows=static_only_rows)
    topic = f"{SERVER}.app.carts"
    try:
        events = []
        for op in (Update("app.carts", {"id": 1}, {"owner": "ann"}, timestamp=NOW),
                   Insert("app.carts", {"id": 1, "line": 1, "qty": 2}, timestamp=NOW + 1),
                   DeleteRow("app.carts", {"id": 1, "line": 1}, timestamp=NOW + 2)):
            events += run_batch(owner, handle, copies(op, schema=CARTS), topic=topic)
        lines = [(e["op"], (e["after"] or e["before"])["line"]) for e in events]
        if static_only_rows == "skip":
            assert lines == [("c", 1), ("d", 1)]
            assert events[0]["after"] == {"id": 1, "line": 1, "owner": "ann", "qty": 2}
        else:  # as SELECT * shows the partition: a row with a null line while it has no other
            assert lines == [("c", None), ("d", None), ("c", 1), ("c", None), ("d", 1)]
    finally:
        owner.close()
        owner.events.close()  # type: ignore[attr-defined]


def test_column_options_reach_every_event_and_keep_dead_letters_without_the_record(
        broker: Any, spark: Any, monkeypatch: Any) -> None:
    """output.column_exclude_list, the masks and skipped_operations, in the task: no event carries an excluded
    column or an unmasked value, no skipped operation is written, and a dead letter (which cannot have them
    applied) names its record without its bytes."""
    rules = ColumnRules(exclude=(r"app\.users\.age",), mask=((3, (r"app\.users\.name",)),))
    owner, handle = started_processor(broker, monkeypatch, [SCHEMA.table("app", "users")], columns=rules,
                                      skipped_operations=frozenset({"u"}))
    try:
        inserted = run_batch(owner, handle, copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30},
                                                          timestamp=NOW)))
        assert [(e["op"], e["before"], e["after"]) for e in inserted] == [
            ("c", None, {"id": 1, "name": "***"})]
        assert run_batch(owner, handle, copies(Update("app.users", {"id": 1}, {"age": 31},
                                                      timestamp=NOW + 1))) == []
        damaged_copy = copies(Update("app.users", {"id": 1}, {"name": "bob"}, timestamp=NOW + 2))[0]
        deleted = run_batch(owner, handle, [(damaged_copy[0], damaged(damaged_copy[1])),
                                            *copies(DeleteRow("app.users", {"id": 1}, timestamp=NOW + 3))])
        assert [(e["op"], e["before"], e["after"]) for e in deleted] == [
            ("d", {"id": 1, "name": "***"}, None)]
        errors = owner.events.read(f"{SERVER}.errors")  # type: ignore[attr-defined]
        [error] = [json.loads(value) for value in errors]
        assert (error["reason"], error["value"], base64.b64decode(error["key"])) == (
            "raw record digest does not match its partition update bytes", None, damaged_copy[0])
    finally:
        owner.close()
        owner.events.close()  # type: ignore[attr-defined]


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
        events = run_batch(change_processor, handle, records, topic=f"{SERVER}.app.late")
        errors = change_processor.events.read(f"{SERVER}.errors")  # type: ignore[attr-defined]
        return [f"{SERVER}.app.late"] * len(events) + [f"{SERVER}.errors"] * len(errors)

    assert topics() == [f"{SERVER}.errors"] * 3
    assert len(reads) == 2  # at the batch's start, and once for the run of records: not once per record
    record = SchemaRecord.of(late.table("app", "late"), "node1")
    with Producer({"bootstrap.servers": broker.bootstrap_servers}) as producer:
        producer.produce(SCHEMA_TOPIC, record.encode(), record.key)
    assert topics() == [f"{SERVER}.app.late"] * 3  # the next micro-batch


def test_a_damaged_copy_is_reported_and_never_hides_a_good_one(processor: Any) -> None:
    change_processor, _ = processor
    first, second, third = copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW))
    events = run_batch(*processor, [(first[0], damaged(first[1])), second, (third[0], damaged(third[1]))])
    assert [(e["op"], e["source"]["node"]) for e in events] == [("c", "node22")]
    errors = [json.loads(value) for value in change_processor.events.read(f"{SERVER}.errors")]
    assert [error["reason"] for error in errors] == ["raw record digest does not match its partition update bytes"] * 2


def is_an_update_cassandra_writes(update: bytes) -> bool:
    """Whether ``update`` is exactly the commit log writer's encoding of a partition update (which
    test_real_segments.py checks is Cassandra's own, byte for byte), judged by that writer alone."""
    try:
        decoded = PartitionUpdateSerializer.deserialize(DataInput(update), SCHEMA, 7)
    except (ValueError, IndexError):
        return False
    written = DataOutput()
    PartitionUpdateSerializer.serialize(decoded, written, 7)
    return bytes(written) == update


USERS_ID = SCHEMA.table("app", "users").id.bytes
# What follows the table id: anything, or a well-formed key of the table (an int) and then anything.
RANDOM_UPDATE_BODIES = st.one_of(st.binary(max_size=80), st.builds(
    lambda key, rest: b"\x04" + key.to_bytes(4, "big", signed=True) + rest, st.integers(-2**31, 2**31 - 1),
    st.binary(max_size=80)))


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(bodies=st.lists(RANDOM_UPDATE_BODIES, min_size=1, max_size=8))
def test_random_update_bytes_under_a_valid_header_are_dead_lettered_never_merged(
        processor: Any, monkeypatch: Any, bodies: list[bytes]) -> None:
    """A raw record's header is checked by its digest; what the digest covers must also be an update of
    the record's table, read to its last byte. Bytes that are not go to the errors topic; none makes an
    event or any merge state."""
    change_processor, handle = processor
    written: list[tuple[str, bytes | None]] = []  # what the task hands its sink (which writes it to Kafka)
    produce = TaskSink.produce
    monkeypatch.setattr(TaskSink, "produce", lambda sink, topic, key, value: written.append((topic, value))
                        or produce(sink, topic, key, value))
    updates = [USERS_ID + body for body in bodies if not is_an_update_cassandra_writes(USERS_ID + body)]
    records = []
    for update in updates:
        try:
            key = record_key(update)  # what the agent keys the record with
        except IndexError:
            key = USERS_ID
        records.append((key, RawRecord("node1", 1, 100, 7, NOW, update).encode()))
    frame = kafka_rows(records)
    handle.current = (0,)
    change_processor.init(handle)  # type: ignore[arg-type]
    list(change_processor.handleInputRows((0,), iter([frame]), _Clock()))
    change_processor.close()
    change_processor.next_batch()  # type: ignore[attr-defined]
    assert {topic for topic, _ in written} <= {f"{SERVER}.errors"}
    errors = [json.loads(value) for _, value in written]  # type: ignore[arg-type]
    # Each record once; records of different keys in any order (merged in the order of their pages).
    dead_letters = [base64.b64decode(error["value"]) for error in errors]
    assert sorted(dead_letters) == sorted(value for _, value in records)
    assert all(error["reason"] for error in errors)
    assert not any(state.exists() for state in handle.values.values())


def test_an_update_the_merge_refuses_is_dead_lettered_and_the_batch_goes_on(broker: Any, spark: Any,
                                                                           monkeypatch: Any) -> None:
    """An update that decodes but cannot be merged (a range deletion that is never closed) is set aside on
    the errors topic, as an undecodable one is, instead of failing the task on every retry; the batch's
    other records are merged."""
    schema = parse_schema("""CREATE TABLE app.visits (id int, day int, page text, PRIMARY KEY (id, day))
        WITH ID = 7d0e7a10-0000-4000-8000-00000000000f AND cdc = true;""")
    owner, handle = started_processor(broker, monkeypatch, [schema.table("app", "visits")])
    try:
        [unclosed] = to_mutation(DeleteRange("app.visits", {"id": 1}, start=3, end=9, timestamp=NOW), schema).updates
        unclosed.unfiltereds.pop()  # the closing bound
        unclosed_bytes = MutationSerializer.serialize(Mutation([unclosed]), 7)[1:]
        insert = MutationSerializer.serialize(Mutation(to_mutation(
            Insert("app.visits", {"id": 1, "day": 4, "page": "home"}, timestamp=NOW + 1), schema).updates), 7)[1:]
        records = [(record_key(update), RawRecord("node1", 1, 100 + i, 7, NOW, update).encode())
                   for i, update in enumerate((unclosed_bytes, insert))]
        frame = kafka_rows(records)
        owner.init(handle)
        list(owner.handleInputRows((0,), iter([frame]), _Clock()))
        owner.close()
        [event] = owner.events.read(f"{SERVER}.app.visits")  # type: ignore[attr-defined]
        assert json.loads(event)["payload"]["after"] == {"id": 1, "day": 4, "page": "home"}
        [error] = [json.loads(value) for value in owner.events.read(f"{SERVER}.errors")  # type: ignore[attr-defined]
                   if json.loads(value)["value"] == base64.b64encode(records[0][1]).decode()]
        assert "cannot merge" in error["reason"] and "never closed" in error["reason"]
    finally:
        owner.close()
        owner.events.close()  # type: ignore[attr-defined]


def test_rows_naming_offset_ranges_are_read_from_the_raw_topic(processor: Any, broker: Any) -> None:
    """With the Python source, the rows name offsets of the raw topic: the task reads them itself."""
    change_processor, handle = processor
    raw = f"{SERVER}.raw-{uuid.uuid4().hex[:8]}"
    broker.create_topic(raw, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    writes = [Insert("app.users", {"id": i, "name": f"u{i}", "age": i}, timestamp=NOW) for i in range(4)]
    writes.append(Update("app.users", {"id": 0}, {"age": 10}, timestamp=NOW + 1))  # merged after its insert
    for op in writes:
        for key, value in copies(op):
            producer.produce(raw, value, key, partition=1)
    producer.produce(raw, b"not a raw record", b"k", partition=1)
    assert producer.flush(30) == 0
    producer.close()
    change_processor.settings = dataclasses.replace(change_processor.settings, ranges=SourceOptions.parse(
        {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": raw, "emit": "offsetRanges"}))
    # Two ranges of one partition, as two micro-batches would name them, given in one call out of order.
    frame = pd.DataFrame({"topic": [raw, raw], "partition": [1, 1], "startOffset": [6, 0],
                          "endOffset": [16, 6]})
    handle.current = (1,)
    events = run_task(change_processor, lambda: list(change_processor.handleInputRows((1,), iter([frame]), _Clock())))
    # Each key's events in the order of its records' offsets (different keys' in any order).
    assert sorted(((e["op"], e["after"]["id"], e["after"]["age"]) for e in events), key=lambda e: e[1]) == [
        ("c", 0, 0), ("u", 0, 10), ("c", 1, 1), ("c", 2, 2), ("c", 3, 3)]
    [error] = change_processor.events.read(f"{SERVER}.errors")
    assert json.loads(error)["value"] == base64.b64encode(b"not a raw record").decode()


def test_a_replayed_task_rebuilds_its_state_without_writing_its_events_again(processor: Any) -> None:
    """Spark runs a batch again when the task, or the driver, failed after the events were committed but
    before the state or the checkpoint were: the task merges again from the state before the batch, and
    writes nothing, its events being committed already. A failed task's events are never seen."""
    change_processor, handle = processor
    run_batch(*processor, copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW)))
    before = copy.deepcopy((handle.values, handle.maps, handle.other_maps, handle.timers))
    replayed_batch = change_processor.batch_id
    update = copies(Update("app.users", {"id": 1}, {"age": 31}, timestamp=NOW + 1))
    assert [e["after"]["age"] for e in run_batch(*processor, update)] == [31]
    handle.values, handle.maps, handle.other_maps, handle.timers = before  # the state store as it was before the batch
    change_processor.batch_id = replayed_batch
    assert run_batch(*processor, update) == []
    events = run_batch(*processor, copies(Update("app.users", {"id": 1}, {"name": "bo"}, timestamp=NOW + 2)))
    assert [(e["before"]["age"], e["after"]["age"], e["after"]["name"]) for e in events] == [(31, 31, "bo")]

    # A task that fails half-way: what it produced is aborted; its retry writes everything once.
    decode = change_processor._decode
    calls = itertools.count()

    def failing_decode(*record: Any) -> Any:
        if next(calls) == 1:
            raise RuntimeError("the executor is lost")
        return decode(*record)

    two = copies(Update("app.users", {"id": 1}, {"age": 40}, timestamp=NOW + 3)) \
        + copies(Insert("app.users", {"id": 2, "name": "cy", "age": 5}, timestamp=NOW + 3))
    before = copy.deepcopy((handle.values, handle.maps, handle.other_maps, handle.timers))
    change_processor._decode = failing_decode  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="executor is lost"):
        change_processor.init(handle)  # type: ignore[arg-type]
        list(change_processor.handleInputRows((0,), iter([pd.DataFrame({
            "key": [k for k, _ in two], "value": [v for _, v in two], "partition": [0] * 6,
            "offset": list(range(6))})]), _Clock()))
    assert change_processor.events.read(f"{SERVER}.app.users") == []
    change_processor._decode = decode  # type: ignore[method-assign]
    handle.values, handle.maps, handle.other_maps, handle.timers = before
    events = run_batch(*processor, two)
    assert sorted((e["op"], e["after"]["id"], e["after"]["age"]) for e in events) == [
        ("c", 2, 5), ("u", 1, 40)]


def truncation_copies(at_ms: int, table: Any = SCHEMA.table("app", "users"),
                      nodes: tuple[str, ...] = ("node1", "node22", "node333")) -> list[tuple[bytes, bytes]]:
    """(key, value) of each node's truncation record of one TRUNCATE: each node's clock a little later."""
    records = [TruncationRecord(node, table.id.bytes, 5, 400 + i, at_ms + 3 * i)
               for i, node in enumerate(nodes)]
    return [(record.key(), record.encode()) for record in records]


def test_a_truncation_deletes_the_table_without_row_events_and_later_writes_live(processor: Any) -> None:
    """The nodes' truncation records give one ``t`` event (no row in its key, no tombstone after it), no
    event per row; a late copy of a write made before the truncation stays deleted, in a partition the group
    held and in one it meets only now; writes after it live, on partitions that start empty."""
    change_processor, handle = processor
    run_batch(*processor, copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW))
              + copies(Insert("app.users", {"id": 2, "name": "bob", "age": 40}, timestamp=NOW)))
    truncated_ms = NOW // 1000 + 10
    late_ann, late_cy = (copies(op, nodes=("node4444",))[0] for op in (
        Update("app.users", {"id": 1}, {"age": 31}, timestamp=NOW + 5),
        Insert("app.users", {"id": 3, "name": "cy", "age": 50}, timestamp=NOW + 5)))
    after_ms = (truncated_ms + 10) * 1000
    events = run_batch(*processor, truncation_copies(truncated_ms)[:2] + [late_ann, late_cy]
                       + copies(Insert("app.users", {"id": 1, "name": "ann", "age": 32}, timestamp=after_ms))
                       + truncation_copies(truncated_ms)[2:])
    assert [(e["op"], e["before"], e["after"] and e["after"]["age"]) for e in events] == [
        ("t", None, None), ("c", None, 32)]
    assert events[0]["source"] | {"version": None} == {
        "version": None, "connector": "cassandra_cdc", "name": SERVER, "ts_ms": truncated_ms,
        "snapshot": "false", "db": "app", "sequence": None, "ts_us": truncated_ms * 1000,
        "ts_ns": truncated_ms * 1_000_000, "cluster": SERVER, "keyspace": "app", "table": "users",
        "node": "node1", "segment": 5, "position": 400}
    key = json.loads(change_processor.events.keys[0])  # a key converters read as null: no row
    assert key["payload"] is None and key["schema"]["optional"] and key["schema"]["name"] == f"{SERVER}.app.users.Key"
    events = run_batch(*processor, copies(Update("app.users", {"id": 2}, {"age": 41}, timestamp=after_ms)))
    assert [(e["op"], e["before"], e["after"]) for e in events] == [
        ("c", None, {"id": 2, "name": None, "age": 41})]
    events = run_batch(*processor, copies(Insert("app.users", {"id": 3, "name": "cy", "age": 50},
                                                 timestamp=NOW)))
    assert events == []  # another late copy of a write the truncation deleted


def test_a_truncation_is_applied_by_every_group_and_written_by_raw_partition_0s(processor: Any) -> None:
    """Every group deletes its partitions of the table; the event comes from the group of raw partition 0
    alone, whichever receives the records first."""
    ann = copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30}, timestamp=NOW))
    truncated_ms = NOW // 1000 + 10
    run_batch(*processor, ann, group=1)
    assert run_batch(*processor, truncation_copies(truncated_ms), group=1) == []
    events = run_batch(*processor, copies(Update("app.users", {"id": 1}, {"age": 31},
                                                 timestamp=(truncated_ms + 10) * 1000)), group=1)
    assert [(e["op"], e["after"]) for e in events] == [("c", {"id": 1, "name": None, "age": 31})]
    assert [e["op"] for e in run_batch(*processor, truncation_copies(truncated_ms), group=0)] == ["t"]


def test_a_replayed_truncation_writes_no_second_event_and_a_later_one_writes_one(processor: Any) -> None:
    """A batch replayed from the state before it writes nothing again; a node's copy arriving late, within
    Cassandra's truncate timeout of the one written, is the same truncation; one after it is another."""
    change_processor, handle = processor
    truncated_ms = NOW // 1000
    before = copy.deepcopy((handle.values, handle.maps, handle.other_maps, handle.timers))
    replayed_batch = change_processor.batch_id
    assert [e["op"] for e in run_batch(*processor, truncation_copies(truncated_ms)[:1])] == ["t"]
    handle.values, handle.maps, handle.other_maps, handle.timers = before
    change_processor.batch_id = replayed_batch
    assert run_batch(*processor, truncation_copies(truncated_ms)[:1]) == []
    assert run_batch(*processor, truncation_copies(truncated_ms + 59_000)[1:]) == []
    assert [e["op"] for e in run_batch(*processor, truncation_copies(truncated_ms + 61_000))] == ["t"]


def test_a_truncation_reaches_the_pages_a_batch_did_not_read_when_they_are_read(processor: Any) -> None:
    """A batch with a truncation writes only the group's index; each other page has the truncation applied
    when it is next read, by a record or a timer: a late copy of a write before it stays deleted, a write
    after it lives on a partition that starts empty, and one written after it (but merged before it) expires
    with its event."""
    owner, handle = processor
    truncated_ms = NOW // 1000 + 10
    after_us = (truncated_ms + 10) * 1000
    run_batch(*processor, [copy for key in range(1, 41) for copy in copies(
        Insert("app.users", {"id": key, "name": f"user{key}", "age": key}, timestamp=NOW))]
        + copies(Insert("app.users", {"id": 100, "name": "ttl", "age": 1}, timestamp=after_us, ttl=5)))
    pages = handle.maps[(0,)]
    [timer] = handle.timers[(0,)]
    pages.calls = 0
    assert [e["op"] for e in run_batch(*processor, truncation_copies(truncated_ms))] == ["t"]
    assert pages.calls == 0  # no page read or written: they are read when a record or a timer needs them
    handle.timers[(0,)].remove(timer)  # Spark drops a timer as it fires
    events = run_task(owner, lambda: list(owner.handleExpiredTimer((0,), _Clock(timer), None)))
    assert [(e["op"], e["before"]["id"]) for e in events] == [("d", 100)]
    late = copies(Update("app.users", {"id": 7}, {"age": 70}, timestamp=NOW + 5), nodes=("node4444",))
    later = copies(Update("app.users", {"id": 8}, {"age": 80}, timestamp=after_us))
    events = run_batch(*processor, late + later)
    assert [(e["op"], e["before"], e["after"]) for e in events] == [
        ("c", None, {"id": 8, "name": None, "age": 80})]


def test_a_group_stored_whole_with_its_truncations_keeps_them_once_paged(processor: Any) -> None:
    """The value of a group as main stored it before pages, ``(timer, partitions, truncations, truncation
    events)``: a late copy of a write the truncation deleted stays deleted, a node's copy of the truncation
    writes no second event, the partitions written after it merge on."""
    owner, handle = processor
    truncated_ms = NOW // 1000 + 10
    after_us = (truncated_ms + 10) * 1000
    run_batch(*processor, copies(Insert("app.users", {"id": 1, "name": "ann", "age": 30},
                                        timestamp=after_us)))
    deletion = group_state.truncation_deletion(truncated_ms)
    table_id = SCHEMA.table("app", "users").id.bytes
    (partitions,) = whole_group_value(handle, (0,), None)
    _, stored = pickle.loads(partitions)
    whole = (None, stored, {table_id: deletion}, {table_id: truncated_ms})
    handle.values[(0,)].value = (pickle.dumps(whole),)
    handle.maps.pop((0,))
    late = copies(Insert("app.users", {"id": 2, "name": "bob", "age": 40}, timestamp=NOW),
                  nodes=("node4444",))
    events = run_batch(*processor, late + truncation_copies(truncated_ms)
                       + copies(Update("app.users", {"id": 1}, {"age": 31}, timestamp=after_us + 1)))
    assert [(e["op"], e["before"]["age"], e["after"]["age"]) for e in events] == [("u", 30, 31)]
    index = index_of(handle)
    assert list(index.truncations) == [table_id] and index.truncation_events == {table_id: truncated_ms}


# A step of one raw partition's records: a write of a key (its kind, its time in seconds after NOW, how many
# replicas' copies arrive) or a TRUNCATE (its time in seconds after NOW, how many nodes' copies arrive):
# writes and truncations a minute or more apart, so that some writes are deleted by a truncation, some
# not, and some truncations are another one, some a node's copy of the last one.
WRITE_STEPS = st.tuples(st.just("write"), st.integers(1, 8), st.sampled_from(("insert", "update", "delete")),
                        st.integers(0, 300), st.integers(1, 3))
TRUNCATE_STEPS = st.tuples(st.just("truncate"), st.just(0), st.just(""), st.integers(0, 300),
                           st.integers(1, 3))


def step_records(steps: list[tuple[str, int, str, int, int]]) -> list[tuple[bytes, bytes]]:
    nodes = ("node1", "node22", "node333")
    records = []
    for number, (kind, key, write, seconds, arriving) in enumerate(steps):
        if kind == "truncate":
            records += truncation_copies(NOW // 1000 + seconds * 1000, nodes=nodes[:arriving])
            continue
        timestamp = NOW + seconds * 1_000_000
        values = {"id": key, "name": f"n{number}", "age": number}
        op = {"insert": Insert("app.users", values, timestamp=timestamp),
              "update": Update("app.users", {"id": key}, {"age": number}, timestamp=timestamp),
              "delete": DeleteRow("app.users", {"id": key}, timestamp=timestamp)}[write]
        records += copies(op, nodes=nodes[:arriving])
    return records


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.one_of(WRITE_STEPS, WRITE_STEPS, WRITE_STEPS, TRUNCATE_STEPS), min_size=1,
                      max_size=24), data=st.data())
def test_records_merged_in_page_order_give_each_key_the_events_of_arrival_order(
        processor: Any, monkeypatch: Any, steps: list[tuple[str, int, str, int, int]], data: Any) -> None:
    """The same batches of writes and truncations merged by a group of one page (its records in arrival
    order: they are all on that page) and by a group of four (its records in the order of their pages,
    within bounds on the pages and records held drawn too): each key has the same events, in the same
    order, and the same ``t`` events between them."""
    owner, _ = processor
    records = step_records(steps)
    cuts = sorted(data.draw(st.lists(st.integers(1, len(records)), max_size=2), label="batch ends"))
    batches = [records[start:end] for start, end in zip([0] + cuts, cuts + [len(records)]) if start < end]
    monkeypatch.setattr(group_state, "RECORDS_ORDERED_BYTES",
                        data.draw(st.sampled_from([1, 300, 64 << 20]), label="records ordered bytes"))
    monkeypatch.setattr(group_state, "PAGES_IN_MEMORY_BYTES",
                        data.draw(st.sampled_from([1, 64 << 20]), label="pages in memory bytes"))
    merged = []
    for pages in (1, 4):
        owner.settings = dataclasses.replace(owner.settings, state_pages=pages)
        handle = _MemoryHandle()
        owner.init(handle)
        merged.append([event for batch in batches for event in run_batch(owner, handle, batch)])
    in_arrival_order, in_page_order = merged

    def of_key(events: list[dict[str, Any]], key: int) -> list[dict[str, Any]]:
        return [e for e in events if e["op"] == "t" or (e["after"] or e["before"])["id"] == key]

    for key in range(1, 9):
        assert of_key(in_page_order, key) == of_key(in_arrival_order, key)
    assert len(in_page_order) == len(in_arrival_order)
