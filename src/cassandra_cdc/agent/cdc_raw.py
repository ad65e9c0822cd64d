"""What is in a node's ``cdc_raw`` directory: segments, their ``_cdc.idx`` files, and change notifications.

Cassandra 3.x moves whole segments in; 4.0+ hard-links live segments and rewrites ``<segment>_cdc.idx``
(``<offset>`` then ``\\nCOMPLETED``) at every sync, truncating and writing in place — so an idx file
can be read empty or half-written, and such a read is retried, never interpreted.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (FileClosedEvent, FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent,
                             FileSystemEvent, FileSystemEventHandler)
from watchdog.observers import Observer

from ..commitlog.segment_descriptor import cdc_index_file_name, parse_segment_name
from ..commitlog.segment_reader import SegmentReader

# A line break may end the file (as ``echo`` writes one): the offset is whole once one follows it.
_INDEX = re.compile(r"([0-9]+)(\r?\nCOMPLETED)?\r?\n?")


@dataclass(frozen=True)
class CdcSegment:
    segment_id: int
    version: int
    path: Path

    @property
    def index_path(self) -> Path:
        return self.path.with_name(cdc_index_file_name(self.version, self.segment_id))


@dataclass(frozen=True)
class CdcIndex:
    offset: int
    completed: bool


def list_segments(cdc_raw: Path) -> list[CdcSegment]:
    """The segments in ``cdc_raw``, oldest first."""
    segments = []
    for path in cdc_raw.iterdir():
        named = parse_segment_name(path.name)
        if named is not None:
            segments.append(CdcSegment(named[1], named[0], path))
    return sorted(segments, key=lambda s: s.segment_id)


def read_cdc_index(path: Path) -> CdcIndex | None:
    """The idx file's content, or None when it is absent or caught mid-rewrite (read it again later)."""
    try:
        text = path.read_text(encoding="ascii")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    match = _INDEX.fullmatch(text)
    if match is None:
        return None
    return CdcIndex(int(match.group(1)), match.group(2) is not None)


def bytes_missing(reader: SegmentReader, durable: int, completed: bool) -> bool:
    """Whether a segment read to its end stopped short of the offset its idx file says is ``durable``.

    A COMPLETED segment may end before that offset at one of Cassandra's markers: the replay of a segment
    after a crash rewrites its idx with the file's length (the unused rest of the segment included), COMPLETED.
    It is short when the file ends first (a file cut short), or, uncompressed, when the offset is past the
    file's end (its positions are the file's offsets).
    """
    if not reader.finished or reader.position >= durable:
        return False
    replayed = completed and reader.ended_at_marker and (durable <= reader.file_size or not reader.plain)
    return not replayed


def cdc_raw_bytes(cdc_raw: Path) -> int:
    """Space the directory takes, as Cassandra counts it against cdc_total_space (segments only)."""
    total = 0
    for path in cdc_raw.iterdir():
        if parse_segment_name(path.name):
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
    return total


def move_files(files: list[Path], directory: Path) -> None:
    """Move a segment's files (out of cdc_raw) into a directory."""
    for path in files:
        shutil.move(str(path), directory / path.name)


class _StoppedWhileReading(logging.Filter):
    """watchdog logs an error when its inotify thread is stopped while it waits for an event: the watcher is
    going away then, so no change can be missed, and the only error line must be the agent's own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


logging.getLogger("watchdog.observers.inotify").addFilter(_StoppedWhileReading())


# What wakes the agent: a file created, moved in, written, closed after a write, or removed. Not the opens and
# read-only closes that inotify also reports: the agent's own reads of each ``_cdc.idx`` would wake it again,
# for ever, with nothing new to read.
_CHANGES = [FileCreatedEvent, FileMovedEvent, FileModifiedEvent, FileClosedEvent, FileDeletedEvent]


class ChangeNotifier:
    """Wakes the agent when anything in ``cdc_raw`` changes (inotify), with a polling fallback."""

    def __init__(self, directory: Path) -> None:
        self._changed = threading.Event()
        self._observer = Observer()
        handler = _SetEvent(self._changed)
        self._observer.schedule(handler, str(directory), recursive=False, event_filter=_CHANGES)

    def start(self) -> None:
        self._observer.start()

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)

    def wait(self, timeout: float) -> bool:
        """Wait for a change (or the timeout); return whether one was seen."""
        changed = self._changed.wait(timeout)
        self._changed.clear()
        return changed

    def wake(self) -> None:
        self._changed.set()


class _SetEvent(FileSystemEventHandler):
    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._event.set()
