"""The real system in tests: the agents (one per node of ``real_cassandra``) and the pipeline as
``cassandra-cdc`` processes on real Kafka, and what their events replay to beside ``SELECT *``."""

from __future__ import annotations

import collections
import contextlib
import json
import statistics
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import yaml
from cassandra import ConsistencyLevel, OperationTimedOut, Unavailable, WriteFailure, WriteTimeout
from cassandra.cluster import EXEC_PROFILE_DEFAULT, NoHostAvailable
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from cassandra_cdc.demo.cql_workload import Workload, key_columns, table_rows
from cassandra_cdc.demo.processes import ChildProcess
from cassandra_cdc.demo.table_check import compare_rows, replay
from cassandra_cdc.kafka.consume import watermark_offsets
from cassandra_cdc.kafka.raw_records import RawRecord, TruncationRecord, is_truncation
from cassandra_cdc.kafka.schema_records import SchemaRecord
from cassandra_cdc.storage import PartitionUpdateSerializer
from cassandra_cdc.storage.binary_io import DataInput


@contextlib.contextmanager
def session_at_all(cluster: Any, schema: list[str]) -> Iterator[Any]:
    """A driver session to ``cluster`` whose statements run at CONSISTENCY ALL, once the ``schema``
    statements have run and every node agrees on the schema."""
    with cluster.driver() as driver:
        session = driver.connect()
        session.get_execution_profile(EXEC_PROFILE_DEFAULT).consistency_level = ConsistencyLevel.ALL
        for cql in schema:
            session.execute(cql)
        assert driver.control_connection.wait_for_schema_agreement(wait_time=60)
        yield session


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


def records_by_node(bootstrap_servers: str, topic: str, table: bytes) -> collections.Counter[str]:
    """How many raw records of ``table``'s updates (its id) each agent (node id) has on ``topic``."""
    return collections.Counter(RawRecord.decode(value).node_id for _, value in raw_records(
        bootstrap_servers, topic, table) if not is_truncation(value))


def digests_by_node(bootstrap_servers: str, topic: str, table: bytes) -> dict[str, set[bytes]]:
    """The writes to ``table`` (its id) each agent (node id) published to ``topic``, each as the digest of its
    partition update (the replicas' copies of a write are the same bytes): a record published again after a
    restart counts once."""
    digests: dict[str, set[bytes]] = collections.defaultdict(set)
    for _, value in raw_records(bootstrap_servers, topic, table):
        if not is_truncation(value):
            record = RawRecord.decode(value)
            digests[record.node_id].add(record.digest)
    return digests


def truncations_by_node(bootstrap_servers: str, topic: str,
                        table: bytes) -> collections.Counter[tuple[str, int]]:
    """How many truncation records of ``table`` each agent (node id) has in each partition of ``topic``."""
    return collections.Counter((TruncationRecord.decode(value).node_id, partition) for partition, value in
                               raw_records(bootstrap_servers, topic, table) if is_truncation(value))


def inserted_ids(bootstrap_servers: str, topic: str, table: bytes, schema: Any,
                 value: str) -> collections.Counter[int]:
    """The ids of the rows of ``table (id int PRIMARY KEY, v text)`` (its id) that the raw records on
    ``topic`` carry, decoded, with how often each is there; each row's ``v`` must be ``value``."""
    ids: collections.Counter[int] = collections.Counter()
    for _, record_value in raw_records(bootstrap_servers, topic, table):
        assert not is_truncation(record_value)
        record = RawRecord.decode(record_value)
        update = PartitionUpdateSerializer.deserialize(DataInput(record.update), schema,
                                                       record.commitlog_version)
        assert [cell.value for row in update.rows for cell in row.cells] == [value.encode()]
        ids[int.from_bytes(update.key, "big", signed=True)] += 1
    return ids


