"""A rolling upgrade from Cassandra 4.1 to 5.0 while CDC runs, as an operator does it (docs/operations.md).

Three real Cassandra 4.1 nodes (RF 3) under a steady CQL workload at QUORUM, an agent beside each node and
the pipeline running throughout. Each node in turn is drained (``nodetool drain``), stopped and started as
5.0 on the same data, commit log and cdc_raw directories with ``storage_compatibility_mode: CASSANDRA_4``;
then the two rolling restarts 5.0 asks for to leave 4.x's formats: ``UPGRADING`` (from which on a node
writes commit log version 8), then ``NONE``. The agents are never stopped: each publishes segments of
commit log versions 7 and 8 of its node. Once writing has stopped and the TTLs have passed, each table's
events (read_committed), replayed, equal ``SELECT *`` at CONSISTENCY ALL with no event twice, and every
write the cluster acknowledged during the upgrade is among them.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Iterator

import pytest

from cassandra_cdc.demo.cql_workload import SHORT_TTL, schema_statements
from cassandra_cdc.kafka.raw_records import RawRecord, is_truncation
from conftest import require_jvm_artifacts
from real_system import (STEADY_TABLES, SteadyWriter, System, assert_no_event_twice,
                         assert_replays_to_select, lag_by_stage, messages, replayed_tables, session_at_all,
                         steps_evented, steps_table)

pytestmark = pytest.mark.scenario  # benchmarks/scenarios.py runs it, not make test

KEYSPACE = "upgrade"
SERVER = "upgrade"
FROM_VERSION = "4.1"
# The passes of the rolling upgrade: each node in turn restarted as (version, storage_compatibility_mode).
PASSES = [("5.0", "CASSANDRA_4"), ("5.0", "UPGRADING"), ("5.0", "NONE")]
CONVERGE_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def cluster_4_1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from cassandra_cdc.localcluster import CassandraCluster
    from cassandra_cdc.localcluster.artifacts import check_cassandra

    require_jvm_artifacts(lambda: check_cassandra(FROM_VERSION), lambda: check_cassandra("5.0"))
    with CassandraCluster(tmp_path_factory.mktemp("upgrade"), nodes=3, version=FROM_VERSION) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def outcome(cluster_4_1: Any, real_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    system = System(tmp_path_factory.mktemp("upgrade-system"), cluster_4_1, real_kafka, SERVER)
    current = ["4.1"]
    timings: dict[str, float] = {}
    started = time.monotonic()
    schema = [*schema_statements(KEYSPACE, FROM_VERSION, 3), steps_table(KEYSPACE)]
    with session_at_all(cluster_4_1, schema) as session, cluster_4_1.driver() as writer_driver:
        writer = SteadyWriter(writer_driver.connect(), KEYSPACE, FROM_VERSION, lambda: current[0])
        try:
            system.start_agents()
            writer.start()
            system.start_pipeline()
            timings["running"] = time.monotonic() - started
            for version, mode in PASSES:
                current[0] = f"{version} {mode}"
                for node in list(cluster_4_1.nodes):
                    node.nodetool("drain")
                    node.stop()
                    cluster_4_1.upgrade(node, version, {"storage_compatibility_mode": mode})
                    cluster_4_1.start()
                    assert writer.is_alive(), writer.error
                timings[current[0]] = time.monotonic() - started
            current[0] = "after"
            time.sleep(5)  # a few steps written on the upgraded cluster
            writer.stop()
            timings["written"] = time.monotonic() - started
            session.cluster.refresh_nodes()
            versions = {host.address: host.release_version for host in session.cluster.metadata.all_hosts()}
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            bootstrap_servers = real_kafka.bootstrap_servers
            events, tables, differences = replayed_tables(bootstrap_servers, session, KEYSPACE, SERVER,
                                                          STEADY_TABLES, CONVERGE_TIMEOUT, system.children)
            timings["converged"] = time.monotonic() - started
            raw = [RawRecord.decode(value) for _, _, value in messages(bootstrap_servers, f"{SERVER}.raw")
                   if not is_truncation(value)]
        finally:
            if writer.is_alive():
                writer.stop()
            system.stop()
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()}, "steps:", len(writer.acknowledged),
          "retried writes:", writer.retrying.retries, "write to event, median / most (s):",
          lag_by_stage(events["steps"]))
    return {"events": events, "differences": differences, "tables": tables, "versions": versions,
            "acknowledged": writer.acknowledged, "nodes": [node.address for node in cluster_4_1.nodes],
            "node_versions": {node.address: node.version for node in cluster_4_1.nodes},
            "commitlog_versions": collections.Counter((r.node_id, r.commitlog_version) for r in raw),
            "logs": system.logs()}


def test_every_node_runs_5_0_at_the_end(outcome):
    """As each node tells the driver (its ``release_version``)."""
    assert set(outcome["node_versions"].values()) == {"5.0"}
    assert {address: version.split(".")[:2] for address, version in outcome["versions"].items()} == \
        {address: ["5", "0"] for address in outcome["nodes"]}


def test_each_agent_published_commit_log_versions_7_and_8(outcome):
    """Segments of 4.1 and of 5.0 in its compatibility mode (version 7), then of 5.0's own (8)."""
    seen = outcome["commitlog_versions"]
    assert {(node, version) for node in outcome["nodes"] for version in (7, 8)} <= set(seen), seen


@pytest.mark.parametrize("table", STEADY_TABLES)
def test_each_tables_events_replay_to_what_select_returns(outcome, table):
    assert_replays_to_select(outcome, table)


def test_no_event_is_read_twice(outcome):
    assert_no_event_twice(outcome["events"])


def test_every_write_acknowledged_during_the_upgrade_has_its_event(outcome):
    """The ``steps`` row each step of the workload wrote last: written in every pass, each one's event."""
    acknowledged = outcome["acknowledged"]
    assert set(acknowledged.values()) >= {"4.1", *(f"{v} {m}" for v, m in PASSES), "after"}, acknowledged
    assert steps_evented(outcome["events"]["steps"]) == acknowledged
