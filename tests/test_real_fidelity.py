"""Real Cassandra files read as Cassandra reads them (the files: ``tests/data/cassandra-5.0``, and files a
live node of each version writes in the test).

Two oracles, both Cassandra itself (see ``fidelity_files.py`` for how the files are made):

* SSTables (``big`` and ``bti``, uncompressed and every compressor): Cassandra's ``sstabledump`` of each
  against ``cassandra-cdc dump`` of the same file, both normalised into one structure (partitions, rows,
  cells with values, timestamps, TTLs and every kind of tombstone) and compared field by field.
* Commit log segments (plain, LZ4-compressed, encrypted): what a node that replayed them returns to
  ``SELECT JSON *`` against the same segments decoded by our reader, merged by the pipeline's merge
  rules and rendered by our ``SELECT JSON`` rendering, row by row and value by value.

The same comparisons run on files freshly written by a live node of Cassandra 5.0, 4.1 and 4.0, each
compared with its own version's ``sstabledump`` and replay (``test_a_live_node_writes_...``).
"""

from __future__ import annotations

import decimal
import functools
import gzip
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from cassandra_cdc.commitlog import KeyStore, SegmentReader
from cassandra_cdc.commitlog.replay import ReplayStats, replay
from cassandra_cdc.merge.reconcile import apply, visible_rows
from cassandra_cdc.merge.partition_state import PartitionState
from cassandra_cdc.schema import Schema, TableMetadata, load_schema_files
from cassandra_cdc.schema.types import json_text

from conftest import REAL_CLUSTERS, require_jvm_artifacts
from fidelity_files import (COMPRESSIONS, EMPTY_VALUES, FIXTURES, KEYSTORE_PASSWORD, generate,
                            phase_directories)

# Cassandra's sstabledump prints a counter cell's value as the first 8 bytes of its counter context (a
# header, not the count): only the replayed SELECT can tell counter values.
COUNTER_VALUE_UNKNOWN = "counter value (sstabledump cannot show it)"


def phase_schema(root: Path) -> Schema:
    return load_schema_files([directory / "schema.cql" for directory in phase_directories(root)])


# --- commit logs: Cassandra's replay and SELECT JSON against our reader, merge and rendering --------------

def our_select(root: Path, now_seconds: int) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows as ``SELECT JSON *`` shows them, from the kept segments alone."""
    schema = phase_schema(root)
    keys = KeyStore.load(root / "fidelity.jceks", KEYSTORE_PASSWORD)
    states: dict[str, dict[bytes, PartitionState]] = defaultdict(dict)
    tables: dict[str, TableMetadata] = {}
    for directory in phase_directories(root):
        for segment in sorted((directory / "commitlog").glob("CommitLog-*.log")):
            stats = ReplayStats()
            with SegmentReader(segment, keys) as reader:
                for _, mutation in replay(reader, schema, stats):
                    for update in mutation.updates:
                        table = update.table
                        if not table.keyspace.startswith("fid_"):
                            continue
                        tables[table.qualified_name] = table
                        state = states[table.qualified_name].setdefault(bytes(update.key), PartitionState())
                        apply(state, update, table, now_seconds)
                assert reader.damage == [], segment
            # (System tables' mutations are skipped: the schema is of the test keyspaces alone.)
            assert stats.undecodable == 0, (segment, stats)
    selected = {}
    for name, partitions in states.items():
        table = tables[name]
        types = {column.name: column.type for column in table.columns}
        selected[name] = [
            _number_exact(json_text({column: types[column].to_json(value) for column, value in row.items()}))
            for state in partitions.values() for row in visible_rows(state, table, now_seconds).values()]
    return selected


def cassandra_select(root: Path) -> dict[str, list[dict[str, Any]]]:
    selected: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with gzip.open(root / "replayed-select.jsonl.gz", "rt", encoding="utf-8") as file:
        lines = file.read().splitlines()
    for line in lines:
        record = _number_exact(line)
        selected[record["table"]].append(record["row"])
    return selected


def compare_select(root: Path) -> list[str]:
    """Differences between Cassandra's replayed rows and ours: one line per differing value."""
    ours, theirs = our_select(root, int(time.time())), cassandra_select(root)
    differences = []
    for table in sorted(set(ours) | set(theirs)):
        our_rows = {_primary_key(r): r for r in ours.get(table, [])}
        their_rows = {_primary_key(r): r for r in theirs.get(table, [])}
        for key in sorted(set(our_rows) | set(their_rows)):
            mine, cassandra = our_rows.get(key), their_rows.get(key)
            if mine is None or cassandra is None:
                differences.append(f"{table} {key}: ours {mine}, Cassandra's {cassandra}")
                continue
            for column in sorted(set(mine) | set(cassandra)):
                if mine.get(column, "absent") != cassandra.get(column, "absent"):
                    differences.append(f"{table} {key} {column}: ours {_shown(mine.get(column))}, "
                                       f"Cassandra's {_shown(cassandra.get(column))}")
    return differences


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _primary_key(row: dict[str, Any]) -> str:
    return json.dumps([row.get("pk"), row.get("ck")])


