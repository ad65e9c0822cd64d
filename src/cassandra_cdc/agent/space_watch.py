"""How full cdc_raw is: Cassandra rejects writes to CDC tables once it holds cdc_total_space."""

from __future__ import annotations

import logging

from .agent_config import AgentConfig
from .agent_metrics import AgentMetrics
from .cdc_raw import cdc_raw_bytes

log = logging.getLogger(__name__)


class SpaceWatch:
    def __init__(self, config: AgentConfig, metrics: AgentMetrics) -> None:
        self.config = config
        self._metrics = metrics
        self._warned = False

    def check(self) -> None:
        """Update the space metrics; warn once when cdc_raw goes over ``space_warning_percent``, and say when
        it is back under."""
        used = cdc_raw_bytes(self.config.cdc_raw)
        total = self.config.cdc_total_space_mb * 1024 * 1024
        self._metrics.cdc_raw_bytes.set(used)
        self._metrics.cdc_raw_usage.set(used / total)
        over = used * 100 >= total * self.config.space_warning_percent
        if over != self._warned:
            self._warned = over
            if over:
                log.warning("cdc_raw holds %.0f MiB, %.0f%% of cdc_total_space (%d MiB): Cassandra rejects writes "
                            "to CDC tables when it is full", used / 2**20, used * 100 / total,
                            self.config.cdc_total_space_mb)
            else:
                log.info("cdc_raw back under %d%% of cdc_total_space", self.config.space_warning_percent)
