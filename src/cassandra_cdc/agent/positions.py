"""The agent's durable position: per segment, the logical position up to which Kafka has everything (and the
durable offset the node's idx gave last); per partition of the raw topic, the highest offset Kafka
acknowledged for the agent's own records; per table, the node's last truncation published; the newest segment
id the agent has seen in cdc_raw, and when (``segment_loss.py``).

Saved by write-temp + fsync + rename (+ fsync of the directory), so a crash at any moment leaves either
the old or the new file, never a torn one. What the agent writes is its own: files 0600, directories 0700,
whatever the umask.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_FILE = "positions.json"
STATE_VERSION = 1


@dataclass
class SegmentPosition:
    file: str
    position: int  # every entry ending at or before this is acknowledged by Kafka
    completed: bool = False  # the whole segment has been read (and is acknowledged up to position)
    # Some bytes were neither published nor quarantined on their own: it is kept whole, never cleaned up.
    damaged: bool = False
    # The offset its idx file said was durable when last read; None: no idx seen (no CDC data, as far
    # as known).
    durable: int | None = None


@dataclass(frozen=True)
class NewestSegment:
    """The newest segment id the agent has seen in cdc_raw, and when it first saw it (ms since the epoch)."""
    segment_id: int
    seen_at_ms: int


class StateError(RuntimeError):
    """The positions cannot be saved (a full or read-only state_dir); the message says what to do."""


def private_directory(path: Path) -> Path:
    """Create a directory only the agent's user can read (0700 whatever the umask)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write a file only the agent's user can read (0600 whatever the umask); a partial file is removed."""
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        raise


def replace_durably(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` (a private file): write a temporary file, fsync it, rename it
    over ``path``, fsync the directory. Raises OSError."""
    temp = path.with_suffix(".tmp")
    write_private(temp, text.encode())
    os.replace(temp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class PositionStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        private_directory(state_dir)
        self.segments: dict[int, SegmentPosition] = {}
        # Per topic, per partition: the highest offset Kafka acknowledged (files of older agents have none).
        self.acknowledged_offsets: dict[str, dict[int, int]] = {}
        # Per table id: the time (ms) of the node's last truncation of it that is published (or was there
        # before the agent); None until the node's truncations are first read.
        self.truncations: dict[str, int] | None = None
        self.newest_segment: NewestSegment | None = None
        self._saved: str | None = None
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"state version {data.get('version')} is not {STATE_VERSION}")
            self.segments = {int(k): SegmentPosition(**v) for k, v in data["segments"].items()}
            self.acknowledged_offsets = {topic: {int(p): int(o) for p, o in offsets.items()}
                                         for topic, offsets in data.get("acknowledged_offsets", {}).items()}
            truncations = data.get("truncations")
            self.truncations = (None if truncations is None
                                else {str(table): int(ms) for table, ms in truncations.items()})
            newest = data.get("newest_segment")
            self.newest_segment = None if newest is None else NewestSegment(int(newest["id"]),
                                                                            int(newest["seen_at_ms"]))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{self.path}: unreadable agent state ({error}); move it away to start over") from error
        self._saved = self._serialize()

    def get(self, segment_id: int) -> SegmentPosition | None:
        return self.segments.get(segment_id)

    def set(self, segment_id: int, file: str, position: int, completed: bool = False,
            damaged: bool = False, durable: int | None = None) -> None:
        self.segments[segment_id] = SegmentPosition(file, position, completed, damaged, durable)

    def forget(self, segment_id: int) -> None:
        self.segments.pop(segment_id, None)

    def acknowledge(self, topic: str, offsets: dict[int, int]) -> None:
        """Raise the topic's acknowledged offsets to these (per partition)."""
        saved = self.acknowledged_offsets.setdefault(topic, {})
        for partition, offset in offsets.items():
            if offset > saved.get(partition, -1):
                saved[partition] = offset

    def _serialize(self) -> str:
        state: dict[str, object] = {"version": STATE_VERSION,
                                    "segments": {str(k): _position_fields(v)
                                                 for k, v in sorted(self.segments.items())}}
        offsets = {topic: {str(p): o for p, o in sorted(by_partition.items())}
                   for topic, by_partition in sorted(self.acknowledged_offsets.items()) if by_partition}
        if offsets:
            state["acknowledged_offsets"] = offsets
        if self.truncations is not None:
            state["truncations"] = dict(sorted(self.truncations.items()))
        if self.newest_segment is not None:
            state["newest_segment"] = {"id": self.newest_segment.segment_id,
                                       "seen_at_ms": self.newest_segment.seen_at_ms}
        return json.dumps(state, indent=1)

    def save(self) -> bool:
        """Write the state durably if it changed; return whether it was written."""
        text = self._serialize()
        if text == self._saved:
            return False
        try:
            replace_durably(self.path, text)
        except OSError as error:
            raise StateError(f"{self.path}: cannot save the agent's positions ({error.strerror or error}): "
                             f"free space in (or fix the permissions of) {self.path.parent}") from None
        self._saved = text
        return True


def _position_fields(position: SegmentPosition) -> dict[str, object]:
    """A segment's saved fields, ``durable`` only when known: most segments a node links hold no CDC data."""
    fields = asdict(position)
    if position.durable is None:
        del fields["durable"]
    return fields
