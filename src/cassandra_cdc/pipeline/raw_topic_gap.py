"""Raw records deleted before the pipeline read them (the raw topic's retention), found before it starts.

Spark's checkpoint records the offsets each raw partition was read to at each micro-batch
(``offsets/<batch>``), and which batches completed (``commits/<batch>``): the query resumes where the last
completed batch ended. A partition whose log now starts past that offset lost the records between, and
with them changes no event will show. Both Kafka sources would fail the query on them (``failOnDataLoss``),
with the first partition's loss buried in a Spark stack trace, again at every restart. Instead, the
pipeline names every partition's missing offsets in one line with the remedy (bootstrap the tables, then
start once with ``kafka.accept_gap``), counts the records in ``cassandra_cdc_pipeline_raw_records_deleted_total``,
and starts only when the gap is accepted: the sources then skip what is gone (``failOnDataLoss=false``) for
that run. The records are gone, so which tables they held is not known.

At start the pipeline also warns when the raw topic's retention is shorter than docs/operations.md
recommends (``RECOMMENDED_RETENTION_MS``, and no ``retention.bytes``): a pipeline stopped longer than that
loses records so.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Mapping

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from ..settings import ConfigError
from .checkpoint_files import CheckpointFiles

log = logging.getLogger(__name__)

# Kafka's own default retention.ms: a week for a stopped pipeline to be noticed and started again.
RECOMMENDED_RETENTION_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class MissingOffsets:
    partition: int
    first: int  # the first offset the pipeline had still to read
    end: int  # where the partition's log starts now: offsets first..end-1 are gone

    @property
    def records(self) -> int:
        """Offsets gone (records, and the transaction markers among them: Kafka does not say which)."""
        return self.end - self.first


@dataclass(frozen=True)
class RawTopicGap:
    topic: str
    missing: tuple[MissingOffsets, ...]

    @property
    def records(self) -> int:
        return sum(part.records for part in self.missing)

    def describe(self) -> str:
        """One line: every partition's missing offsets, and what to do."""
        ranges = ", ".join(f"partition {part.partition}: offsets {part.first}..{part.end - 1}"
                           for part in self.missing)
        return (f"the raw topic {self.topic} lost {self.records:,} records before the pipeline read them "
                f"(deleted by its retention, or the topic recreated): {ranges}. The records are gone, so which "
                "tables they held is not known, and their changes are missing from the events: run "
                "cassandra-cdc bootstrap for the CDC tables, then start the pipeline once with "
                "kafka.accept_gap: true (--accept-gap) to read on past the gap")


class RawTopicGapError(ConfigError):
    """A gap the configuration does not accept: the pipeline does not start."""

    def __init__(self, gap: RawTopicGap) -> None:
        super().__init__(gap.describe())
        self.gap = gap


def source_offsets(offsets: Any, topic: str) -> dict[int, int]:
    """Per partition, the offsets of a source's progress or checkpoint entry: Spark's kafka source writes
    ``{"<topic>": {"<partition>": offset}}``, ours ``{"<partition>": offset}``."""
    offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
    if not isinstance(offsets, dict):
        return {}
    offsets = offsets.get(topic, offsets)
    return {int(partition): int(offset) for partition, offset in offsets.items()
            if str(partition).isdigit() and isinstance(offset, int)}


def resume_offsets(files: CheckpointFiles, topic: str) -> dict[int, int] | None:
    """Per raw partition, the offset the query reads next: where the last completed micro-batch ended. None
    before a batch completed (the query starts at ``starting_offsets`` then)."""
    committed = files.batch_files("commits")
    if not committed:
        return None
    last = max(int(name.rsplit("/", 1)[1]) for name in committed)
    lines = files.read_text(f"offsets/{last}").splitlines()
    # A version line, the batch's metadata, then one line per source: the query has one, the raw topic.
    return source_offsets(lines[2], topic) if len(lines) > 2 else None


def find_gap(admin: AdminClient, topic: str, resume: Mapping[int, int], timeout: float) -> RawTopicGap | None:
    """The partitions of ``topic`` whose log starts past the offset the query resumes from. A partition
    the checkpoint does not have (added since) is read from its offset 0. Raises ``KafkaException`` when
    Kafka does not answer."""
    metadata = admin.list_topics(topic, timeout=timeout).topics[topic]
    if metadata.error is not None:
        return None  # no raw topic (yet): nothing lost
    asked = {TopicPartition(topic, partition): OffsetSpec.earliest() for partition in metadata.partitions}
    starts = {tp.partition: future.result().offset
              for tp, future in admin.list_offsets(asked, request_timeout=timeout).items()}
    missing = tuple(MissingOffsets(partition, resume.get(partition, 0), start)
                    for partition, start in sorted(starts.items()) if start > resume.get(partition, 0))
    return RawTopicGap(topic, missing) if missing else None


def check_retention(admin: AdminClient, topic: str, timeout: float) -> None:
    """Warn when the raw topic deletes records sooner than recommended. Raises ``KafkaException`` when Kafka
    does not answer."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    except KafkaException as error:
        if error.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return  # no raw topic yet: the agents create it with the brokers' defaults
        raise
    retention_ms = int(configs["retention.ms"].value)
    retention_bytes = int(configs["retention.bytes"].value)
    short = []
    if 0 <= retention_ms < RECOMMENDED_RETENTION_MS:
        short.append(f"retention.ms {retention_ms} ({retention_ms / 3_600_000:g} h)")
    if retention_bytes >= 0:
        short.append(f"retention.bytes {retention_bytes}")
    if short:
        log.warning("the raw topic %s deletes records sooner than docs/operations.md recommends (%s; recommended: "
                    "retention.ms >= %d, i.e. 7 days, and retention.bytes -1): records a stopped or slow pipeline "
                    "has not read by then are lost to it, and the tables must be bootstrapped again; raise them "
                    "with kafka-configs --alter --entity-type topics --entity-name %s", topic, ", ".join(short),
                    RECOMMENDED_RETENTION_MS, topic)


__all__ = ["MissingOffsets", "RECOMMENDED_RETENTION_MS", "RawTopicGap", "RawTopicGapError", "check_retention",
           "find_gap", "resume_offsets", "source_offsets"]
