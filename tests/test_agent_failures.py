"""Failures: kill -9, SIGTERM, broker outages and restarts, crashes mid-cleanup, positions that cannot be
saved, a broker that lost acknowledged records."""

from __future__ import annotations

import json
import logging
import resource
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import cassandra_cdc.agent.tailer as agent_module
from cassandra_cdc.agent import Agent
from cassandra_cdc.agent.cdc_raw import ChangeNotifier
from cassandra_cdc.agent.positions import STATE_FILE, PositionStore, SegmentPosition
from cassandra_cdc.simulator import EmbeddedBroker
from cassandra_cdc.simulator.broker import free_port

import agent_harness
from full_disk import FILLER, fill, small_filesystem
from agent_harness import (
    CLI, DEADLINE, Harness, wait_until, RawReader, assert_published_exactly, MakeHarness, running,
    AgentProcess, saved_positions, metric)

broker, harness = agent_harness.broker, agent_harness.harness  # fixtures: a broker per module


# --- failures: kill -9, SIGTERM, broker outage ---------------------------------------------------------------

def catch_up(h: Harness, raw: RawReader, config_file: Path, log: Path, write: Callable[[], Any],
             what: str) -> None:
    """Start the agent, ``write`` and shut the node down; the agent publishes every change and deletes every
    segment, then stops cleanly."""
    with AgentProcess(config_file, log) as process:
        write()
        h.node.close()
        raw.wait_for(lambda: raw.has_all(h.expected), what)
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        assert process.terminate() == 0


def test_kill_9_mid_segment_loses_nothing(tmp_path: Path, harness: MakeHarness) -> None:
    """``kill -9`` of the agent while it is inside a live (compressed) segment, twice, with writes going on
    meanwhile: after each restart it resumes from its saved position; every change reaches Kafka."""
    h = harness(compression="LZ4Compressor", segment_size=32 * 1024)
    config_file = h.config_file()
    log = tmp_path / "agent.log"
    raw: RawReader | None = None
    for attempt in range(2):
        with AgentProcess(config_file, log) as process:
            raw = raw or h.raw_reader()
            deadline = time.monotonic() + DEADLINE
            start = len(raw.records)
            # Write until the agent has published part of the live segment, then kill it.
            while True:
                h.write(40, sync_every=20)
                raw.poll(0.02)
                live = h.node.active_segment.descriptor.segment_id
                if len(raw.records) > start and any(r.segment_id == live for r in raw.records[start:]):
                    break
                assert time.monotonic() < deadline, f"the agent published nothing:\n{process.output()[-3000:]}"
            assert (h.state_dir / STATE_FILE).exists(), "positions are saved while running"
            process.kill()
        # The node goes on while the agent is down, at least into a new segment.
        down_in = h.node.active_segment.descriptor.segment_id
        while h.node.active_segment.descriptor.segment_id == down_in:
            h.write(50, sync_every=20)
    assert raw is not None
    catch_up(h, raw, config_file, log, lambda: h.write(300, sync_every=20), "every change after the restarts")
    raw.poll(0.2)
    assert_published_exactly(raw, h.expected, duplicates=True)
    assert len({k[0] for k in h.expected}) >= 3, "each restart resumed into a segment rolled over meanwhile"
    raw.close()


def test_sigterm_finishes_in_flight_saves_position_and_exits_0(tmp_path: Path, harness: MakeHarness) -> None:
    """SIGTERM mid-stream: exit status 0, everything up to the saved positions is in Kafka, and the restarted
    agent continues exactly there (not one record published twice)."""
    h = harness()
    log = tmp_path / "agent.log"
    with AgentProcess(h.config_file(state_flush_ms=60_000), log) as process:  # only the shutdown saves
        raw = h.raw_reader()
        deadline = time.monotonic() + DEADLINE
        while len(raw.records) < 300:  # the node writes, the agent publishes
            h.write(50, sync_every=25)
            raw.poll(0.02)
            assert time.monotonic() < deadline, process.output()[-3000:]
        h.write(50, sync_every=25)  # and more: in flight when SIGTERM comes
        assert process.terminate() == 0
        assert "everything read is acknowledged" in process.output()
    positions = saved_positions(h.state_dir)
    assert positions, "the position was saved on SIGTERM"
    raw.poll(0.5)
    saved = {segment: p["position"] for segment, p in positions.items()}
    first_saved = min(saved)
    must_be_there = {k for k in h.expected if k[0] < first_saved or k[1] <= saved.get(k[0], -1)}
    assert must_be_there, "the agent had published something"
    assert must_be_there <= raw.arrival.keys(), "a change before a saved position is missing from Kafka"

    h.write(100)
    h.node.close()
    with running(h.config()):
        raw.wait_for(lambda: raw.has_all(h.expected), "every change after the restart")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    raw.close()


