"""Damage the agent cannot publish: dead letters for damaged entries and sections, segments kept whole.

A damaged entry or section goes to the errors topic and, with its bytes, to the quarantine directory; the
segment is read on. A segment some of whose bytes were neither published nor quarantined on their own (a
header or section it cannot read, framing it cannot follow) is never cleaned up: once finished, it is moved
whole into the quarantine directory.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Callable

from ..commitlog import Damage
from ..commitlog.segment_reader import DamageKind
from .agent_config import AgentConfig
from .agent_metrics import AgentMetrics
from .cdc_raw import CdcSegment, move_files
from .deliveries import Deliveries
from .positions import private_directory, write_private
from .segment_progress import SegmentProgress

log = logging.getLogger(__name__)

# Damage after which bytes of the segment are neither published nor quarantined on their own (the rest of a
# section or of the segment is given up): the segment is kept whole.
WHOLE_SEGMENT_DAMAGE = frozenset(DamageKind) - {
    DamageKind.ENTRY_CRC_MISMATCH, DamageKind.UNDECODABLE_MUTATION, DamageKind.SEGMENT_ID_MISMATCH}


class Quarantine:
    def __init__(self, config: AgentConfig, deliveries: Deliveries, metrics: AgentMetrics) -> None:
        self.config = config
        self.directory = private_directory(config.quarantine)
        self._deliveries = deliveries
        self._metrics = metrics

    def dead_letter(self, segment: CdcSegment, damage: Damage, should_stop: Callable[[], bool]) -> bool:
        """A damaged entry or section: to the errors topic and the quarantine directory. False if stopped
        while Kafka's queue was full (the report may not be queued)."""
        self._metrics.errors.labels(damage.kind.name.lower()).inc()
        log.error("%s", damage)
        where = damage_position(damage)
        report = {"node": self.config.node_id, "segment": segment.path.name, "segment_id": segment.segment_id,
                  "section": damage.section, "file_offset": damage.file_offset, "position": damage.position,
                  "kind": damage.kind.name, "reason": f"{damage.kind.value}: {damage.detail}",
                  "raw": base64.b64encode(damage.raw).decode()}
        if damage.kind in WHOLE_SEGMENT_DAMAGE:
            report["kept_whole_in"] = str(self.directory / segment.path.name)
        stem = f"{segment.path.name}@{where}"
        write_private(self.directory / f"{stem}.json", json.dumps(report, indent=1).encode())
        if damage.raw:
            write_private(self.directory / f"{stem}.bin", damage.raw)
        return self._deliveries.send(self.config.errors_topic, stem.encode(), json.dumps(report).encode(),
                                     should_stop)

    def short_of_index(self, progress: SegmentProgress, end: int, durable: int) -> None:
        """The segment ends before the offset its idx file says Cassandra made durable: bytes are missing."""
        if not progress.damaged:
            progress.damaged = True
            log.warning("%s ends at position %d, short of the %d its idx file says Cassandra made durable: "
                        "the segment is kept whole in %s", progress.segment.path, end, durable,
                        self.directory)

    def keep_whole(self, segment: CdcSegment, files: list[Path]) -> None:
        """Move a finished segment that could not be read completely (and its idx) into the quarantine."""
        move_files(files, self.directory)
        self._metrics.segments_quarantined.inc()
        log.error("%s could not be read completely (its damage is on %s): moved whole into %s; to read "
                  "it again, move it and its idx file back into %s", segment.path.name,
                  self.config.errors_topic, self.directory, self.config.cdc_raw)


def damage_position(damage: Damage) -> int:
    """Where a damage is, as a position in the segment (the file offset when it has no logical position)."""
    return damage.position if damage.position is not None else damage.file_offset
