"""The agent: tails ``cdc_raw`` and publishes every change of a CDC table to Kafka, losing nothing.

One pass over ``cdc_raw`` reads each segment from its saved position up to what Cassandra has made
durable (the ``_cdc.idx`` offset; a 3.x segment is complete when it appears), oldest segment first,
and never past a segment that is still being written, so changes to a partition reach Kafka in the
order the node wrote them. A segment's position only advances over entries whose records Kafka has
acknowledged; a segment is cleaned up once it is COMPLETED and fully acknowledged. A segment some of whose
bytes were neither published nor quarantined on their own (a header or section it cannot read, framing it
cannot follow) is never cleaned up: it is moved whole into the quarantine directory.

Every segment the agent sees in ``cdc_raw`` is followed until it is published; one that leaves before that
(the node deletes its oldest segments when ``cdc_block_writes`` is false) is reported and counted
(``segment_loss.py``).

A truncation of a published table (``truncations.py``) is sent to every partition of the raw topic between
the node's mutations up to the commit log position it covers and the later ones: in every partition, the
node's writes before it come before it, and those after it after it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections import defaultdict
from functools import partial
from typing import cast

from confluent_kafka import KafkaException

from ..commitlog import Damage, SegmentReader
from ..commitlog.segment_errors import CommitLogError, DescriptorError
from ..storage import MutationDecodeError, PartitionUpdateSerializer, UnknownTableError
from ..commitlog.mutation import split_partition_updates
from ..commitlog.segment_reader import DamageKind, Entry
from ..kafka.outage import unreachable
from ..kafka.raw_records import TruncationRecord, encode_update, is_truncation, segment_and_position
from ..observability import serve_metrics
from .cdc_raw import CdcSegment, ChangeNotifier, bytes_missing, cdc_raw_bytes, list_segments
from .agent_config import AgentConfig, ConfigError
from .deliveries import Deliveries
from .agent_metrics import DEAD_LETTERS, AgentMetrics
from .publisher import DeliveryFailed, Publisher
from .lost_records import LostRecords, LostRecordsUnknown, describe_loss, lost_partitions
from .node_settings import (NodeSettings, check_against_configuration, configured_settings,
                            read_node_settings, warn_about)
from .positions import PositionStore, StateError
from .quarantine import WHOLE_SEGMENT_DAMAGE, Quarantine, damage_position
from .record_size import (PRODUCER_MESSAGE_MAX_BYTES, TOPIC_MAX_MESSAGE_BYTES, RecordLimit, RecordTooLarge,
                          cut_to_fit, describe_update, required_record_bytes)
from .schema_publisher import SchemaPublisher
from .segment_cleanup import SegmentCleanup
from .segment_keys import ensure_key, key_error, load_keystore
from .segment_loss import UNWATCHED_SECONDS, LossWatch, SegmentsLost
from .segment_progress import SegmentProgress
from .space_watch import SpaceWatch
from .tables import Route, TableRegistry
from .truncations import Truncation, TruncationWatch

log = logging.getLogger(__name__)

SHUTDOWN_FLUSH_SECONDS = 30.0
# At startup, one attempt to reach Kafka (list and create topics) lasts this long; then it is tried again.
STARTUP_KAFKA_TIMEOUT_SECONDS = 5.0
# How often the agent looks at every segment in cdc_raw (those come and go, and the space they use): a pass
# reads only the segments it reaches, up to the first incomplete one.
CENSUS_SECONDS = 1.0
# While the node's settings could not be read (it did not answer), they are tried again this often.
NODE_SETTINGS_RETRY_SECONDS = 30.0
# While a segment is read, every this many entries (a few milliseconds): a checkpoint, the housekeeping (serving
# Kafka's delivery reports, saving positions every ``state_flush_ms``) and the check for a stop. librdkafka frees
# a delivered record only when its report is served: without it, the queue fills with records Kafka has already
# acknowledged, and every record produced lands in memory not touched before (page faults and cache misses, 5% of
# the agent's CPU).
HOUSEKEEPING_ENTRIES = 1000


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.metrics = AgentMetrics()
        self.positions = PositionStore(config.state_dir)
        self.tables = TableRegistry(config)
        self.keystore = load_keystore(config)
        self._check_keys()
        self.node_settings: NodeSettings = configured_settings(config)
        self._node_settings_read_at: float | None = None  # when the node answered (monotonic); None: not yet
        self._last_node_settings_try = 0.0
        self._read_node_settings()
        # The producer's record size is set once, from the node's max_mutation_size as read now.
        self._max_mutation_bytes, self._max_mutation_source = (self.node_settings.max_mutation_size,
                                                               self.node_settings.source)
        producer = config.kafka.librdkafka(config.kafka.producer)
        producer.setdefault(PRODUCER_MESSAGE_MAX_BYTES, required_record_bytes(self._max_mutation_bytes))
        self._producer_record_bytes = int(producer[PRODUCER_MESSAGE_MAX_BYTES])
        self.publisher = Publisher(config.kafka.bootstrap_servers, config.kafka.max_buffered_bytes, producer,
                                   on_reachability=self._kafka_reachability, describe_record=self._describe_record)
        self.record_limit: RecordLimit | None = None  # known once the raw topic exists
        self._max_record_bytes = 0
        self.deliveries = Deliveries(self.publisher, self.metrics.delivery_latency)
        self.notifier = ChangeNotifier(config.cdc_raw)
        self._stopping = threading.Event()
        self.quarantine = Quarantine(config, self.deliveries, self.metrics)
        self.cleanup = SegmentCleanup(config.cleanup, self.quarantine)
        self.schemas = SchemaPublisher(self.publisher, config.schema_topic, config.node_id, self._stopping,
                                       self._while_blocked)
        self.space = SpaceWatch(config.space_warning_percent, self.metrics)
        self.losses = LossWatch(self.positions, self.metrics, config.segment_loss == "stop",
                                lambda: self.node_settings, self.tables.published_names)
        self._loss: SegmentsLost | None = None  # segments lost while segment_loss is 'stop': the agent stops
        self.truncations = TruncationWatch(config, self.positions)
        self._progress: dict[int, SegmentProgress] = {}
        self._node_id = config.node_id.encode("utf-8")
        self._raw_topic = config.raw_topic
        # Records sent since the segment being read took its last checkpoint, per table (DEAD_LETTERS: dead
        # letters).
        self._sent: defaultdict[str, int] = defaultdict(int)
        self._last_flush = self._last_census = 0.0
        self._kafka_reachable = True
        self._tailing = False  # the topics exist and cdc_raw is read: ready, while Kafka is reachable

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
        try:
            return self._serve_and_run()
        finally:
            self.publisher.close()
            self.tables.close()

    def _serve_and_run(self) -> int:
        try:
            server = serve_metrics(self.config.metrics.host, self.config.metrics.port, self.metrics.registry,
                                   self.not_ready)
        except ConfigError as error:
            log.error("agent not started: %s", error)
            return 2
        try:
            return self._run()
        finally:
            if server is not None:
                server.stop()

    def not_ready(self) -> str | None:
        """Why the agent is not ready (the readiness endpoint), or None when it is."""
        if self._stopping.is_set():
            return "stopping"
        if not self._kafka_reachable:
            return f"Kafka at {self.config.kafka.bootstrap_servers} is unreachable"
        if not self._tailing:
            return "starting: not tailing cdc_raw yet"
        return None

    def _run(self) -> int:
        try:
            self._check_segments_at_start()
        except SegmentsLost as error:
            log.error("agent stopped: %s", error)
            return 1
        try:
            if not self._ensure_topics():
                return 0  # stopped while waiting for Kafka: nothing was read
        except ConfigError as error:
            log.error("agent stopped: %s", error)
            return 2
        try:
            self._check_acknowledged_records()
        except (LostRecords, LostRecordsUnknown) as error:
            log.error("agent stopped: %s", error)
            return 1
        log.info("agent %s tailing %s into %s", self.config.node_id, self.config.cdc_raw, self.config.raw_topic)
        self.notifier.start()
        self._tailing = True
        failure: Exception | None = None
        try:
            while not self._stopping.is_set():
                progressed = self.run_once()
                if not progressed:
                    self._wait_for_change()
        except (ConfigError, StateError, DeliveryFailed, RecordTooLarge) as error:
            failure = error
        finally:
            failure = failure or self._loss
            self._tailing = False
            self.notifier.stop()
            self.truncations.close()
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
                required = required_record_bytes(self._max_mutation_bytes)
                self.publisher.ensure_topics({
                    self.config.raw_topic: (self.config.kafka.raw_topic_partitions, False),
                    self.config.schema_topic: (1, True),
                    self.config.errors_topic: (1, False),
                }, timeout=STARTUP_KAFKA_TIMEOUT_SECONDS,
                    configs={self.config.raw_topic: {TOPIC_MAX_MESSAGE_BYTES: str(required)}})
                self._check_raw_partitions()
                self._check_record_limit(required)
            except KafkaException as error:
                if not unreachable(error):
                    raise
                if not waiting:
                    waiting = True
                    self._kafka_reachability(False)
                self._note_durable_writes()
                self._stopping.wait(1.0)
                continue
            if waiting:
                self._kafka_reachability(True)
            return True
        return False

    def _check_raw_partitions(self) -> None:
        """A raw topic with fewer partitions than kafka.raw_topic_partitions (a broker that auto-creates topics
        made it when a client asked for its metadata first): grown while it holds no record; else left, and
        said."""
        topic, wanted = self.config.raw_topic, self.config.kafka.raw_topic_partitions
        had, grown = self.publisher.grow_if_empty(topic, wanted, STARTUP_KAFKA_TIMEOUT_SECONDS)
        if had >= wanted:
            return
        if grown:
            log.warning("the raw topic %s had %d partition(s), fewer than kafka.raw_topic_partitions (%d): "
                        "something else created it (a broker with auto.create.topics.enable creates a topic a "
                        "client asks about); it held no record, so it now has %d", topic, had, wanted, wanted)
        else:
            log.warning("the raw topic %s has %d partition(s), fewer than kafka.raw_topic_partitions (%d), "
                        "and holds records: it is left as it is (the pipeline's state is grouped by raw "
                        "partition), and the agents publish to its %d partition(s); to have %d, recreate the "
                        "topic before any record (and start the pipeline on a new checkpoint), or set "
                        "auto.create.topics.enable=false on the brokers", topic, had, wanted, had, wanted)

    def _check_record_limit(self, required: int) -> None:
        """Raise the raw topic's record limit to what the node's largest mutation needs, and say in one line
        what the limits are and what the agent does with them (record_size.py)."""
        topic = self.config.raw_topic
        topic_bytes, raised_from, refusal = self.publisher.raise_topic_limit(topic, required,
                                                                             STARTUP_KAFKA_TIMEOUT_SECONDS)
        limit = RecordLimit(topic, self._max_mutation_bytes, self._max_mutation_source, topic_bytes, raised_from,
                            refusal, self._producer_record_bytes)
        (log.info if limit.fits_every_mutation else log.warning)("%s", limit.describe())
        self.record_limit, self._max_record_bytes = limit, limit.record_bytes

    def _describe_record(self, topic: str, key: bytes, value: bytes) -> str:
        """A record, for the line saying Kafka refused it: a raw record's segment, position, table and key."""
        if topic != self._raw_topic or is_truncation(value):
            return f"a record to {topic}"
        segment, position = segment_and_position(value)
        limits = f"; limits: {self.record_limit.limits_text()}" if self.record_limit is not None else ""
        table = self.tables.schema.table_by_id(uuid.UUID(bytes=key[:16]))
        return f"the record of {segment} position {position} ({describe_update(table, key)}{limits})"

    def _check_acknowledged_records(self) -> None:
        """Compare the offsets Kafka acknowledged before with where the raw topic's partitions end: LostRecords
        if records are gone, unless the configuration accepts it."""
        topic = self.config.raw_topic
        lost = lost_partitions(self.config, topic, self.positions.acknowledged_offsets.get(topic, {}))
        if not lost:
            return
        self.metrics.kafka_records_lost.inc(sum(partition.records for partition in lost))
        if not self.config.kafka.accept_lost_records:
            raise LostRecords(f"{describe_loss(topic, lost)}; to start anyway, set kafka.accept_lost_records: "
                              "true (or --accept-lost-records)")
        log.warning("%s; carrying on (kafka.accept_lost_records)", describe_loss(topic, lost))
        # The partitions' new records get offsets from their ends again: what was acknowledged before is gone.
        for partition in lost:
            del self.positions.acknowledged_offsets[topic][partition.partition]

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
        for index, segment in enumerate(segments):
            if self._stopping.is_set():
                break
            progress = self._progress_of(segment)
            if progress.read_all:
                if progress.done:
                    self._finish(progress)
                continue
            extent = progress.readable_extent(segments[index + 1:], self.config.stale_segment_seconds)
            if extent is None:
                if segment.index_path.exists():
                    break  # its idx is unreadable (mid-rewrite?): nothing newer before it is read again
                continue  # 4.0+ segment without CDC data (yet): newer segments do not wait for it
            progress.unreadable_since = None
            limit, final = extent
            if limit is None or limit > progress.read_position:
                self.truncations.refresh()  # after the idx was read: every truncation before what it allows
                progressed |= self._read(progress, limit, final)
            elif final:
                progress.read_all = True
            if not progress.read_all:
                break  # newer segments wait until this one is complete: per-partition order
        if not self._stopping.is_set():
            self._publish_truncations(segments)
            self._publish_drops()
        self._housekeeping()
        return progressed

    def _check_segments_at_start(self) -> None:
        """What left cdc_raw while the agent was stopped: saved segments gone before they were published, ids
        it never saw. Reported and counted; ``SegmentsLost`` when segment_loss is 'stop' and it is not
        accepted."""
        segments = list_segments(self.config.cdc_raw)
        listed = {segment.segment_id for segment in segments}
        findings = self.losses.look(segments)
        self.losses.vanished_since_saved(listed, findings)
        if findings:
            self.losses.report(findings, at_start=True, accepted=self.config.accept_segment_loss)
        self.losses.settle(findings, listed)

    def _census(self, segments: list[CdcSegment]) -> None:
        """Follow every segment in cdc_raw: whether it holds CDC data and how far it is durable (its idx), and
        report those that left unpublished. The state of segments gone is dropped, so that neither memory nor
        the state file grows with every segment the node writes."""
        now = time.monotonic()
        listed = {segment.segment_id for segment in segments}
        findings = self.losses.look(segments)
        for segment_id in sorted(self._progress.keys() - listed):
            progress = self._progress.pop(segment_id)
            if progress.done:
                continue
            if progress.holds_data:
                findings.lost.append(progress.lost())
            elif now - progress.last_seen > UNWATCHED_SECONDS:
                findings.add_unseen(progress.segment.path.name)  # it may have had data by the time it left
        for segment in segments:
            try:
                progress = self._progress_of(segment)
            except ConfigError:
                continue  # its key is missing: reading it stops the agent
            progress.last_seen = now
            if not progress.read_all:
                progress.note_durable()
        if self._loss is not None:
            return  # stopping: what is gone stays saved, for the next start to find
        if findings:
            try:
                self.losses.report(findings, at_start=False, accepted=False)
            except SegmentsLost as error:
                self._loss = error
                self.stop()
                return
        self.losses.settle(findings, listed)

    # --- reading ----------------------------------------------------------------------------------

    def _progress_of(self, segment: CdcSegment) -> SegmentProgress:
        progress = self._progress.get(segment.segment_id)
        if progress is None:
            saved = self.positions.get(segment.segment_id)
            if saved is None:
                ensure_key(segment, self.keystore)
            progress = SegmentProgress(segment, saved.position if saved else 0, self.deliveries,
                                       self.metrics.records_published, saved.completed if saved else False,
                                       saved.damaged if saved else False)
            self._progress[segment.segment_id] = progress
        return progress

    def _read(self, progress: SegmentProgress, limit: int | None, final: bool) -> bool:
        segment = progress.segment
        read_any = False
        start = progress.read_position

        def on_damage(damage: Damage) -> None:
            if damage.kind in WHOLE_SEGMENT_DAMAGE:
                progress.damaged = True
            # Each read of a live segment walks its sections from the first one again, so it meets the damage of
            # the sections read before once more: dead-letter each damage once (before ``start``: done already).
            where = damage_position(damage)
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
            raise ConfigError(key_error(segment, error.reason)) from None
        with reader:
            try:
                version = reader.version
                for count, entry in enumerate(reader.entries(), 1):
                    if self.truncations.waiting and not self._publish_truncations_before(progress, entry):
                        break
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
                    if (progress.index_offset is not None
                            and bytes_missing(reader, progress.index_offset, progress.index_completed)):
                        self.quarantine.short_of_index(progress, reader.position, progress.index_offset)
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
        routed = self._routed_updates(progress, version, entry)
        if isinstance(routed, bool):
            return routed
        routes, updates = routed
        for route in routes:
            self.metrics.mutations_read[route.name] += 1
            if route.published and not route.schema_published and not self._publish_schema(route):
                return False
        if any(route.schema_change for route in routes):  # once for the several system_schema tables of a DDL
            self.tables.schema_changed()
        segment_id = progress.segment.segment_id
        for route, update in zip(routes, updates):
            if route.published:
                key, value = encode_update(self._node_id, segment_id, entry.position, version, update)
                if len(key) + len(value) > self._max_record_bytes:
                    if not self._send_pieces(progress, version, entry, route, key, value, update):
                        return False
                elif not self.deliveries.send(self._raw_topic, key, value, self._while_blocked):
                    return False
                self._sent[route.name] += 1
        return True

    def _send_pieces(self, progress: SegmentProgress, version: int, entry: Entry, route: Route, key: bytes,
                     value: bytes, update: bytes) -> bool:
        """Send an update larger than a record the raw topic takes as pieces that fit (record_size.py); False if
        stopped before all were queued. ``RecordTooLarge`` when it cannot be cut."""
        limit = cast(RecordLimit, self.record_limit)
        try:
            pieces = cut_to_fit(update, self.tables.schema, version,
                                self._max_record_bytes - len(key) - (len(value) - len(update)))
        except RecordTooLarge as error:
            raise RecordTooLarge(
                f"the update of {_where(progress, entry)} position {entry.position} "
                f"({describe_update(route.table, key)}) makes a record of {len(key) + len(value):,} bytes, more "
                f"than Kafka takes ({limit.limits_text()}), and cannot be cut: {error}; {limit.remedy()}") from None
        segment_id = progress.segment.segment_id
        for piece in pieces:
            piece_key, piece_value = encode_update(self._node_id, segment_id, entry.position, version, piece)
            if not self.deliveries.send(self._raw_topic, piece_key, piece_value, self._while_blocked):
                return False
        self._sent[route.name] += len(pieces) - 1  # the caller counts one
        self.metrics.updates_cut.inc()
        log.info("the update of %s (%s, %d bytes) is larger than a record the raw topic takes: published as %d "
                 "records", _where(progress, entry), describe_update(route.table, key), len(update), len(pieces))
        return True

    def _routed_updates(self, progress: SegmentProgress, version: int,
                        entry: Entry) -> tuple[list[Route], list[bytes]] | bool:
        """An entry's partition updates and their tables' routes, once the schema has each of their tables
        (waiting for it, see ``TableRegistry.await_table``); else True to go on past the entry (a dropped
        table's mutation skipped, an undecodable one dead-lettered), or False when stopped (the entry is read
        again after the restart).

        A mutation that does not decode may be newer than the schema loaded (see
        ``TableRegistry.schema_changed``): the schema is read again first, and only a mutation the newer one
        does not decode either is dead-lettered. The update of a mutation that has only one is published
        undecoded (``split_partition_updates``): while the schema may lag behind the node's, its column lists
        are checked, so that a column added since reaches the schema topic before the record that needs it."""
        reread = False
        while True:
            try:
                updates = split_partition_updates(entry.body, self.tables.schema, version)
                routes = [self.tables.route(update[:16]) for update in updates]
                if None not in routes:
                    known = cast(list[Route], routes)
                    if len(updates) == 1 and known[0].published and self.tables.may_lag():
                        PartitionUpdateSerializer.check_columns(updates[0], self.tables.schema)
                    return known, updates
                unknown = uuid.UUID(bytes=updates[routes.index(None)][:16])
            except UnknownTableError as error:
                unknown = error.table_id
            except MutationDecodeError as error:
                if not reread:
                    reread = True
                    newer = self.tables.reload_for_undecodable(_where(progress, entry),
                                                               partial(self._pause, progress))
                    if newer is None:
                        return False
                    if newer:
                        continue
                return self._dead_letter(progress, Damage(
                    str(progress.segment.path), DamageKind.UNDECODABLE_MUTATION, str(error),
                    entry.section_offset, entry.section, entry.start, entry.body))
            waited = self.tables.await_table(unknown, _where(progress, entry), partial(self._pause, progress))
            if waited is None:
                if self._stopping.is_set():
                    return False
                self.metrics.skipped.inc()  # Cassandra drops the whole mutation
                return True

    def _pause(self, progress: SegmentProgress, seconds: float) -> bool:
        """Wait ``seconds`` in the middle of reading ``progress``'s segment, keeping the bookkeeping going;
        True when stopping. What was read before reaches Kafka and is acknowledged meanwhile."""
        self.deliveries.seal(self._while_blocked)
        self._checkpoint(progress)
        deadline = time.monotonic() + seconds
        while not self._stopping.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            self._housekeeping()
            if time.monotonic() >= deadline:
                return False
        return True

    def _publish_schema(self, route: Route) -> bool:
        """Publish the schema of a route's table, before its first record; False if stopped meanwhile."""
        route.schema_published = self.schemas.ensure_published(route.table)
        return route.schema_published

    def _publish_drops(self) -> None:
        """Publish the drops of the tables the schema lost (``TableRegistry.dropped``), each once. The read
        that finds a drop may be one made after the node logged it (``may_lag``), or the first one the node
        beside answers after reads of another node (at a start too), which no record of the dropped table
        follows to prompt: it is made here once it is due."""
        self.tables.may_lag()
        self.tables.read_node_beside_when_due()
        for table_id, table in list(self.tables.dropped.items()):
            if not self.schemas.publish_dropped(table):
                return
            self.tables.drop_published(table_id)

    # --- truncations ------------------------------------------------------------------------------

    def _publish_truncations(self, segments: list[CdcSegment]) -> None:
        """Send each due truncation whose commit log position every mutation before it was read up to (with
        no mutation after it read yet, or it would have been sent before that one)."""
        for truncation in self.truncations.due():
            if self._sent_through(segments, truncation) and not self._send_truncation(truncation):
                return

    def _publish_truncations_before(self, progress: SegmentProgress, entry: Entry) -> bool:
        """Send the truncations waiting that precede ``entry``, before it; False if stopped meanwhile."""
        for truncation in self.truncations.before(progress.segment.segment_id, entry.position):
            if not self._send_truncation(truncation):
                return False
        return True

    def _send_truncation(self, truncation: Truncation) -> bool:
        """Send a truncation to every partition of the raw topic (if its table is published; else it is only
        recorded). False if stopped meanwhile: it is sent again after the restart."""
        table = self.tables.lookup(truncation.table_id)
        if table is None or not self.tables.is_published(table):
            self.truncations.skip(truncation)
            return True
        route = self.tables.route(truncation.table_id.bytes)
        if route is None or (not route.schema_published and not self._publish_schema(route)):
            return False  # stopped while publishing the schema (the pipeline needs it to know the table)
        record = TruncationRecord(self.config.node_id, truncation.table_id.bytes, truncation.segment_id,
                                  truncation.position, truncation.truncated_at_ms)
        key, value = record.key(), record.encode()
        for partition in range(self.deliveries.partitions(self._raw_topic)):
            if not self.deliveries.send(self._raw_topic, key, value, self._while_blocked, partition):
                return False
        if not self.deliveries.seal(self._while_blocked):
            return False
        self.truncations.sent(truncation, self.deliveries.watermark())
        log.info("published the truncation of %s at %d ms (commit log segment %d, position %d)",
                 route.name, truncation.truncated_at_ms, truncation.segment_id, truncation.position)
        return True

    def _sent_through(self, segments: list[CdcSegment], truncation: Truncation) -> bool:
        """Whether every mutation of CDC tables the node wrote before the truncation's commit log position is
        read and sent: older segments read to their end, the truncation's own segment up to the position (a
        segment without an idx file holds no CDC data)."""
        for segment in segments:
            if segment.segment_id > truncation.segment_id:
                break
            progress = self._progress.get(segment.segment_id)
            if progress is None:
                return False  # not reached yet: an older one is still being read
            reached = progress.read_all or (segment.segment_id == truncation.segment_id
                                            and progress.read_position >= truncation.position)
            if not reached and segment.index_path.exists():
                return False
        return True

    # --- damage -----------------------------------------------------------------------------------

    def _unreadable(self, progress: SegmentProgress, reason: str, file_offset: int) -> None:
        """A segment whose header cannot be read: to the dead letters, then kept whole once acknowledged."""
        progress.damaged = True
        damage = Damage(str(progress.segment.path), DamageKind.UNREADABLE_HEADER, reason, file_offset, 0)
        if self._dead_letter(progress, damage):
            progress.read_all = True
        self.deliveries.seal(self._while_blocked)
        self._checkpoint(progress)

    def _dead_letter(self, progress: SegmentProgress, damage: Damage) -> bool:
        """A damaged entry or section: to the dead letters, then on. False if stopped while Kafka's queue was
        full."""
        if not self.quarantine.dead_letter(progress.segment, damage, self._while_blocked):
            return False
        self._sent[DEAD_LETTERS] += 1
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
        if now - self._last_census >= CENSUS_SECONDS:
            self._last_census = now
            self._census(list_segments(self.config.cdc_raw))
            self.space.check(cdc_raw_bytes(self.config.cdc_raw), self.node_settings)
        if (self._node_settings_read_at is None and self.config.schema_.cassandra is not None
                and now - self._last_node_settings_try >= NODE_SETTINGS_RETRY_SECONDS):
            self._read_node_settings()

    def _save_positions(self) -> None:
        behind = 0
        for segment_id, progress in self._progress.items():
            self.positions.set(segment_id, progress.segment.path.name, progress.acknowledged, progress.done,
                               progress.damaged, progress.index_offset)
            if progress.index_offset is not None:
                behind += max(0, progress.index_offset - progress.acknowledged)
        self.positions.acknowledge(self._raw_topic, self.deliveries.acknowledged_offsets(self._raw_topic))
        self.truncations.acknowledge(self.deliveries)
        self.positions.save()
        self.metrics.behind_bytes.set(behind)
        self._set_lag()
        self.metrics.segments_pending.set(sum(1 for p in self._progress.values()
                                              if p.holds_data and not p.done))

    def _note_durable_writes(self) -> None:
        """While Kafka cannot be reached at startup nothing is read, but what is durable in cdc_raw keeps
        aging: note it, for the lag."""
        self._census(list_segments(self.config.cdc_raw))
        self._set_lag()

    def _set_lag(self) -> None:
        oldest = [progress.unacknowledged_since() for progress in self._progress.values()]
        self.metrics.unacknowledged_since = min((since for since in oldest if since is not None),
                                                default=None)

    def _kafka_reachability(self, reachable: bool) -> None:
        self._kafka_reachable = reachable
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
                           damaged=progress.damaged, durable=progress.index_offset)
        self.positions.save()
        if not self.cleanup.dispose(segment, progress.damaged):
            return
        self.positions.forget(segment.segment_id)
        self.positions.save()
        self._progress.pop(segment.segment_id, None)  # gone already if a look at cdc_raw found it gone

    def _read_node_settings(self) -> None:
        """The node's CDC settings, by CQL from the node beside the agent (with a schema file: the
        configuration's). While the node does not answer, the configuration's stand in and it is asked
        again."""
        from cassandra import DriverException
        from cassandra.cluster import NoHostAvailable

        source = self.config.schema_.cassandra
        if source is None:
            warn_about(self.node_settings)
            return
        self._last_node_settings_try = time.monotonic()
        try:
            node = read_node_settings(source)
        except ValueError as error:
            log.warning("%s: the agent goes by its configuration's values (%s)", error,
                        self.node_settings.source)
            self._node_settings_read_at = time.monotonic()  # asking again would give the same answer
            return
        except (NoHostAvailable, DriverException, OSError) as error:
            log.warning("cannot read the CDC settings of %s (%s): the agent goes by its configuration's (or "
                        "Cassandra's defaults) and asks again every %.0f s", source.contact_points[0], error,
                        NODE_SETTINGS_RETRY_SECONDS)
            return
        self._node_settings_read_at = time.monotonic()
        check_against_configuration(node, self.config)
        warn_about(node)
        self.node_settings = node

    def _check_keys(self) -> None:
        """Every encrypted segment still to read must decrypt with the keys given: a ConfigError otherwise."""
        for segment in list_segments(self.config.cdc_raw):
            saved = self.positions.get(segment.segment_id)
            if saved is None or not saved.completed:
                ensure_key(segment, self.keystore)


def _where(progress: SegmentProgress, entry: Entry) -> str:
    """An entry's place, for the log: its segment's file name and its offset."""
    return f"{progress.segment.path.name} offset {entry.start}"
