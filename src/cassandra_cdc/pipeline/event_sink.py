"""Writing a task's events to Kafka from the task that makes them: exactly once with transactions, or at
least once.

The stateful processor (processor.py) writes the events of each task of each micro-batch itself, as it
makes them, instead of handing them to Spark for a separate sink stage::

    sink = task_sink(SinkSettings("127.0.0.1:9092", commit_topic="cdc.pipeline-commits"),
                     MicroBatchTask.current())
    sink.produce("cdc.shop.orders", key, value)       # any number of times
    sink.commit()                                      # at the end of the task (``abort()`` when it fails)

``producer`` adds librdkafka producer settings (security, ``transaction.timeout.ms``...);
``topic_partitions`` makes the tasks create the topics they write to that do not exist yet, with that
many partitions (None: the topics must exist, or the broker creates them on its own terms).

Exactly once (``exactly_once=True``): for ``isolation.level=read_committed`` consumers
------------------------------------------------------------------------------------
The task for state partition ``p`` of batch ``b`` writes in one Kafka transaction
(``transactional.id = "<query_name>-<p>"``) that holds its records *and* a marker record keyed
``"<query_name>-<p>"`` with value ``{"batch_id": b, ...}`` in the compacted ``commit_topic``. The task
commits the transaction when it has processed all its input, before Spark commits its state store, and
only once each of its records and the marker is reported delivered with an offset (else it aborts and
fails: Spark retries it).
Before its first record, the task reads the last committed marker of its key (read_committed,
incrementally, cached per Python worker): if it is ``>= b``, the partition was already committed before
a crash, and the task writes nothing (it still merges, to rebuild the state Spark did not commit).
Otherwise it registers its transactional id, which fences an older attempt still running with the
same id and completes or aborts its open transaction. So when Spark replays a batch (a failed task, a
driver restart between the commit and the checkpoint's commit log), every partition is committed once.
A Python worker keeps its registered producers for the next batches, as long as no other process
committed under their id meanwhile (see ``TransactionalProducer``).

What consumers get:

- ``isolation.level=read_committed``: every record of every batch exactly once, in the order each
  task produced it; records of a failed or replayed attempt are never visible.
- ``read_uncommitted`` (Kafka's default): at least once; records of aborted attempts are visible too.
- A batch is not atomic across partitions: a read_committed consumer can see partition 0 of batch 7
  before partition 1 of batch 7 is committed (or while it is being replayed after a crash).

What it relies on:

- A replayed task must make the same records as the first attempt. It does: its input is the same
  offsets of the raw topic (fixed in Spark's offset log), its state the same version of the state
  store, and its clock the batch's timestamp from the offset log.
- Values computed at write time differ between attempts. An event's ``ts_ms`` (the time the job built
  it) is that of the attempt that committed. Deduplicate on the event's source position, never on
  ``ts_ms``.
- ``query_name`` names one pipeline: two queries that write at the same time under one name fence each
  other's transactional ids (the pipeline names its query after its ``server``). Markers also carry the
  streaming query's id (kept in the checkpoint), and markers of another query id are ignored, so a new
  checkpoint under the same name writes from batch 0 again (with the duplicates any reprocessing
  implies) instead of skipping batches.
- ``earlier_query_names``: the names a checkpoint's earlier runs wrote under (an earlier version of the
  pipeline named every query ``cassandra-cdc``). Their markers of the same query id count as the
  partition's own, so a restart on such a checkpoint skips what those runs committed. The first time a
  process finds such a marker and none under the current name, it registers the earlier transactional
  id once before reading the markers again: an attempt of the earlier run still committing is fenced,
  as with the current id. (That also fences, once, a pipeline of the earlier version still running
  under that id elsewhere: its task fails and Spark retries it.)
- The whole task must be written within ``transaction.timeout.ms``: Kafka aborts a transaction open
  longer, and the task fails saying so (its retry, with the same records, would too). The default here is
  15 minutes, the most Kafka's brokers accept by default (``transaction.max.timeout.ms``); a longer one
  needs the brokers' limit raised first. Bound the batch size (``maxOffsetsPerTrigger``) accordingly.
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
use ``exactly_once=False`` where a run includes failures. The exactly-once tests run on real Kafka.

At least once (``exactly_once=False``): each task produces with an idempotent producer (``acks=all``)
kept by its worker, and at its end flushes and fails if any record was not delivered; a replayed task
writes again (duplicates).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark import TaskContext

from ..kafka.admin import TopicCreationFailed, admin_settings, create_missing_topics
from ..kafka.consume import READ_TO_END_FETCH_WAIT_MS, consume_range, watermark_offsets

log = logging.getLogger(__name__)

# Local properties Spark sets on every job of a streaming query's micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
TIMEOUT = 60.0
# Kafka's default transaction.max.timeout.ms: the longest transaction its brokers accept unless raised.
TRANSACTION_TIMEOUT_MS = 900_000
COMMIT_ATTEMPTS = 3
# The largest event record the sink produces, and its event topics take (max.message.bytes): an event holds a row
# before and after, each up to a mutation Cassandra accepts (16 MiB by default), its blobs base64 in JSON (4/3);
# below the brokers' socket.request.max.bytes (100 MiB by default), which bounds a produce request.
EVENT_RECORD_BYTES = 64 << 20


class SinkError(RuntimeError):
    """A task's records could not be written; Spark retries the task or fails the query."""


