"""Schema changes while the agents or the pipeline are down, on the real thing: three Cassandra 5.0 nodes
(RF=3, ``real_cassandra``), one ``cassandra-cdc agent`` per node (schema read from its node by CQL), the
``cassandra-cdc pipeline`` (local[2]) on real Kafka (``real_kafka``), one pipeline checkpoint throughout.

Agents down: one agent killed (kill -9), ``ALTER TABLE ... ADD`` and rows using the new column, which the
two others publish; those two killed as well, ``ALTER TABLE ... DROP`` and more rows, ``CREATE TABLE ...
WITH cdc = true`` and rows in it, ``DROP TABLE`` of another table; the three started again read what they
missed with the schema of now, and each publishes the drop (the pipeline writes one ``DROP``).
Pipeline down (kill -9, the agents running): ADD, rows, DROP, rows, another new table and rows; the
pipeline started again from its checkpoint. After each, every table's events (read_committed), replayed,
equal ``SELECT *`` at CONSISTENCY ALL. Then: each write has exactly one event, with the columns of the
table the pipeline decoded it with (after an ADD the new column, after a DROP not the dropped one, in
``before`` too); each agent published every write; nothing went to the errors topic.
"""

from __future__ import annotations

import collections
import time
from typing import Any, NamedTuple

import pytest

from real_system import (System, consume_events, digests_by_node, drops_by_node, raw_records, read_twice,
                         replayed_tables, session_at_all, table_id, topic_exists, wait_for)

KEYSPACE = "ddl_while_down"
SERVER = "ddlwhiledown"
TABLE = "items"
CREATED = {"agents": "created_while_agents_down", "pipeline": "created_while_pipeline_down"}
CREATED_ROWS = 3
DOOMED = "dropped_while_agents_down"
# Seconds for the events of a phase, or for events matching the tables once the stopped part runs again.
EVENTS_TIMEOUT = 180.0
SCHEMA = [
    f"CREATE KEYSPACE {KEYSPACE} WITH replication = {{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}}",
    f"CREATE TABLE {KEYSPACE}.{TABLE} (id int PRIMARY KEY, v text, dropped_1 text, dropped_2 text) "
    "WITH cdc = true",
    f"CREATE TABLE {KEYSPACE}.{DOOMED} (id int PRIMARY KEY, v text) WITH cdc = true"]


class Phase(NamedTuple):
    """The writes to ``items`` after a schema change (``alter``; none for the first phase): rows ``inserted``
    with every column the table has then (``columns``; ``v`` is the phase's name), a row of an earlier phase
    ``updated`` in all of them, one ``deleted``; and the columns (besides ``id``) of their events' ``before``
    and ``after``: those of the table when the pipeline decoded them."""

    name: str
    alter: str | None
    columns: tuple[str, ...]
    event_columns: tuple[str, ...]
    inserted: range
    updated: int | None = None
    deleted: int | None = None

    @property
    def writes(self) -> int:
        return len(self.inserted) + (self.updated is not None) + (self.deleted is not None)


BEFORE = Phase("before", None, ("v", "dropped_1", "dropped_2"), ("v", "dropped_1", "dropped_2"), range(0, 5))
# One agent down: the two others publish these, decoded at once with the table of then.
ONE_AGENT_DOWN = Phase("one agent down, added", "ADD added_1 text",
                       ("v", "dropped_1", "dropped_2", "added_1"), ("v", "dropped_1", "dropped_2", "added_1"),
                       range(10, 13), updated=0)
# Every agent down: published once they run again, with the schema of then.
AGENTS_DOWN = Phase("agents down, dropped", "DROP dropped_1", ("v", "dropped_2", "added_1"),
                    ("v", "dropped_2", "added_1"), range(20, 23), updated=1, deleted=2)
# The pipeline down: decoded once it runs again, with the table of then, after the DROP below.
PIPELINE_DOWN_ADDED = Phase("pipeline down, added", "ADD added_2 text",
                            ("v", "dropped_2", "added_1", "added_2"), ("v", "added_1", "added_2"),
                            range(30, 33), updated=3)
PIPELINE_DOWN_DROPPED = Phase("pipeline down, dropped", "DROP dropped_2", ("v", "added_1", "added_2"),
                              ("v", "added_1", "added_2"), range(40, 43), updated=4, deleted=10)
