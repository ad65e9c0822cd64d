"""The pieces of :mod:`cassandra_cdc.localcluster` around the real JVMs: finding the fetched classpaths and
Java, what reaches Spark's classpath, and how a node, a PostgreSQL server or a Kafka Connect worker that
cannot start is reported."""

from __future__ import annotations

import base64
import os
import signal
import socket
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient

from cassandra_cdc.localcluster import (CassandraCluster, ConnectWorker, JvmError, KafkaBroker,
                                        MissingArtifacts, PostgresServer, artifacts)
from cassandra_cdc.localcluster.cassandra import cassandra_4_0_settings, evenly_spaced_tokens, splitting_token
from cassandra_cdc.localcluster.process import JvmProcess
from cassandra_cdc.simulator.broker import free_port
from conftest import require_jvm_artifacts


@pytest.mark.parametrize("jar,name", [
    ("kafka-clients-3.9.2.jar", "kafka-clients"),
    ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
    ("scala-library-2.13.18.jar", "scala-library"),
    ("netty-all-4.1.130.Final.jar", "netty-all"),
    ("netty-tcnative-boringssl-static-2.0.70.Final-linux-x86_64.jar", "netty-tcnative-boringssl-static"),
    ("zstd-jni-1.5.7-6.jar", "zstd-jni"),
    ("jffi-1.3.11-native.jar", "jffi"),
    ("javax.inject-1.jar", "javax.inject"),
    ("posix-2.24ea4.jar", "posix"),
])
def test_artifact_names_drop_the_version_and_classifier(jar: str, name: str) -> None:
    assert artifacts.artifact_name(Path(jar)) == name


def test_missing_classpath_says_to_run_make_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CASSANDRA_CDC_JVM_LIB", str(tmp_path))
    with pytest.raises(MissingArtifacts, match=f"{tmp_path}/kafka: no kafka_2.13-.*run `make install`"):
        artifacts.jars(artifacts.KAFKA)
    assert "make install" in (artifacts.missing_reason() or "")


def test_missing_postgresql_or_debezium_says_to_run_make_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CASSANDRA_CDC_JVM_LIB", str(tmp_path))
    with pytest.raises(MissingArtifacts, match=f"{tmp_path}/postgres/server: no bin/postgres; run `make"):
        artifacts.postgres_home()
    with pytest.raises(MissingArtifacts, match="debezium-jdbc: no debezium-connector-jdbc-.*`make install"):
        artifacts.connect_plugin_path()


def test_a_cassandra_4_classpath_missing_says_to_run_make_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CASSANDRA_CDC_JVM_LIB", str(tmp_path))
    with pytest.raises(MissingArtifacts, match=f"{tmp_path}/cassandra-4.0: no cassandra-all-.*make install"):
        artifacts.jars(artifacts.CASSANDRA_VERSIONS["4.0"])


def test_a_cluster_of_a_version_it_cannot_run_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="Cassandra version '3.11': one of 5.0, 4.1, 4.0"):
        CassandraCluster(tmp_path, nodes=1, version="3.11")


def test_a_node_upgraded_keeps_its_directories_ports_and_settings(tmp_path) -> None:
    require_jvm_artifacts(lambda: artifacts.check_cassandra("4.1"))
    cluster = CassandraCluster(tmp_path, nodes=2, version="4.1")
    old = cluster.nodes[1]
    with pytest.raises(ValueError, match="Cassandra version '6.0'"):
        cluster.upgrade(old, "6.0")
    new = cluster.upgrade(old, "5.0", {"storage_compatibility_mode": "CASSANDRA_4"})
    assert cluster.nodes == [cluster.nodes[0], new] and new.version == "5.0"
    assert (new.directory, new.address, new.native_port, new.jmx_port, new.cdc_raw_dir) == \
        (old.directory, old.address, old.native_port, old.jmx_port, old.cdc_raw_dir)
    assert new.settings == {**old.settings, "storage_compatibility_mode": "CASSANDRA_4"}
    written = yaml.safe_load((new.directory / "conf" / "cassandra.yaml").read_text())
    assert written["storage_compatibility_mode"] == "CASSANDRA_4"
    assert written["commitlog_directory"] == old.settings["commitlog_directory"]


