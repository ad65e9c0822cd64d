"""CDC of a cluster of two data centers (docs/operations.md): four real Cassandra 5.0 nodes, two in ``dc1``
and two in ``dc2`` (``GossipingPropertyFileSnitch``), a keyspace replicated twice in each
(``NetworkTopologyStrategy``), a steady CQL workload written at LOCAL_QUORUM from each data center at once.

Run three times on the cluster, each time into a keyspace and a logical cluster of its own: with an agent
beside every node (each write reaches Kafka four times); with agents in ``dc1`` only (twice: the option that
halves the raw records); and with agents everywhere while a third data center is added as Cassandra's
procedure does it (a node of ``dc3`` joins without streaming, its agent started with it, the keyspace
replicated there, ``nodetool rebuild`` of it from ``dc1``). Each time each table's events (read_committed),
replayed, equal ``SELECT *`` at CONSISTENCY ALL, with no event twice, every acknowledged write of either data
center has its event, and each row of ``steps`` (inserted once) has exactly one, whatever the number of
copies. Printed: the raw records per write by node, the write → event lag of the writes of each data center.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
from cassandra import ConsistencyLevel

from cassandra_cdc.demo.cql_workload import SHORT_TTL, replication, schema_statements
from conftest import require_jvm_artifacts
from real_system import (STEADY_TABLES, SteadyWriter, System, assert_no_event_twice,
                         assert_replays_to_select, digests_by_node, lag_by_stage, replayed_tables,
                         session_at_all, steps_evented, steps_evented_more_than_once, steps_table, table_id)

pytestmark = pytest.mark.scenario  # benchmarks/scenarios.py runs it, not make test

CONVERGE_TIMEOUT = 300.0
WRITING_SECONDS = 40.0
# The second data center's writer numbers its steps from here: the two never write the same step.
SECOND_WRITER_FIRST_STEP = 1_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from cassandra_cdc.localcluster import CassandraCluster
    from cassandra_cdc.localcluster.artifacts import check_cassandra

    require_jvm_artifacts(lambda: check_cassandra("5.0"))
    with CassandraCluster(tmp_path_factory.mktemp("two-datacenters"), nodes=4, datacenters=2) as cluster:
        yield cluster


def run(cluster: Any, kafka: Any, root: Any, name: str, agents_everywhere: bool,
        new_datacenter: str | None = None) -> dict[str, Any]:
    """Write from both data centers into keyspace ``name`` with agents beside every node, or beside the nodes
    of ``dc1`` only; the events of logical cluster ``name`` against ``SELECT *``. With ``new_datacenter``, a
    node of that new data center joins meanwhile, its agent with it, the keyspace is replicated there and
    the node rebuilt from ``dc1``."""
    nodes = [node for node in cluster.nodes if agents_everywhere or node.datacenter == "dc1"]
    system = System(root, cluster, kafka, name, tables=[f"{name}.*"], nodes=nodes)
    replicas = {datacenter: 2 for datacenter in cluster.datacenters}
    schema = [*schema_statements(name, "5.0", replicas), steps_table(name)]
    with (session_at_all(cluster, schema) as session,
          cluster.driver(local_datacenter="dc1") as first, cluster.driver(local_datacenter="dc2") as second):
        writers = [SteadyWriter(first.connect(), name, "5.0", lambda: "written in dc1",
                                consistency=ConsistencyLevel.LOCAL_QUORUM),
                   SteadyWriter(second.connect(), name, "5.0", lambda: "written in dc2",
                                first_step=SECOND_WRITER_FIRST_STEP,
                                consistency=ConsistencyLevel.LOCAL_QUORUM)]
        try:
            system.start_agents()
            system.start_pipeline()
            for writer in writers:
                writer.start()
            time.sleep(WRITING_SECONDS / 2)
            if new_datacenter is not None:
                node = cluster.new_node(datacenter=new_datacenter)
                system.add_agent(node, cluster.nodes)
                cluster.add(node)
                nodes.append(node)
                replicas[new_datacenter] = 1
                session.execute(f"ALTER KEYSPACE {name} WITH replication = {replication(replicas)}")
                node.nodetool("rebuild", "--keyspace", name, "--", "dc1", timeout=600)
            time.sleep(WRITING_SECONDS / 2)
            for writer in writers:
                writer.stop()
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            events, tables, differences = replayed_tables(kafka.bootstrap_servers, session, name, name,
                                                          STEADY_TABLES, CONVERGE_TIMEOUT, system.children)
            steps = table_id(session, name, "steps")
        finally:
            for writer in writers:
                if writer.is_alive():
                    writer.stop()
            system.stop()
    acknowledged = {**writers[0].acknowledged, **writers[1].acknowledged}
    copies = {node: len(digests) for node, digests in
              digests_by_node(kafka.bootstrap_servers, f"{name}.raw", steps).items()}
    print(f"{name}: agents beside {[node.address for node in nodes]}; steps written {len(acknowledged)}, "
          f"published by node {copies}; write to event, median / most (s): {lag_by_stage(events['steps'])}")
    return {"events": events, "differences": differences, "tables": tables, "acknowledged": acknowledged,
            "copies": copies, "agents": [node.address for node in nodes], "logs": system.logs()}


# Each run has a keyspace and a logical cluster (topics, checkpoint) of its own; the last adds a data center.
RUNS = {"agents in both": ("twodc", True, None), "agents in dc1": ("onedc", False, None),
        "a data center added": ("newdc", True, "dc3")}


@pytest.fixture(scope="module", params=list(RUNS))
def outcome(request: pytest.FixtureRequest, cluster: Any, real_kafka: Any,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    name, agents_everywhere, new_datacenter = RUNS[request.param]
    return run(cluster, real_kafka, tmp_path_factory.mktemp(name), name, agents_everywhere, new_datacenter)


@pytest.mark.parametrize("table", STEADY_TABLES)
def test_each_tables_events_replay_to_what_select_returns(outcome, table):
    assert_replays_to_select(outcome, table)


def test_no_event_is_read_twice(outcome):
    assert_no_event_twice(outcome["events"])


def test_every_write_acknowledged_in_either_datacenter_has_one_event(outcome):
    acknowledged = outcome["acknowledged"]
    assert set(acknowledged.values()) == {"written in dc1", "written in dc2"}
    assert steps_evented(outcome["events"]["steps"]) == acknowledged
    assert steps_evented_more_than_once(outcome["events"]["steps"]) == {}


def test_each_agent_published_the_writes_of_both_datacenters(outcome):
    """Its node holds a replica of every row: each agent published every step, whichever data center it
    was written in; that of a new data center's node those written before it joined too (the rebuild
    streams through its commit log)."""
    assert set(outcome["copies"]) == set(outcome["agents"])
    copies = outcome["copies"]
    assert all(count >= len(outcome["acknowledged"]) for count in copies.values()), copies
