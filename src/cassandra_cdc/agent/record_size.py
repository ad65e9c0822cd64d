"""How large a raw record may be, and partition updates larger than that as pieces that fit.

Cassandra accepts a mutation up to its ``max_mutation_size`` (half of ``commitlog_segment_size`` unless set:
16 MiB with the default 32 MiB segments). Kafka stores a record up to the raw topic's ``max.message.bytes``
(the broker's ``message.max.bytes``, about 1 MB, unless the topic has its own), and librdkafka produces one
up to the producer's ``message.max.bytes`` (1,000,000 by default). So at start the agent learns the node's
``max_mutation_size`` (``NodeSettings``: ``system_views.settings`` of the node beside it), creates the
raw topic with a ``max.message.bytes`` that takes any mutation of that size, raises an existing topic's lower
one (IncrementalAlterConfigs), sets its producer's ``message.max.bytes`` to match, and says in one line what
the limits are and what it will do. Every update then goes whole in one record: its events are those of
the write.

Where a limit stays lower (the brokers refuse to raise the topic's, or ``kafka.producer`` sets its own
``message.max.bytes``), an update larger than it is cut by rows into pieces that fit
(``storage.partition_split``). The pipeline's events for the pieces equal those of the whole update as
long as each row's change depends on that row alone: an update with a static row or a partition deletion
changes every row of its partition, so it is never cut; nor is a single row. Such an update, too large,
stops the agent with one line naming it, the limits and the remedy (``RecordTooLarge``): nothing is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ResourceType)

from ..schema import Schema, TableMetadata
from ..storage import DataInput, DataOutput, PartitionUpdate, PartitionUpdateSerializer
from ..storage.partition_json import partition_key_text
from ..storage.partition_split import RecordLimits, split_partition


# What a record needs beyond its partition update: the raw record's header and node id, its Kafka key (a
# partition key is at most 64 KiB), the record batch's framing, and what LZ4 adds to data it cannot compress
# (at most 1/255 of it, plus its frame).
RECORD_HEADROOM = 1 << 20
TOPIC_MAX_MESSAGE_BYTES = "max.message.bytes"
PRODUCER_MESSAGE_MAX_BYTES = "message.max.bytes"



class RecordTooLarge(RuntimeError):
    """A partition update that fits in no record the raw topic takes, and cannot be cut so that it does."""


def required_record_bytes(max_mutation_bytes: int) -> int:
    """The ``max.message.bytes`` (topic) and ``message.max.bytes`` (producer) that take a record of any
    mutation the node accepts."""
    return max_mutation_bytes + RECORD_HEADROOM


def usable_record_bytes(limit: int) -> int:
    """Key and value bytes of the largest record a limit takes, once the batch's framing and LZ4's growth
    are counted."""
    return limit - limit // 255 - 1024


@dataclass(frozen=True)
class RecordLimit:
    """What the agent found and set at start: the node's largest mutation, the raw topic's and the producer's
    record limits."""

    topic: str
    max_mutation_bytes: int
    max_mutation_source: str  # where max_mutation_bytes comes from, for the start line
    topic_bytes: int
    topic_raised_from: int | None  # the topic's limit before the agent raised it
    topic_refusal: str | None  # why the topic's limit could not be raised
    producer_bytes: int

    @property
    def record_bytes(self) -> int:
        """Key and value bytes of the largest record both Kafka and the producer take."""
        return usable_record_bytes(min(self.topic_bytes, self.producer_bytes))

    @property
    def fits_every_mutation(self) -> bool:
        return min(self.topic_bytes, self.producer_bytes) >= required_record_bytes(self.max_mutation_bytes)

    def limits_text(self) -> str:
        return (f"{self.topic} max.message.bytes {self.topic_bytes:,}, producer message.max.bytes "
                f"{self.producer_bytes:,}")

    def remedy(self) -> str:
        """What to raise so that every mutation fits, for the lines that need it."""
        needed = required_record_bytes(self.max_mutation_bytes)
        steps = []
        if self.topic_bytes < needed:
            steps.append(f"raise max.message.bytes of {self.topic} to {needed} (kafka-configs --alter "
                         f"--entity-type topics --entity-name {self.topic} --add-config max.message.bytes={needed})")
        if self.producer_bytes < needed:
            steps.append(f"raise message.max.bytes in kafka.producer to {needed} (or leave it out)")
        return f"{' and '.join(steps)}, then start the agent again"

    def describe(self) -> str:
        """The start line: the limits and what the agent does with them."""
        raised = (f", raised from {self.topic_raised_from:,}" if self.topic_raised_from is not None else "")
        refused = f"; raising it was refused: {self.topic_refusal}" if self.topic_refusal else ""
        line = (f"record size: the node's max_mutation_size is {self.max_mutation_bytes:,} bytes "
                f"({self.max_mutation_source}); the raw topic {self.topic} takes records up to "
                f"{self.topic_bytes:,} bytes (max.message.bytes{raised}{refused}), the producer up to "
                f"{self.producer_bytes:,} (message.max.bytes)")
        if self.fits_every_mutation:
            return f"{line}: every mutation goes whole in one record"
        return (f"{line}: partition updates larger than {self.record_bytes:,} bytes are cut by rows into records "
                "that fit; one that cannot be cut (a single row, a static row or a partition deletion) stops "
                f"the agent; to avoid that, {self.remedy()}")


def raise_topic_limit(admin: AdminClient, topic: str, wanted: int,
                      timeout: float) -> tuple[int, int | None, str | None]:
    """Raise the topic's ``max.message.bytes`` to ``wanted`` if it is lower. Returns its limit now, the limit it
    had when the agent raised it (None: not raised) and why it could not be raised (None: it could, or
    needed not). Raises ``KafkaException`` when Kafka does not answer the describe request."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    current = int(described[TOPIC_MAX_MESSAGE_BYTES].value)
    if current >= wanted:
        return current, None, None
    change = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(TOPIC_MAX_MESSAGE_BYTES, str(wanted), incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([change], request_timeout=timeout)[change].result()
    except KafkaException as error:
        return current, None, error.args[0].str()
    return wanted, current, None


def cut_to_fit(update: bytes, schema: Schema, version: int, max_update_bytes: int) -> list[bytes]:
    """The serialized pieces (by rows, as few as the estimate allows) of a partition update larger than
    ``max_update_bytes``, each within it; ``RecordTooLarge`` when it cannot be cut so (see above)."""
    decoded = PartitionUpdateSerializer.deserialize(DataInput(update), schema, version)
    if decoded.static_row is not None or decoded.partition_deletion is not None:
        what = "a partition deletion" if decoded.partition_deletion is not None else "a static row"
        raise RecordTooLarge(f"it holds {what}, which changes every row of the partition, so its pieces would "
                             "not give the events of the whole update")
    if len(decoded.rows) <= 1:
        raise RecordTooLarge("it is a single row, which is never cut (its pieces would not give its event)")
    # Filled to about 90% by the rows' estimated sizes; a piece the estimate misjudged is halved.
    pieces = split_partition(decoded, RecordLimits(rows=len(decoded.unfiltereds),
                                                   bytes=max_update_bytes * 9 // 10))
    return [data for piece in pieces for data in _fitting(piece, version, max_update_bytes)]


def _fitting(piece: PartitionUpdate, version: int, max_update_bytes: int) -> list[bytes]:
    data = _serialized(piece, version)
    if len(data) <= max_update_bytes:
        return [data]
    rows = len(piece.rows)
    if rows <= 1:
        raise RecordTooLarge(f"one of its rows is {len(data):,} bytes alone, and a row is never cut")
    halves = split_partition(piece, RecordLimits(rows=(rows + 1) // 2, bytes=len(data)))
    if len(halves) == 1:  # its rows meet only where one range deletion ends and another starts
        raise RecordTooLarge(f"a piece of {len(data):,} bytes has no row boundary it can be cut at")
    return [part for half in halves for part in _fitting(half, version, max_update_bytes)]


def _serialized(update: PartitionUpdate, version: int) -> bytes:
    out = DataOutput()
    PartitionUpdateSerializer.serialize(update, out, version)
    return bytes(out)


def describe_update(table: TableMetadata | None, key: bytes) -> str:
    """``table ks.t, partition key {...}`` of a record's Kafka key, for error lines."""
    if table is None:
        return f"table id {key[:16].hex()}, partition key 0x{key[16:].hex()}"
    return f"table {table.qualified_name}, partition key {partition_key_text(table, key[16:])}"


__all__ = ["RecordLimit", "RecordTooLarge", "cut_to_fit", "describe_update", "raise_topic_limit",
           "required_record_bytes", "usable_record_bytes"]
