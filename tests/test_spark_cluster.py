"""The pipeline and the bootstrap on a Spark standalone cluster: a master and two workers on this machine
(:mod:`cassandra_cdc.localcluster.spark`), each job submitted with ``spark-submit --master spark://...`` as
docs/pipeline.md says ("On a Spark standalone cluster"), on the real Kafka broker.

Three simulated replicas write commit logs and three agents publish them; the pipeline runs with its
checkpoint on a real HDFS (a NameNode and a DataNode, :mod:`cassandra_cdc.localcluster.hdfs`), as a
deployment's executors share one. While it streams, the bootstrap publishes a real
table's SSTables (three replicas' snapshots) as a second application of the same cluster; then one worker
is killed with ``kill -9`` in the middle of the stream (its executors exit with it) while writes go on,
and later started again. The events (read_committed), replayed, must equal the tables' rows, as the
simulator's CQL model computes them and as the SSTables hold them, with no event twice.
"""

from __future__ import annotations

import collections
import json
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

import cassandra_cdc.pipeline.submit as submit
from conftest import start_agents
from cassandra_cdc.demo.table_check import normalized, replay
from cassandra_cdc.localcluster import HdfsCluster, SparkStandaloneCluster
from cassandra_cdc.pipeline.streaming_job import STATE_LAYOUT_FILE
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Cluster, Workload
from cassandra_cdc.sstable import SSTable
from test_bootstrap import FIXTURE, SCHEMA_CQL, TABLE, replica_snapshots
from test_bootstrap_e2e import snapshot_model, topic_ends
from test_pipeline_faults import read_all
from test_pipeline_submit import SPARK_SUBMIT, package_archive, stop_submitted, submit_environment
from test_real_e2e import consume_events

SERVER = "sparkcluster"
STREAM_SCHEMA = """
CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '3'};
CREATE TABLE shop.orders (
    id int, line int, item text, qty int, price double, note text static, tags set<text>,
    attrs map<text, int>, PRIMARY KEY (id, line)
) WITH ID = 3f1b5a8e-0000-4000-8000-0000000000c1 AND cdc = true;
CREATE TABLE shop.users (id int PRIMARY KEY, name text, email text)
    WITH ID = 3f1b5a8e-0000-4000-8000-0000000000c2 AND cdc = true;
"""
STREAM_TABLES = ["shop.orders", "shop.users"]
CONVERGE_TIMEOUT = 300.0
# Raw records published but not yet merged when the worker is killed: a few micro-batches' worth.
BEHIND_AT_THE_KILL = 300

# What each application asks of the cluster, as docs/pipeline.md's standalone example: one executor of one
# core per worker, so that both applications fit beside each other on two workers of two cores.
APPLICATION = ["--driver-memory", "512m", "--conf", "spark.executor.memory=512m",
               "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2"]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandaloneCluster]:
    with SparkStandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, worker_cores=2,
                                worker_memory="1g") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster]:
    with HdfsCluster(tmp_path_factory.mktemp("hdfs")) as running:
        yield running


def spark_submit(cluster: SparkStandaloneCluster, archive: str, *arguments: str) -> list[str]:
    return [str(SPARK_SUBMIT), "--master", cluster.master_url, *APPLICATION, "--py-files", archive,
            submit.__file__, *arguments]


def applications(cluster: SparkStandaloneCluster) -> dict[str, list[dict[str, Any]]]:
    """The master's applications by name, running and completed."""
    status = cluster.status()
    named: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for application in [*status["activeapps"], *status["completedapps"]]:
        named[application["name"]].append(application)
    return named


def executors(cluster: SparkStandaloneCluster, application_id: str) -> list[Path]:
    """The executors an application has had on the cluster's workers (a directory each, by the worker)."""
    return [executor for worker in cluster.workers
            for executor in (worker.work_directory / application_id).glob("*") if executor.is_dir()]


def merged_offsets(hdfs: HdfsCluster, checkpoint: str) -> int:
    """How many raw records the pipeline has merged: the source offsets (summed over the raw topic's
    partitions) of its last committed micro-batch, as Spark's checkpoint (a path on ``hdfs``) records them."""
    committed = [int(name) for name in hdfs.list(f"{checkpoint}/commits") if name.isdigit()]
    if not committed:
        return 0
    offsets = hdfs.read(f"{checkpoint}/offsets/{max(committed)}").decode().splitlines()[-1]
    return sum(json.loads(offsets).values())