def published_before_outage(h: Harness, broker: EmbeddedBroker, writes: int) -> None:
    """``writes`` changes written and published by the running agent; then Kafka stops."""
    raw = h.raw_reader()
    h.write(writes)
    raw.wait_for(lambda: raw.has_all(h.expected), "changes before the outage")
    raw.close()
    broker.stop()


def test_broker_stopped_and_restarted_mid_stream(broker: EmbeddedBroker, harness: MakeHarness) -> None:
    """Kafka goes away while the node writes: the agent waits (a COMPLETED segment is kept, not cleaned up
    unacknowledged), reports Kafka unreachable, and publishes everything once Kafka is back."""
    h = harness(segment_size=32 * 1024)
    with running(h.config()) as agent:
        published_before_outage(h, broker, 200)
        try:
            first_down = h.node.active_segment.path.name
            h.write(600, sync_every=20)  # rolls over: first_down is COMPLETED while Kafka is away
            assert h.node.active_segment.path.name != first_down
            wait_until(lambda: metric(agent, "cassandra_cdc_agent_kafka_reachable") == 0,
                       "Kafka reported unreachable")
            time.sleep(0.5)  # several passes of the agent: it must keep the completed segment
            assert first_down in h.segment_files(), "a segment was cleaned up before Kafka acknowledged it"
        finally:
            broker.start()
        h.write(200)
        h.node.close()
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "every change after the outage")
        wait_until(lambda: not h.segment_files(), "every segment published and deleted")
        wait_until(lambda: metric(agent, "cassandra_cdc_agent_kafka_reachable") == 1,
                   "Kafka reported reachable")
        raw.poll(0.2)
    # The idempotent producer resends in order: no loss; copies would be tolerated by the contract.
    assert_published_exactly(raw, h.expected, duplicates=True)
    raw.close()


def test_agent_started_while_kafka_is_down_waits_for_it(broker: EmbeddedBroker, harness: MakeHarness) -> None:
    """No Kafka at startup: the agent reports it unreachable and waits; it publishes once Kafka is there."""
    h = harness()
    h.write(200)
    broker.stop()
    try:
        with running(h.config()) as agent:
            wait_until(lambda: metric(agent, "cassandra_cdc_agent_kafka_reachable") == 0,
                       "Kafka reported unreachable")
            broker.start()
            raw = h.raw_reader()
            raw.wait_for(lambda: raw.has_all(h.expected), "the changes once Kafka is back")
            assert metric(agent, "cassandra_cdc_agent_kafka_reachable") == 1
    finally:
        broker.start()
    raw.poll(0.2)
    assert_published_exactly(raw, h.expected)


def librdkafka_threads() -> set[int]:
    """The ids of this process's threads that librdkafka started (named ``rdk:...``), whichever client."""
    threads = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().startswith("rdk:"):
                threads.add(int(task.name))
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return threads


def assert_clients_closed(started_before: set[int]) -> None:
    """No librdkafka thread started since ``started_before`` is left. The tests keep the stopped agent
    referenced, as its caller may: a client it left open would keep its connections to the brokers (and its
    retries and log lines once they go) for as long as the agent object lives."""
    wait_until(lambda: not librdkafka_threads() - started_before, "the agent's Kafka clients closed", 10)


def test_stopped_agent_leaves_no_kafka_client_behind(harness: MakeHarness) -> None:
    """Once ``run`` returns, the agent's producer and admin client are closed: their threads are gone."""
    h = harness()
    h.write(100)
    before = librdkafka_threads()
    with running(h.config()) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        raw.close()
        assert librdkafka_threads() - before, "the agent's clients run while it does"
    assert_clients_closed(before)
    assert agent.not_ready() == "stopping"  # the stopped agent, still referenced, says so


def test_agent_not_started_leaves_no_kafka_client_behind(harness: MakeHarness) -> None:
    """Its metrics port taken, the agent does not start (status 2), and the producer made with it is
    closed."""
    h = harness()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        before = librdkafka_threads()
        agent = Agent(h.config(metrics__host="127.0.0.1", metrics__port=taken.getsockname()[1]))
        assert agent.run() == 2
    assert_clients_closed(before)


