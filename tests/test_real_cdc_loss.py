"""A real Cassandra 5.0 node with ``cdc_block_writes: false``: it deletes its oldest CDC segments, published
or not, once cdc_raw is full. An agent that was stopped or paused meanwhile loses those changes, and says so:
an error line naming each segment it had been publishing and how far it got, one naming the segments it never
saw, both with the tables and the remedy, and counts; then it publishes on.

One node of its own (four 1 MiB segments of cdc_total_space) on the real Kafka broker (``real_kafka``); the
agent reads the node's settings by CQL, as configured from the docs (nothing repeated in its configuration).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest
from cassandra.concurrent import execute_concurrent_with_args

from cassandra_cdc.agent.positions import STATE_FILE
from cassandra_cdc.schema import fetch_schema
from cassandra_cdc.simulator.broker import free_port
from conftest import require_jvm_artifacts
from real_system import (System, agent_metrics, create_single_replica_table, inserted_ids, table_id,
                         wait_for)

SERVER = "cdcloss"
VALUE = "v" * 1000  # a thousand rows fill a segment
ROWS_WHILE_AWAY = 8000  # twice cdc_total_space: the node deletes what the agent had not published


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import CassandraCluster

    config = {"cdc_total_space": "4MiB", "commitlog_segment_size": "1MiB", "cdc_block_writes": False}
    with CassandraCluster(tmp_path_factory.mktemp("cdc-loss"), nodes=1, heap="256m",
                          config=config) as cluster:
        yield cluster


class LossRun:
    """One table of its own, its agent (metrics on a port of its own) and what the agent published."""

    def __init__(self, node: Any, real_kafka: Any, tmp_path: Path, session: Any, name: str) -> None:
        self.port = free_port()
        self.server = f"{SERVER}{name}"
        keyspace = f"loss_{name}"
        self.system = System(tmp_path, node, real_kafka, self.server, tables=[f"{keyspace}.*"],
                             agent_settings={"metrics": {"host": "127.0.0.1", "port": self.port}})
        self.agent = self.system.agents[0]
        self.state = tmp_path / f"agent-state-{node.nodes[0].address}" / STATE_FILE
        self.bootstrap_servers = real_kafka.bootstrap_servers
        self.session = session
        self.insert = create_single_replica_table(session, keyspace, "t")
        self.table = table_id(session, keyspace, "t")
        self.schema = fetch_schema(session)
        self.written = 0

    def write(self, rows: int) -> range:
        ids = range(self.written, self.written + rows)
        execute_concurrent_with_args(self.session, self.insert, [(row_id, VALUE) for row_id in ids],
                                     concurrency=32, raise_on_first_error=True)
        self.written += rows
        return ids

    def published(self) -> set[int]:
        return set(inserted_ids(self.bootstrap_servers, f"{self.server}.raw", self.table, self.schema, VALUE))

    def wait_published(self, ids: range, what: str) -> None:
        wait_for(lambda: set(ids) <= self.published(), what, 120, self.system.agents)

    def saved_segments(self) -> dict[str, dict[str, Any]]:
        """The agent's saved positions, by segment file."""
        return {saved["file"]: saved for saved in json.loads(self.state.read_text())["segments"].values()}

    def errors(self) -> list[str]:
        return [line for line in self.agent.log_path.read_text().splitlines() if " ERROR " in line]

    def carry_on(self, what: str) -> tuple[range, dict[str, float], set[int]]:
        """After the agent's return (``what``): once it has said what was lost, rows written then are
        published. Those rows, the agent's metrics and every row published."""
        wait_for(lambda: len(self.errors()) >= 2, "the agent's error lines", 120, self.system.agents)
        after = self.write(200)
        self.wait_published(after, f"the rows written after {what}")
        return after, agent_metrics(self.port), self.published()


@pytest.fixture
def session(node: Any) -> Iterator[Any]:
    with node.driver() as driver:
        yield driver.connect()


