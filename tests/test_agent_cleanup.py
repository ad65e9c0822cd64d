"""What happens to published segments (cleanup modes), space warnings, ``agent status``, the files the agent
writes."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cassandra_cdc.agent.positions import STATE_FILE
from cassandra_cdc.cli.main import app

import agent_harness
from agent_harness import (
    wait_until, assert_published_exactly, MakeHarness, running, saved_positions, metric)

broker, harness = agent_harness.broker, agent_harness.harness  # fixtures: a broker per module


# --- cleanup, space, status ---------------------------------------------------------------------------------

def test_cleanup_archive(tmp_path: Path, harness: MakeHarness) -> None:
    """``archive`` moves a segment and its idx once COMPLETED and acknowledged; the live one stays."""
    h = harness(segment_size=16 * 1024)
    archive = tmp_path / "archive"
    with running(h.config(cleanup__mode="archive", cleanup__archive_dir=str(archive))):
        raw = h.raw_reader()
        h.write(600, sync_every=20)
        h.node.sync()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        live = h.node.active_segment.path.name
        wait_until(lambda: h.segment_files() == [live, live.replace(".log", "_cdc.idx")], "completed ones archived")
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the last one archived")
    segments = {k[0] for k in h.expected}
    archived = sorted(p.name for p in archive.iterdir())
    assert len(archived) == 2 * len(segments)
    for name in archived:
        if name.endswith("_cdc.idx"):
            assert (archive / name).read_text().endswith("\nCOMPLETED")
    assert_published_exactly(raw, h.expected)
    raw.close()


def test_cleanup_command_runs_after_completion_and_is_retried(tmp_path: Path, harness: MakeHarness) -> None:
    """``command`` gets {segment} and {index} of a COMPLETED, acknowledged segment; the files are deleted only
    when it exits 0; a failure is retried."""
    h = harness(segment_size=1024 * 1024)
    copies = tmp_path / "copies"
    copies.mkdir()
    # Fails the first time for each segment, copies both files the second time.
    command = (f"name=$(basename {{segment}}); if [ -e {copies}/$name.tried ]; then cp {{segment}} {{index}} "
               f"{copies}/; else touch {copies}/$name.tried; exit 3; fi")
    h.write(300)
    with running(h.config(cleanup__mode="command", cleanup__command=command, poll_interval_ms=50)):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        live = h.node.active_segment.path.name
        assert not list(copies.iterdir()), "the command ran on a segment Cassandra had not COMPLETED"
        h.node.close()
        wait_until(lambda: not h.segment_files(), "the command to succeed and the files to be deleted")
    assert sorted(p.name for p in copies.iterdir()) == sorted([live, live + ".tried",
                                                              live.replace(".log", "_cdc.idx")])
    assert (copies / live.replace(".log", "_cdc.idx")).read_text().endswith("COMPLETED")
    raw.close()


def test_cdc_total_space_warning(harness: MakeHarness, caplog: pytest.LogCaptureFixture) -> None:
    """The agent warns when cdc_raw goes over space_warning_percent of cdc_total_space, and says when it is
    back under."""
    caplog.set_level(logging.INFO, logger="cassandra_cdc")
    h = harness(segment_size=1024 * 1024)  # a plain segment takes its whole size at once
    h.write(50)

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records
                if r.name == "cassandra_cdc.agent.space_watch" and r.levelno == logging.WARNING]
    with running(h.config(cdc_total_space_mb=16, commitlog_segment_size_mb=1,
                          space_warning_percent=5)) as agent:
        warning = wait_until(warnings, "the space warning")
        assert warning[0].getMessage().startswith("cdc_raw holds 1.0 MiB, 6% of cdc_total_space (16 MiB)")
        assert metric(agent, "cassandra_cdc_agent_cdc_raw_usage_ratio") == 1 / 16
        h.node.close()
        wait_until(lambda: any("back under 5%" in r.getMessage() for r in caplog.records), "the all-clear")
    assert len(warnings()) == 1


def test_agent_status(tmp_path: Path, harness: MakeHarness) -> None:
    """``agent status`` shows per segment the durable offset, COMPLETED, acknowledged position and lag."""
    h = harness(segment_size=16 * 1024)
    h.write(400, sync_every=20)
    h.node.sync()
    with running(h.config(cleanup__mode="keep")):
        raw = h.raw_reader()
        raw.wait_for(lambda: raw.has_all(h.expected), "the changes")
        wait_until(lambda: all(p["completed"] for s, p in saved_positions(h.state_dir).items()
                               if s != h.node.active_segment.descriptor.segment_id)
                   and len(saved_positions(h.state_dir)) == len({k[0] for k in h.expected}), "positions saved")
        raw.close()
    h.write(10, sync_every=None)
    h.node.sync()  # new durable data the agent has not seen: lag
    live = h.node.active_segment
    durable = int((h.cdc_raw / live.path.name.replace(".log", "_cdc.idx")).read_text())
    acknowledged = saved_positions(h.state_dir)[live.descriptor.segment_id]["position"]
    assert acknowledged < durable

    runner = CliRunner()
    result = runner.invoke(app, ["agent", "status", "--config", str(h.config_file())], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = status_rows(result.output)
    assert set(rows) == {name for name in h.segment_files() if name.endswith(".log")}
    for name, cells in rows.items():
        if name == live.path.name:
            assert cells == [str(durable), "writing", str(acknowledged), str(durable - acknowledged), "in progress"]
        else:
            assert cells[1:] == ["COMPLETED", cells[0], "0", "published"]
    # Without a configuration file, and before the agent ever ran: nothing acknowledged.
    result = runner.invoke(app, ["agent", "status", "--cdc-raw", str(h.cdc_raw), "--state-dir", str(tmp_path / "none")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = status_rows(result.output)
    assert rows and all(cells[2] == "-" and cells[4] == "in progress" for cells in rows.values())
    # A mistyped directory: one line that names it.
    missing = tmp_path / "no-such-cdc_raw"
    result = runner.invoke(app, ["agent", "status", "--cdc-raw", str(missing), "--state-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"error: {missing} is not a directory" in result.output


def test_agent_status_until_drained(harness: MakeHarness) -> None:
    """``agent status --until-drained``, once the node has stopped, waits until the agent has published
    everything the node made durable, its last segment never COMPLETED (as a node decommissioned leaves it):
    exit 1 naming the segments left when its timeout passes first, 0 once they are published."""
    h = harness(segment_size=16 * 1024)
    h.write(100, sync_every=20)
    h.node.sync()
    last = h.node.active_segment.path.name
    command = ["agent", "status", "--config", str(h.config_file(cleanup__mode="keep")), "--until-drained"]
    runner = CliRunner()
    result = runner.invoke(app, [*command, "--timeout", "0.5"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "not drained after 0 s: " in result.output and last in result.output
    with running(h.config(cleanup__mode="keep")):
        result = runner.invoke(app, [*command, "--timeout", "60"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"drained: the agent has published everything Cassandra made durable in {h.cdc_raw}" in result.output
    rows = status_rows(result.output)
    assert rows[last][1:] == ["writing", rows[last][0], "0", "in progress"]
    assert all(cells[1:] == ["COMPLETED", cells[0], "0", "published"]
               for name, cells in rows.items() if name != last)


def status_rows(output: str) -> dict[str, list[str]]:
    """The table ``agent status`` prints: segment -> the other cells."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0].endswith(".log"):
            rows[cells[0]] = cells[1:]
    return rows


