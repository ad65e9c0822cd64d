"""The pipeline's Prometheus metrics, exported by the driver.

What the Python workers count (events by table and op, dead-lettered records by reason, write → event
lag) reaches the driver through a Spark accumulator: each task adds its ``PipelineTally`` once its
events are committed to Kafka (``ChangeProcessor.close``), so a task that fails, or a replay that finds
its output committed already, counts nothing. What only the driver sees it measures itself: each
micro-batch's duration from the query's progress, and per raw topic partition how many records lie
between the offsets the last micro-batch read to and the partition's end.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client import Counter as CounterMetric, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from ..agent.agent_metrics import LatencyHistogram
from ..kafka.admin import admin_settings
from ..kafka.outage import names_unreachable_kafka
from ..kafka.security import LibrdkafkaLog
from ..observability import component_registry
from .pipeline_config import PipelineConfig
from .raw_topic_gap import source_offsets

log = logging.getLogger(__name__)

WRITE_TO_EVENT_BUCKETS = (.1, .25, .5, 1, 2, 5, 10, 30, 60, 300, 1800, 3600)
BATCH_DURATION_BUCKETS = (.1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300)
# How often the driver asks Kafka where the raw topic's partitions end.
ENDS_REFRESH_SECONDS = 5.0
KAFKA_TIMEOUT = 10.0


class PipelineTally:
    """What a task (or, merged, the whole run) emitted: events by (table, op), dead letters by reason, and
    the time from each change's write to its event."""

    def __init__(self) -> None:
        self.events: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[str] = Counter()
        self.write_to_event = LatencyHistogram(WRITE_TO_EVENT_BUCKETS)

    def event(self, table: str, op: str, written_us: int | None) -> None:
        """An event of ``table``; ``written_us``: the write time of the change it shows (None: no write made
        it, e.g. a TTL expiry or a snapshot row)."""
        self.events[(table, op)] += 1
        if written_us is not None and written_us > 0:
            self.write_to_event.observe(max(0.0, time.time() - written_us / 1_000_000))

    def error(self, reason: str) -> None:
        self.errors[reason] += 1

    def merge(self, other: "PipelineTally") -> "PipelineTally":
        self.events.update(other.events)
        self.errors.update(other.errors)
        mine, theirs = self.write_to_event, other.write_to_event
        mine.counts = [a + b for a, b in zip(mine.counts, theirs.counts)]
        mine.sum += theirs.sum
        return self

    def __bool__(self) -> bool:
        return bool(self.events or self.errors)


class _TallyParam(AccumulatorParam):
    def zero(self, value: PipelineTally) -> PipelineTally:
        return PipelineTally()

    def addInPlace(self, total: PipelineTally, more: PipelineTally) -> PipelineTally:
        return total.merge(more)


