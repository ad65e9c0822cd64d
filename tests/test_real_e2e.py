"""The whole system on the real thing: real Cassandra nodes of each version, three of 5.0 (RF=3), one of 4.1
and one of 4.0 (on Java 11; the ``real_cassandra`` fixtures), one ``cassandra-cdc agent`` process beside each
node on its real ``cdc_raw`` (schema read from the node by CQL), the ``cassandra-cdc pipeline`` process
(local[2]) on the real Kafka broker (``real_kafka``).

A CQL workload at CONSISTENCY ALL (cells, rows, partitions, ranges, TTLs, out-of-order timestamps,
statics, collections, nested collections, user types, tuples, counters, batches, LWT, a TRUNCATE,
ALTER TABLE, ALTER TYPE, a table created while running, a table without CDC, many types: vectors on 5.0),
written partly while an agent restarts (SIGTERM) and while the pipeline restarts (kill -9). A TRUNCATE
before the agents start precedes them: it is not published. Then, once the TTLs have passed, each table's
events (read_committed), replayed, must equal ``SELECT *`` at CONSISTENCY ALL, with no event twice.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from cassandra_cdc.demo.cql_workload import CDC_TABLES as WORKLOAD_CDC_TABLES
from cassandra_cdc.demo.cql_workload import SHORT_TTL, Workload, late_table_statement, schema_statements
from conftest import REAL_CLUSTERS
from real_system import (System, assert_no_event_twice, assert_replays_to_select, consume_events,
                         replayed_tables, session_at_all, table_id, topic_exists, truncations_by_node,
                         wait_for)

KEYSPACE = "real_e2e"
SERVER = "reale2e"
CDC_TABLES = [*WORKLOAD_CDC_TABLES, "late"]
CONVERGE_TIMEOUT = 300.0  # seconds for the events to match the tables once writing has ended


@pytest.fixture(scope="module", params=list(REAL_CLUSTERS))
def outcome(request: pytest.FixtureRequest, real_kafka: Any,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the system through the workload and restarts on the cluster of a Cassandra version; the events per
    topic and the tables' rows."""
    version = request.param
    real_cassandra = request.getfixturevalue(REAL_CLUSTERS[version])
    started = time.monotonic()
    timings: dict[str, float] = {}
    server = f"{SERVER}{version.replace('.', '')}"
    system = System(tmp_path_factory.mktemp("real-e2e"), real_cassandra, real_kafka, server)
    replicas = len(real_cassandra.nodes)
    with session_at_all(real_cassandra, schema_statements(KEYSPACE, version, replicas)) as session:
        write = Workload(session, KEYSPACE, version)
        try:
            write(f"TRUNCATE {KEYSPACE}.collections", timeout=120)  # before the agents: not theirs to publish
            system.start_agents()
            write.rows_table(0, 6)
            system.start_pipeline()
            timings["started"] = time.monotonic() - started
            write.out_of_order(50)
            write.collections(0, 6)
            write.nested(0, 6)
            write.counters(0, 4)
            write.types(0, 6)
            write.batches_and_lwt(200)
            write.others(0, 4)
            write.truncate_collections(reinserted=2)
            # An agent stopped cleanly (SIGTERM) while writes go on, then started again.
            agent = system.agents[0]
            assert agent.stop(signal.SIGTERM) == 0, agent.log_tail(30)
            write.rows_table(300, 3)
            write.collections(300, 3)
            agent.start()
            # The pipeline killed (-9, Spark's JVM with it) while writes go on, then started again.
            system.pipeline.kill()
            write.rows_table(400, 3)
            write.counters(400, 2)
            system.pipeline.start()
            # Schema changes while running.
            session.execute(f"ALTER TABLE {KEYSPACE}.rows ADD added int")
            session.execute(f"ALTER TABLE {KEYSPACE}.rows DROP gone")
            session.execute(f"ALTER TYPE {KEYSPACE}.address ADD zip text")  # of collections.home, frozen_home
            session.execute(late_table_statement(KEYSPACE))
            assert session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)
            write(f"UPDATE {KEYSPACE}.rows SET added = 7 WHERE pk = 3 AND ck = 0")
            write(f"UPDATE {KEYSPACE}.collections SET home = {{street: 'new', number: 9, zip: '75001'}}, "
                  f"frozen_home = {{street: 'new', number: 9, zip: '75002'}} WHERE id = 600")
            write(f"UPDATE {KEYSPACE}.collections SET home.zip = '75003' WHERE id = 1")
            write(f"INSERT INTO {KEYSPACE}.rows (pk, ck, v, added) VALUES (500, 0, 'after alter', 8)")
            write.late(0, 5)
            write.types(100, 2)
            wait_for(lambda: system.pipeline.ready, "the restarted pipeline", 180, system.children)
            timings["written"] = time.monotonic() - started
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            events, tables, differences = replayed_tables(
                real_kafka.bootstrap_servers, session, KEYSPACE, server, CDC_TABLES, CONVERGE_TIMEOUT, system.children)
            timings["converged"] = time.monotonic() - started
            plain = f"{server}.{KEYSPACE}.plain"
            plain_exists = topic_exists(real_kafka.bootstrap_servers, plain)
            events["plain"] = consume_events(real_kafka.bootstrap_servers, [plain])[plain]
            truncations = truncations_by_node(real_kafka.bootstrap_servers, f"{server}.raw",
                                              table_id(session, KEYSPACE, "collections"))
        finally:
            system.stop()
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
    return {"events": events, "differences": differences,
            "tables": tables, "plain_topic": plain_exists, "truncation_records": truncations,
            "nodes": [node.address for node in real_cassandra.nodes], "logs": system.logs()}


@pytest.mark.parametrize("table", CDC_TABLES)
def test_each_tables_events_replay_to_what_select_returns(outcome, table):
    """Writes made while an agent was stopped and while the pipeline was down are among the rows."""
    assert_replays_to_select(outcome, table)


def test_no_event_is_read_twice(outcome):
    assert_no_event_twice(outcome["events"])


def test_a_table_without_cdc_has_no_topic(outcome):
    assert not outcome["plain_topic"]
    assert outcome["events"]["plain"] == []


def test_each_agent_publishes_the_truncation_once_to_every_raw_partition(outcome):
    """The TRUNCATE while running: one truncation record per node and raw partition (3), the restarted agent's
    included; the one before the agents started, none. Its events: one ``t``."""
    assert outcome["truncation_records"] == {(node, partition): 1 for node in outcome["nodes"]
                                             for partition in range(3)}, outcome["logs"]
    assert [e["op"] for e in outcome["events"]["collections"]].count("t") == 1
