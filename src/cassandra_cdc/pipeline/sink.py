"""Writing a streaming query's output to Kafka: exactly once with transactions, or at least once.

Both sinks take micro-batches of ``topic string, key binary, value binary`` (events already serialized)
and are used with ``foreachBatch``::

    sink = KafkaTransactionalSink("127.0.0.1:9092", commit_topic="cdc.sink-commits", query_name="cdc-merge",
                                  topic_partitions=6)
    events.writeStream.foreachBatch(sink.write_batch).option("checkpointLocation", ...).start()

``producer_config`` adds librdkafka producer settings (security, ``transaction.timeout.ms``...);
``topic_partitions`` makes the tasks create the topics they write to that do not exist yet, with that
many partitions (None: the topics must exist, or the broker creates them on its own terms).

``KafkaTransactionalSink``: exactly once for ``isolation.level=read_committed`` consumers
------------------------------------------------------------------------------------------
Each Spark partition ``p`` of batch ``b`` is written by one task in one Kafka transaction
(``transactional.id = "<query_name>-<p>"``) that holds its records *and* a marker record keyed
``"<query_name>-<p>"`` with value ``{"batch_id": b, ...}`` in the compacted ``commit_topic``. Before
writing, the task registers its transactional id (which fences an older attempt still running with the
same id and completes or aborts its open transaction), then reads the last committed marker of its key
(read_committed, incrementally, cached per Python worker): if it is ``>= b``, the partition was already
committed before a crash and the task writes nothing. So when Spark replays a batch (a failed task, a
driver restart between the write and the checkpoint's commit log), every partition is committed once.
A Python worker keeps its registered producers for the next batches, as long as no other process
committed under their id meanwhile (see ``_TransactionalProducer``).

What consumers get:

- ``isolation.level=read_committed``: every record of every batch exactly once, in the order each
  task produced it; records of a failed or replayed attempt are never visible.
- ``read_uncommitted`` (Kafka's default): at least once; records of aborted attempts are visible too.
- A batch is not atomic across partitions: a read_committed consumer can see partition 0 of batch 7
  before partition 1 of batch 7 is committed (or while it is being replayed after a crash).

What it relies on:

- The partition -> task mapping of a replayed batch must be the same as the first time, with the same
  records in each partition. It holds when the DataFrame comes straight out of a stateful operator's
  shuffle (a fixed number of partitions, fixed in the checkpoint; rows placed by key hash, state
  restored to the same version) or of a source with deterministic partitions (``cdc-kafka``: one per
  Kafka partition with data). It does not hold after ``repartition(n)`` without keys or any other
  non-deterministic step: a row could then move from a committed partition to a replayed one
  (duplicate) or the other way (loss).
- Values computed at write time differ between attempts. An event's ``ts_ms`` (the time the job built
  it) is that of the attempt that committed: a replayed batch whose partition was already committed
  keeps its first ``ts_ms``; aborted attempts' events, with other ``ts_ms`` values, are seen only by
  read_uncommitted consumers. Deduplicate on the event's source position, never on ``ts_ms``.
- ``query_name`` names one checkpoint: markers also carry the streaming query's id (kept in the
  checkpoint), and markers of another query id are ignored, so a new checkpoint under the same name
  writes from batch 0 again (with the duplicates any reprocessing implies) instead of skipping batches.
- The whole partition must be written within ``transaction.timeout.ms`` (60 s by default here);
  bound the batch size (``maxOffsetsPerTrigger``) accordingly.
- Plain Kafka protocol only (transactions since Kafka 0.11, KIP-98). The commit topic is created
  (1 partition, ``cleanup.policy=compact``) if it does not exist.

On noida-db 0.2.3 (the test broker) transactions, fencing and last stable offsets work, but its fetch
responses list every aborted transaction of a partition, even those that ended before the fetched
range (Kafka lists only overlapping ones). A read_committed consumer (librdkafka, and the Java client
by the same logic) then takes the later committed batches of a producer that once aborted on that
partition for aborted ones and skips them when they come in a later fetch response than the abort
marker. After a failed task, its transactional id's later output can thus be hidden from
read_committed readers on noida-db, and this sink's own marker lookups can miss markers (a replay in
another process then writes the partition again: at least once). Not an issue with Kafka; on noida-db
use ``KafkaAtLeastOnceSink`` where a run includes failures. tests/test_pipeline_io.py tracks the bug.

``KafkaAtLeastOnceSink``: each task produces with an idempotent producer (``acks=all``), flushes, and
fails if any record was not delivered; a replayed batch is written again (duplicates).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import TaskContext
from pyspark.sql import DataFrame

from .source import consume_range

log = logging.getLogger(__name__)

INPUT_COLUMNS = ("topic", "key", "value")
RESULT_SCHEMA = "partition int, records long, skipped boolean"
_RESULT_ARROW = pa.schema([("partition", pa.int32()), ("records", pa.int64()), ("skipped", pa.bool_())])
# The streaming query's id (kept in its checkpoint), a local property of every job it runs.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
TIMEOUT = 60.0
COMMIT_ATTEMPTS = 3


class SinkError(RuntimeError):
    """A micro-batch could not be written; Spark retries the task or fails the query."""


@dataclass(frozen=True)
class BatchReport:
    """What ``write_batch`` did: records written, and partitions skipped as already committed."""
    batch_id: int
    records: int
    partitions_written: list[int] = field(default_factory=list)
    partitions_skipped: list[int] = field(default_factory=list)


class _KafkaSink:
    """What both sinks share: settings, the driver side of a batch, and the record loop of a task."""

    def __init__(self, bootstrap_servers: str, producer_config: dict[str, Any] | None = None, *,
                 topic_partitions: int | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.producer_config = dict(producer_config or {})
        self.topic_partitions = topic_partitions

    def write_batch(self, df: DataFrame, batch_id: int) -> BatchReport:
        """``foreachBatch`` callback (driver side): one task per partition of ``df``."""
        missing = [column for column in INPUT_COLUMNS if column not in df.columns]
        if missing:
            raise SinkError(f"the DataFrame written to Kafka lacks columns {missing}; it has {df.columns}")
        self._prepare()
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)

        def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            partition = TaskContext.get().partitionId()
            records, skipped = self._write_partition(batches, partition, batch_id, query_id)
            yield pa.RecordBatch.from_pydict(
                {"partition": [partition], "records": [records], "skipped": [skipped]}, schema=_RESULT_ARROW)

        results = df.select(*INPUT_COLUMNS).mapInArrow(write, RESULT_SCHEMA).collect()
        report = BatchReport(batch_id, sum(row.records for row in results),
                             sorted(row.partition for row in results if not row.skipped and row.records),
                             sorted(row.partition for row in results if row.skipped))
        if report.partitions_skipped:
            log.info("batch %d: partitions %s were already committed to Kafka; not written again",
                     batch_id, report.partitions_skipped)
        return report

    def _prepare(self) -> None:
        """Driver side, before the tasks run."""

    def _write_partition(self, batches: Iterator[pa.RecordBatch], partition: int, batch_id: int,
                         query_id: str | None) -> tuple[int, bool]:
        """Task side: ``(records written, skipped as already committed)``."""
        raise NotImplementedError

    def _admin_settings(self) -> dict[str, Any]:
        return {key: value for key, value in self._producer_settings().items()
                if key.startswith(("bootstrap.", "security.", "sasl.", "ssl.", "client."))}

    def _producer_settings(self, **settings: Any) -> dict[str, Any]:
        """Defaults, then ``producer_config``, then ``settings`` (what the sink's guarantee needs)."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "linger.ms": 5,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            "transaction.timeout.ms": 60_000,
        }
        config.update(self.producer_config)
        config.update(settings)
        return config

    def _produce_all(self, producer: Producer, batches: Iterator[pa.RecordBatch], **produce: Any) -> int:
        count = 0
        for batch in batches:
            topics, keys, values = (batch.column(name).to_pylist() for name in INPUT_COLUMNS)
            if self.topic_partitions is not None:
                _ensure_topics(self._admin_settings(), set(topics), self.topic_partitions)
            for topic, key, value in zip(topics, keys, values):
                if topic is None:
                    raise SinkError(f"a record has no topic (key {key!r})")
                while True:
                    try:
                        producer.produce(topic, value, key, **produce)
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.05)
            count += batch.num_rows
            producer.poll(0)
        return count


