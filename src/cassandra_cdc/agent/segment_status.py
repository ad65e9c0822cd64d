"""``agent status``: where the agent is in each segment, from its state file and cdc_raw (no agent needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .cdc_raw import list_segments, read_cdc_index
from .positions import PositionStore


@dataclass(frozen=True)
class SegmentStatus:
    segment: str
    durable_offset: int | None  # the _cdc.idx offset (None: no idx, a 3.x segment or no CDC data)
    completed_by_cassandra: bool
    acknowledged: int | None  # the agent's saved position (None: not started)
    published: bool  # completely published (awaiting or past cleanup)
    without_cdc_data: bool = False  # a 4.0+ segment with no idx: Cassandra wrote no CDC data to it (yet)

    @property
    def drained(self) -> bool:
        """Whether nothing of it is left to publish, its node stopped: published whole, or up to the offset
        Cassandra made durable (a node that stops, decommissioned or not drained, leaves its last segments
        without COMPLETED), or a 4.0+ segment without CDC data (no idx)."""
        if self.published:
            return True
        if self.durable_offset is None:
            return self.without_cdc_data
        return not self.completed_by_cassandra and self.lag_bytes == 0

    @property
    def lag_bytes(self) -> int | None:
        if self.durable_offset is None:
            return None
        return max(0, self.durable_offset - (self.acknowledged or 0))


def segment_statuses(cdc_raw: Path, state_dir: Path) -> list[SegmentStatus]:
    positions = PositionStore(state_dir)
    statuses = []
    for segment in list_segments(cdc_raw):
        index = read_cdc_index(segment.index_path)
        saved = positions.get(segment.segment_id)
        statuses.append(SegmentStatus(segment.path.name, index.offset if index else None,
                                      bool(index and index.completed), saved.position if saved else None,
                                      bool(saved and saved.completed),
                                      without_cdc_data=segment.version >= 7 and not segment.index_path.exists()))
    return statuses
