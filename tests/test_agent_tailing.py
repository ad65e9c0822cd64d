"""The agent tailing cdc_raw: every change published once, in the node's order, as the idx files allow;
acknowledgements known from a few delivery reports."""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

import cassandra_cdc.agent.segment_progress as progress_module
from cassandra_cdc.agent import Agent
from cassandra_cdc.agent.deliveries import MARKER_INTERVAL, Deliveries
from cassandra_cdc.agent.agent_metrics import LatencyHistogram
from cassandra_cdc.agent.publisher import DeliveryFailed, Publisher
from cassandra_cdc.agent.cdc_raw import read_cdc_index
from cassandra_cdc.agent.truncations import Truncation, TruncationWatch
from cassandra_cdc.commitlog import Mutation
from cassandra_cdc.simulator import EmbeddedBroker, Insert, SimulatedNode, to_mutation
from cassandra_cdc.kafka.raw_records import TruncationRecord
from cassandra_cdc.kafka.schema_records import SchemaRecord

import agent_harness
from agent_harness import (
    SCHEMA, FIRST_SEGMENT, wait_until, TopicReader, assert_published_exactly, assert_node_order,
    MakeHarness, NodeTruncations, running, saved_positions, metric)

broker, harness = agent_harness.broker, agent_harness.harness  # fixtures: a broker per module


# --- live tailing -----------------------------------------------------------------------------------------

def test_live_tailing_publishes_every_change_in_order_with_schemas_first(harness: MakeHarness) -> None:
    """4.1 node written while the agent runs: growing idx, rollover, COMPLETED, non-CDC and excluded tables.

    Every change of a published table arrives exactly once with its exact bytes, in the node's order per
    Kafka partition; a table's schema is acknowledged before its first raw record is produced; new data is
    published soon after the idx changes; completed segments are deleted, the live one is kept.
    """
    h = harness(published={"ks.users", "ks.events"}, segment_size=32 * 1024)
    events: list[tuple[str, str, bytes]] = []

    def spy(agent: Agent) -> None:
        publish = agent.publisher.publish

        def recording(topic: str, key: bytes, value: bytes, on_delivery: Any, *args: Any, **kwargs: Any) -> bool:
            events.append(("produce", topic, key))

            def delivered(error: Any, message: Any) -> None:
                events.append(("ack", topic, key))
                if on_delivery is not None:
                    on_delivery(error, message)
            return publish(topic, key, value, delivered, *args, **kwargs)
        agent.publisher.publish = recording  # type: ignore[method-assign]

    h.write(100)  # already there when the agent starts
    with running(h.config(tables__exclude=["other.*"]), spy) as agent:
        raw = h.raw_reader()
        for round in range(8):
            h.write(250, sync_every=25)
            # One mutation with a CDC and a non-CDC table: only the CDC table's update is published.
            ts = h.workload.clock.tick()
            users = to_mutation(Insert("ks.users", {"id": 2000 + round, "name": "u"}, timestamp=ts), SCHEMA)
            audit = to_mutation(Insert("ks.audit", {"id": 2000 + round, "v": "a"}, timestamp=ts), SCHEMA)
            h.write_mutation(Mutation(users.updates + audit.updates))
            h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes written so far")
        segments_so_far = {k[0] for k in h.expected}
        assert len(segments_so_far) >= 3, "the test must span segment rollovers"
        # Completed, acknowledged segments are deleted; the live one stays although fully published.
        live = h.node.active_segment.path.name
        wait_until(lambda: h.segment_files() == [live, live.replace(".log", "_cdc.idx")],
                   "completed segments deleted, the live one kept")

        # Latency: from the idx rewrite to the record visible to a consumer.
        latencies = []
        events_id = SCHEMA.table("ks", "events").id
        for i in range(5):
            key = (*h.insert("ks.events", pk=3000 + i, ck=i, v="late"), events_id)
            h.node.sync()
            synced = time.monotonic()
            raw.wait_for(lambda key=key: key in raw.arrival, "a change just synced")
            latencies.append(raw.arrival[key] - synced)
        assert max(latencies) < 5.0, latencies

        h.node.close()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
        assert metric(agent, "cassandra_cdc_agent_mutations_skipped_total") == 0
        # Healthy segments are cleaned up, never quarantined.
        assert metric(agent, "cassandra_cdc_agent_segments_quarantined_total") == 0
        # Per-record metrics: every record counted once, under its table.
        by_table = collections.Counter(SCHEMA.table_by_id(table_id).qualified_name for _, _, table_id in h.expected)
        for table, records in by_table.items():
            assert metric(agent, "cassandra_cdc_agent_records_published_total", table=table) == records
            assert metric(agent, "cassandra_cdc_agent_mutations_read_total", table=table) == records
        # Read, not published.
        assert metric(agent, "cassandra_cdc_agent_mutations_read_total", table="ks.audit") >= 8
        # Delivery latency: observed on the records that report their delivery (deliveries.py), a few per pass.
        observed = metric(agent, "cassandra_cdc_agent_kafka_delivery_seconds_count")
        assert 0 < observed < len(h.expected) / 2
        assert metric(agent, "cassandra_cdc_agent_kafka_delivery_seconds_bucket", le="30.0") == observed
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)
    assert {r.node_id for r in raw.records} == {"node1"} and {r.commitlog_version for r in raw.records} == {7}
    assert all(r.write_time > 0 for r in raw.records)

    # Schemas: only the published tables, each acknowledged before the table's first record was produced.
    schemas = h.reader(f"{h.server}.table-schemas")
    schemas.wait_for(lambda: len(schemas.messages) >= 2, "schema records")
    published = {m.key().decode(): SchemaRecord.decode(m.value()) for m in schemas.messages}
    assert set(published) == {"ks.users", "ks.events"}
    for name, record in published.items():
        table = SCHEMA.table(*name.split("."))
        assert record.table_metadata().id == table.id and record.version == table.version_hash()
        schema_acked = events.index(("ack", f"{h.server}.table-schemas", name.encode()))
        first_record = next(i for i, (kind, topic, key) in enumerate(events)
                            if kind == "produce" and topic == h.raw_topic and key[:16] == table.id.bytes)
        assert schema_acked < first_record, f"{name}: a raw record was produced before its schema was acknowledged"
    schemas.close()
    raw.close()