# --- what the agent says and writes -----------------------------------------------------------------------


def test_files_the_agent_writes_are_private_whatever_the_umask(harness: MakeHarness) -> None:
    """Under umask 000: the state directory and the quarantine 0700, positions and quarantined bytes 0600."""
    h = harness()
    _, first_end = h.insert("ks.users", id=1, name="damaged")
    h.write(50)
    segment = h.node.active_segment.path.name
    h.node.close()
    with open(h.cdc_raw / segment, "r+b") as f:  # the first entry's last body byte: its CRC fails
        f.seek(first_end - 5)
        byte = f.read(1)
        f.seek(first_end - 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    previous = os.umask(0)
    try:
        with running(h.config()):
            wait_until(lambda: not h.segment_files(), "the segment published")
            wait_until(lambda: (h.state_dir / STATE_FILE).exists(), "the positions saved")
    finally:
        os.umask(previous)
    quarantine = h.state_dir / "quarantine"
    written = (h.state_dir / STATE_FILE, *quarantine.iterdir())  # positions, the entry's report and bytes
    files = {path.name: stat.S_IMODE(path.stat().st_mode) for path in written}
    assert len(files) == 3 and set(files.values()) == {0o600}, files
    assert [stat.S_IMODE(path.stat().st_mode) for path in (h.state_dir, quarantine)] == [0o700, 0o700]


def test_agent_status_with_a_corrupt_state_file_says_so_in_one_line(harness: MakeHarness) -> None:
    h = harness()
    h.state_dir.mkdir()
    (h.state_dir / STATE_FILE).write_text('{"version": 1, "segments": {"1000": ')
    result = CliRunner().invoke(app, ["agent", "status", "--cdc-raw", str(h.cdc_raw),
                                      "--state-dir", str(h.state_dir)])
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {h.state_dir / STATE_FILE}: unreadable agent state")
