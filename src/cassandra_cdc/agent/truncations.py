"""The node's truncations (``TRUNCATE``), which its commit log does not show, read by CQL and published.

Cassandra writes no mutation of a table it truncates: each node records, in its ``system.local``, the
map ``truncated_at`` from the table's id to 20 bytes (the commit log position the truncation covers:
segment id and position, and the truncation time in milliseconds, its own clock). The agent reads its
node's map (``schema.cassandra``'s first contact point: the node beside it) before it reads what the idx
files made readable (so it knows every truncation made before the mutations it is about to read), and at
most once a second while idle; each truncation of a published table newer than the last one published for
the table is published as a truncation record between the node's mutations it covers and the later ones
(``Agent`` does that), and recorded with the agent's positions once Kafka acknowledged it.

With a schema file there is no CQL connection, and truncations are not seen.
"""

from __future__ import annotations

import logging
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from .agent_config import AgentConfig, CassandraSchemaSource
from .deliveries import Deliveries, Watermark
from .positions import PositionStore
from .tables import cql_cluster, driver_log_at_debug

log = logging.getLogger(__name__)

# ``system.local`` is read at most this often.
POLL_SECONDS = 1.0
_ENTRY = struct.Struct(">qiq")  # segment id, position, truncation time (ms)


@dataclass(frozen=True)
class Truncation:
    table_id: uuid.UUID
    segment_id: int  # the commit log position the truncation covers
    position: int
    truncated_at_ms: int


def parse_truncated_at(entries: Mapping[uuid.UUID, bytes] | None) -> list[Truncation]:
    """The truncations of ``system.local.truncated_at`` (entries of another size are left out, logged)."""
    truncations = []
    for table_id, value in (entries or {}).items():
        if len(value) != _ENTRY.size:
            log.warning("system.local.truncated_at of table %s is %d bytes, not %d: left out", table_id,
                        len(value), _ENTRY.size)
            continue
        truncations.append(Truncation(table_id, *_ENTRY.unpack(value)))
    return truncations


class TruncatedAtReader:
    """Reads ``system.local.truncated_at`` of one node, on a connection kept open between reads."""

    def __init__(self, settings: CassandraSchemaSource) -> None:
        self._settings = settings
        self.node = settings.contact_points[0]
        self._cluster: Any = None
        self._session: Any = None

    def read(self) -> list[Truncation]:
        """The node's truncations; raises the driver's error (or ``OSError``) when the node does not
        answer."""
        if self._session is None:
            with driver_log_at_debug():
                self._cluster = cql_cluster(self._settings, only_node=self.node)
                try:
                    self._session = self._cluster.connect()
                except BaseException:
                    self.close()
                    raise
        row = self._session.execute("SELECT truncated_at FROM system.local").one()
        return parse_truncated_at(row.truncated_at if row is not None else None)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = None


class TruncationWatch:
    """Which of the node's truncations wait to be published, and which Kafka has acknowledged.

    The last truncation published per table is kept in the positions (``PositionStore.truncations``, saved
    with them): a crash neither loses a truncation nor, but in the moment between Kafka's acknowledgement
    and the next save, publishes it again. Without any (a first start), the truncations the node has are
    the baseline: they precede the agent.
    """

    def __init__(self, config: AgentConfig, positions: PositionStore,
                 reader: TruncatedAtReader | None = None) -> None:
        self._positions = positions
        cassandra = config.schema_.cassandra
        self._reader = reader or (TruncatedAtReader(cassandra) if cassandra is not None else None)
        if self._reader is None:
            log.warning("schema.file: the agent reads no schema by CQL, so it cannot see the node's "
                        "truncations (TRUNCATE): they are not published, and the pipeline keeps the "
                        "truncated rows (use schema.cassandra to have them)")
        self._polled_at = -POLL_SECONDS
        self._failing = False
        self._waiting: dict[uuid.UUID, Truncation] = {}
        self._sent: list[tuple[Truncation, Watermark]] = []

    def due(self) -> list[Truncation]:
        """The truncations to publish (each table's newest), the node's map read again when it is time."""
        if time.monotonic() - self._polled_at >= POLL_SECONDS:
            self.refresh()
        return list(self._waiting.values())

    def refresh(self) -> None:
        """Read the node's map now: before reading mutations the idx files made readable, so that every
        truncation made before them is known (the node records it before any later write)."""
        if self._reader is not None:
            self._polled_at = time.monotonic()
            self._poll(self._reader)

    def before(self, segment_id: int, position: int) -> list[Truncation]:
        """The truncations waiting whose commit log position is before ``position`` of ``segment_id``."""
        return [t for t in self._waiting.values() if (t.segment_id, t.position) < (segment_id, position)]

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def _poll(self, reader: TruncatedAtReader) -> None:
        try:
            truncations = reader.read()
        except Exception as error:  # noqa: BLE001 - any of the driver's failures: the next poll tries again
            if not self._failing:
                log.warning("cannot read the truncations of node %s (%s): trying again every %.0f s",
                            reader.node, error, POLL_SECONDS)
            self._failing = True
            reader.close()
            return
        if self._failing:
            log.info("the truncations of node %s are read again", reader.node)
            self._failing = False
        published = self._positions.truncations
        if published is None:  # a first start: what the node has precedes the agent
            self._positions.truncations = {str(t.table_id): t.truncated_at_ms for t in truncations}
            return
        for truncation in truncations:
            if truncation.truncated_at_ms > max(published.get(str(truncation.table_id), -1), self._pending_at(
                    truncation.table_id)):
                self._waiting[truncation.table_id] = truncation

    def _pending_at(self, table_id: uuid.UUID) -> int:
        """The time of the newest truncation of a table waiting or sent (-1: none)."""
        times = [t.truncated_at_ms for t, _ in self._sent if t.table_id == table_id]
        waiting = self._waiting.get(table_id)
        return max(times + ([waiting.truncated_at_ms] if waiting is not None else []), default=-1)

    def skip(self, truncation: Truncation) -> None:
        """A truncation of a table the agent does not publish: recorded, never sent."""
        del self._waiting[truncation.table_id]
        self._record(truncation)

    def sent(self, truncation: Truncation, watermark: Watermark) -> None:
        """A truncation's records are queued: recorded once Kafka has acknowledged ``watermark``."""
        del self._waiting[truncation.table_id]
        self._sent.append((truncation, watermark))

    def acknowledge(self, deliveries: Deliveries) -> None:
        """Record the truncations whose records Kafka has acknowledged (the positions save them next)."""
        acknowledged = [truncation for truncation, watermark in self._sent if deliveries.covers(watermark)]
        self._sent = [(truncation, watermark) for truncation, watermark in self._sent
                      if truncation not in acknowledged]
        for truncation in acknowledged:
            self._record(truncation)

    def _record(self, truncation: Truncation) -> None:
        published = self._positions.truncations
        assert published is not None
        key = str(truncation.table_id)
        published[key] = max(published.get(key, -1), truncation.truncated_at_ms)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
