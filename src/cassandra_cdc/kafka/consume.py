"""Reading Kafka partitions with a confluent-kafka ``Consumer``: what the Spark source, the event sink's
commit log, the schema catalog, ``cassandra-cdc tail`` and the demo's event feed share.

- ``consume_range``: the records of one partition's offsets ``[start, end)``, in chunks;
- ``consume_available``: what the consumer has queued, without waiting for a count that may never come;
- ``PauseAtEnd``: pauses the partitions read to their end, so an idle consumer does not busy-fetch;
- ``TopicFollower``: a topic's records to its end once, then only those added since, each time asked.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from .outage import unreachable

# Records per chunk of ``consume_range`` (so rows per Arrow record batch of the Spark source at most).
CONSUME_BATCH = 10_000
# How long a read waits for the next record when none is queued.
CONSUME_WAIT = 0.05
# How often ``PauseAtEnd`` reads the high watermarks; readers with every partition paused sleep this long.
END_CHECK_SECONDS = 0.3
# ``fetch.wait.max.ms`` of the consumers that are assigned only while they read to a known end (the source's
# ranges, the commit log, ``TopicFollower``): how long a broker holds a fetch that finds nothing new. A held
# fetch also holds back the consumer's next one to that broker (librdkafka has one in flight per broker), so
# that each read of a range cost the wait on Kafka (100 ms in the source, 500 by default); answered at once,
# a round trip. Unassigned once read, such consumers do not fetch in between.
READ_TO_END_FETCH_WAIT_MS = 0
# Errors librdkafka reports while it reconnects by itself: keep reading until the poll timeout.
_TRANSIENT = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
              KafkaError._DESTROY_BROKER, KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT,
              KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_LEADER_FOR_PARTITION,
              KafkaError.LEADER_NOT_AVAILABLE}


# How soon a watermark request that found its broker gone is made again.
WATERMARK_RETRY_SECONDS = 0.5


def watermark_offsets(consumer: Consumer, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """A partition's first and end offsets, asked of its leader; asked again, until ``timeout``, while the
    client reaches no broker for it: a killed broker of a cluster fails the requests in flight to it, and
    the client moves to the partition's new leader within moments."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout,
                                                       cached=False)
            return low, high
        except KafkaException as error:
            if not unreachable(error) or time.monotonic() >= deadline:
                raise
            time.sleep(WATERMARK_RETRY_SECONDS)


class KafkaSourceError(RuntimeError):
    """The source (or another reader of ``consume_range``) cannot go on: bad options, Kafka unreachable or
    refusing, offsets gone."""


class DataLossError(KafkaSourceError):
    """Offsets the query must read were deleted (retention, a recreated topic) or never were."""


def consume_range(consumer: Consumer, topic: str, partition: int, start: int, end: int,
                  poll_timeout: float) -> Iterator[list[Message]]:
    """The records of ``[start, end)`` of a partition the consumer is assigned at ``start``, in chunks.

    The record at ``end - 1`` may never arrive (a transaction marker, an aborted record): the range is
    complete when a record at or past ``end`` arrives or the consumer reaches the end of the partition
    (which the caller saw at or past ``end``). Needs ``enable.partition.eof``.
    """
    where = f"{topic}[{partition}]"
    next_offset = start
    deadline = time.monotonic() + poll_timeout
    while next_offset < end:
        wanted, records = next_offset, []
        for message in consume_available(consumer, min(CONSUME_BATCH, end - next_offset)):
            error = message.error()
            if error is None:
                records.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                if message.offset() >= end:
                    next_offset = end
            elif error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                raise DataLossError(f"data loss on {where}: offset {next_offset} is gone ({error.str()})")
            elif error.fatal() or error.code() not in _TRANSIENT:
                raise KafkaSourceError(f"reading {where} failed at offset {next_offset}: {error.str()}")
        if records and records[0].offset() < wanted:  # fetched for an earlier assignment
            records = [record for record in records if record.offset() >= wanted]
        if records and records[-1].offset() >= end:
            next_offset = end
            records = [record for record in records if record.offset() < end]
        if records:
            next_offset = max(next_offset, records[-1].offset() + 1)
            deadline = time.monotonic() + poll_timeout
            yield records
        elif next_offset < end and time.monotonic() > deadline:
            raise KafkaSourceError(f"no progress reading {where} for {poll_timeout:.0f} s "
                                   f"(stuck at offset {next_offset}, reading up to {end})")