def test_segments_deleted_while_the_agent_is_stopped(node: Any, real_kafka: Any, tmp_path: Path,
                                                     session: Any) -> None:
    """The agent stops (SIGTERM) while a segment is half published; 8,000 rows later the node has deleted it
    and the segments after it. The agent's next start says which segment it had published how far, how many it
    never saw, the tables and the remedy, counts them, and publishes what the node kept and what comes
    next."""
    run = LossRun(node, real_kafka, tmp_path, session, "stopped")
    cdc_raw = node.nodes[0].cdc_raw_dir
    try:
        run.system.start_agents()
        assert (f"cdc_block_writes is false on node {node.nodes[0].address}: once cdc_raw holds 3 MiB the "
                "node deletes its oldest CDC segments") in run.agent.log_path.read_text()
        before = run.write(200)
        run.wait_published(before, "the rows written before the stop")
        run.agent.stop()
        unfinished = {name: saved for name, saved in run.saved_segments().items()
                      if "durable" in saved and not saved["completed"]}
        assert len(unfinished) == 1, run.saved_segments()
        (name, saved), = unfinished.items()
        run.write(ROWS_WHILE_AWAY)
        assert not (cdc_raw / name).exists(), "the node kept the segment: nothing was lost"
        run.agent.start()
        after, figures, published = run.carry_on("the restart")
    finally:
        run.system.stop()
    lost_rows = ROWS_WHILE_AWAY - len(published - set(before) - set(after))
    assert lost_rows > 0 and set(before) <= published
    lost, unseen = run.errors()[:2]
    assert saved["position"] == saved["durable"]  # everything durable was published when the agent stopped
    assert (f"ERROR cassandra_cdc.agent.segment_loss: {name} left cdc_raw before the agent had published it: "
            f"Kafka has its changes up to position {saved['position']}, all the node had made durable when "
            "the agent last read its idx; the node wrote more to it after that, and those changes never "
            "reached Kafka") in lost
    assert "segment(s) left cdc_raw while it was stopped (ids " in unseen, unseen
    for line in (lost, unseen):
        assert "loss_stopped.t" in line and "cassandra-cdc bootstrap" in line
        assert f"cdc_block_writes is false on node {node.nodes[0].address}" in line
    assert figures["cassandra_cdc_agent_segments_lost_total"] == 1
    assert figures["cassandra_cdc_agent_segments_unseen_total"] >= 1


def test_segments_deleted_while_the_agent_is_paused(node: Any, real_kafka: Any, tmp_path: Path,
                                                    session: Any) -> None:
    """The agent's process paused (SIGSTOP) while 8,000 rows are written and the node deletes the segment it
    was publishing and the ones after; resumed (SIGCONT), it says so in error lines, counts it, and publishes
    on."""
    run = LossRun(node, real_kafka, tmp_path, session, "paused")
    cdc_raw = node.nodes[0].cdc_raw_dir
    try:
        run.system.start_agents()
        before = run.write(200)
        run.wait_published(before, "the rows written before the pause")
        reading = sorted(path.name.replace("_cdc.idx", ".log") for path in cdc_raw.glob("*_cdc.idx"))
        run.agent.send(signal.SIGSTOP)
        try:
            run.write(ROWS_WHILE_AWAY)
        finally:
            run.agent.send(signal.SIGCONT)
        assert not any((cdc_raw / name).exists() for name in reading), \
            "the node kept the segments: nothing lost"
        _, figures, published = run.carry_on("the pause")
    finally:
        run.system.stop()
    assert set(before) <= published and len(published) < run.written
    errors = run.errors()
    lost = [line for line in errors if "left cdc_raw before the agent had published it" in line]
    assert [line for line in lost if any(name in line for name in reading)], errors
    assert any("segment(s) left cdc_raw before the agent looked at them" in line for line in errors), errors
    assert figures["cassandra_cdc_agent_segments_lost_total"] == len(lost) >= 1
    assert figures["cassandra_cdc_agent_segments_unseen_total"] >= 1