def agent_metrics(port: int) -> dict[str, float]:
    """An agent's metrics, scraped from its endpoint on 127.0.0.1: sample name -> value (samples without
    labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def raw_records(bootstrap_servers: str, topic: str, table: bytes) -> list[tuple[int, bytes]]:
    """The raw records of ``table`` (its id) on ``topic``: (partition, value)."""
    return [(partition, value) for partition, key, value in messages(bootstrap_servers, topic)
            if key.startswith(table)]


def messages(bootstrap_servers: str, topic: str) -> list[tuple[int, bytes, bytes]]:
    """Every record of ``topic`` (read_uncommitted): (partition, key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "unused",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending, records = set(partitions), []
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is not None:
                    pending.discard(message.partition())
                else:
                    records.append((message.partition(), message.key(), message.value()))
        return records
    finally:
        consumer.close()


def drops_by_node(bootstrap_servers: str, server: str, table: bytes) -> collections.Counter[str]:
    """How many drop records of ``table`` (its id) each agent (node id) has on ``<server>.table-schemas``."""
    topic = f"{server}.table-schemas"
    records = (SchemaRecord.decode(value) for _, _, value in messages(bootstrap_servers, topic))
    return collections.Counter(record.node for record in records
                               if record.dropped and uuid.UUID(record.table_id).bytes == table)


def table_id(session: Any, keyspace: str, table: str) -> bytes:
    """A table's id (16 bytes, as raw records' keys start) from ``system_schema`` (a session whose rows are
    named tuples or dicts)."""
    row = session.execute("SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
                          (keyspace, table)).one()
    return (row["id"] if isinstance(row, dict) else row.id).bytes


def create_single_replica_table(session: Any, keyspace: str, table: str) -> Any:
    """``keyspace`` (one replica) and its CDC table ``table (id int PRIMARY KEY, v text)``; the prepared
    ``INSERT`` of ``(id, v)``."""
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute(f"CREATE TABLE {keyspace}.{table} (id int PRIMARY KEY, v text) WITH cdc = true")
    return session.prepare(f"INSERT INTO {keyspace}.{table} (id, v) VALUES (?, ?)")


def topic_exists(bootstrap_servers: str, topic: str) -> bool:
    with AdminClient({"bootstrap.servers": bootstrap_servers}) as admin:
        return topic in admin.list_topics(timeout=10).topics


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
    """The agents and the pipeline of logical cluster ``server``, as processes, and how to restart them.
    ``tables``: the agents' ``tables.include`` patterns (none: every CDC table); ``schema_file``: where the
    agents read the schema (none: by CQL from their node); ``agent_settings``: more settings of every
    agent; ``nodes``: the nodes with an agent (default: every node of ``cluster``)."""

    def __init__(self, root: Path, cluster: Any, kafka: Any, server: str, tables: list[str] = (),
                 schema_file: Path | None = None, agent_settings: dict[str, Any] | None = None,
                 nodes: list[Any] | None = None) -> None:
        self.root = root
        self.server = server
        self.bootstrap_servers = kafka.bootstrap_servers
        self._tables = list(tables)
        self._schema_file = schema_file
        self._agent_settings = agent_settings or {}
        self.agents = [self.agent_of(node) for node in (cluster.nodes if nodes is None else nodes)]
        self.pipeline_config = write_yaml(root / "pipeline.yaml", {
            "server": server, "checkpoint": str(root / "checkpoint"),
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "max_offsets_per_trigger": 5000,
                      "events_topic_partitions": 2},
            "spark": {"master": "local[2]", "shuffle_partitions": 2, "trigger_interval": "500 milliseconds"}})
        self.pipeline = ChildProcess("pipeline", ["pipeline", "--config", str(self.pipeline_config)],
                                     root / "pipeline.log",
                                     ready_marker="pipeline running")

    def agent_config(self, node: Any) -> Path:
        return self.root / f"agent-{node.address}.yaml"

    def agent_of(self, node: Any, other_nodes: list[Any] = ()) -> ChildProcess:
        """The agent of ``node`` (not started), reading the schema by CQL from its node, or while it does not
        answer from ``other_nodes``."""
        contact_points = [node.address, *(other.address for other in other_nodes)]
        schema = ({"file": str(self._schema_file)} if self._schema_file is not None else
                  {"cassandra": {"contact_points": contact_points, "port": node.native_port}})
        config = write_yaml(self.agent_config(node), {
            "server": self.server, "node_id": node.address, "cdc_raw": str(node.cdc_raw_dir),
            "state_dir": str(self.root / f"agent-state-{node.address}"), "schema": schema,
            "kafka": {"bootstrap_servers": self.bootstrap_servers, "raw_topic_partitions": 3},
            "metrics": {"port": 0}, "poll_interval_ms": 200, "tables": {"include": self._tables},
            **self._agent_settings})
        return ChildProcess(f"agent {node.address}", ["agent", "--config", str(config)],
                            self.root / f"agent-{node.address}.log", ready_marker="tailing")

    def add_agent(self, node: Any, other_nodes: list[Any] = ()) -> ChildProcess:
        """Start the agent of a node that joins, before it serves CQL (``agent_of``)."""
        agent = self.agent_of(node, other_nodes).start()
        self.agents.append(agent)
        return agent

    def start_agents(self) -> None:
        """Start every agent and wait until each tails its node's cdc_raw."""
        for agent in self.agents:
            agent.start()
        wait_for(lambda: all(a.ready for a in self.agents), "the agents", 120, self.children)

    def start_pipeline(self) -> None:
        """Once the agents have made the raw topic, start the pipeline and wait until it runs."""
        wait_for(lambda: topic_exists(self.bootstrap_servers, f"{self.server}.raw"), "the raw topic", 60,
                 self.children)
        self.pipeline.start()
        wait_for(lambda: self.pipeline.ready, "the pipeline", 180, self.children)

    @property
    def children(self) -> list[ChildProcess]:
        return [*self.agents, self.pipeline]

    def logs(self) -> str:
        return "\n".join(f"--- {child.name}\n{child.log_tail(15)}" for child in self.children)

    def stop(self) -> None:
        for child in self.children:
            child.stop()