def test_include_and_exclude_filters(harness: MakeHarness) -> None:
    """Only CDC tables accepted by ``tables.include`` minus ``tables.exclude`` are published."""
    h = harness(published={"other.logs"})
    h.write(600)
    h.node.close()
    config = h.config(tables__include=["other.*", "ks.events", "ks.audit"], tables__exclude=["ks.events"])
    with running(config):
        raw = h.raw_reader()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.wait_for(lambda: raw.has_all(h.expected), "other.logs changes")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert {r.table_id for r in raw.records} == {SCHEMA.table("other", "logs").id}
    raw.close()


def test_cassandra_311_segments_moved_in_whole(harness: MakeHarness) -> None:
    """3.11: no idx; a segment appears in cdc_raw once discarded and is read once, completely (version 6)."""
    h = harness("3.11", segment_size=16 * 1024)
    with running(h.config()):
        raw = h.raw_reader()
        h.write(700, sync_every=20)
        h.node.sync()
        moved = {k for k in h.expected if k[0] != h.node.active_segment.descriptor.segment_id}
        assert len({k[0] for k in moved}) >= 2
        raw.wait_for(lambda: moved <= raw.arrival.keys(), "the segments moved into cdc_raw")
        assert not any(name.endswith("_cdc.idx") for name in h.segment_files())
        # The active segment is still in commitlog/: nothing of it may be published yet.
        active = h.node.active_segment.descriptor.segment_id
        raw.poll(0.3)
        assert not any(r.segment_id == active for r in raw.records)
        h.node.close()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)
    assert {r.commitlog_version for r in raw.records} == {6}
    assert not list((h.state_dir / "quarantine").iterdir())
    raw.close()


