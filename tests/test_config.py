"""Configuration files as users write them: secrets from the environment and files, one line per problem,
and the reference in docs/configuration.md kept equal to what is validated."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cassandra_cdc.agent.agent_config import load_config as load_agent_config
from cassandra_cdc.cli.config import reference
from cassandra_cdc.cli.main import app
from cassandra_cdc.pipeline.pipeline_config import load_config as load_pipeline_config
from cassandra_cdc.settings import ConfigError

from conftest import REPO


def _agent_yaml(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"server: prod1\ncdc_raw: {tmp_path}\nstate_dir: {tmp_path / 'state'}\n"
                    f"schema: {{file: schema.cql}}\n{extra}")
    return path


def test_the_reference_in_docs_is_what_the_settings_validate() -> None:
    assert (REPO / "docs" / "configuration.md").read_text() == reference()
    for key in ("`encryption.keystore_password`", "`kafka.producer`", "`output.format`", "`spark.conf`"):
        assert key in reference()


def test_environment_variables_and_files_fill_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_TEST_BROKERS", "k1:9092,k2:9092")
    monkeypatch.delenv("CDC_TEST_UNSET", raising=False)
    (tmp_path / "kafka-password").write_text("s3cret\n")
    (tmp_path / "keystore-password").write_text("ks-pass")
    path = _agent_yaml(tmp_path, f"""\
kafka:
  bootstrap_servers: ${{CDC_TEST_BROKERS}}
  raw_topic: ${{CDC_TEST_UNSET:-prod1.changes}}
  producer:
    sasl.username: agent-${{CDC_TEST_UNSET:-a}}
    sasl.password_file: {tmp_path / 'kafka-password'}
encryption:
  keystore_password: ${{file:{tmp_path / 'keystore-password'}}}