class PipelineMetrics:
    """The driver's registry and what feeds it: the workers' tallies (an accumulator) and the query's
    progress (``update``, called by the driver's loop)."""

    def __init__(self, spark: SparkSession, config: PipelineConfig) -> None:
        self.tally: Accumulator[PipelineTally] = spark.sparkContext.accumulator(PipelineTally(),
                                                                                 _TallyParam())
        self.registry = component_registry()
        r = self.registry
        self.batch_duration = Histogram("cassandra_cdc_pipeline_batch_duration_seconds",
                                        "Duration of each micro-batch (Spark's triggerExecution)",
                                        buckets=BATCH_DURATION_BUCKETS, registry=r)
        self.behind = Gauge("cassandra_cdc_pipeline_behind_records",
                            "Records of a raw topic partition after the offsets the last micro-batch read to",
                            ["partition"], registry=r)
        self.raw_records_deleted = CounterMetric(
            "cassandra_cdc_pipeline_raw_records_deleted",
            "Raw topic offsets deleted before the pipeline read them (a gap, found when it starts)", registry=r)
        r.register(_TallyCollector(self.tally))
        self._topic = config.raw_topic
        # Only asks where partitions end: never joins a group nor commits.
        self._consumer_settings = {**admin_settings({"bootstrap.servers": config.kafka.bootstrap_servers,
                                                     **config.kafka.consumer}),
                                   "group.id": "cassandra-cdc-metrics", "enable.auto.commit": False,
                                   # Its retries while Kafka is away are no news: the driver says it once.
                                   "logger": LibrdkafkaLog()}
        self._consumer: Consumer | None = None
        self._last_batch = -1
        self._read_to: dict[int, int] = {}  # per raw partition: the offset the last micro-batch read to
        self._ends_at = 0.0
        self._active = False

    def not_ready(self) -> str | None:
        """Why the pipeline is not ready (the readiness endpoint), or None when its query runs."""
        return None if self._active else "the streaming query is not running"

    def update(self, query: StreamingQuery) -> None:
        """Take in the micro-batches completed since the last call, and where the raw topic ends."""
        self._active = query.isActive
        for progress in query.recentProgress:
            if progress["batchId"] <= self._last_batch:
                continue
            self._last_batch = progress["batchId"]
            duration_ms = progress["durationMs"].get("triggerExecution")
            if duration_ms is not None:
                self.batch_duration.observe(duration_ms / 1000)
            for source in progress["sources"]:
                self._read_to.update(source_offsets(source["endOffset"], self._topic))
        if time.monotonic() - self._ends_at >= ENDS_REFRESH_SECONDS:
            self._ends_at = time.monotonic()
            self._measure_behind()

    def stopped(self) -> None:
        self._active = False
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _measure_behind(self) -> None:
        """Each raw partition's gauge on its own: one partition the broker does not answer for keeps its
        last value without holding back the others'."""
        try:
            if self._consumer is None:
                self._consumer = Consumer(self._consumer_settings)
            metadata = self._consumer.list_topics(self._topic, timeout=KAFKA_TIMEOUT).topics[self._topic]
        except KafkaException as error:  # the gauges keep their last values; the query reports what matters
            self._unmeasured(f"the raw topic's partitions: {error}", error)
            return
        if metadata.error is not None:
            return  # no raw topic yet: nothing behind
        for partition in sorted(metadata.partitions):
            try:
                _, end = self._consumer.get_watermark_offsets(TopicPartition(self._topic, partition),
                                                              timeout=KAFKA_TIMEOUT, cached=False)
            except KafkaException as error:
                self._unmeasured(f"where raw partition {partition} ends: {error}", error)
                continue
            self.behind.labels(str(partition)).set(max(0, end - self._read_to.get(partition, 0)))

    def _unmeasured(self, what: str, error: KafkaException) -> None:
        # Kafka out of reach (or just back) is said once by the driver (streaming_job.run), not at every
        # refresh.
        level = logging.DEBUG if names_unreachable_kafka(str(error)) else logging.WARNING
        log.log(level, "cannot measure how far behind the pipeline is: cannot read %s", what)


class _TallyCollector(Collector):
    def __init__(self, tally: Accumulator[PipelineTally]) -> None:
        self._tally = tally

    def collect(self) -> Iterator[Metric]:
        tally = self._tally.value  # merged by the accumulator server's thread: copied before reading
        events = CounterMetricFamily("cassandra_cdc_pipeline_events",
                                     "Change events written to Kafka, by table and op (c, u, d, r)",
                                     labels=["table", "op"])
        for (table, op), count in sorted(dict(tally.events).items()):
            events.add_metric([table, op], count)
        yield events
        errors = CounterMetricFamily("cassandra_cdc_pipeline_errors", "Raw records sent to the errors topic, "
                                     "by reason", labels=["reason"])
        for reason, count in sorted(dict(tally.errors).items()):
            errors.add_metric([reason], count)
        yield errors
        lag = tally.write_to_event
        family = HistogramMetricFamily("cassandra_cdc_pipeline_write_to_event_seconds",
                                       "From a change's write time (its mutation's timestamp) to its event")
        family.add_metric([], buckets=lag.cumulative(), sum_value=lag.sum)
        yield family
