"""Metrics, health and readiness, scraped over HTTP as Prometheus and Kubernetes would from a running agent
and a running pipeline; the Grafana dashboard queries only what they export."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from cassandra_cdc.agent import AgentConfig
from cassandra_cdc.commitlog import SegmentReader
from cassandra_cdc.commitlog.mutation import split_partition_updates
from cassandra_cdc.demo.processes import ChildProcess
from cassandra_cdc.observability import build_version
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Cluster, Workload
from cassandra_cdc.simulator.broker import free_port

from agent_harness import running, wait_until
from conftest import COMMITLOGS, DATA, start_agents
from test_pipeline_io import read_topic

REAL_SEGMENT = COMMITLOGS / "4.0.11-encrypted" / "CommitLog-7-1699285478684.log"
# The real segment's table (CommitLogUpgradeTestMaker's), with CDC on so that the agent publishes it; the
# system tables of the Cassandra that wrote it, so that the agent can split every mutation of the segment.
TABLE_CQL = (DATA / "legacy_commitlog_tables" / "4.0.11.cql").read_text().replace(
    "CLUSTERING ORDER BY (col ASC)", "CLUSTERING ORDER BY (col ASC) AND cdc = true")
SYSTEM_CQL = (DATA / "system_schemas" / "cassandra-4.0.11.cql").read_text()
STANDARD1 = "Keyspace1.Standard1"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def serving(port: int) -> bool:
    try:
        return get(port, "/healthz")[0] == 200
    except urllib.error.URLError:  # not listening yet
        return False


def scrape(port: int) -> Samples:
    status, text = get(port, "/metrics")
    assert status == 200
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


EXPOSED_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}


def exported_names(port: int) -> set[str]:
    """Every name a query can use: the samples' and, for families without samples yet (a labelled counter
    nothing has counted), what their samples will be called."""
    names = set()
    for family in text_string_to_metric_families(get(port, "/metrics")[1]):
        names.add(family.name)
        names.update(family.name + suffix for suffix in EXPOSED_SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")
AGENT, PIPELINE = "cassandra_cdc_agent_", "cassandra_cdc_pipeline_"
OUR_PREFIXES = (AGENT, PIPELINE, "cassandra_cdc_build_info", "process_", "python_")


def dashboard_metrics() -> set[str]:
    """The metric names the dashboard's queries (panels and variables) select."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    variables = dashboard["templating"]["list"]
    queries += [variable["query"] for variable in variables if variable["type"] == "query"]
    return {name for query in queries for name in SELECTOR.findall(query)}


def test_the_dashboard_selects_only_metrics_the_scrape_tests_check() -> None:
    """Every metric of the dashboard has a prefix the scrape tests below check against what the agent or the
    pipeline exports; each component has panels."""
    names = dashboard_metrics()
    assert names and all(name.startswith(OUR_PREFIXES) for name in names), sorted(names)
    used = {prefix for prefix in OUR_PREFIXES if any(name.startswith(prefix) for name in names)}
    assert used == set(OUR_PREFIXES)


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def real_cdc_raw(root: Path, durable_at: float) -> tuple[Path, Path, collections.Counter[str]]:
    """A cdc_raw holding the real 4.0 segment, its idx COMPLETED at its end and written at ``durable_at``; the
    schema file; the mutations per table in it (read here without the agent)."""
    cdc_raw = root / "cdc_raw"
    cdc_raw.mkdir()
    schema_file = root / "schema.cql"
    schema_file.write_text(SYSTEM_CQL + "\n" + TABLE_CQL)
    schema = parse_schema(schema_file.read_text())
    per_table: collections.Counter[str] = collections.Counter()
    with SegmentReader(REAL_SEGMENT) as reader:
        for entry in reader.entries():
            for update in split_partition_updates(entry.body, schema, reader.version):
                per_table[schema.table_by_id_bytes(update[:16]).qualified_name] += 1
        end = reader.position
    shutil.copy(REAL_SEGMENT, cdc_raw)
    index = cdc_raw / REAL_SEGMENT.name.replace(".log", "_cdc.idx")
    index.write_text(f"{end}\nCOMPLETED")
    os.utime(index, (durable_at, durable_at))
    return cdc_raw, schema_file, per_table


def agent_config(root: Path, bootstrap_servers: str, port: int) -> AgentConfig:
    cdc_raw, schema_file = root / "cdc_raw", root / "schema.cql"
    return AgentConfig.model_validate({
        "server": f"obs{time.monotonic_ns()}", "node_id": "node1", "cdc_raw": str(cdc_raw),
        "state_dir": str(root / "state"), "schema": {"file": str(schema_file)},
        "kafka": {"bootstrap_servers": bootstrap_servers, "raw_topic_partitions": 3},
        "metrics": {"port": port, "host": "127.0.0.1"}, "poll_interval_ms": 200, "state_flush_ms": 50})


