"""Which records Kafka has acknowledged, without a delivery report per record.

confluent-kafka calls a Python function for each delivery report asked for; that costs about 2 µs a
record, a fifth of the agent's whole budget per mutation. The producer is idempotent and gapless
(``enable.gapless.guarantee``): Kafka acknowledges a partition's records in the order they were
produced, and a record that fails for good is a fatal producer error rather than a gap. So the
acknowledgement of one record covers every record produced before it to the same partition, and only
some records need a report ("markers"): every ``MARKER_INTERVAL``-th record of a partition, and the
last one of each partition before the agent pauses (``seal``). To know which record is a partition's
last, each partition's newest record is held back until the next one for it arrives or ``seal`` is
called.

The agent picks each record's partition itself, as librdkafka's default partitioner does for keyed
records (CRC32 of the key modulo the partition count), so it knows the partition when producing.
"""

from __future__ import annotations

import functools
import time
import zlib
from typing import Callable

from confluent_kafka import KafkaError, Message

from .metrics import LatencyHistogram
from .publisher import Publisher

MARKER_INTERVAL = 256

# A record's receipt: (partition slot, sequence number); it is acknowledged once the slot's acknowledged
# sequence reaches its own.
Receipt = tuple[int, int]
NOTHING: Receipt = (-1, 0)  # the receipt of an entry that published no record: acknowledged at once

_Held = tuple[str, int, bytes, bytes, int]  # topic, partition, key, value, sequence


class Deliveries:
    def __init__(self, publisher: Publisher, latency: LatencyHistogram) -> None:
        self._publisher = publisher
        self._latency = latency
        self.acknowledged: list[int] = []  # per partition slot: the highest sequence Kafka acknowledged
        self._slots: dict[tuple[str, int], int] = {}
        self._partitions: dict[str, int] = {}
        self._since_marker: list[int] = []
        self._held: dict[int, _Held] = {}
        self._sequence = 0

    def send(self, topic: str, key: bytes, value: bytes, should_stop: Callable[[], bool]) -> Receipt | None:
        """Queue a record. None if asked to stop while Kafka's queue was full: then the record, or the one it
        was to release, may not be queued, and the caller must not count it as published."""
        partition = zlib.crc32(key) % (self._partitions.get(topic) or self._partition_count(topic))
        slot = self._slots.get((topic, partition))
        if slot is None:
            slot = self._slots[(topic, partition)] = len(self.acknowledged)
            self.acknowledged.append(0)
            self._since_marker.append(0)
        held = self._held.get(slot)
        if held is not None:
            marker = self._since_marker[slot] >= MARKER_INTERVAL
            if not self._produce(slot, held, marker, should_stop):
                return None
        self._sequence += 1
        self._held[slot] = (topic, partition, key, value, self._sequence)
        return slot, self._sequence

    def seal(self, should_stop: Callable[[], bool]) -> bool:
        """Queue the held records, each reporting its delivery; False if asked to stop meanwhile."""
        for slot in list(self._held):
            if not self._produce(slot, self._held[slot], True, should_stop):
                return False
        return True

    def is_acknowledged(self, receipt: Receipt) -> bool:
        slot, sequence = receipt
        return slot < 0 or self.acknowledged[slot] >= sequence

    def _produce(self, slot: int, held: _Held, marker: bool, should_stop: Callable[[], bool]) -> bool:
        topic, partition, key, value, sequence = held
        report = None
        if marker:
            self._since_marker[slot] = 0
            report = functools.partial(self._delivered, slot, sequence, time.monotonic())
        else:
            self._since_marker[slot] += 1
        if not self._publisher.publish(topic, key, value, report, should_stop, partition=partition):
            return False
        del self._held[slot]
        return True

    def _delivered(self, slot: int, sequence: int, produced_at: float, error: KafkaError | None,
                   _message: Message) -> None:
        if self._publisher.check(error):
            self.acknowledged[slot] = max(self.acknowledged[slot], sequence)
            self._latency.observe(time.monotonic() - produced_at)

    def _partition_count(self, topic: str) -> int:
        self._partitions[topic] = count = self._publisher.partition_count(topic)
        return count