# --- the _cdc.idx file ----------------------------------------------------------------------------------

def count_unreadable_idx_reads(monkeypatch: pytest.MonkeyPatch,
                               label: Callable[[Path], str]) -> collections.Counter[str]:
    """Counts, by ``label(path)``, the agent's reads of an idx file that exists but cannot be used."""
    unreadable = collections.Counter[str]()
    read_index = progress_module.read_cdc_index

    def spying(path: Path) -> Any:
        result = read_index(path)
        if result is None and path.exists():
            unreadable[label(path)] += 1
        return result
    monkeypatch.setattr(progress_module, "read_cdc_index", spying)
    return unreadable


def test_unreadable_idx_is_retried_never_misread(harness: MakeHarness,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An idx caught empty, half-written or garbled is read again; nothing past the real offset is published,
    and a truncated ``COMPLETED`` does not complete the segment."""
    h = harness(segment_size=1024 * 1024)
    unreadable = count_unreadable_idx_reads(monkeypatch, lambda path: path.read_text(errors="replace"))

    h.write(60, sync_every=30)
    segment = h.node.active_segment
    index_path = h.cdc_raw / segment.path.name.replace(".log", "_cdc.idx")
    durable = int(index_path.read_text())
    with running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the synced changes")
        # More data, synced into the segment file (markers, fsync) but not yet announced by the idx.
        h.write(60, sync_every=None)
        segment.sync()
        for garbage in ("", "garbage", str(durable) + "\nCOMPLE", "\n" + str(durable), str(durable) + "x"):
            index_path.write_text(garbage)  # what a reader sees between Cassandra's truncate and write
            wait_until(lambda seen=unreadable[garbage], text=garbage: unreadable[text] >= seen + 2,
                       f"the agent to read idx {garbage!r} twice")
            raw.poll(0.05)
            beyond = [r for r in raw.records if r.position > durable]
            assert not beyond, f"published past the durable offset {durable} with idx {garbage!r}"
            assert index_path.name in h.segment_files() and segment.path.name in h.segment_files()
        h.node.sync()  # Cassandra's next sync rewrites the idx: the rest is published
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes after the idx was repaired")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    raw.close()


def test_newer_segment_waits_while_the_older_idx_is_unreadable(harness: MakeHarness,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The older segment's idx caught mid-rewrite (its final COMPLETED rewrite): the newer segment is not read
    before it, so a partition's changes keep the node's order. (One that stays unreadable for
    stale_segment_seconds: test_agent_damage.)"""
    h = harness(segment_size=16 * 1024)
    unreadable = count_unreadable_idx_reads(monkeypatch, lambda path: path.name)
    older = h.node.active_segment
    while h.node.active_segment is older:
        h.write(20, sync_every=20)
    h.write(20, sync_every=20)  # the newer segment has data and its idx
    older_index = h.cdc_raw / older.path.name.replace(".log", "_cdc.idx")
    completed = older_index.read_text()
    older_index.write_text("")  # Cassandra truncated it and has not written it yet
    with running(h.config()):
        raw = h.raw_reader()
        wait_until(lambda: unreadable[older_index.name] >= 3, "the agent to read the older idx three times")
        raw.poll(0.1)
        assert not any(r.segment_id != older.descriptor.segment_id for r in raw.records), \
            "a newer segment was published while the older one's idx was unreadable"
        older_index.write_text(completed)
        h.node.close()
        raw.wait_for(lambda: raw.has_all(h.expected), "every change")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)


