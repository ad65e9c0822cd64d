"""``cassandra-cdc dump`` on inputs that are not what they seem: wrong schema or key, torn tails, FIFOs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from conftest import COMMITLOGS, DATA, SSTABLES
from test_cli import assert_one_line_error, run

from cassandra_cdc.schema import load_schema_files
from cassandra_cdc.simulator.node import SimulatedNode
from cassandra_cdc.simulator.operations import Insert, to_mutation

SEGMENT_4_0 = COMMITLOGS / "4.0.11-encrypted" / "CommitLog-7-1699285478684.log"
SCHEMA_4_0 = ["-s", str(DATA / "system_schemas" / "cassandra-4.0.11.cql"),
              "-s", str(DATA / "legacy_commitlog_tables" / "4.0.11.cql")]
TABLE_CQL = """CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};
CREATE TABLE ks.t (id bigint PRIMARY KEY, v text)
    WITH cdc = true AND ID = 0f6a4a8e-1b36-4a4c-9d8e-2f1c1a7e5b10;
"""


def test_dump_refuses_inputs_that_are_not_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "CommitLog-7-5.log"
    os.mkfifo(fifo)
    assert_one_line_error(run("dump", *SCHEMA_4_0, str(fifo), timeout=20), str(fifo), "is a FIFO")
    os.unlink(fifo)
    sstable_fifo = tmp_path / "nb-1-big-Data.db"
    os.mkfifo(sstable_fifo)
    assert_one_line_error(run("dump", str(sstable_fifo), timeout=20), str(sstable_fifo), "is a FIFO")
    os.unlink(sstable_fifo)
    (tmp_path / "CommitLog-7-123.log").mkdir()
    shutil.copy(SEGMENT_4_0, tmp_path)
    assert_one_line_error(run("dump", *SCHEMA_4_0, str(tmp_path)), str(tmp_path / "CommitLog-7-123.log"),
                          "is a directory")


def test_a_negative_limit_is_refused() -> None:
    assert_one_line_error(run("dump", *SCHEMA_4_0, "--limit", "-5", str(SEGMENT_4_0)), "--limit")


def test_a_schema_without_the_segments_tables_is_an_error() -> None:
    """Table ids of another cluster: nothing matches, which must not look like an empty segment."""
    schema = DATA / "legacy_commitlog_tables" / "3.0.29.cql"  # the test table under another id
    result = run("dump", "-s", str(schema), str(COMMITLOGS / "3.0.13-encrypted"))
    assert result.returncode == 2 and result.stdout == ""
    error = result.stderr.splitlines()[-1]
    assert error.startswith("error: no mutation read is of a table in the schema")
    # the test table, by the id in the directory's hash.txt
    assert "26be1710-7cb9-11ee-9fce-59fe9713701b (1404 mutations)" in error
    assert "Traceback" not in result.stderr


def test_a_key_of_another_type_than_the_schemas_is_damage_not_null(tmp_path: Path) -> None:
    (tmp_path / "right.cql").write_text(TABLE_CQL)
    (tmp_path / "wrong.cql").write_text(TABLE_CQL.replace("id bigint", "id int"))
    schema = load_schema_files([tmp_path / "right.cql"])
    node = SimulatedNode(tmp_path / "node", "node1", schema, "4.1", first_segment_id=1000)
    node.write(to_mutation(Insert("ks.t", {"id": 7, "v": "seven"}, timestamp=1), schema))
    node.close()
    result = run("dump", "-s", str(tmp_path / "right.cql"), str(node.cdc_raw_dir))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["key"] == {"id": 7}
    result = run("dump", "-s", str(tmp_path / "wrong.cql"), str(node.cdc_raw_dir))
    assert result.returncode == 1 and result.stdout == ""
    assert ("mutation could not be decoded: primary key column id: cannot decode 8 bytes as int"
            in result.stderr), result.stderr


def test_a_wrong_encryption_key_is_named_as_such() -> None:
    segment = COMMITLOGS / "3.4-encrypted" / "CommitLog-6-1480001790338.log"
    result = run("dump", "-s", str(DATA / "legacy_commitlog_tables" / "3.4.cql"),
                 "--key", "testing:1=00112233445566778899aabbccddeeff", str(segment))
    assert result.returncode == 1 and result.stdout == ""
    assert "the key for alias 'testing:1' does not decrypt this segment: wrong key?" in result.stderr


def test_a_torn_tail_keeps_every_intact_mutation_before_it(tmp_path: Path) -> None:
    """The file ends inside its last sync section (a copy cut short): its entries before the cut print."""
    intact = run("dump", *SCHEMA_4_0, str(SEGMENT_4_0))
    assert intact.returncode == 0, intact.stderr
    cut_at = 60000  # inside the third of the segment's four sections, which spans 1576-75003
    torn = tmp_path / SEGMENT_4_0.name
    torn.write_bytes(SEGMENT_4_0.read_bytes()[:cut_at])
    result = run("dump", *SCHEMA_4_0, str(torn))
    assert result.returncode == 1
    expected = [line for line in intact.stdout.splitlines() if json.loads(line)["position"] <= cut_at]
    assert len([line for line in expected if json.loads(line)["position"] > 1576]) > 200
    assert result.stdout.splitlines() == expected
    assert "section 3 at file offset 1576: sync marker points outside the file (torn tail)" in result.stderr


def test_an_sstable_key_of_another_type_than_the_schemas_is_an_error(tmp_path: Path) -> None:
    schema = tmp_path / "schema.cql"
    schema.write_text("CREATE TABLE legacy_tables.legacy_me_clust_counter "
                      "(pk int, ck text, val counter, PRIMARY KEY (pk, ck));\n")  # pk is text
    data_file = SSTABLES / "me" / "legacy_tables" / "legacy_me_clust_counter" / "me-1-big-Data.db"
    result = run("dump", "-s", str(schema), str(data_file))
    assert result.returncode == 1 and result.stdout == ""
    assert f"{data_file}: primary key column pk: cannot decode 1 bytes as int" in result.stderr
