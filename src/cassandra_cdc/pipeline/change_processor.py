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
* The state of a group is paged (``PagedGroup``): its partition keys are spread over a fixed number of
  pages by a hash of the key, each page a value of a ``MapState`` mapping each of its partition keys to
  its next expiry and its pickled merge state (see ``merge.py``). A batch reads and writes only the
  pages its records touch, and unpickles and pickles again only the partitions it touches, so that its
  cost and the bytes it writes to the checkpoint follow the batch, not the table; a group's
  ``ValueState`` is a small index (the group's timer, each page's next expiry, its truncations). Each page
  is a read and a write of the state store, its requests written ahead of their answers, many pages at once
  (``state_requests.py``): fewer, fuller pages make large batches cheaper, more, smaller pages make small
  batches read and write less (``spark.state_pages``).

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
import functools
import gc
import json
import logging
import pickle
import time
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal

import pandas as pd
from pyspark import Accumulator
from pyspark.sql.streaming.stateful_processor import (ExpiredTimerInfo, StatefulProcessor,
                                                      StatefulProcessorHandle, TimerValues)
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from ..storage.decode_errors import MutationDecodeError
from ..storage.binary_io import EndOfData
from ..storage.partition_update import PartitionUpdate
from ..schema import TableMetadata
from ..kafka.raw_records import (RawRecord, RawRecordError, TruncationRecord, decode_update, is_truncation,
                                 stored_digest)
from ..kafka.schema_catalog import SchemaCatalog
from ..events.event_encoder import EventEncoder, Format, SchemaRegistry, Source
from ..events.field_mapping import TypeModes
from ..merge.clustering import Clustering
from ..merge.partition_state import Deletion
from ..merge.reconcile import (PartitionState, RowChange, apply, delete_partition, expire, next_expiry,
                               only_deleted_by)
from ..merge.table_view import table_view
from .event_sink import SinkSettings, MicroBatchTask, TaskSink, close_sink_clients, task_sink
from .kafka_source import OffsetRange, SourceOptions, close_task_consumers, read_range
from .pipeline_metrics import PipelineTally
from .row_nodes import NODE_KEY_SCHEMA, RowNodes
from .state_requests import MapStateRequests

log = logging.getLogger(__name__)

OUTPUT_SCHEMA = StructType([StructField("events", LongType())])  # never output: the events go to Kafka from here
_STATE_SCHEMA = StructType([StructField("partitions", BinaryType())])
# The nodes' copies of one truncation carry each node's own time: they are one truncation when this close
# to the one whose event was written. Cassandra's truncate_request_timeout (its default): every node
# truncates within it, or the TRUNCATE fails.
TRUNCATION_COPIES_WINDOW_MS = 60_000
# The raw topic partition whose group writes the truncation events (every group gets the records).
TRUNCATION_EVENTS_PARTITION = 0
_PAGE_KEY_SCHEMA = StructType([StructField("page", IntegerType())])

DEFAULT_STATE_PAGES = 256
# Bytes of a group's pages a worker keeps read at once; beyond, the least recently used ones are written back.
PAGES_IN_MEMORY_BYTES = 64 << 20
# Pages read in one exchange with the state server at most; fewer while a group's pages are large (as many as
# fit in PAGES_IN_MEMORY_BYTES at the size of those read so far), and until one has been read.
READ_AHEAD_PAGES = 4096
FIRST_READ_AHEAD_PAGES = 16
# Bytes of a group's records a worker holds to merge them in the order of their pages; beyond, those held
# are merged and the next ones held anew.
RECORDS_ORDERED_BYTES = 64 << 20
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
    static_only_rows: Literal["emit", "skip"] = "emit"
    consumer: tuple[tuple[str, Any], ...] = ()
    sink: SinkSettings | None = None  # where the events go; None: nowhere (the driver's planning copy)
    ranges: SourceOptions | None = None  # the raw topic, when rows name offset ranges instead of holding records
    tally: Accumulator[PipelineTally] | None = None  # where each task's counts go (the driver's metrics)
    state_pages: int = DEFAULT_STATE_PAGES  # pages of each group's state (fixed once a checkpoint has state)


