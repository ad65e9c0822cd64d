"""The demo's reader of the event topics: one background thread, read_committed, from the beginning.

It keeps what the view shows (events per table and operation, throughput, write → event latency, the
latest events) and what the final check needs (every CDC table replayed from its events, the dead
letters, which events carry the added column). Topics are discovered as the pipeline creates them and
assigned by hand (no consumer group to rebalance).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from .table_check import ReplayedTable
from ..events.event_text import changes_text, key_text
from ..kafka.consume import END_CHECK_SECONDS, PauseAtEnd
from ..kafka.security import LibrdkafkaLog

log = logging.getLogger(__name__)

TOPIC_REFRESH_SECONDS = 1.0
WINDOW_SECONDS = 5.0  # throughput and latency are shown over this window


@dataclass(frozen=True)
class RecentEvent:
    op: str
    table: str
    key: str
    changes: str
    write_time_us: int


@dataclass
class FeedSnapshot:
    """A consistent copy of the feed's figures, for one frame of the view."""

    counts: dict[tuple[str, str], int]
    total: int
    events_per_second: float
    latency_p50: float | None
    latency_max: float | None
    recent: list[RecentEvent]
    dead_letters: int
    topics: set[str] = field(default_factory=set)


class EventFeed:
    """Consumes ``<server>.<keyspace>.<table>`` topics and ``<server>.errors`` until ``stop()``.

    ``tables`` maps each CDC table (``keyspace.table``) to its primary key columns; ``watched_column``
    (table, column) is a column whose presence in events is tracked (the demo's schema change).
    """

    def __init__(self, bootstrap_servers: str, server: str, tables: Mapping[str, list[str]],
                 watched_column: tuple[str, str] | None = None) -> None:
        self.server = server
        self.errors_topic = f"{server}.errors"
        self._consumer_settings = {
            "bootstrap.servers": bootstrap_servers, "group.id": f"cassandra-cdc-demo-{uuid.uuid4()}",
            "enable.auto.commit": False, "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # A broker down for a while (demo --chaos) would flood the view with connection attempts.
            "logger": LibrdkafkaLog()}
        self.replayed = {table: ReplayedTable(keys) for table, keys in tables.items()}
        self._key_columns = {table: list(keys) for table, keys in tables.items()}
        self._watched = watched_column
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-feed", daemon=True)
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._total = 0
        self._arrivals: collections.deque[tuple[float, int]] = collections.deque()
        self._latencies: collections.deque[tuple[float, float]] = collections.deque()
        self._recent: collections.deque[RecentEvent] = collections.deque(maxlen=8)
        self._dead_letters = 0
        self.dead_letter_samples: list[str] = []
        self._topics: set[str] = set()
        self._assigned: set[tuple[str, int]] = set()
        # The schema change: write times of the watched table's events without the column, and how many
        # events carry a value in it.
        self.without_column_us: list[int] = []
        self.with_column_values = 0
        # Exactly once: a digest of every event read, and the events read a second time.
        self._digests: set[tuple[str, bytes]] = set()
        self.duplicates = 0
        self.duplicate_samples: list[str] = []
        self.error: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "EventFeed":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)

    # --- what the view and the check read -------------------------------------------------------

    def snapshot(self) -> FeedSnapshot:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            arrived = sum(n for _, n in self._arrivals)
            latencies = sorted(latency for _, latency in self._latencies)
            return FeedSnapshot(
                dict(self._counts), self._total, arrived / WINDOW_SECONDS,
                latencies[len(latencies) // 2] if latencies else None, latencies[-1] if latencies else None,
                list(self._recent), self._dead_letters, set(self._topics))

    def rows(self, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
        """A copy of the table as replayed from its events so far."""
        with self._lock:
            return dict(self.replayed[table].rows)

    # --- consuming ------------------------------------------------------------------------------

    def _run(self) -> None:
        consumer = Consumer(self._consumer_settings)
        ends = PauseAtEnd(consumer)
        try:
            refreshed = 0.0
            while not self._stopping.is_set():
                if time.monotonic() - refreshed >= TOPIC_REFRESH_SECONDS:
                    self._assign_new_partitions(consumer)
                    refreshed = time.monotonic()
                assigned = sorted(self._assigned)
                if assigned:
                    ends.check(assigned)
                if not assigned or ends.all_paused(assigned):
                    self._stopping.wait(END_CHECK_SECONDS)
                    continue
                messages = consumer.consume(1000, timeout=0.2)
                if messages:
                    self._handle(messages)
        except BaseException as error:  # shown by the demo, which then stops
            log.exception("the event feed failed")
            self.error = error
        finally:
            consumer.close()

    def _assign_new_partitions(self, consumer: Consumer) -> None:
        try:
            topics = consumer.list_topics(timeout=5).topics
        except KafkaException:
            return  # the broker is busy or going away: try again at the next refresh
        new = []
        for name, metadata in topics.items():
            if not (self._is_event_topic(name) or name == self.errors_topic) or metadata.error is not None:
                continue
            for partition in metadata.partitions:
                if (name, partition) not in self._assigned:
                    self._assigned.add((name, partition))
                    new.append(TopicPartition(name, partition, OFFSET_BEGINNING))
        if new:
            consumer.incremental_assign(new)
            with self._lock:
                self._topics.update(tp.topic for tp in new)

    def _is_event_topic(self, name: str) -> bool:
        prefix = self.server + "."
        return name.startswith(prefix) and name[len(prefix):].count(".") == 1

    def _handle(self, messages: list[Any]) -> None:
        now = time.monotonic()
        wall_ms = time.time() * 1000
        arrived = 0
        with self._lock:
            for message in messages:
                if message.error() is not None:
                    continue
                topic, value = message.topic(), message.value()
                if topic == self.errors_topic:
                    self._dead_letters += 1
                    if len(self.dead_letter_samples) < 5 and value:
                        self.dead_letter_samples.append(value[:600].decode("utf-8", "replace"))
                    continue
                if value is None:
                    continue  # a tombstone following a delete (output.tombstones)
                digest = (topic, hashlib.blake2b(value, digest_size=16).digest())
                if digest in self._digests:
                    self.duplicates += 1
                    if len(self.duplicate_samples) < 3:
                        self.duplicate_samples.append(value[:600].decode("utf-8", "replace"))
                self._digests.add(digest)
                payload = json.loads(value)["payload"]
                table = topic[len(self.server) + 1:]
                op = payload["op"]
                self._counts[(table, op)] += 1
                self._total += 1
                arrived += 1
                replayed = self.replayed.get(table)
                if replayed is not None:
                    replayed.apply(payload)
                source = payload["source"]
                if source.get("node") is not None:  # a write, not a TTL expiry the pipeline timed itself
                    self._latencies.append((now, max(0.0, (wall_ms - source["ts_us"] / 1000) / 1000)))
                self._track_column(table, payload)
                row = payload["after"] if op != "d" else payload["before"]
                keys = self._key_columns.get(table)
                self._recent.append(RecentEvent(op, table, key_text(row, keys), changes_text(payload, keys),
                                                source["ts_us"]))
            if arrived:
                self._arrivals.append((now, arrived))
            self._trim(now)

    def _track_column(self, table: str, payload: Mapping[str, Any]) -> None:
        if self._watched is None or table != self._watched[0]:
            return
        row = payload["after"] if payload["after"] is not None else payload["before"]
        if row is None:
            return  # a truncation
        column = self._watched[1]
        if column not in row:
            self.without_column_us.append(payload["source"]["ts_us"])
        elif row[column] is not None:
            self.with_column_values += 1

    def _trim(self, now: float) -> None:
        for window in (self._arrivals, self._latencies):
            while window and window[0][0] < now - WINDOW_SECONDS:
                window.popleft()


__all__ = ["EventFeed", "FeedSnapshot", "RecentEvent"]
