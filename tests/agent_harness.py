"""The harness of the agent's tests (test_agent_*.py): a real broker and real segments; what reaches Kafka
is exactly what the node wrote.

One ``noida-db`` broker serves each test module (``broker``); every test gets its own topics (``server=``). A
``SimulatedNode`` writes segments, ``_cdc.idx`` files and ``cdc_raw`` as Cassandra 3.x / 4.x do, and
records, per mutation, the (segment, position, table) the agent must publish and the exact partition
update bytes. The tests consume the topics and compare: every expected change present, nothing else,
duplicates only after ``kill -9``. The agent runs in a thread (``Agent.run``/``stop``) or, for
``kill -9`` and SIGTERM, as the ``cassandra-cdc`` command.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import signal
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
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from cassandra_cdc.agent import Agent, AgentConfig
from cassandra_cdc.agent.positions import STATE_FILE
from cassandra_cdc.agent.truncations import Truncation
from cassandra_cdc.commitlog import Mutation
from cassandra_cdc.storage import PartitionUpdateSerializer
from cassandra_cdc.storage.binary_io import DataInput, DataOutput
from cassandra_cdc.schema import Schema, parse_schema
from cassandra_cdc.simulator import EmbeddedBroker, Insert, SimulatedNode, Workload, to_mutation
from cassandra_cdc.kafka.raw_records import RawRecord, TruncationRecord, is_truncation, record_key

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


class NodeTruncations:
    """A node's ``system.local.truncated_at`` as a test sets it, in place of the CQL reader of
    ``TruncationWatch`` (test_real_e2e.py reads a real node's)."""

    def __init__(self, *truncations: Truncation, node: str = "node1") -> None:
        self.truncations = list(truncations)
        self.node = node

    def read(self) -> list[Truncation]:
        return list(self.truncations)

    def close(self) -> None:
        pass


Key = tuple[int, int, uuid.UUID]  # (segment id, position, table id) of one expected raw record

ENCRYPTED_SEGMENT = COMMITLOGS / "3.4-encrypted" / "CommitLog-6-1480001790338.log"
KEYSTORE = COMMITLOGS / "keystores" / "cassandra.keystore"


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
        # Per partition, its truncation records, each with how many of the partition's records came before.
        self.truncations: dict[int, list[tuple[int, TruncationRecord]]] = collections.defaultdict(list)
        super().__init__(broker, topic)

    def _received(self, batch: list[Any]) -> None:
        now = time.monotonic()
        for message in batch:
            if is_truncation(message.value()):
                truncation = TruncationRecord.decode(message.value())
                assert message.key() == truncation.key()
                partition = message.partition()
                self.truncations[partition].append((len(self.by_partition[partition]), truncation))
                continue
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