def test_agent_stopped_while_kafka_is_away_drops_its_queue_and_publishes_it_after_restart(
        broker: EmbeddedBroker, harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped while Kafka is away with records queued, the agent stops (after its bounded wait for them)
    instead of waiting for Kafka forever, leaves no Kafka client behind, and publishes those records after
    its restart."""
    monkeypatch.setattr(agent_module, "SHUTDOWN_FLUSH_SECONDS", 1.0)
    h = harness()
    before = librdkafka_threads()
    try:
        with running(h.config()) as agent:
            published_before_outage(h, broker, 100)
            h.write(100)
            wait_until(lambda: agent.publisher.in_flight, "records queued while Kafka is away")
        assert_clients_closed(before)
    finally:
        broker.start()
    with running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "every change after the restart")
    raw.poll(0.2)
    assert_published_exactly(raw, h.expected, duplicates=True)


class Crash(BaseException):
    """The agent process dying at a chosen point."""


def test_crash_between_cleanup_steps_is_finished_on_restart(harness: MakeHarness,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent dies right after deleting the first file of a published segment: the restarted agent
    finishes the cleanup (nothing left behind in cdc_raw) without publishing the segment again."""
    h = harness()
    h.write(200)
    h.node.close()
    unlink = Path.unlink

    def crashing(path: Path, missing_ok: bool = False) -> None:
        unlink(path, missing_ok=missing_ok)
        if path.parent == h.cdc_raw:
            raise Crash(path.name)
    monkeypatch.setattr(Path, "unlink", crashing)
    with pytest.raises(Crash), running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        wait_until(lambda: len(h.segment_files()) < 2, "the cleanup to start")
    monkeypatch.setattr(Path, "unlink", unlink)
    with running(h.config()):
        wait_until(lambda: not h.segment_files(), "the cleanup finished")
        wait_until(lambda: not saved_positions(h.state_dir), "the segment forgotten")
        raw.poll(0.3)
    assert_published_exactly(raw, h.expected)


# --- what the agent says and writes -----------------------------------------------------------------------


def test_kafka_unreachable_is_said_in_one_line(harness: MakeHarness) -> None:
    """While nothing answers at the bootstrap servers, the agent says so once; librdkafka's retries (several
    failed connections a second, a new admin client at each startup attempt) stay out of its output."""
    h = harness()
    config_file = h.config_file(kafka__bootstrap_servers=f"127.0.0.1:{free_port()}")
    with AgentProcess(config_file, h.root / "agent.log") as agent:
        wait_until(lambda: "unreachable" in agent.output(), "Kafka reported unreachable")
        time.sleep(2 * agent_module.STARTUP_KAFKA_TIMEOUT_SECONDS)  # two more attempts to reach it
        assert agent.terminate() == 0
    lines = agent.output().splitlines()
    assert len([line for line in lines if "unreachable" in line]) == 1, lines
    assert not [line for line in lines if line.startswith("%")], lines


def limit_file_size() -> None:
    """In the child process: regular files cannot grow past a few bytes (as on a full disk, writes fail)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def test_positions_that_cannot_be_saved_stop_the_agent_with_one_line(harness: MakeHarness) -> None:
    """A write to state_dir failing (no space, file size limit) leaves no temporary file behind and stops the
    agent with one line naming positions.json and what to do, not a traceback."""
    h = harness()
    h.write(100)
    command = [str(CLI), "agent", "--config", str(h.config_file())]
    result = subprocess.run(command, preexec_fn=limit_file_size, capture_output=True, text=True,
                            timeout=DEADLINE)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert f"{h.state_dir / STATE_FILE}: cannot save the agent's positions" in errors[0]
    assert "free space in" in errors[0]
    assert sorted(path.name for path in h.state_dir.iterdir()) == ["quarantine"]
    assert len(h.segment_files()) == 2  # nothing cleaned up without its completion saved


def test_stopping_while_cdc_raw_changes_logs_no_error(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The watcher of cdc_raw stopped while a change arrives (as when the agent stops on an error while the
    node writes): no error line besides the agent's own (watchdog reports that race as an error)."""
    with caplog.at_level(logging.ERROR):
        for attempt in range(100):
            notifier = ChangeNotifier(tmp_path)
            notifier.start()
            (tmp_path / f"CommitLog-8-{attempt}.log").write_bytes(b"")
            notifier.stop()
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


def test_only_a_change_of_cdc_raw_wakes_the_agent_not_its_own_reads(tmp_path: Path) -> None:
    """Reading an idx file (as the agent does after each wake-up) must not wake the agent again: at a node's
    pace that was thousands of wake-ups a second with nothing new. Rewriting it, as the node does, must."""
    index = tmp_path / "CommitLog-8-1_cdc.idx"
    index.write_text("0")
    notifier = ChangeNotifier(tmp_path)
    notifier.start()
    try:
        notifier.wait(0.5)  # anything of the setup
        assert index.read_text() == "0"
        assert not notifier.wait(1.0), "a read of cdc_raw woke the agent"
        index.write_text("4096")
        assert notifier.wait(5.0), "a rewritten idx did not wake the agent"
        notifier.wait(0.5)
        (tmp_path / "CommitLog-8-2.log").write_bytes(b"")
        assert notifier.wait(5.0), "a new segment did not wake the agent"
        notifier.wait(0.5)
        (tmp_path / "CommitLog-8-2.log").unlink()
        assert notifier.wait(5.0), "a segment removed did not wake the agent"
    finally:
        notifier.stop()


def lose_the_last_batches(broker: EmbeddedBroker, topic: str) -> int:
    """Stop the broker and take from each partition of a topic its last record batch, as a broker restarted
    without what it had acknowledged would; return how many records are gone."""
    broker.stop()
    saved = broker.data_dir / "kafka.json"
    state = json.loads(saved.read_text())
    lost = 0
    for name, data in state["topics"]:
        for _, partition in data["partitions"] if name == topic else ():
            batches = partition["record_batches"]
            if len(batches) < 2:
                continue
            first_lost = batches.pop()[0]
            count = partition["high_watermark"] - first_lost
            partition["high_watermark"] = first_lost
            # The producer's last sequence as the remaining batches leave it (and its last batch's offset).
            partition["producer_seqs"] = [[producer, [sequence - count, batches[-1][0]]]
                                          for producer, (sequence, _) in partition["producer_seqs"]]
            lost += count
    saved.write_text(json.dumps(state))
    broker.start()
    return lost


def test_broker_that_lost_acknowledged_records_stops_the_agent_with_one_line(
        broker: EmbeddedBroker, harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """Kafka comes back without records it had acknowledged: the idempotent producer's next request fails for
    good (OUT_OF_ORDER_SEQUENCE_NUMBER). The agent stops with one error line saying so, exit status 1, no
    traceback, and saves no position past what it had saved before."""
    h = harness()
    agent = Agent(h.config())
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(status=agent.run()), daemon=True)
    thread.start()
    try:
        raw = h.raw_reader()
        for _ in range(10):  # several batches per partition
            h.write(20, sync_every=20)
            raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        raw.close()
        segment = h.node.active_segment.descriptor.segment_id
        read = max(position for (segment_id, position, _) in h.expected if segment_id == segment)
        wait_until(lambda: saved_positions(h.state_dir).get(segment, {}).get("position") == read,
                   "the position saved")
        with caplog.at_level(logging.INFO):
            assert lose_the_last_batches(broker, h.raw_topic) > 0
            h.write(100)
            thread.join(DEADLINE)
    finally:
        agent.stop()
        thread.join(DEADLINE)
    assert outcome == {"status": 1}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "Kafka lost records it had acknowledged" in errors[0], errors
    assert not any("everything read is acknowledged" in r.getMessage() for r in caplog.records)
    assert saved_positions(h.state_dir)[segment]["position"] == read


def test_agent_restarted_after_the_broker_lost_acknowledged_records_stops_with_one_line(
        broker: EmbeddedBroker, harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """The broker loses records it had acknowledged while the agent is stopped: the restarted agent stops with
    one error line naming the raw topic, each partition, where it ends and the offset Kafka had acknowledged,
    and exit status 1. With ``kafka.accept_lost_records`` it counts the records gone and carries on; the next
    start, the offsets acknowledged since saved, finds nothing missing."""
    h = harness()
    with running(h.config()):
        raw = h.raw_reader()
        for _ in range(10):  # several batches per partition
            h.write(20, sync_every=20)
            raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        raw.close()
    acknowledged = json.loads((h.state_dir / STATE_FILE).read_text())["acknowledged_offsets"][h.raw_topic]
    lost = lose_the_last_batches(broker, h.raw_topic)
    assert lost > 0
    caplog.set_level(logging.INFO)

    agent = Agent(h.config())
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(status=agent.run()), daemon=True)
    thread.start()
    thread.join(DEADLINE)
    agent.stop()
    thread.join(DEADLINE)
    assert outcome == {"status": 1}
    errors = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.ERROR and r.name.startswith("cassandra_cdc")]
    assert len(errors) == 1, errors
    assert "Kafka lost records it had acknowledged" in errors[0] and h.raw_topic in errors[0]
    for partition, offset in acknowledged.items():
        assert f"partition {partition} ends at offset " in errors[0]
        assert f"acknowledged this agent's record at offset {offset}" in errors[0]
    assert f"({lost} records gone at least" in errors[0]
    assert "run bootstrap for the affected tables" in errors[0] and "min.insync.replicas" in errors[0]
    assert "kafka.accept_lost_records" in errors[0]
    assert "tailing" not in caplog.text

    caplog.clear()
    with running(h.config(kafka__accept_lost_records=True)) as agent:
        wait_until(lambda: "tailing" in caplog.text, "the agent started")
        assert metric(agent, "cassandra_cdc_agent_kafka_records_lost_total") == lost
        raw = h.raw_reader()
        before = set(h.expected)
        h.write(50)
        raw.wait_for(lambda: h.expected.keys() - before <= raw.arrival.keys(), "the changes written after the loss")
    assert any("carrying on (kafka.accept_lost_records)" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)
    caplog.clear()
    with running(h.config()) as agent:
        wait_until(lambda: "tailing" in caplog.text, "the agent started again")
        assert metric(agent, "cassandra_cdc_agent_kafka_records_lost_total") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "lost" in r.getMessage()]


