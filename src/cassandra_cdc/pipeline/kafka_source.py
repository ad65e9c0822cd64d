"""``cdc-kafka``: a streaming Kafka source for Spark written in Python, over confluent-kafka.

Spark's own ``format("kafka")`` needs a connector jar this platform cannot download; this source has
the same output schema, so the job code is the same with either (``kafka_format_available`` in
pipeline.spark tells which one to use)::

    spark.dataSource.register(KafkaDataSource)
    events = (spark.readStream.format("cdc-kafka")
              .option("kafka.bootstrap.servers", "127.0.0.1:9092")
              .option("subscribe", "cdc.raw")
              .option("maxOffsetsPerTrigger", 50_000)
              .load())

Output schema (Spark's kafka source without headers):

======================  =========  =================================================================
column                  type       meaning
======================  =========  =================================================================
``key``                 binary     record key (null when the record has none)
``value``               binary     record value (null for a tombstone)
``topic``               string     the subscribed topic
``partition``           int        Kafka partition
``offset``              long       Kafka offset
``timestamp``           timestamp  record timestamp (null when the broker has none)
``timestampType``       int        0 = CreateTime, 1 = LogAppendTime, -1 = none
======================  =========  =================================================================

Options (names are case-insensitive):

=========================  ==============  ===========================================================
option                     default         meaning
=========================  ==============  ===========================================================
``kafka.bootstrap.servers``  (required)    brokers
``subscribe``              (required)      one topic
``maxOffsetsPerTrigger``   100000          offsets admitted per micro-batch, spread over partitions in
                                           proportion to their backlog (at least one when data
                                           exists); ``none`` for no limit. ``Trigger.AvailableNow``
                                           keeps the limit and stops at the offsets of its start.
``startingOffsets``        ``earliest``    ``earliest``, ``latest`` or Spark's JSON
                                           ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest);
                                           used only when the checkpoint has no offsets yet
``failOnDataLoss``         ``true``        fail when offsets to read are gone (retention, a topic
                                           recreated) instead of skipping to what is left
``maxPartitions``          ``none``        read tasks per micro-batch at most: Kafka partitions with
                                           new offsets are grouped into this many tasks, balanced by
                                           offsets, each reading its partitions one after the other
                                           (each task costs Spark 0.1-0.3 s whatever it reads)
``emit``                   ``records``     ``offsetRanges``: instead of the records, one row per Kafka
                                           partition with new offsets, naming them (below); whoever
                                           processes the rows reads the records itself with
                                           ``read_range``
``kafkaConsumer.pollTimeoutMs``  120000    a read task fails after this long without progress
``kafka.*``                                any other librdkafka consumer setting, e.g.
                                           ``kafka.security.protocol``
=========================  ==============  ===========================================================

With ``emit=offsetRanges`` the schema is ``topic string, partition int, startOffset long, endOffset
long`` (the offsets ``[startOffset, endOffset)`` of one Kafka partition in the micro-batch), all rows in
one task: the records themselves never pass through the JVM. The stateful pipeline reads them where it
merges them (see change_processor.py), which saves the conversion of every record to Arrow and back and its
shuffle; offsets are still planned, bounded and checkpointed by Spark as with ``emit=records``.

How it maps to Spark:

- Offsets are ``{"<partition>": <next offset>}`` (partitions in numeric order, so equal offsets are
  equal JSON) and live only in Spark's checkpoint: nothing is committed to Kafka, a consumer group id
  is never joined.
- One Spark partition (task) per Kafka partition with new offsets in the micro-batch, or at most
  ``maxPartitions`` of them; for each of its Kafka partitions a task ``assign``s its Python worker's
  consumer (kept across micro-batches) at the start offset and reads up to the end offset, emitting
  Arrow record batches.
- ``isolation.level=read_committed`` by default: the latest offset of a partition is its last stable
  offset, so a batch never waits for an open transaction, and aborted records are never emitted.
  Offset ranges are counted in offsets, which include transaction markers and aborted records, so a
  batch can hold fewer rows than ``maxOffsetsPerTrigger``.
- Partitions added to the topic while the query runs are read from their first offset.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from ..kafka.consume import (READ_TO_END_FETCH_WAIT_MS, DataLossError, KafkaSourceError, consume_range,
                             watermark_offsets)

log = logging.getLogger(__name__)

SOURCE_NAME = "cdc-kafka"
SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")  # exactly what Spark checks yielded batches against
RANGES_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("startOffset", LongType()),
    StructField("endOffset", LongType()),
])
_RANGES_ARROW_SCHEMA = to_arrow_schema(RANGES_SCHEMA)
EMIT_RECORDS, EMIT_RANGES = "records", "offsetranges"  # option values, lowered

DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000
DEFAULT_POLL_TIMEOUT_MS = 120_000
METADATA_TIMEOUT = 30.0
# Spark's startingOffsets JSON uses these for "earliest" and "latest".
EARLIEST, LATEST = -2, -1
# librdkafka's timestamp types are NOT_AVAILABLE=0, CREATE_TIME=1, LOG_APPEND_TIME=2; Kafka's (and
# Spark's ``timestampType``) are -1, 0, 1.
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}
Offsets = dict[int, int]  # Kafka partition -> next offset to read


# --- options -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceOptions:
    topic: str
    max_offsets_per_trigger: int | None
    starting_offsets: str
    fail_on_data_loss: bool
    poll_timeout_ms: int
    max_partitions: int | None = None
    kafka: dict[str, str] = field(default_factory=dict)  # librdkafka settings, ``kafka.`` prefix removed
    emit_ranges: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        lowered = {key.lower(): str(value) for key, value in options.items()}
        kafka = {key[len("kafka."):]: value for key, value in lowered.items() if key.startswith("kafka.")}
        if not kafka.get("bootstrap.servers"):
            raise KafkaSourceError(f"{SOURCE_NAME}: option kafka.bootstrap.servers is required")
        topic = lowered.get("subscribe", "").strip()
        if not topic or "," in topic:
            raise KafkaSourceError(f"{SOURCE_NAME}: option subscribe must name exactly one topic, "
                                   f"got {topic!r}")
        max_offsets = _positive_or_none(lowered.get("maxoffsetspertrigger", str(DEFAULT_MAX_OFFSETS_PER_TRIGGER)),
                                        "maxOffsetsPerTrigger")
        max_partitions = _positive_or_none(lowered.get("maxpartitions", "none"), "maxPartitions")
        fail_on_data_loss = lowered.get("failondataloss", "true").strip().lower()
        if fail_on_data_loss not in ("true", "false"):
            raise KafkaSourceError(f"{SOURCE_NAME}: failOnDataLoss must be true or false, "
                                   f"got {fail_on_data_loss!r}")
        emit = lowered.get("emit", EMIT_RECORDS).strip().lower()
        if emit not in (EMIT_RECORDS, EMIT_RANGES):
            raise KafkaSourceError(f"{SOURCE_NAME}: emit must be records or offsetRanges, got {emit!r}")
        return cls(topic=topic, max_offsets_per_trigger=max_offsets,
                   starting_offsets=lowered.get("startingoffsets", "earliest").strip(),
                   fail_on_data_loss=fail_on_data_loss == "true",
                   poll_timeout_ms=int(lowered.get("kafkaconsumer.polltimeoutms", DEFAULT_POLL_TIMEOUT_MS)),
                   max_partitions=max_partitions, kafka=kafka, emit_ranges=emit == EMIT_RANGES)

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """Settings for a consumer that is only ever ``assign``ed and never commits."""
        config: dict[str, Any] = {
            # librdkafka wants a group id; it is never joined (no subscribe) nor committed to.
            "group.id": f"{SOURCE_NAME}-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": READ_TO_END_FETCH_WAIT_MS,
            # A range is read to its end offset, and the consumer then moves to another range: what it
            # prefetched past the end (librdkafka's defaults: 100,000 records or 64 MB) is decompressed
            # and parsed for nothing. A few MB ahead keep the reads going without that waste, and a short
            # backoff when they are queued (1 s by default) keeps the fetches from pausing the reads.
            "queued.min.messages": 10_000,
            "queued.max.messages.kbytes": 8192,
            "max.partition.fetch.bytes": 2 << 20,
            "fetch.queue.backoff.ms": 5,
        }
        config.update(self.kafka)
        config.update({"enable.auto.commit": False, "enable.auto.offset.store": False}, **overrides)
        return config


def _positive_or_none(text: str, option: str) -> int | None:
    text = text.strip().lower()
    try:
        value = None if text in ("", "none") else int(text)
    except ValueError:
        value = 0
    if value is not None and value < 1:
        raise KafkaSourceError(f"{SOURCE_NAME}: {option} must be a positive integer or none, got {text!r}")
    return value


# --- offsets -----------------------------------------------------------------------------------

def offsets_to_json(offsets: Offsets) -> dict[str, int]:
    """Partitions in numeric order: Spark compares offsets as JSON text."""
    return {str(partition): offsets[partition] for partition in sorted(offsets)}


def offsets_from_json(offsets: Mapping[str, Any]) -> Offsets:
    return {int(partition): int(offset) for partition, offset in offsets.items()}


def admit(available: Offsets, max_rows: int) -> Offsets:
    """How many offsets each partition may advance: all of them when they fit in ``max_rows``, else
    shares roughly proportional to the backlogs that add up to exactly ``max_rows`` (at least 1)."""
    total = sum(available.values())
    if total <= max_rows:
        return dict(available)
    max_rows = max(1, max_rows)
    shares = {partition: count * max_rows // total for partition, count in available.items()}
    left = max_rows - sum(shares.values())  # fewer than the number of partitions
    # The rest to the smallest shares first, so a small backlog is not starved by a big one.
    for partition in sorted(available, key=lambda p: (shares[p], -available[p], p)):
        if left == 0:
            break
        if shares[partition] < available[partition]:
            shares[partition] += 1
            left -= 1
    return shares


# --- the data source ---------------------------------------------------------------------------

class KafkaDataSource(DataSource):
    """Register with ``spark.dataSource.register(KafkaDataSource)``, read with ``format("cdc-kafka")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return RANGES_SCHEMA if SourceOptions.parse(self.options).emit_ranges else SCHEMA

    def streamReader(self, schema: StructType) -> "KafkaStreamReader":
        return KafkaStreamReader(SourceOptions.parse(self.options))


