"""The agent's Prometheus metrics (one registry per agent, so tests can run several).

The per-record figures (mutations read, records acknowledged, delivery latency) are plain ints that
the agent bumps and the registry reads when scraped: ``Counter.inc`` and ``Histogram.observe`` take a
lock, too much for the per-record path. The counts by table are ``defaultdict(int)``, cheaper to bump
than a ``collections.Counter``.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

DELIVERY_BUCKETS = (.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)


class LatencyHistogram:
    """Observations counted per bucket (upper bounds inclusive, as Prometheus's ``le``)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        counts = list(self.counts)  # one copy: the agent's thread keeps counting while a scrape reads
        buckets, total = [], 0
        for bound, count in zip((*map(floatToGoString, self.bounds), "+Inf"), counts):
            total += count
            buckets.append((bound, total))
        return buckets


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.segments_pending = Gauge("cdc_agent_segments_pending", "Segments in cdc_raw not yet fully published",
                                      registry=r)
        self.bytes_behind = Gauge("cdc_agent_bytes_behind",
                                  "Bytes between the idx offsets and the acknowledged positions", registry=r)
        self.skipped = Counter("cdc_agent_mutations_skipped", "Mutations of unknown tables skipped", registry=r)
        self.errors = Counter("cdc_agent_errors", "Damaged or undecodable entries, by kind", ["kind"], registry=r)
        self.segments_quarantined = Counter(
            "cdc_agent_segments_quarantined", "Segments moved whole into the quarantine: not all bytes read",
            registry=r)
        self.cdc_raw_bytes = Gauge("cdc_agent_cdc_raw_bytes", "Bytes of segments in cdc_raw", registry=r)
        self.cdc_raw_usage = Gauge("cdc_agent_cdc_raw_usage_ratio", "cdc_raw bytes / cdc_total_space", registry=r)
        self.kafka_reachable = Gauge("cdc_agent_kafka_reachable", "1 when Kafka accepts records", registry=r)
        self.kafka_reachable.set(1)
        self.kafka_records_lost = Counter(
            "cdc_agent_kafka_records_lost", "Records Kafka had acknowledged that the raw topic no longer holds "
            "(found at start)", registry=r)
        # Bumped per record by the agent's thread, read at scrape time.
        self.mutations_read: defaultdict[str, int] = defaultdict(int)  # by table
        # acknowledged by Kafka, by table ("errors": dead letters)
        self.records_published: defaultdict[str, int] = defaultdict(int)
        self.delivery_latency = LatencyHistogram(DELIVERY_BUCKETS)
        r.register(_PerRecordCollector(self))

    def serve(self, host: str, port: int) -> None:
        if port:
            start_http_server(port, addr=host, registry=self.registry)


class _PerRecordCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        for name, help_text, tally in (
                ("cdc_agent_mutations_read", "Mutations read, by table", m.mutations_read),
                ("cdc_agent_records_published", "Raw records acknowledged by Kafka, by table", m.records_published)):
            family = CounterMetricFamily(name, help_text, labels=["table"])
            for table, count in sorted(dict(tally).items()):  # dict(): one atomic copy under the GIL
                family.add_metric([table], count)
            yield family
        latency = m.delivery_latency
        family = HistogramMetricFamily("cdc_agent_kafka_delivery_seconds", "Time from produce to acknowledgement")
        family.add_metric([], buckets=latency.cumulative(), sum_value=latency.sum)
        yield family
