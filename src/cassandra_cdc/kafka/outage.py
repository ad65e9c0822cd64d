"""Waiting out a Kafka outage: what says Kafka cannot be reached, and one line when a component starts waiting
for it and one when it is back (never one per retry)."""

from __future__ import annotations

import logging
import re
import time

from confluent_kafka import KafkaError, KafkaException

# librdkafka's errors that mean the brokers cannot be reached (yet), not that they refused something: with
# them, a broker of a cluster that was killed and left the cluster's metadata, whose handle the client drops
# with the requests in flight to it (_DESTROY_BROKER).
UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                         KafkaError._RESOLVE, KafkaError._DESTROY_BROKER})
# The same in the text of a failure that crossed process boundaries (a Spark task's Python or Java error):
# librdkafka's codes as confluent-kafka prints them, and the Java client's exceptions for a broker away. With
# them, what a broker that has just restarted answers for a while (partitions without a leader yet, a
# transaction the restart aborted that fences its producer: the replay registers the id again).
_UNREACHABLE_TEXT = re.compile(
    r"code=(_TRANSPORT|_TIMED_OUT|_ALL_BROKERS_DOWN|_RESOLVE|_DESTROY_BROKER|_MSG_TIMED_OUT|_TIMED_OUT_QUEUE|"
    r"COORDINATOR_NOT_AVAILABLE|NOT_COORDINATOR|COORDINATOR_LOAD_IN_PROGRESS|NOT_ENOUGH_REPLICAS|"
    r"LEADER_NOT_AVAILABLE|NOT_LEADER_OR_FOLLOWER|NOT_LEADER_FOR_PARTITION|REQUEST_TIMED_OUT|"
    r"NETWORK_EXCEPTION|_UNKNOWN_PARTITION|_FENCED|PRODUCER_FENCED|INVALID_PRODUCER_EPOCH|"
    r"CONCURRENT_TRANSACTIONS)"
    r"|org\.apache\.kafka\.common\.errors\.(TimeoutException|DisconnectException|NetworkException)"
    r"|Cannot fetch record for offset")


def unreachable(error: BaseException) -> bool:
    """Whether ``error`` is a client's report that the brokers cannot be reached."""
    return (isinstance(error, KafkaException) and bool(error.args) and isinstance(error.args[0], KafkaError)
            and error.args[0].code() in UNREACHABLE)


def names_unreachable_kafka(text: str) -> bool:
    """Whether the text of a failure (a Spark query's, with its tasks' tracebacks) names Kafka out of
    reach."""
    return _UNREACHABLE_TEXT.search(text) is not None


class KafkaOutage:
    """Logs when a component starts waiting for Kafka and when Kafka is back: one line each per outage."""

    def __init__(self, bootstrap_servers: str, waiting: str, logger: logging.Logger) -> None:
        """``waiting``: what waits, as the lines say it (e.g. "the pipeline waits for it")."""
        self.bootstrap_servers = bootstrap_servers
        self._waiting = waiting
        self._log = logger
        self._since: float | None = None

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def down(self, reason: str) -> None:
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning("Kafka at %s is unreachable (%s): %s", self.bootstrap_servers, reason,
                              self._waiting)

    def back(self) -> None:
        if self._since is not None:
            self._log.info("Kafka at %s is back after %.0f s", self.bootstrap_servers,
                           time.monotonic() - self._since)
            self._since = None


__all__ = ["KafkaOutage", "UNREACHABLE", "names_unreachable_kafka", "unreachable"]