def _first_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """The batches from the first non-empty one, or None when there are no rows at all."""
    for batch in batches:
        if batch.num_rows:
            def chain() -> Iterator[pa.RecordBatch]:
                yield batch
                yield from batches
            return chain()
    return None


class KafkaTransactionalSink(_KafkaSink):
    """Exactly-once output to Kafka per micro-batch for read_committed consumers (see the module doc)."""

    def __init__(self, bootstrap_servers: str, commit_topic: str, query_name: str,
                 producer_config: dict[str, Any] | None = None, *,
                 topic_partitions: int | None = None) -> None:
        super().__init__(bootstrap_servers, producer_config, topic_partitions=topic_partitions)
        self.commit_topic = commit_topic
        self.query_name = query_name
        self._commit_topic_ready = False

    def transactional_id(self, partition: int) -> str:
        return f"{self.query_name}-{partition}"

    def _prepare(self) -> None:
        if not self._commit_topic_ready:
            ensure_topic(self._admin_settings(), self.commit_topic, partitions=1, compacted=True)
            self._commit_topic_ready = True

    def _write_partition(self, batches: Iterator[pa.RecordBatch], partition: int, batch_id: int,
                         query_id: str | None) -> tuple[int, bool]:
        rows = _first_rows(batches)
        if rows is None:
            return 0, False  # nothing to write, nothing to remember: a replay has nothing either
        key = self.transactional_id(partition)
        settings = self._producer_settings(**{"transactional.id": key, "enable.idempotence": True, "acks": "all"})
        commits = _CommitLog.of(self._admin_settings(), self.commit_topic)
        try:
            # Committed before a crash: skip without registering the id, which would fence the producer
            # another worker keeps for it.
            committed = commits.last_batch(key, query_id)
            if _at_or_after(committed, batch_id):
                return 0, True
            producer = _TransactionalProducer.of(settings, query_id, committed, commits)
            if _at_or_after(producer.last_committed, batch_id):
                return 0, True
            marker = {"query": self.query_name, "query_id": query_id, "partition": partition, "batch_id": batch_id}
            return producer.write(batch_id, lambda kafka: self._produce_partition(kafka, rows, key, marker)), False
        except KafkaException as error:
            raise SinkError(f"writing batch {batch_id} partition {partition} to Kafka in transaction {key} "
                            f"failed: {error}") from error

    def _produce_partition(self, producer: Producer, rows: Iterator[pa.RecordBatch], key: str,
                           marker: dict[str, Any]) -> int:
        count = self._produce_all(producer, rows)
        self._produce_marker(producer, key, json.dumps({**marker, "records": count}).encode())
        return count

    def _produce_marker(self, producer: Producer, key: str, value: bytes) -> None:
        producer.produce(self.commit_topic, value, key.encode())


