"""What a Spark task of a bootstrap does, in a Python worker: read its range of one SSTable and publish
the partitions as raw records.

The producer is idempotent with ``acks=all``; the task flushes at its end and raises if any record was
not acknowledged, so a task that returns has all its records in Kafka. A task that fails midway may
have published some of its records: running it again publishes the same bytes again, which the
pipeline drops as copies (same key and digest).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..schema import TableMetadata
from ..sstable import SSTable, SSTableError, SSTableReadStats
from ..kafka.raw_records import RawRecord
from .bootstrap_errors import BootstrapError
from .task_plan import SSTableSlice
from .sstable_records import RecordBuilder, RecordLimits, RecordStats

DEFAULT_PRODUCER: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "batch.size": 1 << 20,
    "compression.type": "lz4",
    "queue.buffering.max.kbytes": 64 * 1024,
    "message.timeout.ms": 300_000,  # a task stuck that long fails (retried or reported) rather than hang
}
FLUSH_TIMEOUT_SECONDS = 600.0
_POLL_EVERY = 256


@dataclass(frozen=True)
class PublishSettings:
    """Everything a task needs, pickled to the workers."""

    bootstrap_servers: str
    raw_topic: str
    table: TableMetadata
    producer: dict[str, Any] = field(default_factory=dict)
    limits: RecordLimits = RecordLimits()


@dataclass(kw_only=True)
class TaskResult(RecordStats):
    """What one task read and published: the record builder's counts, and what the task cost."""

    task_id: str
    node_id: str
    data_bytes: int = 0  # uncompressed Data.db bytes covered
    file_bytes: int = 0  # Data.db bytes read (compressed)
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TaskHook = Callable[[SSTableSlice], None]


def publish_tasks(tasks: Iterator[SSTableSlice], settings: PublishSettings, completed: Any = None,
                  hook: TaskHook | None = None) -> Iterator[dict[str, Any]]:
    """``mapPartitions`` function: run each task, add it to the ``completed`` accumulator, yield its
    result."""
    for task in tasks:
        if hook is not None:
            hook(task)
        result = publish_task(task, settings).as_dict()
        if completed is not None:
            completed.add([result])
        yield result


def publish_task(task: SSTableSlice, settings: PublishSettings) -> TaskResult:
    """Publish the partitions of one task; return once Kafka acknowledged every record."""
    started, cpu_started = time.monotonic(), time.process_time()
    builder = RecordBuilder(SSTable(task.path), settings.table, task.node_id, settings.limits)
    read_stats = SSTableReadStats()
    sender = _Sender(settings)
    try:
        for key, records in builder.read(task.data_range, read_stats):
            sender.send(key, records)
        sender.finish()
    except SSTableError as error:
        raise BootstrapError(f"task {task.task_id}: {error}") from None
    finally:
        sender.close()
    return TaskResult(**asdict(builder.stats), task_id=task.task_id, node_id=task.node_id,
                      data_bytes=task.data_bytes, file_bytes=read_stats.file_bytes,
                      seconds=time.monotonic() - started, cpu_seconds=time.process_time() - cpu_started)


class _Sender:
    """Produce records; remember the first delivery failure; ``finish`` waits for every acknowledgement."""

    def __init__(self, settings: PublishSettings) -> None:
        self.topic = settings.raw_topic
        self.failure: str | None = None
        self.sent = 0
        self._producer = Producer({"bootstrap.servers": settings.bootstrap_servers, **DEFAULT_PRODUCER,
                                   **settings.producer, "error_cb": self._on_error})

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal() and self.failure is None:
            self.failure = f"fatal Kafka producer error: {error}"

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None and self.failure is None:
            self.failure = f"Kafka did not accept a record of {self.topic}: {error}"

    def send(self, key: bytes, records: list[RawRecord]) -> None:
        producer = self._producer
        for record in records:
            value = record.encode()
            while True:
                try:
                    producer.produce(self.topic, value, key, on_delivery=self._on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
                    self._raise_failure()
                except KafkaException as error:
                    raise BootstrapError(f"cannot publish the partition {key[16:].hex()} at offset "
                                         f"{record.position} ({len(value)} bytes): {error.args[0]}") from None
            self.sent += 1
            if self.sent % _POLL_EVERY == 0:
                producer.poll(0)
                self._raise_failure()

    def finish(self) -> None:
        deadline = time.monotonic() + FLUSH_TIMEOUT_SECONDS
        while len(self._producer) and time.monotonic() < deadline:
            self._producer.flush(1.0)
            self._raise_failure()
        self._raise_failure()
        if len(self._producer):
            raise BootstrapError(f"{len(self._producer)} records not acknowledged by Kafka after "
                                 f"{FLUSH_TIMEOUT_SECONDS:.0f} s")

    def close(self) -> None:
        # Records still queued (after a failure) are abandoned; the task fails and is run again.
        self._producer.purge()
        self._producer.flush(0)

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise BootstrapError(self.failure)


__all__ = ["DEFAULT_PRODUCER", "PublishSettings", "TaskHook", "TaskResult", "publish_task", "publish_tasks"]