PHASES = (BEFORE, ONE_AGENT_DOWN, AGENTS_DOWN, PIPELINE_DOWN_ADDED, PIPELINE_DOWN_DROPPED)


def change_schema(session: Any, statement: str) -> None:
    session.execute(statement)
    assert session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)


def write(session: Any, phase: Phase) -> None:
    table = f"{KEYSPACE}.{TABLE}"
    if phase.alter is not None:
        change_schema(session, f"ALTER TABLE {table} {phase.alter}")
    values = [phase.name if column == "v" else f"{column} ({phase.name})" for column in phase.columns]
    for row_id in phase.inserted:
        session.execute(f"INSERT INTO {table} (id, {', '.join(phase.columns)}) "
                        f"VALUES (%s{', %s' * len(phase.columns)})", (row_id, *values))
    if phase.updated is not None:
        session.execute(f"UPDATE {table} SET {', '.join(f'{c} = %s' for c in phase.columns)} WHERE id = %s",
                        (*values, phase.updated))
    if phase.deleted is not None:
        session.execute(f"DELETE FROM {table} WHERE id = %s", (phase.deleted,))


def create_and_write(session: Any, table: str) -> None:
    change_schema(session, f"CREATE TABLE {KEYSPACE}.{table} (id int PRIMARY KEY, v text) WITH cdc = true")
    for row_id in range(CREATED_ROWS):
        session.execute(f"INSERT INTO {KEYSPACE}.{table} (id, v) VALUES (%s, 'new')", (row_id,))


def phase_of(event: dict[str, Any]) -> Phase:
    """The phase of the write an event shows: the ``v`` it wrote, or the row it deleted."""
    if event["after"] is not None:
        return next(phase for phase in PHASES if phase.name == event["after"]["v"])
    return next(phase for phase in PHASES if phase.deleted == event["before"]["id"])


def await_events(bootstrap_servers: str, phase: Phase, children: list[Any]) -> None:
    """Until every write of ``phase`` has its event."""
    topic = f"{SERVER}.{KEYSPACE}.{TABLE}"
    wait_for(lambda: sum(phase_of(e) == phase for e in consume_events(bootstrap_servers, [topic])[topic])
             == phase.writes, f"the events of the phase '{phase.name}'", EVENTS_TIMEOUT, children)


