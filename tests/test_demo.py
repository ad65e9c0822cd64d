"""``cassandra-cdc demo`` end to end, on real Cassandra and Kafka and on the simulated cluster (as CI runs
them), ``cassandra-cdc tail``, and the pieces the demo adds: the final check's comparison and the
simulator's schema change."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from cassandra_cdc.cli.main import app
from cassandra_cdc.commitlog import MutationSerializer
from cassandra_cdc.demo.table_check import compare_rows, normalized, replay
from cassandra_cdc.demo.demo_workload import ALTER_CQL, SCHEMA_CQL
from cassandra_cdc.events.event_encoder import EventEncoder, Source
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import Clock, Cluster, EmbeddedBroker, Insert, Update, Workload, to_mutation
from cassandra_cdc.kafka.raw_records import RawRecord, record_key

from conftest import require_jvm_artifacts

DEMO_TIMEOUT = 400  # seconds; Spark and the agents start, the demo writes, the pipeline catches up
REAL_DEMO_TIMEOUT = 1200  # seconds; three nodes, a broker and Spark start first on a machine that may be busy


def run_demo(arguments: list[str], timeout: float) -> tuple[int, str]:
    """``cassandra-cdc demo <arguments>`` as a user runs it; its exit status and output."""
    demo = subprocess.Popen([sys.executable, "-m", "cassandra_cdc", "demo", *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = demo.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Twice SIGTERM: the demo stops what it started at once, rather than leaving it behind.
        demo.terminate()
        time.sleep(1)
        demo.terminate()
        output, _ = demo.communicate(timeout=180)
        pytest.fail(f"the demo did not finish within {timeout} s:\n{output[-6000:]}")
    return demo.returncode, output


@pytest.mark.timeout(REAL_DEMO_TIMEOUT + 300)
def test_real_demo_on_a_spark_cluster_with_chaos_runs_and_its_check_passes(tmp_path: Path) -> None:
    """`make run ARGS="--chaos --spark-cluster"` on the real thing, with a short writing time: three Cassandra
    5.0 nodes, a Kafka broker and a Spark standalone cluster (a master, two workers) start; while the workload
    writes, a process is killed (kill -9) every 12 s and restarted: the first five faults are one of each
    kind (a Spark worker, the pipeline's driver, an agent, the broker, a node); the events of every table
    still replay to SELECT * at CONSISTENCY ALL, none read twice, and all is stopped. Seed 23 kills the
    slowest to recover first, so that the demo waits least for them after writing."""
    require_jvm_artifacts()
    workdir = tmp_path / "demo-data"
    code, output = run_demo(["--spark-cluster", "--chaos", "--fault-interval", "12", "--seed", "23",
                             "--duration", "65", "--plain", "--catchup-timeout", "600", "--workdir",
                             str(workdir)], REAL_DEMO_TIMEOUT)
    assert code == 0, output[-6000:]
    assert "seed 23 (--seed 23 repeats the sequence)" in output
    assert re.search(r"Spark master spark://127\.0\.0\.1:\d+ with 2 workers up", output), output[-6000:]
    injected = re.search(r"✓ (\d+) faults injected \(seed 23\): agent (\d+), pipeline (\d+), kafka (\d+), "
                         r"cassandra (\d+), spark worker (\d+); recovery p50 [0-9.]+ s, max [0-9.]+ s", output)
    assert injected, output[-6000:]
    assert all(int(count) >= 1 for count in injected.groups()[1:]), injected.group(0)
    for killed in (r"agent 127\.0\.0\.\d", "pipeline", r"Kafka broker 127\.0\.0\.1:\d+",
                   r"Cassandra node 127\.0\.0\.\d", r"Spark worker\d"):
        assert re.search(f"chaos: kill -9 of {killed} \\(fault \\d+\\)", output), killed
        assert re.search(f"chaos: {killed} ready again [0-9.]+ s after its kill", output), killed
    for table in ("rows", "collections", "counters", "types", "expiring"):
        assert re.search(f"✓ cdc_demo.{table}: [0-9,]+ events replay into exactly the table's", output), output
    assert "✓ cdc_demo.plain (no CDC)" in output
    assert "✓ no event read twice" in output
    assert "check passed: the events replayed equal SELECT * at CONSISTENCY ALL on the real cluster" in output
    assert "Cassandra node 127.0.0.3 up in" in output and "Kafka broker" in output
    assert re.search(r"Spark master spark://127\.0\.0\.1:\d+ stopped", output), output[-6000:]
    assert not workdir.exists(), "the work directory is removed at the end"


def test_real_demo_without_the_jvm_artifacts_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASSANDRA_CDC_JVM_LIB", str(tmp_path))
    result = CliRunner().invoke(app, ["demo", "--duration", "1", "--workdir", str(tmp_path / "demo-data")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert "run `make install`" in lines[0] and "cassandra-cdc demo --simulated" in lines[0]
    assert not (tmp_path / "demo-data").exists()


def test_demo_refuses_a_cassandra_version_it_cannot_run(tmp_path: Path) -> None:
    for arguments, said in ((["--cassandra-version", "3.11"], "--cassandra-version 3.11: one of 5.0, 4.1, 4.0"),
                            (["--cassandra-version", "4.1", "--simulated"], "not with --simulated")):
        result = CliRunner().invoke(app, ["demo", "--duration", "1", "--workdir", str(tmp_path / "demo-data"),
                                          *arguments])
        assert result.exit_code == 2, result.output
        assert said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "demo-data").exists()


def test_demo_runs_and_its_check_passes(tmp_path: Path) -> None:
    """The simulated system for 25 s of writing (the schema change at 10 s), then the final check (exit 1 if
    it fails)."""
    workdir = tmp_path / "demo-data"
    code, output = run_demo(["--simulated", "--duration", "25", "--check", "--workdir", str(workdir)],
                            DEMO_TIMEOUT)
    assert code == 0, output[-6000:]
    assert "check passed" in output
    assert "✓ shop.users: after ALTER TABLE shop.users ADD country text" in output, output[-3000:]
    assert not workdir.exists(), "the work directory is removed at the end"


def test_demo_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("not the demo's")
    result = CliRunner().invoke(app, ["demo", "--simulated", "--duration", "1", "--workdir", str(tmp_path),
                                      "--plain"])
    assert result.exit_code == 1
    assert "is not a demo work directory" in result.output
    assert (tmp_path / "precious.txt").exists()


# --- tail ---------------------------------------------------------------------------------------

TAIL_SCHEMA = parse_schema("""
CREATE TABLE shop.orders (id int, line int, item text, qty int, tags set<text>, PRIMARY KEY (id, line))
    WITH ID = 7a11a11a-0000-4000-8000-000000000001 AND cdc = true;
""")
ORDERS = TAIL_SCHEMA.table("shop", "orders")


def _produce(broker: EmbeddedBroker, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    broker.create_topic(topic, 2)
    with Producer({"bootstrap.servers": broker.bootstrap_servers}) as producer:
        for key, value in records:
            producer.produce(topic, value, key)
        assert producer.flush(30) == 0


def _tail(*arguments: str) -> list[str]:
    result = CliRunner().invoke(app, ["tail", *arguments])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_tail_prints_events_readably(broker: EmbeddedBroker) -> None:
    topic = f"tail-{uuid.uuid4().hex[:8]}.shop.orders"
    encoder = EventEncoder("tail", ORDERS)
    source = Source("tail", "tail", "shop", "orders", 1_700_000_000_123_456, False, "node1", 1, 100)
    before = {"id": 7, "line": 1, "item": "tea", "qty": 2, "tags": None}
    after = {**before, "qty": 3, "tags": ["green"]}
    _produce(broker, topic, [
        (encoder.key(before), encoder.value(None, before, "c", source, 1)),
        (encoder.key(after), encoder.value(before, after, "u", source, 2)),
        (encoder.key(after), encoder.value(after, None, "d", Source("tail", "tail", "shop", "orders", 1, False, None,
                                                                    None, None), 3)),
        (encoder.key(after), None),
    ])
    lines = _tail(topic, "--bootstrap-servers", broker.bootstrap_servers, "--from-beginning", "--max", "4")
    assert len(lines) == 4
    assert lines[0] == '22:13:20.123 c shop.orders id=7 line=1  item="tea" qty=2'
    assert lines[1] == '22:13:20.123 u shop.orders id=7 line=1  qty 2→3, tags null→["green"]'
    assert lines[2].endswith("d shop.orders id=7 line=1  (expired: TTL)")
    assert lines[3] == "tombstone id=7 line=1"
    # --until-end stops at the end of the topic by itself.
    assert len(_tail(topic, "--bootstrap-servers", broker.bootstrap_servers, "--from-beginning", "--until-end")) == 4


def test_tail_decodes_raw_records_with_a_schema(broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic = f"tail-{uuid.uuid4().hex[:8]}.raw"
    op = Insert("shop.orders", {"id": 3, "line": 0, "item": "cake", "tags": {"a", "b"}},
                timestamp=1_700_000_000_000_000)
    body = MutationSerializer.serialize(to_mutation(op, TAIL_SCHEMA), 7)
    update = body[1:]  # a mutation of one partition update: its count (one byte), then the update
    record = RawRecord("node2", 1234, 567, 7, op.timestamp, update)
    _produce(broker, topic, [(record_key(update), record.encode())])
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(ORDERS.to_cql())
    lines = _tail(topic, "--bootstrap-servers", broker.bootstrap_servers, "--from-beginning", "--max", "1",
                  "--schema", str(schema_file))
    assert lines[0] == "node2 CommitLog-7-1234.log@567 22:13:20.000 shop.orders (" + str(len(update)) + " bytes)"
    assert '"type": "row"' in lines[1] and '"clustering": {"line": 0}' in lines[1]
    assert '"column": "item", "value": "cake"' in lines[1]
    # A schema declaring another type for the key: said so, not a null key.
    schema_file.write_text(ORDERS.to_cql().replace("id int", "id bigint"))
    wrong = _tail(topic, "--bootstrap-servers", broker.bootstrap_servers, "--from-beginning", "--max", "1",
                  "--schema", str(schema_file))
    assert wrong == [lines[0] + " — cannot decode: primary key column id: cannot decode 4 bytes as bigint: "
                                "unpack requires a buffer of 8 bytes (is that its type in the schema?)"]
    # Without the table's schema: the header, and what is missing.
    unknown = _tail(topic, "--bootstrap-servers", broker.bootstrap_servers, "--from-beginning", "--max", "1",
                    "--schema-topic", f"no-such-topic-{uuid.uuid4().hex[:8]}")
    assert unknown[0].endswith("no schema for this table: give --schema")


def test_tail_of_a_missing_topic_is_an_error(broker: EmbeddedBroker) -> None:
    result = CliRunner().invoke(app, ["tail", "no-such-topic", "--bootstrap-servers", broker.bootstrap_servers])
    assert result.exit_code == 2
    assert "does not exist" in result.output


# --- the pieces ---------------------------------------------------------------------------------

def test_replayed_rows_compare_with_the_model_columns_added_later_read_null() -> None:
    changes = [("t", "c", None, {"id": 1, "v": "a"}), ("t", "c", None, {"id": 2, "v": "b"}),
               ("t", "u", {"id": 2, "v": "b"}, {"id": 2, "v": "c"}), ("t", "d", {"id": 1, "v": "a"}, None),
               ("other", "c", None, {"id": 9, "v": "z"})]
    events = [(topic, {"op": op, "before": before, "after": after, "source": {"ts_ms": ms}})
              for ms, (topic, op, before, after) in enumerate(changes)]
    got = replay(events, "t", ["id"])
    assert got == {(2,): {"id": 2, "v": "c"}}
    assert compare_rows(got, {(2,): {"id": 2, "v": "c", "added": None}}, ["id", "v", "added"]) == []
    problems = compare_rows(got, {(2,): {"id": 2, "v": "d", "added": None}, (3,): {"id": 3, "v": "x"}},
                            ["id", "v", "added"])
    assert problems == ["(2): v: events 'c', table 'd'",
                        "(3): in the table, but no event made it (expected {id: 3, v: 'x'})"]
    assert normalized({"s": frozenset({"b", "a"}), "t": (1, 2), "u": uuid.UUID(int=1)}) == {
        "s": ["a", "b"], "t": [1, 2], "u": "00000000-0000-0000-0000-000000000001"}


def test_a_replayed_truncation_empties_the_table_of_the_rows_written_before_it_in_any_order() -> None:
    """A ``t`` has no key: the events of other partitions are read before or after it whatever their write
    times. Those written before it are gone, those written after it stay, in either order."""
    def event(op: str, row: dict[str, Any] | None, ms: int) -> tuple[str, dict[str, Any]]:
        return "t", {"op": op, "before": None, "after": row, "source": {"ts_ms": ms}}
    before = [event("c", {"id": 1, "v": "old"}, 10), event("c", {"id": 2, "v": "old"}, 11)]
    truncation = [event("t", None, 20)]
    after = [event("c", {"id": 2, "v": "new"}, 30), event("c", {"id": 3, "v": "new"}, 31)]
    expected = {(2,): {"id": 2, "v": "new"}, (3,): {"id": 3, "v": "new"}}
    for order in (before + truncation + after, after[1:] + truncation + before + after[:1],
                  before[:1] + after + truncation + before[1:]):
        assert replay(order, "t", ["id"]) == expected


def test_the_simulated_cluster_takes_a_schema_change(tmp_path: Path) -> None:
    schema = parse_schema(SCHEMA_CQL)
    clock = Clock(start_micros=1_700_000_000_000_000)
    cluster = Cluster(tmp_path, schema, nodes=3, rf=3)
    workload = Workload(schema, seed=3, tables=["shop.users"], keys=5, clock=clock)
    cluster.execute(Insert("shop.users", {"id": 1, "name": "ann"}, timestamp=clock.tick()))
    altered = parse_schema(SCHEMA_CQL + ALTER_CQL)
    cluster.alter_schema(altered)
    workload.alter_schema(altered)
    assert cluster.rows("shop.users", clock.now_seconds)[(1,)] == {"id": 1, "name": "ann", "email": None, "plan": None,
                                                                   "country": None}
    cluster.execute(Update("shop.users", {"id": 1}, {"country": "fr"}, timestamp=clock.tick()))
    assert cluster.rows("shop.users", clock.now_seconds)[(1,)]["country"] == "fr"
    mutation = cluster.execute(Update("shop.users", {"id": 2}, {"country": "de"}, timestamp=clock.tick()))
    assert [c.name for c in mutation.updates[0].regular_columns] == ["country"]
    # The workload writes the new column too.
    ops: list[Any] = workload.take(200)
    assert any("country" in getattr(op, "values", getattr(op, "set", {})) for op in ops)
    with pytest.raises(ValueError, match="dropping columns"):
        cluster.alter_schema(schema)
