"""The command line's handling of bad arguments and of what it reads: one-line errors, exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

CLI = Path(sys.executable).parent / "cassandra-cdc"


def run(*arguments: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *arguments], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["agent", "--cdc-raw", "/nonexistent"], ["pipeline"],
                                     ["bootstrap", "--sstables", "/nonexistent"]])
def test_a_log_level_typo_is_a_one_line_usage_error(command: list[str]) -> None:
    assert_one_line_error(run(*command, "--log-level", "DEBG"), "--log-level", "'DEBG'")


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    assert_one_line_error(run("agent", "--no-such-option"), "--no-such-option")
    assert_one_line_error(run("dump"), "Missing argument")
    assert_one_line_error(run("dump", str(tmp_path / "CommitLog-7-1.log")), "does not exist")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_secrets_of_the_settings_never_reach_the_debug_log(broker: Any, tmp_path: Path,
                                                           log_format: str) -> None:
    """Kafka client secrets go to Spark as source options: at DEBUG every option crosses py4j, logged. In
    JSON, every line the command logs is one JSON object."""
    kafka = {"bootstrap_servers": broker.bootstrap_servers,
             "consumer": {"sasl.password": "consumer-pass-7Qz"},
             "producer": {"sasl.password": "producer-pass-9Wx"}}
    spark = {"conf": {"spark.example.token": "token-K2v"}}
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"server": "secrets", "checkpoint": str(tmp_path / "checkpoint"),
                                      "kafka": kafka, "spark": spark}))
    result = run("pipeline", "--config", str(config), "--log-level", "DEBUG", "--log-format", log_format,
                 "--duration", "3", timeout=300)
    log = result.stdout + result.stderr
    assert "pipeline running" in log, log[-3000:]
    if log_format == "json":
        # Spark's JVM logs through log4j, not through Python: its lines are not ours to format.
        entries = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        ours = [entry for entry in entries if entry["logger"].startswith(("cassandra_cdc", "py4j"))]
        assert any(entry["message"].startswith("pipeline running") for entry in ours)
        assert {"DEBUG", "INFO"} <= {entry["level"] for entry in ours}
        assert all(entry["time"].endswith("+00:00") for entry in entries)
        assert not [line for line in result.stderr.splitlines() if " DEBUG py4j" in line], "a text line"
    else:
        assert " DEBUG " in log, log[-3000:]
    for value in ("consumer-pass-7Qz", "producer-pass-9Wx", "token-K2v"):
        assert value not in log
    assert "[redacted]" in log


@pytest.mark.parametrize("command", ["agent", "pipeline"])
def test_a_yaml_syntax_error_is_one_line_without_the_files_text(command: str, tmp_path: Path) -> None:
    """PyYAML quotes the faulty line, here a password: the error says where, not what is written there."""
    config = tmp_path / "config.yaml"
    config.write_text("server: x\nkafka:\n  producer: {sasl.password: hunter2-Zq8]\n")
    result = run(command, "--config", str(config))
    assert_one_line_error(result, f"{config}: line 3, column 40: expected ',' or '}}', but got ']'")
    assert "hunter2-Zq8" not in result.stderr + result.stdout