@dataclass(frozen=True)
class SinkSettings:
    bootstrap_servers: str
    commit_topic: str
    query_name: str = "cassandra-cdc"
    earlier_query_names: tuple[str, ...] = ()
    exactly_once: bool = True
    producer: tuple[tuple[str, Any], ...] = ()  # extra librdkafka settings, as pairs: the settings are hashable
    topic_partitions: int | None = None
    # The topics the tasks create are compacted (cleanup.policy=compact), but for these, which are logs
    # (the errors topic: its records are not the latest state of a key).
    compact_topics: bool = False
    uncompacted_topics: tuple[str, ...] = ()

    def producer_settings(self, **settings: Any) -> dict[str, Any]:
        """Defaults, then ``producer``, then ``settings`` (what the sink's guarantee needs)."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            # A task's commit (or flush) sends what is left at once, whatever linger.ms: a longer linger only
            # makes fewer, larger batches of the events a task sends as it goes, less work for the broker
            # (benchmarks/RESULTS.md, "Pipeline").
            "linger.ms": 100,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            # A task's transaction lasts as long as the task: a batch of a large backlog can take minutes.
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            # A new producer connects to the brokers the bootstrap metadata names only after half of this
            # (100 ms by default): most of a new transactional producer's init_transactions, paid whenever a
            # state partition's task lands in another Python worker than last batch.
            # Reconnections after a failure still back off exponentially, to reconnect.backoff.max.ms.
            "reconnect.backoff.ms": 10,
            "message.max.bytes": EVENT_RECORD_BYTES,
        }
        config.update(self.producer)
        config.update(settings)
        return config

    def admin_settings(self) -> dict[str, Any]:
        return admin_settings(self.producer_settings())


@dataclass(frozen=True)
class MicroBatchTask:
    """Which task of which micro-batch of which query writes."""
    batch_id: int
    partition: int
    query_id: str | None

    @classmethod
    def current(cls) -> "MicroBatchTask":
        """The Spark task running in this Python worker."""
        context = TaskContext.get()
        batch_id = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
        if context is None or batch_id is None:
            raise SinkError("not in a task of a streaming query's micro-batch: no batch id to write under")
        return cls(int(batch_id), context.partitionId(), context.getLocalProperty(QUERY_ID_PROPERTY))


def first_cause(failures: list[KafkaError | str]) -> KafkaError | str:
    """The failure to name for records not delivered: once a transaction fails, librdkafka purges the
    records still queued, and their reports (``_PURGE_QUEUE``, ``_PURGE_INFLIGHT``) may come before the
    one that says why (``MSG_SIZE_TOO_LARGE``, say)."""
    return next((failure for failure in failures if not _purged(failure)), failures[0])


def _purged(failure: KafkaError | str) -> bool:
    return isinstance(failure, KafkaError) and failure.code() in (KafkaError._PURGE_QUEUE,
                                                                  KafkaError._PURGE_INFLIGHT)


class TaskSink(ABC):
    """The records of one task: ``produce`` them, then ``commit`` (or ``abort`` when the task fails)."""

    def __init__(self, settings: SinkSettings, task: MicroBatchTask) -> None:
        self.settings = settings
        self.task = task
        self.records = 0
        self.skipped = False  # committed by an earlier attempt: nothing is written
        self._delivered = 0
        self._failures: list[KafkaError | str] = []  # of the records not delivered, in report order

    def produce(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        producer = self._producer()
        if producer is None:
            return
        if self.settings.topic_partitions is not None and topic not in _EXISTING_TOPICS:
            compacted = self.settings.compact_topics and topic not in self.settings.uncompacted_topics
            ensure_topic(self.settings.admin_settings(), topic, self.settings.topic_partitions, compacted,
                         {"max.message.bytes": str(self.settings.producer_settings()["message.max.bytes"])})
            _EXISTING_TOPICS.add(topic)
        try:
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=self._on_delivery)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    _serve_deliveries(producer, 0.05)
            self.records += 1
            if not self.records % 1000:
                _serve_deliveries(producer, 0)
        except KafkaException as error:  # the producer failed for good (e.g. fenced): so does the task
            self.abort()
            raise self._failure("writing", error) from error

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None and message.offset() >= 0:
            self._delivered += 1
        else:
            self._failures.append(error if error is not None else
                                  f"no offset for a record of {message.topic()} [{message.partition()}]")

    def _undelivered(self, produced: int) -> str | None:
        """Why not each of the ``produced`` records is reported written (with its offset), or None."""
        if self._delivered == produced and not self._failures:
            return None
        example = f", e.g. {first_cause(self._failures)}" if self._failures else " (no delivery report)"
        return f"{produced - self._delivered} of {produced} records were not delivered{example}"

    @abstractmethod
    def commit(self) -> None:
        """Make what was produced durable (and, exactly once, visible), or raise ``SinkError``."""

    def _failure(self, doing: str, error: KafkaException | str) -> SinkError:
        task = self.task
        return SinkError(f"{doing} batch {task.batch_id} partition {task.partition} failed: {error}")

    def abort(self) -> None:
        """The task failed: what it produced must not count (exactly once) or may be sent again."""

    @abstractmethod
    def _producer(self) -> Producer | None:
        """The producer to write with, or None when the task's records are already committed."""