def _at_or_after(committed: int | None, batch_id: int) -> bool:
    return committed is not None and committed >= batch_id


class _TransactionalProducer:
    """The producer of one transactional id, kept by a Python worker process across micro-batches.

    Creating a producer and registering its id (``init_transactions``) costs a connection and
    coordinator round trips, in every partition of every batch if done each time. Workers outlive
    batches, so each keeps its producers. Registering an id fences every older producer of it and
    completes or aborts its open transaction; after that, what is committed under the id can change
    only through this producer. So a kept producer is reused only while the commit topic's last marker
    for its id is still the one it knew: another process that wrote the partition since (after
    fencing this producer) committed a newer one, and this producer is replaced. (A task that finds its
    batch committed already skips it without registering the id, so as not to fence a kept producer
    without a marker saying so. One that registers the id and then fails does fence it that way: the
    next write of that kept producer fails, which drops it, and Spark's retry of the task succeeds.)
    """

    _instances: ClassVar[dict[tuple[str, str | None], "_TransactionalProducer"]] = {}

    @classmethod
    def of(cls, settings: dict[str, Any], query_id: str | None, committed: int | None,
           commits: "_CommitLog") -> "_TransactionalProducer":
        """This process's registered producer for ``settings["transactional.id"]``, given the last batch
        ``committed`` under that id (the commit topic's last marker)."""
        identity = (json.dumps(settings, sort_keys=True, default=str), query_id)
        kept = cls._instances.get(identity)
        if kept is not None and kept.last_committed == committed:
            return kept
        producer = cls._instances[identity] = cls(settings, identity)
        # Read the markers only now that older attempts are fenced: none can commit behind our back.
        producer.last_committed = commits.last_batch(producer.key, query_id)
        return producer

    def __init__(self, settings: dict[str, Any], identity: tuple[str, str | None]) -> None:
        self.key: str = settings["transactional.id"]
        self._identity = identity
        self.last_committed: int | None = None  # the last batch committed under this id, as far as known
        self._producer = Producer(settings)
        self._producer.init_transactions(TIMEOUT)

    def write(self, batch_id: int, produce: Callable[[Producer], int]) -> int:
        """Run ``produce`` in a transaction and commit it, or abort it and drop this producer."""
        try:
            self._producer.begin_transaction()
            count = produce(self._producer)
            self._commit()
        except BaseException:
            self._abort()
            if self._instances.get(self._identity) is self:
                del self._instances[self._identity]
            raise
        self.last_committed = batch_id
        return count

    def _commit(self) -> None:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self._producer.commit_transaction(TIMEOUT)
                return
            except KafkaException as error:
                if not error.args[0].retriable() or attempt == COMMIT_ATTEMPTS:
                    raise

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(TIMEOUT)
        except KafkaException as error:
            # Fatal (fenced by a newer attempt) or the broker is gone: the broker aborts the transaction
            # when its timeout expires or the next attempt registers the same transactional id.
            log.warning("could not abort transaction %s: %s", self.key, error)


