"""Shared fixtures: where the real Cassandra files are, and their schemas."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from typing import Any, Iterator

from cassandra_cdc import settings
from cassandra_cdc.commitlog import Entry, KeyStore, SegmentReader
from cassandra_cdc.schema import Schema, load_schema_files

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CASSANDRA_CDC_SHARED", REPO.parent / "shared"))
COMMITLOGS = SHARED / "cassandra-commitlogs"
SSTABLES = SHARED / "cassandra-sstables"
DATA = Path(__file__).resolve().parent / "data"

# Real segment directories with 3.0+ mutations: (directory, Cassandra version of its system tables,
# keystore needed).
REAL_DIRECTORIES = {
    "3.0.13-encrypted": ("3.0.13", None),
    "3.0.29-encrypted": ("3.0.29", None),
    "3.4-encrypted": ("3.4", "cassandra.keystore"),
    "3.4-encrypted-2016": ("3.4", "cassandra-2015.keystore"),
    "4.0.11-encrypted": ("4.0.11", None),
}


def real_segments(directory: str) -> list[Path]:
    return sorted((COMMITLOGS / directory).glob("*.log"))


def upgrade_table_schema(directory: str) -> Schema:
    """The CommitLogUpgradeTestMaker table of a real directory (its own id)."""
    name = directory.removesuffix("-encrypted").replace("-encrypted-", "-")
    return load_schema_files([DATA / "legacy_commitlog_tables" / f"{name}.cql"])


def full_schema(directory: str) -> Schema:
    """System tables of the Cassandra version that wrote the directory, plus its test table."""
    version, _ = REAL_DIRECTORIES[directory]
    schema = load_schema_files([DATA / "system_schemas" / f"cassandra-{version}.cql"])
    schema.merge(upgrade_table_schema(directory))
    return schema


def keystore_for(directory: str) -> KeyStore | None:
    _, keystore = REAL_DIRECTORIES[directory]
    return KeyStore.load(COMMITLOGS / "keystores" / keystore, "cassandra") if keystore else None


def read_hash_txt(directory: str) -> dict[str, str]:
    lines = (COMMITLOGS / directory / "hash.txt").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


@pytest.fixture(autouse=True, scope="session")
def _shared_files_present() -> None:
    if not COMMITLOGS.is_dir():
        pytest.exit(f"the real Cassandra files are missing: {COMMITLOGS} (set CASSANDRA_CDC_SHARED)", returncode=3)


@pytest.fixture(autouse=True)
def _secrets_redacted_within_their_test() -> Iterator[None]:
    """The secrets a test's settings register are redacted from the logs of that test only.

    The redactor is process-wide (a process runs one configuration), and a filter of every handler of the
    root logger once logging is configured in-process, pytest's among them: a secret such as the password
    "p" would otherwise take every "p" out of the logs of each later test of the worker.
    """
    before = set(settings._redactor.secrets)
    yield
    settings._redactor.secrets.intersection_update(before)


def close_kafka_clients_kept() -> None:
    """Close the Kafka clients the pipeline's code keeps per process (when tests ran it in this one) before
    their broker stops: left open, they retry its connections and log every refusal until the run ends."""
    if any(module in sys.modules for module in ("cassandra_cdc.kafka.schema_catalog",
                                                  "cassandra_cdc.pipeline.event_sink",
                                                  "cassandra_cdc.pipeline.kafka_source")):
        from cassandra_cdc.pipeline.change_processor import close_worker_clients

        close_worker_clients()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One embedded Kafka-protocol broker (noida-db on loopback) for the whole run; tests use their own topics."""
    from cassandra_cdc.simulator import EmbeddedBroker

    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as running:
        yield running
        close_kafka_clients_kept()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] Spark session for the whole run (starting one costs ~10 s)."""
    from cassandra_cdc.pipeline.kafka_source import KafkaDataSource
    from cassandra_cdc.pipeline.spark_session import spark_session

    session = spark_session(app_name="cassandra-cdc-tests")
    session.dataSource.register(KafkaDataSource)
    yield session
    session.stop()


RAW_TOPIC_PARTITIONS = 4


def start_agents(cluster: Any, broker: Any, server: str, root: Path) -> list[tuple[Any, Any]]:
    """One in-process agent per simulated node (schema from ``root/schema.cql``); stop with ``stop_agents``."""
    import threading

    from confluent_kafka.admin import AdminClient

    from cassandra_cdc.agent import Agent, load_config
    from cassandra_cdc.kafka.admin import create_missing_topics

    # Created before the agents, as an operator would: a real broker can auto-create the raw topic with one
    # partition when a client asks for its metadata before the agents' own creation lands (seen once in five
    # runs; which client asks is not known yet).
    create_missing_topics(AdminClient({"bootstrap.servers": broker.bootstrap_servers}),
                          {f"{server}.raw": (RAW_TOPIC_PARTITIONS, False)}, timeout=60)
    agents = []
    for node in cluster.nodes:
        config = load_config(None, {
            "server": server, "node_id": node.node_id, "cdc_raw": str(node.cdc_raw_dir),
            "state_dir": str(root / f"state-{node.node_id}"), "schema.file": str(root / "schema.cql"),
            "kafka.bootstrap_servers": broker.bootstrap_servers, "metrics.port": 0,
            "kafka.raw_topic_partitions": RAW_TOPIC_PARTITIONS})
        agent = Agent(config)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        agents.append((agent, thread))
    return agents


def require_jvm_artifacts(*also_needed: Any) -> None:
    """Skip when `make install` has not fetched the real Cassandra and Kafka (nor what each of
    ``also_needed``, a check of ``localcluster.artifacts``, checks); fail instead when
    CASSANDRA_CDC_REQUIRE_JVM is set (as `make test` sets it), so CI never skips them silently."""
    from cassandra_cdc.localcluster import missing_reason

    reason = missing_reason(*also_needed)
    if reason is None:
        return
    if os.environ.get("CASSANDRA_CDC_REQUIRE_JVM"):
        pytest.fail(f"CASSANDRA_CDC_REQUIRE_JVM is set, but {reason}", pytrace=False)
    pytest.skip(f"real Cassandra and Kafka not installed: {reason}")


@pytest.fixture(scope="session")
def real_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real Apache Kafka broker (KRaft, loopback) for the whole run; tests use their own topics."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import KafkaBroker

    with KafkaBroker(tmp_path_factory.mktemp("real-kafka")) as running:
        yield running
        close_kafka_clients_kept()


# The SSTable format each node of ``real_cassandra`` writes.
REAL_CASSANDRA_FORMATS = ("big", "big", "bti")


@pytest.fixture(scope="session")
def real_cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Three real Cassandra 5.0 nodes with CDC (127.0.0.1-3) for the whole run; tests use their own
    keyspaces. The first two write SSTables in the ``big`` format, the third in ``bti``: one cluster's
    snapshots hold both formats Cassandra 5.0 writes."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import CassandraCluster, sstable_format

    with CassandraCluster(tmp_path_factory.mktemp("real-cassandra"), nodes=3,
                          node_configs=[sstable_format(f) for f in REAL_CASSANDRA_FORMATS]) as running:
        yield running


# The 4.x clusters have one node each: what they add to the 5.0 cluster's tests is their versions' files and
# system tables, which one node writes; the suite's time allows no more.
@pytest.fixture(scope="session")
def real_cassandra_4_1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Cassandra 4.1 node with CDC (127.0.0.1, on Java 11) for the whole run."""
    yield from _cassandra_4(tmp_path_factory, "4.1")