def test_a_joining_node_takes_the_middle_of_the_widest_range() -> None:
    three = evenly_spaced_tokens(3)  # the last range, wrapping past the ring's end, is the widest by 1
    assert splitting_token(three) == three[2] + ((1 << 64) - (three[2] - three[0])) // 2
    assert splitting_token([-100, 100]) == -(1 << 63)  # the middle of the range wrapping past the ring's end
    assert splitting_token([1 << 62]) == -(1 << 62)  # one node: the other side of the ring


def test_nodes_of_two_datacenters_are_placed_in_turn_with_a_seed_in_each(tmp_path) -> None:
    require_jvm_artifacts()
    cluster = CassandraCluster(tmp_path, nodes=4, datacenters=2)
    assert [node.datacenter for node in cluster.nodes] == ["dc1", "dc2", "dc1", "dc2"]
    assert {node.settings["endpoint_snitch"] for node in cluster.nodes} == {"GossipingPropertyFileSnitch"}
    seeds = cluster.nodes[0].settings["seed_provider"][0]["parameters"][0]["seeds"]
    assert seeds == f"127.0.0.1:{cluster.storage_port},127.0.0.2:{cluster.storage_port}"
    rackdc = (cluster.nodes[1].directory / "conf" / "cassandra-rackdc.properties").read_text()
    assert rackdc == "dc=dc2\nrack=rack1\n"
    joining = cluster.new_node(datacenter="dc2")
    assert (joining.address, joining.datacenter) == ("127.0.0.5", "dc2")
    assert joining.settings["auto_bootstrap"] is True
    # The middle of dc2's widest range is the token of a node of dc1: the next one is taken.
    assert splitting_token([cluster.nodes[1].token, cluster.nodes[3].token]) == cluster.nodes[2].token == 0
    assert joining.token == 1
    # The first node of a new datacenter joins without streaming: its data comes with nodetool rebuild.
    first_of_dc3 = cluster.new_node(datacenter="dc3")
    assert (first_of_dc3.datacenter, first_of_dc3.settings["auto_bootstrap"]) == ("dc3", False)
    single = CassandraCluster(tmp_path / "single", nodes=1)
    with pytest.raises(ValueError, match="datacenter 'dc2': a cluster of one datacenter"):
        single.new_node(datacenter="dc2")
    with pytest.raises(ValueError, match="datacenters must be 1 to the number of nodes"):
        CassandraCluster(tmp_path / "other", nodes=2, datacenters=3)


def test_cassandra_4_0_names_settings_with_units_in_its_own_way() -> None:
    """4.0 takes a size or a duration under the old name that holds its unit (4.1 takes both forms)."""
    settings = {"cdc_total_space": "256MiB", "commitlog_segment_size": "2MiB",
                "commitlog_sync_period": "1000ms", "read_request_timeout": "10s",
                "column_index_size": "1KiB", "commitlog_sync": "periodic", "num_tokens": 1,
                "cluster_name": "10s"}
    assert cassandra_4_0_settings(settings) == {
        "cdc_total_space_in_mb": 256, "commitlog_segment_size_in_mb": 2, "commitlog_sync_period_in_ms": 1000,
        "read_request_timeout_in_ms": 10000, "column_index_size_in_kb": 1, "commitlog_sync": "periodic",
        "num_tokens": 1, "cluster_name": "10s"}


def test_missing_java_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    artifacts.java_executable.cache_clear()
    try:
        expected = f"no Java found \\(JAVA_HOME={tmp_path}\\); install Java 17"
        with pytest.raises(MissingArtifacts, match=expected):
            artifacts.java_executable()
    finally:
        artifacts.java_executable.cache_clear()


def test_spark_gets_the_kafka_connector_without_the_libraries_it_ships() -> None:
    require_jvm_artifacts()
    import pyspark

    spark_jars = Path(pyspark.__file__).parent / "jars"
    names = {artifacts.artifact_name(jar) for jar in artifacts.spark_kafka_jars(spark_jars)}
    shipped = {artifacts.artifact_name(jar) for jar in spark_jars.glob("*.jar")}
    assert {"spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients"} <= names
    assert not names & shipped
    fetched = {artifacts.artifact_name(jar) for jar in artifacts.jars(artifacts.SPARK_KAFKA)}
    assert {"scala-library", "slf4j-api"} <= fetched - names  # fetched as dependencies, left to Spark's own