class ChangeProcessor(StatefulProcessor):
    """Runs in the Python workers; one instance per state partition, reused across micro-batches."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        # The index keeps the name and schema of the value that held a whole group before pages: a group
        # stored so is read from it, and paged as it is written again.
        self.index = handle.getValueState("partitions", _STATE_SCHEMA)
        self.pages = MapStateRequests(handle.getMapState("pages", _PAGE_KEY_SCHEMA, _STATE_SCHEMA), "pages")
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
            for records in in_page_order(self._records(rows), self.settings.state_pages):
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
            if partitions.timer != _TIMER_NOT_RECORDED:
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
                  "value": base64.b64encode(value).decode(), "ts_ms": int(time.time() * 1000)}
        self._output().produce(self.settings.errors_topic, record_key, json.dumps(report).encode())

    # --- merging ----------------------------------------------------------------------------------

    def _merge_window(self, partitions: "PagedGroup", window: list[tuple[int | None, bytes, bytes]],
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

    def _decoded(self, partitions: "PagedGroup", record_key: bytes, value: bytes,
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

    def _merge_decoded(self, partitions: "PagedGroup", decoded: list["_Decoded"], now_ms: int) -> None:
        partitions.read_leaves((d.record_key, d.table, d.update) for d in decoded)
        for record in decoded:
            self._merge(partitions, record, now_ms)

    def _merge(self, partitions: "PagedGroup", decoded: "_Decoded", now_ms: int) -> None:
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

    def _truncate(self, partitions: "PagedGroup", record_key: bytes, value: bytes, now_ms: int) -> None:
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
        table_name = table.qualified_name
        for change in changes:
            before, after = change.before, change.after
            if before is None:
                op = "r" if snapshot else "c"
            elif after is None:
                op = "d"
            else:
                op = "u"
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
                self.settings.server, table, self.settings.format, self._registry, self.settings.type_modes)
        return encoder

    # --- state ------------------------------------------------------------------------------------

    def _load(self) -> "PagedGroup":
        stored = self.index.get()
        return PagedGroup(self.pages, self.settings.state_pages, None if stored is None else stored[0],
                          self._definition, RowNodes(self.row_nodes))

    def _definition(self, table_id: bytes) -> TableMetadata | None:
        found = self.catalog.table(table_id)
        return None if found is None else found[0]

    def _save(self, partitions: "PagedGroup", now_ms: int) -> None:
        """Store the group's touched pages and its index, with its one timer at the earliest expiry of its
        partitions.

        The group's index records its timer: every state call is a round trip to the JVM, and asking Spark
        for the timers (``listTimers``) also costs the JVM the code generation of a timer encoder, per group
        and batch. An unchanged timer is left alone, an unchanged index too.
        """
        partitions.write_pages()
        expiry = partitions.earliest_expiry()
        wanted = None if expiry is None else max(expiry * 1000, now_ms + 1)
        if partitions.timer == _TIMER_NOT_RECORDED:
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


# The timer of a group stored before groups recorded theirs: Spark is asked.
_TIMER_NOT_RECORDED = -1
# The first item of a paged group's index; the value of a group stored whole is a dict or a tuple whose
# first item is its timer.
_PAGED = "pages"


def page_of(partition_key: bytes, pages: int) -> int:
    """The page of a partition key: the same in every process (``hash`` of bytes is salted per process)."""
    return zlib.crc32(partition_key) % pages


def in_page_order(records: Iterable[tuple[bytes, bytes]],
                  pages: int) -> Iterator[list[tuple[int | None, bytes, bytes]]]:
    """A group's ``(key, value)`` records in runs of ``(page, key, value)``, those of each page of a run
    together, pages in ascending order, so that a batch reads and writes each page once, however many pages its records touch: read in
    offset order, a group whose pages exceed ``PAGES_IN_MEMORY_BYTES`` would write back and read again a page
    for most of its records.

    Only the order across partition keys changes (events of different keys have no order): the records of
    each key keep theirs (the sort is stable, and a key is on one page). A truncation record stays where it
    was, a run of its own (its page None): the records before it are merged before it, those after it
    after it. A run holds at most ``RECORDS_ORDERED_BYTES`` of records: beyond, the held ones are merged
    first.
    """
    held: list[tuple[int | None, bytes, bytes]] = []
    held_bytes = 0
    for key, value in records:
        truncation = is_truncation(value)
        if not truncation:
            held.append((page_of(key, pages), key, value))
            held_bytes += len(key) + len(value)
        if (truncation or held_bytes >= RECORDS_ORDERED_BYTES) and held:
            held.sort(key=_page_number)
            yield held
            held, held_bytes = [], 0
        if truncation:
            yield [(None, key, value)]
    if held:
        held.sort(key=_page_number)
        yield held


def _page_number(record: tuple[int | None, bytes, bytes]) -> int | None:
    return record[0]


def truncation_deletion(truncated_at_ms: int) -> Deletion:
    """The partition deletion a truncation amounts to: every write up to the end of the truncation's
    millisecond (its time has no finer grain; a write after the TRUNCATE returned is later), deleted then."""
    return truncated_at_ms * 1000 + 999, truncated_at_ms // 1000


def new_partition_state(partition_key: bytes, table: TableMetadata, truncation: Deletion | None,
                        now_seconds: int) -> PartitionState:
    """The state of a partition the group does not hold: empty, or deleted by its table's ``truncation``."""
    if truncation is None:
        return PartitionState()
    state = PartitionState(bytes(partition_key))
    delete_partition(state, table, truncation, now_seconds)
    return state