def test_agent_metrics_scraped_after_publishing_a_real_segment(tmp_path: Path, broker: object) -> None:
    """Every mutation of a real Cassandra 4.0 segment counted under its table, the published ones too; no lag
    once all is acknowledged; the standard process, Python and build metrics; healthy and ready."""
    _, _, per_table = real_cdc_raw(tmp_path, time.time() - 600)
    assert per_table[STANDARD1] > 300
    port = free_port()
    with running(agent_config(tmp_path, broker.bootstrap_servers, port)):  # type: ignore[attr-defined]
        wait_until(lambda: serving(port), "the metrics endpoint")
        wait_until(lambda: sample(scrape(port), f"{AGENT}records_published_total", table=STANDARD1)
                   == per_table[STANDARD1], "every record of the segment acknowledged")
        wait_until(lambda: sample(scrape(port), f"{AGENT}segments_pending") == 0, "the segment done")
        samples = scrape(port)
        for table, mutations in per_table.items():
            assert sample(samples, "cassandra_cdc_agent_mutations_read_total", table=table) == mutations
        published = {dict(labels)["table"] for name, labels in samples
                     if name == "cassandra_cdc_agent_records_published_total"}
        assert published == {STANDARD1}  # only the CDC table; no "errors" table among them
        assert sample(samples, "cassandra_cdc_agent_dead_letters_published_total") == 0
        assert sample(samples, "cassandra_cdc_agent_lag_seconds") == 0
        assert sample(samples, "cassandra_cdc_agent_behind_bytes") == 0
        assert sample(samples, "cassandra_cdc_agent_mutations_skipped_total") == 0
        assert sample(samples, "cassandra_cdc_build_info", version=build_version()) == 1
        assert build_version() != "unknown"
        assert sample(samples, "process_cpu_seconds_total") > 0
        assert sample(samples, "process_resident_memory_bytes") > 0
        assert any(name == "python_info" for name, _ in samples)
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (200, "ready\n")
        on_dashboard = {name for name in dashboard_metrics() if not name.startswith(PIPELINE)}
        assert on_dashboard - exported_names(port) == set()
    with pytest.raises(urllib.error.URLError):  # the endpoint stops with the agent
        get(port, "/healthz")


def test_agent_lag_and_readiness_while_kafka_is_unreachable(tmp_path: Path) -> None:
    """Kafka down at start: alive but not ready, and the lag is the age of the durable data not published."""
    durable_at = time.time() - 300
    real_cdc_raw(tmp_path, durable_at)
    port = free_port()
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        unreachable = f"127.0.0.1:{closed.getsockname()[1]}"
        with running(agent_config(tmp_path, unreachable, port)):
            wait_until(lambda: serving(port), "the metrics endpoint")
            status, reason = wait_until(
                lambda: (answer := get(port, "/readyz"))[1].count("unreachable") and answer,
                "the agent to find Kafka unreachable")
            assert status == 503 and unreachable in reason
            assert get(port, "/healthz") == (200, "ok\n")
            samples = scrape(port)
            assert sample(samples, "cassandra_cdc_agent_kafka_reachable") == 0
            lag = sample(samples, "cassandra_cdc_agent_lag_seconds")
            assert lag is not None and 300 <= lag < time.time() - durable_at + 1
            time.sleep(1.1)
            # It grows while nothing moves.
            assert sample(scrape(port), "cassandra_cdc_agent_lag_seconds") >= lag + 1


PIPELINE_SCHEMA = """
CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '3'};
CREATE TABLE shop.orders (id int, line int, item text, qty int, PRIMARY KEY (id, line))
    WITH ID = 3f1b5a8e-0000-4000-8000-000000000011 AND cdc = true;
CREATE TABLE shop.users (id int PRIMARY KEY, name text, email text)
    WITH ID = 3f1b5a8e-0000-4000-8000-000000000013 AND cdc = true;
"""


