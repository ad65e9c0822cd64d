"""The agent: tails ``cdc_raw`` and publishes every change of a CDC table to Kafka, losing nothing.

One pass over ``cdc_raw`` reads each segment from its saved position up to what Cassandra has made
durable (the ``_cdc.idx`` offset; a 3.x segment is complete when it appears), oldest segment first,
and never past a segment that is still being written, so changes to a partition reach Kafka in the
order the node wrote them. A segment's position only advances over entries whose records Kafka has
acknowledged; a segment is cleaned up once it is COMPLETED and fully acknowledged. A segment some of whose
bytes were neither published nor quarantined on their own (a header or section it cannot read, framing it
cannot follow) is never cleaned up: it is moved whole into the quarantine directory.
"""

from __future__ import annotations

import base64
import json
import logging
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import defaultdict, deque
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException

from ..commitlog import Damage, KeyStore, SegmentReader
from ..commitlog.segment_errors import CommitLogError, DescriptorError
from ..storage import MutationDecodeError, UnknownTableError
from ..commitlog.mutation import split_partition_updates
from ..commitlog.segment_reader import DamageKind, Entry
from ..schema import TableMetadata
from ..kafka.raw_records import encode_update
from ..kafka.schema_records import SchemaRecord
from .cdc_raw import CdcSegment, ChangeNotifier, cdc_raw_bytes, list_segments, read_cdc_index
from .agent_config import AgentConfig, ConfigError
from .deliveries import Deliveries, Watermark
from .agent_metrics import AgentMetrics
from .publisher import DeliveryFailed, Publisher
from .positions import PositionStore, StateError, private_directory, write_private
from .tables import TableRegistry

log = logging.getLogger(__name__)

SHUTDOWN_FLUSH_SECONDS = 30.0
# At startup, one attempt to reach Kafka (list and create topics) lasts this long; then it is tried again.
STARTUP_KAFKA_TIMEOUT_SECONDS = 5.0
# Errors that mean Kafka cannot be reached (yet): wait for it, as while publishing.
UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
SPACE_CHECK_SECONDS = 1.0
# While a segment is read, every this many entries (a few milliseconds): a checkpoint, the housekeeping (serving
# Kafka's delivery reports, saving positions every ``state_flush_ms``) and the check for a stop. librdkafka frees
# a delivered record only when its report is served: without it, the queue fills with records Kafka has already
# acknowledged, and every record produced lands in memory not touched before (page faults and cache misses, 5% of
# the agent's CPU).
HOUSEKEEPING_ENTRIES = 1000
# Damage after which bytes of the segment are neither published nor quarantined on their own (the rest of a
# section or of the segment is given up): the segment is kept whole.
WHOLE_SEGMENT_DAMAGE = frozenset(DamageKind) - {
    DamageKind.ENTRY_CRC_MISMATCH, DamageKind.UNDECODABLE_MUTATION, DamageKind.SEGMENT_ID_MISMATCH}


