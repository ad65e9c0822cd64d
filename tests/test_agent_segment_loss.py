"""Segments that leave cdc_raw before the agent published them (a 4.1+ node with ``cdc_block_writes: false``
deletes its oldest segments when cdc_raw is full): never lost silently. Each is an error line naming what was
lost and the remedy, and a count; the agent goes on (or, with ``segment_loss: stop``, stops until the loss is
accepted). Here on a simulated node that deletes segments as Cassandra does; test_real_cdc_loss.py does the
same on a real node."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import pytest

from cassandra_cdc.agent import Agent
from cassandra_cdc.agent.node_settings import parse_settings
from cassandra_cdc.agent.positions import NewestSegment, PositionStore
from cassandra_cdc.simulator import SimulatedNode

import agent_harness
from agent_harness import (
    AgentProcess, Harness, MakeHarness, SCHEMA, assert_published_exactly, metric, running, saved_positions,
    wait_until)

broker, harness = agent_harness.broker, agent_harness.harness  # fixtures: a broker per module

SEGMENT = 64 * 1024
SEGMENTS_KEPT = 4  # cdc_total_space, in segments


def deleting_node(harness: MakeHarness) -> Harness:
    """A harness whose node deletes its oldest segments once cdc_raw holds more than four."""
    return harness(segment_size=SEGMENT, cdc_total_space=SEGMENTS_KEPT * SEGMENT, cdc_block_writes=False)


def write_segments(h: Harness, segments: int) -> None:
    """Write until the node has started ``segments`` more segments."""
    target = h.node.segments_opened + segments
    while h.node.segments_opened < target:
        h.write(20)


def published_then_lost(h: Harness, published: dict) -> dict:
    """What must be on the raw topic: what the agent published before, and every change of the segments the
    node did not delete."""
    deleted = {int(name.split("-")[2].split(".")[0]) for name in h.node.deleted_for_space}
    return {key: value for key, value in h.expected.items() if key[0] not in deleted or key in published}


def loss_settings(h: Harness, **overrides: object) -> dict[str, object]:
    return {"cdc_block_writes": False, "cdc_total_space_mb": 1, "commitlog_segment_size_mb": 1, **overrides}


def test_segments_deleted_while_the_agent_was_stopped_are_errors_and_counted(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """The agent stops while a segment is half published; the node writes on and deletes it and the segments
    after it. At the next start: an error naming the half-published segment and how far it was published, one
    naming the ids never seen, both with the tables and the remedy; counts; then the rest is published, and a
    second start finds nothing more."""
    h = deleting_node(harness)
    config = h.config(**loss_settings(h))
    h.write(40)
    h.node.sync()
    half_published = h.node.active_segment.path.name
    with running(config):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the first changes")
    published = dict(h.expected)
    write_segments(h, 10)
    h.node.sync()
    assert h.node.deleted_for_space[0] == half_published
    never_seen = h.node.deleted_for_space[1:]
    expected = published_then_lost(h, published)
    with caplog.at_level(logging.INFO), running(config) as agent:
        raw.wait_for(lambda: raw.has_all(expected), "the changes of the segments the node kept")
        assert metric(agent, "cassandra_cdc_agent_segments_lost_total") == 1
        assert metric(agent, "cassandra_cdc_agent_segments_unseen_total") == len(never_seen)
        assert metric(agent, "cassandra_cdc_agent_bytes_lost_total") == 0  # its durable offset was published
    assert_published_exactly(raw, expected)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2, errors
    assert errors[0].startswith(f"{half_published} left cdc_raw before the agent had published it: Kafka has "
                                "its changes up to position "), errors[0]
    first, last = (int(name.split("-")[2].split(".")[0]) for name in (never_seen[0], never_seen[-1]))
    assert errors[1].startswith(f"{len(never_seen)} segment(s) left cdc_raw while it was stopped "
                                f"(ids {first}..{last})")
    for error in errors:
        assert "ks.events, ks.users, other.logs" in error and "cassandra-cdc bootstrap" in error
        assert "cdc_block_writes is false in the agent's configuration" in error
    caplog.clear()
    with caplog.at_level(logging.INFO), running(config) as agent:
        time.sleep(0.5)
        assert metric(agent, "cassandra_cdc_agent_segments_lost_total") == 0
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_segment_loss_stop_keeps_the_agent_stopped_until_the_loss_is_accepted(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """segment_loss: stop. The start that finds the loss exits 1 and leaves the positions as they were, so
    that every start finds it again; a start with accept_segment_loss reports it, counts it and goes on."""
    h = deleting_node(harness)
    h.write(40)
    h.node.sync()
    with running(h.config(**loss_settings(h))):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the first changes")
    published = dict(h.expected)
    saved = (h.state_dir / "positions.json").read_text()
    write_segments(h, 8)
    h.node.sync()
    stopping = h.config(**loss_settings(h, segment_loss="stop"))
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert Agent(stopping).run() == 1
        assert caplog.records[-1].getMessage().startswith("agent stopped: segments left cdc_raw before they "
                                                          "were published"), caplog.records[-1].getMessage()
        assert (h.state_dir / "positions.json").read_text() == saved
    expected = published_then_lost(h, published)
    with running(h.config(**loss_settings(h, segment_loss="stop", accept_segment_loss=True))) as agent:
        raw.wait_for(lambda: raw.has_all(expected), "the changes of the segments the node kept")
        assert metric(agent, "cassandra_cdc_agent_segments_lost_total") == 1
    with running(stopping):
        write_segments(h, 1)
        h.node.sync()
        expected = published_then_lost(h, published)
        raw.wait_for(lambda: raw.has_all(expected), "the changes written since")
    assert_published_exactly(raw, expected)


def test_segments_deleted_while_the_agent_was_paused_are_errors_and_counted(harness: MakeHarness) -> None:
    """The agent's process paused (SIGSTOP) while the node writes and deletes segments, then resumed: the
    segment it was reading and the ones it never saw are error lines and counts, and it publishes the rest."""
    h = deleting_node(harness)
    h.write(40)
    h.node.sync()
    config_file = h.config_file(**loss_settings(h))
    with AgentProcess(config_file, h.root / "agent.log") as process:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the first changes")
        published = dict(h.expected)
        reading = h.node.active_segment.path.name
        process.process.send_signal(signal.SIGSTOP)
        write_segments(h, 10)
        h.node.sync()
        process.process.send_signal(signal.SIGCONT)
        expected = published_then_lost(h, published)
        raw.wait_for(lambda: raw.has_all(expected), "the changes of the segments the node kept")
        assert process.terminate() == 0
    assert_published_exactly(raw, expected)
    output = process.output()
    assert f"ERROR cassandra_cdc.agent.segment_loss: {reading} left cdc_raw before the agent had " \
        "published it" in output, output[-3000:]
    unseen = len(h.node.deleted_for_space) - 1
    assert (f"ERROR cassandra_cdc.agent.segment_loss: {unseen} segment(s) left cdc_raw before the agent "
            "looked at them") in output, output[-3000:]


def test_a_node_restart_between_two_looks_is_no_gap(harness: MakeHarness,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Segment ids start again from the clock's milliseconds when a node starts: the jump is said, not counted
    as segments never seen."""
    h = harness(segment_size=SEGMENT)
    h.write(40)
    h.node.sync()
    with running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the first changes")
    h.node.close()
    h.node = SimulatedNode(h.root / "node", "node1", SCHEMA, "4.1", segment_size=SEGMENT,
                           first_segment_id=int(time.time() * 1000) + 1000)
    h.write(40)
    h.node.sync()
    with caplog.at_level(logging.INFO), running(h.config()) as agent:
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes after the node's restart")
        assert metric(agent, "cassandra_cdc_agent_segments_unseen_total") == 0
    assert any("the node started again since the agent last looked" in r.getMessage() for r in caplog.records)
    assert [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name == "cassandra_cdc.agent.segment_loss"] == []