def wait_for(condition: Any, what: str, timeout: float, pipeline: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert pipeline.poll() is None, f"the pipeline exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(1)


def test_pipeline_and_bootstrap_on_a_standalone_cluster_survive_a_worker_killed_mid_stream(
        spark_cluster: SparkStandaloneCluster, hdfs: HdfsCluster, real_kafka: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    (tmp_path / "schema.cql").write_text(STREAM_SCHEMA)
    schema = parse_schema(STREAM_SCHEMA)
    workload = Workload(schema, seed=5, tables=STREAM_TABLES, keys=20, ttl_probability=0.0)
    simulated = Cluster(tmp_path / "cluster", schema, nodes=3, rf=3, cassandra_version="4.1", seed=5,
                        shuffle=True, segment_size=256 * 1024)
    agents = start_agents(simulated, real_kafka, SERVER, tmp_path)
    checkpoint = "/cassandra-cdc/checkpoint"  # on HDFS
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "server": SERVER, "checkpoint": f"{hdfs.uri}{checkpoint}",
        "kafka": {"bootstrap_servers": real_kafka.bootstrap_servers, "max_offsets_per_trigger": 200,
                  "events_topic_partitions": 2},
        "spark": {"shuffle_partitions": 2, "trigger_interval": "500 milliseconds"}}))
    (tmp_path / "bootstrap.cql").write_text(SCHEMA_CQL)
    snapshots = replica_snapshots(tmp_path / "snapshots")
    archive = package_archive(tmp_path)
    topics = {table: f"{SERVER}.{table}" for table in [*STREAM_TABLES, TABLE]}
    log = tmp_path / "pipeline.log"
    timings: dict[str, float] = {}
    simulated.run(workload.take(150), sync_every=50)
    pipeline = subprocess.Popen(spark_submit(spark_cluster, archive, "pipeline", "--config", str(config)),
                                env=submit_environment(), cwd=tmp_path, stdout=log.open("w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: read_all(real_kafka.bootstrap_servers, topics["shop.users"], "read_uncommitted"),
                 "the pipeline's first events", 360, pipeline, log)
        timings["first events"] = time.monotonic() - started
        (pipeline_app,) = applications(spark_cluster)["cassandra-cdc"]
        # The bootstrap, a second application of the same cluster, while the stream goes on.
        simulated.run(workload.take(150), sync_every=50)
        bootstrap = subprocess.run(
            spark_submit(spark_cluster, archive, "bootstrap", "--config", str(config), "--table", TABLE,
                         "--schema", str(tmp_path / "bootstrap.cql"), "--no-progress",
                         *[f"--sstables={snapshot}" for snapshot in snapshots]),
            env=submit_environment(), cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
        assert bootstrap.returncode == 0, bootstrap.stderr[-3000:]
        assert f"{TABLE}: 3 of 3 tasks run" in bootstrap.stdout, bootstrap.stdout
        timings["bootstrap"] = time.monotonic() - started
        (bootstrap_app,) = applications(spark_cluster)["cassandra-cdc-bootstrap"]
        assert json.loads(hdfs.read(f"{checkpoint}/bootstrap/{TABLE}.json"))["finished"]

        # kill -9 of a worker that runs one of the pipeline's executors, in the middle of the stream: the
        # bootstrap's records and the latest writes are still being merged.
        victim = next(worker for worker in spark_cluster.workers
                      if (worker.work_directory / pipeline_app["id"]).is_dir())
        simulated.run(workload.take(200), sync_every=50)
        wait_for(lambda: sum(topic_ends(real_kafka, f"{SERVER}.raw").values()) - merged_offsets(hdfs, checkpoint)
                 >= BEHIND_AT_THE_KILL, "a backlog to kill the worker in", 60, pipeline, log)
        victim.kill()
        simulated.run(workload.take(100), sync_every=50)
        # The master gives the pipeline an executor in place of the lost one, where cores are free.
        wait_for(lambda: len(executors(spark_cluster, pipeline_app["id"])) > 2, "a new executor", 120,
                 pipeline, log)
        spark_cluster.start_worker(victim)
        simulated.run(workload.take(50), sync_every=50)
        simulated.close_all()
        timings["written"] = time.monotonic() - started

        now = int(time.time())
        expected = {table: {key: normalized(row) for key, row in simulated.rows(table, now).items()}
                    for table in STREAM_TABLES}
        expected[TABLE] = snapshot_model(SSTable(FIXTURE), parse_schema(SCHEMA_CQL).table(*TABLE.split("."))
                                         ).rows(now)
        every_table = parse_schema(STREAM_SCHEMA + SCHEMA_CQL)
        key_columns = {name: [column.name for column in every_table.table(*name.split(".")).primary_key]
                       for name in topics}
        events: dict[str, list[dict[str, Any]]] = {}

        def replayed() -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
            events.update(consume_events(real_kafka.bootstrap_servers, list(topics.values())))
            return {table: replay((("t", e) for e in events[topic]), "t", key_columns[table])
                    for table, topic in topics.items()}

        wait_for(lambda: replayed() == expected, "the events to match the tables", CONVERGE_TIMEOUT,
                 pipeline, log)
        timings["converged"] = time.monotonic() - started
        assert pipeline.poll() is None
    finally:
        stop_submitted(pipeline)
        for agent, thread in agents:
            agent.stop()
            thread.join(timeout=30)
    print("timings (s):", {name: round(seconds, 1) for name, seconds in timings.items()})

    assert all(expected.values()), "the workload left rows in every table"
    for topic, payloads in events.items():
        seen = collections.Counter(json.dumps(payload, sort_keys=True) for payload in payloads)
        assert [event for event, count in seen.items() if count > 1] == [], f"{topic}: an event twice"
    reads = collections.Counter(tuple(e["after"][c] for c in ("pk", "ck"))
                                for e in events[topics[TABLE]] if e["op"] == "r")
    assert set(reads) == set(expected[TABLE]) and set(reads.values()) == {1}, "each SSTable row read once"
    # The bootstrap ran on the cluster's executors (the pipeline did: the victim was chosen by it).
    assert any((worker.work_directory / bootstrap_app["id"]).is_dir() for worker in spark_cluster.workers)
    assert "pipeline running" in log.read_text()
    # Everything the jobs keep is on HDFS, the layout file and the bootstrap's progress beside Spark's own; none
    # of it locally, under the URI read as a relative path (as "hdfs:/...": how s3a:// checkpoints once broke).
    assert {STATE_LAYOUT_FILE, "bootstrap", "commits", "offsets", "state"} <= set(hdfs.list(checkpoint))
    assert not (tmp_path / "hdfs:").exists()