def consume_available(consumer: Consumer, max_messages: int) -> list[Message]:
    """What the consumer has queued, up to ``max_messages``; when nothing is, the first message (record or
    event) to arrive within ``CONSUME_WAIT``.

    ``consume(n, timeout)`` returns early only once it has ``n`` messages, and a read seldom knows how
    many will come: a range can end with offsets that are never delivered (transaction markers, aborted
    records), so that its end is an end-of-partition event. Asking for exactly what is expected cost the
    whole timeout whenever fewer came: 50 ms per read of a commit topic, per task and micro-batch.
    """
    return consumer.consume(max_messages, timeout=0) or consumer.consume(1, timeout=CONSUME_WAIT)


class PauseAtEnd:
    """Pauses the partitions a consumer has read to their end, resumes them when records arrive.

    A consumer keeps sending fetch requests for every assigned partition; a broker answers an empty one
    after ``fetch.wait.max.ms``, but noida-db (the embedded broker) answers at once, so an idle consumer
    spins on it (a third of a core). Pausing a partition stops its fetches; its high watermark, read
    every ``END_CHECK_SECONDS``, says when to fetch again. (Positions move past transaction markers, so
    a partition read to its end has position == high watermark, also with read_committed.)
    """

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.paused: set[tuple[str, int]] = set()
        self._checked = 0.0

    def check(self, partitions: list[tuple[str, int]], force: bool = False) -> None:
        if not force and time.monotonic() - self._checked < END_CHECK_SECONDS:
            return
        self._checked = time.monotonic()
        positions = self.consumer.position([TopicPartition(t, p) for t, p in partitions])
        pause, resume = [], []
        for tp in positions:
            place = (tp.topic, tp.partition)
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                              timeout=5, cached=False)
            except KafkaException:
                continue
            at_end = high == 0 or tp.offset >= high  # a negative position: nothing read yet
            if at_end and place not in self.paused:
                pause.append(TopicPartition(*place))
                self.paused.add(place)
            elif not at_end and place in self.paused:
                resume.append(TopicPartition(*place))
                self.paused.discard(place)
        if pause:
            self.consumer.pause(pause)
        if resume:
            self.consumer.resume(resume)

    def all_paused(self, partitions: list[tuple[str, int]]) -> bool:
        return all(place in self.paused for place in partitions)


class TopicFollower:
    """Reads topics to their end once, then only what was added since, each time it is asked: for small
    topics read again and again (the schema catalog, the schema change topic). The consumer (created on
    first use, again after ``close``) needs ``enable.partition.eof``.

    Each read is on the way of a micro-batch (the catalog is refreshed by every merge task), so it must not
    wait where nothing comes: a partition is read to its end offset, and a transaction's last record is
    followed by its marker, never delivered (the end-of-partition event says the end is reached, and the
    next read starts there).
    """

    def __init__(self, settings: dict[str, Any], timeout: float) -> None:
        self._settings = {"fetch.wait.max.ms": READ_TO_END_FETCH_WAIT_MS, **settings}
        self._timeout = timeout
        self._consumer: Consumer | None = None
        self._next: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset to read

    def read(self, topic: str, handle: Callable[[Message], None]) -> bool:
        """``handle`` each record of ``topic`` added since the last read, in each partition's order;
        return whether there were any. A topic that does not exist has none."""
        handled = False
        consumer = self._consumer
        if consumer is None:
            consumer = self._consumer = Consumer(self._settings)
        metadata = consumer.list_topics(topic, timeout=self._timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            if metadata is not None and metadata.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaException(metadata.error)
            return False
        ends = {}
        for partition in metadata.partitions:
            low, high = watermark_offsets(consumer, topic, partition, self._timeout)
            start = max(self._next.get((topic, partition), 0), low)
            if high > start:
                ends[partition] = high
                self._next[topic, partition] = start
        if not ends:
            return False
        consumer.assign([TopicPartition(topic, partition, self._next[topic, partition])
                         for partition in ends])
        try:
            while ends:
                for message in consume_available(consumer, 1000):
                    partition, error = message.partition(), message.error()
                    if message.topic() != topic or partition not in ends:
                        continue
                    if error is None:
                        handle(message)
                        handled = True
                        self._next[topic, partition] = message.offset() + 1
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # The end can be a compacted-away record or a transaction marker: the next read
                        # starts past it (the event's offset), or it would wait for it again.
                        self._next[topic, partition] = max(self._next[topic, partition], message.offset())
                    else:
                        continue  # librdkafka retries by itself
                    if error is not None or self._next[topic, partition] >= ends[partition]:
                        del ends[partition]
        finally:
            consumer.unassign()
        return handled

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


__all__ = ["CONSUME_BATCH", "CONSUME_WAIT", "DataLossError", "END_CHECK_SECONDS", "KafkaSourceError",
           "PauseAtEnd", "READ_TO_END_FETCH_WAIT_MS", "TopicFollower", "consume_available", "consume_range"]