class SegmentProgress:
    """How far one segment is read and how far Kafka has acknowledged it.

    Between the two lie checkpoints, oldest first: ``(position, watermark, sent)``, taken as reading goes
    (``checkpoint``). Once Kafka has acknowledged everything up to a checkpoint's watermark, the segment is
    acknowledged up to its position, and the records sent since the checkpoint before (``sent``: how many per
    table) count as published.
    """

    def __init__(self, segment: CdcSegment, acknowledged: int, deliveries: Deliveries,
                 published: defaultdict[str, int], completed: bool = False, damaged: bool = False) -> None:
        self.segment = segment
        self._acknowledged = acknowledged
        self.read_position = acknowledged  # every entry before it is published (its records queued)
        self.read_all = completed
        self.damaged = damaged  # bytes neither published nor quarantined: kept whole, never cleaned up
        self.index_offset: int | None = None
        self.resume: tuple[int, int, int] | None = None  # where the sections read so far end (SegmentReader)
        self.changed_at = time.monotonic()
        self.reported: set[tuple[DamageKind, int]] = set()  # damage sent to the dead letters (kind, where)
        self.unreadable_since: float | None = None  # since when its idx has been read unreadable, in a row
        self.unreadable_logged = False
        self._deliveries = deliveries
        self._published = published
        self._checkpoints: deque[tuple[int, Watermark, dict[str, int]]] = deque()

    def checkpoint(self, sent: dict[str, int]) -> None:
        """Mark the read position: it is acknowledged once every record sent so far is (``sent`` of them since
        the previous checkpoint, per table)."""
        self._checkpoints.append((self.read_position, self._deliveries.watermark(), sent))

    @property
    def acknowledged(self) -> int:
        """The position up to which every record is acknowledged."""
        self._advance()
        return self._acknowledged

    @property
    def done(self) -> bool:
        self._advance()
        return self.read_all and not self._checkpoints

    def _advance(self) -> None:
        """Move over the checkpoints Kafka has acknowledged: when asked, not per delivery."""
        checkpoints = self._checkpoints
        while checkpoints and self._deliveries.covers(checkpoints[0][1]):
            self._acknowledged, _, sent = checkpoints.popleft()
            for table, count in sent.items():
                self._published[table] += count


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.metrics = AgentMetrics()
        self.positions = PositionStore(config.state_dir)
        self.tables = TableRegistry(config)
        self.keystore = _keystore(config)
        self._check_keys()
        self.publisher = Publisher(config.kafka.bootstrap_servers, config.kafka.max_buffered_bytes,
                                   config.kafka.producer, on_reachability=self._kafka_reachability)
        self.deliveries = Deliveries(self.publisher, self.metrics.delivery_latency)
        self.notifier = ChangeNotifier(config.cdc_raw)
        self._progress: dict[int, SegmentProgress] = {}
        # Per table id: the version of its schema last published.
        self._schemas_published: dict[uuid.UUID, str] = {}
        # Per table id (its 16 bytes), for the schema loaded: what the per-record path needs to know of the table.
        self._routes: dict[bytes, _Route] = {}
        self._routes_schema = self.tables.schema
        self._node_id = config.node_id.encode("utf-8")
        self._raw_topic = config.raw_topic
        # Records sent since the segment being read took its last checkpoint, per table ("errors": dead letters).
        self._sent: defaultdict[str, int] = defaultdict(int)
        self._stopping = threading.Event()
        self._last_flush = self._last_space_check = 0.0
        self._space_warned = False
        private_directory(config.quarantine)

    # --- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self.notifier.wake()

    def run(self) -> int:
        """Run until stopped (SIGTERM/SIGINT); return the process exit status: 2 for a configuration error met
        while running (a segment's key missing), 1 when positions cannot be saved or Kafka failed for good."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        self.metrics.serve(self.config.metrics.host, self.config.metrics.port)
        if not self._ensure_topics():
            return 0  # stopped while waiting for Kafka: nothing was read
        log.info("agent %s tailing %s into %s", self.config.node_id, self.config.cdc_raw, self.config.raw_topic)
        self.notifier.start()
        failure: Exception | None = None
        try:
            while not self._stopping.is_set():
                progressed = self.run_once()
                if not progressed:
                    self._wait_for_change()
        except (ConfigError, StateError, DeliveryFailed) as error:
            failure = error
        finally:
            self.notifier.stop()
            # After a delivery failure, what Kafka acknowledged before may be gone too: nothing more is saved.
            if not isinstance(failure, DeliveryFailed):
                failure = self._drain() or failure
        if failure is not None:
            log.error("agent stopped: %s", failure)
            return 2 if isinstance(failure, ConfigError) else 1
        return 0

    def _drain(self) -> Exception | None:
        """Finish in-flight deliveries and save the positions; the failure that prevented it, if any."""
        try:
            self.deliveries.seal(self._while_blocked)
            remaining = self.publisher.flush(SHUTDOWN_FLUSH_SECONDS)
            self.publisher.raise_failure()
            self._save_positions()
        except (DeliveryFailed, StateError) as error:
            return error
        if remaining:
            log.warning("agent stopped with %d records unacknowledged: they are published again on restart",
                        remaining)
        else:
            log.info("agent stopped; everything read is acknowledged")
        return None

    def _ensure_topics(self) -> bool:
        """Create missing topics, waiting while Kafka is unreachable; False if stopped meanwhile."""
        waiting = False
        while not self._stopping.is_set():
            try:
                self.publisher.ensure_topics({
                    self.config.raw_topic: (self.config.kafka.raw_topic_partitions, False),
                    self.config.schema_topic: (1, True),
                    self.config.errors_topic: (1, False),
                }, timeout=STARTUP_KAFKA_TIMEOUT_SECONDS)
            except KafkaException as error:
                if error.args[0].code() not in UNREACHABLE:
                    raise
                if not waiting:
                    waiting = True
                    self._kafka_reachability(False)
                self._stopping.wait(1.0)
                continue
            if waiting:
                self._kafka_reachability(True)
            return True
        return False

    def _wait_for_change(self) -> None:
        deadline = time.monotonic() + self.config.poll_interval_ms / 1000
        while not self._stopping.is_set() and time.monotonic() < deadline:
            if self.notifier.wait(0.02):
                return
            self._housekeeping()

    def run_once(self) -> bool:
        """One pass over cdc_raw; return whether anything new was read."""
        progressed = False
        self.tables.reload_if_changed()
        segments = list_segments(self.config.cdc_raw)
        self._forget_vanished(segments)
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
                if segment.index_path.exists():
                    self._index_unreadable(progress)
                    break  # its idx was caught mid-rewrite: nothing newer before it is read again
                continue  # 4.0+ segment without CDC data (yet): newer segments do not wait for it
            progress.unreadable_since = None
            limit, final = extent
            if limit is None or limit > progress.read_position:
                progressed |= self._read(progress, limit, final)
            elif final:
                progress.read_all = True
            if not progress.read_all:
                break  # newer segments wait until this one is complete: per-partition order
        self._housekeeping()
        return progressed

    def _forget_vanished(self, segments: list[CdcSegment]) -> None:
        """Drop the state of segments no longer in cdc_raw (4.0+ removes the links of segments that never held
        CDC data), so that neither memory nor the state file grows with every segment the node writes."""
        listed = {segment.segment_id for segment in segments}
        for segment_id in self._progress.keys() - listed:
            progress = self._progress.pop(segment_id)
            if progress.index_offset is not None and not progress.done:
                log.error("%s was removed from cdc_raw before it was completely published (acknowledged up to "
                          "%d of %d)", progress.segment.path.name, progress.acknowledged, progress.index_offset)
        for segment_id in self.positions.segments.keys() - listed:
            self.positions.forget(segment_id)

    # --- reading ----------------------------------------------------------------------------------

    def _progress_of(self, segment: CdcSegment) -> SegmentProgress:
        progress = self._progress.get(segment.segment_id)
        if progress is None:
            saved = self.positions.get(segment.segment_id)
            if saved is None:
                self._ensure_key(segment)
            progress = SegmentProgress(segment, saved.position if saved else 0, self.deliveries,
                                       self.metrics.records_published, saved.completed if saved else False,
                                       saved.damaged if saved else False)
            self._progress[segment.segment_id] = progress
        return progress

    def _index_unreadable(self, progress: SegmentProgress) -> None:
        """An idx read mid-rewrite is normal; one that stays unreadable blocks every newer segment: say so, once."""
        now = time.monotonic()
        if progress.unreadable_since is None:
            progress.unreadable_since = now
        elif now - progress.unreadable_since >= self.config.stale_segment_seconds and not progress.unreadable_logged:
            progress.unreadable_logged = True
            log.error("%s has been unreadable for %.0f s (not '<offset>' or '<offset>\\nCOMPLETED'): this segment "
                      "and every newer one wait until it is readable", progress.segment.index_path,
                      now - progress.unreadable_since)

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
        start = progress.read_position

        def on_damage(damage: Damage) -> None:
            if damage.kind in WHOLE_SEGMENT_DAMAGE:
                progress.damaged = True
            # Each read of a live segment walks its sections from the first one again, so it meets the damage of
            # the sections read before once more: dead-letter each damage once (before ``start``: done already).
            where = _damage_position(damage)
            if where < start or (damage.kind, where) in progress.reported:
                return
            progress.reported.add((damage.kind, where))
            self._dead_letter(progress, damage)
        try:
            reader = SegmentReader(segment.path, self.keystore, start=progress.read_position, limit=limit,
                                   on_damage=on_damage, resume=progress.resume)
        except FileNotFoundError:
            return False  # removed meanwhile (Cassandra discards segments without CDC data)
        except DescriptorError as error:
            if final:
                self._unreadable(progress, error.reason, error.offset or 0)
            return False
        except ValueError as error:  # a header naming a compressor or cipher nobody knows
            if final:
                self._unreadable(progress, str(error), 0)
            return False
        except CommitLogError as error:  # its key is not in the keystore
            raise ConfigError(_key_error(segment, error.reason)) from None
        with reader:
            try:
                version = reader.version
                for count, entry in enumerate(reader.entries(), 1):
                    if not self._publish_entry(progress, version, entry):
                        break
                    progress.read_position = entry.position
                    read_any = True
                    if count % HOUSEKEEPING_ENTRIES == 0:
                        if self._stopping.is_set():
                            break
                        self._checkpoint(progress)
                        self._housekeeping()
                progress.resume = reader.resume_point
                # Stopped: a dead letter after the last entry may not have been queued.
                if not self._stopping.is_set():
                    progress.read_position = max(progress.read_position, reader.position)
                    progress.read_all = final
                    if limit is not None and reader.finished and reader.position < limit:
                        self._short_of_index(progress, reader.position, limit)
            finally:
                self.deliveries.seal(self._while_blocked)  # the records held back, so that they report delivery
                self._checkpoint(progress)
        return read_any

    def _checkpoint(self, progress: SegmentProgress) -> None:
        progress.checkpoint(self._sent)
        self._sent = defaultdict(int)

    def _publish_entry(self, progress: SegmentProgress, version: int, entry: Entry) -> bool:
        """Send the records of an entry's updates. False if stopped before all were queued: the entry is read
        again after the restart."""
        try:
            updates = split_partition_updates(entry.body, self.tables.schema, version)
        except UnknownTableError as error:
            if self.tables.lookup(error.table_id) is None:
                self.metrics.skipped.inc()
                return True
            updates = split_partition_updates(entry.body, self.tables.schema, version)
        except MutationDecodeError as error:
            return self._dead_letter(progress, Damage(str(progress.segment.path), DamageKind.UNDECODABLE_MUTATION,
                                                      str(error), entry.section_offset, entry.section, entry.start,
                                                      entry.body))
        routes = []
        for update in updates:
            route = self._route(update[:16])
            if route is None:
                self.metrics.skipped.inc()  # Cassandra drops the whole mutation
                return True
            self.metrics.mutations_read[route.name] += 1
            if route.schema_change:
                self.tables.schema_changed()
            if route.published and not route.schema_published and not self._publish_schema(route):
                return False
            routes.append(route)
        segment_id = progress.segment.segment_id
        for route, update in zip(routes, updates):
            if route.published:
                key, value = encode_update(self._node_id, segment_id, entry.position, version, update)
                if not self.deliveries.send(self._raw_topic, key, value, self._while_blocked):
                    return False
                self._sent[route.name] += 1
        return True

    def _route(self, table_id: bytes) -> _Route | None:
        """The table of an update, by its id bytes; None for a table the schema does not know."""
        if self.tables.schema is not self._routes_schema:  # reloaded: tables may have changed
            self._routes.clear()
            self._routes_schema = self.tables.schema
        route = self._routes.get(table_id)
        if route is None:
            table = self.tables.lookup(uuid.UUID(bytes=table_id))
            if table is None:
                return None
            route = self._routes[table_id] = _Route(table, self.tables.is_published(table))
        return route

    def _publish_schema(self, route: _Route) -> bool:
        """Publish the schema of a route's table, before its first record; False if stopped meanwhile."""
        route.schema_published = self._ensure_schema_published(route.table)
        return route.schema_published

    def _ensure_schema_published(self, table: TableMetadata) -> bool:
        """Publish (and wait for) the table's schema unless this version is published; False if stopped meanwhile."""
        version = table.version_hash()
        if self._schemas_published.get(table.id) == version:
            return True
        record = SchemaRecord.of(table, self.config.node_id)
        delivered: list[KafkaError | None] = []
        self.publisher.publish(self.config.schema_topic, record.key, record.encode(),
                               lambda error, _: delivered.append(error), self._while_blocked)
        while not delivered and not self._stopping.is_set():
            self.publisher.poll(0.05)
        if delivered and self.publisher.check(delivered[0]):
            self._schemas_published[table.id] = version
            log.info("published the schema of %s (version %s)", table.qualified_name, version)
            return True
        return False

    # --- damage -----------------------------------------------------------------------------------

    def _short_of_index(self, progress: SegmentProgress, end: int, durable: int) -> None:
        """The segment ends before the offset its idx file says Cassandra made durable: bytes are missing."""
        if not progress.damaged:
            progress.damaged = True
            log.warning("%s ends at position %d, short of the %d its idx file says Cassandra made durable: "
                        "the segment is kept whole in %s", progress.segment.path, end, durable,
                        self.config.quarantine)

    def _unreadable(self, progress: SegmentProgress, reason: str, file_offset: int) -> None:
        """A segment whose header cannot be read: to the dead letters, then kept whole once acknowledged."""
        progress.damaged = True
        damage = Damage(str(progress.segment.path), DamageKind.UNREADABLE_HEADER, reason, file_offset, 0)
        if self._dead_letter(progress, damage):
            progress.read_all = True
        self.deliveries.seal(self._while_blocked)
        self._checkpoint(progress)

    def _dead_letter(self, progress: SegmentProgress, damage: Damage) -> bool:
        """A damaged entry or section: to the errors topic and the quarantine directory, then on. False if stopped
        while Kafka's queue was full."""
        self.metrics.errors.labels(damage.kind.name.lower()).inc()
        log.error("%s", damage)
        segment = progress.segment
        where = _damage_position(damage)
        report = {"node": self.config.node_id, "segment": segment.path.name, "segment_id": segment.segment_id,
                  "section": damage.section, "file_offset": damage.file_offset, "position": damage.position,
                  "kind": damage.kind.name, "reason": f"{damage.kind.value}: {damage.detail}",
                  "raw": base64.b64encode(damage.raw).decode()}
        if damage.kind in WHOLE_SEGMENT_DAMAGE:
            report["kept_whole_in"] = str(self.config.quarantine / segment.path.name)
        stem = f"{segment.path.name}@{where}"
        write_private(self.config.quarantine / f"{stem}.json", json.dumps(report, indent=1).encode())
        if damage.raw:
            write_private(self.config.quarantine / f"{stem}.bin", damage.raw)
        if not self.deliveries.send(self.config.errors_topic, stem.encode(), json.dumps(report).encode(),
                                    self._while_blocked):
            return False
        self._sent["errors"] += 1
        return True

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
            self.positions.set(segment_id, progress.segment.path.name, progress.acknowledged, progress.done,
                               progress.damaged)
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
        """A COMPLETED, fully acknowledged segment: record that durably, then clean it up (or, damaged, move
        it whole into the quarantine)."""
        segment = progress.segment
        self.positions.set(segment.segment_id, segment.path.name, progress.acknowledged, completed=True,
                           damaged=progress.damaged)
        self.positions.save()
        # The idx first: a crash between the two leaves the segment, which the restarted agent finishes cleaning up
        # (its saved position says completed), rather than an idx nothing would ever remove.
        files = [p for p in (segment.index_path, segment.path) if p.exists()]
        if progress.damaged:
            _move(files, self.config.quarantine)
            self.metrics.segments_quarantined.inc()
            log.error("%s could not be read completely (its damage is on %s): moved whole into %s; to read "
                      "it again, move it and its idx file back into %s", segment.path.name,
                      self.config.errors_topic, self.config.quarantine, self.config.cdc_raw)
        elif not self._clean_up(segment, files):
            return
        self.positions.forget(segment.segment_id)
        self.positions.save()
        del self._progress[segment.segment_id]

    def _clean_up(self, segment: CdcSegment, files: list[Path]) -> bool:
        """Apply ``cleanup.mode`` to a published segment's files; whether they are gone from cdc_raw."""
        cleanup = self.config.cleanup
        if cleanup.mode == "keep":
            return False
        if cleanup.mode == "archive":
            assert cleanup.archive_dir is not None
            _move(files, private_directory(cleanup.archive_dir))
        elif cleanup.mode == "command":
            assert cleanup.command is not None
            command = cleanup.command.format(segment=segment.path, index=segment.index_path)
            result = subprocess.run(command, shell=True, capture_output=True, text=True)
            if result.returncode != 0:
                log.error("cleanup command for %s failed (exit %d): %s; retrying later", segment.path.name,
                          result.returncode, result.stderr.strip()[-500:])
                return False
            for path in files:
                path.unlink(missing_ok=True)
        else:
            for path in files:
                path.unlink(missing_ok=True)
        log.info("%s published completely (%s)", segment.path.name, cleanup.mode)
        return True

    def _check_keys(self) -> None:
        """Every encrypted segment still to read must decrypt with the keys given: a ConfigError otherwise."""
        for segment in list_segments(self.config.cdc_raw):
            saved = self.positions.get(segment.segment_id)
            if saved is None or not saved.completed:
                self._ensure_key(segment)

    def _ensure_key(self, segment: CdcSegment) -> None:
        problem = _key_problem(segment, self.keystore)
        if problem is not None:
            raise ConfigError(_key_error(segment, problem))


