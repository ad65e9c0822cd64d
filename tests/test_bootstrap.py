"""Bootstrap: SSTables of real Cassandra nodes (../shared/cassandra-sstables) read and published as raw
snapshot records, against a real broker (noida-db) and a real local Spark.

The oracle is the fixtures' README (LegacySSTableTest's tables): ``legacy_nb_clust`` holds partitions
``'0'..'4'`` of 50 rows each, ``ck = str(i) + LONG``, ``val`` 128 lowercase letters, every cell written
with a timestamp between Statistics.db's min and max. Three copies of it stand for three replicas'
snapshots; merging the copies is the pipeline's job, so every copy is published.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from typer.testing import CliRunner

from cassandra_cdc.bootstrap import (BootstrapError, RecordBuilder, RecordLimits, SSTableSlice, plan,
                                     run_bootstrap)
from cassandra_cdc.bootstrap.task_plan import resolve_snapshots
from cassandra_cdc.bootstrap.progress import ProgressFile
from cassandra_cdc.bootstrap.sstable_records import max_local_deletion_time
from cassandra_cdc.storage.partition_split import split_partition
from cassandra_cdc.cli.main import app
from cassandra_cdc.storage import PartitionUpdateSerializer
from cassandra_cdc.storage.cells import Cell, DeletionTime, LivenessInfo
from cassandra_cdc.storage.binary_io import DataInput
from cassandra_cdc.storage.partition_update import PartitionUpdate
from cassandra_cdc.storage.rows import BoundKind, RangeTombstoneMarker, Row
from cassandra_cdc.pipeline.pipeline_config import load_config
from cassandra_cdc.schema import Schema, parse_schema
from cassandra_cdc.simulator import EmbeddedBroker
from cassandra_cdc.sstable import SSTable
from cassandra_cdc.kafka.raw_records import RawRecord
from cassandra_cdc.kafka.schema_records import SchemaRecord
from conftest import SSTABLES
from test_sstable import LEGACY, assert_readme_content, kind_of, legacy_schema

TABLE = "legacy_tables.legacy_nb_clust"
TABLE_ID = uuid.UUID("6c6e6221-0000-4000-8000-00000000b001")
FIXTURE = SSTABLES / "nb" / "legacy_tables" / "legacy_nb_clust"
SCHEMA_CQL = f"""
CREATE KEYSPACE legacy_tables WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': '3'}};
CREATE TABLE {TABLE} (pk text, ck text, val text, PRIMARY KEY (pk, ck)) WITH ID = {TABLE_ID} AND cdc = true;
"""
NODES = ("node1", "node2", "node3")


# --- helpers ----------------------------------------------------------------------------------------

def replica_snapshots(root: Path, source: Path = FIXTURE, table_id: uuid.UUID = TABLE_ID) -> list[Path]:
    """The fixture copied as three nodes' snapshots: ``<root>/nodeN/legacy_tables/<table>-<id>/snapshots/t1``."""
    directories = []
    for node in NODES:
        directory = root / node / "legacy_tables" / f"{source.name}-{table_id.hex}" / "snapshots" / "t1"
        shutil.copytree(source, directory)
        directories.append(directory)
    return directories


def schema_file(root: Path) -> Path:
    path = root / "schema.cql"
    path.write_text(SCHEMA_CQL)
    return path


def config_for(broker: EmbeddedBroker, root: Path, server: str) -> Any:
    return load_config(None, {"server": server, "checkpoint": str(root / "checkpoint"),
                              "kafka.bootstrap_servers": broker.bootstrap_servers})


def read_topic(broker: Any, topic: str, after: dict[int, int] | None = None,
               security: dict[str, Any] | None = None) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of ``topic`` to its end (from the offsets ``after`` gives, per partition), read with
    the librdkafka ``security`` settings if given."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "enable.partition.eof": True, **(security or {})})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        assignments = [TopicPartition(topic, p, (after or {}).get(p, 0)) for p in partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in assignments}
        consumer.assign(assignments)
        pending = {p for p, end in ends.items() if end > (after or {}).get(p, 0)}
        records = []
        deadline = time.monotonic() + 60
        while pending:
            assert time.monotonic() < deadline, f"{topic} was not read to its end"
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is not None:
                    continue
                records.append((message.key(), message.value()))
                if message.offset() + 1 >= ends[message.partition()]:
                    pending.discard(message.partition())
        return records
    finally:
        consumer.close()