class TransactionalTaskSink(TaskSink):
    """Exactly-once output per task for read_committed consumers (see the module doc)."""

    def __init__(self, settings: SinkSettings, task: MicroBatchTask) -> None:
        super().__init__(settings, task)
        self.key = f"{settings.query_name}-{task.partition}"
        self.earlier_keys = tuple(f"{name}-{task.partition}" for name in settings.earlier_query_names)
        self._transaction: TransactionalProducer | None = None
        self._began_at: float | None = None  # when the task's transaction began (monotonic seconds)

    def _producer(self) -> Producer | None:
        if self._transaction is None and not self.skipped:
            try:
                self._begin()
            except KafkaException as error:
                raise self._failure("starting", error) from error
        return None if self._transaction is None else self._transaction.kafka

    def _begin(self) -> None:
        settings, task = self.settings, self.task
        if settings.commit_topic not in _EXISTING_TOPICS:
            ensure_topic(settings.admin_settings(), settings.commit_topic, partitions=1, compacted=True)
            _EXISTING_TOPICS.add(settings.commit_topic)
        commits = BatchCommitLog.of(settings.admin_settings(), settings.commit_topic)
        self._fence_earlier_ids(commits)
        # Committed before a crash: skip without registering the id, which would fence the producer
        # another worker keeps for it.
        committed = commits.last_batch(self.key, task.query_id, self.earlier_keys)
        if not _at_or_after(committed, task.batch_id):
            producer_settings = settings.producer_settings(**{"transactional.id": self.key,
                                                              "enable.idempotence": True, "acks": "all"})
            transaction = TransactionalProducer.of(producer_settings, task.query_id, committed, commits,
                                                   self.earlier_keys)
            if not _at_or_after(transaction.last_committed, task.batch_id):
                transaction.begin()
                self._transaction = transaction
                self._began_at = time.monotonic()
                return
        self.skipped = True
        log.info("batch %d: partition %d was already committed to Kafka; not written again", task.batch_id,
                 task.partition)

    def _fence_earlier_ids(self, commits: "BatchCommitLog") -> None:
        """Register, once per process, each earlier transactional id this query committed under while
        nothing is committed under the current one yet (see the module doc)."""
        query_id = self.task.query_id
        if commits.last_batch(self.key, query_id) is not None:
            return
        for earlier in self.earlier_keys:
            if earlier in _FENCED_EARLIER_IDS or commits.last_batch(earlier, query_id) is None:
                continue
            fencing = Producer(self.settings.producer_settings(**{"transactional.id": earlier}))
            try:
                fencing.init_transactions(TIMEOUT)
            finally:
                fencing.close()
            _FENCED_EARLIER_IDS.add(earlier)
            log.info("registered the transactional id %s of an earlier run of this query, now %s", earlier,
                     self.key)

    def commit(self) -> None:
        transaction = self._transaction
        if transaction is None:
            return  # nothing written, or skipped: nothing to remember (a replay has nothing either)
        task = self.task
        marker = {"query": self.settings.query_name, "query_id": task.query_id, "partition": task.partition,
                  "batch_id": task.batch_id, "records": self.records}
        try:
            transaction.kafka.produce(self.settings.commit_topic, json.dumps(marker).encode(),
                                      self.key.encode(), on_delivery=self._on_delivery)
            # A committed transaction must hold every record: librdkafka's commit is meant to fail when one
            # was not delivered, and a loss it once let through is checked for here, before committing.
            with kafka_errors_unmasked():
                transaction.kafka.flush(TIMEOUT)
            undelivered = self._undelivered(self.records + 1)  # with the marker
            if undelivered is not None:
                self.abort()
                raise self._failure("committing", undelivered)
            transaction.commit(task.batch_id)
        except KafkaException as error:
            self.abort()
            raise self._failure("committing", error) from error
        finally:
            self._transaction = None

    def abort(self) -> None:
        if self._transaction is not None:
            self._transaction.abort()
            self._transaction = None

    def _failure(self, doing: str, error: KafkaException | str) -> SinkError:
        message = (f"{doing} batch {self.task.batch_id} partition {self.task.partition} in Kafka transaction "
                   f"{self.key} failed: {error}")
        timeout_ms = int(self.settings.producer_settings()["transaction.timeout.ms"])
        open_s = None if self._began_at is None else time.monotonic() - self._began_at
        code = error.args[0].code() if isinstance(error, KafkaException) and error.args else None
        if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            message += (f"; the brokers accept a shorter transaction.timeout.ms than this one ({timeout_ms} "
                        "ms): set kafka.producer's transaction.timeout.ms to at most their "
                        "transaction.max.timeout.ms")
        elif open_s is not None and open_s >= timeout_ms / 1000:
            message += (f"; the transaction had been open for {open_s:.0f} s, longer than its "
                        f"transaction.timeout.ms ({timeout_ms} ms), after which Kafka aborts it. A retry "
                        "of the task writes the same records (the batch's offsets are fixed): raise "
                        "kafka.producer's transaction.timeout.ms (up to the brokers' "
                        "transaction.max.timeout.ms) to get it through, and lower "
                        "kafka.max_offsets_per_trigger for the batches after it")
        return SinkError(message)


