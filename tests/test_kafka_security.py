"""Kafka security, one model for every component: ``kafka.security`` validated up front, mapped to
librdkafka's and to the Java client's settings, and every component working through a real Apache Kafka
broker whose only client listener is SASL_SSL (certificates made here; users logging in with PLAIN and
SCRAM)."""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from agent_harness import Harness, running
from cassandra_cdc.kafka.security import KafkaSecurity
from cassandra_cdc.localcluster.certificates import CertificateAuthority
from cassandra_cdc.pipeline.pipeline_config import load_config as load_pipeline_config
from cassandra_cdc.settings import ConfigError
from conftest import require_jvm_artifacts
from cassandra_cdc.kafka.raw_records import RawRecord
from cassandra_cdc.kafka.schema_records import SchemaRecord
from cassandra_cdc.sstable import SSTable
from test_bootstrap import FIXTURE, TABLE, TABLE_ID, read_topic, replica_snapshots, schema_file
from test_pipeline_faults import (V1, RawPublisher, connector_jars, pipeline_command, read_all,
                                  start_pipeline, stop_pipeline, wait_for)
from cassandra_cdc.simulator import Insert

CLI = str(Path(sys.executable).with_name("cassandra-cdc"))
USERS = {"cdc-agent": "agent-secret-1", "cdc-pipeline": "pipeline-secret-2"}


# --- the settings, without a broker -----------------------------------------------------------------

def pipeline_file(tmp_path: Path, security: dict[str, Any]) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"server": "s", "checkpoint": str(tmp_path / "cp"),
                                    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "security": security}}))
    return path


def problems(tmp_path: Path, security: dict[str, Any]) -> list[str]:
    path = pipeline_file(tmp_path, security)
    with pytest.raises(ConfigError) as raised:
        load_pipeline_config(path)
    return [line.removeprefix(f"{path}: ") for line in str(raised.value).splitlines()]


def test_each_problem_of_the_security_section_is_its_own_line(tmp_path: Path) -> None:
    assert problems(tmp_path, {"protocol": "SASL_SSL"}) == [
        "kafka.security.sasl_mechanism: required with protocol SASL_SSL",
        "kafka.security.username: required with protocol SASL_SSL",
        "kafka.security.password: required with protocol SASL_SSL"]
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    assert problems(tmp_path, {"protocol": "PLAINTEXT", "username": "u", "ca_file": str(ca)}) == [
        "kafka.security.username: only with protocol SASL_PLAINTEXT or SASL_SSL (protocol is PLAINTEXT) "
        "(given: 'u')",
        f"kafka.security.ca_file: only with protocol SSL or SASL_SSL (protocol is PLAINTEXT) (given: '{ca}')"]
    assert problems(tmp_path, {"protocol": "SSL", "ca_file": str(tmp_path / "missing.pem"),
                               "cert_file": str(ca), "key_password": "k"}) == [
        f"kafka.security.ca_file: {tmp_path / 'missing.pem'} is not a readable file "
        f"(given: '{tmp_path / 'missing.pem'}')",
        "kafka.security.key_file: required with cert_file",
        "kafka.security.key_password: only with key_file"]
    assert problems(tmp_path, {"protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "username": "u",
                               "password": "p"})[0].startswith(
        "kafka.security.sasl_mechanism: Input should be 'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512'")


def test_a_password_given_as_a_file_is_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "kafka-password"
    secret.write_text("s3cret-value\n")
    config = load_pipeline_config(pipeline_file(tmp_path, {"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                                           "username": "u", "password_file": str(secret)}))
    assert config.kafka.security.password == "s3cret-value"
    assert "s3cret-value" not in problems(tmp_path, {"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                                     "username": "u", "password": "s3cret-value",
                                                     "verify_hostname": "maybe"})[0]


def test_one_section_maps_to_librdkafka_and_to_the_java_client(tmp_path: Path) -> None:
    authority = CertificateAuthority.create(tmp_path)
    client = authority.issue(tmp_path, "client")
    security = KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", username="cdc",
                             password='p"w\\d', ca_file=authority.certificate, cert_file=client.certificate,
                             key_file=client.key, verify_hostname=False)
    assert security.librdkafka() == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "cdc",
        "sasl.password": 'p"w\\d', "ssl.endpoint.identification.algorithm": "none",
        "ssl.ca.location": str(authority.certificate), "ssl.certificate.location": str(client.certificate),
        "ssl.key.location": str(client.key)}
    assert security.java_client() == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="cdc" '
                            'password="p\\"w\\\\d";',
        "ssl.endpoint.identification.algorithm": "",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(authority.certificate),
        "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": client.certificate.read_text(),
        "ssl.keystore.key": client.key.read_text()}
    plain = KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", username="u", password="p")
    assert plain.java_client() == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
                            'password="p";'}
    assert KafkaSecurity().librdkafka() == KafkaSecurity().java_client() == {"security.protocol": "PLAINTEXT"}


