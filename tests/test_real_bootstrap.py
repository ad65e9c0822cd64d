"""The bootstrap from a real ``nodetool snapshot``, merged with live changes, on the real thing.

A table of the real cluster of each version (``REAL_CLUSTERS``: three Cassandra 5.0 nodes, two writing
SSTables in the ``big`` format and one in ``bti``; a 4.1 and a 4.0 node, writing ``big`` SSTables of
version ``nb``) is filled while CDC is off for it (collections, a user type, static columns,
cell, row, range and partition deletions, TTLs), flushed and snapshotted on every node. Then CDC is
turned on (``ALTER TABLE ... WITH cdc = true``), and ``cassandra-cdc bootstrap`` reads the three
snapshots into real Kafka while the agents (one per node) and the pipeline carry live changes to the
same rows. The events (the bootstrap's ``r`` merged with the live ``c``/``u``/``d``), replayed, must
equal ``SELECT *`` at CONSISTENCY ALL once the TTLs have passed; the rows only the snapshot holds must
have come from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from cassandra_cdc.demo.cql_workload import table_rows
from cassandra_cdc.demo.processes import ChildProcess
from conftest import REAL_CASSANDRA_FORMATS, REAL_CLUSTERS
from real_system import (System, consume_events, differences_of, records_by_node, session_at_all, table_id,
                         topic_exists, wait_for)

KEYSPACE = "real_snapshot"
SERVER = "realsnap"
TABLE = "items"
SNAPSHOT_TAG = "bootstrap"


def schema(replicas: int) -> list[str]:
    return [
        f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
        f"{{'class': 'NetworkTopologyStrategy', 'datacenter1': {replicas}}}",
        *TABLES]


TABLES = [
    f"CREATE TYPE {KEYSPACE}.address (street text, number int)",
    # CDC off while the snapshot's rows are written: they reach Kafka only through the bootstrap.
    f"""CREATE TABLE {KEYSPACE}.{TABLE} (pk int, ck int, s text static, v text, n int, tags set<text>,
        attrs map<text, int>, seq list<int>, home address, frozen_home frozen<address>,
        PRIMARY KEY (pk, ck)) WITH cdc = false""",
    # Written once the snapshot's rows are: when every agent has published it, they have read past them.
    f"CREATE TABLE {KEYSPACE}.marker (id int PRIMARY KEY) WITH cdc = true",
]
SNAPSHOT_PARTITIONS = 24
SHORT_TTL = 2  # seconds: every TTL of the workload has passed before the check
CONVERGE_TIMEOUT = 300.0
T = f"{KEYSPACE}.{TABLE}"


def snapshot_statements() -> list[str]:
    """What the snapshot holds: every partition a few rows of every kind of column, then changes of
    every kind, so that the SSTables hold cells, collections in pieces, tombstones of every scope and
    expiring cells (some already expired when the snapshot is taken)."""
    statements = []
    for pk in range(SNAPSHOT_PARTITIONS):
        for ck in range(6):
            statements.append(
                f"INSERT INTO {T} (pk, ck, v, n, tags, attrs, seq, home, frozen_home) VALUES ({pk}, {ck}, "
                f"'v{pk}-{ck}', {ck}, {{'a', 'b{ck}'}}, {{'x': {ck}, 'y': 2}}, [1, 2, {ck}], "
                f"{{street: 'main', number: {pk}}}, {{street: 'frozen', number: {ck}}})")
        statements += [
            f"UPDATE {T} SET s = 'static {pk}' WHERE pk = {pk}",
            f"UPDATE {T} SET seq = seq + [9], tags = tags - {{'a'}}, attrs['z'] = 26 "
            f"WHERE pk = {pk} AND ck = 0",
            f"DELETE seq[0], attrs['x'] FROM {T} WHERE pk = {pk} AND ck = 1",
            f"UPDATE {T} SET home.number = 99 WHERE pk = {pk} AND ck = 2",
            f"DELETE n, tags FROM {T} WHERE pk = {pk} AND ck = 3",
            f"DELETE FROM {T} WHERE pk = {pk} AND ck = 4",
            f"UPDATE {T} USING TTL {SHORT_TTL} SET v = 'expiring' WHERE pk = {pk} AND ck = 5",
            f"INSERT INTO {T} (pk, ck, v) VALUES ({pk}, 10, 'row ttl') USING TTL {SHORT_TTL}",
            f"UPDATE {T} SET v = 'no row marker' WHERE pk = {pk} AND ck = 11",
            f"INSERT INTO {T} (pk, ck, v) VALUES ({pk}, 12, 'long ttl') USING TTL 86400",
        ]
        if pk % 4 == 1:
            statements.append(f"DELETE FROM {T} WHERE pk = {pk} AND ck >= 1 AND ck < 3")
        if pk % 4 == 2:
            statements.append(f"DELETE FROM {T} WHERE pk = {pk} AND ck > 10")
        if pk % 6 == 3:
            statements.append(f"DELETE FROM {T} WHERE pk = {pk}")
        if pk % 6 == 5:
            statements.append(f"DELETE s FROM {T} WHERE pk = {pk}")
    statements += [f"INSERT INTO {T} (pk, s) VALUES ({pk}, 'static only')" for pk in (100, 101)]
    return statements


# Partitions the live changes touch; the others' rows reach Kafka only from the snapshot.
LIVE_PARTITIONS = range(0, SNAPSHOT_PARTITIONS, 3)


def live_statements() -> list[str]:
    """Changes made while the bootstrap runs, to rows the snapshot holds and to new rows: newer values,
    partial updates of collections and of the user type, deletions of every scope, TTLs."""
    statements = []
    for pk in LIVE_PARTITIONS:
        statements += [
            f"UPDATE {T} SET v = 'live {pk}' WHERE pk = {pk} AND ck = 0",
            f"UPDATE {T} SET seq = seq + [7], tags = tags + {{'live'}}, attrs['w'] = 1 "
            f"WHERE pk = {pk} AND ck = 1",
            f"UPDATE {T} SET home.street = 'live street' WHERE pk = {pk} AND ck = 2",
            f"DELETE FROM {T} WHERE pk = {pk} AND ck = 3",
            f"DELETE FROM {T} WHERE pk = {pk} AND ck >= 11 AND ck <= 12",
            f"INSERT INTO {T} (pk, ck, v, seq) VALUES ({pk}, 20, 'new live row', [20])",
            f"UPDATE {T} SET s = 'live static {pk}' WHERE pk = {pk}",
            f"UPDATE {T} USING TTL {SHORT_TTL} SET n = 5 WHERE pk = {pk} AND ck = 0",
        ]
        if pk % 2:
            statements.append(f"DELETE FROM {T} WHERE pk = {pk}")
            statements.append(f"INSERT INTO {T} (pk, ck, v) VALUES ({pk}, 30, 'after a partition deletion')")
    statements += [f"INSERT INTO {T} (pk, ck, v, frozen_home) VALUES ({pk}, 0, 'live only', "
                   f"{{street: 'new', number: {pk}}})" for pk in range(500, 506)]
    return statements


def snapshot_directories(cluster: Any, table: str) -> dict[str, Path]:
    """Each node's snapshot of ``table``, by node address."""
    directories = {}
    for node in cluster.nodes:
        (directory,) = (node.directory / "data" / KEYSPACE).glob(f"{table}-*/snapshots/{SNAPSHOT_TAG}")
        directories[node.address] = directory
    return directories