@dataclass(frozen=True, order=True)
class OffsetRange:
    """A Kafka partition's offsets ``[start, end)`` in one micro-batch."""

    partition: int
    start: int
    end: int


class KafkaInputPartition(InputPartition):
    """What one read task reads: offset ranges of Kafka partitions, one after the other."""

    def __init__(self, topic: str, ranges: list[OffsetRange]) -> None:
        super().__init__([(r.partition, r.start, r.end) for r in ranges])
        self.topic = topic
        self.ranges = ranges

    def __repr__(self) -> str:
        return f"KafkaInputPartition({self.topic} " + ", ".join(
            f"[{r.partition}] {r.start}..{r.end}" for r in self.ranges) + ")"


def group_ranges(ranges: list[OffsetRange], groups: int | None) -> list[list[OffsetRange]]:
    """The ranges in at most ``groups`` groups of about equal offsets (the largest range first into the
    smallest group); one group per range when ``groups`` is None or not fewer than the ranges."""
    if groups is None or len(ranges) <= groups:
        return [[r] for r in ranges]
    grouped: list[list[OffsetRange]] = [[] for _ in range(groups)]
    sizes = [0] * groups
    for r in sorted(ranges, key=lambda r: (r.start - r.end, r.partition)):
        smallest = sizes.index(min(sizes))
        grouped[smallest].append(r)
        sizes[smallest] += r.end - r.start
    return [sorted(group) for group in grouped]


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (one long-lived process) and reads them in the tasks."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None  # driver side only, for watermarks
        self._target: Offsets | None = None  # Trigger.AvailableNow: never go past these offsets
        self._latest: Offsets | None = None
        self._warned: set[str] = set()  # each problem is logged once, not at every trigger

    def __getstate__(self) -> dict[str, Any]:
        # The reader is pickled into every task: the driver's client stays behind.
        return {**self.__dict__, "_consumer": None}

    # -- driver side --

    def initialOffset(self) -> dict[str, int]:
        marks = self._watermarks()
        starting = self.options.starting_offsets
        if starting.lower() == "earliest":
            return offsets_to_json({partition: low for partition, (low, _) in marks.items()})
        if starting.lower() == "latest":
            return offsets_to_json({partition: high for partition, (_, high) in marks.items()})
        try:
            specified = json.loads(starting)[self.options.topic]
            requested = offsets_from_json(specified)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise KafkaSourceError(f"{SOURCE_NAME}: startingOffsets must be earliest, latest or "
                                   f'{{"{self.options.topic}": {{"<partition>": <offset>}}}}, '
                                   f"got {starting!r}") from error
        offsets = {}
        for partition, (low, high) in marks.items():
            offset = requested.get(partition, EARLIEST)
            offsets[partition] = low if offset == EARLIEST else high if offset == LATEST else offset
        return offsets_to_json(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {partition: high for partition, (_, high) in self._watermarks().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = offsets_from_json(start)
        marks = self._watermarks()
        self._latest = {partition: high for partition, (_, high) in marks.items()}
        available: Offsets = {}
        for partition in sorted(set(begin) | set(marks)):
            if partition not in marks:
                self._data_loss(f"partition {partition} is gone from the topic")
                continue  # keep its offset as it is
            low, high = marks[partition]
            if partition not in begin:
                begin[partition] = 0  # a partition added to the topic: read it from its first offset
            if begin[partition] < low:
                self._data_loss(f"partition {partition}: offsets {begin[partition]}..{low} were deleted "
                                f"before they were read")
            if begin[partition] > high:
                self._data_loss(f"partition {partition}: next offset {begin[partition]} is beyond the end "
                                f"of the partition ({high}); was the topic recreated?")
            if self._target is not None:
                # Partitions added after the query started have no target: nothing to read in them.
                high = min(high, self._target.get(partition, begin[partition]))
            available[partition] = max(0, high - begin[partition])
        if isinstance(limit, ReadMaxRows):
            admitted = admit(available, limit.max_rows)
        elif isinstance(limit, ReadMinRows) and sum(available.values()) < limit.min_rows:
            admitted = {partition: 0 for partition in available}
        else:
            admitted = available
        end = {partition: offset + admitted.get(partition, 0) for partition, offset in begin.items()}
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        begin, finish = offsets_from_json(start), offsets_from_json(end)
        ranges = [OffsetRange(partition, begin.get(partition, 0), stop)
                  for partition, stop in sorted(finish.items()) if stop > begin.get(partition, 0)]
        groups = 1 if self.options.emit_ranges else self.options.max_partitions
        return [KafkaInputPartition(self.options.topic, group) for group in group_ranges(ranges, groups)]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Spark's checkpoint is the only record of what was read."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _watermarks(self) -> dict[int, tuple[int, int]]:
        """``partition -> (first offset, end offset)``; the end is the last stable offset with
        read_committed. A topic that does not exist yet has no partitions."""
        if self._consumer is None:
            self._consumer = Consumer(self.options.consumer_config())
        topic = self.options.topic
        try:
            metadata = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT).topics[topic]
            if metadata.error is not None:
                if metadata.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise KafkaException(metadata.error)
                self._warn_once(f"{SOURCE_NAME}: topic {topic} does not exist (yet): nothing to read")
                return {}
            return {partition: watermark_offsets(self._consumer, topic, partition, METADATA_TIMEOUT)
                    for partition in sorted(metadata.partitions)}
        except KafkaException as error:
            raise KafkaSourceError(f"{SOURCE_NAME}: cannot get the offsets of topic {topic}: {error}") \
                from error

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{SOURCE_NAME}: data loss on topic {self.options.topic}: {message} "
                                   f"(set failOnDataLoss=false to skip what is gone)")
        self._warn_once(f"{SOURCE_NAME}: data loss on topic {self.options.topic}: {message}; going on "
                        f"(failOnDataLoss=false)")

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    # -- executor side --

    def read(self, partition: KafkaInputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if self.options.emit_ranges:
            yield _ranges_batch(partition)
            return
        for offsets in partition.ranges:
            yield from _arrow_batches(read_range(self.options, offsets), partition.topic, offsets.partition)


def read_range(options: SourceOptions, offsets: OffsetRange) -> Iterator[list[Message]]:
    """The records of ``offsets`` in ``options.topic``, in chunks, read with this worker's consumer."""
    consumer = _task_consumer(options)
    topic = options.topic
    try:
        consumer.assign([TopicPartition(topic, offsets.partition, offsets.start)])
        yield from consume_range(consumer, topic, offsets.partition, offsets.start, offsets.end,
                                 options.poll_timeout_ms / 1000)
        consumer.unassign()  # no fetching once the range is read
    except BaseException as error:
        _drop_task_consumer(options)
        if isinstance(error, DataLossError):
            raise DataLossError(f"{SOURCE_NAME}: {error} (set failOnDataLoss=false to skip what is gone)") \
                from None
        raise


# The read tasks' consumers, one per Python worker process and options: workers outlive micro-batches,
# and a new consumer per task (connection, metadata, first fetch) cost ~0.1-0.3 s per partition and batch.
_TASK_CONSUMERS: dict[str, Consumer] = {}


def _task_consumer(options: SourceOptions) -> Consumer:
    identity = _task_consumer_identity(options)
    consumer = _TASK_CONSUMERS.get(identity)
    if consumer is None:
        consumer = _TASK_CONSUMERS[identity] = Consumer(options.consumer_config(**{
            "enable.partition.eof": True,
            "auto.offset.reset": "error" if options.fail_on_data_loss else "earliest",
        }))
    return consumer


def close_task_consumers() -> None:
    """Close the read tasks' consumers this process keeps."""
    while _TASK_CONSUMERS:
        _TASK_CONSUMERS.popitem()[1].close()


def _drop_task_consumer(options: SourceOptions) -> None:
    """After a failure the consumer may be in any state: the next task starts with a new one."""
    consumer = _TASK_CONSUMERS.pop(_task_consumer_identity(options), None)
    if consumer is not None:
        consumer.close()


def _task_consumer_identity(options: SourceOptions) -> str:
    return json.dumps([options.kafka, options.fail_on_data_loss], sort_keys=True)


def _ranges_batch(partition: KafkaInputPartition) -> pa.RecordBatch:
    ranges = partition.ranges
    return pa.RecordBatch.from_arrays([
        pa.array([partition.topic] * len(ranges), pa.string()),
        pa.array([r.partition for r in ranges], pa.int32()),
        pa.array([r.start for r in ranges], pa.int64()),
        pa.array([r.end for r in ranges], pa.int64()),
    ], schema=_RANGES_ARROW_SCHEMA)


def _arrow_batches(chunks: Iterator[list[Message]], topic: str, partition: int) -> Iterator[pa.RecordBatch]:
    topic_value = pa.scalar(topic, pa.string())
    partition_value = pa.scalar(partition, pa.int32())
    timestamp_type = ARROW_SCHEMA.field("timestamp").type
    for records in chunks:
        stamps = [record.timestamp() for record in records]
        count = len(records)
        yield pa.RecordBatch.from_arrays([
            pa.array([record.key() for record in records], pa.binary()),
            pa.array([record.value() for record in records], pa.binary()),
            pa.repeat(topic_value, count),
            pa.repeat(partition_value, count),
            pa.array([record.offset() for record in records], pa.int64()),
            pa.array([ms * 1000 if kind else None for kind, ms in stamps], timestamp_type),
            pa.array([_TIMESTAMP_TYPE.get(kind, -1) for kind, _ in stamps], pa.int32()),
        ], schema=ARROW_SCHEMA)


__all__ = ["DataLossError", "KafkaDataSource", "KafkaInputPartition", "KafkaSourceError", "OffsetRange",
           "RANGES_SCHEMA", "SCHEMA", "SOURCE_NAME", "SourceOptions", "admit", "group_ranges", "read_range"]