@contextlib.contextmanager
def kafka_errors_unmasked() -> Iterator[None]:
    """A producer's fatal error (fenced, its transaction aborted by Kafka) as the ``KafkaException`` it is.

    confluent-kafka raises it from within the delivery callbacks a ``flush`` or ``poll`` serves, so that the
    callback's first call into Python fails with a ``SystemError`` ("returned a result with an exception
    set") caused by it.
    """
    try:
        yield
    except SystemError as error:
        if isinstance(error.__cause__, KafkaException):
            raise error.__cause__ from None
        raise


def _serve_deliveries(producer: Producer, timeout: float) -> None:
    with kafka_errors_unmasked():
        producer.poll(timeout)


def _at_or_after(committed: int | None, batch_id: int) -> bool:
    return committed is not None and committed >= batch_id


# Transactional ids of earlier runs this process registered (``earlier_query_names``).
_FENCED_EARLIER_IDS: set[str] = set()


class TransactionalProducer:
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

    _instances: ClassVar[dict[tuple[str, str | None], "TransactionalProducer"]] = {}

    @classmethod
    def of(cls, settings: dict[str, Any], query_id: str | None, committed: int | None,
           commits: "BatchCommitLog", earlier_keys: tuple[str, ...] = ()) -> "TransactionalProducer":
        """This process's registered producer for ``settings["transactional.id"]``, given the last batch
        ``committed`` under that id or ``earlier_keys`` (the commit topic's last marker)."""
        identity = (json.dumps(settings, sort_keys=True, default=str), query_id)
        kept = cls._instances.get(identity)
        if kept is not None and kept.last_committed == committed and not kept.in_transaction:
            return kept
        if kept is not None:  # fenced, or left in a transaction by a task that died: let it go
            kept.abort()
        producer = cls._instances[identity] = cls(settings, identity)
        # Read the markers only now that older attempts are fenced: none can commit behind our back.
        producer.last_committed = commits.last_batch(producer.key, query_id, earlier_keys)
        return producer

    @classmethod
    def close_all(cls) -> None:
        """Close the producers this process keeps (aborting what they have open)."""
        for producer in list(cls._instances.values()):
            producer.abort()
            producer.kafka.close()

    def __init__(self, settings: dict[str, Any], identity: tuple[str, str | None]) -> None:
        self.key: str = settings["transactional.id"]
        self._identity = identity
        self.last_committed: int | None = None  # the last batch committed under this id, as far as known
        self.in_transaction = False
        self.kafka = Producer(settings)
        # Right after it starts, librdkafka swaps its bootstrap connection for the brokers the first metadata
        # names; a coordinator lookup that falls in between finds no broker and waits for librdkafka's retry
        # timer (often, on a loaded machine). The metadata asked for first, the swap is over before the lookup.
        self.kafka.list_topics(timeout=TIMEOUT)
        self.kafka.init_transactions(TIMEOUT)

    def begin(self) -> None:
        self.kafka.begin_transaction()
        self.in_transaction = True

    def commit(self, batch_id: int) -> None:
        """Commit the open transaction (the caller aborts it when this fails)."""
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self.kafka.commit_transaction(TIMEOUT)
                break
            except KafkaException as error:
                if not error.args[0].retriable() or attempt == COMMIT_ATTEMPTS:
                    raise
        self.in_transaction = False
        self.last_committed = batch_id

    def abort(self) -> None:
        """Abort the open transaction, and drop this producer: what it last committed is unknown now."""
        if self._instances.get(self._identity) is self:
            del self._instances[self._identity]
        if not self.in_transaction:
            return
        self.in_transaction = False
        try:
            self.kafka.abort_transaction(TIMEOUT)
        except KafkaException as error:
            # Fatal (fenced by a newer attempt) or the broker is gone: the broker aborts the transaction
            # when its timeout expires or the next attempt registers the same transactional id.
            log.warning("could not abort transaction %s: %s", self.key, error)


