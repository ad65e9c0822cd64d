"""Damaged segments: dead letters and quarantined entries, segments kept whole when bytes cannot be read,
encrypted segments."""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest


from cassandra_cdc.agent.cdc_raw import read_cdc_index
from cassandra_cdc.commitlog.segment_writer import write_cdc_index

import agent_harness
from agent_harness import (
    SCHEMA, ENCRYPTED_SEGMENT, KEYSTORE, wait_until, assert_published_exactly, Harness, MakeHarness,
    running, metric)

broker, harness = agent_harness.broker, agent_harness.harness  # fixtures: a broker per module


# --- damage, unknown tables ---------------------------------------------------------------------------------

def test_damaged_entries_go_to_dead_letters_and_quarantine(harness: MakeHarness) -> None:
    """A bad entry CRC loses that entry, a bad size CRC the rest of its section, an undecodable mutation
    itself: each once to ``<server>.errors`` and the quarantine directory; everything else is published."""
    h = harness(segment_size=1024 * 1024)
    users = SCHEMA.table("ks", "users")
    segment = h.node.active_segment
    positions = [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10)]
    h.node.sync()
    positions += [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10, 20)]
    h.node.sync()
    # Entry 3: a flipped body byte (entry CRC). Entry 14: a flipped size CRC: 14..19 are lost with it.
    # Plain segment: logical positions are file offsets; an entry starts 12 + size bytes before its end.
    sizes = {p: len(h.expected[(segment.descriptor.segment_id, p, users.id)]) + 1 for p in positions}

    def entry_start(i: int) -> int:
        return positions[i] - 12 - sizes[positions[i]]
    with open(segment.path, "r+b") as f:
        f.seek(entry_start(3) + 8 + 5)
        byte = f.read(1)
        f.seek(entry_start(3) + 8 + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.seek(entry_start(14) + 4)
        f.write(b"\xde\xad\xbe\xef")
    damaged_body = None
    lost = [3] + list(range(14, 20))
    for i in lost:
        key = (segment.descriptor.segment_id, positions[i], users.id)
        if i == 3:
            damaged_body = bytearray(b"\x01" + h.expected[key])  # one partition update: count 1, then it
            damaged_body[5] ^= 0xFF
        del h.expected[key]
    # A mutation whose framing is intact but whose content is not: two updates, the second cut short.
    undecodable = b"\x02" + h.expected[(segment.descriptor.segment_id, positions[0], users.id)] + users.id.bytes + b"\x01"

    with running(h.config()) as agent:
        raw = h.raw_reader()
        errors = h.reader(f"{h.server}.errors")
        raw.wait_for(lambda: raw.has_all(h.expected), "the intact changes of the first two sections")
        # The third section is read by a pass that resumes where the first two end.
        undecodable_position = segment.add(undecodable)
        h.insert("ks.users", id=99, name="after the damage")
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the intact changes")
        errors.wait_for(lambda: len(errors.messages) >= 3, "three dead letters")
        # The live segment goes on: later passes must not report the same damage again.
        for i in range(3):
            h.insert("ks.users", id=200 + i, name="later")
            h.node.sync()
            raw.wait_for(lambda: raw.has_all(h.expected), "changes after the damage")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the damaged segment published and moved")
        errors.poll(0.3)
        raw.poll(0.1)
        assert metric(agent, "cassandra_cdc_agent_errors_total", kind="entry_crc_mismatch") == 1
        # The entries after the bad size CRC are in no report: the segment is kept whole.
        assert metric(agent, "cassandra_cdc_agent_segments_quarantined_total") == 1
    assert_published_exactly(raw, h.expected)

    letters = {json.loads(m.value())["kind"]: json.loads(m.value()) for m in errors.messages}
    assert len(errors.messages) == 3, [m.value()[:200] for m in errors.messages]
    assert set(letters) == {"ENTRY_CRC_MISMATCH", "SIZE_CRC_MISMATCH", "UNDECODABLE_MUTATION"}
    crc = letters["ENTRY_CRC_MISMATCH"]
    assert crc["position"] == entry_start(3) and base64.b64decode(crc["raw"]) == bytes(damaged_body)
    assert crc["segment"] == segment.path.name and crc["node"] == "node1"
    assert letters["SIZE_CRC_MISMATCH"]["position"] == entry_start(14)
    assert base64.b64decode(letters["UNDECODABLE_MUTATION"]["raw"]) == undecodable
    assert letters["UNDECODABLE_MUTATION"]["position"] == undecodable_position - 12 - len(undecodable)
    assert [letters[kind]["section"] for kind in ("ENTRY_CRC_MISMATCH", "SIZE_CRC_MISMATCH", "UNDECODABLE_MUTATION")] \
        == [1, 2, 3]
    message_keys = {m.key().decode() for m in errors.messages}
    assert message_keys == {f"{segment.path.name}@{letter['position']}" for letter in letters.values()}
    quarantine = h.state_dir / "quarantine"
    assert (quarantine / segment.path.name).exists()
    assert letters["SIZE_CRC_MISMATCH"]["kept_whole_in"] == str(quarantine / segment.path.name)
    assert "kept_whole_in" not in letters["ENTRY_CRC_MISMATCH"]
    reports = sorted(p.name for p in quarantine.glob("*.json"))
    assert reports == sorted(f"{segment.path.name}@{letter['position']}.json" for letter in letters.values())
    for letter in letters.values():
        stem = f"{segment.path.name}@{letter['position']}"
        assert json.loads((quarantine / f"{stem}.json").read_text())["kind"] == letter["kind"]
        raw_bytes, binary = base64.b64decode(letter["raw"]), quarantine / f"{stem}.bin"
        assert binary.read_bytes() == raw_bytes if raw_bytes else not binary.exists()
    raw.close()
    errors.close()


# --- segments the agent cannot read whole ----------------------------------------------------------------


def quarantined_whole(h: Harness, name: str) -> Path:
    return h.state_dir / "quarantine" / name


def flip_header_crc(path: Path) -> None:
    data = bytearray(path.read_bytes())
    crc_offset = 14 + int.from_bytes(data[12:14], "big")  # version 4, id 8, params length 2, params
    data[crc_offset] ^= 0xFF
    path.write_bytes(bytes(data))


def random_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:64] = bytes(range(7, 71))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [flip_header_crc, random_header])
def test_segment_whose_header_cannot_be_read_is_kept_whole_and_reported(
        harness: MakeHarness, damage: Callable[[Path], None]) -> None:
    """A COMPLETED segment the agent cannot open is neither skipped nor deleted: it is moved, byte for byte
    and with its idx, into the quarantine, named on the errors topic and counted; the next one is read."""
    h = harness(segment_size=32 * 1024)
    h.write(100)
    unreadable = h.node.active_segment
    unreadable_id = unreadable.descriptor.segment_id
    h.write(400)  # rolls over: later segments are readable
    h.node.close()
    assert h.node.active_segment is None or h.node.active_segment.descriptor.segment_id != unreadable_id
    damage(h.cdc_raw / unreadable.path.name)
    original = (h.cdc_raw / unreadable.path.name).read_bytes()
    index = h.cdc_raw / f"{unreadable.path.stem}_cdc.idx"
    index_text = index.read_text()
    expected = {k: v for k, v in h.expected.items() if k[0] != unreadable_id}
    with running(h.config()) as agent:
        raw = h.raw_reader()
        errors = h.reader(f"{h.server}.errors")
        raw.wait_for(lambda: raw.has_all(expected), "the readable segments")
        errors.wait_for(lambda: errors.messages, "the unreadable segment on the errors topic")
        wait_until(lambda: not h.segment_files(), "cdc_raw emptied")
        assert metric(agent, "cassandra_cdc_agent_segments_quarantined_total") == 1
        assert metric(agent, "cassandra_cdc_agent_errors_total", kind="unreadable_header") == 1
        raw.poll(0.2)
    assert_published_exactly(raw, expected)
    assert quarantined_whole(h, unreadable.path.name).read_bytes() == original
    assert quarantined_whole(h, index.name).read_text() == index_text
    letter = json.loads(errors.messages[0].value())
    assert letter["segment"] == unreadable.path.name and letter["kind"] == "UNREADABLE_HEADER"
    assert letter["kept_whole_in"] == str(quarantined_whole(h, unreadable.path.name))


