"""``fetch_schema``, and the agent's reader of it, on three real Cassandra 5.0 nodes (``real_cassandra``).

A schema change reaches the nodes one after the other, so a read that asks each ``system_schema`` table of
another node can take ``columns`` from a node past a ``DROP`` and ``dropped_columns`` from one before it:
the column is then in neither, and its cells are undecodable ("unknown column"). Each read must be one
node's schema at one moment.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import tuple_factory

from cassandra_cdc.agent.agent_config import CassandraSchemaSource
from cassandra_cdc.agent.tables import ClusterSchemaReader
from cassandra_cdc.schema import fetch_schema

KEYSPACE = "schema_read"
DROPPED = [f"d{i}" for i in range(20)]


def test_a_read_while_columns_are_dropped_has_each_column_as_a_column_or_as_dropped(real_cassandra: Any) -> None:
    """One thread drops the columns one by one while another reads the schema over and over, from every node
    in turn: every read has each column either still a column or already dropped."""
    with real_cassandra.driver() as writer, real_cassandra.driver() as reader:
        ddl = writer.connect()
        ddl.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
                    "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}")
        ddl.execute(f"CREATE TABLE {KEYSPACE}.t (id int PRIMARY KEY, {', '.join(f'{c} text' for c in DROPPED)})")
        assert writer.control_connection.wait_for_schema_agreement(wait_time=60)
        session = reader.connect()
        nodes = [node.address for node in real_cassandra.nodes]
        dropping = threading.Event()
        lost: list[tuple[str, set[str]]] = []
        reads = 0

        def read_while_dropping() -> None:
            nonlocal reads
            while dropping.is_set():
                node = nodes[reads % len(nodes)]
                table = fetch_schema(session, node=node).table(KEYSPACE, "t")
                kept = {c.name for c in table.regular_and_static} | {c.name for c in table.dropped}
                if missing := set(DROPPED) - kept:
                    lost.append((node, missing))
                reads += 1

        dropping.set()
        thread = threading.Thread(target=read_while_dropping)
        thread.start()
        try:
            for column in DROPPED:
                ddl.execute(f"ALTER TABLE {KEYSPACE}.t DROP {column}")
        finally:
            dropping.clear()
            thread.join()
        final = fetch_schema(session).table(KEYSPACE, "t")
    assert lost == []
    assert reads > len(DROPPED)
    assert {c.name for c in final.dropped} == set(DROPPED)
    assert [c.name for c in final.regular_and_static] == []


def test_rows_that_are_neither_dicts_nor_named_tuples_are_refused(real_cassandra: Any) -> None:
    with real_cassandra.driver() as driver:
        session = driver.connect()
        session.get_execution_profile(EXEC_PROFILE_DEFAULT).row_factory = tuple_factory
        with pytest.raises(TypeError, match="dicts or named tuples"):
            fetch_schema(session)


def test_the_agents_reader_reads_the_schema_again_only_once_the_nodes_version_changed(real_cassandra: Any) -> None:
    """The agent reloads on every ``system_schema`` mutation its node logs, several per DDL statement and every
    one still in cdc_raw at its start: a reload at an unchanged schema version costs one query."""
    node = real_cassandra.nodes[1]
    reader = ClusterSchemaReader(CassandraSchemaSource(contact_points=[node.address],
                                                       port=real_cassandra.native_port))
    try:
        first = reader()
        assert reader() is first
        with real_cassandra.driver() as driver:
            driver.connect().execute(f"CREATE KEYSPACE {KEYSPACE}_reader WITH replication = "
                                     "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}")
            assert driver.control_connection.wait_for_schema_agreement(wait_time=60)
        changed = reader()
        assert changed is not first and f"{KEYSPACE}_reader" in changed.keyspaces
        assert reader() is changed
    finally:
        reader.close()


def test_the_agents_reader_says_whether_the_node_beside_it_answered(real_cassandra: Any) -> None:
    """The agent takes a table lost from its schema for dropped only from reads of the node beside it: the
    reader says which node answered. With the first contact point (the node beside) out of the cluster, as
    when it is down, another node answers. (One that times out, on a loaded machine, leaves the read to
    another node too: the node beside is asked up to three times.)"""
    node = real_cassandra.nodes[1]

    def node_beside_answered(contact_points: list[str]) -> bool:
        reader = ClusterSchemaReader(CassandraSchemaSource(contact_points=contact_points,
                                                           port=real_cassandra.native_port))
        try:
            assert reader.node_beside_answered is False  # nothing read yet
            assert "system_schema" in reader().keyspaces
            return reader.node_beside_answered
        finally:
            reader.close()

    assert any(node_beside_answered([node.address]) for _ in range(3))
    assert not node_beside_answered(["127.0.0.9", node.address])


def test_each_change_of_a_table_or_of_a_type_it_uses_defines_it_later(real_cassandra: Any) -> None:
    """What orders two definitions of a table that differ only in options or in a type's fields (no column
    lost): the later of its tables row's and its types rows' write times, which the schema change renews. A
    change of another table leaves it as it is."""
    keyspace = f"{KEYSPACE}_times"
    with real_cassandra.driver() as driver:
        session = driver.connect()

        def defined_at_after(ddl: str) -> int:
            session.execute(ddl)
            assert driver.control_connection.wait_for_schema_agreement(wait_time=60)
            defined_at = fetch_schema(session).table(keyspace, "t").defined_at
            assert defined_at is not None
            return defined_at

        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                        "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}")
        session.execute(f"CREATE TYPE {keyspace}.inner_type (a int)")
        session.execute(f"CREATE TYPE {keyspace}.outer_type (i frozen<inner_type>)")
        session.execute(f"CREATE TABLE {keyspace}.other (id int PRIMARY KEY)")
        created = defined_at_after(f"CREATE TABLE {keyspace}.t (id int PRIMARY KEY, v frozen<outer_type>)")
        assert abs(created / 1e6 - time.time()) < 600
        commented = defined_at_after(f"ALTER TABLE {keyspace}.t WITH comment = 'later'")
        assert commented > created
        assert defined_at_after(f"ALTER TABLE {keyspace}.other ADD x int") == commented
        assert defined_at_after(f"ALTER TYPE {keyspace}.inner_type ADD b text") > commented
