"""Publishing to Kafka without ever dropping a record.

An idempotent producer (``acks=all``) that never times a message out: while Kafka is unreachable,
librdkafka keeps retrying in order and its bounded queue fills, so ``publish`` blocks and the agent
stops reading (back-pressure). A delivery that fails for good stops the agent: it resumes from its
last saved position, so nothing is lost (the unacknowledged tail is published again).

librdkafka's own log (a line per failed connection attempt, several a second while Kafka is away) is kept
for ``--log-level DEBUG``: what a user must know comes through ``error_cb``, one line per change.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from ..kafka.admin import admin_settings, create_missing_topics, grow_if_empty
from ..kafka.security import LibrdkafkaLog, LoginCheck
from .record_size import raise_topic_limit
from ..settings import ConfigError

log = logging.getLogger(__name__)
Acknowledge = Callable[[KafkaError | None, Message], None]
DescribeRecord = Callable[[str, bytes, bytes], str]
T = TypeVar("T")


class DeliveryFailed(RuntimeError):
    """Kafka refused a record for good (not a transient outage)."""


class Publisher:
    def __init__(self, bootstrap_servers: str, max_buffered_bytes: int, extra: dict[str, Any] | None = None,
                 on_reachability: Callable[[bool], None] | None = None,
                 describe_record: DescribeRecord = lambda topic, key, value: f"a record to {topic}") -> None:
        """``describe_record`` names a record (topic, key, value) in the line that says Kafka refused it."""
        self.bootstrap_servers = bootstrap_servers
        settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            # A record that fails for good is a fatal error, never a gap: deliveries.py relies on it.
            "enable.gapless.guarantee": True,
            "acks": "all",
            "message.timeout.ms": 0,  # never give up on a record: order and completeness over latency
            "linger.ms": 5,
            "compression.type": "lz4",
            "queue.buffering.max.kbytes": max(1, max_buffered_bytes // 1024),
            "queue.buffering.max.messages": 2_000_000,
            "error_cb": self._on_error,
            "logger": LibrdkafkaLog(),
        }
        settings.update(extra or {})
        self._producer = Producer(settings)
        self._login = LoginCheck()
        self._admin_settings = {**admin_settings(settings), **self._login.settings()}
        self._admin: AdminClient | None = None  # one for every attempt: each new client logs its own failures
        self._on_reachability = on_reachability
        self._describe_record = describe_record
        self.reachable = True
        self.failure: DeliveryFailed | None = None
        self._errors_logged: set[int] = set()
        self._closing = False

    def _on_error(self, error: KafkaError) -> None:
        if self._closing:
            return  # what a client being closed reports (brokers it no longer reaches) is no news
        if error.fatal():
            self._fail(_fatal_error_message(error))
        elif error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE):
            self._set_reachable(False)
        elif error.code() not in self._errors_logged:  # authentication, TLS: said once, not per retry
            self._errors_logged.add(error.code())
            log.warning("Kafka: %s", error.str())

    def _set_reachable(self, reachable: bool) -> None:
        if reachable != self.reachable:
            self.reachable = reachable
            if self._on_reachability is not None:
                self._on_reachability(reachable)

    def ensure_topics(self, topics: dict[str, tuple[int, bool]], timeout: float = 30.0,
                      configs: dict[str, dict[str, str]] | None = None) -> None:
        """Create missing topics: name -> (partitions, compacted), with the topic settings of ``configs``.
        Existing topics are left as they are.

        Raises ``ConfigError`` when the brokers refuse the agent's login or TLS (kafka.security)."""
        self._administer(lambda admin: create_missing_topics(admin, topics, timeout, configs=configs))

    def raise_topic_limit(self, topic: str, wanted: int,
                          timeout: float = 30.0) -> tuple[int, int | None, str | None]:
        """``record_size.raise_topic_limit`` with the agent's admin client; a ``ConfigError`` as in
        ``ensure_topics``."""
        return self._administer(lambda admin: raise_topic_limit(admin, topic, wanted, timeout))

    def grow_if_empty(self, topic: str, partitions: int, timeout: float = 30.0) -> tuple[int, bool]:
        """``kafka.admin.grow_if_empty`` with the agent's admin client; a ``ConfigError`` as in
        ``ensure_topics``."""
        return self._administer(lambda admin: grow_if_empty(admin, topic, partitions, timeout))

    def _administer(self, request: Callable[[AdminClient], T]) -> T:
        """``request`` with the admin client; a ``ConfigError`` when the brokers refuse its login or TLS."""
        if self._admin is None:
            self._admin = AdminClient(self._admin_settings)
        self._admin.poll(0)  # serves its log
        try:
            return request(self._admin)
        except KafkaException:
            refused = self._login.refusal(self._admin, self.bootstrap_servers)
            if refused is not None:
                raise ConfigError(refused) from None
            raise

    def publish(self, topic: str, key: bytes, value: bytes, on_delivery: Acknowledge | None,
                should_stop: Callable[[], bool] = lambda: False, partition: int = -1) -> bool:
        """Queue one record (to the partition librdkafka picks when -1); block while the queue is full.
        Return False if asked to stop meanwhile."""
        while True:
            try:
                # All positional (the fifth is on_delivery): confluent-kafka parses keyword arguments slowly,
                # on the agent's per-record path.
                self._producer.produce(topic, value, key, partition, on_delivery)
                return True
            except BufferError:
                self.poll(0.05)  # wait for acknowledgements to make room
                if should_stop():
                    return False
            except KafkaException as error:  # refused before it was queued (MSG_SIZE_TOO_LARGE, say)
                raise DeliveryFailed(self._refused(topic, key, value, error.args[0])) from None

    def partition_count(self, topic: str, timeout: float = 30.0) -> int:
        metadata = self._producer.list_topics(topic, timeout=timeout).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        return len(metadata.partitions)

    def check(self, error: KafkaError | None, message: Message) -> bool:
        """For delivery callbacks: True if delivered; records a permanent failure otherwise (not for a record
        ``close`` dropped)."""
        if error is None:
            if not self.reachable:
                self._set_reachable(True)
            return True
        if self._closing:
            return False  # dropped by ``close``
        self._fail(self._refused(message.topic(), message.key() or b"", message.value() or b"", error))
        return False

    def _refused(self, topic: str, key: bytes, value: bytes, error: KafkaError) -> str:
        """One line: which record Kafka refused, its size, why, and that nothing after it is saved."""
        return (f"Kafka refused {self._describe_record(topic, key, value)}, {len(key) + len(value):,} bytes: "
                f"{error.str()}; no position is saved past it, and the restarted agent publishes it again")

    def poll(self, timeout: float = 0.0) -> None:
        self._serve(timeout)
        self.raise_failure()

    def _serve(self, timeout: float) -> None:
        """Serve delivery reports and errors; a fatal error the client raises becomes ``failure``."""
        try:
            self._producer.poll(timeout)
        except KafkaException as error:
            self._fail(_fatal_error_message(error.args[0]))

    def _fail(self, message: str) -> None:
        """Record a failure for good; the first one is the cause (the records it fails report after it)."""
        if self.failure is None:
            self.failure = DeliveryFailed(message)

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def flush(self, timeout: float) -> int:
        """Wait for in-flight records; return how many are still unacknowledged."""
        deadline = time.monotonic() + timeout
        while len(self._producer) and time.monotonic() < deadline and self.failure is None:
            self._serve(0.1)
        return len(self._producer)

    def close(self) -> None:
        """Close the Kafka clients: their threads and connections end now. Records not acknowledged yet are
        dropped rather than waited for (for ever while Kafka is away: no record ever times out); no saved
        position is past them, so the restarted agent publishes them again."""
        self._closing = True
        self._producer.purge()
        self._producer.close()
        self._admin = None  # no other reference: its client is destroyed here

    @property
    def in_flight(self) -> int:
        return len(self._producer)


def _fatal_error_message(error: KafkaError) -> str:
    if error.code() == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER:
        return (f"Kafka lost records it had acknowledged ({error.str()}: a broker restarted without them, "
                "or an unclean leader election): records acknowledged before this may be missing from the "
                "topics; no position is saved past this point, and the restarted agent publishes again from "
                "the positions in positions.json; check the brokers' durability settings (acks=all needs "
                "min.insync.replicas >= 2, unclean.leader.election.enable=false)")
    return f"Kafka failed the producer for good: {error.str()}; no position is saved past this point"
