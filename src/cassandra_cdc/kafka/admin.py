"""Creating topics, for whichever component needs them first: the agents, the bootstrap, the pipeline's sink
(event and commit topics) and the test broker. Each caller keeps its own policy for waiting and retrying."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

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
                          replication_factor: int = -1) -> None:
    """Create those of ``topics`` (name -> (partitions, compacted)) that do not exist.

    Existing topics are left as they are, also one another client creates meanwhile. The replication
    factor is the broker's default unless given. Raises ``KafkaException`` when Kafka does not answer
    the metadata request, ``TopicCreationFailed`` (naming the topic) when it refuses to create one.
    """
    existing = admin.list_topics(timeout=timeout).topics
    wanted = [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                       config={"cleanup.policy": "compact"} if compacted else {})
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
            continue
        partitions, compacted = topics[name]
        log.info("created topic %s (%d partition(s)%s)", name, partitions, ", compacted" if compacted else "")


__all__ = ["TopicCreationFailed", "admin_client", "admin_settings", "create_missing_topics"]
