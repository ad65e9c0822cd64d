"""A table created while the agents run, written to at once: no mutation of it is lost.

On the three real Cassandra 5.0 nodes (``real_cassandra``), one ``cassandra-cdc agent`` per node on its
real ``cdc_raw`` and real Kafka (``real_kafka``). ``CREATE TABLE ... WITH cdc = true``, then rows written
at CONSISTENCY ALL right away: every node's agent must publish every row. Once with the schema read
from the node by CQL (reloaded when the node logs the schema change), once with a schema file that gets
the new table only after its first mutations were read (a schema that reaches the agent late): the
agent waits at the first unknown mutation instead of skipping it. Then, with the schema read by CQL,
``DROP TABLE``: every node's agent publishes the drop once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from real_system import (System, drops_by_node, records_by_node, session_at_all, table_id, topic_exists,
                         wait_for)

KEYSPACE = "real_new_table"
ROWS = 200
# Long enough for every agent to meet the new table's first mutations (the nodes sync their commit logs
# every second).
BEFORE_THE_SCHEMA_FILE_CHANGES = 5.0
# IF NOT EXISTS: a worker of the suite that takes this module's second case after running other modules sets
# the module's session up again, on the same cluster.
SCHEMA = [f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
          "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"]


def describe(session: Any) -> str:
    """Every user keyspace as a schema file (table ids included): the cluster is shared with other tests,
    whose tables' mutations are in cdc_raw too, and a schema file that left them out would make the agent
    wait for each (unknown_table_wait_seconds) as for a table just created."""
    session.cluster.refresh_schema_metadata()
    keyspaces = [name for name in session.cluster.metadata.keyspaces if not name.startswith("system")]
    rows = [row for keyspace in keyspaces
            for row in session.execute(f"DESCRIBE KEYSPACE {keyspace} WITH INTERNALS")]
    return "\n\n".join(row.create_statement for row in rows) + "\n"


@pytest.fixture(scope="module")
def session(real_cassandra: Any) -> Iterator[Any]:
    with session_at_all(real_cassandra, SCHEMA) as session:
        yield session


@pytest.mark.parametrize("source", ["cql", "late_schema_file"])
def test_a_table_created_while_the_agents_run_loses_no_row(real_cassandra, real_kafka, session, source,
                                                           tmp_path: Path):
    # The agents of each case read cdc_raw from its start: each case has tables of its own.
    server, table, existing = f"newtable{source.replace('_', '')}", f"created_{source}", f"existing_{source}"
    session.execute(f"CREATE TABLE {KEYSPACE}.{existing} (id int PRIMARY KEY, v text) WITH cdc = true")
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(describe(session))
    system = System(tmp_path, real_cassandra, real_kafka, server, tables=[f"{KEYSPACE}.*"],
                    schema_file=schema_file if source == "late_schema_file" else None)
    raw_topic = f"{server}.raw"
    try:
        system.start_agents()
        session.execute(f"INSERT INTO {KEYSPACE}.{existing} (id, v) VALUES (1, 'before')")
        session.execute(f"CREATE TABLE {KEYSPACE}.{table} (id int PRIMARY KEY, v text) WITH cdc = true")
        for i in range(ROWS):
            session.execute(f"INSERT INTO {KEYSPACE}.{table} (id, v) VALUES (%s, 'at once')", (i,))
        session.execute(f"INSERT INTO {KEYSPACE}.{existing} (id, v) VALUES (2, 'after')")
        if source == "late_schema_file":
            time.sleep(BEFORE_THE_SCHEMA_FILE_CHANGES)
            schema_file.write_text(describe(session))
        created = table_id(session, KEYSPACE, table)
        every_node = {node.address: ROWS for node in real_cassandra.nodes}
        wait_for(lambda: topic_exists(real_kafka.bootstrap_servers, raw_topic)
                 and records_by_node(real_kafka.bootstrap_servers, raw_topic, created) == every_node,
                 f"every node's agent to publish the {ROWS} rows", 120, system.agents)
        around = table_id(session, KEYSPACE, existing)
        assert records_by_node(real_kafka.bootstrap_servers, raw_topic, around) == {
            node.address: 2 for node in real_cassandra.nodes}
        if source == "cql":
            session.execute(f"DROP TABLE {KEYSPACE}.{table}")
            every_node = {node.address: 1 for node in real_cassandra.nodes}
            wait_for(lambda: drops_by_node(real_kafka.bootstrap_servers, server, created) == every_node,
                     "every node's agent to publish the drop", 60, system.agents)
    finally:
        system.stop()
    # (Cassandra's own tables, left out of the schema file, are skipped: not the new one.)
    for agent in system.agents:
        skipped = [line for line in agent.log_path.read_text().splitlines()
                   if "skipped" in line and str(uuid.UUID(bytes=created)) in line]
        assert skipped == []
