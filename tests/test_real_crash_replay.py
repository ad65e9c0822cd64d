"""A node that crashed, on the real thing: one Cassandra 5.0 node writing LZ4-compressed commit logs, killed
with ``kill -9`` while its agent is not running (a host that lost power loses both), then started again.

Cassandra replays the segments it finds at its start, and rewrites the idx file of each replayed CDC segment
with the file's length, COMPLETED. A compressed segment's positions are uncompressed ones, far past its
file's length: the agent, started after the node, must publish every write of the segment all the same,
and must not take the segment for a damaged one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from cassandra_cdc.agent.cdc_raw import list_segments, read_cdc_index
from cassandra_cdc.localcluster import CassandraCluster
from conftest import require_jvm_artifacts
from real_system import System, create_single_replica_table, digests_by_node, table_id, wait_for

KEYSPACE = "crash_replay"
SERVER = "crashreplay"
WRITES = 2000


@pytest.fixture(scope="module")
def compressed_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CassandraCluster]:
    require_jvm_artifacts()
    with CassandraCluster(tmp_path_factory.mktemp("compressed-node"), nodes=1,
                          config={"commitlog_compression": [{"class_name": "LZ4Compressor"}]}) as cluster:
        yield cluster


def test_every_write_of_a_compressed_segment_replayed_after_a_crash_is_published(
        compressed_node: CassandraCluster, real_kafka: Any, tmp_path: Path) -> None:
    node = compressed_node.nodes[0]
    with compressed_node.driver() as driver:
        session = driver.connect()
        insert = create_single_replica_table(session, KEYSPACE, "items")
        for row_id in range(WRITES):
            session.execute(insert, (row_id, f"value {row_id} " * 10))
        items = table_id(session, KEYSPACE, "items")
    time.sleep(2.5)  # past the node's periodic commit log sync (1 s): every write is durable
    node.kill()
    compressed_node.start()
    replayed = {segment.path.name: (segment.path.stat().st_size, read_cdc_index(segment.index_path))
                for segment in list_segments(node.cdc_raw_dir)}
    # What the test is about: an idx the replay rewrote, COMPLETED at the file's length.
    assert any(index is not None and index.completed and index.offset == size
               for size, index in replayed.values()), replayed

    system = System(tmp_path, compressed_node, real_kafka, SERVER, tables=[f"{KEYSPACE}.*"])
    try:
        system.start_agents()
        published = lambda: len(digests_by_node(real_kafka.bootstrap_servers, f"{SERVER}.raw", items)
                                .get(node.address, ()))
        wait_for(lambda: published() >= WRITES, "every write published", 120, system.agents)
    finally:
        system.stop()
    assert published() == WRITES
    quarantine = tmp_path / f"agent-state-{node.address}" / "quarantine"
    assert not quarantine.exists() or not any(quarantine.iterdir()), system.logs()
