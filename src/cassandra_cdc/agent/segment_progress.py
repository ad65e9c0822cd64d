"""How far the agent has read each segment, and how far Kafka has acknowledged it."""

from __future__ import annotations

import time
from collections import defaultdict, deque

from ..commitlog.segment_reader import DamageKind
from .cdc_raw import CdcSegment
from .deliveries import Deliveries, Watermark


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
        self.resume: tuple[int, int, int] | None = None  # where the sections read so far end (SegmentReader)
        self.changed_at = time.monotonic()
        self.reported: set[tuple[DamageKind, int]] = set()  # damage sent to the dead letters (kind, where)
        self.unreadable_since: float | None = None  # since when its idx has been read unreadable, in a row
        self.unreadable_logged = False
        self._deliveries = deliveries
        self._published = published
        self._checkpoints: deque[tuple[int, Watermark, dict[str, int]]] = deque()

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

    def _advance(self) -> None:
        """Move over the checkpoints Kafka has acknowledged: when asked, not per delivery."""
        checkpoints = self._checkpoints
        while checkpoints and self._deliveries.covers(checkpoints[0][1]):
            self._acknowledged, _, sent = checkpoints.popleft()
            for table, count in sent.items():
                self._published[table] += count
