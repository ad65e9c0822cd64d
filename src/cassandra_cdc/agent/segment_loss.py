"""Segments that leave cdc_raw before the agent has published them: each one an error line and a count.

Cassandra removes a segment's files from cdc_raw when the agent has cleaned it up, when the segment never held
CDC data (its link goes when the node discards it; no idx file was ever written for it), and, with
``cdc_block_writes: false`` (4.1+), when cdc_raw is full: the node then deletes its oldest segments, published
or not, and says so only at DEBUG. That last case loses changes, and only the agent can tell.

The agent knows of every segment it has seen whether it holds CDC data (its idx file; a 3.x segment is moved
in with data), how far the node made it durable and how far Kafka acknowledged it (``SegmentProgress``, kept
in positions.json). So:

* a segment known to hold CDC data that leaves before it is published completely is **lost**;
* a segment id the agent never saw (a gap after the newest id it had seen), or a segment it saw without CDC
  data and did not look at again before it left (the agent was stopped or paused), is **unseen**: it may have
  held changes, but the node also removes segments that held none, so these are reported and counted apart.
  With ``cdc_block_writes: true`` the node deletes no segment holding CDC data, and never links the segments
  it creates while cdc_raw is full: unseen segments then held none.

A node numbers its segments one after another from the clock's milliseconds at its start (Cassandra's
``CommitLogSegment`` id base), so an id greater than the time the agent saw its newest one comes from a later
start of the node, and the ids in between were never segments.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from ..commitlog.segment_descriptor import parse_segment_name
from .agent_metrics import AgentMetrics
from .cdc_raw import CdcSegment
from .node_settings import NodeSettings
from .positions import NewestSegment, PositionStore

log = logging.getLogger(__name__)

# A segment seen without CDC data that leaves cdc_raw within this long of the agent's last look at it left
# while the agent was looking (the node discarded it); later, the agent was not looking (stopped, paused).
UNWATCHED_SECONDS = 3.0
# How many of the possibly affected tables an error line names.
TABLES_NAMED = 10

REMEDY = ("to recover their changes, load the affected tables again with `cassandra-cdc bootstrap` from a "
          "snapshot of the nodes (docs/operations.md, \"Segments lost before they were published\")")


@dataclass(frozen=True)
class LostSegment:
    """A segment that held CDC data and left cdc_raw before Kafka acknowledged all of it."""
    file: str
    acknowledged: int  # the position up to which Kafka acknowledged its records
    durable: int | None  # the offset its idx file said was durable when the agent last read it
    completed: bool  # whether that idx said COMPLETED

    @property
    def bytes_known_lost(self) -> int:
        return max(0, (self.durable or 0) - self.acknowledged)

    def describe(self) -> str:
        """What of it never reached Kafka, as far as the agent knows."""
        published = f"Kafka has its changes up to position {self.acknowledged}"
        if self.durable is None:
            return f"{published}; how far the node had made it durable is not known"
        if self.completed:
            return (f"{published} of the {self.durable} the node made durable: {self.bytes_known_lost} bytes "
                    "of changes never reached Kafka")
        if self.bytes_known_lost == 0:
            return (f"{published}, all the node had made durable when the agent last read its idx; the node "
                    "wrote more to it after that, and those changes never reached Kafka")
        return (f"{published} of the {self.durable} the node had made durable when the agent last read its "
                "idx, and the node wrote more to it after that: the changes after that position never "
                "reached Kafka")


@dataclass
class Findings:
    """What one look at cdc_raw found gone, and the newest segment id it saw."""
    lost: list[LostSegment] = field(default_factory=list)
    # ids never seen ("A", "A..B"), files seen without CDC data
    unseen: list[str] = field(default_factory=list)
    unseen_count: int = 0
    newest: NewestSegment | None = None

    def add_unseen(self, name: str, count: int = 1) -> None:
        self.unseen.append(name)
        self.unseen_count += count

    def __bool__(self) -> bool:
        return bool(self.lost or self.unseen_count)


class SegmentsLost(RuntimeError):
    """Segments left cdc_raw unpublished and ``segment_loss`` is 'stop': the agent stops until accepted."""


class LossWatch:
    """Reports, counts and (with ``segment_loss: stop``) stops on what left cdc_raw unpublished.

    ``node``: the node's settings (whether it deletes unpublished segments); ``published_tables``: the names
    of the tables the agent publishes, every one of which a lost segment may have held changes of."""

    def __init__(self, positions: PositionStore, metrics: AgentMetrics, stop_on_loss: bool,
                 node: Callable[[], NodeSettings], published_tables: Callable[[], list[str]]) -> None:
        self._positions = positions
        self._metrics = metrics
        self._stop_on_loss = stop_on_loss
        self._node = node
        self._published_tables = published_tables

    # --- what is gone ------------------------------------------------------------------------------

    def look(self, segments: list[CdcSegment]) -> Findings:
        """The segment ids after the newest one the agent had seen that cdc_raw lacks (4.0+: a 3.x node moves
        in only the segments that hold CDC data), counted within one start of the node."""
        findings = Findings()
        newest = self._positions.newest_segment
        newer = sorted(segment.segment_id for segment in segments if segment.version >= 7
                       and (newest is None or segment.segment_id > newest.segment_id))
        if not newer:
            return findings
        findings.newest = NewestSegment(newer[-1], int(time.time() * 1000))
        if newest is not None:
            previous = newest.segment_id
            for segment_id in newer:
                if segment_id > newest.seen_at_ms:
                    log.info("the node started again since the agent last looked at cdc_raw (segment ids "
                             "jump from %d to %d): segments it wrote before that start and removed are not "
                             "counted", previous, segment_id)
                    break
                if segment_id > previous + 1:
                    gap = segment_id - previous - 1
                    findings.add_unseen(f"id {previous + 1}" if gap == 1
                                        else f"ids {previous + 1}..{segment_id - 1}", gap)
                previous = segment_id
        return findings

    def vanished_since_saved(self, listed: set[int], findings: Findings) -> None:
        """At start: add to ``findings`` the saved segments no longer in cdc_raw that were not published
        completely."""
        for segment_id, saved in sorted(self._positions.segments.items()):
            if segment_id in listed or saved.completed:
                continue
            named = parse_segment_name(saved.file)
            if saved.durable is not None or (named is not None and named[0] == 6):
                findings.lost.append(LostSegment(saved.file, saved.position, saved.durable, completed=False))
            else:
                findings.add_unseen(saved.file)

    # --- saying it ----------------------------------------------------------------------------------

    def report(self, findings: Findings, at_start: bool, accepted: bool) -> None:
        """Log and count what was found; raise ``SegmentsLost`` when ``segment_loss`` is 'stop' and the loss
        is not ``accepted``."""
        node = self._node()
        tables = self._published_tables()
        affected = ", ".join(tables[:TABLES_NAMED]) + (f" and {len(tables) - TABLES_NAMED} more"
                                                       if len(tables) > TABLES_NAMED else "")
        cause = (f"the node deletes its oldest CDC segments when cdc_raw is full (cdc_block_writes is false "
                 f"{node.where})" if not node.cdc_block_writes else
                 f"cdc_block_writes is true {node.where}, so the node deletes no unpublished segment: "
                 "something else removed it")
        for lost in findings.lost:
            log.error("%s left cdc_raw before the agent had published it: %s. Possibly affected: every table "
                      "the agent publishes (%s). Cause: %s; %s", lost.file, lost.describe(),
                      affected or "none", cause, REMEDY)
            self._metrics.segments_lost.inc()
            self._metrics.bytes_lost.inc(lost.bytes_known_lost)
        if findings.unseen_count:
            self._metrics.segments_unseen.inc(findings.unseen_count)
            where = "while it was stopped" if at_start else "before the agent looked at them"
            if node.cdc_block_writes:
                log.info("%d segment(s) left cdc_raw %s (%s): with cdc_block_writes true %s they held no CDC "
                         "data", findings.unseen_count, where, ", ".join(findings.unseen), node.where)
            else:
                log.error("%d segment(s) left cdc_raw %s (%s): the node removes the segments that held no "
                          "CDC data, and deletes the oldest unpublished ones when cdc_raw is full "
                          "(cdc_block_writes is false %s); if these held changes of %s, those are lost: %s",
                          findings.unseen_count, where, ", ".join(findings.unseen), node.where,
                          affected or "no table", REMEDY)
        loses_changes = findings.lost or (findings.unseen_count and not node.cdc_block_writes)
        if loses_changes and self._stop_on_loss and not accepted:
            raise SegmentsLost("segments left cdc_raw before they were published (the errors above name "
                               "them); segment_loss is 'stop': start the agent with --accept-segment-loss "
                               "(or set accept_segment_loss: true once) to go on past this loss, or set "
                               "segment_loss: continue")

    def settle(self, findings: Findings, listed: set[int]) -> None:
        """Once reported and gone on past: the saved positions of segments gone are dropped, and the newest id
        seen is kept. (Until then, a restart finds the same loss again.)"""
        for segment_id in self._positions.segments.keys() - listed:
            self._positions.forget(segment_id)
        if findings.newest is not None:
            self._positions.newest_segment = findings.newest