def test_segment_never_completed_by_a_crashed_node_is_read_to_its_end(harness: MakeHarness) -> None:
    """The node died (no COMPLETED) and came back with new segments: once the old segment has been idle for
    ``stale_segment_seconds`` and newer ones have data, it is read to its end and cleaned up."""
    h = harness()
    h.write(150, sync_every=50)
    crashed = h.node.active_segment.path.name
    h.node = SimulatedNode(h.root / "node", "node1", SCHEMA, "4.1", first_segment_id=FIRST_SEGMENT + 100,
                           segment_size=128 * 1024)  # the restarted node, same directories
    h.write(150, sync_every=50)
    with running(h.config(stale_segment_seconds=0.3)):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes of both segments")
        wait_until(lambda: crashed not in h.segment_files(), "the crashed segment cleaned up")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    assert_node_order(raw)
    assert not list((h.state_dir / "quarantine").iterdir())  # its unsynced end is not damage


def test_segments_without_cdc_data_leave_no_state_behind(harness: MakeHarness) -> None:
    """4.x links every segment; those that never get CDC data lose their link when discarded. The agent
    neither waits for them nor keeps their positions once they are gone."""
    h = harness(segment_size=16 * 1024)
    with running(h.config()):
        raw = h.raw_reader()
        for i in range(600):  # several segments of a non-CDC table only
            h.insert("ks.audit", id=i, v="x" * 20)
            if i % 20 == 0:
                h.node.sync()
                time.sleep(0.002)
        h.write(200)
        h.node.close()
        assert h.node.active_segment is None and len({k[0] for k in h.expected}) >= 1
        raw.wait_for(lambda: raw.has_all(h.expected), "every change")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        wait_until(lambda: not saved_positions(h.state_dir), "no position left for segments that are gone")
    assert_published_exactly(raw, h.expected)


@pytest.mark.parametrize("text, offset, completed", [
    ("4096\n", 4096, False), ("4096\nCOMPLETED\n", 4096, True), ("4096\r\nCOMPLETED\r\n", 4096, True)])
def test_idx_file_ending_with_a_line_break_is_read(tmp_path: Path, text: str, offset: int,
                                                   completed: bool) -> None:
    """``echo 4096 > x_cdc.idx`` writes a trailing newline: the offset is read, not retried as mid-rewrite."""
    path = tmp_path / "CommitLog-7-1_cdc.idx"
    path.write_text(text, newline="")
    index = read_cdc_index(path)
    assert index is not None and (index.offset, index.completed) == (offset, completed)


# --- acknowledgements without a report per record -------------------------------------------------------

def test_a_record_produce_refuses_is_one_line_naming_it(broker: EmbeddedBroker) -> None:
    """librdkafka refuses a record larger than the producer's message.max.bytes in ``produce()`` itself
    (MSG_SIZE_TOO_LARGE): the publisher raises ``DeliveryFailed`` with one line naming the record as the agent
    describes it, its size and Kafka's reason, where a ``KafkaException`` escaped before."""
    topic = f"refused-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(broker.bootstrap_servers, 64 * 1024 * 1024, {"message.max.bytes": 10_000},
                          describe_record=lambda topic, key, value: f"the record {key.decode()} of {topic}")
    try:
        publisher.ensure_topics({topic: (1, False)})
        with pytest.raises(DeliveryFailed) as refused:
            publisher.publish(topic, b"k1", b"x" * 20_000, None)
    finally:
        publisher.close()
    line = str(refused.value)
    assert line.startswith(f"Kafka refused the record k1 of {topic}, 20,002 bytes: ")
    assert "Message size too large" in line and "\n" not in line

