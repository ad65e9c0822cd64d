"""The agent's configuration: errors named in one line with exit status 2, encryption keys and keystores."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cassandra_cdc.agent import Agent, ConfigError, load_config
from cassandra_cdc.cli.main import app

import agent_harness
from agent_harness import (
    SCHEMA_CQL, DEADLINE, ENCRYPTED_SEGMENT, KEYSTORE, wait_until, MakeHarness)

broker, harness = agent_harness.broker, agent_harness.harness  # fixtures: a broker per module


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
    assert config.raw_topic == "prod.raw" and config.errors_topic == "prod.errors"
    # <server> itself is Debezium's schema change topic's name: the table schemas are read from it too, first,
    # for what versions before published there.
    assert config.schema_topic == "prod.table-schemas"
    assert config.schema_topics_read == ("prod", "prod.table-schemas")


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