class PagedGroup:
    """The merge state of one group (raw topic partition), its partition keys spread over pages.

    Pages are read ahead of the records that need them (``read_ahead``), many in one exchange with the state
    server, and kept as ``PartitionPage``s until the batch's end, or until the pages read exceed
    ``PAGES_IN_MEMORY_BYTES``: then the least recently used ones are written back (a later record may read
    them again), so that a worker's memory does not follow the size of the state. The index (the group's
    ``ValueState``) holds the group's timer, the next expiry of each page that has one, so that a timer reads
    only the pages due, and the group's truncations.

    Per truncated table (its id), the index keeps the deletion of its newest truncation, which every
    partition of the table the group holds or meets later is given, and, for the group that writes the
    truncation events, the time of the last one written. A truncation is applied at once to the pages read,
    and to each other page when it is next read (a page records the truncations applied to it): a batch
    with a truncation writes only the pages it touches, like any other.

    A group stored whole, as before pages, is read from the index value it was, and its partitions are
    written to their pages, once, the first time the group is saved.
    """

    def __init__(self, pages_state: MapStateRequests, pages: int, stored_index: bytes | None,
                 definition: Callable[[bytes], TableMetadata | None], nodes: RowNodes) -> None:
        self._pages_state = pages_state
        self._nodes = nodes
        self._pages = pages
        self._definition = definition  # a table's definition by id, to apply its truncation to a page read
        self._read: OrderedDict[int, tuple[PartitionPage, int]] = OrderedDict()  # page → (page, bytes read)
        self._read_bytes = 0
        self._pages_loaded = 0
        self._bytes_loaded = 0
        self.stored_index = stored_index
        self.timer: int | None = None  # registered with Spark (ms), or None, or _TIMER_NOT_RECORDED
        self._expiries: dict[int, int] = {}  # page → its next expiry (seconds)
        self.truncations: dict[bytes, Deletion] = {}
        self.truncation_events: dict[bytes, int] = {}  # table id → the truncation time (ms) of its last event
        if stored_index is None:
            return
        stored = pickle.loads(stored_index)
        if isinstance(stored, tuple) and stored[0] == _PAGED:
            _, self.timer, self._expiries, self.truncations, self.truncation_events = stored
            return
        # A group stored whole: a dict of its partitions before groups recorded their timer, then a tuple
        # (timer, partitions), then with the group's truncations and truncation events after them.
        if isinstance(stored, dict):
            stored = (_TIMER_NOT_RECORDED, stored)
        self.timer, partitions, self.truncations, self.truncation_events = (*stored, {}, {})[:4]
        for key, value in partitions.items():  # each already deleted by the group's truncations
            page = page_of(key, pages)
            if page not in self._read:
                self._read[page] = (PartitionPage({}, dict(self.truncations), changed=True, nodes=nodes), 0)
            self._read[page][0].stored[key] = value

    def read_ahead(self, records: list[tuple[int | None, bytes, bytes]]
                   ) -> Iterator[list[tuple[int | None, bytes, bytes]]]:
        """A run of ``in_page_order`` in windows, the pages of each read before it is yielded, in one exchange:
        as many pages as fit in ``PAGES_IN_MEMORY_BYTES`` at the size of the pages read so far."""
        start = 0
        while start < len(records):
            fit = self._pages_that_fit()
            wanted: set[int] = set()
            end = start
            while end < len(records):
                page = records[end][0]
                if page is not None and page not in wanted and page not in self._read:
                    if len(wanted) == fit:
                        break
                    wanted.add(page)
                end += 1
            self.read(wanted)
            yield records[start:end]
            start = end

    def _pages_that_fit(self) -> int:
        if not self._pages_loaded:
            return FIRST_READ_AHEAD_PAGES
        page_bytes = max(1, self._bytes_loaded // self._pages_loaded)
        return max(1, min(READ_AHEAD_PAGES, PAGES_IN_MEMORY_BYTES // page_bytes))

    def read(self, pages: Iterable[int]) -> None:
        """Read those of ``pages`` not read yet, in one exchange with the state server, then write back the
        least recently used of the others while the pages read exceed ``PAGES_IN_MEMORY_BYTES`` (those just
        read are kept: ``read_ahead`` asks for as many as fit)."""
        wanted = sorted(page for page in set(pages) if page not in self._read)
        if not wanted:
            return
        for page, stored in zip(wanted, self._pages_state.get_all([(page,) for page in wanted])):
            partitions = PartitionPage.load(None if stored is None else stored[0], self._nodes)
            self._apply_truncations(partitions)
            size = 0 if stored is None else len(stored[0])
            self._read[page] = (partitions, size)
            self._read_bytes += size
            self._pages_loaded += 1
            self._bytes_loaded += size
        written_back = []
        while self._read_bytes > PAGES_IN_MEMORY_BYTES and len(self._read) > len(wanted):
            page, (partitions, size) = self._read.popitem(last=False)
            self._read_bytes -= size
            written_back.append((page, partitions))
        self._write_back(written_back)

    def _page(self, page: int) -> PartitionPage:
        if page not in self._read:
            self.read((page,))
        self._read.move_to_end(page)
        return self._read[page][0]

    def _apply_truncations(self, page: PartitionPage) -> None:
        """Apply to a page just read the group's truncations it has not had yet."""
        for table_id, deletion in self.truncations.items():
            if page.truncations.get(table_id) == deletion:
                continue
            table = self._definition(table_id)
            # Unknown: its partitions cannot be merged either; applied once it is known.
            if table is not None:
                page.truncate(table_id, deletion, table)

    def _write_back(self, pages: list[tuple[int, PartitionPage]]) -> None:
        """Write ``(page number, page)``s back, in one exchange with the state server (two when some have no
        partitions left)."""
        updated: list[tuple[tuple[int], tuple[bytes]]] = []
        removed: list[tuple[int]] = []
        for page, partitions in pages:
            if not partitions.changed:
                continue  # as it was read (its expiry unchanged)
            stored = partitions.dump()
            expiry = partitions.earliest_expiry()
            if expiry is None:
                self._expiries.pop(page, None)
            else:
                self._expiries[page] = expiry
            if stored is None:
                removed.append((page,))
            else:
                updated.append(((page,), (stored,)))
        if updated:
            self._pages_state.update_all(updated)
        if removed:
            self._pages_state.remove_all(removed)
        self._nodes.flush()  # the wide partitions' leaves the pages sealed

    def read_leaves(self, updates: Iterable[tuple[bytes, TableMetadata, PartitionUpdate]]) -> None:
        """Read, in one exchange per level of their trees, the nodes of wide partitions the rows of
        ``(partition key, table, update)``s are in."""
        wanted: dict[bytes, tuple[PartitionState, list[Clustering]]] = {}
        for key, table, update in updates:
            if not update.rows:
                continue
            state = self.page(key).get(key)
            if state is None or state.rows.inline:
                continue
            state.rows.order = table_view(table).clustering_sort_key
            wanted.setdefault(key, (state, []))[1].extend(row.clustering for row in update.rows)
        while wanted:
            unread = {key: state.rows.unread(clusterings, functools.partial(self._nodes.available, key))
                      for key, (state, clusterings) in wanted.items()}
            self._nodes.read_ahead((key, node) for key, nodes in unread.items() for node in sorted(nodes))
            wanted = {key: wanted[key] for key, nodes in unread.items() if nodes}

    def page(self, key: bytes) -> "PartitionPage":
        """The page of a partition key, read if it is not yet."""
        return self._page(page_of(key, self._pages))

    def remove(self, key: bytes) -> None:
        self.page(key).remove(key)

    def truncate(self, table_id: bytes, deletion: Deletion, table: TableMetadata) -> None:
        """Keep a truncation of a table, the table's newest, for its partitions held and to come, and apply
        it to the pages read (the others have it applied when read)."""
        newest = max(deletion, self.truncations.get(table_id, deletion))
        self.truncations[table_id] = newest
        for partitions, _ in self._read.values():
            partitions.truncate(table_id, newest, table)

    def new_truncation(self, record: TruncationRecord) -> bool:
        """Whether a truncation record is of a truncation whose event is not written yet (noting that it is
        now): not a node's copy of the last one."""
        last = self.truncation_events.get(record.table_id)
        if last is not None and record.truncated_at_ms <= last + TRUNCATION_COPIES_WINDOW_MS:
            return False
        self.truncation_events[record.table_id] = record.truncated_at_ms
        return True

    def due(self, now_seconds: int) -> Iterator[tuple[bytes, PartitionState]]:
        """The partitions whose stored expiry has come, opened: only the pages due are read."""
        pages = sorted({page for page, expiry in self._expiries.items() if expiry <= now_seconds}.union(self._read))
        start = 0
        while start < len(pages):
            window = pages[start:start + self._pages_that_fit()]
            self.read(window)
            for page in window:
                partitions = self._page(page)
                for key in partitions.due_keys(now_seconds):
                    yield key, partitions.get(key)  # type: ignore[misc]
            start += len(window)

    def write_pages(self) -> None:
        """Write back every page read (the partitions opened pickled again)."""
        self._write_back([(page, partitions) for page, (partitions, _) in self._read.items()])
        self._read.clear()
        self._read_bytes = 0

    def earliest_expiry(self) -> int | None:
        """The earliest expiry of the group's pages, once written back."""
        return min(self._expiries.values(), default=None)

    def index(self) -> bytes | None:
        """The group's index value; None when there is nothing to record."""
        if self.timer is None and not self._expiries and not self.truncations and not self.truncation_events:
            return None
        return pickle.dumps((_PAGED, self.timer, self._expiries, self.truncations, self.truncation_events),
                            protocol=pickle.HIGHEST_PROTOCOL)


class PartitionPage:
    """The merge states of a page of a group's partitions, each pickled on its own with its next expiry and its
    recent digests beside it, and the truncations applied to them (table id → deletion).

    A micro-batch touches some of them: only those are unpickled and pickled again, the others stay bytes
    (copied, never decoded). A partition whose digests show a record merged already is not even unpickled;
    a page none of whose partitions was opened, added, removed or truncated is not ``changed``: it need not be
    written back.
    """

    def __init__(self, stored: dict[bytes, tuple[Any, ...]], truncations: dict[bytes, Deletion] | None = None,
                 changed: bool = False, nodes: RowNodes | None = None) -> None:
        # partition key → (next expiry, pickled PartitionState.stored(), its digests); pages written before the
        # digests were kept apart hold (next expiry, pickled state with its digests).
        self.stored = stored
        self._opened: dict[bytes, PartitionState] = {}
        self.truncations = truncations or {}
        self._changed = changed
        self._nodes = nodes  # where the rows of its wide partitions are (their trees' nodes)

    @classmethod
    def load(cls, value: bytes | None, nodes: RowNodes | None = None) -> "PartitionPage":
        """A page's value as ``dump`` made it (None: no state)."""
        if value is None:
            return cls({}, nodes=nodes)
        return cls(*pickle.loads(value), nodes=nodes)

    @property
    def changed(self) -> bool:
        """Whether the page differs from the value it was read from."""
        return self._changed or bool(self._opened)

    def get(self, key: bytes) -> PartitionState | None:
        """The partition's state, opened to be merged into (the page is then ``changed``)."""
        state = self._opened.get(key)
        if state is None and key in self.stored:
            entry = self.stored[key]
            stored = pickle.loads(entry[1])
            # A checkpoint may hold states pickled as objects, as they were before ``PartitionState.stored``.
            if isinstance(stored, PartitionState):
                state = stored
            else:
                state = PartitionState.from_stored(stored, entry[2] if len(entry) > 2 else (), self._loader(key))
            self._opened[key] = state
        return state

    def seen(self, key: bytes, digest: bytes | None) -> bool:
        """Whether the partition has merged the update of this digest recently, from the digests stored beside
        its state when they are (else from the state, opened)."""
        if digest is None:
            return False
        state = self._opened.get(key)
        if state is None:
            entry = self.stored.get(key)
            if entry is None:
                return False
            if len(entry) > 2:
                return digest in entry[2]
            state = self.get(key)
            assert state is not None
        return state.seen(digest)

    def _loader(self, key: bytes) -> Callable[[int], bytes] | None:
        nodes = self._nodes
        if nodes is None:
            return None
        return lambda node: nodes.read(key, node)

    def add(self, key: bytes, state: PartitionState) -> None:
        self._opened[key] = state

    def truncate(self, table_id: bytes, deletion: Deletion, table: TableMetadata) -> None:
        """Apply a truncation of a table to its partitions here (those left with nothing else are dropped).

        Each partition is deleted at its own clock: a page read later than the truncation must not move its
        partitions' clocks on, or what expired in between (written after the truncation) would have no event.
        """
        self.truncations[table_id] = deletion
        self._changed = True
        for key in [key for key in self.stored.keys() | self._opened.keys() if key[:16] == table_id]:
            state = self.get(key)
            assert state is not None and state.clock is not None  # every state stored was merged at a time
            delete_partition(state, table, deletion, state.clock)
            if only_deleted_by(state, deletion):
                self.remove(key)

    def remove(self, key: bytes) -> None:
        """Drop a partition, and the leaves of its rows."""
        state = self.get(key)
        if state is not None and not state.rows.inline:
            self._row_nodes().remove(key, state.rows.node_ids())
        self._opened.pop(key, None)
        self.stored.pop(key, None)
        self._changed = True

    def _row_nodes(self) -> RowNodes:
        if self._nodes is None:
            raise RuntimeError("this page has nowhere to keep the leaves of its partitions' rows")
        return self._nodes

    def due_keys(self, now_seconds: int) -> list[bytes]:
        """The partitions whose stored expiry has come (the opened ones sealed first)."""
        self.seal()
        return [key for key, (expiry, *_) in self.stored.items()
                if expiry is not None and expiry <= now_seconds]

    def seal(self) -> None:
        """Pickle the opened partitions again (and note their next expiries and digests)."""
        for key, state in self._opened.items():
            sealed, written, removed = state.seal()
            if written or removed:
                nodes = self._row_nodes()
                nodes.write(key, written)
                nodes.remove(key, removed)
            stored = pickle.dumps(sealed, protocol=pickle.HIGHEST_PROTOCOL)
            self.stored[key] = (next_expiry(state), stored, state.digests)
        if self._opened:
            self._changed = True
        self._opened.clear()

    def dump(self) -> bytes | None:
        """The page's value, sealed first; None when it has no partitions."""
        self.seal()
        if not self.stored:
            return None
        return pickle.dumps((self.stored, self.truncations), protocol=pickle.HIGHEST_PROTOCOL)

    def earliest_expiry(self) -> int | None:
        self.seal()
        return min((entry[0] for entry in self.stored.values() if entry[0] is not None), default=None)