# --- a real broker with SASL_SSL only -------------------------------------------------------------------

@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real Kafka broker whose client listener is SASL_SSL, with a CA and certificate made here."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster.kafka import KafkaBroker, SaslSsl

    root = tmp_path_factory.mktemp("secure-kafka")
    authority = CertificateAuthority.create(root / "tls")
    broker_certificate = authority.issue(root / "tls", "broker", hosts=["127.0.0.1", "localhost"])
    with KafkaBroker(root / "kafka", sasl_ssl=SaslSsl(broker_certificate.certificate, broker_certificate.key,
                                                      authority.certificate, USERS)) as broker:
        yield broker


def section(security: KafkaSecurity) -> dict[str, Any]:
    """A ``kafka.security`` section as a YAML file holds it."""
    return {key: str(value) if isinstance(value, Path) else value
            for key, value in security.model_dump(exclude_defaults=True).items()}


def run_cli(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *arguments], capture_output=True, text=True, timeout=timeout, check=False)


def test_a_client_without_tls_and_login_gets_nothing(secure_kafka: Any) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": secure_kafka.bootstrap_servers, "logger": _Quiet()})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)


class _Quiet:
    @staticmethod
    def log(*_: object) -> None:
        pass


HEADER = re.compile(r"^node1 CommitLog-\d+-(\d+)\.log@(\d+) \S+ (\S+) \(\d+ bytes\)$")


def test_the_agent_publishes_and_tail_reads_through_sasl_ssl(secure_kafka: Any, tmp_path: Path) -> None:
    """The agent (SCRAM-SHA-512) publishes its raw and schema records; ``tail --config`` with the agent's file
    decodes them, reading the schema topic through SASL_SSL too."""
    harness = Harness(tmp_path, secure_kafka)
    security = section(secure_kafka.security("cdc-agent"))
    config_file = harness.config_file(kafka__security=security)
    harness.write(40)
    harness.node.sync()
    names = {table.id: table.qualified_name for table in harness.node.schema}
    expected = sorted((segment, position, names[table]) for segment, position, table in harness.expected)

    def tailed() -> list[tuple[int, int, str]]:
        result = run_cli("tail", harness.raw_topic, "--config", str(config_file), "--from-beginning",
                         "--until-end")
        assert result.returncode == 0, result.stderr
        headers = map(HEADER.match, result.stdout.splitlines())
        return sorted((int(m[1]), int(m[2]), m[3]) for m in headers if m)

    with running(harness.config(kafka__security=security)):
        assert wait_for(lambda: tailed() == expected, 90), (tailed(), expected)


@pytest.mark.parametrize(("source", "mechanism"), [("python", "PLAIN"), ("kafka", "SCRAM-SHA-256")])
def test_the_pipeline_reads_and_writes_through_sasl_ssl(secure_kafka: Any, tmp_path: Path, source: str,
                                                        mechanism: str) -> None:
    """Both read paths (ours on librdkafka, Spark's on the Java client) read the raw topic, the schema topic
    and write committed events through SASL_SSL, logged in as one user."""
    server = f"secure-{source}"
    security = secure_kafka.security("cdc-pipeline", mechanism=mechanism)
    publisher = RawPublisher(secure_kafka.bootstrap_servers, server, security.librdkafka())
    schema = publisher.schema(V1)
    now = time.time_ns() // 1000
    for i in range(10):
        publisher.write(schema, Insert("app.items", {"id": i, "name": f"n{i}", "qty": i}, timestamp=now + i))
    command = pipeline_command(secure_kafka, server, tmp_path,
                               {"source": source, "security": section(security)},
                               connector_jars() if source == "kafka" else None)
    topic = f"{server}.app.items"
    process = start_pipeline(command)
    try:
        assert wait_for(lambda: len(read_all(secure_kafka.bootstrap_servers, topic,
                                             security=security.librdkafka())) >= 10, 300)
    finally:
        stop_pipeline(process)
    events = [e["payload"]
              for e in read_all(secure_kafka.bootstrap_servers, topic, security=security.librdkafka())]
    assert sorted((e["op"], e["after"]["id"]) for e in events) == [("c", i) for i in range(10)]
    tail = run_cli("tail", topic, "--config", command[-1], "--from-beginning", "--until-end")
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 10, tail.stderr


