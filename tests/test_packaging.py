"""What each role installs: the agent on a Cassandra node needs neither Spark nor the test broker."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

from conftest import COMMITLOGS, DATA, REPO

SPARK_ROLE_PACKAGES = {"pyspark", "pyarrow", "pandas", "numpy", "protobuf", "noida-db"}

# Run in a fresh interpreter where the Spark roles' packages cannot be imported, as on a node where only
# `pip install cassandra-cdc` ran.
SPARK_BLOCKED = """
import importlib.abc, sys
blocked = {"pyspark", "pyarrow", "pandas", "numpy", "google.protobuf"}
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in blocked or name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
"""
WITHOUT_SPARK = SPARK_BLOCKED + """
sys.argv = ["cassandra-cdc", *sys.argv[1:]]
from cassandra_cdc.cli import main
main()
"""
# Every module of the packages named on the command line, imported where Spark cannot be.
IMPORT_WITHOUT_SPARK = SPARK_BLOCKED + """
import importlib, pkgutil
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    for found in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
        importlib.import_module(found.name)
"""


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_the_base_install_names_no_spark_package() -> None:
    base = {_requirement_name(r) for r in requires("cassandra-cdc") or [] if "extra ==" not in r}
    assert base, "the package declares no requirements"
    assert not base & SPARK_ROLE_PACKAGES, base & SPARK_ROLE_PACKAGES
    pipeline = {_requirement_name(r) for r in requires("cassandra-cdc") or [] if 'extra == "pipeline"' in r}
    assert {"pyspark", "pyarrow", "pandas"} <= pipeline


def test_the_agent_and_dump_run_without_spark(tmp_path: Path) -> None:
    for command in (["agent", "--help"], ["agent", "status", "--help"], ["tail", "--help"]):
        result = subprocess.run([sys.executable, "-c", WITHOUT_SPARK, *command], capture_output=True, text=True,
                                cwd=tmp_path)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    segment = sorted((COMMITLOGS / "3.0.13-encrypted").glob("*.log"))[0]
    schema = DATA / "system_schemas" / "cassandra-3.0.13.cql"
    result = subprocess.run([sys.executable, "-c", WITHOUT_SPARK, "dump", "--schema", str(schema), str(segment)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("\n") > 10


def test_kafka_knowledge_and_its_readers_import_without_spark(tmp_path: Path) -> None:
    """kafka/ is what every role shares: the agent, ``tail`` and the bootstrap's schema reads load no Spark."""
    packages = ["cassandra_cdc.kafka", "cassandra_cdc.cli.tail", "cassandra_cdc.agent"]
    result = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT_SPARK, *packages], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    result = subprocess.run([sys.executable, "-c", WITHOUT_SPARK, "tail", "--help"], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Print the records of a topic" in result.stdout


def test_make_installs_the_locked_versions() -> None:
    locked = {_requirement_name(line): line.split("==")[1] for line in
              (REPO / "constraints.txt").read_text().splitlines() if "==" in line and not line.startswith("#")}
    assert {"pyspark", "confluent-kafka", "cassandra-driver"} <= locked.keys()
    installed = {name: version(name) for name in locked}
    assert installed == locked
