"""The stateful step of the pipeline: raw records in, change events out, merge state in RocksDB.

PySpark's stateful APIs cost about half a millisecond per grouping key and per state access
(platform-notes.md), so grouping by partition key would cap the pipeline at a few thousand records
per second. Records are instead grouped by a hash bucket of their Kafka key: one call per bucket per
micro-batch, one state read and one state write per bucket, and all of a bucket's partitions merged
in one pass over its records (which arrive as Arrow-backed pandas frames).

What a record costs in Python is kept to what only Python can do (decode, merge, encode):

* Replica copies never reach the merge. ``with_copy_identity`` takes each record's digest from its
  fixed place in the header and checks it against the update bytes natively (in the JVM);
  ``drop_replica_copies`` then keeps the first intact record of each (key, digest) of the batch,
  vectorised. Copies in different batches are skipped by the recent digests kept in the state.
* The state of a bucket maps each partition key to its next expiry and its pickled merge state
  (see ``merge.py``): a batch unpickles and pickles again only the partitions it touches, and sets
  the bucket's timer from the stored expiries.

TTL expiry: each bucket registers a processing-time timer at its earliest expiry; when it fires, the
expired cells and rows are removed and the resulting update or delete events emitted. The timer
values come from the batch's timestamp in Spark's offset log, so a replayed batch decides alike.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import logging
import pickle
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (ExpiredTimerInfo, StatefulProcessor,
                                                      StatefulProcessorHandle, TimerValues)
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from ..commitlog import PartitionUpdateSerializer
from ..commitlog.errors import MutationDecodeError
from ..commitlog.io import DataInput, EndOfData
from ..schema import TableMetadata
from ..topics.raw import DIGEST_OFFSET, DIGEST_SIZE, FORMAT_VERSION, HEADER_SIZE, RawRecord, RawRecordError
from .catalog import SchemaCatalog
from .events import EventEncoder, Format, SchemaRegistry, Source
from .merge import PartitionState, RowChange, apply_update, expire, next_expiry

log = logging.getLogger(__name__)

OUTPUT_SCHEMA = StructType([StructField("topic", StringType()), StructField("key", BinaryType()),
                            StructField("value", BinaryType())])
_STATE_SCHEMA = StructType([StructField("partitions", BinaryType())])
_NODE_ID_LENGTH_OFFSET = 3  # docs/raw-records.md: the node id, then the partition update, follow the header


def with_copy_identity(raw: DataFrame) -> DataFrame:
    """The raw records with what ``ChangeProcessor`` needs to drop replica copies without decoding them.

    ``digest``: the MD5 of the partition update, from its fixed place in the header. ``intact``: the
    format version is known and the digest matches the update bytes, checked natively in the JVM. Only
    intact records are dropped as copies, so that a damaged record never hides the good copy of its
    write (it goes on to be reported as damaged).
    """
    value = F.col("value")
    node_id_length = F.conv(F.hex(F.substring(value, _NODE_ID_LENGTH_OFFSET + 1, 1)), 16, 10).cast("int")
    update = value.substr(node_id_length + HEADER_SIZE + 1, F.length(value))
    digest = F.substring(value, DIGEST_OFFSET + 1, DIGEST_SIZE)
    intact: Column = ((F.substring(value, 1, 1) == F.lit(bytes([FORMAT_VERSION])))
                      & (F.md5(update) == F.lower(F.hex(digest))))
    return raw.withColumn("digest", digest).withColumn("intact", F.coalesce(intact, F.lit(False)))


def drop_replica_copies(batch: pd.DataFrame) -> pd.DataFrame:
    """All but the first (in offset order) of the intact records with the same key and digest.

    The replicas' copies of one write are the same update bytes, published under the same key, so to
    the same Kafka partition: dropping them here, vectorised, means each write is decoded and merged
    once. Copies in different micro-batches are caught by the merge state's recent digests.
    """
    copies = batch["intact"].to_numpy(dtype=bool) & batch.duplicated(["key", "digest", "intact"]).to_numpy()
    return batch[~copies]


@dataclass(frozen=True)
class ProcessorSettings:
    server: str
    cluster: str
    bootstrap_servers: str
    schema_topic: str
    errors_topic: str
    format: Format = "json"
    schema_registry_url: str | None = None
    tombstones: bool = False
    consumer: tuple[tuple[str, Any], ...] = ()


class ChangeProcessor(StatefulProcessor):
    """Runs in the Python workers; one instance per state partition, reused across micro-batches."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("partitions", _STATE_SCHEMA)
        self.catalog = SchemaCatalog.shared(self.settings.bootstrap_servers, self.settings.schema_topic,
                                            dict(self.settings.consumer))
        self.catalog.refresh()  # each batch decodes with the definitions published before it
        self._refreshed_for: set[bytes] = set()  # ids of tables the catalog was read again for, this batch
        registry = SchemaRegistry(self.settings.schema_registry_url) if self.settings.schema_registry_url else None
        self._registry = registry
        self._encoders: dict[tuple[Any, str], EventEncoder] = {}

    # --- Spark callbacks --------------------------------------------------------------------------

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        frames = list(rows)
        batch = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        # Records of one partition key come from one Kafka partition: its offsets give their order.
        batch = drop_replica_copies(batch.sort_values(["partition", "offset"], kind="stable"))
        out = _Output()
        with _collector_paused():
            partitions = self._load()
            for record_key, value in zip(batch["key"].tolist(), batch["value"].tolist()):
                self._apply(partitions, record_key, value, now_ms, out)
            self._save(partitions, now_ms)
        yield out.frame()

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        partitions = self._load()
        out = _Output()
        now_seconds = now_ms // 1000
        for record_key, state in partitions.due(now_seconds):
            expiry = next_expiry(state)
            if expiry is None or expiry > now_seconds:
                continue  # the stored expiry was early: what it was for was deleted since
            found = self.catalog.table(record_key[:16])
            if found is None:
                continue
            table, version = found
            changes = expire(state, table, now_seconds)
            source = Source(self.settings.server, self.settings.cluster, table.keyspace, table.name,
                            expiry * 1_000_000, False, None, None, None)
            self._emit(table, version, changes, source, False, now_ms, out)
            if state.is_empty():
                partitions.remove(record_key)
        self._save(partitions, now_ms)
        yield out.frame()

    def close(self) -> None:
        pass

    # --- merging ----------------------------------------------------------------------------------

    def _apply(self, partitions: "_Partitions", record_key: bytes, value: bytes, now_ms: int,
               out: "_Output") -> None:
        try:
            record = RawRecord.decode(value)
        except RawRecordError as error:
            out.error(self.settings.errors_topic, record_key, value, str(error))
            return
        state = partitions.get(record_key)
        digest = value[DIGEST_OFFSET:DIGEST_OFFSET + DIGEST_SIZE]  # checked against the update by decode: no MD5 again
        if state is not None and state.seen(digest):
            return  # another replica's copy of an update already merged
        table_version = self._decode(record)
        if isinstance(table_version, str):
            out.error(self.settings.errors_topic, record_key, value, table_version)
            return
        table, version, update = table_version
        if state is None:
            state = partitions.add(record_key)
        changes = apply_update(state, update, table, now_ms // 1000, digest)
        source = Source(self.settings.server, self.settings.cluster, table.keyspace, table.name, record.write_time,
                        record.snapshot, record.node_id, record.segment_id, record.position)
        self._emit(table, version, changes, source, record.snapshot, now_ms, out)

    def _decode(self, record: RawRecord) -> tuple[TableMetadata, str, Any] | str:
        """The record's table and decoded partition update, or the reason it cannot be decoded.

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
                update = PartitionUpdateSerializer.deserialize(DataInput(record.update), self.catalog.schema,
                                                               record.commitlog_version)
                return found[0], found[1], update
            except (MutationDecodeError, EndOfData, ValueError, IndexError, KeyError) as error:
                reason = f"cannot decode the partition update of {found[0].qualified_name}: {error}"
        return reason or (f"no schema for table id {uuid.UUID(bytes=table_id)} on the schema topic "
                          f"{self.settings.schema_topic}")

    def _emit(self, table: TableMetadata, version: str, changes: list[RowChange], source: Source, snapshot: bool,
              now_ms: int, out: "_Output") -> None:
        if not changes:
            return
        encoder = self._encoders.get((table.id, version))
        if encoder is None:
            encoder = self._encoders[(table.id, version)] = EventEncoder(self.settings.server, table,
                                                                         self.settings.format, self._registry)
        for change in changes:
            before, after = change.before, change.after
            if before is None:
                op = "r" if snapshot else "c"
            elif after is None:
                op = "d"
            else:
                op = "u"
            key = encoder.key(after if after is not None else before)  # type: ignore[arg-type]
            out.add(encoder.topic, key, encoder.value(before, after, op, source, now_ms))
            if op == "d" and self.settings.tombstones:
                out.add(encoder.topic, key, None)

    # --- state ------------------------------------------------------------------------------------

    def _load(self) -> "_Partitions":
        return _Partitions(pickle.loads(self.state.get()[0]) if self.state.exists() else {})

    def _save(self, partitions: "_Partitions", now_ms: int) -> None:
        stored = partitions.dump()
        if stored is None:
            self.state.clear()
        else:
            self.state.update((stored,))
        expiry = partitions.earliest_expiry()
        wanted = [] if expiry is None else [max(expiry * 1000, now_ms + 1)]
        existing = list(self.handle.listTimers())
        if existing != wanted:  # every state call costs ~0.4 ms: leave an unchanged timer alone
            for timer in existing:
                self.handle.deleteTimer(timer)
            for timer in wanted:
                self.handle.registerTimer(timer)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
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


class _Partitions:
    """The merge states of one bucket's partitions, each pickled on its own, its next expiry beside it.

    A micro-batch touches some of a bucket's partitions: only those are unpickled and pickled again,
    the others stay bytes (copied, never decoded), and timers are set from the stored expiries.
    """

    def __init__(self, stored: dict[bytes, tuple[int | None, bytes]]) -> None:
        self._stored = stored  # partition key → (next expiry, pickled PartitionState.stored())
        self._opened: dict[bytes, PartitionState] = {}

    def get(self, key: bytes) -> PartitionState | None:
        state = self._opened.get(key)
        if state is None and key in self._stored:
            stored = pickle.loads(self._stored[key][1])
            # A checkpoint may hold states pickled as objects, as they were before ``PartitionState.stored``.
            state = stored if isinstance(stored, PartitionState) else PartitionState.from_stored(stored)
            self._opened[key] = state
        return state

    def add(self, key: bytes) -> PartitionState:
        state = self._opened[key] = PartitionState()
        return state

    def remove(self, key: bytes) -> None:
        self._opened.pop(key, None)
        self._stored.pop(key, None)

    def due(self, now_seconds: int) -> list[tuple[bytes, PartitionState]]:
        """The partitions whose stored expiry has come, opened."""
        keys = [key for key, (expiry, _) in self._stored.items() if expiry is not None and expiry <= now_seconds]
        return [(key, self.get(key)) for key in keys]  # type: ignore[misc]

    def dump(self) -> bytes | None:
        """The bucket's state value with the opened partitions pickled again; None when it has none."""
        for key, state in self._opened.items():
            stored = pickle.dumps(state.stored(), protocol=pickle.HIGHEST_PROTOCOL)
            self._stored[key] = (next_expiry(state), stored)
        self._opened.clear()
        return pickle.dumps(self._stored, protocol=pickle.HIGHEST_PROTOCOL) if self._stored else None

    def earliest_expiry(self) -> int | None:
        return min((expiry for expiry, _ in self._stored.values() if expiry is not None), default=None)


class _Output:
    """Events and dead letters of one call, returned as one frame."""

    def __init__(self) -> None:
        self.topics: list[str] = []
        self.keys: list[bytes] = []
        self.values: list[bytes | None] = []

    def add(self, topic: str, key: bytes, value: bytes | None) -> None:
        self.topics.append(topic)
        self.keys.append(key)
        self.values.append(value)

    def error(self, topic: str, key: bytes, value: bytes, reason: str) -> None:
        report = {"reason": reason, "key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode(),
                  "ts_ms": int(time.time() * 1000)}
        self.add(topic, key, json.dumps(report).encode())

    def frame(self) -> pd.DataFrame:
        # Object columns even when empty: an empty list would become float64, which Arrow cannot send.
        return pd.DataFrame({"topic": pd.Series(self.topics, dtype=object), "key": pd.Series(self.keys, dtype=object),
                             "value": pd.Series(self.values, dtype=object)})