def sstable_formats(directory: Path) -> set[tuple[str, str]]:
    """The (version, format) of the SSTables in ``directory``, from their names (``nb-1-big-Data.db``)."""
    return {(name[0], name[2]) for name in (data.name.split("-") for data in directory.glob("*-Data.db"))}


def our_dump(snapshot: Path) -> list[dict[str, Any]]:
    """``cassandra-cdc dump`` of a snapshot's SSTables (with the schema.cql the snapshot holds), without
    where each item lies in its file."""
    command = [sys.executable, "-m", "cassandra_cdc", "dump", "--schema", str(snapshot / "schema.cql"),
               *map(str, sorted(snapshot.glob("*-Data.db")))]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return [{name: value for name, value in json.loads(line).items() if name not in ("sstable", "position")}
            for line in result.stdout.splitlines()]


def run_while(child: ChildProcess, chunks: list[list[str]], write: Callable[[str], Any],
              children: list[ChildProcess]) -> int:
    """Write ``chunks`` one after another while ``child`` runs (all of them, the rest once it ended);
    return how many were written while it still ran."""
    during = 0
    for chunk in chunks:
        if child.exit_code is None:
            during += 1
        for statement in chunk:
            write(statement)
        time.sleep(1.0)
    wait_for(lambda: child.exit_code is not None, child.name, 600, [c for c in children if c is not child])
    return during