class BatchCommitLog:
    """The last committed batch per marker key, read (read_committed) from the commit topic.

    One per Python worker process and commit topic: each lookup first reads the markers committed since
    the previous one, so it is never stale however many processes write to the topic.
    """

    _instances: dict[tuple[str, str], "BatchCommitLog"] = {}

    @classmethod
    def of(cls, settings: dict[str, Any], topic: str) -> "BatchCommitLog":
        identity = (json.dumps(settings, sort_keys=True, default=str), topic)
        if identity not in cls._instances:
            cls._instances[identity] = cls(settings, topic)
        return cls._instances[identity]

    def __init__(self, settings: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self._consumer = Consumer({**settings, "group.id": f"cdc-sink-commits-{uuid.uuid4().hex}",
                                   "isolation.level": "read_committed", "enable.auto.commit": False,
                                   "enable.auto.offset.store": False, "enable.partition.eof": True,
                                   "auto.offset.reset": "earliest",
                                   "fetch.wait.max.ms": READ_TO_END_FETCH_WAIT_MS})
        self._positions: dict[int, int] = {}
        self._last: dict[tuple[str, str | None], int] = {}

    def last_batch(self, key: str, query_id: str | None, earlier_keys: tuple[str, ...] = ()) -> int | None:
        """The last batch of ``query_id`` committed under ``key`` or any of ``earlier_keys``."""
        self._catch_up()
        batches = [self._last.get((name, query_id)) for name in (key, *earlier_keys)]
        return max((batch for batch in batches if batch is not None), default=None)

    def partitions_committed(self, query_names: tuple[str, ...]) -> int:
        """How many state partitions of streaming queries named any of ``query_names`` committed a batch
        here, under any query id (any checkpoint)."""
        self._catch_up()
        return len({key for key, _ in self._last if key.rpartition("-")[0] in query_names})

    def close(self) -> None:
        self._consumer.close()
        for identity, instance in list(self._instances.items()):
            if instance is self:
                del self._instances[identity]

    @classmethod
    def close_all(cls) -> None:
        for instance in list(cls._instances.values()):
            instance.close()

    def remember(self, key: str, query_id: str | None, batch_id: int) -> None:
        identity = (key, query_id)
        self._last[identity] = max(batch_id, self._last.get(identity, batch_id))

    def _catch_up(self) -> None:
        metadata = self._consumer.list_topics(self.topic, timeout=TIMEOUT).topics[self.topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        for partition in sorted(metadata.partitions):
            low, end = watermark_offsets(self._consumer, self.topic, partition, TIMEOUT)
            start = max(self._positions.get(partition, 0), low)
            if start >= end:
                continue
            self._consumer.assign([TopicPartition(self.topic, partition, start)])
            try:
                for records in consume_range(self._consumer, self.topic, partition, start, end, TIMEOUT):
                    for record in records:
                        self._read_marker(record)
            finally:
                # An assigned consumer keeps fetching between lookups (and a broker that answers fetches
                # at the end of a partition at once makes that a busy loop on both sides).
                self._consumer.unassign()
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


def ensure_topic(settings: dict[str, Any], topic: str, partitions: int, compacted: bool = False,
                 config: dict[str, str] | None = None) -> None:
    """Create ``topic`` unless it exists (replication: the broker's default), with the topic settings
    ``config``."""
    try:
        create_missing_topics(AdminClient(settings), {topic: (partitions, compacted)}, TIMEOUT,
                              configs={topic: config or {}})
    except TopicCreationFailed as error:
        raise SinkError(str(error)) from error


# Topics known to exist, per Python worker process: a task asks Kafka only about topics new to it.
_EXISTING_TOPICS: set[str] = set()


class AtLeastOnceTaskSink(TaskSink):
    """Every record of every task at least once: a replayed task writes again."""

    _producers: ClassVar[dict[str, Producer]] = {}  # one idempotent producer per worker process and settings

    def __init__(self, settings: SinkSettings, task: MicroBatchTask) -> None:
        super().__init__(settings, task)
        producer_settings = settings.producer_settings(**{"enable.idempotence": True, "acks": "all"})
        identity = json.dumps(producer_settings, sort_keys=True, default=str)
        if identity not in self._producers:
            self._producers[identity] = Producer(producer_settings)
        self._kafka = self._producers[identity]

    def _producer(self) -> Producer:
        return self._kafka

    def abort(self) -> None:
        """The task failed, perhaps for its producer's fatal error: the process's next task gets a new one."""
        for identity, producer in list(self._producers.items()):
            if producer is self._kafka:
                del self._producers[identity]

    @classmethod
    def close_all(cls) -> None:
        """Close the producers this process keeps, once what they hold is delivered."""
        while cls._producers:
            cls._producers.popitem()[1].close()

    def commit(self) -> None:
        if not self.records:
            return
        producer = self._kafka
        try:
            with kafka_errors_unmasked():
                # librdkafka fails each record after message.timeout.ms (5 min by default): flush ends then.
                while producer.flush(1.0) and not self._failures:
                    pass
        except KafkaException as error:
            self.abort()
            raise self._failure("committing", error) from error
        undelivered = self._undelivered(self.records)
        if undelivered is not None:
            raise SinkError(f"batch {self.task.batch_id} partition {self.task.partition}: {undelivered}")


def partitions_committed(settings: SinkSettings) -> int:
    """How many state partitions of the query ``settings.query_name`` (or its earlier names) committed
    output transactions to Kafka, as their markers in the commit topic say (0 when it does not exist)."""
    admin = settings.admin_settings()
    if settings.commit_topic not in AdminClient(admin).list_topics(timeout=TIMEOUT).topics:
        return 0
    return BatchCommitLog.of(admin, settings.commit_topic).partitions_committed(
        (settings.query_name, *settings.earlier_query_names))


def close_sink_clients() -> None:
    """Close every Kafka client the sink keeps in this process across micro-batches."""
    TransactionalProducer.close_all()
    BatchCommitLog.close_all()
    AtLeastOnceTaskSink.close_all()


def task_sink(settings: SinkSettings, task: MicroBatchTask) -> TaskSink:
    return TransactionalTaskSink(settings, task) if settings.exactly_once else AtLeastOnceTaskSink(settings, task)


__all__ = ["AtLeastOnceTaskSink", "BatchCommitLog", "MicroBatchTask", "SinkError", "SinkSettings", "TaskSink",
           "TransactionalProducer", "TransactionalTaskSink", "close_sink_clients", "ensure_topic",
           "partitions_committed",
           "task_sink"]