def end_offsets(broker: EmbeddedBroker, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"check-{uuid.uuid4()}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def decoded(records: list[tuple[bytes, bytes]], schema: Schema) -> list[tuple[RawRecord, PartitionUpdate]]:
    out = []
    for key, value in records:
        record = RawRecord.decode(value)
        update = PartitionUpdateSerializer.deserialize(DataInput(record.update), schema, record.commitlog_version)
        assert key == record.table_id.bytes + update.key
        out.append((record, update))
    return out


def plain(update: PartitionUpdate) -> tuple:
    """An update as comparable values (column metadata left out: the schema's vs Statistics.db's types)."""
    def cells(row: Row) -> list:
        out = []
        for data in row.cells:
            for cell in getattr(data, "cells", [data]):
                out.append((data.column.name, cell.timestamp, cell.value, cell.ttl, cell.local_deletion_time,
                            cell.path))
            if getattr(data, "deletion", None) is not None:
                out.append((data.column.name, "deletion", data.deletion))
        return out

    def item(u: Row | RangeTombstoneMarker | None) -> tuple | None:
        if u is None:
            return None
        if isinstance(u, RangeTombstoneMarker):
            return ("marker", u.kind, u.clustering, u.open_deletion, u.close_deletion)
        return ("row", u.clustering, u.liveness, u.deletion, cells(u))

    return update.key, update.partition_deletion, item(update.static_row), [item(u) for u in update.unfiltereds]


# --- planning -----------------------------------------------------------------------------------------

def test_plan_is_one_task_per_sstable_named_by_node_and_splits_large_ones(tmp_path: Path) -> None:
    table = parse_schema(SCHEMA_CQL).table("legacy_tables", "legacy_nb_clust")
    directories = replica_snapshots(tmp_path)
    tasks = plan(directories, table)
    assert [t.node_id for t in tasks] == list(NODES)
    assert all(t.start == 0 and t.end is None and t.data_bytes == SSTable(t.path).data_length for t in tasks)
    # a glob, as one quoted argument, finds the same snapshots
    assert plan([str(tmp_path / "node*" / "legacy_tables" / "*" / "snapshots" / "t1")], table) == tasks

    split = plan(directories, table, target_bytes=60_000)  # partitions are about 67 KB each
    assert len(split) == 15 and len({t.task_id for t in split}) == 15
    for node in NODES:
        mine = [t for t in split if t.node_id == node]
        sstable = SSTable(mine[0].path)
        keys = [u.key for t in mine for u in sstable.partitions(table, t.data_range)]
        assert keys == [str(i).encode() for i in range(5)]  # every partition in exactly one task
        assert sum(t.data_bytes for t in mine) == sstable.data_length


def test_snapshots_can_be_named_and_are_checked_against_the_table(tmp_path: Path) -> None:
    table = parse_schema(SCHEMA_CQL).table("legacy_tables", "legacy_nb_clust")
    first, *_ = replica_snapshots(tmp_path)
    assert [s.node_id for s in resolve_snapshots([f"10.0.0.7={first}"])] == ["10.0.0.7"]
    assert [s.node_id for s in resolve_snapshots([first])] == ["snapshot"]
    with pytest.raises(BootstrapError, match="matches nothing"):
        plan([str(tmp_path / "nowhere*")], table)
    with pytest.raises(BootstrapError, match="holds no SSTable.*snapshots: t1"):
        plan([first.parent.parent], table)  # the table directory, not its snapshot
    # the directory names another id than the schema: an earlier table of the same name
    other = replica_snapshots(tmp_path / "old", table_id=uuid.UUID(int=7))[0]
    with pytest.raises(BootstrapError, match="earlier table of that name"):
        plan([other], table)
    # a table with another primary key shape cannot have written these SSTables
    simple = parse_schema(f"CREATE TABLE {TABLE} (pk text PRIMARY KEY, val text) WITH ID = {TABLE_ID};")
    with pytest.raises(BootstrapError, match="clustering columns"):
        plan([first], simple.table("legacy_tables", "legacy_nb_clust"))


# --- records ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("directory", LEGACY, ids=[d.name for d in LEGACY])
def test_records_decode_back_to_the_sstable_partitions(directory: Path) -> None:
    """Every real fixture (all versions, counters, compact storage): the published bytes decode, with the
    schema alone, to exactly what the SSTable holds; the README's content survives the trip."""
    version = directory.parent.parent.name
    schema = legacy_schema(version)
    sstable = SSTable(directory)
    table = schema.table("legacy_tables", sstable.descriptor.table)
    builder = RecordBuilder(sstable, table, "n1")
    originals, published = [], []
    for offset, update in sstable.partitions_with_offsets(table):
        (record,) = builder.records(offset, update, size_hint=None)
        assert record.snapshot and record.node_id == "n1" and record.position == offset
        assert record.commitlog_version == 7  # no deletion time past 2038 here
        assert record.segment_id == int(sstable.descriptor.generation)
        assert record.write_time == min(_timestamps(update))
        again = RawRecord.decode(record.encode())
        published.append(PartitionUpdateSerializer.deserialize(DataInput(again.update), schema, 7))
        originals.append(update)
    assert [plain(u) for u in published] == [plain(u) for u in originals]
    value_column = (originals[0].regular_columns or originals[0].static_columns)[0].name
    assert_readme_content(sstable, published, kind_of(directory), value_column)


def _timestamps(update: PartitionUpdate) -> list[int]:
    out = []
    rows = update.rows + ([update.static_row] if update.static_row is not None else [])
    for row in rows:
        if row.liveness is not None:
            out.append(row.liveness.timestamp)
        out += [c.timestamp for c in row.cells]
    return out


def _synthetic_partition() -> tuple[Schema, PartitionUpdate]:
    schema = parse_schema("CREATE TABLE ks.t (k int, c int, v text, s int static, PRIMARY KEY (k, c)) "
                          "WITH ID = 6c6e6221-0000-4000-8000-00000000b002;")
    table = schema.table("ks", "t")
    v, s = table.column(b"v"), table.column(b"s")
    assert v is not None and s is not None

    def clustering(c: int) -> tuple[bytes]:
        return (c.to_bytes(4, "big"),)

    def row(c: int, ts: int) -> Row:
        return Row(clustering(c), [Cell(v, ts, f"v{c}".encode())], LivenessInfo(ts))

    deletion = DeletionTime(5_000, 1_700_000_000)
    # rows 0-3, then a range deletion [4, 12] (rows 4-11 inside it, some newer than it), then rows 13-15
    unfiltereds: list = [row(c, 1_000) for c in range(4)]
    unfiltereds.append(RangeTombstoneMarker(BoundKind.INCL_START_BOUND, clustering(4), open_deletion=deletion))
    unfiltereds += [row(c, 9_000 if c % 2 else 1_000) for c in range(4, 12)]
    unfiltereds.append(RangeTombstoneMarker(BoundKind.INCL_END_BOUND, clustering(12), close_deletion=deletion))
    unfiltereds += [row(c, 1_000) for c in range(13, 16)]
    static_row = Row((), [Cell(s, 2_000, (7).to_bytes(4, "big"))], is_static=True)
    update = PartitionUpdate(table, (1).to_bytes(4, "big"), unfiltereds, static_row, DeletionTime(500, 1_600_000_000),
                             (v,), (s,))
    return schema, update


def test_large_partitions_are_split_into_updates_that_merge_to_the_same_rows() -> None:
    from cassandra_cdc.merge.reconcile import apply, visible_rows
    from cassandra_cdc.merge.partition_state import PartitionState

    schema, update = _synthetic_partition()
    table = update.table
    pieces = split_partition(update, RecordLimits(rows=3))
    assert len(pieces) == 5
    assert pieces[0].partition_deletion is not None and pieces[0].static_row is not None
    assert all(p.partition_deletion is None and p.static_row is None for p in pieces[1:])
    assert [r.clustering for p in pieces for r in p.rows] == [r.clustering for r in update.rows]
    for piece in pieces:
        # every piece is a valid update on its own: range deletions open and close inside it
        opened = 0
        for marker in piece.markers:
            opened += (1 if marker.kind.opens else 0) - (1 if marker.kind.closes else 0)
            assert opened in (0, 1)
        assert opened == 0
        assert len(piece.rows) <= 3
    # a cut inside the range deletion closes it at the last row and opens it again right after
    cut = pieces[2]
    assert cut.unfiltereds[0].kind == BoundKind.EXCL_START_BOUND
    assert pieces[1].unfiltereds[-1].kind == BoundKind.INCL_END_BOUND
    assert pieces[1].unfiltereds[-1].clustering == cut.unfiltereds[0].clustering == pieces[1].rows[-1].clustering

    def merged(updates: list[PartitionUpdate]) -> dict:
        state = PartitionState()
        for u in updates:
            apply(state, u, table, 1_700_000_100)
        return visible_rows(state, table, 1_700_000_100)

    whole = merged([update])
    assert merged(pieces) == whole == merged(list(reversed(pieces)))
    assert sorted(k[0] for k in whole) == sorted(c.to_bytes(4, "big") for c in [0, 1, 2, 3, 5, 7, 9, 11, 13, 14, 15])
    # and they survive serialization
    for piece in pieces:
        from cassandra_cdc.storage.binary_io import DataOutput
        out = DataOutput()
        PartitionUpdateSerializer.serialize(piece, out, 7)
        assert plain(PartitionUpdateSerializer.deserialize(DataInput(bytes(out)), schema, 7)) == plain(piece)

    # by size too: about 100 bytes per piece here
    assert len(split_partition(update, RecordLimits(rows=1000, bytes=100))) > 3


def test_unknown_columns_are_left_out_and_counted_and_5_0_deletion_times_use_version_8() -> None:
    # a schema that lost `val` entirely (not even as a dropped column): rows keep their liveness
    schema = parse_schema(f"CREATE TABLE {TABLE} (pk text, ck text, other int, PRIMARY KEY (pk, ck)) "
                          f"WITH ID = {TABLE_ID};")
    table = schema.table("legacy_tables", "legacy_nb_clust")
    sstable = SSTable(FIXTURE)
    builder = RecordBuilder(sstable, table, "n1")
    records = [r for offset, u in sstable.partitions_with_offsets(table) for r in builder.records(offset, u, None)]
    assert builder.stats.unknown_cells == 250 and builder.stats.rows == 250 and len(records) == 5
    for record in records:
        update = PartitionUpdateSerializer.deserialize(DataInput(record.update), schema, 7)
        assert len(update.rows) == 50 and all(r.cells == [] and r.liveness is not None for r in update.rows)

    oa = SSTable(SSTABLES / "oa" / "legacy_tables" / "legacy_oa_clust")
    oa_table = legacy_schema("oa").table("legacy_tables", "legacy_oa_clust")
    builder = RecordBuilder(oa, oa_table, "n1")
    offset, update = next(oa.partitions_with_offsets(oa_table))
    row = update.rows[0]
    cell = row.cells[0]
    late = 3_000_000_000  # 2065: only 5.0's unsigned deletion times hold it
    row.cells[0] = Cell(cell.column, cell.timestamp, cell.value, 630_720_000, late)
    assert max_local_deletion_time(update) == late
    (record,) = builder.records(offset, update, None)
    assert record.commitlog_version == 8
    again = PartitionUpdateSerializer.deserialize(DataInput(record.update), legacy_schema("oa"), 8)
    assert again.rows[0].cells[0].local_deletion_time == late


# --- Spark and Kafka ------------------------------------------------------------------------------------

def test_bootstrap_publishes_every_replica_snapshot_as_snapshot_records(broker: EmbeddedBroker, spark: Any,
                                                                        tmp_path: Path) -> None:
    config = config_for(broker, tmp_path, "bs1")
    directories = replica_snapshots(tmp_path)
    report = run_bootstrap(spark, config, TABLE, [str(d) for d in directories], schema_file(tmp_path),
                           progress=False)
    assert (report.tasks, report.tasks_run, report.tasks_skipped, report.sstables) == (3, 3, 0, 3)
    assert (report.partitions, report.rows, report.records) == (15, 750, 15)
    assert report.schema_published and report.file_bytes == 3 * FIXTURE.joinpath("nb-1-big-Data.db").stat().st_size

    (schema_key, schema_value), = read_topic(broker, config.schema_topic)
    assert schema_key == TABLE.encode()
    schema_record = SchemaRecord.decode(schema_value)
    assert schema_record.table_id == str(TABLE_ID) and schema_record.node == "bootstrap"
    schema = parse_schema(schema_record.cql)

    published = decoded(read_topic(broker, config.raw_topic), schema)
    assert len(published) == 15 and all(r.snapshot for r, _ in published)
    sstable = SSTable(FIXTURE)
    for node in NODES:
        mine = sorted(((r, u) for r, u in published if r.node_id == node), key=lambda p: p[0].position)
        updates = [u for _, u in mine]
        assert_readme_content(sstable, updates, "clust", "val")
        assert [r.position for r, _ in mine] == [o for o, _ in sstable.partitions_with_offsets()]
    # the replicas' copies are the same bytes: the pipeline keeps one
    assert len({(r.update, r.digest) for r, _ in published}) == 5
    progress = json.loads(Path(report.progress_file).read_text())
    assert progress["finished"] and len(progress["completed"]) == 3


def test_an_interrupted_bootstrap_resumes_without_reading_completed_sstables_again(
        broker: EmbeddedBroker, spark: Any, tmp_path: Path) -> None:
    config = config_for(broker, tmp_path, "bs2")
    directories = [str(d) for d in replica_snapshots(tmp_path)]
    table = parse_schema(SCHEMA_CQL).table("legacy_tables", "legacy_nb_clust")
    tasks = plan(directories, table, target_bytes=60_000)
    assert len(tasks) == 15
    failing = next(t for t in tasks if t.node_id == "node2" and t.start > 0)

    def fail_one(task: SSTableSlice) -> None:
        if task.task_id == failing.task_id:
            raise RuntimeError("injected failure")

    with pytest.raises(BootstrapError, match="injected failure") as failure:
        run_bootstrap(spark, config, TABLE, directories, schema_file(tmp_path), progress=False,
                      target_task_bytes=60_000, task_hook=fail_one)
    assert "run it again to resume" in str(failure.value)
    store = ProgressFile.at(tmp_path / "checkpoint" / "bootstrap" / f"{TABLE}.json", table)
    done = store.load()
    assert failing.task_id not in done and set(done) < {t.task_id for t in tasks}
    table_schema = parse_schema(SCHEMA_CQL)
    first_run = decoded(read_topic(broker, config.raw_topic), table_schema)
    first_ends = end_offsets(broker, config.raw_topic)

    report = run_bootstrap(spark, config, TABLE, directories, schema_file(tmp_path), progress=False,
                           target_task_bytes=60_000)
    assert report.tasks_skipped == len(done) and report.tasks_run == 15 - len(done)
    assert {r["task_id"] for r in report.task_results} == {t.task_id for t in tasks} - set(done)
    assert report.rows == 50 * report.partitions
    second_run = decoded(read_topic(broker, config.raw_topic, after=first_ends), table_schema)
    everything = first_run + second_run
    # One partition per task here: the second run published the partitions of the other tasks, and
    # none of the completed ones. (A task cancelled when the first run failed may still deliver a
    # record late, so the records after the first read can include one of those too.)
    after = {(r.node_id, r.position) for r, _ in second_run}
    assert after >= {(t.node_id, t.start) for t in tasks if t.task_id not in done}
    assert after.isdisjoint({(t.node_id, t.start) for t in tasks if t.task_id in done})
    assert report.records == 15 - len(done)
    # together: every node's every partition, at least once (a failed task may have published some)
    offsets = [o for o, _ in SSTable(FIXTURE).partitions_with_offsets()]
    assert {(r.node_id, r.position) for r, _ in everything} == {(n, o) for n in NODES for o in offsets}
    # a finished bootstrap has nothing left to do
    again = run_bootstrap(spark, config, TABLE, directories, schema_file(tmp_path), progress=False,
                          target_task_bytes=60_000)
    assert (again.tasks_run, again.tasks_skipped, again.rows) == (0, 15, 0)
    restarted = ProgressFile.at(Path(again.progress_file), table).load()
    assert set(restarted) == {t.task_id for t in tasks}


def test_a_file_uri_checkpoint_keeps_the_progress_file_inside_it(broker: EmbeddedBroker, spark: Any,
                                                                  tmp_path: Path, monkeypatch: Any) -> None:
    """The checkpoint is a Hadoop path, as the pipeline takes it: ``file:///...`` names the directory, and
    the progress file is kept in it (not in a ``file:`` directory under the working directory)."""
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "checkpoint"
    directories = [str(d) for d in replica_snapshots(tmp_path)]
    config = load_config(None, {"server": "bs5", "checkpoint": f"file://{checkpoint}",
                                "kafka.bootstrap_servers": broker.bootstrap_servers})
    report = run_bootstrap(spark, config, TABLE, directories[:1], schema_file(tmp_path), progress=False)
    kept = checkpoint / "bootstrap" / f"{TABLE}.json"
    assert Path(report.progress_file) == kept
    assert json.loads(kept.read_text())["finished"]
    assert not (tmp_path / "file:").exists()
    # the CLI's --checkpoint takes the URI as it is written too; the run resumes from the same file
    result = CliRunner().invoke(app, ["bootstrap", "--bootstrap-servers", broker.bootstrap_servers,
                                      "--server", "bs5", "--checkpoint", f"file://{checkpoint}", "--table",
                                      TABLE, "--no-progress", "--sstables", *directories])
    assert result.exit_code == 0, result.output
    assert "2 of 3 tasks run, 1 done before" in result.output
    assert len(json.loads(kept.read_text())["completed"]) == 3
    assert not (tmp_path / "file:").exists()


def test_schema_comes_from_the_schema_topic_and_must_match_the_file(broker: EmbeddedBroker, spark: Any,
                                                                   tmp_path: Path) -> None:
    config = config_for(broker, tmp_path, "bs3")
    directories = [str(d) for d in replica_snapshots(tmp_path)]
    with pytest.raises(BootstrapError, match="give --schema"):
        run_bootstrap(spark, config, TABLE, directories, None, progress=False)
    run_bootstrap(spark, config, TABLE, directories[:1], schema_file(tmp_path), progress=False)
    # now on the topic: no file needed, and nothing published again
    report = run_bootstrap(spark, config, TABLE, directories[1:], None, progress=False)
    assert report.rows == 500 and not report.schema_published
    wrong = tmp_path / "wrong.cql"
    wrong.write_text(SCHEMA_CQL.replace(str(TABLE_ID), str(uuid.UUID(int=9))))
    with pytest.raises(BootstrapError, match="describes another table"):
        run_bootstrap(spark, config, TABLE, directories, wrong, progress=False, restart=True)


def test_cli(broker: EmbeddedBroker, spark: Any, tmp_path: Path) -> None:
    """In process (the session already running is used, and left running)."""
    directories = [str(d) for d in replica_snapshots(tmp_path)]
    (tmp_path / "pipeline.yaml").write_text(
        f"server: bs4\ncheckpoint: {tmp_path / 'checkpoint'}\nkafka:\n  bootstrap_servers: {broker.bootstrap_servers}\n")
    runner = CliRunner()
    help_text = runner.invoke(app, ["bootstrap", "--help"], env={"COLUMNS": "200"}).output
    assert "--sstables" in help_text and "--schema" in help_text and "resumes" in help_text
    # the shell expands a glob: the first directory follows --sstables, the others are arguments
    arguments = ["bootstrap", "-c", str(tmp_path / "pipeline.yaml"), "--table", TABLE, "--schema",
                 str(schema_file(tmp_path)), "--no-progress", "--sstables", *directories]
    result = runner.invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert "3 of 3 tasks run" in result.output and "750 rows" in result.output
    result = runner.invoke(app, arguments)
    assert result.exit_code == 0 and "0 of 3 tasks run, 3 done before" in result.output
    result = runner.invoke(app, [*arguments, "--restart"])
    assert result.exit_code == 0 and "3 of 3 tasks run" in result.output
    bad = ["bootstrap", "-c", str(tmp_path / "pipeline.yaml"), "--table", "legacy_tables.nope", "--schema",
           str(schema_file(tmp_path)), "--sstables", directories[0]]
    result = runner.invoke(app, bad)
    assert result.exit_code == 1 and "does not define legacy_tables.nope" in result.output
    assert spark.sparkContext._jsc is not None  # still running
