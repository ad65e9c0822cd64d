"""The agent against a real broker and real segments: what reaches Kafka is exactly what the node wrote.

One ``noida-db`` broker serves the whole module; every test gets its own topics (``server=``). A
``SimulatedNode`` writes segments, ``_cdc.idx`` files and ``cdc_raw`` as Cassandra 3.x / 4.x do, and
records, per mutation, the (segment, position, table) the agent must publish and the exact partition
update bytes. The tests consume the topics and compare: every expected change present, nothing else,
duplicates only after ``kill -9``. The agent runs in a thread (``Agent.run``/``stop``) or, for
``kill -9`` and SIGTERM, as the ``cassandra-cdc`` command.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import gc
import json
import logging
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from typer.testing import CliRunner

import cassandra_cdc.agent.tailer as agent_module
import cassandra_cdc.agent.tables as tables_module
from cassandra_cdc.agent import Agent, AgentConfig, ConfigError, load_config
from cassandra_cdc.agent.deliveries import MARKER_INTERVAL, Deliveries
from cassandra_cdc.agent.agent_metrics import LatencyHistogram
from cassandra_cdc.agent.publisher import Publisher
from cassandra_cdc.agent.cdc_raw import read_cdc_index
from cassandra_cdc.agent.positions import STATE_FILE
from cassandra_cdc.cli.main import app
from cassandra_cdc.commitlog import Mutation
from cassandra_cdc.storage import PartitionUpdateSerializer
from cassandra_cdc.storage.binary_io import DataInput, DataOutput
from cassandra_cdc.schema import Schema, parse_schema
from cassandra_cdc.simulator import EmbeddedBroker, Insert, SimulatedNode, Workload, to_mutation
from cassandra_cdc.simulator.broker import free_port
from cassandra_cdc.kafka.raw_records import RawRecord, record_key
from cassandra_cdc.kafka.schema_records import SchemaRecord

from conftest import COMMITLOGS

SCHEMA_CQL = """
CREATE TABLE ks.users (id int PRIMARY KEY, name text, age int, emails set<text>, prefs map<text, int>)
    WITH cdc = true;
CREATE TABLE ks.events (pk int, ck int, v text, s int static, PRIMARY KEY (pk, ck)) WITH cdc = true;
CREATE TABLE ks.audit (id int PRIMARY KEY, v text);
CREATE TABLE other.logs (id int PRIMARY KEY, line text) WITH cdc = true;
"""
# A CDC table the node has but the agent's schema file does not (created after the agent started).
LATE_CQL = "CREATE TABLE ks.late (id int PRIMARY KEY, v text) WITH cdc = true;\n"
SCHEMA = parse_schema(SCHEMA_CQL)
NODE_SCHEMA = parse_schema(SCHEMA_CQL + LATE_CQL)
CLI = Path(sys.executable).parent / "cassandra-cdc"
FIRST_SEGMENT = 1000
DEADLINE = 60.0  # seconds: generous upper bounds for things that normally take well under one

Key = tuple[int, int, uuid.UUID]  # (segment id, position, table id) of one expected raw record


# --- broker, topics -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as running:
        yield running
        gc.collect()  # destroy the agents' producers before their broker goes away (else they log retries)


def wait_until(condition: Callable[[], Any], what: str, timeout: float = DEADLINE, step: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


class TopicReader:
    """Every message of a topic from the beginning, accumulated as it arrives."""

    def __init__(self, broker: EmbeddedBroker, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"test-{uuid.uuid4()}",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        partitions = wait_until(lambda: self._partitions(), f"topic {topic}")
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self.messages: list[Any] = []
        self._closed = False

    def _partitions(self) -> list[int]:
        metadata = self.consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return []
        return sorted(metadata.partitions)

    def poll(self, timeout: float = 0.05) -> int:
        batch = self.consumer.consume(10_000, timeout)
        for message in batch:
            if message.error() is not None and message.error().code() != KafkaError._PARTITION_EOF:
                raise AssertionError(f"consuming {self.topic}: {message.error()}")
        batch = [m for m in batch if m.error() is None]
        self.messages.extend(batch)
        self._received(batch)
        return len(batch)

    def _received(self, batch: list[Any]) -> None:
        pass

    def wait_for(self, condition: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
        return wait_until(lambda: self.poll() >= 0 and condition(), what, timeout, step=0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.consumer.close()


class RawReader(TopicReader):
    """The raw topic, decoded; checks every record's key and that its update decodes with the schema."""

    def __init__(self, broker: EmbeddedBroker, topic: str) -> None:
        self.records: list[RawRecord] = []
        self.arrival: dict[Key, float] = {}
        self.by_partition: dict[int, list[RawRecord]] = collections.defaultdict(list)
        super().__init__(broker, topic)

    def _received(self, batch: list[Any]) -> None:
        now = time.monotonic()
        for message in batch:
            record = RawRecord.decode(message.value())
            assert message.key() == record_key(record.update)
            self.records.append(record)
            self.by_partition[message.partition()].append(record)
            self.arrival.setdefault(key_of(record), now)

    def keys(self) -> collections.Counter[Key]:
        return collections.Counter(key_of(r) for r in self.records)

    def has_all(self, expected: dict[Key, bytes]) -> bool:
        return expected.keys() <= self.arrival.keys()


def key_of(record: RawRecord) -> Key:
    return record.segment_id, record.position, record.table_id


def assert_published_exactly(reader: RawReader, expected: dict[Key, bytes], *, duplicates: bool = False,
                             schema: Schema = SCHEMA) -> None:
    """Every expected change is on the raw topic with its exact bytes, nothing else; no copy unless allowed."""
    seen = reader.keys()
    missing = sorted(expected.keys() - seen.keys())
    assert not missing, f"{len(missing)} of {len(expected)} changes missing from Kafka, first {missing[:5]}"
    unexpected = sorted(seen.keys() - expected.keys())
    assert not unexpected, f"{len(unexpected)} records published that should not be, first {unexpected[:5]}"
    for record in reader.records:
        assert record.update == expected[key_of(record)]
        update = PartitionUpdateSerializer.deserialize(DataInput(record.update), schema, record.commitlog_version)
        assert update.table.cdc
    if not duplicates:
        copies = [k for k, n in seen.items() if n > 1]
        assert not copies, f"{len(copies)} changes published more than once, first {copies[:5]}"


def assert_node_order(reader: RawReader) -> None:
    """In each Kafka partition, one node's records come in the order it wrote them."""
    for partition, records in reader.by_partition.items():
        positions = [(r.segment_id, r.position) for r in records]
        assert positions == sorted(positions), f"partition {partition} is out of order"


# --- a node, its agent's configuration, and what must reach Kafka ---------------------------------------

class Harness:
    """A simulated node, the agent settings for it, and the raw records the agent must publish."""

    def __init__(self, root: Path, broker: EmbeddedBroker, version: str = "4.1", *,
                 published: set[str] | None = None, node_schema: Schema = SCHEMA, seed: int = 1,
                 **node_options: Any) -> None:
        self.root = root
        self.broker = broker
        self.server = f"t{uuid.uuid4().hex[:10]}"
        self.schema_file = root / "schema.cql"
        self.schema_file.write_text(SCHEMA_CQL)
        self.state_dir = root / "state"
        node_options.setdefault("segment_size", 128 * 1024)
        self.node = SimulatedNode(root / "node", "node1", node_schema, version, first_segment_id=FIRST_SEGMENT,
                                  **node_options)
        self.published = published if published is not None else {"ks.users", "ks.events", "other.logs"}
        self.workload = Workload(node_schema, seed=seed, keys=30,
                                 tables=["ks.users", "ks.events", "ks.audit", "other.logs"])
        self.expected: dict[Key, bytes] = {}
        self.writes = 0
        self._readers: list[TopicReader] = []

    @property
    def cdc_raw(self) -> Path:
        return self.node.cdc_raw_dir

    @property
    def raw_topic(self) -> str:
        return f"{self.server}.raw"

    def settings(self, **overrides: Any) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "server": self.server, "node_id": "node1", "cdc_raw": str(self.cdc_raw), "state_dir": str(self.state_dir),
            "schema": {"file": str(self.schema_file)},
            "kafka": {"bootstrap_servers": self.broker.bootstrap_servers, "raw_topic_partitions": 3},
            "metrics": {"port": 0}, "poll_interval_ms": 200, "state_flush_ms": 50,
        }
        for dotted, value in overrides.items():
            node = settings
            *parents, leaf = dotted.split("__")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return settings

    def config(self, **overrides: Any) -> AgentConfig:
        """Settings as an AgentConfig; ``a__b=v`` sets the nested option ``a.b``."""
        return AgentConfig.model_validate(self.settings(**overrides))

    def config_file(self, **overrides: Any) -> Path:
        path = self.root / "agent.yaml"
        path.write_text(yaml.safe_dump(self.settings(**overrides)))
        return path

    # --- writing ----------------------------------------------------------------------------------

    def write(self, count: int, sync_every: int | None = 25) -> None:
        for _ in range(count):
            self.write_mutation(to_mutation(self.workload.next(), self.node.schema))
            if sync_every and self.writes % sync_every == 0:
                self.node.sync()

    def write_mutation(self, mutation: Mutation) -> tuple[int, int]:
        segment, position = self.node.write(mutation)
        self.writes += 1
        for update in mutation.updates:
            if update.table.cdc and update.table.qualified_name in self.published:
                out = DataOutput()
                PartitionUpdateSerializer.serialize(update, out, self.node.version)
                self.expected[(segment, position, update.table.id)] = bytes(out)
        return segment, position

    def insert(self, table: str, **values: Any) -> tuple[int, int]:
        op = Insert(table, values, timestamp=self.workload.clock.tick())
        return self.write_mutation(to_mutation(op, self.node.schema))

    def segment_files(self) -> list[str]:
        return sorted(p.name for p in self.cdc_raw.iterdir())

    def raw_reader(self) -> RawReader:
        reader = RawReader(self.broker, self.raw_topic)
        self._readers.append(reader)
        return reader

    def reader(self, topic: str) -> TopicReader:
        reader = TopicReader(self.broker, topic)
        self._readers.append(reader)
        return reader

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
        self._readers.clear()


