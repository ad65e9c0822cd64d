"""The agent: tails ``cdc_raw`` and publishes every change of a CDC table to Kafka, losing nothing.

One pass over ``cdc_raw`` reads each segment from its saved position up to what Cassandra has made
durable (the ``_cdc.idx`` offset; a 3.x segment is complete when it appears), oldest segment first,
and never past a segment that is still being written, so changes to a partition reach Kafka in the
order the node wrote them. A segment's position only advances over entries whose records Kafka has
acknowledged; a segment is cleaned up once it is COMPLETED and fully acknowledged.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import deque

from confluent_kafka import KafkaError, Message

from ..commitlog import Damage, KeyStore, SegmentReader, UnknownTableError
from ..commitlog.errors import CommitLogError, MutationDecodeError
from ..commitlog.mutation import split_partition_updates
from ..commitlog.partition import peek_min_timestamp
from ..commitlog.reader import DamageKind, Entry
from ..schema import TableMetadata
from ..topics.raw import RawRecord, record_key
from ..topics.schemas import SchemaRecord
from .cdc_raw import CdcSegment, ChangeNotifier, cdc_raw_bytes, list_segments, read_cdc_index
from .config import AgentConfig
from .metrics import AgentMetrics
from .publisher import Publisher
from .state import PositionStore
from .tables import TableRegistry

log = logging.getLogger(__name__)

SHUTDOWN_FLUSH_SECONDS = 30.0
SPACE_CHECK_SECONDS = 1.0


class SegmentProgress:
    """Entries of one segment in flight to Kafka, oldest first.

    Each entry is ``[position, records not yet acknowledged]``; the acknowledged position moves over
    the leading entries whose records are all acknowledged.
    """

    def __init__(self, segment: CdcSegment, acknowledged: int, completed: bool = False) -> None:
        self.segment = segment
        self.acknowledged = acknowledged
        self.read_position = acknowledged
        self.read_all = completed
        self.index_offset: int | None = None
        self.changed_at = time.monotonic()
        self._in_flight: deque[list[int]] = deque()

    def add(self, position: int, records: int) -> list[int]:
        entry = [max(position, self._in_flight[-1][0] if self._in_flight else position), records]
        self._in_flight.append(entry)
        self.advance()
        return entry

    def advance(self) -> None:
        in_flight = self._in_flight
        while in_flight and in_flight[0][1] == 0:
            self.acknowledged = max(self.acknowledged, in_flight.popleft()[0])

    @property
    def done(self) -> bool:
        return self.read_all and not self._in_flight


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.metrics = AgentMetrics()
        self.positions = PositionStore(config.state_dir)
        self.tables = TableRegistry(config)
        self.keystore = _keystore(config)
        self.publisher = Publisher(config.kafka.bootstrap_servers, config.kafka.max_buffered_bytes,
                                   config.kafka.producer, on_reachability=self._kafka_reachability)
        self.notifier = ChangeNotifier(config.cdc_raw)
        self._progress: dict[int, SegmentProgress] = {}
        self._schemas_published: dict[uuid.UUID, str] = {}
        self._stopping = threading.Event()
        self._last_flush = self._last_space_check = 0.0
        self._space_warned = False
        config.quarantine.mkdir(parents=True, exist_ok=True)

    # --- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self.notifier.wake()

    def run(self) -> int:
        """Run until stopped (SIGTERM/SIGINT); return the process exit status."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        self.metrics.serve(self.config.metrics.host, self.config.metrics.port)
        self.publisher.ensure_topics({
            self.config.raw_topic: (self.config.kafka.raw_topic_partitions, False),
            self.config.schema_topic: (1, True),
            self.config.errors_topic: (1, False),
        })
        log.info("agent %s tailing %s into %s", self.config.node_id, self.config.cdc_raw, self.config.raw_topic)
        self.notifier.start()
        try:
            while not self._stopping.is_set():
                progressed = self.run_once()
                if not progressed:
                    self._wait_for_change()
        finally:
            self.notifier.stop()
            remaining = self.publisher.flush(SHUTDOWN_FLUSH_SECONDS)
            self._save_positions()
            if remaining:
                log.warning("agent stopped with %d records unacknowledged: they are published again on restart",
                            remaining)
            else:
                log.info("agent stopped; everything read is acknowledged")
        return 0

    def _wait_for_change(self) -> None:
        deadline = time.monotonic() + self.config.poll_interval_ms / 1000
        while not self._stopping.is_set() and time.monotonic() < deadline:
            if self.notifier.wait(0.02):
                return
            self._housekeeping()

    def run_once(self) -> bool:
        """One pass over cdc_raw; return whether anything new was read."""
        progressed = False
        segments = list_segments(self.config.cdc_raw)
        for index, segment in enumerate(segments):
            if self._stopping.is_set():
                break
            progress = self._progress_of(segment)
            if progress.read_all:
                if progress.done:
                    self._finish(progress)
                continue
            extent = self._readable_extent(progress, segments[index + 1:])
            if extent is None:
                continue
            limit, final = extent
            if limit is None or limit > progress.read_position:
                progressed |= self._read(progress, limit, final)
            elif final:
                progress.read_all = True
            if not progress.read_all:
                break  # newer segments wait until this one is complete: per-partition order
        self._housekeeping()
        return progressed

    # --- reading ----------------------------------------------------------------------------------

    def _progress_of(self, segment: CdcSegment) -> SegmentProgress:
        progress = self._progress.get(segment.segment_id)
        if progress is None:
            saved = self.positions.get(segment.segment_id)
            progress = SegmentProgress(segment, saved.position if saved else 0, saved.completed if saved else False)
            self._progress[segment.segment_id] = progress
        return progress

    def _readable_extent(self, progress: SegmentProgress, newer: list[CdcSegment]) -> tuple[int | None, bool] | None:
        """(limit, final) for the next read of a segment, or None when there is nothing to read yet.

        A None limit reads to the end of the segment.
        """
        segment = progress.segment
        index = read_cdc_index(segment.index_path)
        if index is None:
            if segment.index_path.exists():
                return None  # caught mid-rewrite: read it again on the next pass
            if segment.version == 6:
                return None, True  # Cassandra 3.x moves a segment in once it is complete
            return None  # 4.0+: no CDC data in this segment (yet)
        if index.offset != progress.index_offset:
            progress.index_offset = index.offset
            progress.changed_at = time.monotonic()
        if index.completed:
            return index.offset, True
        idle = time.monotonic() - progress.changed_at
        if newer and idle >= self.config.stale_segment_seconds and any(s.index_path.exists() for s in newer):
            log.warning("%s was never COMPLETED (the node restarted?) and newer segments have data: "
                        "reading it to its end", segment.path.name)
            return None, True
        return index.offset, False

    def _read(self, progress: SegmentProgress, limit: int | None, final: bool) -> bool:
        segment = progress.segment
        read_any = False
        on_damage = functools.partial(self._dead_letter, progress)
        try:
            reader = SegmentReader(segment.path, self.keystore, start=progress.read_position, limit=limit,
                                   on_damage=on_damage)
        except FileNotFoundError:
            return False  # removed meanwhile (Cassandra discards segments without CDC data)
        except CommitLogError as error:
            if final:
                log.error("%s cannot be read (%s): skipping it", segment.path, error.reason)
                progress.read_all = True
            return False
        with reader:
            stopped = False
            for entry in reader.entries():
                self._publish_entry(progress, reader.version, entry)
                progress.read_position = entry.position
                read_any = True
                if self._stopping.is_set():
                    stopped = True
                    break
            if not stopped:
                progress.read_position = max(progress.read_position, reader.position)
                if final:
                    progress.read_all = True
        return read_any

    def _publish_entry(self, progress: SegmentProgress, version: int, entry: Entry) -> None:
        try:
            updates = split_partition_updates(entry.body, self.tables.schema, version)
        except UnknownTableError as error:
            if self.tables.lookup(error.table_id) is None:
                self._skip(progress, entry)
                return
            updates = split_partition_updates(entry.body, self.tables.schema, version)
        except MutationDecodeError as error:
            self._dead_letter(progress, Damage(str(progress.segment.path), DamageKind.UNDECODABLE_MUTATION,
                                               str(error), entry.section_offset, 0, entry.start, entry.body))
            return
        published: list[tuple[TableMetadata, bytes]] = []
        for table_id, update in updates:
            table = self.tables.lookup(table_id)
            if table is None:
                self._skip(progress, entry)  # Cassandra drops the whole mutation
                return
            self.metrics.mutations_read.labels(table.qualified_name).inc()
            if self.tables.is_published(table):
                published.append((table, update))
        slot = progress.add(entry.position, len(published))
        for table, update in published:
            self._ensure_schema_published(table)
            record = RawRecord(self.config.node_id, progress.segment.segment_id, entry.position, version,
                               peek_min_timestamp(update) or 0, update)
            acknowledge = functools.partial(self._acknowledged, progress, slot, table.qualified_name, time.monotonic())
            if not self.publisher.publish(self.config.raw_topic, record_key(update), record.encode(), acknowledge,
                                          self._while_blocked):
                return

    def _skip(self, progress: SegmentProgress, entry: Entry) -> None:
        self.metrics.skipped.inc()
        progress.add(entry.position, 0)

    def _acknowledged(self, progress: SegmentProgress, slot: list[int], table: str, produced_at: float,
                      error: KafkaError | None, _message: Message) -> None:
        if self.publisher.check(error):
            slot[1] -= 1
            progress.advance()
            self.metrics.records_published.labels(table).inc()
            self.metrics.delivery_latency.observe(time.monotonic() - produced_at)

    def _ensure_schema_published(self, table: TableMetadata) -> None:
        """Publish (and wait for) the table's schema before its first record or after it changed."""
        version = table.version_hash()
        if self._schemas_published.get(table.id) == version:
            return
        record = SchemaRecord.of(table, self.config.node_id)
        delivered: list[KafkaError | None] = []
        self.publisher.publish(self.config.schema_topic, record.key, record.encode(),
                               lambda error, _: delivered.append(error), self._while_blocked)
        while not delivered and not self._stopping.is_set():
            self.publisher.poll(0.05)
        if delivered and self.publisher.check(delivered[0]):
            self._schemas_published[table.id] = version
            log.info("published the schema of %s (version %s)", table.qualified_name, version)

    # --- damage -----------------------------------------------------------------------------------

    def _dead_letter(self, progress: SegmentProgress, damage: Damage) -> None:
        """A damaged entry or section: to the errors topic and the quarantine directory, then on."""
        self.metrics.errors.labels(damage.kind.name.lower()).inc()
        log.error("%s", damage)
        segment = progress.segment
        where = damage.position if damage.position is not None else damage.file_offset
        report = {"node": self.config.node_id, "segment": segment.path.name, "segment_id": segment.segment_id,
                  "section": damage.section, "file_offset": damage.file_offset, "position": damage.position,
                  "kind": damage.kind.name, "reason": f"{damage.kind.value}: {damage.detail}",
                  "raw": base64.b64encode(damage.raw).decode()}
        stem = self.config.quarantine / f"{segment.path.name}@{where}"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
        if damage.raw:
            stem.with_suffix(".bin").write_bytes(damage.raw)
        slot = progress.add(where, 1)
        acknowledge = functools.partial(self._acknowledged, progress, slot, "errors", time.monotonic())
        self.publisher.publish(self.config.errors_topic, f"{segment.path.name}@{where}".encode(),
                               json.dumps(report).encode(), acknowledge, self._while_blocked)

    # --- housekeeping -----------------------------------------------------------------------------

    def _while_blocked(self) -> bool:
        """Called while Kafka's queue is full: keep the bookkeeping going; True means stop waiting."""
        self._housekeeping()
        return self._stopping.is_set()

    def _housekeeping(self) -> None:
        self.publisher.poll(0)
        now = time.monotonic()
        if now - self._last_flush >= self.config.state_flush_ms / 1000:
            self._last_flush = now
            self._save_positions()
        if now - self._last_space_check >= SPACE_CHECK_SECONDS:
            self._last_space_check = now
            self._check_space()

    def _save_positions(self) -> None:
        behind = 0
        for segment_id, progress in self._progress.items():
            self.positions.set(segment_id, progress.segment.path.name, progress.acknowledged, progress.done)
            if progress.index_offset is not None:
                behind += max(0, progress.index_offset - progress.acknowledged)
        self.positions.save()
        self.metrics.bytes_behind.set(behind)
        self.metrics.segments_pending.set(sum(1 for p in self._progress.values() if not p.done))

    def _check_space(self) -> None:
        used = cdc_raw_bytes(self.config.cdc_raw)
        total = self.config.cdc_total_space_mb * 1024 * 1024
        self.metrics.cdc_raw_bytes.set(used)
        self.metrics.cdc_raw_usage.set(used / total)
        over = used * 100 >= total * self.config.space_warning_percent
        if over != self._space_warned:
            self._space_warned = over
            if over:
                log.warning("cdc_raw holds %.0f MiB, %.0f%% of cdc_total_space (%d MiB): Cassandra rejects writes "
                            "to CDC tables when it is full", used / 2**20, used * 100 / total,
                            self.config.cdc_total_space_mb)
            else:
                log.info("cdc_raw back under %d%% of cdc_total_space", self.config.space_warning_percent)

    def _kafka_reachability(self, reachable: bool) -> None:
        self.metrics.kafka_reachable.set(1 if reachable else 0)
        if reachable:
            log.info("Kafka is reachable again: publishing resumes")
        else:
            log.warning("Kafka at %s is unreachable: records stay queued and reading pauses when the queue is full",
                        self.config.kafka.bootstrap_servers)

    def _finish(self, progress: SegmentProgress) -> None:
        """A COMPLETED, fully acknowledged segment: record that durably, then clean it up."""
        segment = progress.segment
        self.positions.set(segment.segment_id, segment.path.name, progress.acknowledged, completed=True)
        self.positions.save()
        cleanup = self.config.cleanup
        if cleanup.mode == "keep":
            return
        files = [p for p in (segment.path, segment.index_path) if p.exists()]
        if cleanup.mode == "archive":
            assert cleanup.archive_dir is not None
            cleanup.archive_dir.mkdir(parents=True, exist_ok=True)
            for path in files:
                shutil.move(str(path), cleanup.archive_dir / path.name)
        elif cleanup.mode == "command":
            assert cleanup.command is not None
            command = cleanup.command.format(segment=segment.path, index=segment.index_path)
            result = subprocess.run(command, shell=True, capture_output=True, text=True)
            if result.returncode != 0:
                log.error("cleanup command for %s failed (exit %d): %s; retrying later", segment.path.name,
                          result.returncode, result.stderr.strip()[-500:])
                return
            for path in files:
                path.unlink(missing_ok=True)
        else:
            for path in files:
                path.unlink(missing_ok=True)
        log.info("%s published completely (%s)", segment.path.name, cleanup.mode)
        self.positions.forget(segment.segment_id)
        self.positions.save()
        del self._progress[segment.segment_id]


def _keystore(config: AgentConfig) -> KeyStore:
    encryption = config.encryption
    if encryption.keystore is not None:
        return KeyStore.load(encryption.keystore, encryption.keystore_password or "", encryption.key_password)
    return KeyStore({alias: bytes.fromhex(key) for alias, key in encryption.keys.items()})
