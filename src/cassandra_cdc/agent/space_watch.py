"""How full cdc_raw is, against the point where the node acts on it (``NodeSettings.action_point``): it then
rejects writes to CDC tables, or deletes its oldest segments (``cdc_block_writes: false``)."""

from __future__ import annotations

import logging

from .agent_metrics import AgentMetrics
from .node_settings import MIB, NodeSettings

log = logging.getLogger(__name__)


class SpaceWatch:
    def __init__(self, warning_percent: int, metrics: AgentMetrics) -> None:
        self._warning_percent = warning_percent
        self._metrics = metrics
        self._warned = False

    def check(self, used: int, node: NodeSettings) -> None:
        """Update the space metrics from ``used`` (the bytes of cdc_raw's segments); warn once when cdc_raw
        goes over ``space_warning_percent`` of cdc_total_space or comes within one segment of the node's
        action point, and say when it is back under."""
        total = node.cdc_total_space
        headroom = node.action_point - used
        self._metrics.cdc_raw_bytes.set(used)
        self._metrics.cdc_raw_usage.set(used / total)
        self._metrics.cdc_raw_headroom.set(headroom)
        over = used * 100 >= total * self._warning_percent or headroom <= node.commitlog_segment_size
        if over == self._warned:
            return
        self._warned = over
        if over:
            log.warning("cdc_raw holds %.1f MiB, %.0f%% of cdc_total_space (%d MiB): the node %s once it "
                        "holds %d MiB (cdc_total_space minus one %d MiB segment); publishing must catch up",
                        used / MIB, used * 100 / total, total // MIB, node.describe_action(),
                        node.action_point // MIB, node.commitlog_segment_size // MIB)
        else:
            log.info("cdc_raw back under %d%% of cdc_total_space, %.1f MiB before the node acts",
                     self._warning_percent, headroom / MIB)
