"""A real Cassandra 5.0 node whose cdc_raw reaches cdc_total_space (``cdc_block_writes: true``, the default).

One node of its own (the shared ``real_cassandra`` keeps its settings), with a cdc_total_space of eight commit
log segments, on the real Kafka broker (``real_kafka``). The node rejects writes to CDC tables once cdc_raw
plus a new segment would exceed cdc_total_space: the client gets a ``WriteFailure`` and the node logs
"Rejecting mutation ... Free up space in <cdc_raw>".

- An agent that publishes but keeps the segments (``cleanup.mode: keep``, as a stand-in for one that cannot
  keep up) warns before the node rejects a write, with the headroom as a gauge, from the settings it read from
  the node.
- Writes go on, the agent stopped, until the node rejects them. Then the agent starts: it publishes the full
  segments and deletes them, the node (which looks at cdc_raw again every ``cdc_free_space_check_interval``)
  accepts writes again, and the raw records published are exactly the writes the node accepted, the rejected
  ones absent.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from cassandra import WriteFailure

from cassandra_cdc.schema import fetch_schema
from cassandra_cdc.simulator.broker import free_port
from conftest import require_jvm_artifacts
from real_system import System, agent_metrics, create_single_replica_table, inserted_ids, table_id, wait_for

KEYSPACE = "cdc_full"
TABLE = "filled"
SERVER = "cdcfull"
SEGMENT_MIB = 1
# An idle node has two segments in cdc_raw (the one it writes and a spare it made ready): four more fit.
TOTAL_SPACE_MIB = 8 * SEGMENT_MIB
VALUE = "v" * 1000  # a thousand rows fill a segment
WRITES_AFTER_THE_DRAIN = 50


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real node with a small cdc_total_space, its agent not started; rejected writes are re-checked
    against cdc_raw's size every 250 ms (cdc_free_space_check_interval, set to Cassandra's default)."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import CassandraCluster

    config = {"cdc_total_space": f"{TOTAL_SPACE_MIB}MiB", "commitlog_segment_size": f"{SEGMENT_MIB}MiB",
              "cdc_free_space_check_interval": "250ms"}
    directory = tmp_path_factory.mktemp("cdc-full")
    with CassandraCluster(directory, nodes=1, heap="256m", config=config) as cluster:
        yield cluster


def accepted(session: Any, insert: Any, row_id: int) -> bool:
    """Whether the node accepts a write of row ``row_id`` to a CDC table."""
    try:
        session.execute(insert, (row_id, VALUE))
    except WriteFailure:
        return False
    return True


def test_the_agent_warns_before_the_node_rejects_writes(node: Any, real_kafka: Any, tmp_path: Path) -> None:
    """cdc_raw fills while the agent runs (it keeps the segments it published): the agent, which read
    cdc_total_space and the segment size from the node, warns one segment before the node rejects writes (at
    cdc_total_space minus one segment) whatever space_warning_percent says, and its headroom gauge says how
    far that is."""
    port = free_port()
    system = System(tmp_path, node, real_kafka, f"{SERVER}warn", tables=[f"{KEYSPACE}_warn.*"],
                    agent_settings={"cleanup": {"mode": "keep"},
                                    "metrics": {"host": "127.0.0.1", "port": port},
                                    "space_warning_percent": 100})
    agent = system.agents[0]
    cdc_raw = node.nodes[0].cdc_raw_dir
    warning = ("the node rejects writes to CDC tables once it holds 7 MiB (cdc_total_space minus one 1 MiB "
               "segment)")
    headroom_at_warning = None
    with node.driver() as driver:
        session = driver.connect()
        insert = create_single_replica_table(session, f"{KEYSPACE}_warn", TABLE)
        try:
            system.start_agents()
            log = agent.log_path.read_text()
            assert (f"CDC settings on node {node.nodes[0].address}: cdc_total_space {TOTAL_SPACE_MIB} MiB, "
                    f"commitlog_segment_size {SEGMENT_MIB} MiB, cdc_block_writes true") in log, log
            assert warning not in log
            row_id, deadline = 0, time.monotonic() + 120
            while True:  # about a segment every two seconds: the agent looks at cdc_raw every second
                assert time.monotonic() < deadline, "the node never rejected a write"
                try:
                    for _ in range(50):
                        session.execute(insert, (row_id, VALUE))
                        row_id += 1
                except WriteFailure:
                    break
                if headroom_at_warning is None and warning in agent.log_path.read_text():
                    headroom_at_warning = agent_metrics(port)["cassandra_cdc_agent_cdc_raw_headroom_bytes"]
                time.sleep(0.1)
            assert headroom_at_warning is not None, "the node rejected a write before the agent warned"
            assert 0 < headroom_at_warning <= SEGMENT_MIB * 2**20
            wait_for(lambda: agent_metrics(port)["cassandra_cdc_agent_cdc_raw_headroom_bytes"] <= 0,
                     "no headroom left in the gauge", 10, system.agents)
        finally:
            system.stop()
        # published, and kept for this test alone: room for the next test
        for path in list(cdc_raw.iterdir()):
            path.unlink()
        wait_for(lambda: accepted(session, insert, row_id), "the node to accept writes again", 30, [])
    assert (f"Rejecting mutation to keyspace {KEYSPACE}_warn" in node.nodes[0].system_log.read_text())


def test_a_full_cdc_raw_is_drained_by_the_agent_and_the_node_accepts_writes_again(
        node: Any, real_kafka: Any, tmp_path: Path) -> None:
    system = System(tmp_path, node, real_kafka, SERVER, tables=[f"{KEYSPACE}.*"])
    agent = system.agents[0]
    accepted, rejected = [], []
    with node.driver() as driver:
        session = driver.connect()
        insert = create_single_replica_table(session, KEYSPACE, TABLE)

        def write(row_id: int) -> bool:
            """Whether the node accepted the row (a timeout, which would leave it unknown, fails the test)."""
            try:
                session.execute(insert, (row_id, VALUE))
            except WriteFailure:
                rejected.append(row_id)
                return False
            accepted.append(row_id)
            return True

        next_id = iter(range(1_000_000)).__next__
        deadline = time.monotonic() + 60
        while write(next_id()):
            assert time.monotonic() < deadline, "the node never rejected a write"
        assert len(accepted) * len(VALUE) > SEGMENT_MIB * 2**20, "rejected before the first segment was full"
        assert not any(write(next_id()) for _ in range(5)), "a full cdc_raw accepted a write again"
        log = node.nodes[0].system_log.read_text()
        assert (f"Rejecting mutation to keyspace {KEYSPACE}. Free up space in {node.nodes[0].cdc_raw_dir}"
                in log)
        full = sorted(path.name for path in node.nodes[0].cdc_raw_dir.glob("*.log"))
        try:
            system.start_agents()
            wait_for(lambda: write(next_id()), "the node to accept writes again", 60, system.agents)
            for _ in range(WRITES_AFTER_THE_DRAIN):
                assert write(next_id()), "a write rejected once the node accepted writes again"
            schema = fetch_schema(session)
            table = table_id(session, KEYSPACE, TABLE)

            def published_ids() -> collections.Counter[int]:
                return inserted_ids(real_kafka.bootstrap_servers, f"{SERVER}.raw", table, schema, VALUE)
            wait_for(lambda: sum(published_ids().values()) >= len(accepted),
                     f"the {len(accepted)} accepted rows on the raw topic", 60, system.agents)
            published = published_ids()
        finally:
            system.stop()
    assert set(published) == set(accepted)
    assert set(published).isdisjoint(rejected)
    assert [row_id for row_id, copies in published.items() if copies > 1] == []
    remaining = {path.name for path in node.nodes[0].cdc_raw_dir.glob("*.log")}
    assert remaining.isdisjoint(full[:-1]), "a completed full segment left in cdc_raw"
    lines = agent.log_path.read_text().splitlines()
    warned = [i for i, line in enumerate(lines) if f"of cdc_total_space ({TOTAL_SPACE_MIB} MiB): the node "
              "rejects writes to CDC tables" in line]
    back_under = [i for i, line in enumerate(lines) if "cdc_raw back under" in line]
    assert warned and back_under and warned[0] < back_under[-1], "\n".join(lines[-30:])
