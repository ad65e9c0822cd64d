"""Which records Kafka has acknowledged, without a delivery report or a receipt per record.

confluent-kafka calls a Python function for each delivery report asked for; one per record would be a
large part of the agent's budget per mutation (benchmarks/RESULTS.md, "Agent"). The producer is idempotent and gapless
(``enable.gapless.guarantee``): Kafka acknowledges a partition's records in the order they were
produced, and a record that fails for good is a fatal producer error rather than a gap. So the
acknowledgement of one record covers every record produced before it to the same partition, and only
some records need a report ("markers"): every ``MARKER_INTERVAL``-th record of a partition, and the
last one of each partition before the agent pauses (``seal``). To know which record is a partition's
last, each partition's newest record is held back until the next one for it arrives or ``seal`` is
called.

A delivery report also carries the offset Kafka gave the record: per partition, the highest one is kept
(``acknowledged_offsets``), so that a restarted agent can tell whether a topic lost records it had
acknowledged.

Nor does the agent note anything per record: it takes a ``watermark`` now and then (each partition's
newest sequence number) and asks later whether Kafka has acknowledged everything up to it.

The agent picks each record's partition itself, as librdkafka's default partitioner does for keyed
records (CRC32 of the key modulo the partition count), so it knows the partition when producing.
"""

from __future__ import annotations

import functools
import operator
import time
import zlib
from typing import Callable

from confluent_kafka import KafkaError, Message

from .agent_metrics import LatencyHistogram
from .publisher import Publisher

MARKER_INTERVAL = 256

# Per partition slot (one per partition of each topic, numbered as topics are first sent to), the sequence
# number of the newest record sent to it when the watermark was taken; slots added later are not in it.
Watermark = tuple[int, ...]

_Held = tuple[str, int, bytes, bytes, int]  # topic, partition, key, value, sequence


class Deliveries:
    def __init__(self, publisher: Publisher, latency: LatencyHistogram) -> None:
        self._publisher = publisher
        self._latency = latency
        # Per partition slot: the highest sequence Kafka acknowledged, the newest sequence sent (records are
        # numbered 1, 2, ... per slot), the records produced since its last marker, and its newest record, held
        # back until the next one for it comes or ``seal``.
        self.acknowledged: list[int] = []
        self._acknowledged_offsets: list[int] = []  # per slot: the highest offset a report carried (-1: none)
        self._newest: list[int] = []
        self._since_marker: list[int] = []
        self._held: list[_Held | None] = []
        self._slots: dict[str, list[int]] = {}  # per topic: the slot of each partition

    def send(self, topic: str, key: bytes, value: bytes, should_stop: Callable[[], bool],
             partition: int | None = None) -> bool:
        """Queue a record (to ``partition``, or the key's). False if asked to stop while Kafka's queue was
        full: then the record, or the one it was to release, may not be queued, and the caller must not count
        it as published."""
        slots = self._slots.get(topic) or self._add_slots(topic)
        if partition is None:
            partition = zlib.crc32(key) % len(slots)
        slot = slots[partition]
        held = self._held[slot]
        if held is not None and not self._produce(slot, held, False, should_stop):
            return False
        self._newest[slot] = sequence = self._newest[slot] + 1
        self._held[slot] = (topic, partition, key, value, sequence)
        return True

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has."""
        return len(self._slots.get(topic) or self._add_slots(topic))

    def seal(self, should_stop: Callable[[], bool]) -> bool:
        """Queue the held records, each reporting its delivery; False if asked to stop meanwhile."""
        for slot, held in enumerate(self._held):
            if held is not None:
                if not self._produce(slot, held, True, should_stop):
                    return False
                self._held[slot] = None
        return True

    def watermark(self) -> Watermark:
        """Where every record sent so far stands: ``covers`` tells when Kafka has acknowledged them all."""
        return tuple(self._newest)

    def covers(self, watermark: Watermark) -> bool:
        """Whether Kafka has acknowledged every record sent before the watermark was taken."""
        return all(map(operator.ge, self.acknowledged, watermark))

    def acknowledged_offsets(self, topic: str) -> dict[int, int]:
        """Per partition of a topic: the highest offset Kafka acknowledged in a delivery report."""
        offsets = self._acknowledged_offsets
        return {partition: offsets[slot] for partition, slot in enumerate(self._slots.get(topic, ()))
                if offsets[slot] >= 0}

    def _produce(self, slot: int, held: _Held, last: bool, should_stop: Callable[[], bool]) -> bool:
        """Produce a held record; a marker (asking for a delivery report) if it is its partition's last before a
        pause or the ``MARKER_INTERVAL``-th since the previous marker."""
        topic, partition, key, value, sequence = held
        since_marker = self._since_marker[slot]
        if last or since_marker >= MARKER_INTERVAL:
            self._since_marker[slot] = 0
            report = functools.partial(self._delivered, slot, sequence, time.monotonic())
        else:
            self._since_marker[slot] = since_marker + 1
            report = None
        return self._publisher.publish(topic, key, value, report, should_stop, partition)

    def _delivered(self, slot: int, sequence: int, produced_at: float, error: KafkaError | None,
                   message: Message) -> None:
        if self._publisher.check(error, message):
            self.acknowledged[slot] = max(self.acknowledged[slot], sequence)
            self._acknowledged_offsets[slot] = max(self._acknowledged_offsets[slot], message.offset())
            self._latency.observe(time.monotonic() - produced_at)

    def _add_slots(self, topic: str) -> list[int]:
        """A slot for each partition of a topic sent to for the first time."""
        first = len(self.acknowledged)
        count = self._publisher.partition_count(topic)
        self.acknowledged += [0] * count
        self._acknowledged_offsets += [-1] * count
        self._newest += [0] * count
        self._since_marker += [0] * count
        self._held += [None] * count
        slots = self._slots[topic] = list(range(first, first + count))
        return slots
