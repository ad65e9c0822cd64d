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
                                      bool(saved and saved.completed)))
    return statuses
