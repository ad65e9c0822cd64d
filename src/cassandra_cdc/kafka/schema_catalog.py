"""Table schemas as the agents publish them on the schema topic, read wherever records are decoded.

The catalog reads one or more topics, in order (by default the schema topic of versions before it,
``<server>``, then ``<server>.table-schemas``, ``topic_names.schema_topics``): a later definition of a
table replaces an earlier one, unless it is older: published late by an agent whose node had not applied a
change yet. Such a definition is ignored (logged). It is older when it was written to ``system_schema``
before the one held (``defined_at``, which Cassandra's own schema changes are ordered by), or, whatever
the times say or when one is unknown (a schema file's), when it lacks a column the held one has (or has
dropped) without recording it dropped.

A table's drop record keeps the definition held (records of the table published before the drop still
decode with it, until a table of its name is created again). Records that are not schema records are
skipped.

The pipeline never connects to Cassandra: a raw record names its table by id, and the schema topic
maps ids to definitions. The catalog reads the (compacted, small) topic to its end once, then only
what was added since, each time it is refreshed: when a record names a table it does not know or a
column its definition lacks (a schema change), and at the start of each micro-batch.

Spark creates the stateful processor's handle for every micro-batch but reuses the Python worker
processes, so ``SchemaCatalog.shared`` keeps one catalog (and its consumer) per process: a refresh is
then a watermark request, not a new consumer reading the whole topic (about a second per batch).
"""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from typing import Any, Callable, ClassVar

from confluent_kafka import Message

from ..schema import Schema, TableMetadata
from .consume import TopicFollower
from .schema_records import SchemaRecord

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10.0


class SchemaCatalog:
    _shared: ClassVar[dict[str, "SchemaCatalog"]] = {}

    def __init__(self, bootstrap_servers: str, topics: tuple[str, ...],
                 consumer: dict[str, Any] | None = None,
                 on_record: Callable[[SchemaRecord, TableMetadata], None] | None = None) -> None:
        """``on_record``: called with each schema record read, in the topics' order, and its table."""
        settings = {"bootstrap.servers": bootstrap_servers, "group.id": "cassandra-cdc-schema-reader",
                    "enable.auto.commit": False, "enable.auto.offset.store": False,
                    "enable.partition.eof": True, "isolation.level": "read_committed", **(consumer or {})}
        self.topics = topics
        self.schema = Schema()
        self._versions: dict[uuid.UUID, str] = {}
        self._ignored: set[tuple[uuid.UUID, str]] = set()  # (table id, version): older than the one held
        self._follower = TopicFollower(settings, TIMEOUT_SECONDS)
        self._on_record = on_record

    @classmethod
    def shared(cls, bootstrap_servers: str, topics: tuple[str, ...],
               consumer: dict[str, Any] | None = None) -> "SchemaCatalog":
        """The catalog of this process for these settings, created on first use."""
        identity = json.dumps([bootstrap_servers, topics, consumer or {}], sort_keys=True, default=str)
        catalog = cls._shared.get(identity)
        if catalog is None:
            catalog = cls._shared[identity] = cls(bootstrap_servers, topics, consumer)
        return catalog

    @classmethod
    def close_shared(cls) -> None:
        """Close the consumers of this process's shared catalogs (a catalog used again reopens its own)."""
        for catalog in cls._shared.values():
            catalog.close()

    def table(self, table_id: uuid.UUID | bytes, refresh: bool = True) -> tuple[TableMetadata, str] | None:
        """The latest definition of a table and its version, reading the topic again if unknown.

        The id as a UUID or as its 16 bytes, which start every partition update (no UUID to build per record).
        """
        table = self._find(table_id)
        if table is None and refresh and self.refresh():
            table = self._find(table_id)
        return None if table is None else (table, self._versions[table.id])

    def _find(self, table_id: uuid.UUID | bytes) -> TableMetadata | None:
        if isinstance(table_id, bytes):
            return self.schema.table_by_id_bytes(table_id)
        return self.schema.table_by_id(table_id)

    def refresh(self) -> bool:
        """Read what was added to the topics since the last refresh; return whether anything was."""
        added = [self._follower.read(topic, self._add) for topic in self.topics]
        return any(added)

    def close(self) -> None:
        self._follower.close()

    def _add(self, message: Message) -> None:
        value = message.value()
        if not value:
            return
        if not SchemaRecord.looks_like_one(value):
            return  # another kind of record on a topic read for the older records (Debezium's schema changes)
        try:
            record = SchemaRecord.decode(value)
            table = record.table_metadata()
        except (ValueError, TypeError) as error:
            log.error("ignoring an unreadable schema record: %s", error)
            return
        held = self.schema.table_by_id(table.id)
        if record.dropped and held is not None:
            # An agent's last definition of the table, maybe older than the one held: the drop is news, the
            # definition not.
            if self._on_record is not None:
                self._on_record(record, held)
            return
        older = None if held is None else why_older(table, held)
        if older:
            if (table.id, record.version) not in self._ignored:
                self._ignored.add((table.id, record.version))
                log.warning("ignoring version %s of %s from %s: %s: a definition older than the one held "
                            "(%s), published late", record.version, table.qualified_name, record.node, older,
                            self._versions[table.id])
            return
        self.schema.add_table(table)
        self._versions[table.id] = record.version
        if self._on_record is not None:
            self._on_record(record, table)


def why_older(candidate: TableMetadata, held: TableMetadata) -> str | None:
    """Why ``candidate``, a definition of ``held``'s table, is older than ``held``; None if it is not."""
    defined_at, held_defined_at = candidate.defined_at, held.defined_at
    if defined_at is not None and held_defined_at is not None and defined_at < held_defined_at:
        return f"it was defined at {_as_time(defined_at)}, the version held at {_as_time(held_defined_at)}"
    lost = lost_columns(candidate, held)
    if lost:
        return (f"it lacks {', '.join(lost)} of the version held, neither as columns nor as dropped ones "
                "(or is from a schema file that does not record its drops)")
    return None


def _as_time(microseconds: int) -> str:
    return datetime.datetime.fromtimestamp(microseconds / 1e6, datetime.timezone.utc).isoformat()


def lost_columns(candidate: TableMetadata, held: TableMetadata) -> list[str]:
    """The columns of ``held`` that ``candidate``, a definition of the same table, lacks without a drop newer
    than ``held`` knows of, and the dropped columns of ``held`` it does not record as dropped as late.

    Cassandra drops a column only by recording it dropped, and keeps the record (a column added again keeps
    it too), so a definition that lacks either is older than ``held``. A column ``held`` has and also records
    dropped was added again after that drop: a definition that lacks it by the same drop (or an earlier one)
    is from between the two."""
    kept = {column.name for column in candidate.regular_and_static}
    dropped_at = {column.name: column.dropped_time for column in candidate.dropped}
    held_dropped_at = {column.name: column.dropped_time for column in held.dropped}
    lost = [name for name in (column.name for column in held.regular_and_static)
            if name not in kept and dropped_at.get(name, -1) <= held_dropped_at.get(name, -1)]
    lost += [name for name, dropped_time in held_dropped_at.items()
             if dropped_at.get(name, -1) < dropped_time]
    return lost
