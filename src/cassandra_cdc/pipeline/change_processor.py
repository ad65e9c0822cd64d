"""The stateful step of the pipeline: raw records in, change events out, merge state in RocksDB.

PySpark's stateful APIs cost about half a millisecond per grouping key and per state access
(docs/pipeline.md, "How it works"), so grouping by partition key would cap the pipeline at a few
thousand records per second. Records are instead grouped by raw topic partition (the agents key the
topic by partition key): one call per raw partition per micro-batch, a read and a write of each page
of its state the records touch (below), and all of its partition keys merged in one pass over its records.

The records reach the processor in one of two ways. With the Python source they are not in the rows
at all: each row names a range of offsets of one raw topic partition (``emit=offsetRanges`` in
source.py), and the processor reads the range itself, so that no record is converted to Arrow, shuffled
or handed between the JVM and Python. With Spark's ``kafka`` format the rows are the records. Either
way, the grouping key is the raw topic partition (all records of a partition key are in one), and
records are merged in the order of their state pages, each partition key's in offset order
(``in_page_order``).

The events are written to Kafka by the processor itself, as it makes them, in one transaction per task
(sink.py) committed in ``close``, after the task's last input and timer and before Spark commits the
state store. Spark's output of the operator is empty.

What a record costs in Python is kept to what only Python can do (decode, merge, encode):

* Replica copies are not merged again: a partition's state keeps the digests of its recent updates
  (the copies of one write are the same update bytes, so the same digest), stored beside its pickled state,
  and a copy costs the header's decode and digest check only: the state is not unpickled, and a page whose
  partitions did not change is not written back, so that copies arriving in another micro-batch than their
  write (agents lagging apart) cost a page read.
* The state of a group is paged (``PagedGroup``, ``group_state.py``): a batch reads and writes only the pages
  its records touch, many in one exchange with the state server, and unpickles and pickles again only the
  partitions it touches, so that its cost and the bytes it writes to the checkpoint follow the batch, not the
  table; pages split as the group grows, and a wide partition's rows are in leaves, of which a write reads
  and writes the one it changes (read ahead for ``DECODED_AHEAD`` records at a time).

Truncation: a ``TRUNCATE`` reaches the raw topic as one truncation record per node and raw partition
(``TruncationRecord``). Each group applies it as a deletion of every partition of the table it holds (in
the pages the batch reads, and in each other page when it is next read) and keeps it (the table's newest)
in its index, so that partitions of the table it meets later start deleted: a late copy
of a write made before the truncation stays deleted, a write made after it lives (by write time, as
Cassandra reconciles). Only the group of raw partition 0 writes the ``t`` event, once per truncation: the
nodes' copies, each with its node's time, are one truncation.

TTL expiry: each group registers a processing-time timer at its earliest expiry; when it fires, the
expired cells and rows are removed and the resulting update or delete events emitted. The timer
values come from the batch's timestamp in Spark's offset log, so a replayed batch decides alike.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Literal

import pandas as pd
from pyspark import Accumulator
from pyspark.sql.streaming.stateful_processor import (ExpiredTimerInfo, StatefulProcessor,
                                                      StatefulProcessorHandle, TimerValues)
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from ..storage.decode_errors import MutationDecodeError
from ..storage.binary_io import EndOfData
from ..storage.partition_update import PartitionUpdate
from ..schema import TableMetadata
from ..kafka.raw_records import (RawRecord, RawRecordError, TruncationRecord, decode_update, is_truncation,
                                 stored_digest)
from ..kafka.schema_catalog import SchemaCatalog
from ..events.column_rules import ColumnRules
from ..events.event_encoder import EventEncoder, Format, SchemaRegistry, Source
from ..events.field_mapping import TypeModes
from ..merge.reconcile import RowChange, apply, expire, next_expiry, only_deleted_by
from .event_sink import SinkSettings, MicroBatchTask, TaskSink, close_sink_clients, task_sink
from .kafka_source import OffsetRange, SourceOptions, close_task_consumers, read_range
from .pipeline_metrics import PipelineTally
from .group_state import (DEFAULT_STATE_PAGES, EXPIRY_BUCKET_KEY_SCHEMA, PAGE_KEY_SCHEMA, TIMER_NOT_RECORDED,
                          PagedGroup, in_page_order, new_partition_state, truncation_deletion)
from .row_nodes import NODE_KEY_SCHEMA, RowNodes
from .state_requests import MapStateRequests

log = logging.getLogger(__name__)

OUTPUT_SCHEMA = StructType([StructField("events", LongType())])  # never output: the events go to Kafka from here
_STATE_SCHEMA = StructType([StructField("partitions", BinaryType())])
# The raw topic partition whose group writes the truncation events (every group gets the records).
TRUNCATION_EVENTS_PARTITION = 0
# Records decoded ahead of their merge, the leaves of wide partitions their rows are in read for them at once.
DECODED_AHEAD = 1024


@dataclass(frozen=True)
class ProcessorSettings:
    server: str
    cluster: str
    bootstrap_servers: str
    schema_topics: tuple[str, ...]
    errors_topic: str
    format: Format = "json"
    schema_registry: tuple[tuple[str, Any], ...] = ()  # the registry client's settings; none: no registry
    tombstones: bool = True
    type_modes: TypeModes = TypeModes()
    columns: ColumnRules = ColumnRules()
    skipped_operations: frozenset[str] = frozenset()  # Debezium's skipped.operations: c, u, d, t
    static_only_rows: Literal["emit", "skip"] = "emit"
    consumer: tuple[tuple[str, Any], ...] = ()
    sink: SinkSettings | None = None  # where the events go; None: nowhere (the driver's planning copy)
    ranges: SourceOptions | None = None  # the raw topic, when rows name offset ranges instead of holding records
    tally: Accumulator[PipelineTally] | None = None  # where each task's counts go (the driver's metrics)
    state_pages: int = DEFAULT_STATE_PAGES  # pages each group's state starts with (fixed once it has state)


class ChangeProcessor(StatefulProcessor):
    """Runs in the Python workers; one instance per state partition, reused across micro-batches."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        # The index keeps the name and schema of the value that held a whole group before pages: a group
        # stored so is read from it, and paged as it is written again.
        self.index = handle.getValueState("partitions", _STATE_SCHEMA)
        self.pages = MapStateRequests(handle.getMapState("pages", PAGE_KEY_SCHEMA, _STATE_SCHEMA), "pages")
        self.expiries = MapStateRequests(handle.getMapState("expiries", EXPIRY_BUCKET_KEY_SCHEMA, _STATE_SCHEMA),
                                         "expiries")
        self.row_nodes = MapStateRequests(handle.getMapState("rows", NODE_KEY_SCHEMA, _STATE_SCHEMA), "rows")
        self.catalog = SchemaCatalog.shared(self.settings.bootstrap_servers, self.settings.schema_topics,
                                            dict(self.settings.consumer))
        self.catalog.refresh()  # each batch decodes with the definitions published before it
        self._refreshed_for: set[bytes] = set()  # ids of tables the catalog was read again for, this batch
        registry = None
        if self.settings.schema_registry:
            registry = SchemaRegistry(dict(self.settings.schema_registry))
        self._registry = registry
        self._encoders: dict[tuple[Any, str], EventEncoder] = {}
        self._sink: TaskSink | None = None  # opened by the task's first event
        self._raw_partition: int | None = None  # the raw topic partition of the records being merged
        self._tally = PipelineTally()  # what the task wrote, added to settings.tally once committed

    # --- Spark callbacks --------------------------------------------------------------------------

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        with self._aborted_on_failure(), collector_paused():
            partitions = self._load()
            for records in in_page_order(self._records(rows), partitions.page_number):
                for window in partitions.read_ahead(records):
                    self._merge_window(partitions, window, now_ms)
            self._save(partitions, now_ms)
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        now_seconds = now_ms // 1000
        with self._aborted_on_failure():
            partitions = self._load()
            if partitions.timer != TIMER_NOT_RECORDED:
                partitions.timer = None  # the group's one timer fired: Spark has removed it
            for record_key, state in partitions.due(now_seconds):
                expiry = next_expiry(state)
                if expiry is None or expiry > now_seconds:
                    continue  # the stored expiry was early: what it was for was deleted since
                found = self.catalog.table(record_key[:16])
                if found is None:
                    continue
                table, version = found
                changes = expire(state, table, now_seconds)
                source = Source(name=self.settings.server, cluster=self.settings.cluster, keyspace=table.keyspace,
                                table=table.name, ts_us=expiry * 1_000_000, snapshot=False, node=None, segment=None,
                                position=None)
                self._emit(table, version, changes, source, False, now_ms)
                if state.is_empty():
                    partitions.remove(record_key)
            self._save(partitions, now_ms)
        return iter(())

    def close(self) -> None:
        """The task's end: its events committed to Kafka before Spark commits the state store."""
        if self._sink is not None:
            with self._aborted_on_failure():
                self._sink.commit()
            if self.settings.tally is not None and not self._sink.skipped:
                self.settings.tally.add(self._tally)
            self._sink = None
        self._tally = PipelineTally()

    # --- input and output -------------------------------------------------------------------------

    def _records(self, rows: Iterator[pd.DataFrame]) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of the group's raw records in offset order, read from Kafka when the rows
        name offset ranges."""
        frames = list(rows)
        batch = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        ranges = self.settings.ranges
        if ranges is None:
            for partition, records in batch.groupby("partition", sort=True):
                records = records.sort_values("offset", kind="stable")
                self._raw_partition = int(partition)
                yield from zip(records["key"].tolist(), records["value"].tolist())
            return
        for partition, start, end in sorted(zip(batch["partition"].tolist(), batch["startOffset"].tolist(),
                                                batch["endOffset"].tolist())):
            self._raw_partition = partition
            for messages in read_range(ranges, OffsetRange(partition, start, end)):
                for message in messages:
                    yield message.key(), message.value()

    def _output(self) -> TaskSink:
        if self._sink is None:
            if self.settings.sink is None:
                raise RuntimeError("this processor has no sink settings: it cannot write events")
            self._sink = task_sink(self.settings.sink, MicroBatchTask.current())
        return self._sink

    @contextlib.contextmanager
    def _aborted_on_failure(self) -> Iterator[None]:
        """A task that fails leaves nothing committed: its retry writes everything again."""
        try:
            yield
        except BaseException:
            if self._sink is not None:
                self._sink.abort()
                self._sink = None
            self._tally = PipelineTally()  # the retry counts it all again
            raise

    def _error(self, record_key: bytes, value: bytes, kind: str, reason: str) -> None:
        """Send a record to the errors topic; ``kind`` names the reason in a word (the metric's label)."""
        self._tally.error(kind)
        report = {"reason": reason, "key": base64.b64encode(record_key).decode(),
                  "value": self._dead_letter_value(value), "ts_ms": int(time.time() * 1000)}
        self._output().produce(self.settings.errors_topic, record_key, json.dumps(report).encode())

    def _dead_letter_value(self, value: bytes) -> str | None:
        """The raw record in a dead letter (base64), or None when the column options leave columns out or
        mask them: a record that could not be decoded cannot have them applied, and the raw topic keeps it."""
        return None if self.settings.columns else base64.b64encode(value).decode()

    # --- merging ----------------------------------------------------------------------------------

    def _merge_window(self, partitions: PagedGroup, window: list[tuple[int | None, bytes, bytes]],
                      now_ms: int) -> None:
        """Merge a window of records whose pages are read: decoded ``DECODED_AHEAD`` at a time, the leaves their
        rows are in (wide partitions) read for them in one exchange, then merged in order."""
        decoded: list[_Decoded] = []
        fresh: set[tuple[bytes, bytes]] = set()  # (key, digest) decoded in this run: the others are copies
        for _, record_key, value in window:
            if is_truncation(value):
                self._merge_decoded(partitions, decoded, now_ms)
                decoded, fresh = [], set()
                self._truncate(partitions, record_key, value, now_ms)
                continue
            record = self._decoded(partitions, record_key, value, fresh)
            if record is not None:
                decoded.append(record)
                if len(decoded) == DECODED_AHEAD:
                    self._merge_decoded(partitions, decoded, now_ms)
                    decoded, fresh = [], set()
        self._merge_decoded(partitions, decoded, now_ms)

    def _decoded(self, partitions: PagedGroup, record_key: bytes, value: bytes,
                 fresh: set[tuple[bytes, bytes]]) -> "_Decoded | None":
        """A record decoded, or None: a copy of an update merged already or decoded just before, or one that
        cannot be decoded (sent to the errors topic)."""
        try:
            record = RawRecord.decode(value)
        except RawRecordError as error:
            self._error(record_key, value, "invalid_raw_record", str(error))
            return None
        digest = stored_digest(value)
        # Seen before decoding: most records are another replica's copy of an update already merged.
        if digest is not None and ((record_key, digest) in fresh
                                   or partitions.page(record_key).seen(record_key, digest)):
            return None
        try:
            table, version, update = self._decode(record_key, record)
        except _Undecodable as error:  # each copy is set aside
            self._error(record_key, value, error.kind, error.reason)
            return None
        if digest is not None:
            fresh.add((record_key, digest))
        return _Decoded(record_key, value, record, digest, table, version, update)

    def _merge_decoded(self, partitions: PagedGroup, decoded: list["_Decoded"], now_ms: int) -> None:
        partitions.read_leaves((d.record_key, d.table, d.update) for d in decoded)
        for record in decoded:
            self._merge(partitions, record, now_ms)

    def _merge(self, partitions: PagedGroup, decoded: "_Decoded", now_ms: int) -> None:
        record_key, value, record, digest = decoded.record_key, decoded.value, decoded.record, decoded.digest
        table, version, update = decoded.table, decoded.version, decoded.update
        page = partitions.page(record_key)
        state = page.get(record_key)
        truncation = partitions.truncations.get(record_key[:16])
        merged = state if state is not None else new_partition_state(update.key, table, truncation,
                                                                     now_ms // 1000)
        try:
            changes = apply(merged, update, table, now_ms // 1000)
        except ValueError as error:  # raised before the state changed: the record is set aside, not retried
            self._error(record_key, value, "unmergeable_update",
                        f"cannot merge the partition update of {table.qualified_name}: {error}")
            return
        if truncation is not None and only_deleted_by(merged, truncation):
            page.remove(record_key)  # a write the truncation deleted: the group's truncation holds it
        elif state is None:
            page.add(record_key, merged)
        merged.remember(digest)
        source = Source(name=self.settings.server, cluster=self.settings.cluster, keyspace=table.keyspace,
                        table=table.name, ts_us=record.write_time, snapshot=record.snapshot, node=record.node_id,
                        segment=record.segment_id, position=record.position)
        self._emit(table, version, changes, source, record.snapshot, now_ms,
                   None if record.snapshot else record.write_time)

    def _truncate(self, partitions: PagedGroup, record_key: bytes, value: bytes, now_ms: int) -> None:
        """A node's truncation of a table: the group's partitions of the table deleted, without events; the
        ``t`` event from the group of raw partition 0, for the first of the nodes' copies."""
        try:
            record = TruncationRecord.decode(value)
            if record_key != record.key():
                raise RawRecordError(f"the Kafka key {record_key.hex()} does not name the truncated table")
        except RawRecordError as error:
            self._error(record_key, value, "invalid_raw_record", str(error))
            return
        found = self.catalog.table(record.table_id)
        if found is None:
            self._error(record_key, value, "unknown_table", self._no_schema(record.table_id))
            return
        table, version = found
        deletion = truncation_deletion(record.truncated_at_ms)
        partitions.truncate(record.table_id, deletion, table)
        if self._raw_partition != TRUNCATION_EVENTS_PARTITION or not partitions.new_truncation(record):
            return
        if "t" in self.settings.skipped_operations:
            return
        encoder = self._encoder(table, version)
        source = Source(name=self.settings.server, cluster=self.settings.cluster, keyspace=table.keyspace,
                        table=table.name, ts_us=record.truncated_at_ms * 1000, snapshot=False,
                        node=record.node_id, segment=record.segment_id, position=record.position)
        self._output().produce(encoder.topic, encoder.no_key(), encoder.value(None, None, "t", source, now_ms))
        self._tally.event(table.qualified_name, "t", None)

    def _decode(self, record_key: bytes, record: RawRecord) -> tuple[TableMetadata, str, Any]:
        """The record's table, the version of its definition and its decoded partition update; raises
        ``_Undecodable`` with the reason when it cannot be decoded.

        An unknown table, or a column its known definition lacks, means the schema topic has news (the
        agents publish a definition before the records that need it): read it again, once per table and
        batch, so that a run of records no definition will explain costs no more than one read.
        """
        table_id = record.update[:16]
        reason: str | None = None
        for attempt in range(2):
            if attempt:
                if table_id in self._refreshed_for:
                    break
                self._refreshed_for.add(table_id)
                if not self.catalog.refresh():
                    break
            found = self.catalog.table(table_id, refresh=False)
            if found is None:
                continue
            try:
                update = decode_update(record_key, record, self.catalog.schema)
                return found[0], found[1], update
            except (MutationDecodeError, EndOfData, ValueError, IndexError, KeyError) as error:
                reason = (f"cannot decode the partition update of {found[0].qualified_name} with the definition "
                          f"of schema version {found[1]}: {error}")
        if reason is not None:
            raise _Undecodable("undecodable_update", reason)
        raise _Undecodable("unknown_table", self._no_schema(table_id))

    def _no_schema(self, table_id: bytes) -> str:
        return (f"no schema for table id {uuid.UUID(bytes=table_id)} on the schema topics "
                f"{', '.join(self.settings.schema_topics)}")

    def _emit(self, table: TableMetadata, version: str, changes: list[RowChange], source: Source, snapshot: bool,
              now_ms: int, written_us: int | None = None) -> None:
        """Write the events of ``changes``; ``written_us``: the write time of the update that made them (None
        for a TTL expiry or a snapshot row), for the write → event lag."""
        if not changes:
            return
        out = self._output()
        encoder = self._encoder(table, version)
        skip_static_only = self.settings.static_only_rows == "skip"
        skipped = self.settings.skipped_operations
        table_name = table.qualified_name
        for change in changes:
            before, after = change.before, change.after
            if before is None:
                op = "r" if snapshot else "c"
            elif after is None:
                op = "d"
            else:
                op = "u"
            if op in skipped:
                continue
            row = after if after is not None else before
            if skip_static_only and encoder.static_only(row):  # type: ignore[arg-type]
                continue
            key = encoder.key(row)  # type: ignore[arg-type]
            out.produce(encoder.topic, key, encoder.value(before, after, op, source, now_ms))
            self._tally.event(table_name, op, written_us)
            if op == "d" and self.settings.tombstones:
                out.produce(encoder.topic, key, None)

    def _encoder(self, table: TableMetadata, version: str) -> EventEncoder:
        encoder = self._encoders.get((table.id, version))
        if encoder is None:
            encoder = self._encoders[(table.id, version)] = EventEncoder(
                self.settings.server, table, self.settings.format, self._registry, self.settings.type_modes,
                self.settings.columns)
        return encoder

    # --- state ------------------------------------------------------------------------------------

    def _load(self) -> PagedGroup:
        stored = self.index.get()
        return PagedGroup(self.pages, self.expiries, RowNodes(self.row_nodes), self.settings.state_pages,
                          None if stored is None else stored[0], self._definition)

    def _definition(self, table_id: bytes) -> TableMetadata | None:
        found = self.catalog.table(table_id)
        return None if found is None else found[0]

    def _save(self, partitions: PagedGroup, now_ms: int) -> None:
        """Store the group's touched pages and its index, with its one timer at the earliest expiry of its
        partitions.

        The group's index records its timer: every state call is a round trip to the JVM, and asking Spark
        for the timers (``listTimers``) also costs the JVM the code generation of a timer encoder, per group
        and batch. An unchanged timer is left alone, an unchanged index too.
        """
        partitions.write_pages()
        expiry = partitions.earliest_expiry()
        wanted = None if expiry is None else max(expiry * 1000, now_ms + 1)
        if partitions.timer == TIMER_NOT_RECORDED:
            registered = list(self.handle.listTimers())
        else:
            registered = [] if partitions.timer is None else [partitions.timer]
        if registered != ([] if wanted is None else [wanted]):
            for timer in registered:
                self.handle.deleteTimer(timer)
            if wanted is not None:
                self.handle.registerTimer(wanted)
        partitions.timer = wanted
        index = partitions.index()
        if index != partitions.stored_index:
            if index is None:
                self.index.clear()
            else:
                self.index.update((index,))


def close_worker_clients() -> None:
    """Close the Kafka clients this process keeps across micro-batches (the processor's, the sink's, the
    read tasks'): before its brokers go away, so that none is left retrying their connections."""
    SchemaCatalog.close_shared()
    close_sink_clients()
    close_task_consumers()


@dataclass(frozen=True)
class _Decoded:
    """A raw record decoded, to be merged."""
    record_key: bytes
    value: bytes
    record: RawRecord
    digest: bytes | None
    table: TableMetadata
    version: str
    update: PartitionUpdate


class _Undecodable(Exception):
    """A raw record the processor cannot decode: it goes to the errors topic with ``reason`` (``kind``: the
    reason in a word)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a batch is merged, back on (if it was) afterwards.

    Merging allocates dozens of containers per record (updates, rows, cells, events) and keeps the opened
    merge states until the batch ends, none of them in reference cycles. Counted towards the collector's
    thresholds, they set off collections, full ones walking every object of the worker: a seventh of the
    processor's time in its benchmark. Paused, the collector catches up with one young collection after.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