def test_bad_sync_marker_keeps_the_segment_whole(harness: MakeHarness) -> None:
    """Cassandra's reader stops at a sync marker whose CRC fails (it cannot know where the sections after it
    are): the agent publishes what comes before, reports the damage, and moves the segment whole into the
    quarantine instead of deleting the intact entries after the marker with it."""
    h = harness(segment_size=1024 * 1024)
    users = SCHEMA.table("ks", "users")
    segment = h.node.active_segment
    segment_id = segment.descriptor.segment_id
    before = [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10)]
    h.node.sync()
    after = [h.insert("ks.users", id=i, name=f"user{i}")[1] for i in range(10, 20)]
    h.node.sync()
    h.node.close()
    # Plain segment: the second section's marker sits right after the first section's last entry.
    marker = before[-1]
    with open(h.cdc_raw / segment.path.name, "r+b") as f:
        f.seek(marker + 4)
        crc = f.read(1)
        f.seek(marker + 4)
        f.write(bytes([crc[0] ^ 0xFF]))
    original = (h.cdc_raw / segment.path.name).read_bytes()
    for position in after:
        del h.expected[(segment_id, position, users.id)]
    with running(h.config()) as agent:
        raw = h.raw_reader()
        errors = h.reader(f"{h.server}.errors")
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes before the bad marker")
        wait_until(lambda: not h.segment_files(), "cdc_raw emptied")
        errors.wait_for(lambda: errors.messages, "the damage on the errors topic")
        assert metric(agent, "cassandra_cdc_agent_segments_quarantined_total") == 1
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    letter = json.loads(errors.messages[0].value())
    assert letter["kind"] == "BAD_SYNC_MARKER_CRC" and letter["file_offset"] == marker
    assert quarantined_whole(h, segment.path.name).read_bytes() == original
    assert (h.state_dir / "quarantine" / f"{segment.path.stem}_cdc.idx").exists()


