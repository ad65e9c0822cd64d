"""The agent's Prometheus metrics (one registry per agent, so tests can run several).

The per-record figures (mutations read, records acknowledged, delivery latency) are plain ints that
the agent bumps and the registry reads when scraped: ``Counter.inc`` and ``Histogram.observe`` take a
lock, too much for the per-record path. The counts by table are ``defaultdict(int)``, cheaper to bump
than a ``collections.Counter``.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..observability import component_registry

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


# The key under which ``records_published`` counts the dead letters (damaged entries sent to the errors
# topic): no table's name, and exported as a metric of its own.
DEAD_LETTERS = ""


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = component_registry()
        r = self.registry
        self.segments_pending = Gauge("cassandra_cdc_agent_segments_pending",
                                      "Segments in cdc_raw not yet fully published", registry=r)
        self.behind_bytes = Gauge("cassandra_cdc_agent_behind_bytes",
                                  "Bytes between the idx offsets and the acknowledged positions", registry=r)
        # When the oldest durable write Kafka has not acknowledged was made durable (time.time()); None: none.
        self.unacknowledged_since: float | None = None
        Gauge("cassandra_cdc_agent_lag_seconds",
              "How long the oldest durable write not yet acknowledged by Kafka has been durable (its idx "
              "offset's write); 0 when everything durable is acknowledged",
              registry=r).set_function(self._lag)
        self.skipped = Counter("cassandra_cdc_agent_mutations_skipped", "Mutations of unknown tables skipped",
                               registry=r)
        self.errors = Counter("cassandra_cdc_agent_errors", "Damaged or undecodable entries, by kind",
                              ["kind"], registry=r)
        self.segments_quarantined = Counter(
            "cassandra_cdc_agent_segments_quarantined",
            "Segments moved whole into the quarantine: not all bytes read", registry=r)
        self.cdc_raw_bytes = Gauge("cassandra_cdc_agent_cdc_raw_bytes", "Bytes of segments in cdc_raw",
                                   registry=r)
        self.cdc_raw_usage = Gauge("cassandra_cdc_agent_cdc_raw_usage_ratio",
                                   "cdc_raw bytes / cdc_total_space", registry=r)
        self.cdc_raw_headroom = Gauge(
            "cassandra_cdc_agent_cdc_raw_headroom_bytes",
            "Bytes cdc_raw can still grow by before the node rejects writes to CDC tables (or, with "
            "cdc_block_writes: false, deletes its oldest segments): cdc_total_space minus one segment minus "
            "cdc_raw's bytes", registry=r)
        self.segments_lost = Counter(
            "cassandra_cdc_agent_segments_lost",
            "Segments holding CDC data that left cdc_raw before the agent had published them completely",
            registry=r)
        self.bytes_lost = Counter(
            "cassandra_cdc_agent_bytes_lost",
            "Bytes of those segments known to be unpublished (durable offset minus acknowledged position); "
            "what was written after the agent last read a segment is not known", registry=r)
        self.segments_unseen = Counter(
            "cassandra_cdc_agent_segments_unseen",
            "Segment ids the agent never saw in cdc_raw (removed before it looked): segments that held no "
            "CDC data, or, with cdc_block_writes: false, segments the node deleted unpublished", registry=r)
        self.kafka_reachable = Gauge("cassandra_cdc_agent_kafka_reachable", "1 when Kafka accepts records",
                                     registry=r)
        self.kafka_reachable.set(1)
        self.kafka_records_lost = Counter(
            "cassandra_cdc_agent_kafka_records_lost",
            "Records Kafka had acknowledged that the raw topic no longer holds (found at start)", registry=r)
        self.updates_cut = Counter(
            "cassandra_cdc_agent_updates_cut",
            "Partition updates larger than a record the raw topic takes, published as several records", registry=r)
        # Bumped per record by the agent's thread, read at scrape time.
        self.mutations_read: defaultdict[str, int] = defaultdict(int)  # by table
        # acknowledged by Kafka, by table (DEAD_LETTERS: the dead letters)
        self.records_published: defaultdict[str, int] = defaultdict(int)
        self.delivery_latency = LatencyHistogram(DELIVERY_BUCKETS)
        r.register(_PerRecordCollector(self))

    def _lag(self) -> float:
        since = self.unacknowledged_since
        return 0.0 if since is None else max(0.0, time.time() - since)


class _PerRecordCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        published = dict(m.records_published)  # dict(): one atomic copy under the GIL
        dead_letters = published.pop(DEAD_LETTERS, 0)
        for name, help_text, tally in (
                ("cassandra_cdc_agent_mutations_read", "Mutations read, by table", dict(m.mutations_read)),
                ("cassandra_cdc_agent_records_published", "Raw records acknowledged by Kafka, by table",
                 published)):
            family = CounterMetricFamily(name, help_text, labels=["table"])
            for table, count in sorted(tally.items()):
                family.add_metric([table], count)
            yield family
        yield CounterMetricFamily("cassandra_cdc_agent_dead_letters_published",
                                  "Damaged entries published to the errors topic and acknowledged by Kafka",
                                  value=dead_letters)
        latency = m.delivery_latency
        family = HistogramMetricFamily("cassandra_cdc_agent_kafka_delivery_seconds",
                                       "Time from produce to acknowledgement")
        family.add_metric([], buckets=latency.cumulative(), sum_value=latency.sum)
        yield family