""")
    config = load_agent_config(path)
    assert config.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert config.raw_topic == "prod1.changes"
    assert config.kafka.producer == {"sasl.username": "agent-a", "sasl.password": "s3cret"}
    assert config.encryption.keystore_password == "ks-pass"


def test_an_unset_variable_or_unreadable_secret_file_names_the_key(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_TEST_UNSET", raising=False)
    path = _agent_yaml(tmp_path, "kafka:\n  bootstrap_servers: ${CDC_TEST_UNSET}\n")
    with pytest.raises(ConfigError, match=r"agent.yaml: kafka.bootstrap_servers: .*CDC_TEST_UNSET is not set"):
        load_agent_config(path)
    path = _agent_yaml(tmp_path, f"kafka:\n  bootstrap_servers: k:9092\n"
                                 f"encryption:\n  keystore_password_file: {tmp_path / 'missing'}\n")
    with pytest.raises(ConfigError, match=r"encryption.keystore_password_file: cannot read .*missing"):
        load_agent_config(path)


def test_a_key_named_file_is_not_taken_for_a_secret_file(tmp_path: Path) -> None:
    config = load_agent_config(_agent_yaml(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\n"))
    assert config.schema_.file == Path("schema.cql")
    path = _agent_yaml(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\ncleanup: {mode_file: /etc/passwd}\n")
    with pytest.raises(ConfigError, match="cleanup.mode_file: not a setting here"):
        load_agent_config(path)


def test_task_attempts_that_are_not_a_count_name_the_setting(tmp_path: Path) -> None:
    """A local master gets spark.task.maxFailures attempts per task: a value that is no count is refused when
    the config is read, not as a traceback when the Spark session starts."""
    path = tmp_path / "pipeline.yaml"
    for value, accepted in (("3", True), ("four", False), ("0", False)):
        path.write_text(f"server: s\ncheckpoint: {tmp_path / 'ck'}\nkafka: {{bootstrap_servers: 'k:9092'}}\n"
                        f"spark: {{conf: {{spark.task.maxFailures: '{value}'}}}}\n")
        if accepted:
            assert load_pipeline_config(path).spark.conf["spark.task.maxFailures"] == value
        else:
            with pytest.raises(ConfigError, match=r"pipeline.yaml: spark.conf: spark.task.maxFailures must be a "
                                                  rf"whole number of attempts ≥ 1, not '{value}'"):
                load_pipeline_config(path)


def test_spark_settings_as_yaml_numbers_and_booleans_reach_spark_as_its_strings(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"server: s\ncheckpoint: {tmp_path / 'ck'}\nkafka: {{bootstrap_servers: 'k:9092'}}\n"
                    "spark:\n  conf:\n"
                    "    spark.sql.streaming.stateStore.rocksdb.writeBufferSizeMB: 256\n"
                    "    spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage: true\n"
                    "    spark.memory.fraction: 0.5\n"
                    "    spark.executor.memory: 2g\n")
    assert load_pipeline_config(path).spark.conf == {
        "spark.sql.streaming.stateStore.rocksdb.writeBufferSizeMB": "256",
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
        "spark.memory.fraction": "0.5", "spark.executor.memory": "2g"}
    path.write_text(f"server: s\ncheckpoint: {tmp_path / 'ck'}\nkafka: {{bootstrap_servers: 'k:9092'}}\n"
                    "spark: {conf: {spark.jars: [a.jar, b.jar]}}\n")
    with pytest.raises(ConfigError, match=r"spark.conf.spark.jars: Input should be a valid string"):
        load_pipeline_config(path)


def test_avro_without_a_schema_registry_is_refused(tmp_path: Path) -> None:
    """Avro records without a registry's schema id are what no Kafka deserializer reads: refused at load."""
    path = tmp_path / "pipeline.yaml"
    base = f"server: s\ncheckpoint: {tmp_path / 'ck'}\nkafka: {{bootstrap_servers: 'k:9092'}}\n"
    path.write_text(base + "output: {format: avro}\n")
    with pytest.raises(ConfigError) as raised:
        load_pipeline_config(path)
    assert str(raised.value) == (f"{path}: output: format avro needs a schema registry: set "
                                 "output.schema_registry_url (or output.schema_registry)")
    for registry in ("schema_registry_url: 'http://r:8081'", "schema_registry: {url: 'http://r:8081'}"):
        path.write_text(base + f"output: {{format: avro, {registry}}}\n")
        assert load_pipeline_config(path).output.registry_client_settings() == {"url": "http://r:8081"}


def test_every_problem_on_its_own_line_without_secret_values(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text("server: prod1\ncheckpoint: /tmp/ckpt\nkafka: {bootstrap_servers: 'k:9092', "
                    "max_offsets_per_trigger: 0, sourse: python}\noutput: {format: xml}\n")
    with pytest.raises(ConfigError) as raised:
        load_pipeline_config(path)
    lines = str(raised.value).splitlines()
    assert len(lines) == 3, lines
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert any("kafka.max_offsets_per_trigger: Input should be greater than or equal to 1 (given: 0)" in line
               for line in lines)
    assert any("kafka.sourse: not a setting here" in line for line in lines)
    assert any("output.format: Input should be 'json' or 'avro' (given: 'xml')" in line for line in lines)
    path = _agent_yaml(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\nencryption: {keystore_password: [hunter2]}\n")
    with pytest.raises(ConfigError) as raised:
        load_agent_config(path)
    assert "encryption.keystore_password" in str(raised.value) and "hunter2" not in str(raised.value)


def test_config_check_command(tmp_path: Path) -> None:
    runner = CliRunner()
    good = _agent_yaml(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\n")
    result = runner.invoke(app, ["config", "check", "agent", str(good)])
    assert result.exit_code == 0 and "valid agent configuration" in result.output
    bad = _agent_yaml(tmp_path, "kafka: {bootstrap_servers: 'k:9092'}\nmetrics: {port: 99999}\n")
    result = runner.invoke(app, ["config", "check", "agent", str(bad)])
    assert result.exit_code == 2
    assert "metrics.port: Input should be less than or equal to 65535 (given: 99999)" in result.output