def test_idx_offset_past_the_end_of_the_segment_is_reported(harness: MakeHarness,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """An idx file saying more is durable than the segment holds: a warning naming the file, and the segment
    kept whole rather than deleted."""
    h = harness()
    h.write(50)
    segment = h.node.active_segment
    h.node.close()
    size = (h.cdc_raw / segment.path.name).stat().st_size
    (h.cdc_raw / f"{segment.path.stem}_cdc.idx").write_text(f"{size + 4096}\nCOMPLETED")
    with caplog.at_level(logging.WARNING), running(h.config()):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        wait_until(lambda: not h.segment_files(), "cdc_raw emptied")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(segment.path.name in message and str(size + 4096) in message for message in warnings)
    assert quarantined_whole(h, segment.path.name).exists()


def test_encrypted_segment_with_its_key_is_published_and_cleaned_up(harness: MakeHarness) -> None:
    """The real encrypted segment, its keystore given: read to the end and deleted, nothing quarantined."""
    h = harness()
    (h.cdc_raw / ENCRYPTED_SEGMENT.name).write_bytes(ENCRYPTED_SEGMENT.read_bytes())
    # The segment also holds a user table our schema leaves out: skipped at once, not waited for.
    config = h.config(encryption={"keystore": str(KEYSTORE), "keystore_password": "cassandra"},
                      unknown_table_wait_seconds=0)
    with running(config) as agent:
        wait_until(lambda: ENCRYPTED_SEGMENT.name not in h.segment_files(), "the encrypted segment published")
        assert metric(agent, "cassandra_cdc_agent_segments_quarantined_total") == 0
    assert not list((h.state_dir / "quarantine").iterdir())


# --- a torn tail, an idx with garbage, a segment deleted while being read -----------------------------------

def write_sections(h: Harness, sections: int, rows: int = 10, synced: bool = True) -> list[list[int]]:
    """``sections`` sections of ``rows`` inserts each into the active segment (synced: the idx says so, and
    the agent may read them): their positions."""
    positions = []
    for _ in range(sections):
        positions.append([h.insert("ks.users", id=len(h.expected) + i, name="row")[1] for i in range(rows)])
        if synced:
            h.node.sync()
    return positions


def test_torn_tail_of_a_segment_the_node_never_completed_is_reported_and_the_rest_published(
        harness: MakeHarness) -> None:
    """A node crashed while it wrote a (compressed) section: the file ends inside that section and the idx
    still says the end of the section before, never COMPLETED. Once the restarted node writes a newer
    segment, the agent reads the torn one to its end: every intact entry published, the torn tail reported
    with its file and offset, the segment kept whole; the newer segment is published too."""
    h = harness(compression="LZ4Compressor", segment_size=256 * 1024)
    users = SCHEMA.table("ks", "users")
    torn = h.node.active_segment
    write_sections(h, 3)
    durable = read_cdc_index(h.cdc_raw / f"{torn.path.stem}_cdc.idx").offset
    lost = write_sections(h, 1)[0]
    torn_at = (h.cdc_raw / torn.path.name).stat().st_size - 20
    h.node.close()  # the crash: the file cut inside its last section, the idx as it was before that section
    os.truncate(h.cdc_raw / torn.path.name, torn_at)
    write_cdc_index(h.cdc_raw / f"{torn.path.stem}_cdc.idx", durable, completed=False)
    for position in lost:
        del h.expected[(torn.descriptor.segment_id, position, users.id)]
    h.write(50)  # the restarted node's segment
    h.node.close()
    with running(h.config(stale_segment_seconds=0.5)) as agent:
        raw = h.raw_reader()
        errors = h.reader(f"{h.server}.errors")
        raw.wait_for(lambda: raw.has_all(h.expected), "every intact change, of both segments")
        errors.wait_for(lambda: errors.messages, "the torn tail on the errors topic")
        wait_until(lambda: quarantined_whole(h, torn.path.name).exists(), "the torn segment kept whole")
        assert metric(agent, "cassandra_cdc_agent_segments_quarantined_total") == 1
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    letter = json.loads(errors.messages[0].value())
    assert (letter["segment"], letter["kind"]) == (torn.path.name, "SYNC_MARKER_PAST_END")
    assert letter["file_offset"] < torn_at
    assert letter["kept_whole_in"] == str(quarantined_whole(h, torn.path.name))


def test_completed_segment_whose_idx_holds_garbage_does_not_hold_back_the_newer_ones(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """An idx file that stays unreadable (garbage, not a rewrite caught half-way) while newer segments have
    data: after stale_segment_seconds the agent says so naming the file, reads the segment to its end as
    Cassandra's replay would (it never reads the idx), and goes on with the newer segments."""
    h = harness(segment_size=32 * 1024)
    h.write(100)
    garbled = h.node.active_segment
    h.write(400)  # rolls over: newer segments with data
    h.node.close()
    index = h.cdc_raw / f"{garbled.path.stem}_cdc.idx"
    index.write_bytes(b"\x00\xffgarbage\n" * 3)
    with caplog.at_level(logging.WARNING), running(h.config(stale_segment_seconds=0.5)):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes of every segment")
        wait_until(lambda: not h.segment_files(), "cdc_raw emptied")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(index) in errors[0] and "reading it to its end" in errors[0], errors


def test_newest_segment_whose_idx_holds_garbage_is_waited_for_and_said_once(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """An idx that stays unreadable with no newer segment holding data: the node may still be writing that
    segment, so the agent waits for a readable idx, with one error line naming the file."""
    h = harness()
    h.write(50)
    index = h.cdc_raw / f"{h.node.active_segment.path.stem}_cdc.idx"
    index.write_bytes(b"\x00\xffgarbage")
    with caplog.at_level(logging.ERROR), running(h.config(stale_segment_seconds=0.5)):
        def waiting() -> list[str]:
            return [r.getMessage() for r in caplog.records if str(index) in r.getMessage()]
        wait_until(waiting, "the unreadable idx logged")
        time.sleep(1.0)
        assert len(waiting()) == 1 and "wait until it is readable" in waiting()[0], waiting()
        raw = h.raw_reader()
        raw.poll(0.2)
        assert raw.records == []
        h.node.close()  # the node rewrites the idx
        raw.wait_for(lambda: raw.has_all(h.expected), "every change once the idx is readable")
        raw.poll(0.2)
    assert_published_exactly(raw, h.expected)


def test_segment_deleted_while_being_read_is_reported_and_the_newer_ones_published(
        harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """The live segment the agent is tailing removed from cdc_raw (by hand, or a node discarding it): one
    error line naming it, how far it was published and the remedy, and a count; the agent goes on with the
    newer segments."""
    h = harness(segment_size=64 * 1024)
    users = SCHEMA.table("ks", "users")
    removed = h.node.active_segment
    read = write_sections(h, 2)
    with caplog.at_level(logging.ERROR), running(h.config()) as agent:
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the live segment's synced changes")
        unread = write_sections(h, 1, synced=False)[0]  # the agent cannot have read them before the removal
        for path in (h.cdc_raw / removed.path.name, h.cdc_raw / f"{removed.path.stem}_cdc.idx"):
            path.unlink()
        for position in unread:
            del h.expected[(removed.descriptor.segment_id, position, users.id)]
        h.node.close()  # rewrites the removed segment's idx (COMPLETED), as Cassandra does
        h.write(60)  # a newer segment
        h.node.close()
        raw.wait_for(lambda: raw.has_all(h.expected), "the newer segment's changes")
        # The idx the node wrote after the removal is left, alone (the agent reads segments, not idx files).
        leftover = [f"{removed.path.stem}_cdc.idx"]
        wait_until(lambda: h.segment_files() == leftover, "the newer segment published and deleted")
        raw.poll(0.2)
        # The agent looks at every segment in cdc_raw once a second: the loss is counted by then.
        wait_until(lambda: metric(agent, "cassandra_cdc_agent_segments_lost_total") == 1, "the loss counted")
        assert metric(agent, "cassandra_cdc_agent_segments_lost_total") == 1
        assert metric(agent, "cassandra_cdc_agent_segments_unseen_total") == 0
    assert_published_exactly(raw, h.expected)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    published = read[-1][-1]
    assert errors[0].startswith(
        f"{removed.path.name} left cdc_raw before the agent had published it: Kafka has its changes up to "
        f"position {published}, all the node had made durable when the agent last read its idx; the node "
        "wrote more to it after that, and those changes never reached Kafka"), errors
    assert "every table the agent publishes (ks.events, ks.users, other.logs)" in errors[0]
    assert "cassandra-cdc bootstrap" in errors[0]