class _Route:
    """What the per-record path needs of a table, worked out once per schema load."""

    __slots__ = ("name", "published", "schema_change", "schema_published", "table")

    def __init__(self, table: TableMetadata, published: bool) -> None:
        self.table = table
        self.name = table.qualified_name
        self.published = published
        self.schema_change = table.keyspace == "system_schema"  # the node logged a CREATE/ALTER/DROP
        self.schema_published = False


def _damage_position(damage: Damage) -> int:
    """Where a damage is, as a position in the segment (the file offset when it has no logical position)."""
    return damage.position if damage.position is not None else damage.file_offset


def _move(files: list[Path], directory: Path) -> None:
    for path in files:
        shutil.move(str(path), directory / path.name)


def _keystore(config: AgentConfig) -> KeyStore:
    encryption = config.encryption
    if encryption.keystore is not None:
        try:
            return KeyStore.load(encryption.keystore, encryption.keystore_password or "",
                                 encryption.key_password)
        except CommitLogError as error:
            raise ConfigError(f"encryption.keystore: {error}: check the file and "
                              "encryption.keystore_password / encryption.key_password") from None
    try:
        return KeyStore({alias: bytes.fromhex(key) for alias, key in encryption.keys.items()})
    except ValueError:
        raise ConfigError("encryption.keys: every key must be hexadecimal") from None