class _CommitLog:
    """The last committed batch per marker key, read (read_committed) from the commit topic.

    One per Python worker process and commit topic: each lookup first reads the markers committed since
    the previous one, so it is never stale however many processes write to the topic.
    """

    _instances: dict[tuple[str, str], "_CommitLog"] = {}

    @classmethod
    def of(cls, settings: dict[str, Any], topic: str) -> "_CommitLog":
        identity = (json.dumps(settings, sort_keys=True, default=str), topic)
        if identity not in cls._instances:
            cls._instances[identity] = cls(settings, topic)
        return cls._instances[identity]

    def __init__(self, settings: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self._consumer = Consumer({**settings, "group.id": f"cdc-sink-commits-{uuid.uuid4().hex}",
                                   "isolation.level": "read_committed", "enable.auto.commit": False,
                                   "enable.auto.offset.store": False, "enable.partition.eof": True,
                                   "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
        self._positions: dict[int, int] = {}
        self._last: dict[tuple[str, str | None], int] = {}

    def last_batch(self, key: str, query_id: str | None) -> int | None:
        self._catch_up()
        return self._last.get((key, query_id))

    def close(self) -> None:
        self._consumer.close()
        for identity, instance in list(self._instances.items()):
            if instance is self:
                del self._instances[identity]

    def remember(self, key: str, query_id: str | None, batch_id: int) -> None:
        identity = (key, query_id)
        self._last[identity] = max(batch_id, self._last.get(identity, batch_id))

    def _catch_up(self) -> None:
        metadata = self._consumer.list_topics(self.topic, timeout=TIMEOUT).topics[self.topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        for partition in sorted(metadata.partitions):
            low, end = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                            timeout=TIMEOUT, cached=False)
            start = max(self._positions.get(partition, 0), low)
            if start >= end:
                continue
            self._consumer.assign([TopicPartition(self.topic, partition, start)])
            for records in consume_range(self._consumer, self.topic, partition, start, end, TIMEOUT):
                for record in records:
                    self._read_marker(record)
            self._positions[partition] = end

    def _read_marker(self, record: Message) -> None:
        key = record.key().decode(errors="replace") if record.key() else None
        try:
            marker = json.loads(record.value())
            batch_id = int(marker["batch_id"])
        except (TypeError, ValueError, KeyError):
            return  # a tombstone (a deleted marker) or a record some other tool wrote
        if key is not None:
            self.remember(key, marker.get("query_id"), batch_id)


def ensure_topic(settings: dict[str, Any], topic: str, partitions: int, compacted: bool = False) -> None:
    """Create ``topic`` unless it exists (replication: the broker's default)."""
    admin = AdminClient(settings)
    if topic in admin.list_topics(timeout=TIMEOUT).topics:
        return
    config = {"cleanup.policy": "compact"} if compacted else {}
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, config=config)],
                                 request_timeout=TIMEOUT)[topic]
    try:
        future.result(TIMEOUT)
        log.info("created topic %s (%d partition(s)%s)", topic, partitions,
                 ", compacted" if compacted else "")
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # created meanwhile by someone else
            raise SinkError(f"cannot create topic {topic}: {error}") from error


# Topics known to exist, per Python worker process: a task asks Kafka only about topics new to it.
_EXISTING_TOPICS: set[str] = set()


def _ensure_topics(settings: dict[str, Any], topics: set[Any], partitions: int) -> None:
    for topic in topics - _EXISTING_TOPICS:
        if topic is not None:
            ensure_topic(settings, topic, partitions)
            _EXISTING_TOPICS.add(topic)


class KafkaAtLeastOnceSink(_KafkaSink):
    """Every record of every batch at least once: a replayed batch is written again."""

    def _write_partition(self, batches: Iterator[pa.RecordBatch], partition: int, batch_id: int,
                         query_id: str | None) -> tuple[int, bool]:
        failures: list[KafkaError] = []

        def delivered(error: KafkaError | None, _: Message) -> None:
            if error is not None:
                failures.append(error)

        producer = Producer(self._producer_settings(**{"enable.idempotence": True, "acks": "all"}))
        count = self._produce_all(producer, batches, on_delivery=delivered)
        # librdkafka fails each record after message.timeout.ms (5 min by default): flush ends by then.
        while producer.flush(1.0) and not failures:
            pass
        if failures:
            raise SinkError(f"batch {batch_id} partition {partition}: {len(failures)} of {count} records "
                            f"were not delivered, e.g. {failures[0]}")
        return count, False


__all__ = ["BatchReport", "KafkaAtLeastOnceSink", "KafkaTransactionalSink", "SinkError", "ensure_topic"]