def test_deliveries_know_every_record_acknowledged_from_a_few_reports(broker: EmbeddedBroker) -> None:
    """Records go to the partition librdkafka's own partitioner picks for their key (as bootstrap's records do);
    only some report their delivery, yet once sealed and delivered every watermark taken reads as covered, and
    none does before Kafka has every record sent before it."""
    topic = f"deliveries-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(broker.bootstrap_servers, 64 * 1024 * 1024)
    publisher.ensure_topics({topic: (5, False)})
    latency = LatencyHistogram((1.0,))
    deliveries = Deliveries(publisher, latency)
    keys = [f"key{i % 300}".encode() for i in range(3000)]
    watermarks = []
    for i, key in enumerate(keys):
        assert deliveries.send(topic, key, b"v%d" % i, lambda: False)
        if i % 100 == 0:
            watermarks.append(deliveries.watermark())
    watermarks.append(deliveries.watermark())
    assert watermarks[-1] and sum(watermarks[-1]) == len(keys), "one sequence number per record"
    assert publisher.flush(30) == 0
    publisher.poll(0)
    assert not deliveries.covers(watermarks[-1]), "each partition's newest record is held, not yet sent"
    assert deliveries.seal(lambda: False)
    assert publisher.flush(30) == 0
    publisher.poll(0)
    assert all(map(deliveries.covers, watermarks))
    reports = sum(latency.counts)
    assert 5 <= reports <= 3000 // MARKER_INTERVAL + 5 * 2, reports  # markers, plus one per partition when sealed

    # The same key → partition mapping as librdkafka's default partitioner.
    default = Producer({"bootstrap.servers": broker.bootstrap_servers})
    picked: dict[bytes, int] = {}
    for key in set(keys):
        default.produce(topic, b"x", key, on_delivery=lambda error, message: picked.__setitem__(message.key(),
                                                                                              message.partition()))
    default.flush(30)
    reader = TopicReader(broker, topic)
    wait_until(lambda: reader.poll() >= 0 and len(reader.messages) == len(keys) + len(picked), "the records")
    ours = {m.key(): m.partition() for m in reader.messages if m.value() != b"x"}
    assert ours == picked
    reader.close()
    default.close()


# --- truncations ------------------------------------------------------------------------------------------

def test_a_truncation_is_published_to_every_partition_once_after_the_writes_it_covers(
        harness: MakeHarness) -> None:
    """The truncations the node has at the agent's first start are not published; a later one of a
    published table goes to each raw partition once the node's writes up to its commit log position are
    read, between them and the later writes in every partition (read in the same pass), and never again,
    after a restart too; an unpublished table's never."""
    h = harness()
    users, audit = SCHEMA.table("ks", "users").id, SCHEMA.table("ks", "audit").id
    node = NodeTruncations(Truncation(users, 1, 10, 1_000))  # there before the agent

    def with_node(agent: Agent) -> None:
        agent.truncations = TruncationWatch(agent.config, agent.positions, node)  # type: ignore[arg-type]
    config = h.config()
    h.write(40)
    h.node.sync()
    with running(config, with_node) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the writes")
        h.write(10, sync_every=None)
        segment, position = h.insert("ks.users", id=1, name="covered")
        h.write(5, sync_every=None)  # after the truncation: not synced yet, so nothing of these is read
        node.truncations = [Truncation(table, segment, position, 2_000) for table in (users, audit)]
        time.sleep(1.5)  # the agent polls the node's truncations every second
        raw.poll()
        assert not raw.truncations, "published before the writes it covers were read"
        h.node.sync()
        raw.wait_for(lambda: sum(map(len, raw.truncations.values())) == 3, "the truncation in each partition")
        wait_until(lambda: agent.positions.truncations == {str(users): 2_000, str(audit): 2_000}, "recorded")
    assert sorted(raw.truncations) == [0, 1, 2]
    later = 0
    for partition, [(after, truncation)] in raw.truncations.items():
        assert truncation == TruncationRecord("node1", users.bytes, segment, position, 2_000)
        covered = [(r.segment_id, r.position) <= (segment, position) for r in raw.by_partition[partition]]
        assert all(covered[:after]) and not any(covered[after:]), f"partition {partition} out of order"
        later += len(covered[after:])
    assert later, "no write after the truncation"
    with running(config, with_node):
        h.insert("ks.users", id=2, name="after the restart")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the write after the restart")
        time.sleep(1.5)
        raw.poll()
    assert sum(map(len, raw.truncations.values())) == 3