# --- SSTables: Cassandra's sstabledump against our dump ---------------------------------------------------

def _number_exact(text: str) -> Any:
    return json.loads(text, parse_float=decimal.Decimal)


def _key_text(value: Any) -> str:
    """sstabledump shows partition keys and cell paths as CQL text (``getString``), not JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _cell(name: str, path: str | None, timestamp: int, content: Any, ttl: tuple[int, int] | None = None) \
        -> tuple:
    return (name, path, timestamp, content, ttl)


def normalise_sstabledump(text: str, table: TableMetadata) -> list[tuple]:
    """Partitions as (key, deletion, items) with every cell complete: sstabledump leaves out a cell's
    timestamp and TTL when they are the row's."""
    unset_values = _columns_without_values(table)
    partitions = []
    for partition in _number_exact(text):
        head = partition["partition"]
        items: list[tuple] = []
        open_start: tuple | None = None
        for row in partition["rows"]:
            if row["type"] == "range_tombstone_bound" and "start" in row:
                open_start = _bound(row["start"])
            elif row["type"] == "range_tombstone_bound":
                end = _bound(row["end"])
                items.append(("range", open_start[:2], end[:2], open_start[2]))  # type: ignore[index]
            elif row["type"] == "range_tombstone_boundary":
                end, start = _bound(row["end"]), _bound(row["start"])
                items.append(("range", open_start[:2], end[:2], open_start[2]))  # type: ignore[index]
                open_start = start
            else:
                items.append(_dumped_row(row, unset_values))
        partitions.append((head["key"], _deletion(head.get("deletion_info")), items))
    return sorted(partitions, key=repr)


def _columns_without_values(table: TableMetadata) -> dict[str, Any]:
    """Columns whose cells sstabledump cannot show a value of: set elements (the value is the path) and
    counters."""
    return {c.name: COUNTER_VALUE_UNKNOWN if c.type.is_counter else None for c in table.columns
            if c.type.is_counter or (c.type.kind == "set" and c.type.multi_cell)}


def _bound(bound: dict[str, Any]) -> tuple:
    return (bound.get("clustering", []), bound["type"] == "inclusive", _deletion(bound["deletion_info"]))


def _deletion(info: dict[str, Any] | None) -> tuple[int, int] | None:
    return None if info is None else (int(info["marked_deleted"]), int(info["local_delete_time"]))


def _dumped_row(row: dict[str, Any], unset_values: dict[str, Any]) -> tuple:
    liveness = row.get("liveness_info", {})
    row_timestamp = int(liveness["tstamp"]) if "tstamp" in liveness else None
    row_ttl = (liveness["ttl"], int(liveness["expires_at"])) if "ttl" in liveness else None
    cells = []
    for cell in row["cells"]:
        name, path = cell["name"], cell["path"][0] if "path" in cell else None
        info = cell.get("deletion_info")
        if info is not None and "marked_deleted" in info:
            cells.append(_cell(name, None, int(info["marked_deleted"]), ("collection_deletion",
                                                                       int(info["local_delete_time"]))))
            continue
        timestamp = int(cell["tstamp"]) if "tstamp" in cell else row_timestamp
        if info is not None:
            content: Any = ("tombstone", int(info["local_delete_time"]))
        else:
            content = ("value", unset_values.get(name, cell.get("value")))
        if "ttl" in cell:
            ttl = (cell["ttl"], int(cell["expires_at"]))
        else:
            ttl = row_ttl if timestamp == row_timestamp and info is None else None
        cells.append(_cell(name, path, timestamp, content, ttl))
    return ("static" if row["type"] == "static_block" else "row", row.get("clustering", []),
            (row_timestamp, row_ttl) if liveness else None, _deletion(row.get("deletion_info")),
            sorted(cells, key=repr))