def _key_problem(segment: CdcSegment, keystore: KeyStore) -> str | None:
    """Why the keys given cannot read a segment: its alias missing, or its first section not decrypting.

    Only a durable first section is tried (a 3.x segment is whole; a live one up to its idx offset): one being
    written may not decrypt yet.
    """
    index = read_cdc_index(segment.index_path)
    durable: int | None = 0  # 4.0+ without an idx: no CDC data yet
    if index is not None:
        durable = index.offset
    elif segment.version == 6:
        durable = None  # 3.x: whole once in cdc_raw
    try:
        reader = SegmentReader(segment.path, keystore, limit=durable)
    except (FileNotFoundError, DescriptorError, ValueError):
        return None  # gone, or not a key problem: the segment is kept whole when it is read
    except CommitLogError as error:
        return error.reason
    with reader:
        if reader.descriptor.encrypted:
            next(reader.sections(), None)
            if any(damage.kind is DamageKind.UNREADABLE_SECTION for damage in reader.damage):
                return (f"its first section does not decrypt with the key of alias "
                        f"{reader.descriptor.params['encKeyAlias']!r} (a wrong key?)")
    return None


def _key_error(segment: CdcSegment, problem: str) -> str:
    return (f"{segment.path}: encrypted, and {problem}: give the node's keystore (encryption.keystore) or "
            "key (encryption.keys), then start the agent again; the segment stays in cdc_raw")