MakeHarness = Callable[..., Harness]


@pytest.fixture
def harness(tmp_path: Path, broker: EmbeddedBroker) -> Iterator[MakeHarness]:
    """Makes Harnesses (version, options) in tmp_path; closes their consumers after the test."""
    made: list[Harness] = []

    def make(version: str = "4.1", **options: Any) -> Harness:
        made.append(Harness(tmp_path, broker, version, **options))
        return made[-1]
    yield make
    for h in made:
        h.close()


@contextlib.contextmanager
def running(config: AgentConfig, prepare: Callable[[Agent], None] | None = None) -> Iterator[Agent]:
    """The agent running in a thread; stopped (as on SIGTERM) on exit, which must succeed with status 0."""
    agent = Agent(config)
    if prepare is not None:
        prepare(agent)
    outcome: dict[str, Any] = {}

    def main() -> None:
        try:
            outcome["status"] = agent.run()
        except BaseException as error:  # reported by the test thread
            outcome["error"] = error

    thread = threading.Thread(target=main, name="agent", daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive(), "the agent did not stop"
    if "error" in outcome:
        raise outcome["error"]
    assert outcome["status"] == 0


class AgentProcess:
    """``cassandra-cdc agent --config FILE`` as a separate process, its output in a log file."""

    def __init__(self, config_file: Path, log: Path) -> None:
        self.log_path = log
        self._log = open(log, "ab")
        self.process = subprocess.Popen([str(CLI), "agent", "--config", str(config_file)], stdin=subprocess.DEVNULL,
                                        stdout=self._log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no flush, no state save
        self.process.wait(DEADLINE)
        self._log.close()

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(DEADLINE)
        self._log.close()
        return status

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, *_: object) -> None:
        if self.process.poll() is None:
            self.kill()


def saved_positions(state_dir: Path) -> dict[int, dict[str, Any]]:
    path = state_dir / STATE_FILE
    if not path.exists():
        return {}
    return {int(k): v for k, v in json.loads(path.read_text())["segments"].items()}


def metric(agent: Agent, name: str, **labels: str) -> float:
    value = agent.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# --- live tailing -----------------------------------------------------------------------------------------

def test_live_tailing_publishes_every_change_in_order_with_schemas_first(harness: MakeHarness) -> None:
    """4.1 node written while the agent runs: growing idx, rollover, COMPLETED, non-CDC and excluded tables.

    Every change of a published table arrives exactly once with its exact bytes, in the node's order per
    Kafka partition; a table's schema is acknowledged before its first raw record is produced; new data is
    published soon after the idx changes; completed segments are deleted, the live one is kept.
    """
    h = harness(published={"ks.users", "ks.events"}, segment_size=32 * 1024)
    events: list[tuple[str, str, bytes]] = []

    def spy(agent: Agent) -> None:
        publish = agent.publisher.publish

        def recording(topic: str, key: bytes, value: bytes, on_delivery: Any, *args: Any, **kwargs: Any) -> bool:
            events.append(("produce", topic, key))

            def delivered(error: Any, message: Any) -> None:
                events.append(("ack", topic, key))
                if on_delivery is not None:
                    on_delivery(error, message)
            return publish(topic, key, value, delivered, *args, **kwargs)
        agent.publisher.publish = recording  # type: ignore[method-assign]

    h.write(100)  # already there when the agent starts
    with running(h.config(tables__exclude=["other.*"]), spy) as agent:
        raw = h.raw_reader()
        for round in range(8):
            h.write(250, sync_every=25)
            # One mutation with a CDC and a non-CDC table: only the CDC table's update is published.
            ts = h.workload.clock.tick()
            users = to_mutation(Insert("ks.users", {"id": 2000 + round, "name": "u"}, timestamp=ts), SCHEMA)
            audit = to_mutation(Insert("ks.audit", {"id": 2000 + round, "v": "a"}, timestamp=ts), SCHEMA)
            h.write_mutation(Mutation(users.updates + audit.updates))
            h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes written so far")
        segments_so_far = {k[0] for k in h.expected}
        assert len(segments_so_far) >= 3, "the test must span segment rollovers"
        # Completed, acknowledged segments are deleted; the live one stays although fully published.
        live = h.node.active_segment.path.name
        wait_until(lambda: h.segment_files() == [live, live.replace(".log", "_cdc.idx")],
                   "completed segments deleted, the live one kept")

        # Latency: from the idx rewrite to the record visible to a consumer.
        latencies = []
        events_id = SCHEMA.table("ks", "events").id
        for i in range(5):
            key = (*h.insert("ks.events", pk=3000 + i, ck=i, v="late"), events_id)
            h.node.sync()
            synced = time.monotonic()
            raw.wait_for(lambda key=key: key in raw.arrival, "a change just synced")
            latencies.append(raw.arrival[key] - synced)
        assert max(latencies) < 5.0, latencies

        h.node.close()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
        assert metric(agent, "cdc_agent_mutations_skipped_total") == 0
        assert metric(agent, "cdc_agent_segments_quarantined_total") == 0  # healthy segments are cleaned up
        # Per-record metrics: every record counted once, under its table.
        by_table = collections.Counter(SCHEMA.table_by_id(table_id).qualified_name for _, _, table_id in h.expected)
        for table, records in by_table.items():
            assert metric(agent, "cdc_agent_records_published_total", table=table) == records
            assert metric(agent, "cdc_agent_mutations_read_total", table=table) == records
        assert metric(agent, "cdc_agent_mutations_read_total", table="ks.audit") >= 8  # read, not published
        # Delivery latency: observed on the records that report their delivery (deliveries.py), a few per pass.
        observed = metric(agent, "cdc_agent_kafka_delivery_seconds_count")
        assert 0 < observed < len(h.expected) / 2
        assert metric(agent, "cdc_agent_kafka_delivery_seconds_bucket", le="30.0") == observed
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)
    assert {r.node_id for r in raw.records} == {"node1"} and {r.commitlog_version for r in raw.records} == {7}
    assert all(r.write_time > 0 for r in raw.records)

    # Schemas: only the published tables, each acknowledged before the table's first record was produced.
    schemas = h.reader(h.server)
    schemas.wait_for(lambda: len(schemas.messages) >= 2, "schema records")
    published = {m.key().decode(): SchemaRecord.decode(m.value()) for m in schemas.messages}
    assert set(published) == {"ks.users", "ks.events"}
    for name, record in published.items():
        table = SCHEMA.table(*name.split("."))
        assert record.table_metadata().id == table.id and record.version == table.version_hash()
        schema_acked = events.index(("ack", h.server, name.encode()))
        first_record = next(i for i, (kind, topic, key) in enumerate(events)
                            if kind == "produce" and topic == h.raw_topic and key[:16] == table.id.bytes)
        assert schema_acked < first_record, f"{name}: a raw record was produced before its schema was acknowledged"
    schemas.close()
    raw.close()


def test_include_and_exclude_filters(harness: MakeHarness) -> None:
    """Only CDC tables accepted by ``tables.include`` minus ``tables.exclude`` are published."""
    h = harness(published={"other.logs"})
    h.write(600)
    h.node.close()
    config = h.config(tables__include=["other.*", "ks.events", "ks.audit"], tables__exclude=["ks.events"])
    with running(config):
        raw = h.raw_reader()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.wait_for(lambda: raw.has_all(h.expected), "other.logs changes")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert {r.table_id for r in raw.records} == {SCHEMA.table("other", "logs").id}
    raw.close()