def secure_pipeline_file(secure_kafka: Any, tmp_path: Path, security: dict[str, Any],
                         server: str = "s") -> Path:
    """A pipeline configuration for the secured broker, logging in with ``security``."""
    path = pipeline_file(tmp_path, security)
    config = yaml.safe_load(path.read_text())
    config["kafka"]["bootstrap_servers"] = secure_kafka.bootstrap_servers
    config["server"] = server
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_bootstrap_publishes_through_sasl_ssl(secure_kafka: Any, tmp_path: Path) -> None:
    """``cassandra-cdc bootstrap`` (SCRAM-SHA-256) reads the schema topic, creates the topics and publishes
    the schema and one node's snapshot of a real SSTable through SASL_SSL; its records read back through
    SASL_SSL are the SSTable's five partitions."""
    security = secure_kafka.security("cdc-pipeline", mechanism="SCRAM-SHA-256")
    config = secure_pipeline_file(secure_kafka, tmp_path, section(security), server="secure-bootstrap")
    snapshot = replica_snapshots(tmp_path)[0]
    result = run_cli("bootstrap", "-c", str(config), "--table", TABLE, "--schema", str(schema_file(tmp_path)),
                     "--no-progress", "--sstables", str(snapshot), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "1 of 1 tasks run" in result.stdout and "250 rows" in result.stdout, result.stdout
    (_, schema_value), = read_topic(secure_kafka, "secure-bootstrap.table-schemas",
                                    security=security.librdkafka())
    assert SchemaRecord.decode(schema_value).table_id == str(TABLE_ID)
    raw = read_topic(secure_kafka, "secure-bootstrap.raw", security=security.librdkafka())
    records = [RawRecord.decode(value) for _, value in raw]
    assert all(r.snapshot for r in records)
    partitions = [offset for offset, _ in SSTable(FIXTURE).partitions_with_offsets()]
    assert sorted(r.position for r in records) == partitions


def test_a_wrong_password_is_one_clear_line(secure_kafka: Any, tmp_path: Path) -> None:
    """tail, the pipeline, the bootstrap and the agent: exit status 2 and one line naming the refusal, no
    traceback, and never the password given."""
    wrong = "not-the-password"
    security = section(secure_kafka.security("cdc-pipeline", password=wrong))
    pipeline_yaml = secure_pipeline_file(secure_kafka, tmp_path, security)
    snapshot = replica_snapshots(tmp_path)[0]
    (tmp_path / "agent").mkdir()
    harness = Harness(tmp_path / "agent", secure_kafka)
    agent_yaml = harness.config_file(kafka__security=security)
    commands = (["tail", "anything", "--config", str(pipeline_yaml)],
                ["pipeline", "--config", str(pipeline_yaml)],
                ["bootstrap", "--config", str(pipeline_yaml), "--table", TABLE, "--schema",
                 str(schema_file(tmp_path)), "--sstables", str(snapshot)],
                ["agent", "--config", str(agent_yaml)])
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:  # each waits on the broker's refusal
        results = list(pool.map(lambda command: run_cli(*command), commands))
    for command, result in zip(commands, results):
        output = (result.stdout + result.stderr).strip()
        lines = [line for line in output.splitlines() if "refused the connection" in line]
        assert result.returncode == 2, (command, output)
        assert len(lines) == 1 and "Authentication failed" in lines[0], output
        assert "kafka.security" in lines[0], output
        assert "Traceback" not in output and wrong not in output, output
