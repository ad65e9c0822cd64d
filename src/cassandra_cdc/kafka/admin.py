"""Creating topics, for whichever component needs them first: the agents, the bootstrap, the pipeline's sink
(event and commit topics) and the test broker. Each caller keeps its own policy for waiting and retrying."""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, OffsetSpec

log = logging.getLogger(__name__)

# What an admin client shares with the producer or consumer it works for: how to reach and log in to the
# brokers, and where to log. Nothing about producing or consuming (nor the producer's error callback).
_CONNECTION_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "client.", "logger")


class TopicCreationFailed(KafkaException):
    """Kafka refused to create a topic; ``args[0]`` is its ``KafkaError``, as in any ``KafkaException``."""

    def __init__(self, topic: str, error: KafkaError) -> None:
        super().__init__(error)
        self.topic = topic

    def __str__(self) -> str:
        return f"cannot create topic {self.topic}: {self.args[0]}"


def admin_settings(client_settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of an admin client that reaches the brokers as a client with ``client_settings`` does."""
    return {key: value for key, value in client_settings.items() if key.startswith(_CONNECTION_PREFIXES)}


def admin_client(client_settings: Mapping[str, Any]) -> AdminClient:
    """An admin client that reaches the brokers as a client with ``client_settings`` does."""
    return AdminClient(admin_settings(client_settings))


def create_missing_topics(admin: AdminClient, topics: Mapping[str, tuple[int, bool]], timeout: float, *,
                          replication_factor: int = -1,
                          configs: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Create those of ``topics`` (name -> (partitions, compacted)) that do not exist, with the topic
    settings of ``configs`` (name -> settings) besides.

    Existing topics are left as they are, also one another client creates meanwhile. The replication
    factor is the broker's default unless given. Returns once the leader of each partition of each topic
    created (here, or meanwhile by another client) answers, within ``timeout``: a new topic is in the
    metadata before its leaders serve it, and a produce in between can be lost. Raises ``KafkaException``
    when Kafka does not answer the metadata request, ``TopicCreationFailed`` (naming the topic) when it
    refuses to create one or one of its partitions has no leader that answers in time.
    """
    existing = admin.list_topics(timeout=timeout).topics
    wanted = [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                       config={**({"cleanup.policy": "compact"} if compacted else {}),
                               **(configs or {}).get(name, {})})
              for name, (partitions, compacted) in topics.items() if name not in existing]
    if not wanted:
        return
    # The request's timeout ends every future; ``admin`` must outlive them (a destroyed client fails them).
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicCreationFailed(name, error.args[0]) from None
            _wait_for_leaders(admin, name, None, timeout)  # another client's, maybe as new: as many as it has
            continue
        partitions, compacted = topics[name]
        _wait_for_leaders(admin, name, partitions, timeout)
        log.info("created topic %s (%d partition(s)%s)", name, partitions, ", compacted" if compacted else "")


def grow_if_empty(admin: AdminClient, topic: str, partitions: int, timeout: float) -> tuple[int, bool]:
    """Give ``topic`` ``partitions`` partitions if it has fewer and holds no record yet (every partition's
    high watermark 0): records already there keep the partitions their keys chose. Returns how many partitions it
    had and whether it has ``partitions`` now. Raises ``KafkaException`` when Kafka does not answer,
    ``TopicCreationFailed`` when it refuses to add the partitions."""
    metadata = admin.list_topics(topic, timeout=timeout).topics[topic]
    if metadata.error is not None:
        raise KafkaException(metadata.error)
    count = len(metadata.partitions)
    if count >= partitions:
        return count, True
    ends = admin.list_offsets({TopicPartition(topic, partition): OffsetSpec.latest()
                               for partition in metadata.partitions}, request_timeout=timeout)
    if any(future.result().offset > 0 for future in ends.values()):
        return count, False
    try:
        admin.create_partitions([NewPartitions(topic, partitions)], request_timeout=timeout)[topic].result()
    except KafkaException as error:
        # Another agent grew it meanwhile: as many partitions as asked, or it says why not.
        if error.args[0].code() != KafkaError.INVALID_PARTITIONS:
            raise TopicCreationFailed(topic, error.args[0]) from None
        return grow_if_empty(admin, topic, partitions, timeout)
    _wait_for_leaders(admin, topic, partitions, timeout)
    return count, True


def _wait_for_leaders(admin: AdminClient, topic: str, partitions: int | None, timeout: float) -> None:
    """Return once the metadata names a leader for each of the ``partitions`` of ``topic`` (None: each one
    it lists) and each leader answers an offset request; raise ``TopicCreationFailed`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (not_ready := _partition_not_ready(admin, topic, partitions, timeout)) is not None:
        if time.monotonic() >= deadline:
            reason = f"created, but after {timeout:g} s {not_ready}; check the brokers' health and logs"
            raise TopicCreationFailed(topic, KafkaError(KafkaError._TIMED_OUT, reason))
        time.sleep(0.1)


def _partition_not_ready(admin: AdminClient, topic: str, partitions: int | None,
                         timeout: float) -> str | None:
    """What a client would still miss of ``topic`` (None: nothing)."""
    metadata = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        return f"the metadata lacks it ({metadata.error if metadata else 'not listed'})"
    wanted = range(partitions) if partitions is not None else sorted(metadata.partitions)
    for partition in wanted:
        described = metadata.partitions.get(partition)
        if described is None or described.error is not None or described.leader < 0:
            return f"partition {partition} has no leader in the metadata"
    offsets = admin.list_offsets({TopicPartition(topic, partition): OffsetSpec.latest()
                                  for partition in wanted}, request_timeout=timeout)
    for asked, future in offsets.items():
        try:
            future.result()
        except KafkaException as error:
            return f"the leader of partition {asked.partition} does not answer ({error.args[0].str()})"
    return None


__all__ = ["TopicCreationFailed", "admin_client", "admin_settings", "create_missing_topics", "grow_if_empty"]