@pytest.fixture(scope="module")
def outcome(real_cassandra: Any, real_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run both scenarios on one pipeline checkpoint; what each check found, the events, the raw records."""
    started = time.monotonic()
    timings: dict[str, float] = {}
    bootstrap = real_kafka.bootstrap_servers
    system = System(tmp_path_factory.mktemp("ddl-while-down"), real_cassandra, real_kafka, SERVER,
                    tables=[f"{KEYSPACE}.*"])
    first, others = system.agents[0], system.agents[1:]
    nodes = {node.address for node in real_cassandra.nodes}
    with session_at_all(real_cassandra, SCHEMA) as session:
        try:
            system.start_agents()
            wait_for(lambda: topic_exists(bootstrap, f"{SERVER}.raw"), "the raw topic", 60, system.children)
            system.pipeline.start()
            write(session, BEFORE)
            session.execute(f"INSERT INTO {KEYSPACE}.{DOOMED} (id, v) VALUES (1, 'before its drop')")
            doomed = table_id(session, KEYSPACE, DOOMED)
            wait_for(lambda: system.pipeline.ready, "the pipeline", 180, system.children)
            await_events(bootstrap, BEFORE, system.children)
            wait_for(lambda: {node: len(digests) for node, digests in digests_by_node(
                bootstrap, f"{SERVER}.raw", doomed).items()} == dict.fromkeys(nodes, 1),
                     f"every agent to publish the row of {DOOMED}", 120, system.agents)
            timings["started"] = time.monotonic() - started

            first.kill()
            write(session, ONE_AGENT_DOWN)
            await_events(bootstrap, ONE_AGENT_DOWN, [*others, system.pipeline])
            for agent in others:
                agent.kill()
            write(session, AGENTS_DOWN)
            create_and_write(session, CREATED["agents"])
            change_schema(session, f"DROP TABLE {KEYSPACE}.{DOOMED}")
            system.start_agents()
            wait_for(lambda: drops_by_node(bootstrap, SERVER, doomed) == dict.fromkeys(nodes, 1),
                     f"every agent to publish the drop of {DOOMED}", 120, system.agents)
            agents_down = replayed_tables(bootstrap, session, KEYSPACE, SERVER, [TABLE, CREATED["agents"]],
                                          EVENTS_TIMEOUT, system.children)
            timings["agents down"] = time.monotonic() - started

            system.pipeline.kill()
            write(session, PIPELINE_DOWN_ADDED)
            write(session, PIPELINE_DOWN_DROPPED)
            create_and_write(session, CREATED["pipeline"])
            # Every agent past the DROP: the pipeline's catalog gets the table of then at its start.
            created = table_id(session, KEYSPACE, CREATED["pipeline"])
            wait_for(lambda: {node: len(digests) for node, digests in digests_by_node(
                bootstrap, f"{SERVER}.raw", created).items()} == dict.fromkeys(nodes, CREATED_ROWS),
                     "every agent to publish the new table's rows", 120, system.agents)
            system.pipeline.start()
            wait_for(lambda: system.pipeline.ready, "the restarted pipeline", 180, system.children)
            pipeline_down = replayed_tables(bootstrap, session, KEYSPACE, SERVER, [TABLE, *CREATED.values()],
                                            EVENTS_TIMEOUT, system.children)
            timings["pipeline down"] = time.monotonic() - started
            published = {table: digests_by_node(bootstrap, f"{SERVER}.raw",
                                                table_id(session, KEYSPACE, table))
                         for table in [TABLE, *CREATED.values()]}
            errors = raw_records(bootstrap, f"{SERVER}.errors", b"")  # every key starts with b""
            doomed_changes = [change["type"] for value in consume_events(bootstrap, [SERVER])[SERVER]
                              for change in value["tableChanges"]
                              if change["id"] == f'"{KEYSPACE}"."{DOOMED}"']
        finally:
            system.stop()
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
    return {"checks": {"agents": agents_down, "pipeline": pipeline_down}, "published": published,
            "nodes": nodes, "errors": errors, "doomed_changes": doomed_changes, "logs": system.logs()}


@pytest.mark.parametrize("down", ["agents", "pipeline"])
def test_each_tables_events_replay_to_what_select_returns(outcome, down):
    """After the agents were down, then after the pipeline was: every table involved, new ones included."""
    check = outcome["checks"][down]
    for table, (_, rows) in check.selected.items():
        assert rows, f"{table}: no rows"
    assert check.differences == dict.fromkeys(check.selected, []), f"{check.differences}\n{outcome['logs']}"


def test_each_write_has_one_event_with_the_columns_of_the_table_it_was_decoded_with(outcome):
    events = outcome["checks"]["pipeline"].events
    for table, table_events in events.items():
        duplicates = read_twice(table_events)
        assert duplicates == [], f"{table}: {len(duplicates)} events twice, first {duplicates[:3]}"
    items = events[TABLE]
    assert collections.Counter(phase_of(e).name for e in items) == {p.name: p.writes for p in PHASES}
    wrong = [(phase_of(e).name, e["op"], image, sorted(e[image]))
             for e in items for image in ("before", "after")
             if e[image] is not None and set(e[image]) != {"id", *phase_of(e).event_columns}]
    assert wrong == []


def test_each_agent_published_every_write(outcome):
    """Every write of each table published by every node's agent, the one killed before the ADD included."""
    for table, digests in outcome["published"].items():
        every_write = set().union(*digests.values())
        expected = sum(p.writes for p in PHASES) if table == TABLE else CREATED_ROWS
        assert len(every_write) == expected, table
        assert digests == dict.fromkeys(outcome["nodes"], every_write), table


def test_no_record_went_to_the_errors_topic(outcome):
    assert outcome["errors"] == []


def test_a_table_dropped_while_the_agents_were_down_has_one_drop(outcome):
    """Each agent found the drop at its start (the tables its node had are kept in its state directory) and
    published it; the pipeline wrote one ``DROP`` after the table's ``CREATE``."""
    assert outcome["doomed_changes"] == ["CREATE", "DROP"], outcome["logs"]