def test_free_ports_are_below_the_ports_the_os_gives_clients() -> None:
    clients_from = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert port < clients_from
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def _listening_program(port: int) -> list[str]:
    """A shell whose child process listens on ``port`` (the shell forks it: ``; true`` follows)."""
    listen = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', %d)); s.listen(); "
              "time.sleep(60)" % port)
    return ["sh", "-c", f"{sys.executable} -c \"{listen}\"; true"]


def test_a_program_is_up_once_a_process_it_started_listens_on_its_port(tmp_path) -> None:
    port = free_port()
    program = JvmProcess("listener", _listening_program(port), tmp_path, tmp_path / "stdout.log")
    program.start()
    try:
        program.wait_for_port("127.0.0.1", port, timeout=30)
    finally:
        os.killpg(program.pid, signal.SIGKILL)  # the shell and its child
        program.kill()


def test_another_process_listening_on_a_programs_port_is_not_taken_for_it(tmp_path) -> None:
    port = free_port()
    program = JvmProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path,
                         tmp_path / "stdout.log")
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen()
        program.start()
        try:
            with pytest.raises(JvmError, match=f"not listening on 127.0.0.1:{port} after 2 s \\(another process"):
                program.wait_for_port("127.0.0.1", port, timeout=2)
        finally:
            program.kill()


def test_a_node_that_cannot_start_raises_with_the_tail_of_its_log(tmp_path) -> None:
    require_jvm_artifacts()
    cluster = CassandraCluster(tmp_path, nodes=1, config={"commitlog_segment_size": "lots"})
    with pytest.raises(JvmError) as failure:
        cluster.start()
    message = str(failure.value)
    assert message.startswith("Cassandra 5.0 node 127.0.0.1 exited with status")
    assert "Invalid data storage: lots" in message and str(cluster.nodes[0].system_log) in message
    assert not cluster.nodes[0].running


def test_a_broker_whose_cluster_id_starts_with_a_dash_starts(tmp_path, monkeypatch) -> None:
    """One random cluster id in 64 starts with "-": its storage is formatted all the same."""
    require_jvm_artifacts()
    dashed = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))
    monkeypatch.setattr(uuid, "uuid4", lambda: dashed)
    with KafkaBroker(tmp_path / "kafka") as broker:
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=30)
    assert metadata.cluster_id == "-AAAAAAAAAAAAAAAAAAAAA"


def test_a_postgresql_server_that_cannot_start_raises_with_its_log(tmp_path) -> None:
    require_jvm_artifacts(artifacts.postgres_home)
    with PostgresServer(tmp_path / "first") as first:
        data_directories = set(Path(tempfile.gettempdir()).glob("cassandra-cdc-postgres-*"))
        second = PostgresServer(tmp_path / "second", port=first.port)
        with pytest.raises(JvmError) as failure:
            second.start()
        assert not second.running
        assert set(Path(tempfile.gettempdir()).glob("cassandra-cdc-postgres-*")) == data_directories
    message = str(failure.value)
    assert message.startswith(f"PostgreSQL 127.0.0.1:{first.port} exited before accepting connections")
    assert "Address already in use" in message and message.count("--- ") == 1


def test_a_connect_worker_stopping_on_a_connector_error_raises_with_that_error(real_kafka, tmp_path) -> None:
    require_jvm_artifacts(artifacts.connect_plugin_path)
    worker = ConnectWorker(tmp_path, real_kafka.bootstrap_servers,
                           {"odd": {"connector.class": "no.such.Connector", "topics": "odd"}})
    with pytest.raises(JvmError) as failure, worker:
        pass
    message = str(failure.value)
    assert message.startswith(f"Kafka Connect worker 127.0.0.1:{worker.port} exited while starting")
    assert "Failed to find any class that implements Connector and which name matches no.such.Connector" \
        in message
    assert not worker.running
