"""Kafka as production runs it, failing over under CDC: three KRaft brokers (``KafkaCluster``), every topic
with three replicas and ``min.insync.replicas`` 2, under the agents of the three real Cassandra 5.0 nodes
(``real_cassandra``) and the pipeline, a steady CQL workload at QUORUM throughout.

Each in turn is killed (``kill -9``) while writes go on, then started again: the leader of a raw
partition, the transaction coordinator of the pipeline's producer of the first state partition, and the
controller quorum's leader. Nothing is done to the agents or the pipeline: their idempotent and
transactional producers ride through the leaders' moves. Then the events (read_committed), replayed,
equal ``SELECT *`` at CONSISTENCY ALL, no event twice, every acknowledged write among them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import pytest

from cassandra_cdc.demo.cql_workload import SHORT_TTL, schema_statements
from conftest import require_jvm_artifacts
from real_system import (STEADY_TABLES, SteadyWriter, System, assert_no_event_twice,
                         assert_replays_to_select, consume_events, lag_by_stage, replayed_tables,
                         session_at_all, steps_evented, steps_table, topic_exists, wait_for)

pytestmark = pytest.mark.scenario  # benchmarks/scenarios.py runs it, not make test

KEYSPACE = "kafka_failover"
SERVER = "kafkafailover"
CONVERGE_TIMEOUT = 300.0
DOWN_SECONDS = 10.0  # how long each broker stays down while the writes go on


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import KafkaCluster

    with KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), brokers=3) as cluster:
        yield cluster


def faults(cluster: Any) -> dict[str, Callable[[], Any]]:
    """The brokers to kill, in order, each found when its turn comes."""
    return {"raw partition leader": lambda: cluster.leader(f"{SERVER}.raw", 0),
            "transaction coordinator": lambda: cluster.transaction_coordinator(f"cassandra-cdc.{SERVER}-0"),
            "controller": cluster.active_controller}


def events_written(bootstrap_servers: str) -> bool:
    topic = f"{SERVER}.{KEYSPACE}.steps"
    return topic_exists(bootstrap_servers, topic) and bool(consume_events(bootstrap_servers, [topic])[topic])


@pytest.fixture(scope="module")
def outcome(real_cassandra: Any, kafka_cluster: Any,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    system = System(tmp_path_factory.mktemp("kafka-failover"), real_cassandra, kafka_cluster, SERVER)
    stage = ["running"]
    killed: dict[str, int] = {}
    timings: dict[str, float] = {}
    started = time.monotonic()
    schema = [*schema_statements(KEYSPACE, "5.0", 3), steps_table(KEYSPACE)]
    with session_at_all(real_cassandra, schema) as session, real_cassandra.driver() as writer_driver:
        writer = SteadyWriter(writer_driver.connect(), KEYSPACE, "5.0", lambda: stage[0])
        try:
            system.start_agents()
            writer.start()
            system.start_pipeline()
            # Its first transactions committed: its producers have their transactional ids.
            wait_for(lambda: events_written(kafka_cluster.bootstrap_servers), "the first events", 180,
                     system.children)
            for name, find in faults(kafka_cluster).items():
                broker = find()
                killed[name] = broker.node_id
                stage[0] = f"{name} down"
                broker.kill()
                time.sleep(DOWN_SECONDS)
                stage[0] = f"{name} back"
                broker.start()
                timings[name] = time.monotonic() - started
                time.sleep(5)
            stage[0] = "after"
            time.sleep(3)
            writer.stop()
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            events, tables, differences = replayed_tables(kafka_cluster.bootstrap_servers, session, KEYSPACE,
                                                          SERVER, STEADY_TABLES, CONVERGE_TIMEOUT,
                                                          system.children)
            timings["converged"] = time.monotonic() - started
        finally:
            if writer.is_alive():
                writer.stop()
            system.stop()
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()}, "killed:", killed,
          "steps:", len(writer.acknowledged), "write to event, median / most (s):",
          lag_by_stage(events["steps"]))
    return {"events": events, "differences": differences, "tables": tables, "killed": killed,
            "acknowledged": writer.acknowledged, "logs": system.logs()}


def test_each_broker_was_killed_under_load(outcome):
    assert list(outcome["killed"]) == ["raw partition leader", "transaction coordinator", "controller"]


@pytest.mark.parametrize("table", STEADY_TABLES)
def test_each_tables_events_replay_to_what_select_returns(outcome, table):
    assert_replays_to_select(outcome, table)


def test_no_event_is_read_twice(outcome):
    assert_no_event_twice(outcome["events"])


def test_every_write_acknowledged_while_brokers_failed_has_its_event(outcome):
    acknowledged = outcome["acknowledged"]
    assert {f"{name} down" for name in outcome["killed"]} <= set(acknowledged.values()), acknowledged
    assert steps_evented(outcome["events"]["steps"]) == acknowledged