def events_by_table_and_op(kafka: Any, topics: list[str]) -> collections.Counter[tuple[str, str]]:
    """The events on the topics (read_committed, to each partition's end), counted by table and op."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for topic in topics:
        for _, _, _, value in read_topic(kafka, topic):
            if value is not None:
                payload = json.loads(value)["payload"]
                counts[(f"{payload['source']['keyspace']}.{payload['source']['table']}", payload["op"])] += 1
    return counts


def test_pipeline_metrics_scraped_from_the_driver_count_what_it_wrote(real_kafka: Any,
                                                                      tmp_path: Path) -> None:
    """The pipeline run as the command (local Spark, real Kafka) behind three simulated replicas' agents: the
    events counted by table and op are the events on the topics, the dead-lettered record is counted by its
    reason, each event's write → event lag is observed, batches are timed, nothing is behind at the end."""
    server = f"obsp{time.monotonic_ns()}"
    (tmp_path / "schema.cql").write_text(PIPELINE_SCHEMA)
    schema = parse_schema(PIPELINE_SCHEMA)
    workload = Workload(schema, seed=11, tables=["shop.orders", "shop.users"], keys=20)
    cluster = Cluster(tmp_path / "cluster", schema, nodes=3, rf=3, cassandra_version="4.1", seed=5)
    agents = start_agents(cluster, real_kafka, server, tmp_path)
    port = free_port()
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "server": server, "checkpoint": str(tmp_path / "checkpoint"),
        "kafka": {"bootstrap_servers": real_kafka.bootstrap_servers, "events_topic_partitions": 2},
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "trigger_interval": "500 milliseconds"},
        "metrics": {"port": port, "host": "127.0.0.1"}}))
    pipeline = ChildProcess("pipeline", ["pipeline", "--config", str(config)], tmp_path / "pipeline.log")
    try:
        cluster.run(workload.take(300), sync_every=50)
        cluster.close_all()
        wait_until(lambda: all(agent.metrics.registry.get_sample_value(f"{AGENT}segments_pending") == 0
                               for agent, _ in agents), "the agents to publish every segment")
        with Producer({"bootstrap.servers": real_kafka.bootstrap_servers}) as producer:
            producer.produce(f"{server}.raw", b"not a raw record", b"key")
            assert producer.flush(30) == 0
        pipeline.start()
        wait_until(lambda: serving(port), "the pipeline's metrics endpoint", timeout=180)
        wait_until(lambda: get(port, "/readyz")[0] == 200, "the query running", timeout=180)
        topics = [f"{server}.shop.orders", f"{server}.shop.users"]

        last_seen: list[str] = []

        def caught_up() -> Samples | None:
            samples = scrape(port)
            behind = {dict(labels)["partition"]: value for (name, labels), value in samples.items()
                      if name == f"{PIPELINE}behind_records"}
            counted = sum(value for (name, _), value in samples.items() if name == f"{PIPELINE}events_total")
            written = sum(events_by_table_and_op(real_kafka, topics).values())
            last_seen[:] = [f"behind {behind}, {counted} events counted, {written} on the topics"]
            # Every raw partition measured (a busy broker may answer some of them a refresh later).
            return samples if len(behind) == 4 and not any(behind.values()) and counted == written > 0 else None
        try:
            samples = wait_until(caught_up, "the pipeline to catch up", timeout=300, step=2)
        except pytest.fail.Exception:
            raw = AdminClient({"bootstrap.servers": real_kafka.bootstrap_servers}).list_topics(timeout=10).topics
            partitions = len(raw[f"{server}.raw"].partitions)
            pytest.fail(f"the pipeline did not catch up: {last_seen}, the raw topic has {partitions} partitions\n"
                        f"{pipeline.log_tail(30)}")
        expected = events_by_table_and_op(real_kafka, topics)
        counted = {(dict(labels)["table"], dict(labels)["op"]): value
                   for (name, labels), value in samples.items() if name == f"{PIPELINE}events_total"}
        assert counted == expected and {table for table, _ in expected} == {"shop.orders", "shop.users"}
        assert sample(samples, "cassandra_cdc_pipeline_errors_total", reason="invalid_raw_record") == 1
        assert len(read_topic(real_kafka, f"{server}.errors")) == 1
        behind = {dict(labels)["partition"] for name, labels in samples
                  if name == f"{PIPELINE}behind_records"}
        assert behind == {"0", "1", "2", "3"}  # the raw topic's partitions (start_agents makes 4)
        # Every event shows a write (no TTL, no snapshot here): each one's lag observed, none negative.
        assert sample(samples, f"{PIPELINE}write_to_event_seconds_count") == sum(expected.values())
        assert sample(samples, "cassandra_cdc_pipeline_write_to_event_seconds_sum") > 0
        assert sample(samples, "cassandra_cdc_pipeline_batch_duration_seconds_count") > 0
        assert sample(samples, "cassandra_cdc_pipeline_batch_duration_seconds_sum") > 0
        assert sample(samples, "cassandra_cdc_build_info", version=build_version()) == 1
        assert sample(samples, "process_resident_memory_bytes") > 0
        assert get(port, "/healthz") == (200, "ok\n")
        on_dashboard = {name for name in dashboard_metrics() if not name.startswith(AGENT)}
        assert on_dashboard - exported_names(port) == set()
    finally:
        assert pipeline.stop() in (0, None), pipeline.log_tail(30)
        for agent, thread in agents:
            agent.stop()
            thread.join(timeout=30)