def test_cassandra_311_segments_moved_in_whole(harness: MakeHarness) -> None:
    """3.11: no idx; a segment appears in cdc_raw once discarded and is read once, completely (version 6)."""
    h = harness("3.11", segment_size=16 * 1024)
    with running(h.config()):
        raw = h.raw_reader()
        h.write(700, sync_every=20)
        h.node.sync()
        moved = {k for k in h.expected if k[0] != h.node.active_segment.descriptor.segment_id}
        assert len({k[0] for k in moved}) >= 2
        raw.wait_for(lambda: moved <= raw.arrival.keys(), "the segments moved into cdc_raw")
        assert not any(name.endswith("_cdc.idx") for name in h.segment_files())
        # The active segment is still in commitlog/: nothing of it may be published yet.
        active = h.node.active_segment.descriptor.segment_id
        raw.poll(0.3)
        assert not any(r.segment_id == active for r in raw.records)
        h.node.close()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)
    assert {r.commitlog_version for r in raw.records} == {6}
    assert not list((h.state_dir / "quarantine").iterdir())
    raw.close()


# --- the _cdc.idx file ----------------------------------------------------------------------------------

def count_unreadable_idx_reads(monkeypatch: pytest.MonkeyPatch,
                               label: Callable[[Path], str]) -> collections.Counter[str]:
    """Counts, by ``label(path)``, the agent's reads of an idx file that exists but cannot be used."""
    unreadable = collections.Counter[str]()
    read_index = agent_module.read_cdc_index

    def spying(path: Path) -> Any:
        result = read_index(path)
        if result is None and path.exists():
            unreadable[label(path)] += 1
        return result
    monkeypatch.setattr(agent_module, "read_cdc_index", spying)
    return unreadable