@pytest.fixture(scope="session")
def real_cassandra_4_0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Cassandra 4.0 node with CDC (127.0.0.1, on Java 11) for the whole run."""
    yield from _cassandra_4(tmp_path_factory, "4.0")


def _cassandra_4(tmp_path_factory: pytest.TempPathFactory, version: str) -> Iterator[Any]:
    from cassandra_cdc.localcluster import CassandraCluster
    from cassandra_cdc.localcluster.artifacts import check_cassandra

    require_jvm_artifacts(lambda: check_cassandra(version))
    with CassandraCluster(tmp_path_factory.mktemp(f"real-cassandra-{version}"), nodes=1,
                          version=version) as running:
        yield running


# The fixture of the real cluster of each Cassandra version.
REAL_CLUSTERS = {"5.0": "real_cassandra", "4.1": "real_cassandra_4_1", "4.0": "real_cassandra_4_0"}


def read_in_steps(path: str | Path, keystore: KeyStore | None, limits: list[int]) -> list[Entry]:
    """Read a segment as the agent reads one being written: up to each limit in turn (the durable offset of
    its ``_cdc.idx``), each read resuming where the one before stopped, then to the end."""
    entries: list[Entry] = []
    start, resume = 0, None
    for limit in [*limits, None]:
        with SegmentReader(path, keystore, start=start, limit=limit, resume=resume) as reader:
            entries += reader.entries()
            assert reader.damage == []
            start, resume = reader.position, reader.resume_point
    assert reader.finished
    return entries


def entry_fields(entries: list[Entry]) -> list[tuple]:
    return [(e.start, e.position, e.body, e.section_offset, e.section) for e in entries]
