"""How far the agent has read each segment, how far Kafka has acknowledged it, and how far its idx file lets
the agent read."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict, deque

from ..commitlog.segment_reader import DamageKind
from .cdc_raw import CdcIndex, CdcSegment, read_cdc_index
from .deliveries import Deliveries, Watermark
from .segment_loss import LostSegment

log = logging.getLogger(__name__)


def have_data(segments: list[CdcSegment]) -> bool:
    """Whether any of these (4.0+) segments holds CDC data: the node has written its idx file."""
    return any(segment.index_path.exists() for segment in segments)


class SegmentProgress:
    """How far one segment is read and how far Kafka has acknowledged it.

    Between the two lie checkpoints, oldest first: ``(position, watermark, sent)``, taken as reading goes
    (``checkpoint``). Once Kafka has acknowledged everything up to a checkpoint's watermark, the segment is
    acknowledged up to its position, and the records sent since the checkpoint before (``sent``: how many per
    table) count as published.
    """

    def __init__(self, segment: CdcSegment, acknowledged: int, deliveries: Deliveries,
                 published: defaultdict[str, int], completed: bool = False, damaged: bool = False) -> None:
        self.segment = segment
        self._acknowledged = acknowledged
        self.read_position = acknowledged  # every entry before it is published (its records queued)
        self.read_all = completed
        self.damaged = damaged  # bytes neither published nor quarantined: kept whole, never cleaned up
        self.index_offset: int | None = None
        self.index_completed = False
        self.resume: tuple[int, int, int] | None = None  # where the sections read so far end (SegmentReader)
        self.changed_at = time.monotonic()
        self.reported: set[tuple[DamageKind, int]] = set()  # damage sent to the dead letters (kind, where)
        self.unreadable_since: float | None = None  # since when its idx has been read unreadable, in a row
        self.unreadable_logged = False
        self.last_seen = time.monotonic()  # the agent's last look at cdc_raw that found it there
        self._deliveries = deliveries
        self._published = published
        self._checkpoints: deque[tuple[int, Watermark, dict[str, int]]] = deque()
        # Durable offsets as the agent saw them grow, with when each was made durable (the idx file's write,
        # time.time()), oldest first: for the lag. A 3.x segment is durable whole (offset: infinity).
        self._durable: deque[tuple[float, float]] = deque()

    def checkpoint(self, sent: dict[str, int]) -> None:
        """Mark the read position: it is acknowledged once every record sent so far is (``sent`` of them since
        the previous checkpoint, per table)."""
        self._checkpoints.append((self.read_position, self._deliveries.watermark(), sent))

    @property
    def acknowledged(self) -> int:
        """The position up to which every record is acknowledged."""
        self._advance()
        return self._acknowledged

    @property
    def done(self) -> bool:
        self._advance()
        return self.read_all and not self._checkpoints

    @property
    def holds_data(self) -> bool:
        """Whether the segment holds CDC data: its idx file was seen (4.0+), or it is a 3.x segment (moved in
        with data)."""
        return self.index_offset is not None or self.segment.version == 6

    def lost(self) -> LostSegment:
        """What is lost of the segment, gone from cdc_raw now."""
        return LostSegment(self.segment.path.name, self.acknowledged, self.index_offset, self.index_completed)

    def readable_extent(self, newer: list[CdcSegment],
                        stale_seconds: float) -> tuple[int | None, bool] | None:
        """(limit, final) for the next read of the segment, or None when there is nothing to read yet.

        A None limit reads to the end of the segment.
        """
        segment = self.segment
        index = self.note_durable()
        if index is None:
            if segment.index_path.exists():
                return self._unreadable_index(newer, stale_seconds)
            if segment.version == 6:
                return None, True  # Cassandra 3.x moves a segment in once it is complete
            return None  # 4.0+: no CDC data in this segment (yet)
        if index.completed:
            # Read to the end whatever the offset: a segment Cassandra replayed after a crash gets the file's
            # length as its offset, short of its positions when it is compressed (they are uncompressed ones).
            return None, True
        if time.monotonic() - self.changed_at >= stale_seconds and have_data(newer):
            log.warning("%s was never COMPLETED (the node restarted?) and newer segments have data: "
                        "reading it to its end", segment.path.name)
            return None, True
        return index.offset, False

    def _unreadable_index(self, newer: list[CdcSegment], stale_seconds: float) -> tuple[None, bool] | None:
        """An idx read mid-rewrite is normal: it is read again on the next pass. One still unreadable after
        ``stale_seconds`` while newer segments have data is damaged (the node writes the newest segments
        only): the segment is read to its end, as Cassandra's replay reads segments (it never reads idx
        files). Without newer data, it holds back every newer segment: said once."""
        now = time.monotonic()
        if self.unreadable_since is None:
            self.unreadable_since = now
        unreadable_for = now - self.unreadable_since
        if unreadable_for < stale_seconds:
            return None
        unreadable = (f"{self.segment.index_path} has been unreadable for {unreadable_for:.0f} s "
                      "(not '<offset>' or '<offset>\\nCOMPLETED')")
        if have_data(newer):
            log.error("%s and newer segments have data: reading it to its end", unreadable)
            return None, True
        if not self.unreadable_logged:
            self.unreadable_logged = True
            log.error("%s: this segment and every newer one wait until it is readable", unreadable)
        return None

    def note_durable(self) -> CdcIndex | None:
        """Read the idx file, noting a new durable offset; the index, or None when there is none (yet)."""
        segment = self.segment
        index = read_cdc_index(segment.index_path)
        if index is not None:
            self.index_completed = index.completed
        if index is not None and index.offset != self.index_offset:
            self.index_offset = index.offset
            self.changed_at = time.monotonic()
            self._note(index.offset, segment.index_path)
        elif index is None and segment.version == 6 and not self._durable and not self.read_all:
            self._note(math.inf, segment.path)
        return index

    def _note(self, offset: float, written: os.PathLike[str]) -> None:
        try:
            self._durable.append((offset, os.stat(written).st_mtime))
        except FileNotFoundError:
            pass  # removed meanwhile: nothing left to publish

    def unacknowledged_since(self) -> float | None:
        """When the oldest durable write of the segment that Kafka has not acknowledged was made durable (as
        far as the agent saw: the idx write that first covered it); None when there is none."""
        if self.done:
            self._durable.clear()
            return None
        durable, acknowledged = self._durable, self.acknowledged
        while durable and durable[0][0] <= acknowledged:
            durable.popleft()
        return durable[0][1] if durable else None

    def _advance(self) -> None:
        """Move over the checkpoints Kafka has acknowledged: when asked, not per delivery."""
        checkpoints = self._checkpoints
        while checkpoints and self._deliveries.covers(checkpoints[0][1]):
            self._acknowledged, _, sent = checkpoints.popleft()
            for table, count in sent.items():
                self._published[table] += count
