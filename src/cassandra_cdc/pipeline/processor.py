"""The stateful step of the pipeline: raw records in, change events out, merge state in RocksDB.

PySpark's stateful APIs cost about half a millisecond per grouping key and per state access
(platform-notes.md), so grouping by partition key would cap the pipeline at a few thousand records
per second. Records are instead grouped by a hash bucket of their Kafka key: one call per bucket per
micro-batch, one state read and one state write per bucket, and all of a bucket's partitions merged
in one pass over its records (which arrive as Arrow-backed pandas frames). The state of a bucket is
the pickled map of its partitions' merge states (see ``merge.py``); buckets are many enough to keep
each small.

TTL expiry: each bucket registers a processing-time timer at its earliest expiry; when it fires, the
expired cells and rows are removed and the resulting update or delete events emitted. The timer
values come from the batch's timestamp in Spark's offset log, so a replayed batch decides alike.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (ExpiredTimerInfo, StatefulProcessor,
                                                      StatefulProcessorHandle, TimerValues)
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from ..commitlog import PartitionUpdateSerializer
from ..commitlog.errors import MutationDecodeError
from ..commitlog.io import DataInput, EndOfData
from ..schema import TableMetadata
from ..topics.raw import RawRecord, RawRecordError
from .catalog import SchemaCatalog
from .events import EventEncoder, Format, SchemaRegistry, Source
from .merge import PartitionState, RowChange, apply_update, expire, next_expiry

log = logging.getLogger(__name__)

OUTPUT_SCHEMA = StructType([StructField("topic", StringType()), StructField("key", BinaryType()),
                            StructField("value", BinaryType())])
_STATE_SCHEMA = StructType([StructField("partitions", BinaryType())])


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
        self.catalog = SchemaCatalog(self.settings.bootstrap_servers, self.settings.schema_topic,
                                     dict(self.settings.consumer))
        registry = SchemaRegistry(self.settings.schema_registry_url) if self.settings.schema_registry_url else None
        self._registry = registry
        self._encoders: dict[tuple[Any, str], EventEncoder] = {}

    # --- Spark callbacks --------------------------------------------------------------------------

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        frames = list(rows)
        batch = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        # Records of one partition key come from one Kafka partition: its offsets give their order.
        batch = batch.sort_values(["partition", "offset"], kind="stable")
        partitions = self._load()
        out = _Output()
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
        for record_key, state in list(partitions.items()):
            expiry = next_expiry(state)
            if expiry is None or expiry > now_seconds:
                continue
            found = self.catalog.table(uuid.UUID(bytes=record_key[:16]))
            if found is None:
                continue
            table, version = found
            changes = expire(state, table, now_seconds)
            source = Source(self.settings.server, self.settings.cluster, table.keyspace, table.name,
                            expiry * 1_000_000, False, None, None, None)
            self._emit(table, version, changes, source, False, now_ms, out)
            if state.is_empty():
                del partitions[record_key]
        self._save(partitions, now_ms)
        yield out.frame()

    def close(self) -> None:
        pass

    # --- merging ----------------------------------------------------------------------------------

    def _apply(self, partitions: dict[bytes, PartitionState], record_key: bytes, value: bytes, now_ms: int,
               out: "_Output") -> None:
        try:
            record = RawRecord.decode(value)
        except RawRecordError as error:
            out.error(self.settings.errors_topic, record_key, value, str(error))
            return
        state = partitions.get(record_key)
        if state is not None and state.seen(record.digest):
            return  # another replica's copy of an update already merged
        table_version = self._decode(record)
        if isinstance(table_version, str):
            out.error(self.settings.errors_topic, record_key, value, table_version)
            return
        table, version, update = table_version
        if state is None:
            state = partitions[record_key] = PartitionState()
        changes = apply_update(state, update, table, now_ms // 1000, record.digest)
        source = Source(self.settings.server, self.settings.cluster, table.keyspace, table.name, record.write_time,
                        record.snapshot, record.node_id, record.segment_id, record.position)
        self._emit(table, version, changes, source, record.snapshot, now_ms, out)

    def _decode(self, record: RawRecord) -> tuple[TableMetadata, str, Any] | str:
        """The record's table and decoded partition update, or the reason it cannot be decoded.

        An unknown table, or a column its known definition lacks, means the schema topic has news (the
        agents publish a definition before the records that need it): read it again, once.
        """
        reason = f"no schema for table id {record.table_id} on the schema topic {self.settings.schema_topic}"
        for attempt in range(2):
            if attempt and not self.catalog.refresh():
                break
            found = self.catalog.table(record.table_id, refresh=False)
            if found is None:
                continue
            try:
                update = PartitionUpdateSerializer.deserialize(DataInput(record.update), self.catalog.schema,
                                                               record.commitlog_version)
                return found[0], found[1], update
            except (MutationDecodeError, EndOfData, ValueError, IndexError, KeyError) as error:
                reason = f"cannot decode the partition update of {found[0].qualified_name}: {error}"
        return reason

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

    def _load(self) -> dict[bytes, PartitionState]:
        if not self.state.exists():
            return {}
        return pickle.loads(self.state.get()[0])

    def _save(self, partitions: dict[bytes, PartitionState], now_ms: int) -> None:
        if partitions:
            self.state.update((pickle.dumps(partitions, protocol=pickle.HIGHEST_PROTOCOL),))
        else:
            self.state.clear()
        expiries = [e for e in (next_expiry(s) for s in partitions.values()) if e is not None]
        wanted = [max(min(expiries) * 1000, now_ms + 1)] if expiries else []
        existing = list(self.handle.listTimers())
        if existing != wanted:  # every state call costs ~0.4 ms: leave an unchanged timer alone
            for timer in existing:
                self.handle.deleteTimer(timer)
            for timer in wanted:
                self.handle.registerTimer(timer)


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