def normalise_our_dump(lines: str, table: TableMetadata) -> list[tuple]:
    """Our dump's JSON lines in the structure ``normalise_sstabledump`` makes."""
    unset_values = _columns_without_values(table)
    partitions: dict[str, tuple] = {}
    for line in lines.splitlines():
        change = _number_exact(line)
        key = [_key_text(value) for value in change["key"].values()]
        partition = partitions.setdefault(json.dumps(key), (key, [None], []))
        kind = change["type"]
        if kind == "partition_deletion":
            partition[1][0] = _our_deletion(change["deletion"])
        elif kind == "range_deletion":
            partition[2].append(("range", *[(list(change[side]["clustering"].values()),
                                             change[side]["inclusive"]) for side in ("start", "end")],
                                 _our_deletion(change["deletion"])))
        else:
            partition[2].append(_our_row(change, unset_values))
    return sorted(((key, deletion[0], items) for key, deletion, items in partitions.values()), key=repr)


def _our_deletion(deletion: dict[str, int]) -> tuple[int, int]:
    return deletion["timestamp"], deletion["local_deletion_time"]


def _our_row(change: dict[str, Any], unset_values: dict[str, Any]) -> tuple:
    liveness = change.get("liveness")
    cells = []
    for cell in change["cells"]:
        name = cell["column"]
        if "collection_deletion" in cell:
            deletion = cell["collection_deletion"]
            cells.append(_cell(name, None, deletion["timestamp"],
                               ("collection_deletion", deletion["local_deletion_time"])))
            continue
        path = _key_text(cell["path"]) if "path" in cell else None
        if cell.get("tombstone"):
            content: Any = ("tombstone", cell["deleted_at"])
        else:
            content = ("value", unset_values.get(name, cell["value"]))
        ttl = (cell["ttl"], cell["expires_at"]) if "ttl" in cell else None
        cells.append(_cell(name, path, cell["timestamp"], content, ttl))
    kind = "static" if change["type"] == "static_row" else "row"
    return (kind, list(change.get("clustering", {}).values()),
            (liveness["timestamp"], (liveness["ttl"], liveness["expires_at"]) if "ttl" in liveness else None)
            if liveness else None,
            _our_deletion(change["deletion"]) if "deletion" in change else None, sorted(cells, key=repr))


