"""A real Cassandra 5.0 node whose cdc_raw reaches cdc_total_space while its agent is stopped.

One node of its own (the shared ``real_cassandra`` keeps its settings), with a cdc_total_space of two
commit log segments, on the real Kafka broker (``real_kafka``). Writes to a CDC table go on until the node
rejects them: the client gets a ``WriteFailure`` and the node logs "Rejecting mutation ... Free up space
in <cdc_raw>". Then the agent starts: it publishes the full segments and deletes them, the node (which
looks at cdc_raw again every ``cdc_free_space_check_interval``) accepts writes again, and the raw records
published are exactly the writes the node accepted, the rejected ones absent.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from cassandra import WriteFailure

from cassandra_cdc.kafka.raw_records import is_truncation, RawRecord
from cassandra_cdc.schema import fetch_schema
from cassandra_cdc.storage import PartitionUpdateSerializer
from cassandra_cdc.storage.binary_io import DataInput
from conftest import require_jvm_artifacts
from real_system import System, create_single_replica_table, raw_records, table_id, wait_for

KEYSPACE = "cdc_full"
TABLE = "filled"
SERVER = "cdcfull"
SEGMENT_MIB = 1
TOTAL_SPACE_MIB = 2 * SEGMENT_MIB
VALUE = "v" * 1000  # a few thousand rows fill the two segments
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


def inserted_ids(bootstrap_servers: str, table: bytes, schema: Any) -> collections.Counter[int]:
    """The ids of the rows the raw records of ``table`` carry, decoded, with how often each is there."""
    ids: collections.Counter[int] = collections.Counter()
    for _, value in raw_records(bootstrap_servers, f"{SERVER}.raw", table):
        assert not is_truncation(value)
        record = RawRecord.decode(value)
        update = PartitionUpdateSerializer.deserialize(DataInput(record.update), schema,
                                                       record.commitlog_version)
        assert [cell.value for row in update.rows for cell in row.cells] == [VALUE.encode()]
        ids[int.from_bytes(update.key, "big", signed=True)] += 1
    return ids


def test_a_full_cdc_raw_is_drained_by_the_agent_and_the_node_accepts_writes_again(
        node: Any, real_kafka: Any, tmp_path: Path) -> None:
    system = System(tmp_path, node, real_kafka, SERVER, tables=[f"{KEYSPACE}.*"],
                    agent_settings={"cdc_total_space_mb": TOTAL_SPACE_MIB})
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
            wait_for(lambda: sum(inserted_ids(real_kafka.bootstrap_servers, table, schema).values())
                     >= len(accepted), f"the {len(accepted)} accepted rows on the raw topic", 60,
                     system.agents)
            published = inserted_ids(real_kafka.bootstrap_servers, table, schema)
        finally:
            system.stop()
    assert set(published) == set(accepted)
    assert set(published).isdisjoint(rejected)
    assert [row_id for row_id, copies in published.items() if copies > 1] == []
    remaining = {path.name for path in node.nodes[0].cdc_raw_dir.glob("*.log")}
    assert remaining.isdisjoint(full[:-1]), "a completed full segment left in cdc_raw"
    lines = agent.log_path.read_text().splitlines()
    warned = [i for i, line in enumerate(lines) if f"of cdc_total_space ({TOTAL_SPACE_MIB} MiB)" in line]
    back_under = [i for i, line in enumerate(lines) if "cdc_raw back under" in line]
    assert warned and back_under and warned[0] < back_under[-1], "\n".join(lines[-30:])