def differences_of(events: list[dict[str, Any]], session: Any, keyspace: str, table: str,
                   selected: tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]) -> list[str]:
    """How ``events``, replayed, differ from ``selected`` (``table_rows``)."""
    columns, expected = selected
    got = replay((("table", e) for e in events), "table", key_columns(session, keyspace, table))
    return compare_rows(got, expected, columns)


def read_twice(events: list[dict[str, Any]]) -> list[str]:
    """The events (as JSON) that are there more than once."""
    seen = collections.Counter(json.dumps(e, sort_keys=True) for e in events)
    return [event for event, count in seen.items() if count > 1]


def assert_replays_to_select(outcome: dict[str, Any], table: str) -> None:
    """A table of a run's ``outcome`` (``replayed_tables``' ``differences`` and ``tables``, the system's
    ``logs``) has rows, and its events replayed equal them."""
    differences = outcome["differences"][table]
    assert outcome["tables"][table][1], f"{table}: the workload left rows"
    assert differences == [], (f"{table}: {len(differences)} differences, first {differences[:10]}\n"
                               f"{outcome['logs']}")


def assert_no_event_twice(events: dict[str, list[dict[str, Any]]]) -> None:
    """No table's events (by table) hold one event twice."""
    for table, table_events in events.items():
        duplicates = read_twice(table_events)
        assert duplicates == [], f"{table}: {len(duplicates)} events twice, first {duplicates[:3]}"


class Replayed(NamedTuple):
    """Per table: its events (read_committed), its ``SELECT *`` (``table_rows``), how the events, replayed,
    differ from it."""

    events: dict[str, list[dict[str, Any]]]
    selected: dict[str, tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]]
    differences: dict[str, list[str]]


def replayed_tables(bootstrap_servers: str, session: Any, keyspace: str, server: str, tables: list[str],
                    timeout: float, children: list[ChildProcess]) -> Replayed:
    """The tables' events against their ``SELECT *``, read again until the events differ in nothing or
    ``timeout`` seconds have passed (then the differences left), ``children`` meanwhile checked to run."""
    topics = {table: f"{server}.{keyspace}.{table}" for table in tables}
    selected = {table: table_rows(session, keyspace, table) for table in tables}
    deadline = time.monotonic() + timeout
    while True:
        read = consume_events(bootstrap_servers, list(topics.values()))
        events = {table: read[topic] for table, topic in topics.items()}
        differences = {table: differences_of(events[table], session, keyspace, table, selected[table])
                       for table in tables}
        if not any(differences.values()) or time.monotonic() > deadline:
            return Replayed(events, selected, differences)
        for child in children:
            assert child.exit_code is None, f"{child.name} exited: {child.log_tail(30)}"
        time.sleep(2)


# --- a steady workload while the cluster changes ---------------------------------------------------------

# The tables SteadyWriter writes (``steps_table`` beside the CQL workload's).
STEADY_TABLES = ["rows", "collections", "types", "expiring", "steps"]
# The errors of a write at QUORUM while a node drains, stops or starts: the write is made again.
RETRIED = (NoHostAvailable, OperationTimedOut, Unavailable, WriteFailure, WriteTimeout)
# A steady load, not the most the nodes can take: the machine's two cores also run the nodes' restarts.
STEP_INTERVAL = 0.5


