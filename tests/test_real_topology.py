"""Cassandra's topology changing under CDC, as an operator changes it (docs/operations.md): nodes join, leave,
are removed while dead and are replaced, a repair runs, while a steady CQL workload writes at QUORUM and the
agents and the pipeline run throughout.

Three real Cassandra 5.0 nodes (RF 3), then in turn: a 4th node bootstraps (its agent started before it, so
that the data streamed to it, which Cassandra writes through its commit log for CDC tables, is published
too); node 3 down for a while (no hints), started again and repaired (``nodetool repair -full``); node 2
killed and removed (``nodetool removenode``); a 5th node bootstraps; node 3 decommissioned (its agent
stopped once ``agent status --until-drained`` says it published everything); node 4 killed and replaced
by a 6th (``replace_address_first_boot``). Three nodes are left, RF 3. Then each
table's events (read_committed), replayed, equal ``SELECT *`` at CONSISTENCY ALL with no event twice, every
acknowledged write has its event, and no streamed or repaired copy of a row made an event of its own: each
row of ``steps``, inserted once, has exactly one event. Printed per stage: its seconds, the raw records
published (against the steady stage's rate) and the write → event lag.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from cassandra_cdc.demo.cql_workload import SHORT_TTL, schema_statements
from cassandra_cdc.kafka.raw_records import RawRecord, is_truncation
from conftest import require_jvm_artifacts
from real_system import (STEADY_TABLES, SteadyWriter, System, assert_no_event_twice,
                         assert_replays_to_select, lag_by_stage, messages, records_on, replayed_tables,
                         session_at_all, steps_evented, steps_evented_more_than_once, steps_table)

# benchmarks/scenarios.py runs it, not make test; its stages take longer than a test of the suite may.
pytestmark = [pytest.mark.scenario, pytest.mark.timeout(1800)]

KEYSPACE = "topology"
SERVER = "topology"
CONVERGE_TIMEOUT = 300.0
STEADY_SECONDS = 20.0  # the writes before and after each change
DRAIN_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from cassandra_cdc.localcluster import CassandraCluster
    from cassandra_cdc.localcluster.artifacts import check_cassandra

    require_jvm_artifacts(lambda: check_cassandra("5.0"))
    # Without hints, a node that was down lacks the writes it missed until a repair streams them.
    with CassandraCluster(tmp_path_factory.mktemp("topology"), nodes=3,
                          config={"hinted_handoff_enabled": False}) as cluster:
        yield cluster


class Stages:
    """The stages of the scenario: the one the writer is in (``current``), and per stage ended its seconds
    and the raw records published meanwhile."""

    def __init__(self, bootstrap_servers: str, first: str) -> None:
        self._bootstrap_servers = bootstrap_servers
        self.current = first
        self.figures: dict[str, dict[str, float]] = {}
        self._started = time.monotonic()
        self._records = records_on(bootstrap_servers, f"{SERVER}.raw")

    def next(self, name: str) -> None:
        now, records = time.monotonic(), records_on(self._bootstrap_servers, f"{SERVER}.raw")
        self.figures[self.current] = {"seconds": round(now - self._started, 1),
                                      "raw records": records - self._records}
        self.current, self._started, self._records = name, now, records


def drain_agent(system: System, node: Any) -> float:
    """Once ``node`` has left and stopped: wait until its agent published every segment of it
    (``agent status --until-drained``), then stop the agent. Returns the seconds the wait took."""
    started = time.monotonic()
    command = [sys.executable, "-m", "cassandra_cdc", "agent", "status", "--config",
               str(system.agent_config(node)), "--until-drained", "--timeout", str(DRAIN_TIMEOUT)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=DRAIN_TIMEOUT + 60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    agent = next(agent for agent in system.agents if agent.name == f"agent {node.address}")
    assert agent.stop() == 0, agent.log_tail(20)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def outcome(cluster: Any, real_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    system = System(tmp_path_factory.mktemp("topology-system"), cluster, real_kafka, SERVER)
    schema = [*schema_statements(KEYSPACE, "5.0", 3), steps_table(KEYSPACE)]
    changes: dict[str, Any] = {}
    joined_at: dict[str, int] = {}  # node -> when it started to join (microseconds, as write times)
    with session_at_all(cluster, schema) as session, cluster.driver() as writer_driver:
        writer = SteadyWriter(writer_driver.connect(), KEYSPACE, "5.0", lambda: stages.current)
        try:
            system.start_agents()
            system.start_pipeline()
            stages = Stages(real_kafka.bootstrap_servers, "steady")
            writer.start()
            time.sleep(STEADY_SECONDS)

            def bootstrap(name: str) -> Any:
                stages.next(name)
                joining = cluster.new_node()
                joined_at[joining.address] = time.time_ns() // 1000
                system.add_agent(joining, cluster.nodes)
                cluster.add(joining)
                return joining

            fourth = bootstrap("a node joins")
            stages.next("after the join")
            time.sleep(STEADY_SECONDS)
            stages.next("a node down, then repaired")
            missing = cluster.nodes[2]
            missing.nodetool("drain")
            missing.stop()
            time.sleep(STEADY_SECONDS)
            repaired = (missing.address, time.time_ns() // 1000)
            cluster.start()
            missing.nodetool("repair", "-full", KEYSPACE, timeout=600)
            stages.next("after the repair")
            time.sleep(STEADY_SECONDS)

            stages.next("a dead node removed")
            second = cluster.nodes[1]
            second.kill()
            cluster.remove(second)
            changes["removed"] = second.address
            stages.next("after the removal")
            time.sleep(STEADY_SECONDS)
            # The removed node's agent publishes what its commit log made durable, then is stopped: the rest
            # of its writes are the other replicas' too.
            next(agent for agent in system.agents if agent.name == f"agent {second.address}").stop()

            bootstrap("another node joins")
            stages.next("a node decommissioned")
            third = cluster.nodes[1]
            cluster.decommission(third)
            changes["decommissioned"] = third.address
            changes["drained in (s)"] = round(drain_agent(system, third), 1)
            stages.next("after the decommission")
            time.sleep(STEADY_SECONDS)

            stages.next("a dead node replaced")
            fourth.kill()
            replacement = cluster.new_node(replacing=fourth)
            joined_at[replacement.address] = time.time_ns() // 1000
            system.add_agent(replacement, cluster.nodes)
            cluster.add(replacement)
            next(agent for agent in system.agents if agent.name == f"agent {fourth.address}").stop()
            changes["replaced"] = f"{fourth.address} by {replacement.address}"
            stages.next("after the replacement")
            time.sleep(STEADY_SECONDS)
            stages.next("stopped")
            writer.stop()
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            events, tables, differences = replayed_tables(real_kafka.bootstrap_servers, session, KEYSPACE,
                                                          SERVER, STEADY_TABLES, CONVERGE_TIMEOUT,
                                                          [agent for agent in system.children
                                                           if agent.exit_code is None])
            raw = [RawRecord.decode(value) for _, _, value in messages(real_kafka.bootstrap_servers,
                                                                       f"{SERVER}.raw")
                   if not is_truncation(value)]
        finally:
            if writer.is_alive():
                writer.stop()
            system.stop()
    # What the nodes that joined published of writes made before they started to join: what was streamed to
    # them (or repaired), which the other nodes' agents had published when it was written.
    streamed = collections.Counter(record.node_id for record in raw if record.node_id in joined_at
                                   and record.write_time < joined_at[record.node_id])
    # What the repaired node published, from the segments it wrote after its restart (a segment's id is at
    # least the time of the node's start, in ms), of writes older than its restart: the repair streamed them
    # (whole partitions: their oldest write may be older than its time down).
    node, restarted_at = repaired
    changes["repaired"] = sum(1 for record in raw if record.node_id == node
                              and record.segment_id >= restarted_at // 1000
                              and record.write_time < restarted_at)
    print("nodes:", [node.address for node in cluster.nodes], changes, "raw records of writes older than "
          f"the node that published them: {dict(streamed)} of {len(raw)} in all")
    for stage, figures in stages.figures.items():
        print(f"{stage}: {figures}")
    print("steps:", len(writer.acknowledged), "retried writes:", writer.retrying.retries,
          "write to event, median / most (s):", lag_by_stage(events["steps"]))
    return {"events": events, "differences": differences, "tables": tables, "changes": changes,
            "acknowledged": writer.acknowledged, "stages": stages.figures, "streamed": streamed,
            "joined": list(joined_at), "logs": system.logs()}


@pytest.mark.parametrize("table", STEADY_TABLES)
def test_each_tables_events_replay_to_what_select_returns(outcome, table):
    assert_replays_to_select(outcome, table)


def test_no_event_is_read_twice(outcome):
    assert_no_event_twice(outcome["events"])


def test_every_write_acknowledged_while_the_cluster_changed_has_its_event(outcome):
    acknowledged = outcome["acknowledged"]
    assert set(outcome["stages"]) <= set(acknowledged.values()) | {"stopped"}, acknowledged
    assert steps_evented(outcome["events"]["steps"]) == acknowledged


def test_the_nodes_that_joined_published_the_data_streamed_to_them(outcome):
    """Cassandra writes what is streamed to a CDC table through the commit log (``cdc_on_repair_enabled``,
    its default): each node that joined, replacement included, published writes older than itself."""
    assert set(outcome["streamed"]) == set(outcome["joined"]), outcome["streamed"]


def test_the_repaired_node_published_the_writes_it_had_missed(outcome):
    """A node down while writes went on (no hints) gets them from ``nodetool repair``, through its commit
    log: its agent published, after the restart, writes older than it."""
    assert outcome["changes"]["repaired"] > 0


def test_no_streamed_or_repaired_copy_of_a_row_makes_an_event(outcome):
    """Each row of ``steps`` is inserted once and never changed: one event each, whatever streamed it."""
    assert steps_evented_more_than_once(outcome["events"]["steps"]) == {}