def test_unreadable_idx_is_retried_never_misread(harness: MakeHarness,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An idx caught empty, half-written or garbled is read again; nothing past the real offset is published,
    and a truncated ``COMPLETED`` does not complete the segment."""
    h = harness(segment_size=1024 * 1024)
    unreadable = count_unreadable_idx_reads(monkeypatch, lambda path: path.read_text(errors="replace"))

    h.write(60, sync_every=30)
    segment = h.node.active_segment
    index_path = h.cdc_raw / segment.path.name.replace(".log", "_cdc.idx")
    durable = int(index_path.read_text())
    with running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the synced changes")
        # More data, synced into the segment file (markers, fsync) but not yet announced by the idx.
        h.write(60, sync_every=None)
        segment.sync()
        for garbage in ("", "garbage", str(durable) + "\nCOMPLE", "\n" + str(durable), str(durable) + "x"):
            index_path.write_text(garbage)  # what a reader sees between Cassandra's truncate and write
            wait_until(lambda seen=unreadable[garbage], text=garbage: unreadable[text] >= seen + 2,
                       f"the agent to read idx {garbage!r} twice")
            raw.poll(0.05)
            beyond = [r for r in raw.records if r.position > durable]
            assert not beyond, f"published past the durable offset {durable} with idx {garbage!r}"
            assert index_path.name in h.segment_files() and segment.path.name in h.segment_files()
        h.node.sync()  # Cassandra's next sync rewrites the idx: the rest is published
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes after the idx was repaired")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    raw.close()


def test_newer_segment_waits_while_the_older_idx_is_unreadable(harness: MakeHarness,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """The older segment's idx caught mid-rewrite (its final COMPLETED rewrite): the newer segment is not read
    before it, so a partition's changes keep the node's order. An idx that stays unreadable is logged, once."""
    h = harness(segment_size=16 * 1024)
    unreadable = count_unreadable_idx_reads(monkeypatch, lambda path: path.name)
    older = h.node.active_segment
    while h.node.active_segment is older:
        h.write(20, sync_every=20)
    h.write(20, sync_every=20)  # the newer segment has data and its idx
    older_index = h.cdc_raw / older.path.name.replace(".log", "_cdc.idx")
    completed = older_index.read_text()
    older_index.write_text("")  # Cassandra truncated it and has not written it yet
    with running(h.config(stale_segment_seconds=0.5)):
        raw = h.raw_reader()
        wait_until(lambda: unreadable[older_index.name] >= 3, "the agent to read the older idx three times")
        def blocked() -> list[logging.LogRecord]:
            return [r for r in caplog.records if older_index.name in r.getMessage() and "newer one" in r.getMessage()]
        wait_until(lambda: bool(blocked()), "the blocking idx logged")
        time.sleep(0.6)
        assert len(blocked()) == 1 and blocked()[0].levelno == logging.ERROR
        raw.poll(0.1)
        assert not any(r.segment_id != older.descriptor.segment_id for r in raw.records), \
            "a newer segment was published while the older one's idx was unreadable"
        older_index.write_text(completed)
        h.node.close()
        raw.wait_for(lambda: raw.has_all(h.expected), "every change")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)


def test_segment_never_completed_by_a_crashed_node_is_read_to_its_end(harness: MakeHarness) -> None:
    """The node died (no COMPLETED) and came back with new segments: once the old segment has been idle for
    ``stale_segment_seconds`` and newer ones have data, it is read to its end and cleaned up."""
    h = harness()
    h.write(150, sync_every=50)
    crashed = h.node.active_segment.path.name
    h.node = SimulatedNode(h.root / "node", "node1", SCHEMA, "4.1", first_segment_id=FIRST_SEGMENT + 100,
                           segment_size=128 * 1024)  # the restarted node, same directories
    h.write(150, sync_every=50)
    with running(h.config(stale_segment_seconds=0.3)):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes of both segments")
        wait_until(lambda: crashed not in h.segment_files(), "the crashed segment cleaned up")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)
    assert not list((h.state_dir / "quarantine").iterdir())  # its unsynced end is not damage


def test_segments_without_cdc_data_leave_no_state_behind(harness: MakeHarness) -> None:
    """4.x links every segment; those that never get CDC data lose their link when discarded. The agent
    neither waits for them nor keeps their positions once they are gone."""
    h = harness(segment_size=16 * 1024)
    with running(h.config()):
        raw = h.raw_reader()
        for i in range(600):  # several segments of a non-CDC table only
            h.insert("ks.audit", id=i, v="x" * 20)
            if i % 20 == 0:
                h.node.sync()
                time.sleep(0.002)
        h.write(200)
        h.node.close()
        assert h.node.active_segment is None and len({k[0] for k in h.expected}) >= 1
        raw.wait_for(lambda: raw.has_all(h.expected), "every change")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        wait_until(lambda: not saved_positions(h.state_dir), "no position left for segments that are gone")
    assert_published_exactly(raw, h.expected)


# --- damage, unknown tables ---------------------------------------------------------------------------------

def test_damaged_entries_go_to_dead_letters_and_quarantine(harness: MakeHarness) -> None:
    """A bad entry CRC loses that entry, a bad size CRC the rest of its section, an undecodable mutation
    itself: each once to ``<server>.errors`` and the quarantine directory; everything else is published."""
    h = harness(segment_size=1024 * 1024)
    users = SCHEMA.table("ks", "users")
    segment = h.node.active_segment
    positions = [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10)]
    h.node.sync()
    positions += [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10, 20)]
    h.node.sync()
    # Entry 3: a flipped body byte (entry CRC). Entry 14: a flipped size CRC: 14..19 are lost with it.
    # Plain segment: logical positions are file offsets; an entry starts 12 + size bytes before its end.
    sizes = {p: len(h.expected[(segment.descriptor.segment_id, p, users.id)]) + 1 for p in positions}

    def entry_start(i: int) -> int:
        return positions[i] - 12 - sizes[positions[i]]
    with open(segment.path, "r+b") as f:
        f.seek(entry_start(3) + 8 + 5)
        byte = f.read(1)
        f.seek(entry_start(3) + 8 + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.seek(entry_start(14) + 4)
        f.write(b"\xde\xad\xbe\xef")
    damaged_body = None
    lost = [3] + list(range(14, 20))
    for i in lost:
        key = (segment.descriptor.segment_id, positions[i], users.id)
        if i == 3:
            damaged_body = bytearray(b"\x01" + h.expected[key])  # one partition update: count 1, then it
            damaged_body[5] ^= 0xFF
        del h.expected[key]
    # A mutation whose framing is intact but whose content is not: two updates, the second cut short.
    undecodable = b"\x02" + h.expected[(segment.descriptor.segment_id, positions[0], users.id)] + users.id.bytes + b"\x01"

    with running(h.config()) as agent:
        raw = h.raw_reader()
        errors = h.reader(f"{h.server}.errors")
        raw.wait_for(lambda: raw.has_all(h.expected), "the intact changes of the first two sections")
        # The third section is read by a pass that resumes where the first two end.
        undecodable_position = segment.add(undecodable)
        h.insert("ks.users", id=99, name="after the damage")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the intact changes")
        errors.wait_for(lambda: len(errors.messages) >= 3, "three dead letters")
        # The live segment goes on: later passes must not report the same damage again.
        for i in range(3):
            h.insert("ks.users", id=200 + i, name="later")
            h.node.sync()
            raw.wait_for(lambda: raw.has_all(h.expected), "changes after the damage")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the damaged segment published and moved")
        errors.poll(0.3)
        raw.poll(0.1)
        assert metric(agent, "cdc_agent_errors_total", kind="entry_crc_mismatch") == 1
        # The entries after the bad size CRC are in no report: the segment is kept whole.
        assert metric(agent, "cdc_agent_segments_quarantined_total") == 1
    assert_published_exactly(raw, h.expected)

    letters = {json.loads(m.value())["kind"]: json.loads(m.value()) for m in errors.messages}
    assert len(errors.messages) == 3, [m.value()[:200] for m in errors.messages]
    assert set(letters) == {"ENTRY_CRC_MISMATCH", "SIZE_CRC_MISMATCH", "UNDECODABLE_MUTATION"}
    crc = letters["ENTRY_CRC_MISMATCH"]
    assert crc["position"] == entry_start(3) and base64.b64decode(crc["raw"]) == bytes(damaged_body)
    assert crc["segment"] == segment.path.name and crc["node"] == "node1"
    assert letters["SIZE_CRC_MISMATCH"]["position"] == entry_start(14)
    assert base64.b64decode(letters["UNDECODABLE_MUTATION"]["raw"]) == undecodable
    assert letters["UNDECODABLE_MUTATION"]["position"] == undecodable_position - 12 - len(undecodable)
    assert [letters[kind]["section"] for kind in ("ENTRY_CRC_MISMATCH", "SIZE_CRC_MISMATCH", "UNDECODABLE_MUTATION")] \
        == [1, 2, 3]
    message_keys = {m.key().decode() for m in errors.messages}
    assert message_keys == {f"{segment.path.name}@{letter['position']}" for letter in letters.values()}
    quarantine = h.state_dir / "quarantine"
    assert (quarantine / segment.path.name).exists()
    assert letters["SIZE_CRC_MISMATCH"]["kept_whole_in"] == str(quarantine / segment.path.name)
    assert "kept_whole_in" not in letters["ENTRY_CRC_MISMATCH"]
    reports = sorted(p.name for p in quarantine.glob("*.json"))
    assert reports == sorted(f"{segment.path.name}@{letter['position']}.json" for letter in letters.values())
    for letter in letters.values():
        stem = f"{segment.path.name}@{letter['position']}"
        assert json.loads((quarantine / f"{stem}.json").read_text())["kind"] == letter["kind"]
        raw_bytes, binary = base64.b64decode(letter["raw"]), quarantine / f"{stem}.bin"
        assert binary.read_bytes() == raw_bytes if raw_bytes else not binary.exists()
    raw.close()
    errors.close()


def test_unknown_tables_are_skipped_until_the_schema_has_them(harness: MakeHarness,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A table id missing from the schema: its mutations are skipped (counted, logged once); once the schema
    file has the table, its later mutations are published, with its schema record first."""
    monkeypatch.setattr(tables_module, "RELOAD_INTERVAL_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    h = harness(node_schema=NODE_SCHEMA, published={"ks.users", "ks.late"})
    late = NODE_SCHEMA.table("ks", "late")
    h.insert("ks.users", id=1, name="before")
    skipped = [h.insert("ks.late", id=1, v="unknown"), h.insert("ks.late", id=2, v="unknown")]
    h.insert("ks.users", id=2, name="after")
    h.node.sync()
    for segment, position in skipped:
        del h.expected[(segment, position, late.id)]
    with running(h.config()) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the known table's changes")
        assert metric(agent, "cdc_agent_mutations_skipped_total") == 2
        warnings = [r for r in caplog.records if str(late.id) in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        h.schema_file.write_text(SCHEMA_CQL + LATE_CQL)  # the schema now has it
        h.insert("ks.late", id=3, v="known")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the new table's change")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected, schema=NODE_SCHEMA)
    schemas = h.reader(h.server)
    schemas.wait_for(lambda: len(schemas.messages) >= 2, "schema records")
    assert {m.key() for m in schemas.messages} == {b"ks.users", b"ks.late"}
    schemas.close()
    raw.close()


ALTERED_CQL = SCHEMA_CQL.replace("prefs map<text, int>)", "prefs map<text, int>, email text)")
ALTERED = parse_schema(ALTERED_CQL)
SYSTEM_CQL = (Path(__file__).parent / "data" / "system_schemas" / "cassandra-4.0.11.cql").read_text()


def schema_versions(h: Harness, table: str) -> list[SchemaRecord]:
    reader = h.reader(h.server)
    reader.poll(1.0)
    return [r for r in map(SchemaRecord.decode, (m.value() for m in reader.messages))
            if f"{r.keyspace}.{r.table}" == table]


def insert_with_email(h: Harness, key: int) -> Key:
    """An insert that uses the column ALTER TABLE added: only the new definition decodes it."""
    mutation = to_mutation(Insert("ks.users", {"id": key, "name": "n", "email": f"{key}@x"},
                                  timestamp=h.workload.clock.tick()), ALTERED)
    return (*h.write_mutation(mutation), mutation.updates[0].table.id)


def test_schema_file_change_publishes_the_new_definition_before_records_that_need_it(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """ALTER TABLE, with the schema from a file: the agent reloads the file when it changes and publishes the
    new version of the table's schema before the first record written with it."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    assert ALTERED.table("ks", "users").id == SCHEMA.table("ks", "users").id  # ALTER keeps the table id
    h = harness(published={"ks.users"})
    h.insert("ks.users", id=1, name="before")
    h.node.sync()
    with running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the change before the ALTER")
        h.schema_file.write_text(ALTERED_CQL)
        wait_until(lambda: any("changed: reloading" in r.getMessage() for r in caplog.records), "the reload")
        altered = insert_with_email(h, 2)
        h.node.sync()
        raw.wait_for(lambda: altered in raw.arrival, "the change after the ALTER")
    versions = schema_versions(h, "ks.users")
    assert [("email text" in r.cql) for r in versions] == [False, True]
    record = next(r for r in raw.records if key_of(r) == altered)
    update = PartitionUpdateSerializer.deserialize(DataInput(record.update), parse_schema(versions[-1].cql), 7)
    assert [c.name for c in update.regular_columns] == ["email", "name"]
    raw.close()


@pytest.mark.parametrize("broken", ["", "CREATE TABLE ks.users (id int PRIMARY", "CREATE TABLE ks.users (id int"])
def test_schema_file_being_rewritten_or_broken_keeps_the_loaded_schema(harness: MakeHarness, broken: str,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A schema file caught mid-write or broken never replaces a good schema: the agent would skip (lose) the
    changes of every table missing from it. It waits for the file to settle; a broken file is logged."""
    monkeypatch.setattr(tables_module, "SETTLE_SECONDS", 0.2)
    h = harness()
    registry = tables_module.TableRegistry(h.config())
    loaded = registry.schema
    h.schema_file.write_text(broken)
    registry.reload_if_changed()
    assert registry.schema is loaded, "a file just changed is not read yet"
    time.sleep(0.3)
    registry.reload_if_changed()
    assert registry.schema is loaded
    assert any("cannot be loaded" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    h.schema_file.write_text(ALTERED_CQL)
    wait_until(lambda: registry.reload_if_changed() or registry.schema is not loaded, "the fixed file loaded")
    assert "email" in {c.name for c in registry.schema.table("ks", "users").columns}


def test_schema_change_logged_by_the_node_reloads_the_cluster_schema(harness: MakeHarness,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """ALTER TABLE, with the schema from the cluster: the node logs the change as a system_schema mutation
    before any data that uses it; the agent reloads on it and publishes the new schema version first."""
    monkeypatch.setattr(tables_module, "RELOAD_INTERVAL_SECONDS", 0.0)
    cluster_schema = [parse_schema(SCHEMA_CQL + SYSTEM_CQL)]

    def from_cluster(agent: Agent) -> None:
        agent.tables = tables_module.TableRegistry(agent.config, loader=lambda: cluster_schema[0])

    h = harness(published={"ks.users"}, node_schema=parse_schema(ALTERED_CQL + SYSTEM_CQL))
    h.insert("ks.users", id=1, name="before")
    h.node.sync()
    with running(h.config(), from_cluster) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the change before the ALTER")
        cluster_schema[0] = parse_schema(ALTERED_CQL + SYSTEM_CQL)
        h.insert("system_schema.columns", keyspace_name="ks", table_name="users", column_name="email",
                 kind="regular", position=-1, type="text", clustering_order="none")
        altered = insert_with_email(h, 2)
        h.node.sync()
        raw.wait_for(lambda: altered in raw.arrival, "the change after the ALTER")
        assert metric(agent, "cdc_agent_mutations_read_total", table="system_schema.columns") == 1
    assert [("email text" in r.cql) for r in schema_versions(h, "ks.users")] == [False, True]
    raw.close()


# --- acknowledgements without a report per record -------------------------------------------------------

def test_deliveries_know_every_record_acknowledged_from_a_few_reports(broker: EmbeddedBroker) -> None:
    """Records go to the partition librdkafka's own partitioner picks for their key (as bootstrap's records do);
    only some report their delivery, yet once sealed and delivered every watermark taken reads as covered, and
    none does before Kafka has every record sent before it."""
    topic = f"deliveries-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(broker.bootstrap_servers, 64 * 1024 * 1024)
    publisher.ensure_topics({topic: (5, False)})
    latency = LatencyHistogram((1.0,))
    deliveries = Deliveries(publisher, latency)
    keys = [f"key{i % 300}".encode() for i in range(3000)]
    watermarks = []
    for i, key in enumerate(keys):
        assert deliveries.send(topic, key, b"v%d" % i, lambda: False)
        if i % 100 == 0:
            watermarks.append(deliveries.watermark())
    watermarks.append(deliveries.watermark())
    assert watermarks[-1] and sum(watermarks[-1]) == len(keys), "one sequence number per record"
    assert publisher.flush(30) == 0
    publisher.poll(0)
    assert not deliveries.covers(watermarks[-1]), "each partition's newest record is held, not yet sent"
    assert deliveries.seal(lambda: False)
    assert publisher.flush(30) == 0
    publisher.poll(0)
    assert all(map(deliveries.covers, watermarks))
    reports = sum(latency.counts)
    assert 5 <= reports <= 3000 // MARKER_INTERVAL + 5 * 2, reports  # markers, plus one per partition when sealed

    # The same key → partition mapping as librdkafka's default partitioner.
    default = Producer({"bootstrap.servers": broker.bootstrap_servers})
    picked: dict[bytes, int] = {}
    for key in set(keys):
        default.produce(topic, b"x", key, on_delivery=lambda error, message: picked.__setitem__(message.key(),
                                                                                              message.partition()))
    default.flush(30)
    reader = TopicReader(broker, topic)
    wait_until(lambda: reader.poll() >= 0 and len(reader.messages) == len(keys) + len(picked), "the records")
    ours = {m.key(): m.partition() for m in reader.messages if m.value() != b"x"}
    assert ours == picked
    reader.close()


# --- failures: kill -9, SIGTERM, broker outage ---------------------------------------------------------------

def test_kill_9_mid_segment_loses_nothing(tmp_path: Path, harness: MakeHarness) -> None:
    """``kill -9`` of the agent while it is inside a live (compressed) segment, twice, with writes going on
    meanwhile: after each restart it resumes from its saved position; every change reaches Kafka."""
    h = harness(compression="LZ4Compressor", segment_size=32 * 1024)
    config_file = h.config_file()
    log = tmp_path / "agent.log"
    raw: RawReader | None = None
    for attempt in range(2):
        with AgentProcess(config_file, log) as process:
            raw = raw or h.raw_reader()
            deadline = time.monotonic() + DEADLINE
            start = len(raw.records)
            # Write until the agent has published part of the live segment, then kill it.
            while True:
                h.write(40, sync_every=20)
                raw.poll(0.02)
                live = h.node.active_segment.descriptor.segment_id
                if len(raw.records) > start and any(r.segment_id == live for r in raw.records[start:]):
                    break
                assert time.monotonic() < deadline, f"the agent published nothing:\n{process.output()[-3000:]}"
            assert (h.state_dir / STATE_FILE).exists(), "positions are saved while running"
            process.kill()
        # The node goes on while the agent is down, at least into a new segment.
        down_in = h.node.active_segment.descriptor.segment_id
        while h.node.active_segment.descriptor.segment_id == down_in:
            h.write(50, sync_every=20)
    assert raw is not None
    with AgentProcess(config_file, log) as process:
        h.write(300, sync_every=20)
        h.node.close()
        raw.wait_for(lambda: raw.has_all(h.expected), "every change after the restarts")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        assert process.terminate() == 0
    raw.poll(0.2)
    assert_published_exactly(raw, h.expected, duplicates=True)
    assert len({k[0] for k in h.expected}) >= 3, "each restart resumed into a segment rolled over meanwhile"
    raw.close()


def test_sigterm_finishes_in_flight_saves_position_and_exits_0(tmp_path: Path, harness: MakeHarness) -> None:
    """SIGTERM mid-stream: exit status 0, everything up to the saved positions is in Kafka, and the restarted
    agent continues exactly there (not one record published twice)."""
    h = harness()
    log = tmp_path / "agent.log"
    with AgentProcess(h.config_file(state_flush_ms=60_000), log) as process:  # only the shutdown saves
        raw = h.raw_reader()
        deadline = time.monotonic() + DEADLINE
        while len(raw.records) < 300:  # the node writes, the agent publishes
            h.write(50, sync_every=25)
            raw.poll(0.02)
            assert time.monotonic() < deadline, process.output()[-3000:]
        h.write(50, sync_every=25)  # and more: in flight when SIGTERM comes
        assert process.terminate() == 0
        assert "everything read is acknowledged" in process.output()
    positions = saved_positions(h.state_dir)
    assert positions, "the position was saved on SIGTERM"
    raw.poll(0.5)
    saved = {segment: p["position"] for segment, p in positions.items()}
    first_saved = min(saved)
    must_be_there = {k for k in h.expected if k[0] < first_saved or k[1] <= saved.get(k[0], -1)}
    assert must_be_there, "the agent had published something"
    assert must_be_there <= raw.arrival.keys(), "a change before a saved position is missing from Kafka"

    h.write(100)
    h.node.close()
    with running(h.config()):
        raw.wait_for(lambda: raw.has_all(h.expected), "every change after the restart")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    raw.close()


def test_broker_stopped_and_restarted_mid_stream(broker: EmbeddedBroker, harness: MakeHarness) -> None:
    """Kafka goes away while the node writes: the agent waits (a COMPLETED segment is kept, not cleaned up
    unacknowledged), reports Kafka unreachable, and publishes everything once Kafka is back."""
    h = harness(segment_size=32 * 1024)
    with running(h.config()) as agent:
        raw = h.raw_reader()
        h.write(200)
        raw.wait_for(lambda: raw.has_all(h.expected), "changes before the outage")
        raw.close()
        broker.stop()
        try:
            first_down = h.node.active_segment.path.name
            h.write(600, sync_every=20)  # rolls over: first_down is COMPLETED while Kafka is away
            assert h.node.active_segment.path.name != first_down
            wait_until(lambda: metric(agent, "cdc_agent_kafka_reachable") == 0, "Kafka reported unreachable")
            time.sleep(0.5)  # several passes of the agent: it must keep the completed segment
            assert first_down in h.segment_files(), "a segment was cleaned up before Kafka acknowledged it"
        finally:
            broker.start()
        h.write(200)
        h.node.close()
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "every change after the outage")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        wait_until(lambda: metric(agent, "cdc_agent_kafka_reachable") == 1, "Kafka reported reachable")
        raw.poll(0.2)
    # The idempotent producer resends in order: no loss; copies would be tolerated by the contract.
    assert_published_exactly(raw, h.expected, duplicates=True)
    raw.close()


def test_agent_started_while_kafka_is_down_waits_for_it(broker: EmbeddedBroker, harness: MakeHarness) -> None:
    """No Kafka at startup: the agent reports it unreachable and waits; it publishes once Kafka is there."""
    h = harness()
    h.write(200)
    broker.stop()
    try:
        with running(h.config()) as agent:
            wait_until(lambda: metric(agent, "cdc_agent_kafka_reachable") == 0, "Kafka reported unreachable")
            broker.start()
            raw = h.raw_reader()
            raw.wait_for(lambda: raw.has_all(h.expected), "the changes once Kafka is back")
            assert metric(agent, "cdc_agent_kafka_reachable") == 1
    finally:
        broker.start()
    raw.poll(0.2)
    assert_published_exactly(raw, h.expected)


class Crash(BaseException):
    """The agent process dying at a chosen point."""


def test_crash_between_cleanup_steps_is_finished_on_restart(harness: MakeHarness,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent dies right after deleting the first file of a published segment: the restarted agent
    finishes the cleanup (nothing left behind in cdc_raw) without publishing the segment again."""
    h = harness()
    h.write(200)
    h.node.close()
    unlink = Path.unlink

    def crashing(path: Path, missing_ok: bool = False) -> None:
        unlink(path, missing_ok=missing_ok)
        if path.parent == h.cdc_raw:
            raise Crash(path.name)
    monkeypatch.setattr(Path, "unlink", crashing)
    with pytest.raises(Crash), running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        wait_until(lambda: len(h.segment_files()) < 2, "the cleanup to start")
    monkeypatch.setattr(Path, "unlink", unlink)
    with running(h.config()):
        wait_until(lambda: not h.segment_files(), "the cleanup finished")
        wait_until(lambda: not saved_positions(h.state_dir), "the segment forgotten")
        raw.poll(0.3)
    assert_published_exactly(raw, h.expected)


# --- cleanup, space, status ---------------------------------------------------------------------------------

def test_cleanup_archive(tmp_path: Path, harness: MakeHarness) -> None:
    """``archive`` moves a segment and its idx once COMPLETED and acknowledged; the live one stays."""
    h = harness(segment_size=16 * 1024)
    archive = tmp_path / "archive"
    with running(h.config(cleanup__mode="archive", cleanup__archive_dir=str(archive))):
        raw = h.raw_reader()
        h.write(600, sync_every=20)
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        live = h.node.active_segment.path.name
        wait_until(lambda: h.segment_files() == [live, live.replace(".log", "_cdc.idx")], "completed ones archived")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the last one archived")
    segments = {k[0] for k in h.expected}
    archived = sorted(p.name for p in archive.iterdir())
    assert len(archived) == 2 * len(segments)
    for name in archived:
        if name.endswith("_cdc.idx"):
            assert (archive / name).read_text().endswith("\nCOMPLETED")
    assert_published_exactly(raw, h.expected)
    raw.close()


def test_cleanup_command_runs_after_completion_and_is_retried(tmp_path: Path, harness: MakeHarness) -> None:
    """``command`` gets {segment} and {index} of a COMPLETED, acknowledged segment; the files are deleted only
    when it exits 0; a failure is retried."""
    h = harness(segment_size=1024 * 1024)
    copies = tmp_path / "copies"
    copies.mkdir()
    # Fails the first time for each segment, copies both files the second time.
    command = (f"name=$(basename {{segment}}); if [ -e {copies}/$name.tried ]; then cp {{segment}} {{index}} "
               f"{copies}/; else touch {copies}/$name.tried; exit 3; fi")
    h.write(300)
    with running(h.config(cleanup__mode="command", cleanup__command=command, poll_interval_ms=50)):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        live = h.node.active_segment.path.name
        assert not list(copies.iterdir()), "the command ran on a segment Cassandra had not COMPLETED"
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the command to succeed and the files to be deleted")
    assert sorted(p.name for p in copies.iterdir()) == sorted([live, live + ".tried",
                                                              live.replace(".log", "_cdc.idx")])
    assert (copies / live.replace(".log", "_cdc.idx")).read_text().endswith("COMPLETED")
    raw.close()


def test_cdc_total_space_warning(harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """The agent warns when cdc_raw nears cdc_total_space, and says when it is back under."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    h = harness(segment_size=1024 * 1024)  # a plain segment takes its whole size at once
    h.write(50)
    with running(h.config(cdc_total_space_mb=1, space_warning_percent=50)) as agent:
        warning = wait_until(lambda: [r for r in caplog.records if "cdc_total_space" in r.getMessage()
                                      and r.levelno == logging.WARNING], "the space warning")
        assert "100% of cdc_total_space (1 MiB)" in warning[0].getMessage()
        assert metric(agent, "cdc_agent_cdc_raw_usage_ratio") == 1.0
        h.node.close()
        wait_until(lambda: any("back under 50%" in r.getMessage() for r in caplog.records), "the all-clear")
    assert len([r for r in caplog.records if r.levelno == logging.WARNING and "cdc_total_space" in r.getMessage()]) == 1


def test_agent_status(tmp_path: Path, harness: MakeHarness) -> None:
    """``agent status`` shows per segment the durable offset, COMPLETED, acknowledged position and lag."""
    h = harness(segment_size=16 * 1024)
    h.write(400, sync_every=20)
    h.node.sync()
    with running(h.config(cleanup__mode="keep")):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        wait_until(lambda: all(p["completed"] for s, p in saved_positions(h.state_dir).items()
                               if s != h.node.active_segment.descriptor.segment_id)
                   and len(saved_positions(h.state_dir)) == len({k[0] for k in h.expected}), "positions saved")
        raw.close()
    h.write(10, sync_every=None)
    h.node.sync()  # new durable data the agent has not seen: lag
    live = h.node.active_segment
    durable = int((h.cdc_raw / live.path.name.replace(".log", "_cdc.idx")).read_text())
    acknowledged = saved_positions(h.state_dir)[live.descriptor.segment_id]["position"]
    assert acknowledged < durable

    runner = CliRunner()
    result = runner.invoke(app, ["agent", "status", "--config", str(h.config_file())], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = status_rows(result.output)
    assert set(rows) == {name for name in h.segment_files() if name.endswith(".log")}
    for name, cells in rows.items():
        if name == live.path.name:
            assert cells == [str(durable), "writing", str(acknowledged), str(durable - acknowledged), "in progress"]
        else:
            assert cells[1:] == ["COMPLETED", cells[0], "0", "published"]
    # Without a configuration file, and before the agent ever ran: nothing acknowledged.
    result = runner.invoke(app, ["agent", "status", "--cdc-raw", str(h.cdc_raw), "--state-dir", str(tmp_path / "none")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = status_rows(result.output)
    assert rows and all(cells[2] == "-" and cells[4] == "in progress" for cells in rows.values())
    # A mistyped directory: one line that names it.
    missing = tmp_path / "no-such-cdc_raw"
    result = runner.invoke(app, ["agent", "status", "--cdc-raw", str(missing), "--state-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"error: {missing} is not a directory" in result.output


def status_rows(output: str) -> dict[str, list[str]]:
    """The table ``agent status`` prints: segment -> the other cells."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0].endswith(".log"):
            rows[cells[0]] = cells[1:]
    return rows


# --- configuration -------------------------------------------------------------------------------------------

BASE_CONFIG = {"server": "prod", "cdc_raw": "/tmp", "state_dir": "/tmp/state", "schema": {"file": "/tmp/s.cql"},
               "kafka": {"bootstrap_servers": "127.0.0.1:9092"}}


def with_changes(**changes: Any) -> dict[str, Any]:
    config = json.loads(json.dumps(BASE_CONFIG))
    for dotted, value in changes.items():
        node = config
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return config


@pytest.mark.parametrize("text, message", [
    (yaml.safe_dump(with_changes(kafka__bootstrap_servers=None)), "kafka.bootstrap_servers: Field required"),
    (yaml.safe_dump(with_changes(server=None)), "server: Field required"),
    (yaml.safe_dump(with_changes(server="prod/eu")), "server: use letters"),
    (yaml.safe_dump(with_changes(kafka__bootstrap_server="x:1")),
     "kafka.bootstrap_server: not a setting here"),
    (yaml.safe_dump(with_changes(schema={"file": "/a.cql", "cassandra": {}})), "exactly one of schema.file"),
    (yaml.safe_dump(with_changes(schema={})), "exactly one of schema.file"),
    (yaml.safe_dump(with_changes(cleanup={"mode": "archive"})), "needs cleanup.archive_dir"),
    (yaml.safe_dump(with_changes(cleanup={"mode": "command"})), "needs cleanup.command"),
    (yaml.safe_dump(with_changes(cleanup={"mode": "shred"})), "cleanup.mode: Input should be"),
    (yaml.safe_dump(with_changes(poll_interval_ms=0)), "poll_interval_ms: Input should be greater"),
    (yaml.safe_dump(with_changes(metrics={"port": 70000})), "metrics.port: Input should be less"),
    (yaml.safe_dump(with_changes(kafka__producer={"acks": "1", "linger.ms": 50})),
     "kafka.producer: acks cannot be changed"),
    (yaml.safe_dump(with_changes(node_id="n" * 300)), "node_id: must be 1 to 255 bytes"),
    ("server: [unclosed\n", "while parsing"),
    ("- a\n- b\n", "must be a YAML mapping"),
])
def test_config_errors_name_the_file_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_config_errors_stop_the_command_with_one_line(tmp_path: Path) -> None:
    """The command exits 2 with a one-line error, before anything starts (no topic, no state)."""
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(with_changes(kafka__bootstrap_servers=None, state_dir=str(tmp_path / "state"))))
    runner = CliRunner()
    result = runner.invoke(app, ["agent", "--config", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {path}: kafka.bootstrap_servers: Field required"
    assert not (tmp_path / "state").exists()
    # Flags alone: the same validation, "command line" as the source.
    result = runner.invoke(app, ["agent", "--cdc-raw", str(tmp_path), "--server", "x"])
    assert result.exit_code == 2 and result.output.startswith("error: command line: ")
    # Flags override the file.
    config = load_config(path, {"kafka.bootstrap_servers": "h:1", "node_id": "n7"})
    assert config.kafka.bootstrap_servers == "h:1" and config.node_id == "n7"
    assert config.raw_topic == "prod.raw" and config.schema_topic == "prod" and config.errors_topic == "prod.errors"


def test_missing_paths_are_configuration_errors(tmp_path: Path) -> None:
    """A cdc_raw directory or schema file that does not exist stops the agent with a one-line error."""
    schema = tmp_path / "schema.cql"
    schema.write_text(SCHEMA_CQL)
    base = with_changes(state_dir=str(tmp_path / "state"), schema={"file": str(schema)},
                        kafka={"bootstrap_servers": "127.0.0.1:1"}, metrics={"port": 0})
    runner = CliRunner()
    for changes, fragment in (({"cdc_raw": str(tmp_path / "nowhere")}, "nowhere"),
                              ({"cdc_raw": str(tmp_path), "schema": {"file": str(tmp_path / "none.cql")}}, "none.cql")):
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump({**base, **changes}))
        result = runner.invoke(app, ["agent", "--config", str(path)])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ") and fragment in result.output and len(result.output.splitlines()) == 1


# --- segments the agent cannot read whole ----------------------------------------------------------------

ENCRYPTED_SEGMENT = COMMITLOGS / "3.4-encrypted" / "CommitLog-6-1480001790338.log"
KEYSTORE = COMMITLOGS / "keystores" / "cassandra.keystore"


def quarantined_whole(h: Harness, name: str) -> Path:
    return h.state_dir / "quarantine" / name


def flip_header_crc(path: Path) -> None:
    data = bytearray(path.read_bytes())
    crc_offset = 14 + int.from_bytes(data[12:14], "big")  # version 4, id 8, params length 2, params
    data[crc_offset] ^= 0xFF
    path.write_bytes(bytes(data))


def random_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:64] = bytes(range(7, 71))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [flip_header_crc, random_header])
def test_segment_whose_header_cannot_be_read_is_kept_whole_and_reported(
        harness: MakeHarness, damage: Callable[[Path], None]) -> None:
    """A COMPLETED segment the agent cannot open is neither skipped nor deleted: it is moved, byte for byte
    and with its idx, into the quarantine, named on the errors topic and counted; the next one is read."""
    h = harness(segment_size=32 * 1024)
    h.write(100)
    unreadable = h.node.active_segment
    unreadable_id = unreadable.descriptor.segment_id
    h.write(400)  # rolls over: later segments are readable
    h.node.close()
    assert h.node.active_segment is None or h.node.active_segment.descriptor.segment_id != unreadable_id
    damage(h.cdc_raw / unreadable.path.name)
    original = (h.cdc_raw / unreadable.path.name).read_bytes()
    index = h.cdc_raw / f"{unreadable.path.stem}_cdc.idx"
    index_text = index.read_text()
    expected = {k: v for k, v in h.expected.items() if k[0] != unreadable_id}
    with running(h.config()) as agent:
        raw = h.raw_reader()
        errors = h.reader(f"{h.server}.errors")
        raw.wait_for(lambda: raw.has_all(expected), "the readable segments")
        errors.wait_for(lambda: errors.messages, "the unreadable segment on the errors topic")
        wait_until(lambda: not h.segment_files(), "cdc_raw emptied")
        assert metric(agent, "cdc_agent_segments_quarantined_total") == 1
        assert metric(agent, "cdc_agent_errors_total", kind="unreadable_header") == 1
        raw.poll(0.2)
    assert_published_exactly(raw, expected)
    assert quarantined_whole(h, unreadable.path.name).read_bytes() == original
    assert quarantined_whole(h, index.name).read_text() == index_text
    letter = json.loads(errors.messages[0].value())
    assert letter["segment"] == unreadable.path.name and letter["kind"] == "UNREADABLE_HEADER"
    assert letter["kept_whole_in"] == str(quarantined_whole(h, unreadable.path.name))


def test_bad_sync_marker_keeps_the_segment_whole(harness: MakeHarness) -> None:
    """Cassandra's reader stops at a sync marker whose CRC fails (it cannot know where the sections after it
    are): the agent publishes what comes before, reports the damage, and moves the segment whole into the
    quarantine instead of deleting the intact entries after the marker with it."""
    h = harness(segment_size=1024 * 1024)
    users = SCHEMA.table("ks", "users")
    segment = h.node.active_segment
    segment_id = segment.descriptor.segment_id
    before = [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10)]
    h.node.sync()
    after = [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10, 20)]
    h.node.sync()
    h.node.close()
    # Plain segment: the second section's marker sits right after the first section's last entry.
    marker = before[-1]
    with open(h.cdc_raw / segment.path.name, "r+b") as f:
        f.seek(marker + 4)
        crc = f.read(1)
        f.seek(marker + 4)
        f.write(bytes([crc[0] ^ 0xFF]))
    original = (h.cdc_raw / segment.path.name).read_bytes()
    for position in after:
        del h.expected[(segment_id, position, users.id)]
    with running(h.config()) as agent:
        raw = h.raw_reader()
        errors = h.reader(f"{h.server}.errors")
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes before the bad marker")
        wait_until(lambda: not h.segment_files(), "cdc_raw emptied")
        errors.wait_for(lambda: errors.messages, "the damage on the errors topic")
        assert metric(agent, "cdc_agent_segments_quarantined_total") == 1
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    letter = json.loads(errors.messages[0].value())
    assert letter["kind"] == "BAD_SYNC_MARKER_CRC" and letter["file_offset"] == marker
    assert quarantined_whole(h, segment.path.name).read_bytes() == original
    assert (h.state_dir / "quarantine" / f"{segment.path.stem}_cdc.idx").exists()


def test_idx_offset_past_the_end_of_the_segment_is_reported(harness: MakeHarness,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """An idx file saying more is durable than the segment holds: a warning naming the file, and the segment
    kept whole rather than deleted."""
    h = harness()
    h.write(50)
    segment = h.node.active_segment
    h.node.close()
    size = (h.cdc_raw / segment.path.name).stat().st_size
    (h.cdc_raw / f"{segment.path.stem}_cdc.idx").write_text(f"{size + 4096}\nCOMPLETED")
    with caplog.at_level(logging.WARNING), running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        wait_until(lambda: not h.segment_files(), "cdc_raw emptied")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(segment.path.name in message and str(size + 4096) in message for message in warnings)
    assert quarantined_whole(h, segment.path.name).exists()


@pytest.mark.parametrize("text, offset, completed", [
    ("4096\n", 4096, False), ("4096\nCOMPLETED\n", 4096, True), ("4096\r\nCOMPLETED\r\n", 4096, True)])
def test_idx_file_ending_with_a_line_break_is_read(tmp_path: Path, text: str, offset: int,
                                                   completed: bool) -> None:
    """``echo 4096 > x_cdc.idx`` writes a trailing newline: the offset is read, not retried as mid-rewrite."""
    path = tmp_path / "CommitLog-7-1_cdc.idx"
    path.write_text(text, newline="")
    index = read_cdc_index(path)
    assert index is not None and (index.offset, index.completed) == (offset, completed)


def offline_config_file(tmp_path: Path, cdc_raw: Path, **changes: Any) -> Path:
    """An agent configuration for tests that stop before Kafka is contacted."""
    schema = tmp_path / "schema.cql"
    schema.write_text(SCHEMA_CQL)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(with_changes(cdc_raw=str(cdc_raw), state_dir=str(tmp_path / "state"),
                                                schema={"file": str(schema)}, metrics={"port": 0},
                                                kafka={"bootstrap_servers": "127.0.0.1:1"}, **changes)))
    return path


def encrypted_cdc_raw(tmp_path: Path) -> Path:
    cdc_raw = tmp_path / "cdc_raw"
    cdc_raw.mkdir()
    (cdc_raw / ENCRYPTED_SEGMENT.name).write_bytes(ENCRYPTED_SEGMENT.read_bytes())
    return cdc_raw


@pytest.mark.parametrize("encryption, message", [
    ({}, "no key for alias 'testing:1'"),
    ({"keys": {"testing:1": "00" * 16}}, "does not decrypt with the key of alias 'testing:1'"),
])
def test_encrypted_segment_without_its_key_is_a_configuration_error(
        tmp_path: Path, encryption: dict[str, Any], message: str) -> None:
    """A segment the keys given cannot decrypt stops the agent at start (exit 2, one line naming the segment),
    before anything is read; the segment stays in cdc_raw."""
    cdc_raw = encrypted_cdc_raw(tmp_path)
    path = offline_config_file(tmp_path, cdc_raw, encryption=encryption)
    result = CliRunner().invoke(app, ["agent", "--config", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {cdc_raw / ENCRYPTED_SEGMENT.name}: ") \
        and message in lines[0], result.output
    assert (cdc_raw / ENCRYPTED_SEGMENT.name).read_bytes() == ENCRYPTED_SEGMENT.read_bytes()


@pytest.mark.parametrize("encryption, message", [
    ({"keystore": str(KEYSTORE), "keystore_password": "wrong"}, "cannot open keystore"),
    ({"keystore": str(KEYSTORE), "keystore_password": "cassandra", "key_password": "wrong"},
     "wrong key password for alias"),
    ({"keystore": "/nonexistent/cassandra.keystore", "keystore_password": "cassandra"}, "No such file"),
    ({"keys": {"testing:1": "not hex"}}, "encryption.keys"),
])
def test_keystore_errors_stop_the_agent_with_one_line(tmp_path: Path, encryption: dict[str, Any],
                                                      message: str) -> None:
    path = offline_config_file(tmp_path, tmp_path, encryption=encryption)
    result = CliRunner().invoke(app, ["agent", "--config", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: encryption."), result.output
    assert message in lines[0]


def test_encrypted_segment_with_its_key_is_published_and_cleaned_up(harness: MakeHarness) -> None:
    """The real encrypted segment, its keystore given: read to the end and deleted, nothing quarantined."""
    h = harness()
    (h.cdc_raw / ENCRYPTED_SEGMENT.name).write_bytes(ENCRYPTED_SEGMENT.read_bytes())
    config = h.config(encryption={"keystore": str(KEYSTORE), "keystore_password": "cassandra"})
    with running(config) as agent:
        wait_until(lambda: ENCRYPTED_SEGMENT.name not in h.segment_files(), "the encrypted segment published")
        assert metric(agent, "cdc_agent_segments_quarantined_total") == 0
    assert not list((h.state_dir / "quarantine").iterdir())


# --- what the agent says and writes -----------------------------------------------------------------------

def test_kafka_unreachable_is_said_in_one_line(harness: MakeHarness) -> None:
    """While nothing answers at the bootstrap servers, the agent says so once; librdkafka's retries (several
    failed connections a second, a new admin client at each startup attempt) stay out of its output."""
    h = harness()
    config_file = h.config_file(kafka__bootstrap_servers=f"127.0.0.1:{free_port()}")
    with AgentProcess(config_file, h.root / "agent.log") as agent:
        wait_until(lambda: "unreachable" in agent.output(), "Kafka reported unreachable")
        time.sleep(2 * agent_module.STARTUP_KAFKA_TIMEOUT_SECONDS)  # two more attempts to reach it
        assert agent.terminate() == 0
    lines = agent.output().splitlines()
    assert len([line for line in lines if "unreachable" in line]) == 1, lines
    assert not [line for line in lines if line.startswith("%")], lines


def test_files_the_agent_writes_are_private_whatever_the_umask(harness: MakeHarness) -> None:
    """Under umask 000: the state directory and the quarantine 0700, positions and quarantined bytes 0600."""
    h = harness()
    _, first_end = h.insert("ks.users", id=1, name="damaged")
    h.write(50)
    segment = h.node.active_segment.path.name
    h.node.close()
    with open(h.cdc_raw / segment, "r+b") as f:  # the first entry's last body byte: its CRC fails
        f.seek(first_end - 5)
        byte = f.read(1)
        f.seek(first_end - 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    previous = os.umask(0)
    try:
        with running(h.config()):
            wait_until(lambda: not h.segment_files(), "the segment published")
            wait_until(lambda: (h.state_dir / STATE_FILE).exists(), "the positions saved")
    finally:
        os.umask(previous)
    quarantine = h.state_dir / "quarantine"
    written = (h.state_dir / STATE_FILE, *quarantine.iterdir())  # positions, the entry's report and bytes
    files = {path.name: stat.S_IMODE(path.stat().st_mode) for path in written}
    assert len(files) == 3 and set(files.values()) == {0o600}, files
    assert [stat.S_IMODE(path.stat().st_mode) for path in (h.state_dir, quarantine)] == [0o700, 0o700]


def limit_file_size() -> None:
    """In the child process: regular files cannot grow past a few bytes (as on a full disk, writes fail)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def test_positions_that_cannot_be_saved_stop_the_agent_with_one_line(harness: MakeHarness) -> None:
    """A write to state_dir failing (no space, file size limit) leaves no temporary file behind and stops the
    agent with one line naming positions.json and what to do, not a traceback."""
    h = harness()
    h.write(100)
    command = [str(CLI), "agent", "--config", str(h.config_file())]
    result = subprocess.run(command, preexec_fn=limit_file_size, capture_output=True, text=True,
                            timeout=DEADLINE)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert f"{h.state_dir / STATE_FILE}: cannot save the agent's positions" in errors[0]
    assert "free space in" in errors[0]
    assert sorted(path.name for path in h.state_dir.iterdir()) == ["quarantine"]
    assert len(h.segment_files()) == 2  # nothing cleaned up without its completion saved


def test_agent_status_with_a_corrupt_state_file_says_so_in_one_line(harness: MakeHarness) -> None:
    h = harness()
    h.state_dir.mkdir()
    (h.state_dir / STATE_FILE).write_text('{"version": 1, "segments": {"1000": ')
    result = CliRunner().invoke(app, ["agent", "status", "--cdc-raw", str(h.cdc_raw),
                                      "--state-dir", str(h.state_dir)])
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {h.state_dir / STATE_FILE}: unreadable agent state")


def lose_the_last_batches(broker: EmbeddedBroker, topic: str) -> int:
    """Stop the broker and take from each partition of a topic its last record batch, as a broker restarted
    without what it had acknowledged would; return how many records are gone."""
    broker.stop()
    saved = broker.data_dir / "kafka.json"
    state = json.loads(saved.read_text())
    lost = 0
    for name, data in state["topics"]:
        for _, partition in data["partitions"] if name == topic else ():
            batches = partition["record_batches"]
            if len(batches) < 2:
                continue
            first_lost = batches.pop()[0]
            count = partition["high_watermark"] - first_lost
            partition["high_watermark"] = first_lost
            # The producer's last sequence as the remaining batches leave it (and its last batch's offset).
            partition["producer_seqs"] = [[producer, [sequence - count, batches[-1][0]]]
                                          for producer, (sequence, _) in partition["producer_seqs"]]
            lost += count
    saved.write_text(json.dumps(state))
    broker.start()
    return lost


def test_broker_that_lost_acknowledged_records_stops_the_agent_with_one_line(
        broker: EmbeddedBroker, harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """Kafka comes back without records it had acknowledged: the idempotent producer's next request fails for
    good (OUT_OF_ORDER_SEQUENCE_NUMBER). The agent stops with one error line saying so, exit status 1, no
    traceback, and saves no position past what it had saved before."""
    h = harness()
    agent = Agent(h.config())
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(status=agent.run()), daemon=True)
    thread.start()
    try:
        raw = h.raw_reader()
        for _ in range(10):  # several batches per partition
            h.write(20, sync_every=20)
            raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        raw.close()
        segment = h.node.active_segment.descriptor.segment_id
        read = max(position for (segment_id, position, _) in h.expected if segment_id == segment)
        wait_until(lambda: saved_positions(h.state_dir).get(segment, {}).get("position") == read,
                   "the position saved")
        with caplog.at_level(logging.INFO):
            assert lose_the_last_batches(broker, h.raw_topic) > 0
            h.write(100)
            thread.join(DEADLINE)
    finally:
        agent.stop()
        thread.join(DEADLINE)
    assert outcome == {"status": 1}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "Kafka lost records it had acknowledged" in errors[0], errors
    assert not any("everything read is acknowledged" in r.getMessage() for r in caplog.records)
    assert saved_positions(h.state_dir)[segment]["position"] == read


@pytest.mark.parametrize("encryption", [{}, {"keys": {"testing:1": "00" * 16}}])
def test_encrypted_segment_arriving_without_its_key_stops_the_agent(harness: MakeHarness,
                                                                   encryption: dict[str, Any],
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A segment moved into cdc_raw while the agent runs, that the keys given cannot decrypt: the agent stops
    with exit status 2 and one line naming it, and the segment stays where it is."""
    h = harness()
    agent = Agent(h.config(encryption=encryption))
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(status=agent.run()), daemon=True)
    caplog.set_level(logging.INFO)
    thread.start()
    try:
        wait_until(lambda: "tailing" in caplog.text, "the agent started")
        moving = h.root / ENCRYPTED_SEGMENT.name
        moving.write_bytes(ENCRYPTED_SEGMENT.read_bytes())
        moving.rename(h.cdc_raw / moving.name)  # as Cassandra 3.x moves a segment in: whole
        thread.join(DEADLINE)
    finally:
        agent.stop()
        thread.join(DEADLINE)
    assert outcome == {"status": 2}
    errors = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.ERROR and r.name.startswith("cassandra_cdc")]
    assert len(errors) == 1 and str(h.cdc_raw / ENCRYPTED_SEGMENT.name) in errors[0], errors
    assert (h.cdc_raw / ENCRYPTED_SEGMENT.name).read_bytes() == ENCRYPTED_SEGMENT.read_bytes()