def test_space_warning_comes_a_segment_before_the_node_acts(harness: MakeHarness,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The node acts (rejects writes, or deletes segments) once cdc_raw plus a new segment exceeds
    cdc_total_space: the warning comes one segment before that, whatever space_warning_percent says, with the
    headroom as a gauge."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    mib = 1024 * 1024
    h = harness(segment_size=mib)  # a plain segment takes its whole size at once
    config = h.config(cdc_total_space_mb=4, commitlog_segment_size_mb=1, space_warning_percent=100,
                      cleanup__mode="keep")
    with running(config) as agent:
        wait_until(lambda: metric(agent, "cassandra_cdc_agent_cdc_raw_headroom_bytes") == 2 * mib,
                   "the headroom of one segment in cdc_raw")
        write_segments(h, 1)
        warning = wait_until(lambda: [r for r in caplog.records if r.levelno == logging.WARNING
                                      and r.name == "cassandra_cdc.agent.space_watch"], "the warning")
        assert metric(agent, "cassandra_cdc_agent_cdc_raw_headroom_bytes") == mib
    assert warning[0].getMessage().startswith(
        "cdc_raw holds 2.0 MiB, 50% of cdc_total_space (4 MiB): the node rejects writes to CDC tables "
        "once it holds 3 MiB"), warning[0]


def test_positions_keep_durable_offsets_where_known_and_the_newest_segment_seen(tmp_path: Path) -> None:
    """positions.json keeps a segment's durable offset only when its idx was seen, and the newest segment id
    seen with when; a file without them (an older agent's) still loads."""
    store = PositionStore(tmp_path)
    store.set(7, "CommitLog-7-7.log", 100, durable=300)
    store.set(8, "CommitLog-7-8.log", 0)
    store.newest_segment = NewestSegment(8, 1_700_000_000_000)
    store.save()
    again = PositionStore(tmp_path)
    assert again.get(7).durable == 300 and again.get(8).durable is None
    assert again.newest_segment == NewestSegment(8, 1_700_000_000_000)
    assert saved_positions(tmp_path) == {7: {"file": "CommitLog-7-7.log", "position": 100, "completed": False,
                                             "damaged": False, "durable": 300},
                                         8: {"file": "CommitLog-7-8.log", "position": 0, "completed": False,
                                             "damaged": False}}
    (tmp_path / "positions.json").write_text('{"version": 1, "segments": {"8": {"file": "CommitLog-7-8.log", '
                                             '"position": 5, "completed": false, "damaged": false}}}')
    older = PositionStore(tmp_path)
    assert older.get(8).durable is None and older.newest_segment is None


@pytest.mark.parametrize("rows, expected", [
    ({"cdc_enabled": "true", "cdc_block_writes": "false", "cdc_total_space": "4MiB",
      "commitlog_segment_size": "1024KiB"}, (True, False, 4 * 2**20, 2**20)),
    ({"cdc_enabled": "false", "cdc_total_space_in_mb": "4096", "commitlog_segment_size_in_mb": "32"},
     # 4.0: the old names, and no cdc_block_writes (it always blocks)
     (False, True, 4096 * 2**20, 32 * 2**20)),
])
def test_node_settings_in_the_names_of_each_cassandra_version(rows: dict[str, str],
                                                             expected: tuple[bool, bool, int, int]) -> None:
    node = parse_settings(rows, "node 127.0.0.1")
    assert (node.cdc_enabled, node.cdc_block_writes, node.cdc_total_space,
            node.commitlog_segment_size) == expected


def test_a_node_setting_that_does_not_parse_names_itself() -> None:
    with pytest.raises(ValueError, match=r"system_views.settings: cdc_total_space = '4 MB' is not a size"):
        parse_settings({"cdc_total_space": "4 MB", "commitlog_segment_size": "1MiB"}, "node 127.0.0.1")