def steps_table(keyspace: str) -> str:
    return f"CREATE TABLE {keyspace}.steps (id int PRIMARY KEY, stage text) WITH cdc = true"


def steps_evented(events: list[dict[str, Any]]) -> dict[int, str]:
    """The steps whose row's insert has its event: id -> stage."""
    return {event["after"]["id"]: event["after"]["stage"] for event in events if event["op"] == "c"}


def steps_evented_more_than_once(events: list[dict[str, Any]]) -> dict[int, list[str]]:
    """The steps (each a row inserted once, never changed) with more than one event: id -> their ops."""
    ops: dict[int, list[str]] = collections.defaultdict(list)
    for event in events:
        ops[(event["after"] or event["before"])["id"]].append(event["op"])
    return {step: found for step, found in ops.items() if len(found) > 1}


def records_on(bootstrap_servers: str, topic: str) -> int:
    """How many records ``topic`` holds: the sum of its partitions' high watermarks."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "unused"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(watermark_offsets(consumer, topic, partition, timeout=10)[1] for partition in partitions)
    finally:
        consumer.close()


def lag_by_stage(events: list[dict[str, Any]]) -> dict[str, str]:
    """How long after its write each step's event was made (its ``ts_ms`` against ``source.ts_ms``), by
    stage: the median and the most, in seconds."""
    lags: dict[str, list[float]] = collections.defaultdict(list)
    for event in events:
        if event["op"] == "c":
            lags[event["after"]["stage"]].append((event["ts_ms"] - event["source"]["ts_ms"]) / 1000)
    return {stage: f"{statistics.median(values):.1f} / {max(values):.1f}" for stage, values in lags.items()}


class RetryingSession:
    """A session whose statements run at ``consistency`` (QUORUM) and run again when the cluster could not
    take them (a node draining, stopping or starting)."""

    def __init__(self, session: Any, attempts: int = 20, consistency: int = ConsistencyLevel.QUORUM) -> None:
        session.get_execution_profile(EXEC_PROFILE_DEFAULT).consistency_level = consistency
        self.session = session
        self.attempts = attempts
        self.retries = 0

    def execute(self, cql: str, values: Any = None, timeout: float | None = None) -> Any:
        for attempt in range(1, self.attempts + 1):
            try:
                return self.session.execute(cql, values, **({"timeout": timeout} if timeout else {}))
            except RETRIED:
                if attempt == self.attempts:
                    raise
                self.retries += 1
                time.sleep(0.5)


class SteadyWriter(threading.Thread):
    """The CQL workload (``cql_workload``) into ``keyspace`` in a loop, a step (~60 statements) every
    ``STEP_INTERVAL`` seconds at most, until stopped; the last statement of each step writes its id and
    the stage it ran in (``current_stage``) into the ``steps`` table, and ``acknowledged`` holds them.
    Steps are numbered from ``first_step`` (writers of one keyspace side by side: far apart), their
    statements run at ``consistency``."""

    def __init__(self, session: Any, keyspace: str, cassandra_version: str,
                 current_stage: Callable[[], str], first_step: int = 0,
                 consistency: int = ConsistencyLevel.QUORUM) -> None:
        super().__init__(name="steady writer", daemon=True)
        self.retrying = RetryingSession(session, consistency=consistency)
        self.first_step = first_step
        self.keyspace = keyspace
        self.write = Workload(self.retrying, keyspace, cassandra_version)
        self.current_stage = current_stage
        self.acknowledged: dict[int, str] = {}
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            step = self.first_step
            while not self._stopping.wait(STEP_INTERVAL):
                start = step * 10
                self.write.rows_table(start, 1)
                self.write.collections(start, 2)
                self.write.nested(start, 1)
                self.write.types(step % 100, 1)  # (its blob holds the id as a byte)
                self.write.others(start, 1)
                stage = self.current_stage()
                self.write(f"INSERT INTO {self.keyspace}.steps (id, stage) VALUES (%s, %s)", step, stage)
                self.acknowledged[step] = stage
                step += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def stop(self) -> None:
        self._stopping.set()
        self.join(120)
        assert not self.is_alive(), "the writer did not stop"
        if self.error is not None:
            raise self.error