@pytest.fixture(scope="module", params=list(REAL_CLUSTERS))
def outcome(request: pytest.FixtureRequest, real_kafka: Any,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    version = request.param
    real_cassandra = request.getfixturevalue(REAL_CLUSTERS[version])
    root = tmp_path_factory.mktemp("real-bootstrap")
    server = f"{SERVER}{version.replace('.', '')}"
    system = System(root, real_cassandra, real_kafka, server, tables=[f"{KEYSPACE}.*"])
    topic = f"{server}.{T}"
    with session_at_all(real_cassandra, schema(len(real_cassandra.nodes))) as session:
        try:
            system.start_agents()
            for statement in snapshot_statements():
                session.execute(statement)
            session.execute(f"INSERT INTO {KEYSPACE}.marker (id) VALUES (1)")
            marker = table_id(session, KEYSPACE, "marker")
            raw_topic = f"{server}.raw"
            wait_for(lambda: topic_exists(real_kafka.bootstrap_servers, raw_topic)
                     and set(records_by_node(real_kafka.bootstrap_servers, raw_topic, marker))
                     == set(real_cassandra.contact_points),
                     "every agent to read past the snapshot's rows", 120, system.children)
            system.pipeline.start()
            for node in real_cassandra.nodes:
                node.nodetool("flush", KEYSPACE, TABLE)
                node.nodetool("snapshot", "-t", SNAPSHOT_TAG, "-cf", TABLE, KEYSPACE)
            snapshots = snapshot_directories(real_cassandra, TABLE)
            session.execute(f"ALTER TABLE {T} WITH cdc = true")
            assert session.cluster.control_connection.wait_for_schema_agreement(wait_time=60)
            wait_for(lambda: system.pipeline.ready, "the pipeline", 180, system.children)
            bootstrap = ChildProcess("bootstrap", [
                "bootstrap", "--config", str(system.pipeline_config), "--table", T, "--no-progress",
                *[f"--sstables={address}={path}" for address, path in snapshots.items()]],
                root / "bootstrap.log")
            bootstrap.start()
            live = live_statements()
            chunks = [live[i:i + 6] for i in range(0, len(live), 6)]
            chunks_during = run_while(bootstrap, chunks, session.execute, system.children)
            assert bootstrap.exit_code == 0, bootstrap.log_tail(40)
            time.sleep(SHORT_TTL + 2)  # every TTL has passed
            selected = table_rows(session, KEYSPACE, TABLE)
            deadline = time.monotonic() + CONVERGE_TIMEOUT
            while True:
                events = consume_events(real_kafka.bootstrap_servers, [topic])[topic]
                differences = differences_of(events, session, KEYSPACE, TABLE, selected)
                if not differences or time.monotonic() > deadline:
                    break
                for child in system.children:
                    assert child.exit_code is None, f"{child.name} exited: {child.log_tail(30)}"
                time.sleep(3)
        finally:
            system.stop()
    return {"version": version, "events": events, "differences": differences, "selected": selected,
            "snapshots": snapshots,
            "chunks_during": chunks_during, "logs": system.logs(), "bootstrap_log": bootstrap.log_tail(10)}


def test_the_snapshots_hold_the_sstable_formats_of_their_version(outcome):
    """Each 5.0 node's snapshot is in the format its cassandra.yaml selects: ``big`` (Index.db) or ``bti``
    (Partitions.db, Rows.db); a 4.x node's is ``big`` of version ``nb``."""
    formats = [sstable_formats(path) for path in outcome["snapshots"].values()]
    if outcome["version"] == "5.0":
        names = [{name for _, name in found} for found in formats]
        assert names == [{name} for name in REAL_CASSANDRA_FORMATS]
    else:
        assert formats == [{("nb", "big")}]
    for path, found in zip(outcome["snapshots"].values(), formats):
        index = {"big": "Index.db", "bti": "Partitions.db"}[next(iter(found))[1]]
        assert list(path.glob(f"*-{index}")), f"{path}: no {index}"


def test_we_read_the_same_content_from_either_format(outcome):
    """Every replica got the same writes (at CONSISTENCY ALL, with the coordinator's timestamps and
    deletion times): our reading of the ``bti`` snapshot equals that of the ``big`` ones, cell by cell,
    tombstones and TTLs included."""
    if len(outcome["snapshots"]) < 2:
        pytest.skip(f"Cassandra {outcome['version']}: one node, one format")
    dumps = [our_dump(path) for path in outcome["snapshots"].values()]
    assert dumps[0] and all(dump == dumps[0] for dump in dumps[1:])


def test_the_bootstrap_merged_with_live_changes_replays_to_the_table(outcome):
    assert outcome["chunks_during"] > 0, "no live change was written while the bootstrap ran"
    assert outcome["selected"][1], "the workload left rows"
    assert outcome["differences"] == [], (f"{len(outcome['differences'])} differences, first "
                                          f"{outcome['differences'][:10]}\n{outcome['logs']}\n"
                                          f"--- bootstrap\n{outcome['bootstrap_log']}")


def test_rows_only_the_snapshot_holds_came_from_it(outcome):
    """Rows of partitions no live change touched reach Kafka only as the bootstrap's ``r`` events."""
    reads = [e for e in outcome["events"] if e["op"] == "r"]
    read_keys = {(e["after"]["pk"], e["after"]["ck"]) for e in reads}
    untouched = {key for key in outcome["selected"][1] if key[0] < SNAPSHOT_PARTITIONS
                 and key[0] not in LIVE_PARTITIONS}
    assert untouched and untouched <= read_keys
    assert all(e["source"]["snapshot"] == "true" for e in reads)