@functools.cache
def our_dumps(phase_directory: Path) -> dict[str, str]:
    """``cassandra-cdc dump`` of every SSTable of a phase in one run: each one's lines, by its path."""
    data_files = _data_files_of(phase_directory)
    result = subprocess.run([sys.executable, "-m", "cassandra_cdc", "dump", "--schema",
                             str(phase_directory / "schema.cql"), *map(str, data_files)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    lines: dict[str, str] = dict.fromkeys(map(str, data_files), "")
    for line in result.stdout.splitlines(keepends=True):
        lines[json.loads(line)["sstable"]] += line
    return lines


def compare_sstable(data_file: Path) -> list[str]:
    """Differences between sstabledump's and our dump's reading of one SSTable, one line per partition."""
    phase_directory = data_file.parents[3]
    schema = load_schema_files([phase_directory / "schema.cql"])
    keyspace, table_directory = data_file.parent.parent.name, data_file.parent.name
    table = schema.table(keyspace, table_directory.rsplit("-", 1)[0])
    oracle = data_file.with_name(data_file.name.replace("-Data.db", "-sstabledump.json")).read_text()
    theirs = normalise_sstabledump(oracle, table)
    ours = normalise_our_dump(our_dumps(phase_directory)[str(data_file)], table)
    differences = [f"partitions: ours {[p[0] for p in ours]}, Cassandra's {[p[0] for p in theirs]}"] \
        if [p[0] for p in ours] != [p[0] for p in theirs] else []
    for mine, cassandra in zip(ours, theirs):
        if mine != cassandra:
            differences += _item_differences(mine, cassandra)
    return differences


def _item_differences(mine: tuple, cassandra: tuple) -> list[str]:
    key = mine[0]
    if mine[1] != cassandra[1]:
        return [f"{key} partition deletion: ours {mine[1]}, Cassandra's {cassandra[1]}"]
    out = []
    our_items, their_items = mine[2], cassandra[2]
    if len(our_items) != len(their_items):
        out.append(f"{key}: {len(our_items)} rows and ranges, Cassandra {len(their_items)}")
    for ours, theirs in zip(our_items, their_items):
        if ours == theirs:
            continue
        if ours[0] == theirs[0] != "range" and ours[1:4] == theirs[1:4]:
            out += [f"{key} {ours[1]}: ours {[c for c in ours[4] if c not in theirs[4]]}, "
                    f"Cassandra's {[c for c in theirs[4] if c not in ours[4]]}"]
        else:
            out.append(f"{key}: ours {ours}, Cassandra's {theirs}")
    return out


# --- the tests --------------------------------------------------------------------------------------------

def _data_files(root: Path) -> list[Path]:
    return [data_file for directory in phase_directories(root) for data_file in _data_files_of(directory)]


def _data_files_of(phase_directory: Path) -> list[Path]:
    return sorted(phase_directory.glob("sstables/*/*/*-Data.db"))


def _sstable_id(data_file: Path) -> str:
    return f"{data_file.name.split('-')[2]}-{data_file.parent.name.rsplit('-', 1)[0]}"


def pipeline_empty_value_differences(root: Path) -> list[str]:
    """The one difference the merged rows keep on purpose: the pipeline decodes an empty value of a type
    other than text and blob as null (as the Python driver does, and as a typed Spark column must), where
    SELECT JSON shows ""."""
    empty = [column for column, literal in EMPTY_VALUES.items() if literal.startswith("blobAs")]
    return [f'{table} [2, "empty"] {column}: ours null, Cassandra\'s ""'
            for table in sorted(cassandra_select(root)) if ".everything_" in table
            for column in sorted(empty)]


SEGMENT_KINDS = ("plain", "LZ4Compressor", "encrypted")


def segment_kinds(root: Path) -> set[tuple[int, str]]:
    """(commit log version, plain, compressor or encrypted) of each segment under ``root``."""
    keys = KeyStore.load(root / "fidelity.jceks", KEYSTORE_PASSWORD)
    kinds = set()
    for segment in root.glob("*/commitlog/CommitLog-*.log"):
        with SegmentReader(segment, keys) as reader:
            descriptor = reader.descriptor
            kinds.add((reader.version, "encrypted" if descriptor.encrypted
                       else descriptor.compression_class or "plain"))
    return kinds


def test_the_fixtures_hold_both_formats_every_compressor_and_every_kind_of_segment():
    """What the comparisons below cover, so that they cannot pass on fewer files."""
    assert {_sstable_id(f) for f in _data_files(FIXTURES)} == {
        f"{sstable_format}-{table}" for sstable_format in ("big", "bti")
        for table in ["counters", *(f"everything_{name}" for name in COMPRESSIONS)]}
    assert segment_kinds(FIXTURES) == {(8, kind) for kind in SEGMENT_KINDS}
    # A row larger than a 64 KiB read, uncompressed, in either format; index blocks (BTI keeps them in
    # Rows.db, for partitions of more than one block only).
    assert all(f.stat().st_size > 65536 for f in _data_files(FIXTURES) if "everything_none" in f.parent.name)
    assert all(rows.stat().st_size > 0 for rows in FIXTURES.glob("bti/sstables/*/everything_*/*-Rows.db"))


@pytest.mark.parametrize("data_file", _data_files(FIXTURES), ids=_sstable_id)
def test_our_dump_of_a_real_sstable_shows_what_sstabledump_shows(data_file):
    assert compare_sstable(data_file) == []


def test_segments_merged_by_us_select_as_the_node_that_replayed_them():
    assert compare_select(FIXTURES) == pipeline_empty_value_differences(FIXTURES)


@pytest.fixture(scope="module", params=list(REAL_CLUSTERS))
def regenerated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The fixtures' files made again by a live node of each version, as ``python tests/fidelity_files.py``
    makes 5.0's."""
    from cassandra_cdc.localcluster.artifacts import check_cassandra

    version = request.param
    require_jvm_artifacts(lambda: check_cassandra(version))
    root = tmp_path_factory.mktemp(f"cassandra-{version}") / "files"
    generate(root, tmp_path_factory.mktemp("node"), version, progress=lambda line: None)
    return version, root


def test_a_live_node_writes_files_that_we_read_as_cassandra_reads_them(regenerated):
    version, root = regenerated
    data_files = _data_files(root)
    # 4.x writes SSTables in the ``big`` format only, and commit log version 7.
    expected = {_sstable_id(f) for f in _data_files(FIXTURES)
                if version == "5.0" or _sstable_id(f).startswith("big-")}
    assert {_sstable_id(f) for f in data_files} == expected
    assert segment_kinds(root) == {(8 if version == "5.0" else 7, kind) for kind in SEGMENT_KINDS}
    assert {f: compare_sstable(f) for f in data_files} == dict.fromkeys(data_files, [])
    assert compare_select(root) == pipeline_empty_value_differences(root)