def test_positions_saved_by_an_older_agent_are_read(tmp_path: Path) -> None:
    """A state file without acknowledged offsets (an agent from before they were kept) is read as it was."""
    (tmp_path / STATE_FILE).write_text('{"version": 1, "segments": {"1000": {"file": "CommitLog-7-1000.log", '
                                       '"position": 42, "completed": false, "damaged": false}}}')
    positions = PositionStore(tmp_path)
    assert positions.get(1000) == SegmentPosition("CommitLog-7-1000.log", 42)
    assert positions.acknowledged_offsets == {}


def test_a_full_state_dir_stops_the_agent_with_one_line_and_a_restart_after_space_returns_loses_nothing(
        tmp_path: Path, harness: MakeHarness) -> None:
    """state_dir on a small filesystem of its own, filled while the agent runs: the agent stops (exit status
    1) with one line naming positions.json; the file is the last one saved, whole, and nothing else is left
    in state_dir. Once space returns, the restarted agent publishes every change; only what came after the
    last saved position is published twice."""
    h = harness()
    with small_filesystem(h.state_dir):
        h.write(100)
        log = tmp_path / "agent.log"
        with AgentProcess(h.config_file(), log) as process:
            raw = h.raw_reader()
            raw.wait_for(lambda: raw.has_all(h.expected), "the changes written before the disk fills")
            wait_until(lambda: saved_positions(h.state_dir), "the positions saved")
            filler = fill(h.state_dir)
            saved = (h.state_dir / STATE_FILE).read_text()
            h.write(100)
            status = process.process.wait(DEADLINE)
        assert status == 1, process.output()
        output = process.output()
        assert "Traceback" not in output, output
        errors = [line for line in output.splitlines() if " ERROR " in line]
        assert len(errors) == 1, output
        assert f"{h.state_dir / STATE_FILE}: cannot save the agent's positions (No space left on device)" \
            in errors[0]
        assert (h.state_dir / STATE_FILE).read_text() == saved
        assert sorted(path.name for path in h.state_dir.iterdir()) == sorted(
            ["quarantine", FILLER, STATE_FILE])
        last_saved = {int(segment): position["position"]
                      for segment, position in json.loads(saved)["segments"].items()}
        filler.unlink()
        catch_up(h, raw, h.config_file(), log, lambda: h.write(50), "every change after the restart")
    raw.poll(0.2)
    assert_published_exactly(raw, h.expected, duplicates=True)
    twice = [key for key, copies in raw.keys().items() if copies > 1]
    assert all(position > last_saved.get(segment, 0) for segment, position, _ in twice), twice
