"""Tables and their schemas: unknown tables skipped until the schema has them, schema changes published
before the records that need them."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

import cassandra_cdc.agent.tables as tables_module
from cassandra_cdc.agent import Agent
from cassandra_cdc.agent.tables_seen import TABLES_FILE, TablesSeen
from cassandra_cdc.storage import PartitionUpdateSerializer
from cassandra_cdc.storage.binary_io import DataInput
from cassandra_cdc.commitlog.mutation import Mutation
from cassandra_cdc.schema import Schema, parse_schema
from cassandra_cdc.simulator import Insert, to_mutation
from cassandra_cdc.kafka.schema_records import SchemaRecord

import agent_harness
from agent_harness import (
    SCHEMA_CQL, LATE_CQL, SCHEMA, NODE_SCHEMA, Key, wait_until, key_of, assert_published_exactly, Harness,
    MakeHarness, RawReader, running, metric)

broker, harness = agent_harness.broker, agent_harness.harness  # fixtures: a broker per module


# --- damage, unknown tables ---------------------------------------------------------------------------------


# ks.late as a real CREATE TABLE makes it: with a time-based id (a system table's is name-based).
CREATED_LATE_CQL = LATE_CQL.replace("WITH cdc = true",
                                    "WITH ID = 5a1c0e00-e844-11f1-8a5e-4f0f66fd55a8 AND cdc = true")
CREATED_LATE_SCHEMA = parse_schema(SCHEMA_CQL + CREATED_LATE_CQL)


def test_unknown_tables_are_skipped_once_waited_for_until_the_schema_has_them(
        harness: MakeHarness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A table id missing from the schema for longer than unknown_table_wait_seconds: its mutations are
    skipped (counted; a warning when the wait starts, an error when it ends); once the schema file has
    the table, its later mutations are published, with its schema record first."""
    monkeypatch.setattr(tables_module, "RELOAD_INTERVAL_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    h = harness(node_schema=CREATED_LATE_SCHEMA, published={"ks.users", "ks.late"})
    late = CREATED_LATE_SCHEMA.table("ks", "late")
    h.insert("ks.users", id=1, name="before")
    skipped = [h.insert("ks.late", id=1, v="unknown"), h.insert("ks.late", id=2, v="unknown")]
    h.insert("ks.users", id=2, name="after")
    h.node.sync()
    for segment, position in skipped:
        del h.expected[(segment, position, late.id)]
    with running(h.config(unknown_table_wait_seconds=0.5)) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the known table's changes")
        assert metric(agent, "cassandra_cdc_agent_mutations_skipped_total") == 2
        logged = [r.levelno for r in caplog.records if str(late.id) in r.getMessage()]
        assert logged == [logging.WARNING, logging.ERROR]
        h.schema_file.write_text(SCHEMA_CQL + CREATED_LATE_CQL)  # the schema now has it
        h.insert("ks.late", id=3, v="known")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the new table's change")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected, schema=CREATED_LATE_SCHEMA)
    schemas = h.reader(f"{h.server}.table-schemas")
    schemas.wait_for(lambda: len(schemas.messages) >= 2, "schema records")
    assert {m.key() for m in schemas.messages} == {b"ks.users", b"ks.late"}
    schemas.close()
    raw.close()


def test_a_table_the_schema_gets_late_loses_no_mutation(harness: MakeHarness,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A table created since the schema was loaded, its schema given to the agent only after its first
    mutations were read: reading waits at the first one (nothing after it is published meanwhile) and,
    once the schema has the table, every mutation of it is published, none skipped."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    h = harness(node_schema=CREATED_LATE_SCHEMA, published={"ks.users", "ks.late"})
    before = h.insert("ks.users", id=1, name="before")
    first_late = h.insert("ks.late", id=1, v="new table")
    h.insert("ks.late", id=2, v="new table")
    after = h.insert("ks.users", id=2, name="after")
    h.node.sync()
    late = CREATED_LATE_SCHEMA.table("ks", "late")
    with running(h.config(unknown_table_wait_seconds=120)) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: any(key[:2] == before for key in raw.arrival), "the change before the new table's")
        time.sleep(1.5)  # the agent meets the new table's mutation and reloads the schema, still without it
        raw.poll(0.5)
        assert not any(key[:2] in (first_late, after) for key in raw.arrival), "read past the unknown table"
        waiting = [r.getMessage() for r in caplog.records if "reading waits there" in r.getMessage()]
        assert len(waiting) == 1 and str(late.id) in waiting[0] and f"-{first_late[0]}.log offset " in waiting[0]
        h.schema_file.write_text(SCHEMA_CQL + CREATED_LATE_CQL)
        raw.wait_for(lambda: raw.has_all(h.expected), "every change, the new table's included")
        assert metric(agent, "cassandra_cdc_agent_mutations_skipped_total") == 0
    assert_published_exactly(raw, h.expected, schema=CREATED_LATE_SCHEMA)
    raw.close()


def test_a_system_table_the_schema_file_leaves_out_is_skipped_without_waiting(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """Cassandra's own tables (system.local, system.batches, ...) have ids made from their names; a schema
    file of the user's keyspaces leaves them out: their mutations are skipped at once, not waited for, and
    not warned of (an upgraded node logs the tables its new version adds before its schema is read)."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    h = harness(node_schema=NODE_SCHEMA, published={"ks.users", "ks.late"})  # ks.late: a name-based id
    h.insert("ks.users", id=1, name="before")
    skipped = h.insert("ks.late", id=1, v="system table")
    h.insert("ks.users", id=2, name="after")
    h.node.sync()
    del h.expected[(*skipped, NODE_SCHEMA.table("ks", "late").id)]
    with running(h.config(unknown_table_wait_seconds=120)) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes around it", timeout=30)
        assert metric(agent, "cassandra_cdc_agent_mutations_skipped_total") == 1
    raw.close()
    late_id = str(NODE_SCHEMA.table("ks", "late").id)
    assert [r.levelno for r in caplog.records if late_id in r.getMessage()] == [logging.INFO]


def test_an_agent_stopped_while_it_waits_for_a_table_reads_its_mutations_after_the_restart(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """Stopped while a mutation of an unknown table holds reading back: its position is not passed, so the
    restarted agent, whose schema has the table, publishes it."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    h = harness(node_schema=CREATED_LATE_SCHEMA, published={"ks.users", "ks.late"})
    before = h.insert("ks.users", id=0, name="before")
    h.insert("ks.late", id=1, v="new table")
    h.insert("ks.users", id=1, name="after")
    h.node.sync()
    with running(h.config(unknown_table_wait_seconds=120)):
        raw = h.raw_reader()
        raw.wait_for(lambda: any(key[:2] == before for key in raw.arrival), "the change before the new table's")
        time.sleep(1.0)  # the agent meets the new table's mutation
    h.schema_file.write_text(SCHEMA_CQL + CREATED_LATE_CQL)
    with running(h.config(unknown_table_wait_seconds=120)) as agent:
        raw.wait_for(lambda: raw.has_all(h.expected), "every change, the new table's included")
        assert metric(agent, "cassandra_cdc_agent_mutations_skipped_total") == 0
    assert_published_exactly(raw, h.expected, schema=CREATED_LATE_SCHEMA)
    raw.close()


ALTERED_CQL = SCHEMA_CQL.replace("prefs map<text, int>)", "prefs map<text, int>, email text)")
ALTERED = parse_schema(ALTERED_CQL)
SYSTEM_CQL = (Path(__file__).parent / "data" / "system_schemas" / "cassandra-4.0.11.cql").read_text()


def schema_versions(h: Harness, table: str) -> list[SchemaRecord]:
    reader = h.reader(f"{h.server}.table-schemas")
    reader.poll(1.0)
    return [r for r in map(SchemaRecord.decode, (m.value() for m in reader.messages))
            if f"{r.keyspace}.{r.table}" == table]


def log_added_column(h: Harness, table: str, column: str) -> None:
    """The system_schema mutation the node logs for ``ALTER TABLE ks.<table> ADD <column> text``."""
    h.insert("system_schema.columns", keyspace_name="ks", table_name=table, column_name=column,
             kind="regular", position=-1, type="text", clustering_order="none")


@contextlib.contextmanager
def agent_past_a_first_write(harness: MakeHarness, node_schema: Schema,
                             read_schema: Callable[[], Schema]) -> Iterator[tuple[Harness, Agent, RawReader]]:
    """A node with a write to ks.users (the only table published), and its agent, which reads the schema from
    the cluster with ``read_schema``, running and past that write."""
    h = harness(published={"ks.users"}, node_schema=node_schema)
    h.insert("ks.users", id=1, name="before")
    h.node.sync()

    def from_cluster(agent: Agent) -> None:
        agent.tables = tables_module.TableRegistry(agent.config, loader=read_schema)

    with running(h.config(), from_cluster) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the change before the ALTER")
        yield h, agent, raw
    raw.close()


def insert_with_email(h: Harness, key: int) -> Key:
    """An insert that uses the column ALTER TABLE added: only the new definition decodes it."""
    mutation = to_mutation(Insert("ks.users", {"id": key, "name": "n", "email": f"{key}@x"},
                                  timestamp=h.workload.clock.tick()), ALTERED)
    return (*h.write_mutation(mutation), mutation.updates[0].table.id)


def test_schema_file_change_publishes_the_new_definition_before_records_that_need_it(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """ALTER TABLE, with the schema from a file: the agent reloads the file when it changes and publishes the
    new version of the table's schema before the first record written with it."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    assert ALTERED.table("ks", "users").id == SCHEMA.table("ks", "users").id  # ALTER keeps the table id
    h = harness(published={"ks.users"})
    h.insert("ks.users", id=1, name="before")
    h.node.sync()
    with running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the change before the ALTER")
        h.schema_file.write_text(ALTERED_CQL)
        wait_until(lambda: any("changed: reloading" in r.getMessage() for r in caplog.records), "the reload")
        altered = insert_with_email(h, 2)
        h.node.sync()
        raw.wait_for(lambda: altered in raw.arrival, "the change after the ALTER")
    versions = schema_versions(h, "ks.users")
    assert [("email text" in r.cql) for r in versions] == [False, True]
    record = next(r for r in raw.records if key_of(r) == altered)
    update = PartitionUpdateSerializer.deserialize(DataInput(record.update), parse_schema(versions[-1].cql), 7)
    assert [c.name for c in update.regular_columns] == ["email", "name"]
    raw.close()


@pytest.mark.parametrize("broken", ["", "CREATE TABLE ks.users (id int PRIMARY", "CREATE TABLE ks.users (id int"])
def test_schema_file_being_rewritten_or_broken_keeps_the_loaded_schema(harness: MakeHarness, broken: str,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A schema file caught mid-write or broken never replaces a good schema: the agent would skip (lose) the
    changes of every table missing from it. It waits for the file to settle; a broken file is logged."""
    monkeypatch.setattr(tables_module, "SETTLE_SECONDS", 0.2)
    h = harness()
    registry = tables_module.TableRegistry(h.config())
    loaded = registry.schema
    h.schema_file.write_text(broken)
    registry.reload_if_changed()
    assert registry.schema is loaded, "a file just changed is not read yet"
    time.sleep(0.3)
    registry.reload_if_changed()
    assert registry.schema is loaded
    assert any("cannot be loaded" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    h.schema_file.write_text(ALTERED_CQL)
    wait_until(lambda: registry.reload_if_changed() or registry.schema is not loaded, "the fixed file loaded")
    assert "email" in {c.name for c in registry.schema.table("ks", "users").columns}


def test_schema_change_logged_by_the_node_reloads_the_cluster_schema(harness: MakeHarness) -> None:
    """ALTER TABLE, with the schema from the cluster: the node logs the change as a system_schema mutation
    before any data that uses it; the agent reloads on it (even right after its start) and publishes the new
    schema version first."""
    cluster_schema = [parse_schema(SCHEMA_CQL + SYSTEM_CQL)]
    with agent_past_a_first_write(harness, parse_schema(ALTERED_CQL + SYSTEM_CQL),
                                  lambda: cluster_schema[0]) as (h, agent, raw):
        cluster_schema[0] = parse_schema(ALTERED_CQL + SYSTEM_CQL)
        log_added_column(h, "users", "email")
        altered = insert_with_email(h, 2)
        h.node.sync()
        raw.wait_for(lambda: altered in raw.arrival, "the change after the ALTER")
        assert metric(agent, "cassandra_cdc_agent_mutations_read_total", table="system_schema.columns") == 1
    assert [("email text" in r.cql) for r in schema_versions(h, "ks.users")] == [False, True]


WITHOUT_EVENTS_CQL = "\n".join(line for line in SCHEMA_CQL.splitlines()
                               if not line.startswith("CREATE TABLE ks.events "))


class NodeReads:
    """The schema as the agent's reader reads it: the node beside the agent's, or another node's while that
    one is down (``node_beside_answered`` False)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.node_beside_answered = True

    def __call__(self) -> Schema:
        return self.schema

    def read_by(self, agent: Agent) -> None:
        """Make ``agent`` read its schema here (a ``prepare`` of ``running``)."""
        agent.tables = tables_module.TableRegistry(agent.config, loader=self)


def node_with_an_events_write(harness: MakeHarness) -> Harness:
    h = harness(node_schema=parse_schema(SCHEMA_CQL + SYSTEM_CQL))
    h.insert("ks.events", pk=1, ck=1, v="before the drop")
    h.node.sync()
    return h


def assert_events_published_then_dropped(h: Harness) -> None:
    """ks.events's schema was published, then its drop with the same definition, once."""
    records = schema_versions(h, "ks.events")
    last = SCHEMA.table("ks", "events")
    assert [(r.dropped, r.node, r.version) for r in records] == [(False, "node1", last.version_hash()),
                                                                (True, "node1", last.version_hash())]
    assert records[1].table_metadata().to_cql() == last.to_cql()


@pytest.mark.parametrize("source", ["cluster", "schema file"])
def test_a_table_the_cluster_dropped_has_its_drop_published_once(harness: MakeHarness, source: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """DROP TABLE, with the schema from the cluster: the node logs it as system_schema mutations, the agent's
    read at them lacks the table, and the agent publishes the table's last definition as dropped, once. A
    schema file that leaves a table out says nothing of a drop (an edit, maybe): no drop is published."""
    reads = NodeReads(parse_schema(SCHEMA_CQL + SYSTEM_CQL))
    h = node_with_an_events_write(harness)
    with caplog.at_level(logging.INFO), running(h.config(), reads.read_by if source == "cluster" else None):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the write before the DROP")
        if source == "cluster":
            reads.schema = parse_schema(WITHOUT_EVENTS_CQL + SYSTEM_CQL)
            h.insert("system_schema.tables", keyspace_name="ks", table_name="events")
        else:
            h.schema_file.write_text(WITHOUT_EVENTS_CQL)
            wait_until(lambda: any("changed: reloading it" in r.getMessage() for r in caplog.records),
                       "the schema file reloaded")
        h.insert("ks.users", id=1, name="after the drop")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the write after the DROP")
        if source == "cluster":
            wait_until(lambda: [r for r in schema_versions(h, "ks.events") if r.dropped],
                       "the drop published")
    if source == "cluster":
        assert_events_published_then_dropped(h)
    else:
        assert [r.dropped for r in schema_versions(h, "ks.events")] == [False]
    assert not [r for r in schema_versions(h, "ks.users") if r.dropped]
    raw.close()


def test_a_table_dropped_while_the_agent_was_stopped_has_its_drop_published_at_its_start(
        harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent keeps the tables its node had at its last read in its state directory: the first read of
    that node after a start lacks a table dropped meanwhile, whose drop it publishes once, with the definition
    it kept. A read another node answered (the node beside slow at the start) is made again until the node
    beside answers. Without the file (an agent of an earlier version) there is nothing to go by: no drop."""
    monkeypatch.setattr(tables_module, "RELOAD_INTERVAL_SECONDS", 0.5)
    reads = NodeReads(parse_schema(SCHEMA_CQL + SYSTEM_CQL))
    h = node_with_an_events_write(harness)
    with running(h.config(), reads.read_by):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the write before the DROP")
    kept = h.config().state_dir / "tables.json"
    saved = kept.read_text()
    reads.schema = parse_schema(WITHOUT_EVENTS_CQL + SYSTEM_CQL)  # DROP TABLE ks.events, the agent stopped
    kept.unlink()
    with running(h.config(), reads.read_by):
        h.insert("ks.users", id=1, name="after the drop")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "a write after the start")
    assert [r.dropped for r in schema_versions(h, "ks.events")] == [False]
    kept.write_text(saved)
    reads.node_beside_answered = False
    with running(h.config(), reads.read_by):
        h.insert("ks.users", id=2, name="read while another node answers")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "a write after the start")
        assert [r.dropped for r in schema_versions(h, "ks.events")] == [False]
        reads.node_beside_answered = True
        wait_until(lambda: [r for r in schema_versions(h, "ks.events") if r.dropped], "the drop published")
    with running(h.config(), reads.read_by):
        h.insert("ks.users", id=3, name="after another start")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "a write after another start")
    assert_events_published_then_dropped(h)
    raw.close()


EVENTS_ALTERED_CQL = ALTERED_CQL.replace("s int static,", "s int static, w text,")


@pytest.mark.parametrize("missed", ["read before the node applied it", "read failed"])
def test_a_schema_read_that_misses_a_logged_change_is_made_again_before_the_records_that_need_it(
        harness: MakeHarness, missed: str) -> None:
    """The node logs a schema change before it applies it: the agent's read at the logged change can come in
    between and get the schema before, or fail and keep it. The agent reads it again before the records that
    need the change: the new definition reaches the schema topic before the record of one update (published
    undecoded), and a mutation of several updates (decoded to be split) is published, not dead-lettered."""
    schemas = [parse_schema(cql + SYSTEM_CQL) for cql in (SCHEMA_CQL, ALTERED_CQL, EVENTS_ALTERED_CQL)]
    alters = {"logged": 0, "applied": 0}

    def read_schema() -> Schema:
        if alters["applied"] < alters["logged"]:  # the agent's read at a logged ALTER: not applied yet
            alters["applied"] = alters["logged"]
            if missed == "read failed":
                raise tables_module.CassandraUnreachable("no node answers")
            return schemas[alters["logged"] - 1]
        return schemas[alters["applied"]]

    def log_alter(table: str, column: str) -> None:
        alters["logged"] += 1
        log_added_column(h, table, column)

    with agent_past_a_first_write(harness, schemas[-1], read_schema) as (h, _, raw):
        log_alter("users", "email")
        single = insert_with_email(h, 2)
        h.node.sync()
        raw.wait_for(lambda: single in raw.arrival, "the change after the ALTER")
        assert [("email text" in r.cql) for r in schema_versions(h, "ks.users")] == [False, True]
        log_alter("events", "w")
        stamp = h.workload.clock.tick
        users = to_mutation(Insert("ks.users", {"id": 3, "email": "3@x"}, timestamp=stamp()), schemas[-1])
        events = to_mutation(Insert("ks.events", {"pk": 3, "ck": 1, "w": "w"}, timestamp=stamp()),
                             schemas[-1])
        several = (*h.write_mutation(Mutation(users.updates + events.updates)), users.updates[0].table.id)
        h.node.sync()
        raw.wait_for(lambda: several in raw.arrival, "a mutation of two updates after the second ALTER")
    assert alters == {"logged": 2, "applied": 2}


def test_a_change_the_node_applies_seconds_after_logging_it_reaches_the_schema_topic_before_its_records(
        harness: MakeHarness) -> None:
    """A node under load applies a logged ALTER seconds after it logged it: every read the agent makes until
    then has the schema before, the reads a second after the change included. A record that needs the added
    column, written two seconds after the change (a mutation of one update, published undecoded), still waits
    for the new definition, which reaches the schema topic first."""
    schemas = [parse_schema(cql + SYSTEM_CQL) for cql in (SCHEMA_CQL, ALTERED_CQL)]
    applied_at = [float("inf")]
    with agent_past_a_first_write(harness, schemas[-1],
                                  lambda: schemas[time.monotonic() >= applied_at[0]]) as (h, _, raw):
        applied_at[0] = time.monotonic() + 4.0
        log_added_column(h, "users", "email")
        h.node.sync()
        time.sleep(2.0)
        needs_email = insert_with_email(h, 2)
        h.node.sync()
        raw.wait_for(lambda: needs_email in raw.arrival, "the change after the ALTER")
        assert time.monotonic() >= applied_at[0]
    assert [("email text" in r.cql) for r in schema_versions(h, "ks.users")] == [False, True]


def test_a_table_another_node_lacks_is_no_drop(harness: MakeHarness) -> None:
    """While the node beside the agent is down its schema is read from another node, which may lack a table
    created moments before: that is no drop. Once the node beside answers again, a table it lacks is one."""
    full, lacking = (parse_schema(cql + SYSTEM_CQL) for cql in (SCHEMA_CQL, WITHOUT_EVENTS_CQL))
    assert lacking.table("ks", "events") is None and lacking.table("ks", "users") is not None
    reads = NodeReads(full)

    def read_after_a_logged_change(key: int) -> None:
        h.insert("system_schema.tables", keyspace_name="ks", table_name=f"t{key}")
        h.insert("ks.users", id=key, name="after a schema change")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the write after the schema change")

    with agent_past_a_first_write(harness, full, reads) as (h, agent, raw):
        reads.schema, reads.node_beside_answered = lacking, False
        read_after_a_logged_change(2)
        assert agent.tables.schema is lacking
        reads.schema, reads.node_beside_answered = full, True
        read_after_a_logged_change(3)
        assert agent.tables.schema is full
        assert schema_versions(h, "ks.events") == []  # the pass that read the other node's schema is over
        reads.schema = lacking
        read_after_a_logged_change(4)
        wait_until(lambda: [r for r in schema_versions(h, "ks.events") if r.dropped], "the drop published")
    assert [r.dropped for r in schema_versions(h, "ks.events")] == [True]


def test_the_tables_kept_for_drops_read_back_and_an_unreadable_file_is_only_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The definitions kept in the state directory read back as they were (the file private to the agent's
    user); an unreadable file costs only the drops made while the agent was stopped: logged, then replaced."""
    tables = [table for table in parse_schema(SCHEMA_CQL) if table.cdc]
    TablesSeen(tmp_path).save(tables)
    path = tmp_path / TABLES_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    read_back = TablesSeen(tmp_path).load()
    assert read_back is not None and [t.ddl() for t in read_back] == [t.ddl() for t in tables]
    path.write_text('{"version": 1, "tables": {')  # torn by hand: the agent writes it whole
    seen = TablesSeen(tmp_path)
    with caplog.at_level(logging.ERROR):
        assert seen.load() is None
    assert [r.getMessage() for r in caplog.records if str(path) in r.getMessage()] != []
    seen.save(tables)
    assert TablesSeen(tmp_path).load() is not None
